//! The election scenario in the report.

use super::super::goals::goals;
use super::super::markdown;
use super::super::verdict::{GOAL_ELECTION_HANDOVER, GOAL_OBSERVE};
use super::{handoff, run, verdict};
use crate::results::{ElectionRow, HandOver, HandoffMode, Latency};

fn row(how: HandOver, standbys: usize, p50_us: u64, observed_us: u64) -> ElectionRow {
    let mut h = handoff(standbys, HandoffMode::Push, false, p50_us);
    h.store = "redis".into();
    ElectionRow {
        how,
        handoff: h,
        observed: (how != HandOver::Bound).then(|| Latency {
            p50_us: observed_us,
            count: 100,
            ..Latency::default()
        }),
        observed_missed: 0,
        seen: None,
    }
}

#[test]
fn hand_overs_and_observers_are_judged_against_the_unfair_one_to_one_waiter() {
    let mut r = run();
    r.election = vec![
        row(HandOver::Bound, 1, 1_300, 0),
        row(HandOver::Resign, 1, 1_200, 900),
        row(HandOver::StepDown, 16, 1_300, 1_300),
    ];
    let v = goals(&r);
    let g = verdict(&v, GOAL_ELECTION_HANDOVER);
    assert_eq!(g.met, Some(true), "{}", g.measured);
    assert!(g.measured.contains("bound 1.30 ms"), "{}", g.measured);
    assert_eq!(verdict(&v, GOAL_OBSERVE).met, Some(true));
    // A hand-over one round trip over, an observer over its bound.
    r.election[2].handoff.latency.p50_us = 1_800;
    r.election[1].observed.as_mut().expect("observed").p50_us = 1_400;
    let v = goals(&r);
    assert_eq!(verdict(&v, GOAL_ELECTION_HANDOVER).met, Some(false));
    assert_eq!(verdict(&v, GOAL_OBSERVE).met, Some(false));
    let md = markdown(&r, "run.json", &[]);
    assert!(
        md.contains("## Election hand-over: resign or step-down → the next leader"),
        "{md}"
    );
    assert!(md.contains("| redis | 16 | step-down | 1.80 |"), "{md}");
    assert!(
        md.contains("0.500 ms more on step-down with 16 standby(s) (1.0 round trips)"),
        "{md}"
    );
}

#[test]
fn without_notifications_only_the_observer_is_judged_by_the_poll() {
    let mut r = run();
    r.election = vec![
        row(HandOver::Bound, 1, 60_000, 0),
        row(HandOver::Resign, 16, 70_000, 90_000),
    ];
    for x in &mut r.election {
        x.handoff.notified = false;
    }
    let v = goals(&r);
    assert!(v.iter().all(|v| v.goal != GOAL_ELECTION_HANDOVER));
    // The plan's poll is 100 ms: 90 ms is within it.
    let g = verdict(&v, GOAL_OBSERVE);
    assert_eq!(g.met, Some(true), "{}", g.measured);
}
