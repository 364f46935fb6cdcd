//! In-process wake-ups for waiters: one [`Notify`] per work ID that has
//! waiters. Stores with their own notifications (PostgreSQL `NOTIFY`, Redis
//! pub/sub, etcd watches) feed them into the same [`Watchers`].
//!
//! A process renewing 100,000 leases watches 100,000 work IDs (the session
//! subscribes every held lease, so a revocation is seen at once): one
//! `Arc<Notify>` per work ID and one registered [`OwnedNotified`] per
//! watcher keep that to about a hundred bytes each (issue 17).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

use crate::limits::WorkId;

#[derive(Default)]
pub(crate) struct Watchers {
    channels: Mutex<HashMap<WorkId, Arc<Notify>>>,
}

impl Watchers {
    /// Wakes every waiter of `work_id`; forgets the work ID once nobody
    /// waits.
    pub(crate) fn notify(&self, work_id: &WorkId) {
        if let Ok(mut channels) = self.channels.lock() {
            if let Some(n) = channels.get(work_id) {
                n.notify_waiters();
                if Arc::strong_count(n) == 1 {
                    channels.remove(work_id);
                }
            }
        }
    }

    /// A future that completes at the next [`Watchers::notify`] of
    /// `work_id` after this call (it is registered before this returns,
    /// not at its first poll), or when the store is dropped.
    pub(crate) fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        let notify = self
            .channels
            .lock()
            .ok()?
            .entry(work_id.clone())
            .or_default()
            .clone();
        let mut notified: std::pin::Pin<Box<OwnedNotified>> = Box::pin(notify.notified_owned());
        notified.as_mut().enable();
        Some(notified)
    }
}

impl Drop for Watchers {
    /// The store is gone: nothing more will change, so every waiter wakes
    /// (its next attempt reports what it finds).
    fn drop(&mut self) {
        if let Ok(channels) = self.channels.get_mut() {
            for n in channels.values() {
                n.notify_waiters();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> WorkId {
        WorkId::new(s.to_string()).expect("a valid work ID")
    }

    #[tokio::test]
    async fn a_notify_after_watch_wakes_even_before_the_first_poll() {
        let w = Watchers::default();
        let fut = w.watch(&id("a")).expect("a watch");
        w.notify(&id("a"));
        tokio::time::timeout(std::time::Duration::from_secs(5), fut)
            .await
            .expect("woken by the earlier notify");
    }

    #[tokio::test]
    async fn another_work_id_does_not_wake() {
        let w = Watchers::default();
        let mut fut = w.watch(&id("a")).expect("a watch");
        w.notify(&id("b"));
        assert!(futures_util::poll!(&mut fut).is_pending());
        w.notify(&id("a"));
        fut.await;
    }

    #[tokio::test]
    async fn dropping_the_store_wakes_every_waiter() {
        let w = Watchers::default();
        let fut = w.watch(&id("a")).expect("a watch");
        drop(w);
        fut.await;
    }

    #[test]
    fn a_work_id_nobody_watches_is_forgotten_at_its_next_notify() {
        let w = Watchers::default();
        drop(w.watch(&id("a")));
        w.notify(&id("a"));
        assert!(w.channels.lock().expect("not poisoned").is_empty());
    }
}
