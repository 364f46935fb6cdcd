//! What a [`Leases`] handle still does in the background after its caller
//! has gone: the store call of a dropped acquisition, the release of the
//! grant it left ([`crate::lease::granting`]), a fair waiter letting go of its
//! place ([`crate::fair`]), the release of a dropped runner's or leader's
//! lease. Each such task is counted from its spawn to its end, so that a
//! process can wait for them before it exits ([`Leases::settle`]): a
//! runtime that shuts down drops its tasks, and a lease whose release was
//! dropped stays taken until its TTL (issue 23: the CLI left such leases
//! when a signal ended it during an acquisition).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::lease::Leases;

/// A count of tasks in progress, with a wake-up when it reaches zero.
#[derive(Default, Clone)]
pub(crate) struct Pending(Arc<Count>);

#[derive(Default)]
struct Count {
    count: AtomicUsize,
    done: Notify,
}

impl Pending {
    /// Counts one more task until the ticket is dropped.
    pub(crate) fn ticket(&self) -> Ticket {
        self.0.count.fetch_add(1, Ordering::SeqCst);
        Ticket(self.0.clone())
    }

    /// The tasks in progress now.
    pub(crate) fn count(&self) -> usize {
        self.0.count.load(Ordering::SeqCst)
    }

    /// Completes once no task is in progress.
    pub(crate) async fn settled(&self) {
        loop {
            let done = self.0.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            done.await;
        }
    }
}

/// One task counted by a [`Pending`], until this is dropped.
pub(crate) struct Ticket(Arc<Count>);

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.done.notify_waiters();
        }
    }
}

/// The background tasks of a [`Leases`] handle were still running when
/// the timeout given to [`Leases::settle`] passed. Their leases are not
/// lost to S1: each ends at the latest when its TTL runs out; until then
/// other holders may see it taken (`Held`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{pending} background task(s) (dropped acquisitions, releases) still running after {timeout:?}: \
     a lease they leave ends when its TTL runs out"
)]
pub struct Unsettled {
    pending: usize,
    timeout: Duration,
}

impl Unsettled {
    /// How many background tasks were still running when the timeout
    /// passed.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// The timeout that passed.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl Leases {
    /// Runs `task` on a task of its own, counted by [`Leases::settle`]
    /// until it ends (also when the runtime drops it).
    pub(crate) fn spawn_background<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let ticket = self.inner.background.ticket();
        tokio::spawn(async move {
            let _ticket = ticket;
            task.await
        })
    }

    /// Waits, at most `timeout`, until nothing this handle (or a clone of
    /// it) started in the background is still running: the store calls of
    /// acquisitions whose futures were dropped, the release of what they
    /// were granted, fair waiters letting go of their places, the releases
    /// of dropped runners and leaders. A process awaits this after it
    /// dropped its acquisitions and before it exits (its runtime's end
    /// drops whatever still runs, and the leases it was releasing stay
    /// taken until their TTL). Acquisitions still awaited by a caller are
    /// waited for too, one store call at a time; drop them first.
    ///
    /// `timeout` is a duration of the tokio clock; a few of the store's
    /// round trips are enough for the releases themselves, and none of
    /// them takes longer than the handle's TTL.
    ///
    /// # Errors
    /// [`Unsettled`], with the number of tasks still running, when
    /// `timeout` passed first: the leases they were to release end with
    /// their TTL instead. Nothing else fails; the tasks go on running.
    pub async fn settle(&self, timeout: Duration) -> Result<(), Unsettled> {
        let background = &self.inner.background;
        match tokio::time::timeout(timeout, background.settled()).await {
            Ok(()) => Ok(()),
            Err(_) => Err(Unsettled {
                pending: background.count(),
                timeout,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::Config;

    fn leases() -> Leases {
        Leases::new(
            Arc::new(MemoryStore::new()),
            Config::new("settling", Duration::from_secs(30)),
        )
        .expect("valid config")
    }

    #[tokio::test(start_paused = true)]
    async fn settle_waits_for_background_tasks_and_no_longer() {
        let leases = leases();
        assert_eq!(leases.settle(Duration::ZERO).await, Ok(()));
        let work = Duration::from_millis(300);
        leases.spawn_background(tokio::time::sleep(work));
        let started = tokio::time::Instant::now();
        assert_eq!(leases.settle(work * 2).await, Ok(()));
        assert_eq!(started.elapsed(), work, "settled as the task ended");
    }

    #[tokio::test(start_paused = true)]
    async fn settle_gives_up_at_its_timeout_naming_what_is_left() {
        let leases = leases();
        let work = Duration::from_secs(10);
        leases.spawn_background(tokio::time::sleep(work));
        leases.spawn_background(tokio::time::sleep(work));
        let timeout = work / 4;
        let started = tokio::time::Instant::now();
        let e = leases.clone().settle(timeout).await.expect_err("unsettled");
        assert_eq!(started.elapsed(), timeout);
        assert_eq!((e.pending(), e.timeout()), (2, timeout));
        assert!(e.to_string().contains("2 background task(s)"), "{e}");
        // The tasks went on: they settle later.
        assert_eq!(leases.settle(work).await, Ok(()));
    }
}
