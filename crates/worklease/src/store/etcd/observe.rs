//! Liveness that does not rest on etcd's lessor: the observation rule of
//! the crate docs' "Clocks", applied to a lease whose `live` key etcd
//! keeps although its holder stopped renewing (a new Raft leader restarts
//! every lease's countdown, etcd-io/etcd#9888).
//!
//! The *version* of a held lease is (create and mod revision of `live`,
//! mod revision of `state`, mod revision of the session key of the etcd
//! lease `live` is on). Every renewal moves it: a batch renewal by the
//! session's own store puts the session key in the transaction whose
//! compare renews the lease (`batch.rs`), and every other renewal,
//! checkpoint or move writes `state` or `live`. A contender notes when it
//! first saw a version (when the read of the session key, made after the
//! read of the lease's keys, returned: never before the holder sent the
//! renewal that made it); once it has seen that version unchanged for the
//! holder's TTL (that of the renewal that last wrote `state` or the
//! acquisition, rounded up to whole etcd seconds, and at least what etcd
//! granted the etcd lease `live` is on, which every renewal that leaves
//! `live` there asked no more than) by its own monotonic clock, the
//! holder's own deadline (that send + TTL − margin) has passed, and the
//! contender deletes `live` in a transaction that compares exactly that
//! version. A renewal that lands first moves the version, so the deletion
//! changes nothing; a renewal that lands after it fails (`live` is gone:
//! `Expired`, then `Fenced`).
//!
//! The session key moves for every lease of the session at once: a lease
//! its holder gave up while the holder renews others is ended by the
//! holder's own store instead (`sweep.rs`).

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use tokio::time::Instant;

use crate::error::Result;
use crate::limits::WorkId;

use super::keys::session_key;
use super::rpc::Budget;
use super::snapshot::{bad_value, Snapshot};
use super::Core;

/// How many work IDs a store keeps observations of (more: it starts
/// again, which only delays its takeovers).
const OBSERVED: usize = 2 * crate::limits::MAX_BATCH;

/// The version of a held lease: create and mod revision of `live`, mod
/// revisions of `state` and of the session key.
pub(super) type Version = (i64, i64, i64, i64);

/// When this store first saw a version of a work ID's lease.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seen {
    version: Version,
    since: Instant,
}

/// The observations of a store, by work ID.
pub(super) type Observations = HashMap<WorkId, Seen>;

/// The version `snap` shows with the session key at revision `session`,
/// if its `live` key is there.
fn version(snap: &Snapshot, session: i64) -> Option<Version> {
    let live = snap.live.as_ref()?;
    Some((
        live.create_revision(),
        live.mod_revision(),
        snap.state_rev(),
        session,
    ))
}

/// What a contender makes of a lease held by another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Contended {
    /// Still held: the version must stay unchanged this much longer.
    Held(Duration),
    /// Taken over (or changed meanwhile): try to acquire it again.
    Again,
}

impl Core {
    /// The mod revisions of the session keys of etcd leases `ids` (0 for
    /// one that is not there), read in one transaction.
    async fn session_revisions(&self, ids: &[i64], budget: Budget) -> Result<HashMap<i64, i64>> {
        let mut out = HashMap::with_capacity(ids.len());
        for chunk in ids.chunks(self.config.max_txn_ops.max(1)) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|id| {
                    TxnOp::get(
                        session_key(&self.config.prefix, *id),
                        Some(GetOptions::new().with_keys_only()),
                    )
                })
                .collect();
            let resp = self
                .txn(Txn::new().and_then(ops), "read session keys", budget)
                .await?;
            for (id, r) in chunk.iter().zip(resp.op_responses()) {
                let TxnOpResponse::Get(g) = r else {
                    return Err(bad_value(&format!("a read answered {r:?}")));
                };
                out.insert(*id, g.kvs().first().map_or(0, |kv| kv.mod_revision()));
            }
        }
        Ok(out)
    }

    /// Applies the observation rule to leases held by others, as the
    /// failure branches of an acquisition read them (`held`, by work ID):
    /// reads their session keys, notes the versions, and takes over those
    /// whose version stayed unchanged for their holder's TTL, when
    /// `take_over[i]` allows it.
    pub(super) async fn contend(
        &self,
        held: &[(&WorkId, Snapshot)],
        take_over: &[bool],
        budget: Budget,
    ) -> Result<Vec<Contended>> {
        let mut ids: Vec<i64> = held
            .iter()
            .filter_map(|(_, s)| s.live.as_ref().map(|l| l.lease()))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let revisions = self.session_revisions(&ids, budget).await?;
        let read_at = Instant::now();
        let mut out = Vec::with_capacity(held.len());
        for ((work_id, snap), may) in held.iter().zip(take_over) {
            let session = snap
                .live
                .as_ref()
                .and_then(|l| revisions.get(&l.lease()))
                .copied()
                .unwrap_or(0);
            let left = self.observe(work_id, snap, session, read_at);
            if !left.is_zero() || !*may {
                out.push(Contended::Held(left));
                continue;
            }
            if self.take_over(work_id, snap, session, budget).await? {
                self.saw_free(work_id, snap.free());
            }
            out.push(Contended::Again);
        }
        Ok(out)
    }

    /// Notes that reads that returned at `at` showed `snap` (a held lease)
    /// with its session key at revision `session`; returns how much longer
    /// its version must stay unchanged before this store may take the
    /// lease over (zero: now).
    pub(super) fn observe(
        &self,
        work_id: &WorkId,
        snap: &Snapshot,
        session: i64,
        at: Instant,
    ) -> Duration {
        let Some(v) = version(snap, session) else {
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

    /// Deletes `live` of a lease whose version `snap` and `session` show,
    /// comparing exactly that version (see the module docs); true when it
    /// did.
    async fn take_over(
        &self,
        work_id: &WorkId,
        snap: &Snapshot,
        session: i64,
        budget: Budget,
    ) -> Result<bool> {
        let (Some((create, modified, state, _)), Some(lease)) = (
            version(snap, session),
            snap.live.as_ref().map(|l| l.lease()),
        ) else {
            return Ok(false);
        };
        let keys = self.keys(work_id);
        let txn = Txn::new()
            .when([
                Compare::create_revision(keys.live.as_str(), CompareOp::Equal, create),
                Compare::mod_revision(keys.live.as_str(), CompareOp::Equal, modified),
                Compare::mod_revision(keys.state.as_str(), CompareOp::Equal, state),
                Compare::mod_revision(
                    session_key(&self.config.prefix, lease),
                    CompareOp::Equal,
                    session,
                ),
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
