//! The semaphore scenario in the report.

use super::super::goals::goals;
use super::super::markdown;
use super::super::verdict::GOAL_SEMAPHORE;
use super::{op, run, verdict};
use crate::results::{PermitRow, Variant};

fn permit(clients: usize, permits: usize, fair: bool, variant: Variant, rate: f64) -> PermitRow {
    PermitRow {
        permits,
        fair,
        op: op("redis", clients, variant, rate, 1000),
    }
}

#[test]
fn permit_cycles_are_set_against_the_lease_cycle_beside_them() {
    let mut r = run();
    r.semaphore = vec![
        permit(16, 1, false, Variant::Ours, 950.0),
        permit(16, 1, false, Variant::Baseline, 1000.0),
        permit(16, 16, false, Variant::Ours, 920.0),
        permit(16, 16, true, Variant::Ours, 300.0),
        permit(16, 16, false, Variant::Baseline, 1000.0),
    ];
    // N = 256 missing, the others ≥ 0.9 (the fair cycle is no goal).
    let v = goals(&r);
    let g = verdict(&v, GOAL_SEMAPHORE);
    assert_eq!(g.met, None);
    assert!(g.measured.contains("N = 1: 0.95 × at 16"), "{}", g.measured);
    assert!(
        g.measured.contains("N = 256 not measured"),
        "{}",
        g.measured
    );
    // N = 256 at 0.5: not met, and explained.
    r.semaphore
        .push(permit(16, 256, false, Variant::Ours, 500.0));
    r.semaphore
        .push(permit(16, 256, false, Variant::Baseline, 1000.0));
    let v = goals(&r);
    assert_eq!(verdict(&v, GOAL_SEMAPHORE).met, Some(false));
    let md = markdown(&r, "run.json", &[]);
    assert!(
        md.contains("## Semaphore: permit acquire → release"),
        "{md}"
    );
    assert!(
        md.contains("| redis | 16 | 16 | fair | 300 | 1,000 | 0.30 |"),
        "{md}"
    );
    assert!(
        md.contains("| redis | 16 | 256 | fail fast | 500 | 1,000 | 0.50 |"),
        "{md}"
    );
    assert!(
        md.contains(&format!("- **redis**: {GOAL_SEMAPHORE}")),
        "{md}"
    );
    assert!(md.contains("`Leases::acquire_any`"), "{md}");
    // All three at ≥ 0.9: met.
    r.semaphore[5].op.ops_per_sec = 900.0;
    assert_eq!(verdict(&goals(&r), GOAL_SEMAPHORE).met, Some(true));
}

#[test]
fn no_semaphore_rows_is_not_measured() {
    let v = goals(&run());
    let g = verdict(&v, GOAL_SEMAPHORE);
    assert_eq!(g.met, None);
    assert!(!markdown(&run(), "run.json", &[]).contains("## Semaphore"));
}
