//! The fair hand-off scenario in the report.

use super::super::goals::goals;
use super::super::markdown;
use super::super::verdict::GOAL_FAIR_HANDOFF;
use super::{handoff, run, verdict};
use crate::results::{FairHandoffRow, HandoffMode};

fn row(fair: bool, waiters: usize, p50_us: u64) -> FairHandoffRow {
    let mut h = handoff(waiters, HandoffMode::Push, false, p50_us);
    h.store = "redis".into();
    FairHandoffRow { fair, handoff: h }
}

#[test]
fn fair_handoffs_are_judged_against_the_unfair_one_to_one_waiter() {
    let mut r = run();
    // Round trip 500 µs; the bound 1,300 µs: 2 round trips + 300 µs.
    r.fair_handoff = vec![
        row(false, 1, 1_300),
        row(true, 1, 1_200),
        row(true, 16, 1_250),
    ];
    let v = goals(&r);
    let g = verdict(&v, GOAL_FAIR_HANDOFF);
    assert_eq!(g.met, Some(true), "{}", g.measured);
    assert!(g.measured.contains("bound 1.30 ms"), "{}", g.measured);
    assert!(
        g.measured.contains("one notification (0.300 ms)"),
        "{}",
        g.measured
    );
    // 16 waiters one round trip over: not met, and explained.
    r.fair_handoff[2].handoff.latency.p50_us = 1_800;
    let v = goals(&r);
    assert_eq!(verdict(&v, GOAL_FAIR_HANDOFF).met, Some(false));
    let md = markdown(&r, "run.json", &[]);
    assert!(
        md.contains("## Fair hand-off: release → the next fair waiter"),
        "{md}"
    );
    assert!(md.contains("| redis | 16 | fair, push | 1.80 |"), "{md}");
    assert!(
        md.contains("| redis | 1 | bound: unfair, push | 1.30 |"),
        "{md}"
    );
    assert!(
        md.contains("0.500 ms more at 16 waiter(s) (1.0 round trips)"),
        "{md}"
    );
}

#[test]
fn a_store_without_notifications_is_shown_not_judged() {
    let mut r = run();
    r.fair_handoff = vec![row(false, 1, 60_000), row(true, 16, 70_000)];
    for x in &mut r.fair_handoff {
        x.handoff.notified = false;
    }
    let v = goals(&r);
    assert!(v.iter().all(|v| v.goal != GOAL_FAIR_HANDOFF));
    let md = markdown(&r, "run.json", &[]);
    assert!(md.contains("fair, polling (no notifications)"), "{md}");
}
