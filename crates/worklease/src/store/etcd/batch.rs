//! Renewal of one lease or of a batch: one etcd transaction, with a
//! keep-alive of each distinct etcd lease of the batch beside it (one,
//! usually: the holder's session lease). The transaction's success branch
//! holds one nested transaction per lease and a put of the key of each
//! session lease whose leases it renews by a compare alone:
//!
//! * a lease on a session lease of this store, as this store last wrote
//!   it: `If live's mod revision is as recorded` and nothing else. etcd
//!   writes nothing per lease; the batch's put of the session key moves
//!   the revision contenders watch (the observation rule, `observe.rs`),
//!   atomically with every compare that succeeded;
//! * any other lease (on another process's session lease, one this store
//!   did not know, or one asking for a longer TTL than its etcd lease has,
//!   which moves `live` to the holder's session lease of that TTL): `If
//!   live's mod revision is as read Then put state (and live)`, a
//!   per-lease write that contenders see, as before sessions;
//! * a lease its holder gave up (its time ran out with no renewal sent
//!   since): deleted as the sweep does (`sweep.rs`), answering `Expired`.
//!
//! A nested transaction that fails writes nothing, and the batch reads the
//! keys of the failed leases in a second transaction to name each one's
//! error with the single call's rules (`Snapshot::check`): one round trip
//! when every lease renews, two when one did not. A batch transaction has
//! room for two session keys (`layout.rs`); the leases of any further
//! session of the batch (rare: a holder's leases are on one session per
//! TTL) are renewed with a write of their own.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use futures_util::future::join_all;
use std::ops::Range;
use tokio::time::Instant;

use crate::error::{Error, Result, StoreError};
use crate::limits::WorkId;
use crate::store::record::Phase;
use crate::store::LeaseRef;

use super::acquire::lease_missing;
use super::keys::{live_key, live_key_len, session_key};
use super::layout::{OP_BYTES, TAIL_OPS};
use super::leases::{ttl_secs, Session};
use super::records::{end_of, extend_until, Claim, Granted};
use super::rpc::Budget;
use super::snapshot::{to_json, State};
use super::{millis, now_ms, Core, KIND};

/// How one lease of a batch is renewed.
enum Plan {
    /// Answered already (a read showed it is not this holder's).
    Done,
    /// Not known to this store: its keys are read first.
    Unknown,
    /// On session lease `id` of this store, `live` as this store last
    /// wrote it at `live_rev`: a compare only, the batch puts the session
    /// key.
    Compare { id: i64, live_rev: i64 },
    /// A write of `state`, and of `live` when it moves to session lease
    /// `to` (a longer TTL than its etcd lease has).
    Write { from: Granted, to: Option<Session> },
    /// Its holder gave it up: `live` is deleted, the answer is `Expired`.
    GivenUp(Granted),
}

/// Per distinct etcd lease, the answer of its keep-alive.
type Kept = Vec<(i64, Result<bool>)>;

fn kept_of(kept: &Kept, id: i64) -> Option<&Result<bool>> {
    kept.iter().find(|(k, _)| *k == id).map(|(_, a)| a)
}

/// A generous size of a `state` value, in bytes.
const STATE_BYTES: usize = 256;

impl Core {
    /// Renews each of `leases` for `ttl` (see the module docs); per lease
    /// the new expiry or the single renewal's error.
    pub(super) async fn renew_batch(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<SystemTime>>> {
        if let Some(out) = self.renew_round(leases, ttl, true).await? {
            return Ok(out);
        }
        // A session lease of the batch had ended (and its keys with it):
        // forgotten, the batch goes again.
        self.renew_round(leases, ttl, false).await?.ok_or_else(|| {
            StoreError::new(KIND, "the etcd session lease keeps ending under renewals").into()
        })
    }

    /// How each of `leases` is renewed by a batch sent at `sent`, which
    /// counts on it until `until`: from the records, under one lock.
    fn plan(&self, leases: &[LeaseRef<'_>], sent: Instant, until: Instant, want: i64) -> Vec<Plan> {
        let sessions: Vec<i64> = self.sessions.lock().map(|s| s.ids()).unwrap_or_default();
        let Ok(mut records) = self.records.lock() else {
            return leases.iter().map(|_| Plan::Unknown).collect();
        };
        leases
            .iter()
            .map(|lease| match records.claim(*lease, sent, until) {
                Claim::Unknown => Plan::Unknown,
                Claim::GivenUp(g) => Plan::GivenUp(g),
                Claim::Known(g) if g.own && g.ttl_s >= want && sessions.contains(&g.id) => {
                    Plan::Compare {
                        id: g.id,
                        live_rev: g.live_rev,
                    }
                }
                Claim::Known(g) => Plan::Write {
                    from: g.clone(),
                    to: None,
                },
            })
            .collect()
    }

    /// One try of a batch renewal; `None` when a session lease of the
    /// batch had ended and `may_retry` (it is then forgotten).
    async fn renew_round(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
        may_retry: bool,
    ) -> Result<Option<Vec<Result<SystemTime>>>> {
        if leases.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let sent = Instant::now();
        let budget = Budget::lease(&self.config, ttl);
        let want = ttl_secs(ttl);
        let until = end_of(sent, ttl);
        let mut out: Vec<Option<Result<SystemTime>>> = leases.iter().map(|_| None).collect();
        let mut plans = self.plan(leases, sent, until, want);
        self.learn(leases, &mut plans, &mut out, until, budget)
            .await?;
        // Leases asking for more than their etcd lease was granted move to
        // the holder's session lease of this TTL.
        let mut refresh = BTreeSet::new();
        for (plan, lease) in plans.iter_mut().zip(leases) {
            match plan {
                Plan::Compare { id, .. } => {
                    refresh.insert(*id);
                }
                Plan::Write { from, to } => {
                    if from.ttl_s < want {
                        let (s, stale) =
                            self.session_for(lease.holder_id, ttl, sent, budget).await?;
                        if s.id == from.id {
                            refresh.insert(s.id);
                        } else {
                            *to = Some(s);
                            if stale {
                                refresh.insert(s.id);
                            }
                        }
                    } else {
                        refresh.insert(from.id);
                    }
                }
                Plan::Done | Plan::Unknown | Plan::GivenUp(_) => {}
            }
        }
        let sessions = self.session_keys_to_put(leases, &mut plans);
        let (sent_ops, sizes, counts_on) = self.renewal_index(leases, &plans);
        let prefix = self.config.prefix.as_str();
        // Built afresh for each try (see `txn_with`).
        let build = |range: Range<usize>| -> Vec<TxnOp> {
            sent_ops[range]
                .iter()
                .filter_map(|&i| self.renewal_op(leases[i], &plans[i], ttl))
                .collect()
        };
        // Each transaction of the batch puts the session keys of the
        // leases it renews by a compare.
        let tail = |range: Range<usize>| -> Vec<TxnOp> {
            sessions
                .iter()
                .filter(|(id, _)| counts_on[range.clone()].contains(&Some(*id)))
                .map(|&(id, first)| {
                    TxnOp::put(
                        session_key(prefix, id),
                        leases[first].holder_id.as_str(),
                        Some(PutOptions::new().with_lease(id)),
                    )
                })
                .collect()
        };
        let kept = join_all(
            refresh
                .iter()
                .map(|id| async move { (*id, self.keep_alive_after(*id, sent, budget).await) }),
        );
        let txn = async {
            if sizes.is_empty() {
                Ok(Vec::new())
            } else {
                self.send_built(&sizes, build, tail, "renew", budget).await
            }
        };
        let (kept, replies) = tokio::join!(kept, txn);
        if replies.is_err() {
            // The deletions of given-up leases may not have been applied:
            // the sweep tries them again.
            let given_up = leases.iter().zip(&plans).filter_map(|(l, p)| match p {
                Plan::GivenUp(g) => Some((l.work_id.clone(), l.fencing_token, g.clone())),
                _ => None,
            });
            self.restore(given_up.collect());
        }
        let replies = match replies {
            Err(e) if may_retry && lease_missing(&e) => {
                let mut found = false;
                for (id, alive) in &kept {
                    if matches!(alive, Ok(false)) {
                        self.session_gone(*id);
                        found = true;
                    }
                }
                if !found {
                    for (id, _) in &sessions {
                        if !self.keep_alive(*id, budget).await? {
                            self.session_gone(*id);
                        }
                    }
                }
                return Ok(None);
            }
            r => r?,
        };
        let mut failed = Vec::new();
        let expires = SystemTime::now() + ttl;
        for (&i, one) in sent_ops.iter().zip(replies) {
            if !one.txn.succeeded() {
                failed.push(i);
                continue;
            }
            out[i] = Some(self.renewed(leases[i], &plans[i], &kept, expires, until, one.revision));
        }
        self.explain(leases, &failed, &mut out, ttl, budget).await?;
        Ok(Some(
            out.into_iter()
                .map(|o| {
                    o.unwrap_or_else(|| {
                        Err(StoreError::new(KIND, "a lease left out of a renewal").into())
                    })
                })
                .collect(),
        ))
    }

    /// Reads the keys of the leases this store does not know: each is
    /// renewed with a write (`state`), or answered with why not.
    async fn learn(
        &self,
        leases: &[LeaseRef<'_>],
        plans: &mut [Plan],
        out: &mut [Option<Result<SystemTime>>],
        until: Instant,
        budget: Budget,
    ) -> Result<()> {
        let unknown: Vec<usize> = (0..leases.len())
            .filter(|&i| matches!(plans[i], Plan::Unknown))
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        let ids: Vec<&WorkId> = unknown.iter().map(|&i| leases[i].work_id).collect();
        for (&i, snap) in unknown.iter().zip(self.read_batch(&ids, budget).await?) {
            match snap.check(leases[i]) {
                Err(e) => {
                    out[i] = Some(Err(e));
                    plans[i] = Plan::Done;
                }
                Ok(live) => {
                    plans[i] = Plan::Write {
                        from: Granted {
                            id: live.lease(),
                            ttl_s: snap.granted(),
                            until,
                            live_rev: live.mod_revision(),
                            state_rev: snap.state_rev(),
                            holder: leases[i].holder_id.clone(),
                            own: false,
                        },
                        to: None,
                    }
                }
            }
        }
        Ok(())
    }

    /// The session keys the batch puts, with the holder each names: those
    /// of the sessions whose leases are renewed by a compare, as many as
    /// the transaction has room for (the most leases first); the leases
    /// of the others are renewed with a write instead.
    fn session_keys_to_put(
        &self,
        leases: &[LeaseRef<'_>],
        plans: &mut [Plan],
    ) -> Vec<(i64, usize)> {
        let mut counts: HashMap<i64, (usize, usize)> = HashMap::new();
        for (i, plan) in plans.iter().enumerate() {
            if let Plan::Compare { id, .. } = plan {
                counts.entry(*id).or_insert((0, i)).0 += 1;
            }
        }
        let room = TAIL_OPS;
        let mut by_size: Vec<(i64, usize, usize)> =
            counts.into_iter().map(|(id, (n, i))| (id, n, i)).collect();
        by_size.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let keep: Vec<(i64, usize)> = by_size
            .iter()
            .take(room)
            .map(|&(id, _, i)| (id, i))
            .collect();
        if keep.len() < by_size.len() {
            let records = self.records.lock().ok();
            for (i, plan) in plans.iter_mut().enumerate() {
                let Plan::Compare { id, .. } = plan else {
                    continue;
                };
                if keep.iter().any(|(k, _)| k == id) {
                    continue;
                }
                let from = records
                    .as_ref()
                    .and_then(|r| {
                        r.leases
                            .get(&(leases[i].work_id.clone(), leases[i].fencing_token))
                    })
                    .cloned();
                *plan = match from {
                    Some(from) => Plan::Write { from, to: None },
                    None => Plan::Unknown,
                };
            }
        }
        keep
    }

    /// The leases the batch sends (their indices), the estimated size of
    /// each one's nested transaction, and the session whose key it counts
    /// on (renewed by a compare).
    fn renewal_index(
        &self,
        leases: &[LeaseRef<'_>],
        plans: &[Plan],
    ) -> (Vec<usize>, Vec<usize>, Vec<Option<i64>>) {
        let prefix = self.config.prefix.as_str();
        let mut sent_ops = Vec::with_capacity(leases.len());
        let mut sizes = Vec::with_capacity(leases.len());
        let mut counts_on = Vec::with_capacity(leases.len());
        for (i, (plan, lease)) in plans.iter().zip(leases).enumerate() {
            let key = live_key_len(prefix, lease.work_id) + OP_BYTES;
            let (size, session) = match plan {
                Plan::Done | Plan::Unknown => continue,
                Plan::Compare { id, .. } => (key, Some(*id)),
                Plan::Write { .. } | Plan::GivenUp(_) => (4 * key + STATE_BYTES, None),
            };
            sent_ops.push(i);
            sizes.push(size);
            counts_on.push(session);
        }
        (sent_ops, sizes, counts_on)
    }

    /// The nested transaction of `lease` by `plan`.
    fn renewal_op(&self, lease: LeaseRef<'_>, plan: &Plan, ttl: Duration) -> Option<TxnOp> {
        Some(match plan {
            Plan::Done | Plan::Unknown => return None,
            Plan::Compare { live_rev, .. } => TxnOp::txn(Txn::new().when([Compare::mod_revision(
                live_key(&self.config.prefix, lease.work_id),
                CompareOp::Equal,
                *live_rev,
            )])),
            Plan::Write { from, to } => {
                let keys = self.keys(lease.work_id);
                let state = to_json(&State {
                    token: lease.fencing_token,
                    phase: Phase::Held.as_str().to_string(),
                    at_ms: now_ms().saturating_add(millis(ttl)),
                    granted_s: to.map_or(from.ttl_s, |s| s.ttl_s),
                    ttl_ms: millis(ttl),
                });
                let mut then = vec![TxnOp::put(keys.state.as_str(), state, None)];
                if let Some(s) = to {
                    then.push(TxnOp::put(
                        keys.live.as_str(),
                        lease.holder_id.as_str(),
                        Some(PutOptions::new().with_lease(s.id)),
                    ));
                }
                TxnOp::txn(
                    Txn::new()
                        .when([Compare::mod_revision(
                            keys.live.as_str(),
                            CompareOp::Equal,
                            from.live_rev,
                        )])
                        .and_then(then),
                )
            }
            Plan::GivenUp(g) => self.give_up_part(lease.work_id, lease.fencing_token, g).op,
        })
    }

    /// The answer for a lease whose nested transaction succeeded, and its
    /// record brought up to date.
    fn renewed(
        &self,
        lease: LeaseRef<'_>,
        plan: &Plan,
        kept: &Kept,
        expires: SystemTime,
        until: Instant,
        rev: i64,
    ) -> Result<SystemTime> {
        let id = match plan {
            Plan::GivenUp(_) => return Err(Error::expired(lease)),
            Plan::Compare { id, .. } => *id,
            Plan::Write { from, to } => to.map_or(from.id, |s| s.id),
            Plan::Done | Plan::Unknown => {
                return Err(StoreError::new(KIND, "a renewal of a lease it did not send").into())
            }
        };
        match kept_of(kept, id) {
            Some(Ok(false)) => {
                // etcd ended the etcd lease after the transaction: with it
                // the lease's key.
                self.forget(lease.work_id, lease.fencing_token);
                return Err(Error::expired(lease));
            }
            Some(Err(e)) => {
                return Err(StoreError::new(
                    KIND,
                    format!("renew the etcd lease of {}: {e}", lease.work_id),
                )
                .into())
            }
            _ => {}
        }
        if let Plan::Write { from, to } = plan {
            let mut g = Granted {
                id,
                ttl_s: to.map_or(from.ttl_s, |s| s.ttl_s),
                until: from.until,
                live_rev: if to.is_some() { rev } else { from.live_rev },
                state_rev: rev,
                holder: lease.holder_id.clone(),
                own: self.is_session(id),
            };
            extend_until(&mut g.until, until);
            self.remember(lease.work_id, lease.fencing_token, g);
        }
        Ok(expires)
    }

    /// Names the error of each lease of `failed` (its nested transaction
    /// failed) from a read of its keys; one still this holder's (another
    /// process wrote it meanwhile) gets the single renewal.
    async fn explain(
        &self,
        leases: &[LeaseRef<'_>],
        failed: &[usize],
        out: &mut [Option<Result<SystemTime>>],
        ttl: Duration,
        budget: Budget,
    ) -> Result<()> {
        if failed.is_empty() {
            return Ok(());
        }
        let ids: Vec<&WorkId> = failed.iter().map(|&i| leases[i].work_id).collect();
        let mut retry = Vec::new();
        for (&i, snap) in failed.iter().zip(self.read_batch(&ids, budget).await?) {
            let lease = leases[i];
            match snap.check(lease) {
                Err(e) => {
                    self.forget(lease.work_id, lease.fencing_token);
                    out[i] = Some(Err(e));
                }
                Ok(_) => retry.push(i),
            }
        }
        for i in retry {
            self.forget(leases[i].work_id, leases[i].fencing_token);
            out[i] = Some(self.extend(leases[i], ttl, None).await);
        }
        Ok(())
    }
}
