//! Acquisition, of one work ID or of a batch: one etcd transaction whose
//! success branch holds one nested transaction per work ID (etcd 3.3 and
//! later), each `If live absent, acq and state as last seen Then put
//! live (on the holder's session lease), put acq, delete state Else get
//! live, acq, state`, so every work ID's outcome comes back in the one
//! reply. A work ID this store saw free (it released it, or a failure
//! branch showed it free) compares what it saw; any other compares "never
//! acquired", and a wrong guess costs one more round with what the failure
//! branch read.

use std::time::{Duration, SystemTime};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use tokio::time::Instant;

use crate::error::{Error, Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::{Grant, Handoff, LeaseEnd, PreviousHolder};

use super::leases::Granted;
use super::rpc::Budget;
use super::snapshot::{
    bad_value, snapshot_ops, to_json, token_of, Acquisition, Free, Snapshot, StoredPrevious,
};
use super::{millis, now_ms, EtcdStore, KIND, RACE_RETRIES};

/// How many free work IDs a store remembers for its next acquisitions.
const FREE_CACHE: usize = 2 * crate::limits::MAX_BATCH;

/// The nested transactions' replies of a batch transaction, one per
/// nested transaction in order.
pub(super) fn nested(resp: &TxnResponse, n: usize) -> Result<Vec<TxnResponse>> {
    let out: Vec<TxnResponse> = resp
        .op_responses()
        .into_iter()
        .map(|r| match r {
            TxnOpResponse::Txn(t) => Ok(t),
            other => Err(bad_value(&format!(
                "a batch transaction answered {other:?}"
            ))),
        })
        .collect::<Result<_>>()?;
    if out.len() != n {
        return Err(bad_value(&format!(
            "{} replies in a batch transaction of {n}",
            out.len()
        )));
    }
    Ok(out)
}

/// Whether a transaction failed because an etcd lease it attaches a key
/// to is gone (etcd ended the session lease).
pub(super) fn lease_missing(e: &Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.to_string().contains("requested lease not found") {
            return true;
        }
        source = err.source();
    }
    false
}

fn previous(p: Option<&StoredPrevious>) -> Option<PreviousHolder> {
    let p = p?;
    Some(PreviousHolder {
        holder_id: p.holder.clone(),
        fencing_token: p.token,
        ended: LeaseEnd::from_str(&p.end)?,
    })
}

impl EtcdStore {
    /// What this store saw of `work_id` when it was last free (a guess of
    /// "never acquired" when it has not seen it).
    fn free_of(&self, work_id: &WorkId) -> Free {
        self.free
            .lock()
            .ok()
            .and_then(|f| f.get(work_id).cloned())
            .unwrap_or_default()
    }

    /// Notes what an acquisition of free `work_id` compares.
    pub(super) fn saw_free(&self, work_id: &WorkId, free: Free) {
        if let Ok(mut f) = self.free.lock() {
            if f.len() >= FREE_CACHE {
                f.clear();
            }
            f.insert(work_id.clone(), free);
        }
    }

    fn taken(&self, work_id: &WorkId) {
        if let Ok(mut f) = self.free.lock() {
            f.remove(work_id);
        }
        self.unobserve(work_id);
    }

    /// Acquires up to `max` of `work_ids` (at most [`super::MAX_TXN_OPS`])
    /// in order, each with the single acquisition's outcome; see the
    /// module docs. A work ID found free but changed since it was seen is
    /// tried again (up to `RACE_RETRIES` times), and one held by a holder
    /// that stopped renewing it is taken over by the observation rule
    /// (`observe.rs`).
    pub(super) async fn acquire_batch(
        &self,
        work_ids: &[WorkId],
        holder: &HolderId,
        ttl: Duration,
        max: usize,
    ) -> Result<Vec<Result<Grant>>> {
        let budget = Budget::lease(&self.config, ttl);
        let nonce = rand::random::<u64>();
        let mut outcomes: Vec<Option<Result<Grant>>> = work_ids.iter().map(|_| None).collect();
        let mut tries = vec![0usize; work_ids.len()];
        let mut pending: Vec<usize> = Vec::new();
        let mut next = 0;
        let mut granted = 0;
        let mut session_retry = true;
        loop {
            let room = max.saturating_sub(granted).min(self.max_batch_len());
            while pending.len() < room && next < work_ids.len() {
                pending.push(next);
                next += 1;
            }
            pending.truncate(room);
            if pending.is_empty() {
                break;
            }
            let round = std::mem::take(&mut pending);
            let sent = Instant::now();
            let (session, refresh) = self.session_for(holder, ttl, sent, budget).await?;
            let mut frees = Vec::with_capacity(round.len());
            let mut ops = Vec::with_capacity(round.len());
            for &i in &round {
                let keys = self.keys(&work_ids[i]);
                let free = self.free_of(&work_ids[i]);
                let acquisition = Acquisition {
                    holder: holder.to_string(),
                    ttl_ms: millis(ttl),
                    granted_s: session.ttl_s,
                    exp_ms: now_ms().saturating_add(millis(ttl)),
                    prev: free.prev.clone(),
                    nonce,
                };
                let mut writes = vec![
                    TxnOp::put(
                        keys.live.as_str(),
                        holder.as_str(),
                        Some(PutOptions::new().with_lease(session.id)),
                    ),
                    TxnOp::put(keys.acquisition.as_str(), to_json(&acquisition), None),
                ];
                if free.state_rev != 0 {
                    // The compare says `state` is absent otherwise.
                    writes.push(TxnOp::delete(keys.state.as_str(), None));
                }
                ops.push(TxnOp::txn(
                    Txn::new()
                        .when([
                            Compare::create_revision(keys.live.as_str(), CompareOp::Equal, 0),
                            Compare::mod_revision(
                                keys.acquisition.as_str(),
                                CompareOp::Equal,
                                i64::try_from(free.acq_rev).unwrap_or(-1),
                            ),
                            Compare::mod_revision(
                                keys.state.as_str(),
                                CompareOp::Equal,
                                free.state_rev,
                            ),
                        ])
                        .and_then(writes)
                        .or_else(snapshot_ops(&keys, false)),
                ));
                frees.push(free);
            }
            let txn = self.txn(Txn::new().and_then(ops), "acquire", budget);
            // The session lease's countdown must start again after `sent`
            // (the holder counts its TTL from then): a keep-alive beside
            // the transaction, unless it was granted after `sent`.
            let (resp, alive) = if refresh {
                // The keep-alive would keep keys of the session that their
                // holder gave up: they are deleted beside it.
                let gone = self.abandoned(session.id);
                let (r, a, ()) = tokio::join!(
                    txn,
                    self.keep_alive_after(session.id, sent, budget),
                    self.abandon(&gone, budget)
                );
                (r, a.map(Some))
            } else {
                (txn.await, Ok(None))
            };
            let resp = match resp {
                Err(e) if session_retry && lease_missing(&e) => {
                    // etcd ended the session lease: a new one, once.
                    self.session_gone(session.id);
                    session_retry = false;
                    pending = round;
                    continue;
                }
                r => r?,
            };
            if alive? == Some(false) {
                // Gone under the transaction: what it attached is gone too.
                if !session_retry {
                    return Err(StoreError::new(KIND, "the etcd session lease keeps ending").into());
                }
                session_retry = false;
                pending = round;
                continue;
            }
            let token = resp
                .header()
                .map(|h| token_of(h.revision()))
                .filter(|t| *t > 0)
                .ok_or_else(|| bad_value("a transaction reply without a revision"))?;
            let read_at = Instant::now();
            let replies = nested(&resp, round.len())?;
            for ((i, free), one) in round.into_iter().zip(frees).zip(replies) {
                let work_id = &work_ids[i];
                let mut grant = |token: u64, prev: Option<PreviousHolder>| {
                    self.taken(work_id);
                    self.remember(
                        work_id,
                        token,
                        Granted {
                            id: session.id,
                            ttl_s: session.ttl_s,
                            ttl,
                            renewed: sent,
                            state_rev: 0,
                        },
                    );
                    granted += 1;
                    Ok(Grant {
                        fencing_token: token,
                        expires_at: SystemTime::now() + ttl,
                        handoff: Handoff { previous: prev },
                    })
                };
                if one.succeeded() {
                    outcomes[i] = Some(grant(token, previous(free.prev.as_ref())));
                    continue;
                }
                let snap = Snapshot::from_responses(one.op_responses())?;
                let Some(live) = &snap.live else {
                    // Free, but not as this store saw it: again, with what
                    // the failure branch read.
                    self.saw_free(work_id, snap.free());
                    self.unobserve(work_id);
                    tries[i] += 1;
                    if tries[i] >= RACE_RETRIES {
                        outcomes[i] = Some(Err(StoreError::new(
                            KIND,
                            format!("the lease of {work_id} kept changing under {RACE_RETRIES} acquisition attempts"),
                        )
                        .into()));
                    } else {
                        pending.push(i);
                    }
                    continue;
                };
                let ours = snap.live_of_current().is_some()
                    && snap
                        .acq
                        .as_ref()
                        .is_some_and(|(a, _)| a.nonce == nonce && a.holder == holder.as_str());
                if ours {
                    // A copy of this call's transaction that a member did
                    // not answer in time was applied: the acquisition is
                    // this call's.
                    let token = token_of(live.create_revision());
                    outcomes[i] = Some(grant(token, snap.previous()));
                    continue;
                }
                let left = self.observe(work_id, &snap, read_at);
                if left.is_zero() && tries[i] < RACE_RETRIES {
                    tries[i] += 1;
                    if self
                        .take_over(work_id, &self.keys(work_id), &snap, budget)
                        .await?
                    {
                        self.saw_free(work_id, snap.free());
                    }
                    pending.push(i);
                    continue;
                }
                // Live for everyone, the same holder ID included (ADR 0002).
                outcomes[i] = Some(Err(Error::Held {
                    work_id: work_id.to_string(),
                    holder_id: String::from_utf8_lossy(live.value()).into_owned(),
                    expires_in: Some(left),
                }));
            }
            pending.sort_unstable();
        }
        Ok(outcomes.into_iter().map_while(|o| o).collect())
    }
}
