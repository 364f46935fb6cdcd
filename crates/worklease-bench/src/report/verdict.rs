//! What every goal module of the report shares, below all of them: the
//! goals of issues 10, 17, 18 and 19 in the report's words, a goal's
//! [`Verdict`], and how rows are found and set against a bound.

use super::format::ms;
use crate::results::{HandoffRow, OpRow, Run, Variant};

// The goals of issue 10, in the words of the report.
pub const GOAL_CYCLE: &str = "cycle throughput ≥ 0.9 × baseline at 16 clients";
pub const GOAL_P99: &str = "cycle p99 latency ≤ 1.2 × baseline's at 16 clients";
pub const GOAL_FAILOVER: &str = "failover within TTL + poll interval + 50 ms";
pub const GOAL_HANDOFF: &str = "hand-off with push within 2 store round trips (median)";
/// After a store's name in a verdict of the hand-off rows with the waiters
/// in other processes.
pub const ACROSS_PROCESSES: &str = ", waiters in other processes";
pub const GOAL_PEER: &str = "cycle at least as fast as the peer lock at every concurrency";
pub const GOAL_SCALE: &str = "100,000 leases renewed by one process, no renewal missed";
// The goals of issue 17 (sessions and batches).
pub const GOAL_SCALE_REGISTER: &str =
    "a register store (S3, DynamoDB): 1,000 leases renewed, no renewal missed";
pub const GOAL_CALLS: &str = "store calls per renewal tick ≤ ceil(leases due / batch size)";
pub const GOAL_CPU: &str = "process CPU ≤ 5 µs per lease renewal at 100,000";
pub const GOAL_RSS: &str = "resident memory ≤ 2 KiB per lease at 100,000";
pub const GOAL_ETCD: &str = "etcd cycle ≥ 0.9 × two compare-and-put transactions";
pub const GOAL_POOL: &str = "3 `worklease pool` processes on SQLite: every work ID's child started exactly once within 3 rounds, no lease lost";
// The goals of issue 18 (semaphores and fair waiting).
pub const GOAL_SEMAPHORE: &str =
    "permit acquire → release with a free permit ≥ 0.9 × a lease cycle (reused IDs) at N = 1, 16 and 256";
pub const GOAL_FAIR_HANDOFF: &str =
    "hand-off to the next fair waiter within 2 store round trips + one notification (median)";
// The goals of issue 19 (elections).
pub const GOAL_ELECTION_HANDOVER: &str =
    "election hand-over after resign or step-down within 2 store round trips + one notification (median, 1 and 16 standbys)";
pub const GOAL_OBSERVE: &str =
    "an observer learns of a new leader within one notification (stores with notifications) or one poll interval";

/// The row of `store` at `clients` clients (and `bytes`) of `variant`.
pub fn find<'a>(
    rows: &'a [OpRow],
    store: &str,
    clients: usize,
    bytes: Option<usize>,
    variant: Variant,
) -> Option<&'a OpRow> {
    rows.iter().find(|r| {
        r.store == store && r.clients == clients && r.bytes == bytes && r.variant == variant
    })
}

/// Whether `bound` was measured and every row ran without failures with
/// a median within the bound's (the fair hand-off and election goals).
pub fn within_bound<'a>(
    bound: &HandoffRow,
    rows: impl IntoIterator<Item = &'a HandoffRow>,
) -> bool {
    bound.latency.count > 0
        && rows.into_iter().all(|r| {
            r.errors == 0 && r.latency.count > 0 && r.latency.p50_us <= bound.latency.p50_us
        })
}

/// `row`'s median as a multiple of `bound`'s (the fair hand-off and
/// election tables and goals).
pub fn of_bound(row: &HandoffRow, bound: &HandoffRow) -> f64 {
    row.latency.p50_us as f64 / bound.latency.p50_us.max(1) as f64
}

/// "X ms more LABEL (N round trips)" for each of the labelled rows whose
/// median is over `bound`'s, in round trips of the bound's store.
pub fn over_bound<'a>(
    bound: &HandoffRow,
    rows: impl IntoIterator<Item = (String, &'a HandoffRow)>,
) -> Vec<String> {
    let rtt = bound.round_trip_us.max(1);
    rows.into_iter()
        .filter(|(_, r)| r.latency.p50_us > bound.latency.p50_us)
        .map(|(label, r)| {
            let extra = r.latency.p50_us - bound.latency.p50_us;
            format!(
                "{} ms more {label} ({:.1} round trips)",
                ms(extra),
                extra as f64 / rtt as f64
            )
        })
        .collect()
}

/// The stores of a run, in its order.
pub fn stores(run: &Run) -> Vec<&str> {
    run.stores.iter().map(|s| s.name.as_str()).collect()
}

/// One goal's verdict for one store.
pub struct Verdict {
    pub goal: &'static str,
    pub store: String,
    pub measured: String,
    /// `None`: not measured in this run.
    pub met: Option<bool>,
}
