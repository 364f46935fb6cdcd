//! The concurrent stress check and its history checker (S1, S2, S4 under
//! many holders), shared with the batch checks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::{fast, Suite};
use crate::error::Error;
use crate::Token;

/// What holders believe and what the store acknowledged, checked at
/// every step.
#[derive(Default)]
pub(crate) struct History {
    /// Per work ID: the live belief (holder, token, deadline) and the last
    /// token granted.
    beliefs: HashMap<String, (String, u64, Instant)>,
    last_token: HashMap<String, u64>,
    grants: HashMap<String, u64>,
    /// Per work ID: the last acknowledged checkpoint and those in flight.
    acked: HashMap<String, Option<Bytes>>,
    pending: HashMap<String, Vec<Bytes>>,
}

impl History {
    pub(crate) fn granted(&mut self, holder: &str, t: &Token) {
        let id = t.work_id().to_string();
        let now = Instant::now();
        if let Some((other, token, deadline)) = self.beliefs.get(&id) {
            assert!(
                *deadline <= now,
                "S1 violated on {id}: {holder} got token {} while {other} (token {token}) still believes it holds until {:?} from now",
                t.fencing_token(),
                *deadline - now
            );
        }
        let last = self
            .last_token
            .insert(id.clone(), t.fencing_token())
            .unwrap_or(0);
        assert!(
            t.fencing_token() > last,
            "S2 violated on {id}: token {} after {last}",
            t.fencing_token()
        );
        self.beliefs.insert(
            id,
            (
                holder.to_string(),
                t.fencing_token(),
                t.deadline().expect("deadline"),
            ),
        );
        *self.grants.entry(t.work_id().to_string()).or_default() += 1;
    }

    /// `holder` renewed `t`: it believes in it until the new deadline.
    pub(crate) fn renewed(&mut self, holder: &str, t: &Token) {
        self.beliefs.insert(
            t.work_id().to_string(),
            (
                holder.to_string(),
                t.fencing_token(),
                t.deadline().expect("deadline"),
            ),
        );
    }

    pub(crate) fn read(&self, t: &Token, data: &Option<Bytes>) {
        let id = t.work_id().to_string();
        let acked = self.acked.get(&id).cloned().unwrap_or(None);
        let pending = self.pending.get(&id).map(Vec::as_slice).unwrap_or(&[]);
        let ok = *data == acked || data.as_ref().is_some_and(|d| pending.contains(d));
        assert!(ok, "S4 violated on {id}: read {data:?}, last acknowledged {acked:?}, in flight {pending:?}");
    }

    /// The holder of `t` stops believing in it (it is about to release).
    pub(crate) fn released(&mut self, t: &Token) {
        let id = t.work_id().to_string();
        if self
            .beliefs
            .get(&id)
            .is_some_and(|(_, token, _)| *token == t.fencing_token())
        {
            self.beliefs.remove(&id);
        }
    }

    /// How many holders believe, now, in a live lease on a work ID that
    /// starts with `prefix` (a semaphore's permits).
    pub(crate) fn live_under(&self, prefix: &str) -> usize {
        let now = Instant::now();
        self.beliefs
            .iter()
            .filter(|(id, (_, _, deadline))| id.starts_with(prefix) && *deadline > now)
            .count()
    }

    pub(crate) fn lost(&mut self, t: &Token, e: &Error) {
        let id = t.work_id().to_string();
        if let Some((_, token, deadline)) = self.beliefs.get(&id) {
            if *token == t.fencing_token() {
                if matches!(e, Error::Fenced { .. }) {
                    assert!(*deadline <= Instant::now(), "S1 violated on {id}: token {token} fenced while its holder still believed in it");
                }
                self.beliefs.remove(&id);
            }
        }
    }
}

/// A concurrent stress check of S1, S2 and S4: `tasks` holders acquire,
/// renew, checkpoint, pause past their TTL and release a few work IDs for
/// `rounds` rounds each, while a history checker fails on any overlap of
/// believed leases, any token that does not increase, and any checkpoint
/// read that is neither the last acknowledged one nor one in flight.
pub async fn concurrent_stress(s: &Suite, tasks: usize, rounds: usize) {
    let ids: Vec<String> = (0..3).map(|i| s.work_id(&format!("stress-{i}"))).collect();
    let history = Arc::new(Mutex::new(History::default()));
    let mut handles = Vec::new();
    for n in 0..tasks {
        let (leases, ids, history, ttl) = (
            s.holder(&format!("stress-{n}")),
            ids.clone(),
            history.clone(),
            s.ttl,
        );
        handles.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(n as u64);
            for round in 0..rounds {
                let id = &ids[rng.gen_range(0..ids.len())];
                let mut t = match leases.acquire(id, fast()).await {
                    Ok(t) => t,
                    // Expired: the grant came after its deadline (a slowed
                    // store) and was handed back: no lease, as when held.
                    Err(Error::Held { .. } | Error::Expired { .. }) => {
                        tokio::time::sleep(ttl.mul_f64(rng.gen_range(0.0..0.3))).await;
                        continue;
                    }
                    Err(e) => panic!("acquire: {e}"),
                };
                history
                    .lock()
                    .expect("history")
                    .granted(leases.holder_id().as_str(), &t);
                let c = leases
                    .read_checkpoint(&t)
                    .await
                    .expect("read right after acquire");
                history.lock().expect("history").read(&t, &c.data);
                let mut alive = true;
                for op in 0..rng.gen_range(1..5) {
                    // Mostly well inside the window; sometimes a pause past it.
                    let pause = if rng.gen_bool(0.1) {
                        ttl.mul_f64(1.3)
                    } else {
                        ttl.mul_f64(rng.gen_range(0.0..0.5))
                    };
                    tokio::time::sleep(pause).await;
                    let result = if rng.gen_bool(0.5) {
                        leases.renew(&t).await
                    } else {
                        let data = Bytes::from(format!("{}:{round}:{op}", leases.holder_id()));
                        history
                            .lock()
                            .expect("history")
                            .pending
                            .entry(id.clone())
                            .or_default()
                            .push(data.clone());
                        let r = leases.checkpoint(&t, data.clone()).await;
                        let mut h = history.lock().expect("history");
                        h.pending
                            .entry(id.clone())
                            .or_default()
                            .retain(|d| *d != data);
                        if r.is_ok() {
                            h.acked.insert(id.clone(), Some(data));
                        }
                        r
                    };
                    match result {
                        Ok(renewed) => {
                            t = renewed;
                            history
                                .lock()
                                .expect("history")
                                .renewed(leases.holder_id().as_str(), &t);
                        }
                        Err(e) if e.is_lease_lost() => {
                            history.lock().expect("history").lost(&t, &e);
                            alive = false;
                            break;
                        }
                        Err(e) => panic!("renew/checkpoint: {e}"),
                    }
                }
                if alive && rng.gen_bool(0.8) {
                    history.lock().expect("history").lost(
                        &t,
                        &Error::Expired {
                            work_id: id.clone(),
                            holder_id: t.holder_id().to_string(),
                            fencing_token: 0,
                        },
                    );
                    match leases.release(t.clone()).await {
                        Ok(()) | Err(Error::Expired { .. } | Error::Fenced { .. }) => {}
                        Err(e) => panic!("release: {e}"),
                    }
                }
                // else: abandoned, as by a crash; the belief runs out at its deadline.
            }
        }));
    }
    for h in handles {
        h.await
            .expect("stress task panicked (see its message above)");
    }
    // The history checks only mean something if every work ID changed
    // hands several times.
    let h = history.lock().expect("history");
    for id in &ids {
        let n = h.grants.get(id).copied().unwrap_or(0);
        assert!(
            n >= 3,
            "the stress made too little progress: {id} was granted {n} times"
        );
    }
}
