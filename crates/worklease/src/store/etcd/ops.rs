//! The lease operations: [`LeaseStore`] for [`EtcdStore`] (acquire,
//! read checkpoint, release, revoke; renewal and checkpoint in `renew.rs`,
//! inspection in `inspect.rs`, the watch in `watch.rs`).

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{
    Compare, CompareOp, DeleteOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use futures_util::future::BoxFuture;

use crate::error::{Error, Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::record::Phase;
use crate::store::{
    Checkpoint, Grant, Handoff, LeaseEnd, LeaseInfo, LeaseRef, LeaseStore, PreviousHolder,
};

use super::inspect::lease_info;
use super::leases::Granted;
use super::rpc::Budget;
use super::snapshot::{
    bad_value, snapshot_ops, to_json, token_of, Acquisition, Snapshot, State, StoredPrevious,
};
use super::{millis, now_ms, EtcdStore, KIND, RACE_RETRIES};

/// Whether `live`, the lease key a snapshot read, is the acquisition an
/// earlier copy of this store's acquire transaction made with the etcd
/// lease `granted`: attached to that etcd lease (granted, or renewed from
/// the spares, for this call alone: no other key uses it), naming
/// `holder`, and the current acquisition (its create revision is the
/// revision of `acq`).
fn applied_ours(snap: &Snapshot, live: &KeyValue, granted: &Granted, holder: &HolderId) -> bool {
    live.lease() == granted.id
        && live.value() == holder.as_str().as_bytes()
        && snap.live_of_current().is_some()
}

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
        let keys = self.keys(work_id);
        let budget = Budget::lease(&self.config, ttl);
        // Granted once, on the first attempt that finds the lease free; its
        // countdown started after the caller sent its request, so it stays
        // valid for later attempts.
        let mut granted: Option<Granted> = None;
        let result = async {
            for _ in 0..RACE_RETRIES {
                let snap = self.snapshot(&keys, false, budget).await?;
                if let Some(live) = &snap.live {
                    if let Some(g) = granted.filter(|g| applied_ours(&snap, live, g, holder_id)) {
                        // A copy of our transaction that a member did not
                        // answer in time was applied: the acquisition is
                        // ours.
                        let token = token_of(live.create_revision());
                        let state_rev = snap.state.as_ref().map_or(0, |(_, r)| *r);
                        self.remember(work_id, token, Granted { state_rev, ..g });
                        return Ok(Grant {
                            fencing_token: token,
                            expires_at: SystemTime::now() + ttl,
                            handoff: Handoff {
                                previous: snap.previous(),
                            },
                        });
                    }
                    // Live for everyone, the same holder ID included (ADR 0002).
                    return Err(Error::Held {
                        work_id: work_id.to_string(),
                        holder_id: String::from_utf8_lossy(live.value()).into_owned(),
                        expires_in: self.time_left(live.lease(), budget).await,
                    });
                }
                let lease = match granted {
                    Some(g) => g,
                    None => *granted.insert(self.lease_for(ttl, budget).await?),
                };
                let prev = snap.acq.as_ref().map(|(acq, token)| StoredPrevious {
                    holder: acq.holder.clone(),
                    token: *token,
                    end: snap.end().as_str().to_string(),
                });
                let acquisition = Acquisition {
                    holder: holder_id.to_string(),
                    ttl_ms: millis(ttl),
                    granted_s: lease.ttl_s,
                    exp_ms: now_ms().saturating_add(millis(ttl)),
                    prev,
                };
                let acq_rev = snap.acq.as_ref().map_or(0, |(_, t)| *t);
                let state_rev = snap.state.as_ref().map_or(0, |(_, r)| *r);
                let txn = Txn::new()
                    .when([
                        Compare::create_revision(keys.live.as_str(), CompareOp::Equal, 0),
                        Compare::mod_revision(
                            keys.acquisition.as_str(),
                            CompareOp::Equal,
                            i64::try_from(acq_rev).unwrap_or(-1),
                        ),
                        Compare::mod_revision(keys.state.as_str(), CompareOp::Equal, state_rev),
                    ])
                    .and_then([
                        TxnOp::put(
                            keys.live.as_str(),
                            holder_id.as_str(),
                            Some(PutOptions::new().with_lease(lease.id)),
                        ),
                        TxnOp::put(keys.acquisition.as_str(), to_json(&acquisition), None),
                        TxnOp::delete(keys.state.as_str(), None),
                    ]);
                let resp = self.txn(txn, "acquire", budget).await?;
                if !resp.succeeded() {
                    continue; // another writer came between: read again
                }
                let token = resp
                    .header()
                    .map(|h| token_of(h.revision()))
                    .filter(|t| *t > 0)
                    .ok_or_else(|| bad_value("a transaction reply without a revision"))?;
                self.remember(work_id, token, Granted { state_rev: 0, ..lease });
                let previous = acquisition.prev.and_then(|p| {
                    Some(PreviousHolder {
                        holder_id: p.holder,
                        fencing_token: p.token,
                        ended: LeaseEnd::from_str(&p.end)?,
                    })
                });
                return Ok(Grant {
                    fencing_token: token,
                    expires_at: SystemTime::now() + ttl,
                    handoff: Handoff { previous },
                });
            }
            Err(StoreError::new(
                KIND,
                format!("the lease of {work_id} kept changing under {RACE_RETRIES} acquisition attempts"),
            )
            .into())
        }
        .await;
        if result.is_err() {
            if let Some(g) = granted {
                self.discard(g.id);
            }
        }
        result
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        self.extend(lease, ttl, None).await
    }

    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime> {
        self.extend(lease, ttl, Some(data)).await
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        let snap = self
            .snapshot(&self.keys(lease.work_id), true, self.budget_of(lease))
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
        let keys = self.keys(lease.work_id);
        let state = State {
            token: lease.fencing_token,
            phase: Phase::Released.as_str().to_string(),
            at_ms: now_ms(),
            granted_s: 0,
        };
        let txn = Txn::new()
            .when([
                Compare::create_revision(
                    keys.live.as_str(),
                    CompareOp::Equal,
                    i64::try_from(lease.fencing_token).unwrap_or(-1),
                ),
                Compare::value(
                    keys.live.as_str(),
                    CompareOp::Equal,
                    lease.holder_id.as_str(),
                ),
            ])
            .and_then([
                TxnOp::delete(
                    keys.live.as_str(),
                    Some(DeleteOptions::new().with_prev_key()),
                ),
                TxnOp::put(keys.state.as_str(), to_json(&state), None),
            ])
            .or_else(snapshot_ops(&keys, false));
        let resp = self.txn(txn, "release", self.budget_of(lease)).await?;
        if !resp.succeeded() {
            return Err(Self::failure_snapshot(&resp)?.refusal(lease));
        }
        let granted = self.remembered(lease.work_id, lease.fencing_token);
        self.forget(lease.work_id, lease.fencing_token);
        if let Some(TxnOpResponse::Delete(d)) = resp.op_responses().first() {
            if let Some(prev) = d.prev_kvs().first() {
                self.spare(granted, prev.lease());
            }
        }
        Ok(())
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        crate::store::inspect_each(work_ids, self.list_work_ids(), |id| self.inspect_one(id)).await
    }

    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        let keys = self.keys(work_id);
        let budget = Budget::plain(&self.config);
        for _ in 0..RACE_RETRIES {
            let snap = self.snapshot(&keys, true, budget).await?;
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
                self.time_left(live.lease(), budget).await,
            );
            let state = State {
                token,
                phase: Phase::Revoked.as_str().to_string(),
                at_ms: now_ms(),
                granted_s: 0,
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
            if self.txn(txn, "revoke", budget).await?.succeeded() {
                self.forget(work_id, token);
                self.discard(live.lease());
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

    /// Registers the waiter, then starts the store's watch if this is its
    /// first waiter, from the revision after the newest one the store has
    /// seen: every deletion of a `live` key after this call has a larger
    /// revision, so it reaches the waiter even if the watch is set up only
    /// later. Before the store has seen any revision, the future is ready
    /// at once (one spurious wake-up: the waiter's next attempt reads).
    fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        let one = self.wakeups.watchers.watch(work_id)?;
        let seen = self.seen.load(Ordering::Relaxed);
        if seen == 0 {
            return Some(Box::pin(std::future::ready(())));
        }
        if !self.start_watching(seen + 1) {
            return None;
        }
        let mut all = self.wakeups.all.subscribe();
        Some(Box::pin(async move {
            tokio::select! {
                () = one => {}
                // An error means the store is gone: nothing more will change.
                _ = all.changed() => {}
            }
        }))
    }
}
