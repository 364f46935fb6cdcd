//! The batch operations: each one call of a batch script whose `KEYS` are
//! every key of every lease in the batch, and whose reply holds each
//! lease's reply in the single script's encoding (the batch and single
//! scripts call the same functions of `common.lua`).

use std::time::{Duration, SystemTime};

use redis::{ScriptInvocation, Value};

use crate::error::Result;
use crate::limits::{ceil_millis, HolderId, WorkId};
use crate::store::{Grant, LeaseRef};

use super::acquire::Replies;
use super::keys::{KeyWriter, Kind};
use super::reply::{array, bad_reply};
use super::scripts::{lease_outcome, SCRIPTS};
use super::RedisStore;

/// The most leases one batch call names (see "Batches" in the module docs
/// for how it was chosen).
pub const MAX_BATCH: usize = 100;

impl RedisStore {
    /// `acquire_many`: one `acquire_many.lua` call (and one `WAIT` after
    /// it with a replica wait).
    pub(super) async fn acquire_batch(
        &self,
        work_ids: &[WorkId],
        holder_id: &HolderId,
        ttl: Duration,
        max: usize,
    ) -> Result<Vec<Result<Grant>>> {
        if work_ids.is_empty() || max == 0 {
            return Ok(Vec::new());
        }
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

    /// `renew_many`: one `renew_many.lua` call.
    pub(super) async fn renew_batch(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<SystemTime>>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
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

    /// `release_many`: one `release_many.lua` call, which publishes each
    /// released work ID.
    pub(super) async fn release_batch(&self, leases: &[LeaseRef<'_>]) -> Result<Vec<Result<()>>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
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
