//! Liveness that does not rest on etcd's lessor: the observation rule of
//! the crate docs' "Clocks", applied to a lease whose `live` key etcd
//! keeps although its holder stopped renewing (a new Raft leader restarts
//! every lease's countdown, etcd-io/etcd#9888; a session lease kept alive
//! for the holder's other keys).
//!
//! Every renewal and checkpoint writes the lease's `state` key, so the
//! *version* of a held lease, (create and mod revision of `live`, mod
//! revision of `state`), moves at every renewal. A contender notes when it
//! first saw a version (after the read that showed it returned: never
//! before the write that made it, so never before the holder sent that
//! write's request); once it has seen that version unchanged for the
//! holder's TTL (rounded up to whole etcd seconds, at least what etcd
//! granted) by its own monotonic clock, the holder's own deadline (that
//! send + TTL − margin) has passed, and the contender deletes `live` in a
//! transaction that compares exactly that version. A renewal that lands
//! first moves the version, so the deletion changes nothing; a renewal
//! that lands after it fails (`live` is gone: `Expired`, then `Fenced`).

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use tokio::time::Instant;

use crate::error::Result;
use crate::limits::WorkId;

use super::rpc::Budget;
use super::snapshot::Snapshot;
use super::{EtcdKeys, EtcdStore};

/// How many work IDs a store keeps observations of (more: it starts
/// again, which only delays its takeovers).
const OBSERVED: usize = 2 * crate::limits::MAX_BATCH;

/// The version of a held lease: create and mod revision of `live`, mod
/// revision of `state`.
pub(super) type Version = (i64, i64, i64);

/// When this store first saw a version of a work ID's lease.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seen {
    version: Version,
    since: Instant,
}

/// The observations of a store, by work ID.
pub(super) type Observations = HashMap<WorkId, Seen>;

/// The version `snap` shows, if its `live` key is there.
pub(super) fn version(snap: &Snapshot) -> Option<Version> {
    let live = snap.live.as_ref()?;
    Some((
        live.create_revision(),
        live.mod_revision(),
        snap.state_rev(),
    ))
}

impl EtcdStore {
    /// Notes that a read that returned at `at` showed `snap` (a held
    /// lease); returns how much longer its version must stay unchanged
    /// before this store may take the lease over (zero: now).
    pub(super) fn observe(&self, work_id: &WorkId, snap: &Snapshot, at: Instant) -> Duration {
        let Some(v) = version(snap) else {
            self.unobserve(work_id);
            return Duration::ZERO;
        };
        let Ok(mut seen) = self.observed.lock() else {
            return snap.holder_ttl();
        };
        if seen.len() >= OBSERVED && !seen.contains_key(work_id) {
            seen.clear();
        }
        let entry = seen.entry(work_id.clone()).or_insert(Seen {
            version: v,
            since: at,
        });
        if entry.version != v {
            *entry = Seen {
                version: v,
                since: at,
            };
        }
        let unchanged = Instant::now().saturating_duration_since(entry.since);
        snap.holder_ttl().saturating_sub(unchanged)
    }

    /// Forgets the observation of `work_id` (acquired, or seen free).
    pub(super) fn unobserve(&self, work_id: &WorkId) {
        if let Ok(mut seen) = self.observed.lock() {
            seen.remove(work_id);
        }
    }

    /// Deletes `live` of a lease whose version `snap` shows, comparing
    /// exactly that version (see the module docs); true when it did.
    pub(super) async fn take_over(
        &self,
        work_id: &WorkId,
        keys: &EtcdKeys,
        snap: &Snapshot,
        budget: Budget,
    ) -> Result<bool> {
        let Some((create, modified, state)) = version(snap) else {
            return Ok(false);
        };
        let txn = Txn::new()
            .when([
                Compare::create_revision(keys.live.as_str(), CompareOp::Equal, create),
                Compare::mod_revision(keys.live.as_str(), CompareOp::Equal, modified),
                Compare::mod_revision(keys.state.as_str(), CompareOp::Equal, state),
            ])
            .and_then([TxnOp::delete(keys.live.as_str(), None)]);
        let done = self
            .txn(txn, "take over a lease", budget)
            .await?
            .succeeded();
        self.unobserve(work_id);
        if done {
            tracing::debug!(work_id = %work_id, "took over a lease its holder stopped renewing (its version stayed unchanged for its TTL)");
        }
        Ok(done)
    }
}
