//! The goals of issues 10, 17, 18 and 19, judged from a run's figures: one
//! [`Verdict`] per goal and store. The cycle, peer, failover, hand-off and
//! etcd goals are judged here; each scenario's own goals by its module.

use super::format::{ms, ms_f, rate};
use super::verdict::{
    find, stores, Verdict, ACROSS_PROCESSES, GOAL_CYCLE, GOAL_ETCD, GOAL_FAILOVER, GOAL_HANDOFF,
    GOAL_P99, GOAL_PEER,
};
use super::{election, fair, pool, scale, semaphore};
use crate::results::{HandoffMode, HandoffRow, Run, Variant};

/// Every goal's verdicts for every store of the run, in the report's order.
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
    scale::verdicts(run, &mut v);
    pool::verdicts(run, &mut v);
    semaphore::verdicts(run, &mut v);
    fair::verdicts(run, &mut v);
    election::verdicts(run, &mut v);
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
