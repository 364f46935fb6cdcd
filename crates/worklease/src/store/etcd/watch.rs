//! Push hand-off: the store's one watch on deletions of its `live` keys.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{WatchFilterType, WatchOptions};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::store::notify::Watchers;

use super::keys::{work_id_of, LIVE};
use super::members::Members;
use super::Core;

/// The first wait before watching again after a broken watch; it doubles
/// up to [`REWATCH_MAX`].
const REWATCH_MIN: Duration = Duration::from_millis(50);
/// The longest wait between watch attempts.
const REWATCH_MAX: Duration = Duration::from_secs(2);

/// What the watch task and the store share.
pub(super) struct Wakeups {
    pub(super) watchers: Watchers,
    /// Bumped when deletions may have been missed: wakes every waiter.
    pub(super) all: watch::Sender<u64>,
}

impl Core {
    /// Starts the watch task if it is not running; false where it cannot
    /// run (no client yet, no tokio runtime here, a poisoned lock).
    pub(super) fn start_watching(&self, from: i64) -> bool {
        let Ok(mut watching) = self.watching.lock() else {
            return false;
        };
        if *watching {
            return true;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let task = WatchTask {
            members: self.members.clone(),
            prefix: self.config.prefix.clone(),
            wakeups: self.wakeups.clone(),
        };
        runtime.spawn(task.run(from, self.stop.child_token()));
        *watching = true;
        true
    }
}

/// The store's one watch on its `live` keys.
struct WatchTask {
    members: Arc<Members>,
    prefix: String,
    wakeups: Arc<Wakeups>,
}

impl WatchTask {
    /// Watches deletions of `live` keys from revision `from` on, until
    /// `stop`, watching again after every broken stream from the revision
    /// after the last event seen, on the next member after a member that
    /// failed it.
    async fn run(self, mut from: i64, stop: CancellationToken) {
        let base = format!("{}{LIVE}", self.prefix);
        let mut backoff = REWATCH_MIN;
        loop {
            let options = WatchOptions::new()
                .with_prefix()
                .with_start_revision(from)
                .with_filters([WatchFilterType::NoPut])
                .with_progress_notify();
            let member = self.members.preferred();
            let watched = tokio::select! {
                () = stop.cancelled() => return,
                w = async {
                    let mut client = self.members.client(member).await?;
                    client.watch(base.as_str(), Some(options)).await
                } => w,
            };
            match watched {
                Ok(mut stream) => loop {
                    let message = tokio::select! {
                        () = stop.cancelled() => return,
                        m = stream.message() => m,
                    };
                    match message {
                        Ok(Some(resp)) => {
                            backoff = REWATCH_MIN;
                            if resp.compact_revision() > 0 {
                                // The revisions we missed are gone: wake
                                // everyone, go on from the oldest one kept.
                                tracing::debug!(
                                    from,
                                    compacted = resp.compact_revision(),
                                    "etcd watch fell behind a compaction: waking every waiter"
                                );
                                from = from.max(resp.compact_revision());
                                self.wakeups.all.send_modify(|n| *n += 1);
                                break;
                            }
                            for event in resp.events() {
                                if let Some(kv) = event.kv() {
                                    if let Some(id) = work_id_of(&self.prefix, LIVE, kv.key()) {
                                        self.wakeups.watchers.notify(&id);
                                    }
                                    from = from.max(kv.mod_revision() + 1);
                                }
                            }
                            if resp.events().is_empty() && !resp.created() {
                                // A progress notice: every later event has
                                // a larger revision than its header's.
                                if let Some(h) = resp.header() {
                                    from = from.max(h.revision() + 1);
                                }
                            }
                            if resp.canceled() {
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(error = %e, "etcd watch broke: watching again");
                            self.members.failed(member);
                            break;
                        }
                    }
                },
                Err(e) => {
                    tracing::debug!(error = %e, "cannot watch etcd: trying again");
                    self.members.failed(member);
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(REWATCH_MAX);
        }
    }
}
