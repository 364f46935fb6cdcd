//! The sweep: a store's task that ends the leases their holder gave up
//! while their session lease is kept alive for the holder's other leases.
//!
//! A keep-alive extends every key of a session lease, and a batch renewal
//! moves the session key that contenders watch (`observe.rs`) for every
//! lease of the session at once: neither stops for one lease whose holder
//! stopped renewing it (`Renewal::stop`, a token dropped, renewals that
//! failed until the holder's deadline). So the store ends such a lease
//! itself: as soon as the earliest time it knows of runs out (times only
//! move later, and a new record that runs out sooner wakes the task), it
//! deletes the `live` key of each lease on one of its session leases
//! whose [`Granted::until`] (the end of the latest acquisition or renewal
//! it sent, successful or not) has passed; when etcd does not answer, it
//! tries again [`SWEEP_RETRY`] later. The deletion compares the mod revisions of `live` and `state`
//! as the store last wrote or read them, so it changes nothing when
//! another process renewed or checkpointed the lease meanwhile (such a
//! renewal writes `state`); the store then counts the lease as renewed
//! when it saw that (the observation rule, applied by the holder's own
//! store) and looks again a TTL later.
//!
//! A renewal this store sends after `until` passed is refused (`Expired`)
//! and one sent before moves `until` on, under the same lock the sweep
//! takes: so no renewal that the holder counts as successful is sent after
//! the sweep decided to end its lease, and any the holder counted was sent
//! a TTL before (its deadline has passed). That is why a renewal of an
//! own lease may be a compare alone: a deletion racing it cannot undo a
//! renewal that its holder still counts on.
//!
//! The sweep also ends acquisitions whose outcome this store never
//! learned ([`Pending`]) once their call's time is up: compared by the
//! exact `acq` value they wrote, their `live` key is deleted if it is
//! still theirs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::limits::WorkId;
use crate::store::record::Phase;
use crate::store::LeaseRef;

use super::layout::{Part, OP_BYTES};
use super::leases::secs;
use super::records::{Granted, Pending};
use super::rpc::Budget;
use super::snapshot::{to_json, Snapshot, State};
use super::{now_ms, Core};

/// How soon a sweep that etcd did not answer is tried again.
pub(super) const SWEEP_RETRY: Duration = Duration::from_millis(500);
/// The longest time between two sweeps when no lease runs out sooner (it
/// also forgets ended sessions and other processes' unused leases).
const SWEEP_IDLE: Duration = Duration::from_secs(5);
/// The shortest time between two sweeps.
const SWEEP_GAP: Duration = Duration::from_millis(10);
/// How often the sweep tries to end an acquisition of unknown outcome
/// while etcd cannot be reached.
const PENDING_TRIES: u32 = 8;

/// When the sweep task wakes next, and how to wake it sooner: a record
/// whose time runs out before then (an acquisition) wakes it, so that a
/// lease is ended at its time, not up to [`SWEEP_IDLE`] later.
#[derive(Debug)]
pub(super) struct Wake {
    base: Instant,
    /// The next wake, in ns since `base`.
    at: AtomicU64,
    notify: Arc<Notify>,
}

impl Default for Wake {
    fn default() -> Self {
        Self {
            base: Instant::now(),
            at: AtomicU64::new(u64::MAX),
            notify: Arc::new(Notify::new()),
        }
    }
}

impl Wake {
    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Wakes the sweep task if it sleeps past `until`.
    pub(super) fn by(&self, until: Instant) {
        if self.ns(until) < self.at.load(Ordering::Relaxed) {
            self.notify.notify_one();
        }
    }
}

impl Core {
    /// Starts the sweep task if it is not running (and a tokio runtime
    /// runs here).
    pub(super) fn start_sweeping(&self) {
        if self.sweeping.load(Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        runtime.spawn(sweep_task(self.me.clone(), self.stop.child_token()));
    }

    /// The nested transaction that ends lease (`work_id`, `token`) of
    /// record `g`: `live` deleted and the end noted in `state`, if both
    /// are as the record says.
    pub(super) fn give_up_part(&self, work_id: &WorkId, token: u64, g: &Granted) -> Part {
        let keys = self.keys(work_id);
        let state = to_json(&State {
            token,
            phase: Phase::Held.as_str().to_string(),
            at_ms: now_ms(),
            granted_s: 0,
            ttl_ms: 0,
        });
        let bytes = 4 * (keys.live.len() + OP_BYTES) + state.len();
        let op = TxnOp::txn(
            Txn::new()
                .when([
                    Compare::mod_revision(keys.live.as_str(), CompareOp::Equal, g.live_rev),
                    Compare::mod_revision(keys.state.as_str(), CompareOp::Equal, g.state_rev),
                ])
                .and_then([
                    TxnOp::delete(keys.live.as_str(), None),
                    TxnOp::put(keys.state.as_str(), state, None),
                ]),
        );
        Part { op, bytes }
    }

    /// Ends each of `gone` (leases their holder gave up, no longer in the
    /// records); per lease `None` when it ended, or what its keys hold
    /// when they changed meanwhile (it was not ended).
    pub(super) async fn end_given_up(
        &self,
        gone: &[(WorkId, u64, Granted)],
        budget: Budget,
    ) -> Result<Vec<Option<Snapshot>>> {
        let mut out = Vec::with_capacity(gone.len());
        for chunk in gone.chunks(self.max_batch_len()) {
            let parts: Vec<Part> = chunk
                .iter()
                .map(|(w, t, g)| self.give_up_part(w, *t, g))
                .collect();
            let replies = self
                .send_batch(parts, |_| Vec::new(), "end given-up leases", budget)
                .await?;
            let failed: Vec<&WorkId> = chunk
                .iter()
                .zip(&replies)
                .filter(|(_, r)| !r.txn.succeeded())
                .map(|((w, _, _), _)| w)
                .collect();
            let mut read = self.read_batch(&failed, budget).await?.into_iter();
            for one in &replies {
                out.push(if one.txn.succeeded() {
                    None
                } else {
                    read.next()
                });
            }
        }
        Ok(out)
    }

    /// One sweep (see the module docs); returns when to sweep next.
    async fn sweep(&self) -> Instant {
        let now = Instant::now();
        self.forget_ended_sessions(now);
        let mut next = now + SWEEP_IDLE;
        let mut gone = Vec::new();
        let mut pending = Vec::new();
        if let Ok(mut r) = self.records.lock() {
            r.leases.retain(|(w, t), g| {
                if !g.own {
                    // Another process's lease this store renewed: kept
                    // while it may be renewed again.
                    return g.until + secs(g.ttl_s) > now;
                }
                if g.until <= now {
                    gone.push((w.clone(), *t, g.clone()));
                    return false;
                }
                next = next.min(g.until);
                true
            });
            r.pending.retain(|(w, nonce), p| {
                if p.until <= now {
                    pending.push((w.clone(), *nonce, p.clone()));
                    return false;
                }
                next = next.min(p.until);
                true
            });
        }
        let budget = Budget::plain(&self.config);
        if !gone.is_empty() {
            match self.end_given_up(&gone, budget).await {
                Ok(outcomes) => self.swept(gone, outcomes),
                Err(e) => {
                    tracing::debug!(error = %e, leases = gone.len(), "cannot end leases their holder gave up: trying again");
                    self.restore(gone);
                    next = next.min(Instant::now() + SWEEP_RETRY);
                }
            }
        }
        if !pending.is_empty() && !self.end_pending(pending, budget).await {
            next = next.min(Instant::now() + SWEEP_RETRY);
        }
        next
    }

    /// Notes the outcome of a sweep of `gone`: a lease another process
    /// renewed meanwhile (it is still its holder's, on a session lease of
    /// this store) is counted as renewed now, for the longest TTL its
    /// etcd lease allows.
    fn swept(&self, gone: Vec<(WorkId, u64, Granted)>, outcomes: Vec<Option<Snapshot>>) {
        let read_at = Instant::now();
        for ((w, t, g), outcome) in gone.into_iter().zip(outcomes) {
            let Some(snap) = outcome else {
                tracing::debug!(work_id = %w, fencing_token = t, "ended a lease its holder gave up");
                continue;
            };
            let lease = LeaseRef {
                work_id: &w,
                holder_id: &g.holder,
                fencing_token: t,
            };
            let Ok(live) = snap.check(lease) else {
                continue;
            };
            if !self.is_session(live.lease()) {
                continue;
            }
            let again = Granted {
                id: live.lease(),
                ttl_s: snap.granted(),
                until: read_at + secs(snap.granted()),
                live_rev: live.mod_revision(),
                state_rev: snap.state_rev(),
                holder: g.holder.clone(),
                own: true,
            };
            let until = again.until;
            if let Ok(mut r) = self.records.lock() {
                r.leases.entry((w, t)).or_insert(again);
            }
            self.sweep_wake.by(until);
        }
    }

    /// Puts back records of given-up leases whose end etcd did not
    /// answer: the sweep tries again.
    pub(super) fn restore(&self, gone: Vec<(WorkId, u64, Granted)>) {
        if gone.is_empty() {
            return;
        }
        if let Ok(mut r) = self.records.lock() {
            for (w, t, g) in gone {
                r.leases.entry((w, t)).or_insert(g);
            }
        }
        self.start_sweeping();
        self.sweep_wake.by(Instant::now() + SWEEP_RETRY);
    }

    /// Deletes the `live` keys of acquisitions of unknown outcome whose
    /// time is up, where they were applied and are still theirs; false
    /// when etcd did not answer (they are tried again).
    async fn end_pending(&self, pending: Vec<(WorkId, u64, Pending)>, budget: Budget) -> bool {
        let mut answered = true;
        for chunk in pending.chunks(self.max_batch_len()) {
            let parts: Vec<Part> = chunk
                .iter()
                .map(|(w, _, p)| {
                    let keys = self.keys(w);
                    let bytes = 3 * (keys.live.len() + OP_BYTES) + p.acq.len();
                    let op = TxnOp::txn(
                        Txn::new()
                            .when([
                                Compare::value(
                                    keys.acquisition.as_str(),
                                    CompareOp::Equal,
                                    p.acq.clone(),
                                ),
                                Compare::lease(keys.live.as_str(), CompareOp::Equal, p.session),
                            ])
                            .and_then([TxnOp::delete(keys.live.as_str(), None)]),
                    );
                    Part { op, bytes }
                })
                .collect();
            match self
                .send_batch(
                    parts,
                    |_| Vec::new(),
                    "end acquisitions of unknown outcome",
                    budget,
                )
                .await
            {
                Ok(_) => {}
                Err(e) => {
                    answered = false;
                    tracing::debug!(error = %e, "cannot end acquisitions of unknown outcome: trying again");
                    if let Ok(mut r) = self.records.lock() {
                        for (w, nonce, p) in chunk {
                            if p.tries + 1 < PENDING_TRIES {
                                let mut p = p.clone();
                                p.tries += 1;
                                r.pending.entry((w.clone(), *nonce)).or_insert(p);
                            }
                        }
                    }
                }
            }
        }
        answered
    }
}

/// Sweeps until the store is dropped.
async fn sweep_task(core: Weak<Core>, stop: CancellationToken) {
    loop {
        let Some(c) = core.upgrade() else {
            return;
        };
        let next = tokio::select! {
            () = stop.cancelled() => return,
            next = c.sweep() => next,
        };
        let at = next.max(Instant::now() + SWEEP_GAP);
        c.sweep_wake
            .at
            .store(c.sweep_wake.ns(at), Ordering::Relaxed);
        let notify = c.sweep_wake.notify.clone();
        drop(c);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(at) => {}
            () = notify.notified() => {}
        }
    }
}
