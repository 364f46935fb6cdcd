//! The pool scenario in the report.

use super::super::goals::goals;
use super::super::markdown;
use super::super::verdict::{Verdict, GOAL_POOL};
use super::run;
use crate::results::{PoolRow, Run};

fn pool(n: usize, ttl_ms: u64, ours: f64, baseline: f64) -> PoolRow {
    PoolRow {
        store: "sqlite".into(),
        work_ids: n,
        processes: 3,
        ttl_ms,
        round_ms: ttl_ms / 3,
        limit_secs: 50.0,
        coverage_secs: Some(ours),
        started: n,
        restarts: 0,
        warnings: 0,
        lost_leases: 0,
        pools_exited: 0,
        window_secs: 60.0,
        baseline_secs: Some(baseline),
        baseline_started: n,
        leftover: 0,
        first_error: None,
    }
}

fn pool_verdicts(r: &Run) -> Vec<Verdict> {
    goals(r)
        .into_iter()
        .filter(|v| v.goal == GOAL_POOL)
        .collect()
}

#[test]
fn pool_coverage_is_judged_in_rounds_beside_the_spawn_floor() {
    let mut r = run();
    r.stores[0].name = "sqlite".into();
    // 2,000 at TTL 5 s: round 1.666 s; 4.0 s is 2.4 rounds.
    r.pool = vec![pool(2_000, 5_000, 4.0, 1.0)];
    let v = pool_verdicts(&r);
    assert_eq!(v.len(), 2, "the measured size and the missing 10,000");
    assert_eq!(v[0].met, Some(true), "{}", v[0].measured);
    assert!(v[0].measured.contains("2.40 rounds"), "{}", v[0].measured);
    assert!(
        v[0].measured.contains("ours / baseline 4.00 ×"),
        "{}",
        v[0].measured
    );
    assert_eq!(v[1].met, None);
    assert!(v[1]
        .measured
        .starts_with("10,000 work IDs, TTL 10 s: not measured"));
    // A restart fails it whatever the time.
    r.pool[0].restarts = 2;
    r.pool[0].lost_leases = 3;
    let v = pool_verdicts(&r);
    assert_eq!(v[0].met, Some(false));
    let md = markdown(&r, "run.json", &[]);
    assert!(md.contains("started more than once"), "{md}");
    assert!(
        md.contains(
            "| sqlite | 2,000 | 3 | 5 | 1.67 | 4.00 | 2.40 | 1.00 | 0.60 | 4.00 | 2 | 3 | 0 | 0 |"
        ),
        "{md}"
    );
}

#[test]
fn a_spawn_floor_above_three_rounds_is_what_stands_in_the_way() {
    let mut r = run();
    r.stores[0].name = "sqlite".into();
    // 10,000 at TTL 10 s (round 3.333 s): the baseline alone 12 s.
    r.pool = vec![pool(10_000, 10_000, 30.0, 12.0)];
    let v = pool_verdicts(&r);
    assert_eq!(v[0].met, Some(false));
    let md = markdown(&r, "run.json", &[]);
    assert!(md.contains("its spawn floor is above 3 rounds"), "{md}");
    // The pools slower than 3 rounds with a floor below: their own cost.
    r.pool[0].baseline_secs = Some(2.0);
    let md = markdown(&r, "run.json", &[]);
    assert!(
        md.contains("a pool's first round only writes its membership"),
        "{md}"
    );
    // Not all started: no figure, and the goal is not met.
    r.pool[0].coverage_secs = None;
    r.pool[0].started = 9_000;
    let v = pool_verdicts(&r);
    assert!(
        v[0].measured.contains("only 9,000 of 10,000 started"),
        "{}",
        v[0].measured
    );
    assert_eq!(v[0].met, Some(false));
}
