//! Renewal and release of one lease or of a batch: one etcd transaction
//! whose success branch holds one nested transaction per lease (`If the
//! lease is this holder's Then write Else read its keys`), so each lease's
//! outcome comes back in the one reply, with the single call's rules
//! (`Snapshot::check` and `refusal`). A renewal also keeps each distinct
//! session lease of the batch alive, beside the transaction; a session's
//! keys whose holder gave them up are deleted first (see
//! [`EtcdStore::abandoned`]).
//!
//! Why nested transactions rather than one transaction comparing every
//! lease (whose failure branch reads them all, and a second transaction
//! renews those still ours): a nested transaction per lease renews every
//! lease that is still ours in one round trip even when one of the batch
//! was taken over, and etcd counts the `--max-txn-ops` limit (128 by
//! default) per level of nesting, so a batch of 128 leases fits where a
//! flat transaction of four compares per lease would hold 32.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use futures_util::future::join_all;
use tokio::time::Instant;

use crate::error::{Error, Result, StoreError};
use crate::limits::WorkId;
use crate::store::record::Phase;
use crate::store::LeaseRef;

use super::acquire::nested;
use super::leases::{ttl_secs, Granted};
use super::rpc::Budget;
use super::snapshot::{snapshot_ops, to_json, Free, Snapshot, State, StoredPrevious};
use super::{millis, now_ms, EtcdStore, KIND};

/// Compares that `live` is the acquisition `lease` names.
fn is_ours(live: &str, lease: LeaseRef<'_>) -> [Compare; 2] {
    [
        Compare::create_revision(
            live,
            CompareOp::Equal,
            i64::try_from(lease.fencing_token).unwrap_or(-1),
        ),
        Compare::value(live, CompareOp::Equal, lease.holder_id.as_str()),
    ]
}

fn expired(lease: LeaseRef<'_>) -> Error {
    Error::Expired {
        work_id: lease.work_id.to_string(),
        fencing_token: lease.fencing_token,
    }
}

impl EtcdStore {
    /// Reads the keys of each of `leases` in one transaction.
    async fn read_batch(&self, leases: &[LeaseRef<'_>], budget: Budget) -> Result<Vec<Snapshot>> {
        let ops: Vec<TxnOp> = leases
            .iter()
            .map(|l| TxnOp::txn(Txn::new().and_then(snapshot_ops(&self.keys(l.work_id), false))))
            .collect();
        let resp = self
            .txn(Txn::new().and_then(ops), "read leases", budget)
            .await?;
        nested(&resp, leases.len())?
            .into_iter()
            .map(|r| Snapshot::from_responses(r.op_responses()))
            .collect()
    }

    /// Deletes the `live` keys of leases their holder gave up, each
    /// comparing the token, the session lease and the `state` revision
    /// this store last saw (so a renewal by another process of the same
    /// token is left alone). Best effort: one that stays is freed by
    /// etcd's expiry or a contender's observation.
    pub(super) async fn abandon(&self, gone: &[(WorkId, u64, Granted)], budget: Budget) {
        for chunk in gone.chunks(self.max_batch_len()) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|(w, token, g)| {
                    let keys = self.keys(w);
                    TxnOp::txn(
                        Txn::new()
                            .when([
                                Compare::create_revision(
                                    keys.live.as_str(),
                                    CompareOp::Equal,
                                    i64::try_from(*token).unwrap_or(-1),
                                ),
                                Compare::lease(keys.live.as_str(), CompareOp::Equal, g.id),
                                Compare::mod_revision(
                                    keys.state.as_str(),
                                    CompareOp::Equal,
                                    g.state_rev,
                                ),
                            ])
                            .and_then([TxnOp::delete(keys.live.as_str(), None)]),
                    )
                })
                .collect();
            if let Err(e) = self
                .txn(Txn::new().and_then(ops), "end given-up leases", budget)
                .await
            {
                tracing::debug!(error = %e, "cannot end leases their holder gave up: etcd ends them");
            }
        }
    }

    /// Renews each of `leases` for `ttl` (see the module docs).
    pub(super) async fn renew_batch(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<SystemTime>>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let sent = Instant::now();
        let budget = Budget::lease(&self.config, ttl);
        let want = ttl_secs(ttl);
        let mut out: Vec<Option<Result<SystemTime>>> = leases.iter().map(|_| None).collect();
        let mut known: Vec<Option<Granted>> = Vec::with_capacity(leases.len());
        // Leases whose holder counts them lost (their TTL ran out since
        // their last renewal): not renewed; their key is deleted in the
        // batch (a keep-alive of their session would keep it), and the
        // answer is `Expired`, or why not (taken over: `Fenced`).
        let mut given_up: Vec<Option<Granted>> = Vec::with_capacity(leases.len());
        let mut gone = Vec::new();
        for lease in leases {
            match self.remembered(lease.work_id, lease.fencing_token) {
                Some(g) if g.given_up(sent) => {
                    self.forget(lease.work_id, lease.fencing_token);
                    known.push(None);
                    given_up.push(Some(g));
                }
                g => {
                    known.push(g);
                    given_up.push(None);
                }
            }
        }
        // Leases of another process (or forgotten): learn their etcd lease.
        let unknown: Vec<usize> = (0..leases.len())
            .filter(|&i| known[i].is_none() && given_up[i].is_none())
            .collect();
        if !unknown.is_empty() {
            let refs: Vec<LeaseRef<'_>> = unknown.iter().map(|&i| leases[i]).collect();
            for (&i, snap) in unknown.iter().zip(self.read_batch(&refs, budget).await?) {
                match snap.check(leases[i]) {
                    Err(e) => out[i] = Some(Err(e)),
                    Ok(live) => {
                        known[i] = Some(Granted {
                            id: live.lease(),
                            ttl_s: snap.granted(),
                            ttl,
                            renewed: sent,
                            state_rev: snap.state_rev(),
                        });
                    }
                }
            }
        }
        // Where each lease's `live` will be: its session lease, or, for a
        // TTL longer than that was granted, the holder's session of `ttl`.
        let mut target: Vec<Option<(Granted, bool)>> = Vec::with_capacity(leases.len());
        let mut refresh = BTreeSet::new();
        for (i, lease) in leases.iter().enumerate() {
            let Some(g) = known[i].filter(|_| out[i].is_none()) else {
                target.push(None);
                continue;
            };
            if g.ttl_s >= want {
                refresh.insert(g.id);
                target.push(Some((g, false)));
            } else {
                let (s, stale) = self.session_for(lease.holder_id, ttl, sent, budget).await?;
                if stale {
                    refresh.insert(s.id);
                }
                target.push(Some((
                    Granted {
                        id: s.id,
                        ttl_s: s.ttl_s,
                        ..g
                    },
                    s.id != g.id,
                )));
            }
        }
        for id in &refresh {
            gone.extend(self.abandoned(*id));
        }
        let mut ops = Vec::new();
        let mut sent_ops = Vec::new();
        for (i, lease) in leases.iter().enumerate() {
            if let Some(g) = given_up[i] {
                let keys = self.keys(lease.work_id);
                let [a, b] = is_ours(&keys.live, *lease);
                ops.push(TxnOp::txn(
                    Txn::new()
                        .when([
                            a,
                            b,
                            Compare::lease(keys.live.as_str(), CompareOp::Equal, g.id),
                            Compare::mod_revision(
                                keys.state.as_str(),
                                CompareOp::Equal,
                                g.state_rev,
                            ),
                        ])
                        .and_then([TxnOp::delete(keys.live.as_str(), None)])
                        .or_else(snapshot_ops(&keys, false)),
                ));
                sent_ops.push(i);
                continue;
            }
            let (Some(g), Some((t, moved))) = (known[i], target[i]) else {
                continue;
            };
            let keys = self.keys(lease.work_id);
            let state = State {
                token: lease.fencing_token,
                phase: Phase::Held.as_str().to_string(),
                at_ms: now_ms().saturating_add(millis(ttl)),
                granted_s: t.ttl_s,
                ttl_ms: millis(ttl),
            };
            let mut then = vec![TxnOp::put(keys.state.as_str(), to_json(&state), None)];
            if moved {
                then.push(TxnOp::put(
                    keys.live.as_str(),
                    lease.holder_id.as_str(),
                    Some(PutOptions::new().with_lease(t.id)),
                ));
            }
            let [a, b] = is_ours(&keys.live, *lease);
            ops.push(TxnOp::txn(
                Txn::new()
                    .when([
                        a,
                        b,
                        Compare::lease(keys.live.as_str(), CompareOp::Equal, g.id),
                    ])
                    .and_then(then)
                    .or_else(snapshot_ops(&keys, false)),
            ));
            sent_ops.push(i);
        }
        let kept = join_all(
            refresh
                .iter()
                .map(|id| async move { (*id, self.keep_alive_after(*id, sent, budget).await) }),
        );
        let txn = async {
            if ops.is_empty() {
                Ok(None)
            } else {
                self.txn(Txn::new().and_then(ops), "renew", budget)
                    .await
                    .map(Some)
            }
        };
        let (kept, resp, ()) = tokio::join!(kept, txn, self.abandon(&gone, budget));
        let resp = resp?;
        let mut retry = Vec::new();
        if let Some(resp) = resp {
            let rev = resp.header().map_or(0, |h| h.revision());
            for (i, one) in sent_ops.iter().zip(nested(&resp, sent_ops.len())?) {
                let (i, lease) = (*i, leases[*i]);
                if given_up[i].is_some() {
                    if one.succeeded() {
                        out[i] = Some(Err(expired(lease)));
                        continue;
                    }
                    match Snapshot::from_responses(one.op_responses())?.check(lease) {
                        Err(e) => out[i] = Some(Err(e)),
                        // Renewed meanwhile by another process with the
                        // token: the single renewal.
                        Ok(_) => retry.push(i),
                    }
                    continue;
                }
                let Some((t, _)) = target[i] else { continue };
                if !one.succeeded() {
                    let snap = Snapshot::from_responses(one.op_responses())?;
                    match snap.check(lease) {
                        Err(e) => {
                            self.forget(lease.work_id, lease.fencing_token);
                            out[i] = Some(Err(e));
                        }
                        // Still ours, on another etcd lease (another handle
                        // of the holder moved it): the single renewal.
                        Ok(_) => retry.push(i),
                    }
                    continue;
                }
                let alive = kept.iter().find(|(id, _)| *id == t.id).map(|(_, a)| a);
                out[i] = Some(match alive {
                    Some(Ok(false)) => {
                        self.forget(lease.work_id, lease.fencing_token);
                        Err(expired(lease))
                    }
                    Some(Err(e)) => Err(StoreError::new(
                        KIND,
                        format!("renew the etcd lease of {}: {e}", lease.work_id),
                    )
                    .into()),
                    _ => {
                        self.remember(
                            lease.work_id,
                            lease.fencing_token,
                            Granted {
                                renewed: sent,
                                state_rev: rev,
                                ..t
                            },
                        );
                        Ok(SystemTime::now() + ttl)
                    }
                });
            }
        }
        for i in retry {
            self.forget(leases[i].work_id, leases[i].fencing_token);
            out[i] = Some(self.extend(leases[i], ttl, None).await);
        }
        Ok(out
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(StoreError::new(KIND, "a lease left out of a renewal").into())
                })
            })
            .collect())
    }

    /// Releases each of `leases` in one transaction: `live` deleted and
    /// `state` written as released, for each lease still this holder's.
    pub(super) async fn release_batch(&self, leases: &[LeaseRef<'_>]) -> Result<Vec<Result<()>>> {
        let Some(first) = leases.first() else {
            return Ok(Vec::new());
        };
        let at_ms = now_ms();
        let ops: Vec<TxnOp> = leases
            .iter()
            .map(|lease| {
                let keys = self.keys(lease.work_id);
                let state = State {
                    token: lease.fencing_token,
                    phase: Phase::Released.as_str().to_string(),
                    at_ms,
                    granted_s: 0,
                    ttl_ms: 0,
                };
                TxnOp::txn(
                    Txn::new()
                        .when(is_ours(&keys.live, *lease))
                        .and_then([
                            TxnOp::delete(keys.live.as_str(), None),
                            TxnOp::put(keys.state.as_str(), to_json(&state), None),
                        ])
                        .or_else(snapshot_ops(&keys, false)),
                )
            })
            .collect();
        let resp = self
            .txn(Txn::new().and_then(ops), "release", self.budget_of(*first))
            .await?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let replies = nested(&resp, leases.len())?;
        leases
            .iter()
            .zip(replies)
            .map(|(lease, one)| {
                if !one.succeeded() {
                    return Ok(Err(
                        Snapshot::from_responses(one.op_responses())?.refusal(*lease)
                    ));
                }
                self.forget(lease.work_id, lease.fencing_token);
                self.saw_free(
                    lease.work_id,
                    Free {
                        acq_rev: lease.fencing_token,
                        state_rev: rev,
                        prev: Some(StoredPrevious {
                            holder: lease.holder_id.to_string(),
                            token: lease.fencing_token,
                            end: crate::store::LeaseEnd::Released.as_str().to_string(),
                        }),
                    },
                );
                Ok(Ok(()))
            })
            .collect()
    }
}
