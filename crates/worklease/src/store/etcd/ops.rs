//! The lease operations: [`LeaseStore`] for [`EtcdStore`] (acquire,
//! read checkpoint, release, revoke; the acquisition itself in
//! `acquire.rs`, renewal of one lease or a batch in `batch.rs`, checkpoint
//! in `renew.rs`, inspection in `inspect.rs`, the watch in `watch.rs`).

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use futures_util::future::BoxFuture;

use crate::error::{Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::record::Phase;
use crate::store::{Checkpoint, Grant, Handoff, LeaseInfo, LeaseRef, LeaseStore, StoredCheckpoint};

use super::inspect::lease_info;
use super::rpc::Budget;
use super::snapshot::{to_json, State};
use super::{now_ms, EtcdStore, KIND, RACE_RETRIES};

#[async_trait]
impl LeaseStore for EtcdStore {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn acquire(
        &self,
        work_id: &WorkId,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> Result<Grant> {
        self.core
            .acquire_batch(std::slice::from_ref(work_id), holder_id, ttl, 1)
            .await?
            .pop()
            .unwrap_or_else(|| {
                Err(StoreError::new(KIND, "an acquisition without an outcome").into())
            })
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        self.core
            .renew_batch(&[lease], ttl)
            .await?
            .pop()
            .unwrap_or_else(|| Err(StoreError::new(KIND, "a renewal without an outcome").into()))
    }

    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime> {
        self.core.extend(lease, ttl, Some(data)).await
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        let snap = self
            .core
            .snapshot(
                &self.core.keys(lease.work_id),
                true,
                self.core.budget_of(lease),
            )
            .await?;
        snap.check(lease)?;
        Ok(Checkpoint {
            data: snap.checkpoint.clone(),
            handoff: Handoff {
                previous: snap.previous(),
            },
        })
    }

    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        self.core
            .release_batch(&[lease])
            .await?
            .pop()
            .unwrap_or_else(|| Err(StoreError::new(KIND, "a release without an outcome").into()))
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        crate::store::inspect_each(work_ids, self.core.list_work_ids(), |id| {
            self.core.inspect_one(id)
        })
        .await
    }

    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        let keys = self.core.keys(work_id);
        let budget = Budget::plain(&self.core.config);
        for _ in 0..RACE_RETRIES {
            let snap = self.core.snapshot(&keys, true, budget).await?;
            let Some(token) = snap.token() else {
                return Ok(None);
            };
            let Some(live) = snap.live_of_current() else {
                // Not live: nothing to end.
                return Ok(lease_info(work_id.clone(), &snap, None));
            };
            let before = lease_info(
                work_id.clone(),
                &snap,
                self.core.time_left(live.lease(), budget).await,
            );
            let state = State {
                token,
                phase: Phase::Revoked.as_str().to_string(),
                at_ms: now_ms(),
                granted_s: 0,
                ttl_ms: 0,
            };
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    keys.live.as_str(),
                    CompareOp::Equal,
                    live.mod_revision(),
                )])
                .and_then([
                    TxnOp::delete(keys.live.as_str(), None),
                    TxnOp::put(keys.state.as_str(), to_json(&state), None),
                ]);
            if self.core.txn(txn, "revoke", budget).await?.succeeded() {
                // The etcd lease stays: it is the holder's session lease,
                // which its other keys share.
                self.core.forget(work_id, token);
                return Ok(before);
            }
        }
        Err(StoreError::new(
            KIND,
            format!(
                "the lease of {work_id} kept changing under {RACE_RETRIES} revocation attempts"
            ),
        )
        .into())
    }

    async fn inspect_checkpoint(&self, work_id: &WorkId) -> Result<Option<StoredCheckpoint>> {
        let keys = self.core.keys(work_id);
        let budget = Budget::plain(&self.core.config);
        let snap = self.core.snapshot(&keys, true, budget).await?;
        let left = match snap.live_of_current() {
            Some(live) => self.core.time_left(live.lease(), budget).await,
            None => None,
        };
        Ok(
            lease_info(work_id.clone(), &snap, left).map(|lease| StoredCheckpoint {
                lease,
                data: snap.checkpoint.clone(),
            }),
        )
    }

    /// One transaction: `If acq's mod revision is fencing_token And live
    /// is absent Then delete acq, state, ckpt`. No floor is needed: tokens
    /// are etcd revisions, global and monotonic (compaction keeps the
    /// revision counter), so the next acquisition's is larger. A `live`
    /// key etcd still keeps (even one its holder gave up) keeps the lease.
    async fn delete_ended(&self, work_id: &WorkId, fencing_token: u64) -> Result<bool> {
        let Ok(revision) = i64::try_from(fencing_token) else {
            return Ok(false);
        };
        let keys = self.core.keys(work_id);
        let budget = Budget::plain(&self.core.config);
        let txn = Txn::new()
            .when([
                Compare::mod_revision(keys.acquisition.as_str(), CompareOp::Equal, revision),
                Compare::create_revision(keys.live.as_str(), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::delete(keys.acquisition.as_str(), None),
                TxnOp::delete(keys.state.as_str(), None),
                TxnOp::delete(keys.checkpoint.as_str(), None),
            ]);
        Ok(self
            .core
            .txn(txn, "delete an ended lease", budget)
            .await?
            .succeeded())
    }

    /// [`super::batch_capacity`] of `max_txn_ops` (the URL's, default
    /// [`super::MAX_TXN_OPS`]): [`super::MAX_BATCH`] (1,000) by default.
    fn max_batch(&self) -> usize {
        self.core.max_batch_len()
    }

    async fn renew_many(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<SystemTime>>> {
        let mut out = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(self.core.max_batch_len()) {
            out.extend(self.core.renew_batch(chunk, ttl).await?);
        }
        Ok(out)
    }

    async fn acquire_many(
        &self,
        work_ids: &[WorkId],
        holder_id: &HolderId,
        ttl: Duration,
        max: usize,
    ) -> Result<Vec<Result<Grant>>> {
        if work_ids.is_empty() || max == 0 {
            return Ok(Vec::new());
        }
        self.core.acquire_batch(work_ids, holder_id, ttl, max).await
    }

    async fn release_many(&self, leases: &[LeaseRef<'_>]) -> Result<Vec<Result<()>>> {
        let mut out = Vec::with_capacity(leases.len());
        for chunk in leases.chunks(self.core.max_batch_len()) {
            out.extend(self.core.release_batch(chunk).await?);
        }
        Ok(out)
    }

    /// Registers the waiter, then starts the store's watch if this is its
    /// first waiter, from the revision after the newest one the store has
    /// seen: every deletion of a `live` key after this call has a larger
    /// revision, so it reaches the waiter even if the watch is set up only
    /// later. Before the store has seen any revision, the future is ready
    /// at once (one spurious wake-up: the waiter's next attempt reads).
    fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        let one = self.core.wakeups.watchers.watch(work_id)?;
        let seen = self.core.seen.load(Ordering::Relaxed);
        if seen == 0 {
            return Some(Box::pin(std::future::ready(())));
        }
        if !self.core.start_watching(seen + 1) {
            return None;
        }
        let mut all = self.core.wakeups.all.subscribe();
        Some(Box::pin(async move {
            tokio::select! {
                () = one => {}
                // An error means the store is gone: nothing more will change.
                _ = all.changed() => {}
            }
        }))
    }
}
