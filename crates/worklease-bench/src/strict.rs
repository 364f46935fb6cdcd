//! `--strict`: what went wrong in a run, so that CI's smoke run fails on
//! it.

use crate::results::Run;
use crate::stores;

/// What went wrong in a run, for `--strict`: stores of this build left
/// out, failed or skipped scenarios (the pool scenario without the
/// `worklease` binary too), failed operations of cycle, renew, checkpoint
/// and semaphore, failed failover trials, scale runs that acquired nothing
/// or counted no store call while renewing, pool measurements where not
/// every child started within the limit (ours or the baseline's), a pool
/// exited, or a process was left after the cleanup, an election row
/// without a single hand-over. (Failed calls of
/// waiters in the hand-offs are the store's answers under contention:
/// reported, not fatal; nor is a goal not met.)
pub fn problems(run: &Run) -> Vec<String> {
    let built: Vec<&str> = stores::table()
        .iter()
        .filter(|e| e.connect.is_ok())
        .map(|e| e.name)
        .collect();
    let mut v: Vec<String> = run
        .skipped
        .iter()
        .filter(|s| s.scenario.is_some() || built.contains(&s.store.as_str()))
        .map(|s| {
            format!(
                "{}{}: {}",
                s.store,
                s.scenario
                    .as_deref()
                    .map(|x| format!(" {x}"))
                    .unwrap_or_default(),
                s.reason
            )
        })
        .collect();
    for r in run
        .cycle
        .iter()
        .chain(&run.cycle_reused)
        .chain(&run.renew)
        .chain(&run.checkpoint)
    {
        if r.errors > 0 {
            v.push(format!(
                "{} {} at {} clients: {} failed operations ({})",
                r.store,
                r.variant.as_str(),
                r.clients,
                r.errors,
                r.first_error.as_deref().unwrap_or("?")
            ));
        }
    }
    for r in &run.semaphore {
        if r.op.errors > 0 {
            v.push(format!(
                "{} semaphore {} (N = {}{}) at {} clients: {} failed operations ({})",
                r.op.store,
                r.op.variant.as_str(),
                r.permits,
                if r.fair { ", fair" } else { "" },
                r.op.clients,
                r.op.errors,
                r.op.first_error.as_deref().unwrap_or("?")
            ));
        }
    }
    for p in &run.pool {
        let mut wrong = Vec::new();
        if p.coverage_secs.is_none() {
            wrong.push(format!(
                "{} of the work IDs' children started within {:.0} s",
                p.started, p.limit_secs
            ));
        }
        if p.baseline_secs.is_none() {
            wrong.push(format!(
                "{} of the baseline's children started within {:.0} s",
                p.baseline_started, p.limit_secs
            ));
        }
        if p.pools_exited > 0 {
            wrong.push(format!("{} pools exited early", p.pools_exited));
        }
        if p.leftover > 0 {
            wrong.push(format!("{} processes left after the cleanup", p.leftover));
        }
        if !wrong.is_empty() {
            v.push(format!(
                "{} pool over {} work IDs: {}",
                p.store,
                p.work_ids,
                wrong.join(", ")
            ));
        }
    }
    // An election that stalled (no hand-over at all) is a liveness bug.
    for e in run.election.iter().filter(|e| e.handoff.latency.count == 0) {
        v.push(format!(
            "{} election {} with {} standbys: no hand-over ({})",
            e.handoff.store,
            e.how.as_str(),
            e.handoff.waiters,
            e.handoff.first_error.as_deref().unwrap_or("no error")
        ));
    }
    for f in &run.failover {
        if f.errors > 0 {
            v.push(format!(
                "{} failover: {} failed trials ({})",
                f.store,
                f.errors,
                f.first_error.as_deref().unwrap_or("?")
            ));
        }
    }
    // The store calls are counted by the scale process's recorder from
    // the library's metrics: none counted while renewals went on means the
    // count is broken, and so are the figures made of it.
    for s in &run.scale {
        if s.acquired == 0 {
            v.push(format!(
                "{} scale at {} leases: none acquired",
                s.store, s.leases
            ));
        }
        if s.renewals_ok > 0 && s.renew_calls.unwrap_or(0) == 0 {
            v.push(format!(
                "{} scale at {} leases: {} renewals but no renew_many store call counted",
                s.store, s.leases, s.renewals_ok
            ));
        }
    }
    v
}
