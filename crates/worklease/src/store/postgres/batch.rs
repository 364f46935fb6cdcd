//! The batch operations: each ONE statement over arrays (`unnest`), so a
//! batch of up to [`MAX_BATCH`] leases costs one round trip (see the
//! module docs' "Batches").

use std::time::{Duration, SystemTime};

use tokio_postgres::types::ToSql;

use crate::error::Result;
use crate::limits::{HolderId, WorkId};
use crate::store::{Grant, LeaseRef};

use super::ops::{kept_racing, ttl_millis, verdicts, ATTEMPTS};
use super::PostgresStore;

/// The most leases one batch statement names ([`crate::LeaseStore::max_batch`]).
///
/// The arrays are single parameters, so PostgreSQL's 65,535 parameters per
/// statement do not apply, and 2,000 work IDs of the longest kind (1 KiB)
/// make 2 MiB, far below the protocol's 1 GiB per message. The limit comes
/// from cost, measured on PostgreSQL 15 on loopback (`fsync` on): a batch
/// renewal costs about 25–35 µs of server time per lease at every size
/// from a few hundred up (to 20,000), on top of a fixed 1–3 ms (round
/// trip, planning, commit), so at 2,000 the fixed part is a few percent and
/// bigger batches save nothing measurable; meanwhile a statement holds
/// its rows locked for its whole run (about 60 ms at 2,000, 300 ms at
/// 10,000), and a contender's acquisition of one of them waits that long.
/// The planner's estimated cost grows with the batch too (about 9 per
/// lease for a renewal, 12 for an acquisition): at 2,000 it stays well
/// under `jit_above_cost` (100,000 by default), beyond which the first
/// executions on each connection would pay for JIT compilation.
pub const MAX_BATCH: usize = 2_000;

/// A fencing token as the statements take it: one beyond `i64` was never
/// issued, and -1 matches no row, so its verdict is `Fenced`.
fn token_param(lease: &LeaseRef<'_>) -> i64 {
    i64::try_from(lease.fencing_token).unwrap_or(-1)
}

impl PostgresStore {
    /// Runs the batch form of renew or release (`sql`, with `extra` as
    /// `$4`) and maps each lease's verdict.
    async fn update_many(
        &self,
        sql: &str,
        leases: &[LeaseRef<'_>],
        extra: &(dyn ToSql + Sync),
        context: &'static str,
    ) -> Result<Vec<Result<()>>> {
        let work_ids: Vec<&str> = leases.iter().map(|l| l.work_id.as_str()).collect();
        let holders: Vec<&str> = leases.iter().map(|l| l.holder_id.as_str()).collect();
        let tokens: Vec<i64> = leases.iter().map(token_param).collect();
        let rows = self
            .query(sql, &[&work_ids, &holders, &tokens, extra], context)
            .await?;
        verdicts(&rows, leases, context)
    }

    pub(super) async fn renew_batch(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<SystemTime>>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let ttl_ms = ttl_millis(ttl)?;
        let out = self
            .update_many(&self.sql.renew_many, leases, &ttl_ms, "cannot renew")
            .await?;
        let now = SystemTime::now();
        Ok(out.into_iter().map(|r| r.map(|()| now + ttl)).collect())
    }

    pub(super) async fn release_batch(&self, leases: &[LeaseRef<'_>]) -> Result<Vec<Result<()>>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let channel = self.channel.as_str();
        let out = self
            .update_many(&self.sql.release_many, leases, &channel, "cannot release")
            .await?;
        // Waiters of these values need not wait for the notifications' trip.
        for (lease, r) in leases.iter().zip(&out) {
            if r.is_ok() {
                self.shared.notify(lease.work_id);
            }
        }
        Ok(out)
    }

    /// Acquires up to `max` of `work_ids` in order, one statement for the
    /// whole list. A work ID whose row a concurrent first acquisition
    /// inserted after the statement began is left undecided by it; the
    /// undecided ones, then the untried rest, go to one more statement
    /// (with `max` less the grants so far), as the single acquisition runs
    /// its statement again. The undecided ones come first and number at
    /// most that `max`, so each is tried again before any untried one is
    /// granted, and the outcomes stay a prefix of `work_ids` in order.
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
        let ttl_ms = ttl_millis(ttl)?;
        let mut outcomes: Vec<Option<Result<Grant>>> = work_ids.iter().map(|_| None).collect();
        // The positions in `work_ids` the next statement tries, in order.
        let mut pending: Vec<usize> = (0..work_ids.len()).collect();
        let mut granted = 0;
        // Statements in a row that decided nothing.
        let mut idle = 0;
        loop {
            let ids: Vec<&str> = pending.iter().map(|&i| work_ids[i].as_str()).collect();
            // As in the single acquisition: a waiter marks a held lease as
            // wanted, so that its release notifies.
            let waiting: Vec<bool> = pending
                .iter()
                .map(|&i| self.shared.is_watched(&work_ids[i]))
                .collect();
            let left = i64::try_from(max - granted).unwrap_or(i64::MAX);
            let rows = self
                .query(
                    &self.sql.acquire_many,
                    &[&ids, &holder_id.as_str(), &ttl_ms, &waiting, &left],
                    "cannot acquire",
                )
                .await?;
            let mut undecided = Vec::new();
            for (row, &i) in rows.iter().zip(&pending) {
                match self.acquired(row, &work_ids[i], ttl)? {
                    Some(outcome) => {
                        granted += usize::from(outcome.is_ok());
                        outcomes[i] = Some(outcome);
                    }
                    None => undecided.push(i),
                }
            }
            if undecided.is_empty() {
                // Every work ID tried was decided: the statement stopped at
                // `max` grants or at the end of the list.
                break;
            }
            idle = if undecided.len() == rows.len() {
                idle + 1
            } else {
                0
            };
            if idle == ATTEMPTS {
                for i in undecided {
                    outcomes[i] = Some(Err(kept_racing(&work_ids[i])));
                }
                break;
            }
            undecided.extend_from_slice(&pending[rows.len().min(pending.len())..]);
            pending = undecided;
        }
        Ok(outcomes.into_iter().map_while(|o| o).collect())
    }
}
