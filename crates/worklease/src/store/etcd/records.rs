//! What a store remembers of the leases it acquired or renewed (which
//! etcd lease `live` is on, the revisions of `live` and `state` it last
//! saw or wrote, until when its holder may count on it), and of the
//! acquisitions whose outcome it does not know. The records of leases on
//! this store's own session leases are what its sweep (`sweep.rs`) goes
//! through: a session kept alive for some of its keys keeps all of them,
//! so the store must end those their holder gave up.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::limits::{HolderId, WorkId};
use crate::store::LeaseRef;

use super::leases::secs;
use super::rpc::Budget;
use super::Core;

/// How many records of leases on other processes' session leases a store
/// keeps (a renewal of one it does not keep reads its keys first: one
/// request more). Records of its own sessions' leases are always kept:
/// the sweep needs them.
const FOREIGN_CACHE: usize = 2 * crate::limits::MAX_BATCH;

/// What a store knows of one lease it acquired or renewed.
#[derive(Debug, Clone)]
pub(super) struct Granted {
    /// The etcd lease `live` is attached to.
    pub(super) id: i64,
    /// The TTL etcd granted it, in seconds.
    pub(super) ttl_s: i64,
    /// The latest end, by this host's monotonic clock, of any acquisition
    /// or renewal of this lease this store sent (successful, failed or
    /// still in flight): its send time plus its TTL. The holder's deadline
    /// (a successful one's send time + TTL − margin) is earlier, so once
    /// this has passed the holder counts the lease lost, whatever replies
    /// are still on their way (the crate docs' "Clocks").
    pub(super) until: Instant,
    /// The mod revision of `live` as this store last wrote or read it: the
    /// acquisition (its fencing token), or the move to a session lease of
    /// a longer TTL. A renewal compares it: equal means `live` is this
    /// acquisition's, on etcd lease `id`.
    pub(super) live_rev: i64,
    /// The mod revision of `state` as this store last wrote or read it
    /// (0: absent). Checkpoints and renewals from other stores write
    /// `state`; the sweep compares it.
    pub(super) state_rev: i64,
    /// The holder that acquired it.
    pub(super) holder: HolderId,
    /// Whether `id` was a session lease of this store when the record was
    /// made: then its batch renewals are compares only, and the sweep ends
    /// it once `until` has passed.
    pub(super) own: bool,
}

impl Granted {
    /// Whether it is on one of this store's session leases and its
    /// holder's time ran out (by this host's clock) with no renewal sent
    /// since.
    pub(super) fn given_up(&self, now: Instant) -> bool {
        self.own && self.until <= now
    }
}

/// An acquisition this store sent whose outcome it did not learn (the
/// call failed with a store error, or its caller gave it up): if it was
/// applied, its `live` key is on this store's session lease, whose key
/// moves with the session's other leases, so the sweep deletes it once
/// the call's time is up.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    /// The exact value the acquisition wrote to `acq` (it holds a number
    /// drawn per call, so it names this acquisition).
    pub(super) acq: Vec<u8>,
    /// The session lease it attached `live` to.
    pub(super) session: i64,
    /// When its call's time is up: its send time plus its TTL.
    pub(super) until: Instant,
    /// How often the sweep tried to delete it and could not reach etcd.
    pub(super) tries: u32,
}

/// The records of a store.
#[derive(Debug, Default)]
pub(super) struct Records {
    /// By (work ID, fencing token).
    pub(super) leases: HashMap<(WorkId, u64), Granted>,
    /// By (work ID, the number the acquiring call drew).
    pub(super) pending: HashMap<(WorkId, u64), Pending>,
}

/// What the records say of a lease about to be renewed.
pub(super) enum Claim<'a> {
    /// Known, and moved on to the renewal's `until`.
    Known(&'a mut Granted),
    Unknown,
    /// Given up (taken out of the records): to be ended, not renewed.
    GivenUp(Granted),
}

impl Records {
    /// The record of `lease`, when it is the same holder's.
    pub(super) fn of(&mut self, lease: LeaseRef<'_>) -> Option<&mut Granted> {
        self.leases
            .get_mut(&(lease.work_id.clone(), lease.fencing_token))
            .filter(|g| g.holder == *lease.holder_id)
    }

    /// The record of `lease` for a renewal sent at `sent` that counts on
    /// it until `until`: moved on to `until` if it is not given up, taken
    /// out of the records if it is (see `sweep.rs`).
    pub(super) fn claim(
        &mut self,
        lease: LeaseRef<'_>,
        sent: Instant,
        until: Instant,
    ) -> Claim<'_> {
        match self
            .leases
            .entry((lease.work_id.clone(), lease.fencing_token))
        {
            Entry::Occupied(e) if e.get().holder == *lease.holder_id => {
                if e.get().given_up(sent) {
                    Claim::GivenUp(e.remove())
                } else {
                    let g = e.into_mut();
                    extend_until(&mut g.until, until);
                    Claim::Known(g)
                }
            }
            _ => Claim::Unknown,
        }
    }
}

impl Core {
    /// Records `granted` for (`work_id`, `token`) (replacing what was
    /// there), and starts the sweep for a lease on this store's session.
    pub(super) fn remember(&self, work_id: &WorkId, token: u64, granted: Granted) {
        let own = granted.own;
        let until = granted.until;
        if let Ok(mut r) = self.records.lock() {
            let key = (work_id.clone(), token);
            if own || r.leases.len() < FOREIGN_CACHE || r.leases.contains_key(&key) {
                r.leases.insert(key, granted);
            }
        }
        if own {
            self.start_sweeping();
            self.sweep_wake.by(until);
        }
    }

    pub(super) fn forget(&self, work_id: &WorkId, token: u64) {
        if let Ok(mut r) = self.records.lock() {
            r.leases.remove(&(work_id.clone(), token));
        }
    }

    /// The record of `lease` (of the same holder), if any.
    pub(super) fn remembered(&self, lease: LeaseRef<'_>) -> Option<Granted> {
        self.records.lock().ok()?.of(lease).cloned()
    }

    /// Notes acquisitions about to be sent, by work ID, under the number
    /// `nonce` their call drew.
    pub(super) fn pend(&self, nonce: u64, pending: Vec<(WorkId, Pending)>) {
        let first = pending.iter().map(|(_, p)| p.until).min();
        if let Ok(mut r) = self.records.lock() {
            for (w, p) in pending {
                r.pending.insert((w, nonce), p);
            }
        }
        self.start_sweeping();
        if let Some(until) = first {
            self.sweep_wake.by(until);
        }
    }

    /// The outcome of the acquisition of `work_id` by the call that drew
    /// `nonce` is known.
    pub(super) fn unpend(&self, work_id: &WorkId, nonce: u64) {
        if let Ok(mut r) = self.records.lock() {
            r.pending.remove(&(work_id.clone(), nonce));
        }
    }

    /// The budget of an operation on `lease` without a TTL of its own
    /// (release, read checkpoint): that of the TTL its etcd lease was
    /// granted, when this store knows it.
    pub(super) fn budget_of(&self, lease: LeaseRef<'_>) -> Budget {
        match self.remembered(lease) {
            Some(g) if g.ttl_s > 0 => Budget::lease(&self.config, secs(g.ttl_s)),
            _ => Budget::plain(&self.config),
        }
    }
}

/// `until` moved to at least `at`.
pub(super) fn extend_until(until: &mut Instant, at: Instant) {
    if at > *until {
        *until = at;
    }
}

/// `sent` plus `ttl` (TTLs are at most [`crate::limits::MAX_TTL`], far
/// from the end of the clock).
pub(super) fn end_of(sent: Instant, ttl: Duration) -> Instant {
    sent.checked_add(ttl)
        .or_else(|| sent.checked_add(crate::limits::MAX_TTL))
        .unwrap_or(sent)
}
