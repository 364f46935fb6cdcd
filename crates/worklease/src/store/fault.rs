//! A store that wraps a store and injects faults: the decorator shape of
//! `object_store`'s `throttle.rs`, for tests of renewal and of the
//! contract under failures (feature `testkit`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::BoxFuture;

use crate::error::{Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::{Checkpoint, ExpiryClock, Grant, LeaseInfo, LeaseRef, LeaseStore};

/// Wraps a store; while [`FaultStore::set_unreachable`] is on, every call
/// fails with a [`StoreError`] after the configured delay, without reaching
/// the inner store. Every call first waits [`FaultStore::set_delay`] before
/// it reaches the store, and [`FaultStore::set_reply_delay`] after the store
/// applied it (a slow or lost reply).
pub struct FaultStore {
    inner: Arc<dyn LeaseStore>,
    unreachable: AtomicBool,
    delay_ms: AtomicU64,
    reply_delay_ms: AtomicU64,
    calls: AtomicU64,
}

impl FaultStore {
    /// Wraps `inner`, with no faults on.
    pub fn new(inner: Arc<dyn LeaseStore>) -> Self {
        Self {
            inner,
            unreachable: AtomicBool::new(false),
            delay_ms: AtomicU64::new(0),
            reply_delay_ms: AtomicU64::new(0),
            calls: AtomicU64::new(0),
        }
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

    async fn reply<T>(&self, r: T) -> T {
        let delay = self.reply_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        r
    }

    /// How many calls were made, reachable or not.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
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
impl LeaseStore for FaultStore {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn acquire(
        &self,
        work_id: &WorkId,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> Result<Grant> {
        self.gate().await?;
        self.reply(self.inner.acquire(work_id, holder_id, ttl).await)
            .await
    }
    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        self.gate().await?;
        self.reply(self.inner.renew(lease, ttl).await).await
    }
    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime> {
        self.gate().await?;
        self.reply(self.inner.checkpoint(lease, ttl, data).await)
            .await
    }
    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        self.gate().await?;
        self.reply(self.inner.read_checkpoint(lease).await).await
    }
    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        self.gate().await?;
        self.reply(self.inner.release(lease).await).await
    }
    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        self.gate().await?;
        self.reply(self.inner.inspect(work_ids).await).await
    }
    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        self.gate().await?;
        self.reply(self.inner.revoke(work_id).await).await
    }
    fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        self.inner.watch(work_id)
    }
    fn expiry_clock(&self) -> ExpiryClock {
        self.inner.expiry_clock()
    }
}
