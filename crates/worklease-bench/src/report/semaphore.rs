//! The semaphore scenario in the report: its goal (a permit cycle ≥ 0.9 ×
//! the lease cycle over reused work IDs, at N = 1, 16 and 256), what
//! stands in its way, and its table.

use std::fmt::Write as _;

use super::format::{failures, ms, rate};
use super::verdict::{stores, Verdict, GOAL_SEMAPHORE};
use crate::results::{PermitRow, Run, Variant};

/// The permit counts the goal names.
const GOAL_PERMITS: [usize; 3] = [1, 16, 256];
/// The goal's bound: permit cycles / lease cycles.
const GOAL_RATIO: f64 = 0.9;

/// The lease-cycle row measured beside `r` (same store, clients and N).
fn baseline_of<'a>(run: &'a Run, r: &PermitRow) -> Option<&'a PermitRow> {
    run.semaphore.iter().find(|b| {
        b.op.variant == Variant::Baseline
            && b.op.store == r.op.store
            && b.op.clients == r.op.clients
            && b.permits == r.permits
    })
}

/// (clients, N, permit cycles / lease cycles) of `store`'s unfair permit
/// rows.
fn ratios(run: &Run, store: &str) -> Vec<(usize, usize, f64)> {
    run.semaphore
        .iter()
        .filter(|r| r.op.store == store && r.op.variant == Variant::Ours && !r.fair)
        .filter_map(|r| {
            let b = baseline_of(run, r)?;
            Some((r.op.clients, r.permits, r.op.ops_per_sec / b.op.ops_per_sec))
        })
        .collect()
}

/// The semaphore goal of every store of the run.
pub fn verdicts(run: &Run, v: &mut Vec<Verdict>) {
    for store in stores(run) {
        let ratios = ratios(run, store);
        if ratios.is_empty() {
            v.push(Verdict {
                goal: GOAL_SEMAPHORE,
                store: store.to_string(),
                measured: "not measured in this run".to_string(),
                met: None,
            });
            continue;
        }
        let mut parts = Vec::new();
        let mut missing = Vec::new();
        for n in GOAL_PERMITS {
            let at: Vec<String> = ratios
                .iter()
                .filter(|(_, p, _)| *p == n)
                .map(|(c, _, r)| format!("{r:.2} × at {c}"))
                .collect();
            if at.is_empty() {
                missing.push(n.to_string());
            } else {
                parts.push(format!("N = {n}: {}", at.join(", ")));
            }
        }
        let low = ratios.iter().any(|(_, _, r)| *r < GOAL_RATIO);
        let mut measured = format!(
            "permit cycles / lease cycles by clients: {}",
            parts.join("; ")
        );
        if !missing.is_empty() {
            let _ = write!(measured, "; N = {} not measured", missing.join(", "));
        }
        v.push(Verdict {
            goal: GOAL_SEMAPHORE,
            store: store.to_string(),
            measured,
            met: if low {
                Some(false)
            } else if missing.is_empty() {
                Some(true)
            } else {
                None
            },
        });
    }
}

/// What stands in the way of an unmet semaphore goal; `None` for the
/// other goals.
pub fn why(run: &Run, v: &Verdict) -> Option<String> {
    if v.goal != GOAL_SEMAPHORE {
        return None;
    }
    let cpu: Vec<String> = run
        .semaphore
        .iter()
        .filter(|r| r.op.store == v.store && r.op.variant == Variant::Ours && !r.fair)
        .filter_map(|r| {
            let b = baseline_of(run, r)?;
            Some(format!(
                "N = {} at {}: {:.1} against {:.1}",
                r.permits, r.op.clients, r.op.cpu_us_per_op?, b.op.cpu_us_per_op?
            ))
        })
        .collect();
    let cpu = if cpu.is_empty() {
        String::new()
    } else {
        format!(
            " This process's CPU per cycle, µs (permit against lease): {}.",
            cpu.join("; ")
        )
    };
    Some(format!(
        "a permit is `Leases::acquire_any` over the N permits' work IDs from a random one on: one `acquire_many` store call naming up to min(N, the store's batch size) work IDs, at most one granted, where the lease cycle's acquisition names one; the store's batch path (a transaction, statement, script or set of requests for many leases) and the client's work per named work ID (checked IDs, the batch's outcomes) are what a permit costs beyond a lease.{cpu}"
    ))
}

/// The semaphore table.
pub fn table(w: &mut String, run: &Run) {
    if run.semaphore.is_empty() {
        return;
    }
    let _ = writeln!(
        w,
        "\n## Semaphore: permit acquire → release with a free permit\n"
    );
    let _ = writeln!(
        w,
        "Each client has a semaphore of its own of N permits (`Semaphore::new(leases, NAME, N)`), so a permit is always free (at N = 1 too) and no acquisition races another for one: the figure is what \"any free one of these N\" costs. A cycle is `Semaphore::acquire(AcquireOptions::new())` (fail fast) then `release` of the permit. Every permit is acquired and released once before the figures. **Lease cycle**, the baseline of this goal, measured alternately with the permit cycles in the same comparison: ours' acquire → release over the fixed set of {} reused work IDs, partitioned among the clients as in the cycle over reused work IDs. **fair**: the permit cycle with `AcquireOptions::new().fair()` on semaphores of their own, nobody in line (ADR 0015's fast path: the queue lease, its checkpoint read, the permit, the queue lease's release): reported, not a goal. Latencies are of one whole cycle, in ms.\n",
        run.plan.cycle_reused_ids
    );
    let _ = writeln!(w, "| store | clients | N | acquisition | permit cycles /s | lease cycles /s | permit / lease | permit p50 / p99 | lease p50 / p99 | CPU µs/op permit / lease |\n|---|---|---|---|---|---|---|---|---|---|");
    let mut errors = Vec::new();
    for r in run
        .semaphore
        .iter()
        .filter(|r| r.op.variant == Variant::Ours)
    {
        let b = baseline_of(run, r);
        let cpu = |r: Option<&PermitRow>| {
            r.and_then(|r| r.op.cpu_us_per_op)
                .map_or("-".to_string(), |c| format!("{c:.1}"))
        };
        let lat = |r: Option<&PermitRow>| {
            r.map_or("-".to_string(), |r| {
                format!("{} / {}", ms(r.op.latency.p50_us), ms(r.op.latency.p99_us))
            })
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} |",
            r.op.store,
            r.op.clients,
            r.permits,
            if r.fair { "fair" } else { "fail fast" },
            rate(r.op.ops_per_sec),
            b.map_or("-".into(), |b| rate(b.op.ops_per_sec)),
            b.map_or("-".into(), |b| format!(
                "{:.2}",
                r.op.ops_per_sec / b.op.ops_per_sec
            )),
            lat(Some(r)),
            lat(b),
            cpu(Some(r)),
            cpu(b)
        );
        for x in [Some(r), b].into_iter().flatten() {
            if x.op.errors > 0 {
                errors.push(format!(
                    "{} {} (N = {}{}) at {} clients: {} failed operations (first: {})",
                    x.op.store,
                    if x.op.variant == Variant::Baseline {
                        "lease cycle"
                    } else {
                        "permit cycle"
                    },
                    x.permits,
                    if x.fair { ", fair" } else { "" },
                    x.op.clients,
                    x.op.errors,
                    x.op.first_error.as_deref().unwrap_or("?")
                ));
            }
        }
    }
    errors.dedup();
    failures(w, "Failures (not timed)", &errors);
}
