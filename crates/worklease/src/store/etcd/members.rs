//! One client per member, the member requests go to first, and the check
//! of the etcd version for bug #15247.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use super::EtcdConfig;

/// Whether etcd `version` (`3.4.23`, as a member reports it) predates the
/// first patch release of its line believed to carry the fix of etcd bug
/// #15247 (PR #16822, backported to 3.4 in PR #17465): 3.4.30 and 3.5.13.
/// An older member that leads the cluster, paused and resumed, may revoke
/// leases its successor renewed. Unknown or newer versions are `false`.
fn lacks_lease_revoke_fix(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Some(3)), Some(Some(minor)), Some(Some(patch))) => {
            minor < 4 || (minor == 4 && patch < 30) || (minor == 5 && patch < 13)
        }
        _ => false,
    }
}

/// Asks one member for its version, in the background, and logs a warning
/// when it lacks the fix of etcd bug #15247 ([`lacks_lease_revoke_fix`]).
/// Only a diagnostic: a failure to ask is logged at debug level.
fn warn_if_lease_revoke_bug(mut client: Client, timeout: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        match tokio::time::timeout(timeout, client.status()).await {
            Ok(Ok(status)) if lacks_lease_revoke_fix(status.version()) => {
                tracing::warn!(
                    etcd_version = status.version(),
                    "this etcd predates the fix of etcd bug #15247 (PR #16822; in 3.4 PR #17465, \
                     believed first released in 3.4.30 and 3.5.13): a Raft leader that was paused \
                     may revoke leases after it resumes, ending a lease just renewed; upgrade etcd \
                     for production (fencing tokens still protect downstream writes)"
                );
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "cannot read the etcd version"),
            Err(_) => tracing::debug!("cannot read the etcd version: no reply in time"),
        }
    });
}

/// One client per member, each connected on first use, and the member
/// requests go to first. A request goes to that member; when it fails
/// over ([`fails_over`]) the store moves on to the next member and sends
/// it there, so one member that hangs costs one attempt timeout, once,
/// not one per request (`etcd-client`'s balanced channel would keep
/// routing a share of the requests to it).
///
/// [`fails_over`]: super::rpc::fails_over
pub(super) struct Members {
    /// `http://host:port` of each member.
    pub(super) endpoints: Vec<String>,
    options: ConnectOptions,
    clients: Vec<tokio::sync::OnceCell<Client>>,
    /// The index of the member requests go to first.
    preferred: AtomicUsize,
    /// Whether a member was asked for its version (see
    /// [`warn_if_lease_revoke_bug`]).
    version_checked: std::sync::atomic::AtomicBool,
    request_timeout: Duration,
}

impl Members {
    pub(super) fn new(config: &EtcdConfig) -> Self {
        let endpoints = config.endpoints();
        Self {
            clients: endpoints
                .iter()
                .map(|_| tokio::sync::OnceCell::new())
                .collect(),
            endpoints,
            options: config.connect_options(),
            preferred: AtomicUsize::new(0),
            version_checked: std::sync::atomic::AtomicBool::new(false),
            request_timeout: config.request_timeout,
        }
    }

    /// The member requests go to now.
    pub(super) fn preferred(&self) -> usize {
        self.preferred.load(Ordering::Relaxed) % self.endpoints.len()
    }

    /// Member `i` failed a request: requests go to the next one, unless
    /// another request already moved them on from `i`.
    pub(super) fn failed(&self, i: usize) {
        let next = (i + 1) % self.endpoints.len();
        let _ = self
            .preferred
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The client of member `i`, connecting it first if needed (without
    /// authentication this sends nothing; with it, it asks for a token).
    pub(super) async fn client(&self, i: usize) -> std::result::Result<Client, etcd_client::Error> {
        let client = self.clients[i]
            .get_or_try_init(|| {
                Client::connect([self.endpoints[i].as_str()], Some(self.options.clone()))
            })
            .await?
            .clone();
        if !self.version_checked.swap(true, Ordering::Relaxed) {
            warn_if_lease_revoke_bug(client.clone(), self.request_timeout);
        }
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_without_the_lease_revoke_fix_are_recognised() {
        for v in ["3.4.23", "3.4.29", "3.5.0", "3.5.12", "3.3.27"] {
            assert!(lacks_lease_revoke_fix(v), "{v}");
        }
        for v in [
            "3.4.30", "3.4.35", "3.5.13", "3.5.17", "3.6.0", "4.0.0", "", "x.y.z", "3.5",
        ] {
            assert!(!lacks_lease_revoke_fix(v), "{v}");
        }
    }
}
