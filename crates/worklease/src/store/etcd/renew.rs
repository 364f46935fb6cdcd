//! Checkpoint (and the renewal of a lease whose `live` key another process
//! moved or wrote meanwhile): one transaction after the etcd lease's
//! keep-alive, writing `state` (the per-lease revision contenders and the
//! sweep see). Renewals of one lease or of a batch are in `batch.rs`.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use etcd_client::{Compare, CompareOp, PutOptions, ResponseHeader, Txn, TxnOp};
use tokio::time::Instant;

use crate::error::{Result, StoreError};
use crate::store::record::Phase;
use crate::store::LeaseRef;

use super::leases::ttl_secs;
use super::records::{end_of, extend_until, Claim, Granted};
use super::rpc::Budget;
use super::snapshot::{snapshot_ops, to_json, State};
use super::{millis, now_ms, Core, KIND, RACE_RETRIES};

impl Core {
    /// Extends `lease` to `ttl` from now (and stores `checkpoint`, if
    /// any), in one transaction after the etcd lease's renewal. The
    /// transaction compares the token, the holder, the etcd lease and the
    /// revision of `state` this store last saw: sent twice (a member that
    /// hung, then the next one), it applies at most once per revision of
    /// `state`, and a copy applied late cannot undo a newer checkpoint.
    pub(super) async fn extend(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        checkpoint: Option<Bytes>,
    ) -> Result<SystemTime> {
        let keys = self.keys(lease.work_id);
        let want = ttl_secs(ttl);
        let budget = Budget::lease(&self.config, ttl);
        let start = Instant::now();
        let until = end_of(start, ttl);
        // The record, moved on to this renewal's end; or, given up, taken
        // out of the records (see `sweep.rs`).
        let (mut known, given_up) = self
            .records
            .lock()
            .ok()
            .map(|mut r| match r.claim(lease, start, until) {
                Claim::Known(g) => (Some(g.clone()), None),
                Claim::GivenUp(g) => (None, Some(g)),
                Claim::Unknown => (None, None),
            })
            .unwrap_or((None, None));
        if let Some(g) = given_up {
            let gone = vec![(lease.work_id.clone(), lease.fencing_token, g)];
            let ended = match self.end_given_up(&gone, budget).await {
                Ok(ended) => ended,
                Err(e) => {
                    self.restore(gone);
                    return Err(e);
                }
            };
            if let Some(snap) = ended.into_iter().next().flatten() {
                // Written meanwhile by another process: renewed, if it is
                // still this holder's (read again below).
                snap.check(lease)?;
            } else {
                return Err(crate::Error::expired(lease));
            }
        }
        for _ in 0..RACE_RETRIES {
            let current = match known.take() {
                Some(g) => g,
                None => {
                    // Another process's acquisition, one this store forgot,
                    // or one whose `state` moved: learn its etcd lease and
                    // the revision of its state first.
                    let snap = self.snapshot(&keys, false, budget).await?;
                    let live = snap.check(lease)?;
                    Granted {
                        id: live.lease(),
                        ttl_s: snap.granted(),
                        until,
                        live_rev: live.mod_revision(),
                        state_rev: snap.state_rev(),
                        holder: lease.holder_id.clone(),
                        own: false,
                    }
                }
            };
            // The etcd lease must last the TTL from now: renew it when it
            // was granted at least as long, else move to the holder's
            // session lease of this TTL.
            let sent = Instant::now();
            let attached = if current.ttl_s >= want {
                if !self.keep_alive_after(current.id, sent, budget).await? {
                    // etcd answers so only once it deleted the lease's
                    // keys; ours may have moved to another lease meanwhile
                    // (another handle of the holder).
                    self.forget(lease.work_id, lease.fencing_token);
                    let snap = self.snapshot(&keys, false, budget).await?;
                    if snap.check(lease)?.lease() == current.id {
                        return Err(crate::Error::expired(lease));
                    }
                    known = None;
                    continue;
                }
                current.clone()
            } else {
                let (s, stale) = self.session_for(lease.holder_id, ttl, sent, budget).await?;
                if stale && !self.keep_alive_after(s.id, sent, budget).await? {
                    known = None;
                    continue;
                }
                Granted {
                    id: s.id,
                    ttl_s: s.ttl_s,
                    ..current.clone()
                }
            };
            let moved = attached.id != current.id;
            let state = State {
                token: lease.fencing_token,
                phase: Phase::Held.as_str().to_string(),
                at_ms: now_ms().saturating_add(millis(ttl)),
                granted_s: attached.ttl_s,
                ttl_ms: millis(ttl),
            };
            let mut ops = vec![TxnOp::put(keys.state.as_str(), to_json(&state), None)];
            if moved {
                ops.push(TxnOp::put(
                    keys.live.as_str(),
                    lease.holder_id.as_str(),
                    Some(PutOptions::new().with_lease(attached.id)),
                ));
            }
            if let Some(data) = &checkpoint {
                ops.push(TxnOp::put(keys.checkpoint.as_str(), data.to_vec(), None));
            }
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
                    Compare::lease(keys.live.as_str(), CompareOp::Equal, current.id),
                    Compare::mod_revision(keys.state.as_str(), CompareOp::Equal, current.state_rev),
                ])
                .and_then(ops)
                .or_else(snapshot_ops(&keys, false));
            let what = if checkpoint.is_some() {
                "checkpoint"
            } else {
                "renew"
            };
            let resp = self.txn(txn, what, budget).await?;
            if resp.succeeded() {
                let rev = resp.header().map_or(0, ResponseHeader::revision);
                let mut g = Granted {
                    live_rev: if moved { rev } else { current.live_rev },
                    state_rev: rev,
                    own: self.is_session(attached.id),
                    ..attached
                };
                extend_until(&mut g.until, until);
                self.remember(lease.work_id, lease.fencing_token, g);
                return Ok(SystemTime::now() + ttl);
            }
            let snap = Core::failure_snapshot(&resp)?;
            if let Err(e) = snap.check(lease) {
                self.forget(lease.work_id, lease.fencing_token);
                return Err(e);
            }
            // Still ours, but on another etcd lease or with a newer state
            // (another handle of the holder, or this renewal's own earlier
            // copy, applied by a member that did not answer in time): learn
            // them, again.
            known = None;
        }
        Err(StoreError::new(
            KIND,
            format!(
                "the etcd lease of {} kept changing under {RACE_RETRIES} renewals",
                lease.work_id
            ),
        )
        .into())
    }
}
