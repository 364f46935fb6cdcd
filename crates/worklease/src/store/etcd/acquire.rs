//! Acquisition, of one work ID or of a batch: one etcd transaction whose
//! success branch holds one nested transaction per work ID (etcd 3.3 and
//! later), each `If live absent, acq and state as last seen Then put
//! live (on the holder's session lease), put acq Else get live, acq,
//! state`, so every work ID's outcome comes back in the one reply. A work
//! ID this store saw free (it released it, or a failure branch showed it
//! free) compares what it saw; any other compares "never acquired", and a
//! wrong guess costs one more round with what the failure branch read.
//! `state` is left as it is: it names the acquisition it is about, and
//! the acquisition's record keeps its revision.

use std::time::{Duration, SystemTime};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

use crate::error::{Error, Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::{Grant, Handoff, LeaseEnd, PreviousHolder};

use super::layout::{Part, OP_BYTES};
use super::observe::Contended;
use super::records::{end_of, Granted, Pending};
use super::rpc::Budget;
use super::snapshot::{
    bad_value, snapshot_ops, to_json, token_of, Acquisition, Free, Snapshot, StoredPrevious,
};
use super::{millis, now_ms, Core, KIND, RACE_RETRIES};

/// How many free work IDs a store remembers for its next acquisitions.
const FREE_CACHE: usize = 2 * crate::limits::MAX_BATCH;

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

impl Core {
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
            let until = end_of(sent, ttl);
            let (session, refresh) = self.session_for(holder, ttl, sent, budget).await?;
            let mut frees = Vec::with_capacity(round.len());
            let mut ops = Vec::with_capacity(round.len());
            let mut pends = Vec::with_capacity(round.len());
            for &i in &round {
                let keys = self.keys(&work_ids[i]);
                let free = self.free_of(&work_ids[i]);
                let acquisition = to_json(&Acquisition {
                    holder: holder.to_string(),
                    ttl_ms: millis(ttl),
                    granted_s: session.ttl_s,
                    exp_ms: now_ms().saturating_add(millis(ttl)),
                    prev: free.prev.clone(),
                    nonce,
                });
                let bytes =
                    8 * (keys.live.len() + OP_BYTES) + holder.as_str().len() + acquisition.len();
                ops.push(Part {
                    bytes,
                    op: TxnOp::txn(
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
                            .and_then([
                                TxnOp::put(
                                    keys.live.as_str(),
                                    holder.as_str(),
                                    Some(PutOptions::new().with_lease(session.id)),
                                ),
                                TxnOp::put(keys.acquisition.as_str(), acquisition.clone(), None),
                            ])
                            .or_else(snapshot_ops(&keys, false)),
                    ),
                });
                pends.push((
                    work_ids[i].clone(),
                    Pending {
                        acq: acquisition,
                        session: session.id,
                        until,
                        tries: 0,
                    },
                ));
                frees.push(free);
            }
            // Until its outcome is known, the sweep ends what the
            // acquisition may have written once its time is up.
            self.pend(nonce, pends);
            let settled = |round: &[usize]| {
                for &i in round {
                    self.unpend(&work_ids[i], nonce);
                }
            };
            let txn = self.send_batch(ops, |_| Vec::new(), "acquire", budget);
            // The session lease's countdown must start again after `sent`
            // (the holder counts its TTL from then): a keep-alive beside
            // the transaction, unless it was granted after `sent`.
            let (resp, alive) = if refresh {
                let (r, a) = tokio::join!(txn, self.keep_alive_after(session.id, sent, budget));
                (r, a.map(Some))
            } else {
                (txn.await, Ok(None))
            };
            let resp = match resp {
                Err(e) if session_retry && lease_missing(&e) => {
                    // etcd ended the session lease (the transaction wrote
                    // nothing): a new one, once.
                    settled(&round);
                    self.session_gone(session.id);
                    session_retry = false;
                    pending = round;
                    continue;
                }
                r => r?,
            };
            if alive? == Some(false) {
                // Gone under the transaction: what it attached is gone too.
                settled(&round);
                if !session_retry {
                    return Err(StoreError::new(KIND, "the etcd session lease keeps ending").into());
                }
                session_retry = false;
                pending = round;
                continue;
            }
            let replies = resp;
            settled(&round);
            let mut held: Vec<(usize, Snapshot)> = Vec::new();
            for ((i, free), one) in round.into_iter().zip(frees).zip(replies) {
                let work_id = &work_ids[i];
                let token = token_of(one.revision);
                if token == 0 {
                    return Err(bad_value("a transaction reply without a revision"));
                }
                let one = one.txn;
                let mut grant = |token: u64, record: Granted, prev: Option<PreviousHolder>| {
                    self.taken(work_id);
                    self.remember(work_id, token, record);
                    granted += 1;
                    Ok(Grant {
                        fencing_token: token,
                        expires_at: SystemTime::now() + ttl,
                        handoff: Handoff { previous: prev },
                    })
                };
                if one.succeeded() {
                    let record = Granted {
                        id: session.id,
                        ttl_s: session.ttl_s,
                        until,
                        live_rev: i64::try_from(token).unwrap_or(0),
                        state_rev: free.state_rev,
                        holder: holder.clone(),
                        own: true,
                    };
                    outcomes[i] = Some(grant(token, record, previous(free.prev.as_ref())));
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
                    let record = Granted {
                        id: live.lease(),
                        ttl_s: snap.granted(),
                        until,
                        live_rev: live.mod_revision(),
                        state_rev: snap.state_rev(),
                        holder: holder.clone(),
                        own: self.is_session(live.lease()),
                    };
                    let prev = snap.previous();
                    outcomes[i] = Some(grant(token, record, prev));
                    continue;
                }
                held.push((i, snap));
            }
            if !held.is_empty() {
                let may: Vec<bool> = held.iter().map(|(i, _)| tries[*i] < RACE_RETRIES).collect();
                let index: Vec<usize> = held.iter().map(|(i, _)| *i).collect();
                let seen: Vec<(&WorkId, Snapshot)> = held
                    .into_iter()
                    .map(|(i, snap)| (&work_ids[i], snap))
                    .collect();
                let verdicts = self.contend(&seen, &may, budget).await?;
                for ((&i, (work_id, snap)), verdict) in index.iter().zip(&seen).zip(verdicts) {
                    match verdict {
                        Contended::Again => {
                            tries[i] += 1;
                            pending.push(i);
                        }
                        // Live for everyone, the same holder ID included
                        // (ADR 0002).
                        Contended::Held(left) => {
                            outcomes[i] = Some(Err(Error::Held {
                                work_id: work_id.to_string(),
                                holder_id: snap
                                    .live
                                    .as_ref()
                                    .map(|l| String::from_utf8_lossy(l.value()).into_owned())
                                    .unwrap_or_default(),
                                expires_in: Some(left),
                            }));
                        }
                    }
                }
            }
            pending.sort_unstable();
        }
        Ok(outcomes.into_iter().map_while(|o| o).collect())
    }
}
