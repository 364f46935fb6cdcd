//! What a pool is given and what it reports: [`PoolOptions`], the errors
//! of a work function ([`SlotError`]) and of the pool ([`PoolError`]), and
//! the slot observer ([`PoolObserver`]).

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::lease::renewal::RenewalOptions;
use crate::lease::AcquireOptions;
use crate::runner::DEFAULT_FINISH_TIMEOUT;

/// The default of [`PoolOptions::backoff`]: 1 s.
pub const DEFAULT_SLOT_BACKOFF: Duration = Duration::from_secs(1);

/// The boxed error a work function gives with a [`SlotError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a pool's work function failed, which decides what becomes of its
/// slot.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    /// Worth retrying: the slot is released and retried after the pool's
    /// back-off.
    #[error("transient: {0}")]
    Transient(#[source] BoxError),
    /// Not worth retrying: the slot is released and its work ID dropped by
    /// this pool.
    #[error("permanent: {0}")]
    Permanent(#[source] BoxError),
}

/// Why [`Pool::run`](super::Pool::run) ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// Every work ID's slot was dropped after a permanent error.
    #[error("all {count} slots of pool {pool:?} are dead")]
    AllSlotsDead {
        /// The pool's name.
        pool: String,
        /// How many work IDs the pool covered.
        count: usize,
    },
    /// The pool could not start (for example [`Error::Invalid`]).
    #[error(transparent)]
    Lease(#[from] Error),
}

/// Events of a pool's slots; every method has a no-op default.
pub trait PoolObserver: Send + Sync {
    /// The slot of `work_id` was acquired with `fencing_token`; its work
    /// function runs.
    fn on_slot_acquired(&self, _work_id: &str, _fencing_token: u64) {}
    /// The slot's lease was lost while the work ran (`Fenced`, `Expired`,
    /// `WindowExhausted`).
    fn on_slot_lost(&self, _work_id: &str, _error: &Error) {}
    /// The slot failed transiently and is retried after `retry_in`.
    fn on_slot_backoff(&self, _work_id: &str, _error: &str, _retry_in: Duration) {}
    /// The slot failed permanently: this pool does not take `work_id`
    /// again.
    fn on_slot_dead(&self, _work_id: &str, _error: &str) {}
    /// The slot was surplus to the pool's share and was handed off (final
    /// checkpoint written, lease released).
    fn on_slot_released(&self, _work_id: &str) {}
}

/// A [`PoolObserver`] that does nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopPoolObserver;

impl PoolObserver for NoopPoolObserver {}

/// Settings of a [`Pool`](super::Pool).
#[derive(Clone)]
pub struct PoolOptions {
    pub(super) name: String,
    pub(super) work_ids: Vec<String>,
    pub(super) acquire: AcquireOptions,
    pub(super) renewal: RenewalOptions,
    pub(super) backoff: Duration,
    pub(super) finish_timeout: Duration,
    pub(super) done_prefix: Option<String>,
    pub(super) observer: Arc<dyn PoolObserver>,
}

impl std::fmt::Debug for PoolOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolOptions")
            .field("name", &self.name)
            .field("work_ids", &self.work_ids)
            .field("acquire", &self.acquire)
            .field("renewal", &self.renewal)
            .field("backoff", &self.backoff)
            .field("finish_timeout", &self.finish_timeout)
            .field("done_prefix", &self.done_prefix)
            .finish_non_exhaustive()
    }
}

impl PoolOptions {
    /// A pool named `name` (pools of one name balance against each other)
    /// over `work_ids`. Defaults: fail-fast acquisition,
    /// [`RenewalOptions::new`], back-off [`DEFAULT_SLOT_BACKOFF`], finish
    /// timeout [`DEFAULT_FINISH_TIMEOUT`], no done prefix,
    /// [`NoopPoolObserver`].
    pub fn new<I, S>(name: impl Into<String>, work_ids: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            name: name.into(),
            work_ids: work_ids.into_iter().map(Into::into).collect(),
            acquire: AcquireOptions::new(),
            renewal: RenewalOptions::new(),
            backoff: DEFAULT_SLOT_BACKOFF,
            finish_timeout: DEFAULT_FINISH_TIMEOUT,
            done_prefix: None,
            observer: Arc::new(NoopPoolObserver),
        }
    }

    /// Acquisition options of each slot. Waiting
    /// ([`AcquireOptions::wait_for_lease`]) is refused by [`Pool::new`](super::Pool::new): a
    /// pool tries free work IDs every round instead of blocking a slot, in
    /// batches that fail fast, so the other options (poll interval,
    /// timeout, cancellation) have nothing to act on.
    pub fn acquire_options(mut self, options: AcquireOptions) -> Self {
        self.acquire = options;
        self
    }

    /// Renewal options of each slot and of the membership lease; their
    /// interval is also the pool's round interval.
    pub fn renewal_options(mut self, options: RenewalOptions) -> Self {
        self.renewal = options;
        self
    }

    /// How long a slot waits after a transient error; at least 1 ms.
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// How long each slot's final checkpoint and release may take (see
    /// [`Runner::finish_timeout`](crate::runner::Runner::finish_timeout)).
    pub fn finish_timeout(mut self, timeout: Duration) -> Self {
        self.finish_timeout = timeout;
        self
    }

    /// Where the done records are: a work ID `W` is finished once the
    /// store lists a lease on `<prefix>W` (see the [module
    /// docs](crate::pool#finished-work-ids)). The pool reads these records and
    /// never acquires a finished work ID; writing them is the work
    /// function's part. [`Pool::new`](super::Pool::new) checks that every `<prefix>W` is a
    /// valid work ID, that no work ID lies under the prefix, and that the
    /// prefix and the membership prefix `<name>/members/` do not overlap.
    pub fn done_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.done_prefix = Some(prefix.into());
        self
    }

    /// The observer of slot events.
    pub fn observer(mut self, observer: Arc<dyn PoolObserver>) -> Self {
        self.observer = observer;
        self
    }
}
