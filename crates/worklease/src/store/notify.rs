//! In-process wake-ups for waiters: one watch channel per work ID that has
//! waiters. Stores with their own notifications (PostgreSQL `NOTIFY`, Redis
//! pub/sub, etcd watches) feed them into the same [`Watchers`].

use std::collections::HashMap;
use std::sync::Mutex;

use futures_util::future::BoxFuture;
use tokio::sync::watch;

use crate::limits::WorkId;

#[derive(Default)]
pub(crate) struct Watchers {
    channels: Mutex<HashMap<WorkId, watch::Sender<u64>>>,
}

impl Watchers {
    /// Wakes every waiter of `work_id`; forgets the channel once nobody
    /// waits.
    pub(crate) fn notify(&self, work_id: &WorkId) {
        if let Ok(mut channels) = self.channels.lock() {
            if let Some(tx) = channels.get(work_id) {
                tx.send_modify(|v| *v += 1);
                if tx.receiver_count() == 0 {
                    channels.remove(work_id);
                }
            }
        }
    }

    /// A future that completes at the next [`Watchers::notify`] of
    /// `work_id` after this call.
    pub(crate) fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        let mut channels = self.channels.lock().ok()?;
        let mut rx = channels
            .entry(work_id.clone())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        Some(Box::pin(async move {
            // An error means the store is gone: nothing more will change.
            let _ = rx.changed().await;
        }))
    }
}
