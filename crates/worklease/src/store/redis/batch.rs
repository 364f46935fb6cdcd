//! The batch operations' script calls (their entry points, which split a
//! batch by hash slot on a Cluster, are in `ops.rs`): each one call of a
//! batch script whose `KEYS` are
//! every key of every lease in the batch, and whose reply holds each
//! lease's reply in the single script's encoding (the batch and single
//! scripts call the same functions of `common.lua`).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use redis::{ScriptInvocation, Value};

use crate::error::Result;
use crate::limits::{ceil_millis, HolderId, WorkId};
use crate::store::{Grant, LeaseRef};

use super::acquire::Replies;
use super::conn::slot;
use super::keys::{KeyWriter, Kind};
use super::reply::{array, bad_reply};
use super::scripts::{lease_outcome, SCRIPTS};
use super::RedisStore;

/// The most leases one batch call names (see "Batches" in the module docs
/// for how it was chosen).
pub const MAX_BATCH: usize = 100;

impl RedisStore {
    /// `acquire_many` of work IDs in one slot: one `acquire_many.lua` call
    /// (and one `WAIT` after it with a replica wait).
    pub(super) async fn acquire_slot(
        &self,
        work_ids: &[WorkId],
        holder_id: &HolderId,
        ttl: Duration,
        max: usize,
    ) -> Result<Vec<Result<Grant>>> {
        let mut inv = SCRIPTS.acquire_many.prepare_invoke();
        inv.arg(holder_id.as_str()).arg(ceil_millis(ttl)).arg(max);
        let mut keys = KeyWriter::new(&self.config.prefix);
        for id in work_ids {
            inv.key(keys.write(id, Kind::State));
            inv.key(keys.write(id, Kind::Live));
            inv.key(keys.write(id, Kind::Fence));
        }
        self.acquisitions(
            &inv,
            "acquire_many",
            Replies::Each,
            work_ids,
            holder_id,
            ttl,
        )
        .await
    }

    /// `renew_many` of leases in one slot: one `renew_many.lua` call.
    pub(super) async fn renew_slot(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<SystemTime>>> {
        let mut inv = SCRIPTS.renew_many.prepare_invoke();
        inv.arg(ceil_millis(ttl));
        let mut keys = KeyWriter::new(&self.config.prefix);
        for lease in leases {
            inv.key(keys.write(lease.work_id, Kind::State));
            inv.key(keys.write(lease.work_id, Kind::Live));
            inv.arg(lease.holder_id.as_str()).arg(lease.fencing_token);
        }
        let replies = self.run_batch(&inv, "renew_many", leases.len()).await?;
        let expires_at = SystemTime::now() + ttl;
        Ok(leases
            .iter()
            .zip(replies)
            .map(|(lease, reply)| lease_outcome(*lease, reply).map(|_| expires_at))
            .collect())
    }

    /// `release_many` of leases in one slot: one `release_many.lua` call,
    /// which publishes each released work ID.
    pub(super) async fn release_slot(&self, leases: &[LeaseRef<'_>]) -> Result<Vec<Result<()>>> {
        let mut inv = SCRIPTS.release_many.prepare_invoke();
        inv.arg(self.channel());
        let mut keys = KeyWriter::new(&self.config.prefix);
        for lease in leases {
            inv.key(keys.write(lease.work_id, Kind::State));
            inv.key(keys.write(lease.work_id, Kind::Live));
            inv.arg(lease.holder_id.as_str())
                .arg(lease.fencing_token)
                .arg(lease.work_id.as_str());
        }
        let replies = self.run_batch(&inv, "release_many", leases.len()).await?;
        Ok(leases
            .iter()
            .zip(replies)
            .map(|(lease, reply)| lease_outcome(*lease, reply).map(drop))
            .collect())
    }

    /// On a Cluster, the indexes of `leases` grouped by hash slot (in
    /// order within each group); `None` elsewhere.
    pub(super) fn slot_groups(&self, leases: &[LeaseRef<'_>]) -> Option<Vec<Vec<usize>>> {
        if !self.is_cluster() {
            return None;
        }
        let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, lease) in leases.iter().enumerate() {
            groups.entry(slot_of(lease.work_id)).or_default().push(i);
        }
        Some(groups.into_values().collect())
    }

    /// Runs a batch script over `n` leases; returns each lease's reply.
    async fn run_batch(
        &self,
        invocation: &ScriptInvocation<'_>,
        what: &str,
        n: usize,
    ) -> Result<Vec<Vec<Value>>> {
        let replies: Vec<Vec<Value>> = self
            .run_write(invocation, what)
            .await?
            .into_iter()
            .map(array)
            .collect::<Result<_>>()?;
        if replies.len() != n {
            return Err(bad_reply(&format!(
                "{what}: {} replies for {n} leases",
                replies.len()
            )));
        }
        Ok(replies)
    }
}

/// The hash slot of `work_id`'s keys (their hash tag is the escaped ID).
pub(super) fn slot_of(work_id: &WorkId) -> u16 {
    slot(super::keys::escape(work_id.as_str()).as_bytes())
}

/// A lease's outcome, or a reply error when a slot's call left it out.
pub(super) fn missing<T>(r: Option<Result<T>>) -> Result<T> {
    r.unwrap_or_else(|| Err(bad_reply("a batch left a lease without a reply")))
}
