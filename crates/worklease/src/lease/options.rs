//! The settings of a [`Leases`](super::Leases) handle ([`Config`]: holder, TTL, safety
//! margin, observer) and of one acquisition ([`AcquireOptions`]: waiting,
//! polling, fairness, time-outs and cancellation).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::observe::{LeaseObserver, NoopObserver};

/// The default poll interval of a waiting acquisition (as in the Go
/// original).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Settings of a [`Leases`](super::Leases) handle (Go: `Config`).
#[derive(Clone)]
pub struct Config {
    pub(super) holder_id: String,
    pub(super) ttl: Duration,
    pub(super) safety_margin: Option<Duration>,
    pub(super) observer: Arc<dyn LeaseObserver>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("holder_id", &self.holder_id)
            .field("ttl", &self.ttl)
            .field("safety_margin", &self.safety_margin)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// A holder ID (unique per process: two processes with one holder ID are
    /// one holder to the store) and a lease TTL. Checked by [`Leases::new`](super::Leases::new).
    pub fn new(holder_id: impl Into<String>, ttl: Duration) -> Self {
        Self {
            holder_id: holder_id.into(),
            ttl,
            safety_margin: None,
            observer: Arc::new(NoopObserver),
        }
    }

    /// The observer of every operation; default [`NoopObserver`].
    pub fn observer(mut self, observer: Arc<dyn LeaseObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// How long before the end of its TTL a holder stops counting the lease
    /// as its own (the crate docs' "Clocks": send time + TTL − margin). It covers
    /// clock-rate differences between holder and store and the time a
    /// holder needs to stop its work. Default: TTL/10. Must be shorter than
    /// the TTL.
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = Some(margin);
        self
    }
}

/// Options of one acquisition (Go: `WithWaitForLease`, `WithPollInterval`).
#[derive(Clone, Debug)]
pub struct AcquireOptions {
    pub(crate) wait: bool,
    pub(crate) fair: bool,
    pub(crate) poll_interval: Duration,
    pub(crate) wait_timeout: Option<Duration>,
    pub(crate) cancel: Option<CancellationToken>,
}

impl Default for AcquireOptions {
    fn default() -> Self {
        Self {
            wait: false,
            fair: false,
            poll_interval: DEFAULT_POLL_INTERVAL,
            wait_timeout: None,
            cancel: None,
        }
    }
}

impl AcquireOptions {
    /// Fail fast with `Held` when the lease is taken.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wait until the lease is free instead of failing with `Held`. The wait
    /// ends early when the store notifies a release, when the holder's lease
    /// is due to expire by the store's clock, and otherwise every poll
    /// interval. Cancel it by dropping the future, through
    /// [`AcquireOptions::cancel_on`], or with [`AcquireOptions::wait_timeout`].
    pub fn wait_for_lease(mut self) -> Self {
        self.wait = true;
        self
    }

    /// Whether waiting was asked for (Go: `HasWaitForLease`).
    pub fn waits(&self) -> bool {
        self.wait
    }

    /// Wait in line: fair waiters of a lease (or of a semaphore's permits)
    /// are served in the order they arrived, and a fail-fast fair
    /// acquisition refuses while fair waiters are queued. Built from
    /// leases on every store (`T/fair-queue`, `T/fair-waiter/<slot>`,
    /// next to the target `T`; a semaphore's line is next to
    /// `NAME/permit/line`); a waiter that dies leaves the line within its
    /// TTL, one that is cancelled, times out or is dropped at once (a
    /// dropped one lets go in the background: await
    /// [`Leases::settle`](super::Leases::settle) before the process exits). Costs a few more
    /// round trips than an unfair acquisition, and only orders fair
    /// acquirers among themselves: an unfair one may still take a free
    /// lease first. See ADR 0015 for the rules and bounds.
    pub fn fair(mut self) -> Self {
        self.fair = true;
        self
    }

    /// Whether fair waiting was asked for.
    pub fn is_fair(&self) -> bool {
        self.fair
    }

    /// How often a waiting acquisition retries; default 2 s; must be at
    /// least 1 ms.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The poll interval in force.
    pub fn get_poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// Give up waiting after `timeout` with [`Error::WaitTimedOut`](crate::Error::WaitTimedOut).
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = Some(timeout);
        self
    }

    /// Give up waiting with [`Error::Cancelled`](crate::Error::Cancelled) when `cancel` fires.
    pub fn cancel_on(mut self, cancel: CancellationToken) -> Self {
        self.cancel = Some(cancel);
        self
    }
}
