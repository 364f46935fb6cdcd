//! What the batch operations (in `ops.rs`) share: each is ONE statement
//! over arrays (`unnest`), so a batch of up to [`MAX_BATCH`] leases costs
//! one round trip (see the module docs' "Batches").

use tokio_postgres::types::ToSql;

use crate::error::Result;
use crate::store::LeaseRef;

use super::ops::verdicts;
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
    pub(super) async fn update_many(
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
}
