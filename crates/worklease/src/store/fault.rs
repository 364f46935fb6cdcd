//! The store tests' decorator (feature `testkit`): it wraps a store,
//! injects faults and reports what reached it, in the shape of
//! `object_store`'s `throttle.rs`; for tests of renewal, of the contract
//! under failures and of the checks themselves, and for every store's own
//! test file (count acquisitions, hide expiry, keep a cleanup alive)
//! instead of a forwarding wrapper per file.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::sync::watch;

use crate::error::{Error, Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::{
    Checkpoint, ExpiryClock, Grant, LeaseInfo, LeaseRef, LeaseStore, StoredCheckpoint,
};

/// Counts events of a store under test (acquire calls, `Held` answers) as
/// a signal a test can wait for ([`Counter::reaches`]) instead of
/// sleeping. Clones share one count, so several stores (one per simulated
/// process) can feed one counter.
#[derive(Clone)]
pub struct Counter(Arc<watch::Sender<u64>>);

impl Default for Counter {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Counter").field(&*self.0.borrow()).finish()
    }
}

impl Counter {
    /// A counter at zero.
    pub fn new() -> Self {
        Self(Arc::new(watch::channel(0).0))
    }

    /// The count now.
    pub fn get(&self) -> u64 {
        *self.0.borrow()
    }

    /// Completes once the count is at least `n`.
    pub async fn reaches(&self, n: u64) {
        // The sender lives in `self`, so the channel cannot close here.
        let _ = self.0.subscribe().wait_for(|v| *v >= n).await;
    }

    /// A receiver that sees every later change of the count.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }

    fn bump(&self) {
        self.0.send_modify(|n| *n += 1);
    }
}

/// How a broken store keeps a TTL: the TTL it is asked for in, the one it
/// keeps out ([`FaultStore::distort_ttl`]).
type TtlDistortion = Arc<dyn Fn(Duration) -> Duration + Send + Sync>;

/// The decorator of the store tests: wraps a store, injects faults and
/// reports what reached it.
///
/// Faults: while [`FaultStore::set_unreachable`] is on, every call fails
/// with a [`StoreError`] after the configured delay, without reaching the
/// inner store; while [`FaultStore::set_fail_checkpoints`] is on, only
/// checkpoint writes do. Every call first waits [`FaultStore::set_delay`] before it
/// reaches the store, and [`FaultStore::set_reply_delay`] after the store
/// applied it (a slow reply); [`FaultStore::set_lose_replies`] loses the
/// reply of a call the store applied. [`FaultStore::hide_expiry`] hides
/// from a waiter how long a held lease has left (so that only a
/// notification or its poll interval wakes it), and
/// [`FaultStore::distort_ttl`] makes a deliberately broken store, one
/// that keeps another TTL than it is asked for, to show that a check
/// catches it.
///
/// Signals: [`FaultStore::acquires`] counts acquire calls that reached the
/// store, [`FaultStore::held_answers`] the `Held` answers among them.
/// [`FaultStore::with_guard`] keeps a value (a test's cleanup of its keys)
/// alive as long as the store.
pub struct FaultStore<S: ?Sized = dyn LeaseStore> {
    inner: Arc<S>,
    unreachable: AtomicBool,
    delay_ms: AtomicU64,
    reply_delay_ms: AtomicU64,
    lose_replies: AtomicBool,
    fail_checkpoints: AtomicBool,
    calls: AtomicU64,
    writes: AtomicU64,
    acquires: Counter,
    held: Counter,
    hide_expiry: AtomicBool,
    ttl_distortion: Mutex<Option<TtlDistortion>>,
    guard: Option<Arc<dyn Any + Send + Sync>>,
}

impl<S: LeaseStore + ?Sized> std::fmt::Debug for FaultStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultStore")
            .field("inner", &self.inner.kind())
            .field("calls", &self.calls.load(Ordering::Relaxed))
            .field("writes", &self.writes.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl FaultStore {
    /// Wraps `inner`, with no faults on.
    pub fn new(inner: Arc<dyn LeaseStore>) -> Self {
        FaultStore::over(inner)
    }
}

impl<S: LeaseStore + ?Sized> FaultStore<S> {
    /// Wraps `inner`, with no faults on, keeping its type: a test reaches
    /// the store's own methods through [`FaultStore::inner`].
    pub fn over(inner: Arc<S>) -> Self {
        Self {
            inner,
            unreachable: AtomicBool::new(false),
            delay_ms: AtomicU64::new(0),
            reply_delay_ms: AtomicU64::new(0),
            lose_replies: AtomicBool::new(false),
            fail_checkpoints: AtomicBool::new(false),
            calls: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            acquires: Counter::new(),
            held: Counter::new(),
            hide_expiry: AtomicBool::new(false),
            ttl_distortion: Mutex::new(None),
            guard: None,
        }
    }

    /// Counts acquire calls in `counter` (shared with other stores) instead
    /// of a counter of its own.
    pub fn count_acquires_in(mut self, counter: Counter) -> Self {
        self.acquires = counter;
        self
    }

    /// Keeps `guard` alive as long as this store (a test's cleanup of the
    /// keys it wrote, say).
    pub fn with_guard(mut self, guard: Arc<dyn Any + Send + Sync>) -> Self {
        self.guard = Some(guard);
        self
    }

    /// The guard given to [`FaultStore::with_guard`], to share it with
    /// another store over the same keys.
    pub fn guard(&self) -> Option<Arc<dyn Any + Send + Sync>> {
        self.guard.clone()
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// Makes the store unreachable (`true`) or reachable again.
    pub fn set_unreachable(&self, on: bool) {
        self.unreachable.store(on, Ordering::SeqCst);
    }

    /// Delays every call by `delay` before it reaches the store.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Delays every reply by `delay` after the store applied the call.
    pub fn set_reply_delay(&self, delay: Duration) {
        self.reply_delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// While on, every call reaches the store and is applied, and then its
    /// reply is lost: the caller gets a [`StoreError`] (a cut connection
    /// after the request went through).
    pub fn set_lose_replies(&self, on: bool) {
        self.lose_replies.store(on, Ordering::SeqCst);
    }

    /// While on, checkpoint writes fail with a [`StoreError`] without
    /// reaching the store, while every other call passes (a store that
    /// renews a lease but refuses its checkpoint).
    pub fn set_fail_checkpoints(&self, on: bool) {
        self.fail_checkpoints.store(on, Ordering::SeqCst);
    }

    /// While on, a `Held` answer does not say how long the lease has left
    /// (`expires_in: None`), so a waiter sleeps its poll interval unless a
    /// notification wakes it.
    pub fn hide_expiry(&self, on: bool) {
        self.hide_expiry.store(on, Ordering::SeqCst);
    }

    /// Makes this a broken store: acquire, renew and checkpoint keep
    /// `keep(ttl)` instead of the TTL they are asked for (for tests of the
    /// conformance checks themselves).
    pub fn distort_ttl(&self, keep: impl Fn(Duration) -> Duration + Send + Sync + 'static) {
        *self.ttl_distortion.lock().expect("distortion") = Some(Arc::new(keep));
    }

    /// Acquire calls that reached the inner store.
    pub fn acquires(&self) -> &Counter {
        &self.acquires
    }

    /// `Held` answers to acquire calls.
    pub fn held_answers(&self) -> &Counter {
        &self.held
    }

    /// How many calls were made, reachable or not.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// How many of the calls were writes (every call but `inspect`,
    /// `read_checkpoint` and `watch`), reachable or not.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    fn ttl(&self, ttl: Duration) -> Duration {
        match &*self.ttl_distortion.lock().expect("distortion") {
            Some(keep) => keep(ttl),
            None => ttl,
        }
    }

    /// Counts a `Held` answer to an acquisition, and hides how long the
    /// lease has left while [`Self::hide_expiry`] is on.
    fn note_held(&self, outcome: &mut Result<Grant>) {
        if let Err(Error::Held { expires_in, .. }) = outcome {
            self.held.bump();
            if self.hide_expiry.load(Ordering::SeqCst) {
                *expires_in = None;
            }
        }
    }

    async fn reply<T>(&self, r: Result<T>) -> Result<T> {
        let delay = self.reply_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if self.lose_replies.load(Ordering::SeqCst) {
            return Err(StoreError::new(
                self.inner.kind(),
                "injected fault: the reply was lost after the store applied the call",
            )
            .into());
        }
        r
    }

    /// [`Self::gate`] for a call that writes.
    async fn gate_write(&self) -> Result<()> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.gate().await
    }

    async fn gate(&self) -> Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if self.unreachable.load(Ordering::SeqCst) {
            return Err(
                StoreError::new(self.inner.kind(), "injected fault: store unreachable").into(),
            );
        }
        Ok(())
    }
}

#[async_trait]
impl<S: LeaseStore + ?Sized> LeaseStore for FaultStore<S> {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn acquire(
        &self,
        work_id: &WorkId,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> Result<Grant> {
        self.gate_write().await?;
        let mut r = self.inner.acquire(work_id, holder_id, self.ttl(ttl)).await;
        self.acquires.bump();
        self.note_held(&mut r);
        self.reply(r).await
    }
    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        self.gate_write().await?;
        self.reply(self.inner.renew(lease, self.ttl(ttl)).await)
            .await
    }
    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime> {
        self.gate_write().await?;
        if self.fail_checkpoints.load(Ordering::SeqCst) {
            return Err(
                StoreError::new(self.inner.kind(), "injected fault: checkpoint refused").into(),
            );
        }
        self.reply(self.inner.checkpoint(lease, self.ttl(ttl), data).await)
            .await
    }
    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        self.gate().await?;
        self.reply(self.inner.read_checkpoint(lease).await).await
    }
    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        self.gate_write().await?;
        self.reply(self.inner.release(lease).await).await
    }
    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        self.gate().await?;
        self.reply(self.inner.inspect(work_ids).await).await
    }
    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        self.gate_write().await?;
        self.reply(self.inner.revoke(work_id).await).await
    }
    async fn inspect_checkpoint(&self, work_id: &WorkId) -> Result<Option<StoredCheckpoint>> {
        self.gate().await?;
        self.reply(self.inner.inspect_checkpoint(work_id).await)
            .await
    }
    async fn delete_ended(&self, work_id: &WorkId, fencing_token: u64) -> Result<bool> {
        self.gate_write().await?;
        self.reply(self.inner.delete_ended(work_id, fencing_token).await)
            .await
    }
    fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        self.inner.watch(work_id)
    }
    fn expiry_clock(&self) -> ExpiryClock {
        self.inner.expiry_clock()
    }
    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }
    fn max_checkpoint_bytes(&self) -> usize {
        self.inner.max_checkpoint_bytes()
    }
    async fn renew_many(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<SystemTime>>> {
        self.gate_write().await?;
        self.reply(self.inner.renew_many(leases, self.ttl(ttl)).await)
            .await
    }
    async fn acquire_many(
        &self,
        work_ids: &[WorkId],
        holder_id: &HolderId,
        ttl: Duration,
        max: usize,
    ) -> Result<Vec<Result<Grant>>> {
        self.gate_write().await?;
        let mut r = self
            .inner
            .acquire_many(work_ids, holder_id, self.ttl(ttl), max)
            .await;
        self.acquires.bump();
        for outcome in r.iter_mut().flatten() {
            self.note_held(outcome);
        }
        self.reply(r).await
    }
    async fn release_many(&self, leases: &[LeaseRef<'_>]) -> Result<Vec<Result<()>>> {
        self.gate_write().await?;
        self.reply(self.inner.release_many(leases).await).await
    }
}
