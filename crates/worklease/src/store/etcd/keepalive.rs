//! Keep-alives of session leases: one stream per session lease, kept open
//! and shared by every call that needs a keep-alive, as a group commit.

use std::collections::HashMap;
use std::sync::Arc;

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use tokio::time::Instant;

use crate::error::Result;

use super::rpc::Budget;
use super::Core;

/// One session lease's keep-alives: the send time and answer of the last
/// one, and the open stream to send the next on.
#[derive(Default)]
pub(super) struct Keeper {
    last: Option<(Instant, bool)>,
    stream: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
}

/// Per etcd lease, its [`Keeper`], locked while a keep-alive is in flight.
pub(super) type Keepers = HashMap<i64, Arc<tokio::sync::Mutex<Keeper>>>;

impl Core {
    /// Renews etcd lease `id` with a keep-alive sent at or after `after`;
    /// false when etcd no longer has it. Calls for one lease share their
    /// keep-alives, as a group commit does: one is in flight at a time, and
    /// the calls that waited for it take the next one, which each of them
    /// was sent before. So a session's keep-alives number at most one per
    /// keep-alive round trip, however many acquisitions and renewal
    /// batches need one. The keep-alive goes on the stream the last one
    /// opened (a message, not a new request); a stream that fails or does
    /// not answer within one attempt's time is dropped, and a new one is
    /// opened with the store's fail-over.
    pub(super) async fn keep_alive_after(
        &self,
        id: i64,
        after: Instant,
        budget: Budget,
    ) -> Result<bool> {
        let slot = self
            .keepers
            .lock()
            .ok()
            .map(|mut keepers| keepers.entry(id).or_default().clone());
        let Some(slot) = slot else {
            return self.keep_alive(id, budget).await;
        };
        let mut keeper = slot.lock().await;
        if let Some((sent, alive)) = keeper.last {
            if sent >= after {
                return Ok(alive);
            }
        }
        let sent = Instant::now();
        if let (Some((k, stream)), Some(limit)) = (keeper.stream.as_mut(), budget.attempt_now()) {
            let answer = tokio::time::timeout(limit, async {
                k.keep_alive().await?;
                stream.message().await
            })
            .await;
            if let Ok(Ok(Some(resp))) = answer {
                let alive = resp.ttl() > 0;
                keeper.last = Some((sent, alive));
                self.kept_alive(id, sent, alive);
                return Ok(alive);
            }
            keeper.stream = None;
        }
        let opened = self
            .rpc("renew the etcd lease", budget, |mut c| async move {
                match c.lease_keep_alive(id).await {
                    Ok(pair) => Ok(Some(pair)),
                    Err(etcd_client::Error::LeaseKeepAliveError(m)) if m.contains("not found") => {
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            })
            .await?;
        let alive = opened.is_some();
        keeper.stream = opened;
        keeper.last = Some((sent, alive));
        self.kept_alive(id, sent, alive);
        Ok(alive)
    }

    /// Renews etcd lease `id` once, on a stream of its own; false when etcd
    /// no longer has it (the session is then forgotten).
    pub(super) async fn keep_alive(&self, id: i64, budget: Budget) -> Result<bool> {
        let sent = Instant::now();
        // A stream: `rpc`'s attempt timeout bounds the whole of it (the
        // reply may wait for a new leader), not only its opening.
        let alive = self
            .rpc("renew the etcd lease", budget, |mut c| async move {
                match c.lease_keep_alive(id).await {
                    Ok(_) => Ok(true),
                    // etcd answers a renewal of an unknown lease with a TTL
                    // of 0, which the client turns into this error.
                    Err(etcd_client::Error::LeaseKeepAliveError(m)) if m.contains("not found") => {
                        Ok(false)
                    }
                    Err(e) => Err(e),
                }
            })
            .await?;
        self.kept_alive(id, sent, alive);
        Ok(alive)
    }
}
