//! The pool scenario in the report: its goal (three `worklease pool`
//! processes on SQLite start every work ID's child exactly once within 3
//! rounds, no lease lost: issue 17 at 2,000 work IDs / TTL 5 s and 10,000
//! / TTL 10 s), what stands in its way (the machine's spawn floor, measured
//! beside it), and its table.

use std::fmt::Write as _;

use super::format::{count, failures};
use super::verdict::{Verdict, GOAL_POOL};
use crate::results::{PoolRow, Run};

/// The goal's sizes: (work IDs, TTL ms).
const GOAL_SIZES: [(usize, u64); 2] = [(2_000, 5_000), (10_000, 10_000)];
/// The goal's bound, in rounds.
const GOAL_ROUNDS: f64 = 3.0;

/// `4.21 s (1.26 rounds)`, or why there is no figure.
fn took(secs: Option<f64>, rounds: Option<f64>, started: usize, of: usize) -> String {
    match (secs, rounds) {
        (Some(s), Some(r)) => format!("{s:.2} s ({r:.2} rounds)"),
        _ => format!(
            "only {} of {} started within the limit",
            count(started as u64),
            count(of as u64)
        ),
    }
}

/// The size of a row: `2,000 work IDs, TTL 5 s`.
fn size(p: &PoolRow) -> String {
    format!(
        "{} work IDs, TTL {} s",
        count(p.work_ids as u64),
        p.ttl_ms as f64 / 1000.0
    )
}

/// Whether a row meets the goal.
fn met(p: &PoolRow) -> bool {
    p.coverage_rounds().is_some_and(|r| r <= GOAL_ROUNDS)
        && p.restarts == 0
        && p.lost_leases == 0
        && p.pools_exited == 0
}

/// One pool goal per measured size, and a "not measured" one for each of
/// the goal's sizes the run lacks.
pub fn verdicts(run: &Run, v: &mut Vec<Verdict>) {
    let on_sqlite = run.stores.iter().any(|s| s.name == "sqlite");
    if !on_sqlite && run.pool.is_empty() {
        return;
    }
    for p in &run.pool {
        v.push(Verdict {
            goal: GOAL_POOL,
            store: p.store.clone(),
            measured: format!(
                "{}: all started in {}; baseline (this program spawning them) {}; ours / baseline {}; {} restarts, {} lost leases ({} warnings), {} pools exited",
                size(p),
                took(p.coverage_secs, p.coverage_rounds(), p.started, p.work_ids),
                took(p.baseline_secs, p.baseline_rounds(), p.baseline_started, p.work_ids),
                p.ratio().map_or("-".into(), |r| format!("{r:.2} ×")),
                p.restarts,
                p.lost_leases,
                p.warnings,
                p.pools_exited
            ),
            met: Some(met(p)),
        });
    }
    for (n, ttl_ms) in GOAL_SIZES {
        if !run
            .pool
            .iter()
            .any(|p| p.work_ids == n && p.ttl_ms == ttl_ms)
        {
            v.push(Verdict {
                goal: GOAL_POOL,
                store: "sqlite".to_string(),
                measured: format!(
                    "{} work IDs, TTL {} s: not measured in this run",
                    count(n as u64),
                    ttl_ms / 1000
                ),
                met: None,
            });
        }
    }
}

/// What stands in the way of an unmet pool goal; `None` for the other
/// goals.
pub fn why(run: &Run, v: &Verdict) -> Option<String> {
    if v.goal != GOAL_POOL {
        return None;
    }
    let p = run.pool.iter().find(|p| v.measured.starts_with(&size(p)))?;
    let mut why = Vec::new();
    match (p.coverage_rounds(), p.baseline_rounds()) {
        (_, None) => why.push(format!(
            "even this program spawning the {} children directly did not start them all within {:.0} s: the machine cannot start that many processes within 3 rounds",
            count(p.work_ids as u64),
            p.limit_secs
        )),
        (_, Some(b)) if b > GOAL_ROUNDS => why.push(format!(
            "even this program spawning the {} children directly took {:.2} s = {b:.2} rounds of {:.2} s on this machine (its spawn floor is above 3 rounds), so the pools cannot meet it here",
            count(p.work_ids as u64),
            p.baseline_secs.unwrap_or_default(),
            p.round_secs()
        )),
        (Some(c), Some(b)) if c > GOAL_ROUNDS => why.push(format!(
            "the pools took {c:.2} rounds where spawning the children directly took {b:.2} ({:.1} × as long): a pool's first round only writes its membership (no child starts before one round), then each pool acquires its share and starts its children, at most 16 at a time (a store read and a spawn each, `STARTING` in the CLI's pool) on the one thread that also renews its leases; and each child is started through the `worklease` binary itself (`posix_spawn` of `/proc/self/exe __worklease-exec-child`, which sets the parent-death signal and reports a failed exec through a pipe, then execs the command): one more exec per child than the baseline's",
            p.ratio().unwrap_or_default()
        )),
        (None, Some(_)) => why.push(format!(
            "only {} of the {} work IDs' children started within {:.0} s",
            count(p.started as u64),
            count(p.work_ids as u64),
            p.limit_secs
        )),
        _ => {}
    }
    if p.restarts > 0 || p.lost_leases > 0 {
        why.push(format!(
            "{} work IDs' children started more than once and the pools logged {} lost leases ({} warnings in all): leases were lost while the pools were busy starting children (the pools' stderr says which)",
            p.restarts, p.lost_leases, p.warnings
        ));
    }
    if p.pools_exited > 0 {
        why.push(format!(
            "{} pools exited before the end: {}",
            p.pools_exited,
            p.first_error.as_deref().unwrap_or("?")
        ));
    }
    Some(why.join("; ") + ".")
}

/// The pool table.
pub fn table(w: &mut String, run: &Run) {
    if run.pool.is_empty() {
        return;
    }
    let _ = writeln!(
        w,
        "\n## Pool coverage: `worklease pool` against spawning the children directly\n"
    );
    let _ = writeln!(
        w,
        "{} `worklease pool` processes (the `worklease` binary beside worklease-bench) share N work IDs on a fresh SQLite file, each work ID's child being `crates/worklease-cli/tests/pool_scale.rs`'s (it appends its work ID and fencing token to a file, then `exec sleep 3600`, so every child stays). **ours**: from starting the pools until every work ID's child had started; a round is TTL/3 (the pools' renewal and rebalancing interval; a pool's first round only writes its membership, so no child starts before one round). Then a window of {:.0} s: restarts are work IDs whose child started more than once (by the window's end), warnings the pools' WARN and ERROR lines, lost leases those among them that say a lease was lost. **baseline**, in the same run just before: this program spawning the same N children directly (std's `Command`, `posix_spawn` here, of `/bin/sh child.sh` with the same environment variables, each in a process group of its own), until every child had started: the machine's floor for starting N processes. Every process group is killed at the end and no process of the scenario may be left. Limit of each wait: {} rounds.\n",
        run.plan.pool_processes, run.plan.pool_window_secs, run.plan.pool_limit_rounds
    );
    let _ = writeln!(w, "| store | work IDs | pools | TTL s | round s | ours s | ours rounds | baseline s | baseline rounds | ours / baseline | restarts | lost leases | warnings | processes left |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let or_dash = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
    let mut notes = Vec::new();
    for p in &run.pool {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {:.2} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.store,
            count(p.work_ids as u64),
            p.processes,
            p.ttl_ms as f64 / 1000.0,
            p.round_secs(),
            or_dash(p.coverage_secs),
            or_dash(p.coverage_rounds()),
            or_dash(p.baseline_secs),
            or_dash(p.baseline_rounds()),
            or_dash(p.ratio()),
            p.restarts,
            p.lost_leases,
            p.warnings,
            p.leftover
        );
        if let Some(e) = &p.first_error {
            notes.push(format!("{}: {e}", size(p)));
        }
    }
    failures(w, "Failures", &notes);
}
