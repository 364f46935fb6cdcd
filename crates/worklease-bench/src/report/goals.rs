//! The goals of issues 10, 17, 18 and 19, judged from a run's figures: one
//! [`Verdict`] per goal and store.

use super::format::{ms, ms_f, rate};
use crate::results::{HandoffMode, HandoffRow, OpRow, Run, Variant};

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

pub fn goals(run: &Run) -> Vec<Verdict> {
    let mut v = Vec::new();
    for store in stores(run) {
        let ours = find(&run.cycle, store, 16, None, Variant::Ours);
        let base = find(&run.cycle, store, 16, None, Variant::Baseline);
        match (ours, base) {
            (Some(o), Some(b)) => {
                let r = o.ops_per_sec / b.ops_per_sec;
                v.push(Verdict {
                    goal: GOAL_CYCLE,
                    store: store.to_string(),
                    measured: format!(
                        "{r:.2} × ({} vs {} cycles/s)",
                        rate(o.ops_per_sec),
                        rate(b.ops_per_sec)
                    ),
                    met: Some(r >= 0.9),
                });
                let p = o.latency.p99_us as f64 / b.latency.p99_us.max(1) as f64;
                v.push(Verdict {
                    goal: GOAL_P99,
                    store: store.to_string(),
                    measured: format!(
                        "{p:.2} × ({} vs {} ms)",
                        ms(o.latency.p99_us),
                        ms(b.latency.p99_us)
                    ),
                    met: Some(p <= 1.2),
                });
            }
            _ => {
                for goal in [GOAL_CYCLE, GOAL_P99] {
                    v.push(Verdict {
                        goal,
                        store: store.to_string(),
                        measured: "not measured at 16 clients in this run".to_string(),
                        met: None,
                    });
                }
            }
        }
    }
    for store in stores(run) {
        let ratios: Vec<(usize, f64)> = run
            .cycle
            .iter()
            .filter(|r| r.store == store && r.variant == Variant::Peer)
            .filter_map(|p| {
                find(&run.cycle, store, p.clients, None, Variant::Ours)
                    .map(|o| (p.clients, o.ops_per_sec / p.ops_per_sec))
            })
            .collect();
        if ratios.is_empty() {
            continue;
        }
        let worst = ratios
            .iter()
            .cloned()
            .fold((0, f64::INFINITY), |a, b| if b.1 < a.1 { b } else { a });
        let list: Vec<String> = ratios
            .iter()
            .map(|(c, r)| format!("{c}: {r:.2} ×"))
            .collect();
        v.push(Verdict {
            goal: GOAL_PEER,
            store: store.to_string(),
            measured: format!("ours / peer by clients: {}", list.join(", ")),
            met: Some(worst.1 >= 1.0),
        });
    }
    for f in &run.failover {
        let max = f.trials_ms.iter().cloned().fold(0.0, f64::max);
        v.push(Verdict {
            goal: GOAL_FAILOVER,
            store: f.store.clone(),
            measured: if f.trials_ms.is_empty() {
                format!(
                    "no trial succeeded: {}",
                    f.first_error.as_deref().unwrap_or("?")
                )
            } else {
                format!(
                    "worst {} ms of {} trials; bound {} ms (TTL {} + poll {} + 50)",
                    ms_f(max),
                    f.trials_ms.len(),
                    f.bound_ms,
                    f.ttl_ms,
                    f.poll_ms
                )
            },
            met: Some(!f.trials_ms.is_empty() && f.errors == 0 && max <= f.bound_ms as f64),
        });
    }
    for (store, across) in stores(run)
        .into_iter()
        .flat_map(|s| [(s, false), (s, true)])
    {
        let rows: Vec<&HandoffRow> = run
            .handoff
            .iter()
            .filter(|h| {
                h.store == store && h.mode == HandoffMode::Push && h.across_processes == across
            })
            .collect();
        if rows.is_empty() {
            continue;
        }
        let list: Vec<String> = rows
            .iter()
            .map(|h| {
                format!(
                    "{} waiter(s): {:.1} round trips",
                    h.waiters,
                    h.latency.p50_us as f64 / h.round_trip_us.max(1) as f64
                )
            })
            .collect();
        let notified = rows.iter().all(|h| h.notified);
        let met = notified
            && rows
                .iter()
                .all(|h| h.errors == 0 && h.latency.p50_us <= 2 * h.round_trip_us.max(1));
        v.push(Verdict {
            goal: GOAL_HANDOFF,
            store: if across {
                format!("{store}{ACROSS_PROCESSES}")
            } else {
                store.to_string()
            },
            measured: format!(
                "{}{} (round trip {} ms)",
                if notified {
                    ""
                } else {
                    "no push, the store has no notifications: "
                },
                list.join(", "),
                ms(rows[0].round_trip_us)
            ),
            met: Some(met),
        });
    }
    etcd_verdicts(run, &mut v);
    super::scale::verdicts(run, &mut v);
    super::pool::verdicts(run, &mut v);
    super::semaphore::verdicts(run, &mut v);
    super::fair::verdicts(run, &mut v);
    super::election::verdicts(run, &mut v);
    v
}

/// The etcd cycle against two of its baseline's compare-and-put
/// transactions (the cycle baseline), at 16 clients, over fresh and over
/// reused work IDs.
fn etcd_verdicts(run: &Run, v: &mut Vec<Verdict>) {
    const STORE: &str = "etcd";
    if !stores(run).contains(&STORE) {
        return;
    }
    for (ids, rows) in [("fresh IDs", &run.cycle), ("reused IDs", &run.cycle_reused)] {
        let ours = find(rows, STORE, 16, None, Variant::Ours);
        let base = find(rows, STORE, 16, None, Variant::Baseline);
        v.push(match (ours, base) {
            (Some(o), Some(b)) => {
                let r = o.ops_per_sec / b.ops_per_sec;
                Verdict {
                    goal: GOAL_ETCD,
                    store: STORE.to_string(),
                    measured: format!(
                        "{ids}, 16 clients: {r:.2} × ({} cycles/s vs {} pairs of transactions/s)",
                        rate(o.ops_per_sec),
                        rate(b.ops_per_sec)
                    ),
                    met: Some(r >= 0.9),
                }
            }
            _ => Verdict {
                goal: GOAL_ETCD,
                store: STORE.to_string(),
                measured: format!("{ids}: not measured at 16 clients in this run"),
                met: None,
            },
        });
    }
}
