//! The report's tests: a fixture run of one store and helpers, the
//! report's own tests here and each scenario's in a module of its own.
//! They sit above every module of the report, so that the report's
//! modules never reach up to them.

mod election;
mod fair;
mod pool;
mod semaphore;

use super::format::{count, ms, rate};
use super::goals::goals;
use super::markdown;
use super::verdict::*;
use crate::results::{
    FailoverRow, HandoffMode, HandoffRow, Latency, Machine, OpRow, PlanInfo, Run, ScaleRow,
    StoreInfo, Variant,
};

pub fn op(store: &str, clients: usize, variant: Variant, rate: f64, p99_us: u64) -> OpRow {
    OpRow {
        store: store.into(),
        clients,
        bytes: None,
        variant,
        what: String::new(),
        ops_per_sec: rate,
        cpu_us_per_op: None,
        ops: 1000,
        errors: 0,
        first_error: None,
        latency: Latency {
            p99_us,
            ..Latency::default()
        },
    }
}

pub fn run() -> Run {
    Run {
        format: 1,
        started_unix: 0,
        elapsed_secs: 60.0,
        command: "cargo run --release -p worklease-bench".into(),
        quick: false,
        machine: Machine {
            cores: 2,
            cpu_model: "test".into(),
            memory_gib: 1.0,
            kernel: "6".into(),
            rustc: None,
            load_average_start: Some([0.1, 0.1, 0.1]),
            load_average_end: None,
        },
        plan: PlanInfo {
            seconds_per_figure: 3.0,
            slices: 3,
            ttl_ms: 10_000,
            cycle_reused_ids: 1000,
            handoffs: 100,
            handoff_hold_ms: 20,
            handoff_poll_ms: 100,
            failover_trials: 1,
            scale_window_secs: 20.0,
            scale_acquire_limit_secs: 60.0,
            scale_acquire_batch: 1000,
            scale_acquire_in_flight: 4,
            pool_processes: 3,
            pool_window_secs: 60.0,
            pool_limit_rounds: 30,
        },
        stores: vec![StoreInfo {
            name: "redis".into(),
            url: "redis://127.0.0.1:6379/0".into(),
            server: None,
            baseline: "cas".into(),
            peer: Some("redlock".into()),
            register: false,
        }],
        skipped: Vec::new(),
        cycle: vec![
            op("redis", 16, Variant::Ours, 950.0, 1100),
            op("redis", 16, Variant::Baseline, 1000.0, 1000),
            op("redis", 16, Variant::Peer, 900.0, 900),
            op("redis", 1, Variant::Ours, 100.0, 100),
            op("redis", 1, Variant::Peer, 200.0, 100),
        ],
        cycle_reused: Vec::new(),
        renew: Vec::new(),
        checkpoint: Vec::new(),
        handoff: Vec::new(),
        failover: vec![FailoverRow {
            store: "redis".into(),
            how: "SIGKILL".into(),
            ttl_ms: 2000,
            poll_ms: 250,
            bound_ms: 2300,
            trials_ms: vec![1900.0, 2400.0],
            errors: 0,
            first_error: None,
        }],
        scale: Vec::new(),
        semaphore: Vec::new(),
        fair_handoff: Vec::new(),
        election: Vec::new(),
        pool: Vec::new(),
    }
}

pub fn verdict<'a>(v: &'a [Verdict], goal: &str) -> &'a Verdict {
    v.iter()
        .find(|v| v.goal == goal)
        .expect("a verdict for the goal")
}

#[test]
fn goals_are_judged_from_the_figures() {
    let v = goals(&run());
    // 950 / 1000 = 0.95 ≥ 0.9; p99 1100 / 1000 = 1.1 ≤ 1.2.
    assert_eq!(verdict(&v, GOAL_CYCLE).met, Some(true));
    assert_eq!(verdict(&v, GOAL_P99).met, Some(true));
    // Faster than the peer at 16 clients, slower at 1: not met.
    assert_eq!(verdict(&v, GOAL_PEER).met, Some(false));
    // One trial of 2400 ms against a bound of 2300 ms.
    assert_eq!(verdict(&v, GOAL_FAILOVER).met, Some(false));
    // No 100,000-lease row: not measured, neither met nor unmet.
    assert_eq!(verdict(&v, GOAL_SCALE).met, None);
}

#[test]
fn the_report_explains_every_unmet_goal() {
    let md = markdown(&run(), "run.json", &[]);
    assert!(md.contains("### What stands in the way"));
    assert!(md.contains(&format!("- **redis**: {GOAL_PEER}")));
    assert!(md.contains(GOAL_FAILOVER));
    assert!(md.contains("`cargo run --release -p worklease-bench`"));
}

pub fn handoff(waiters: usize, mode: HandoffMode, across: bool, p50_us: u64) -> HandoffRow {
    HandoffRow {
        store: "sqlite".into(),
        waiters,
        mode,
        what: String::new(),
        notified: mode == HandoffMode::Push,
        across_processes: across,
        round_trip_us: 500,
        errors: 0,
        first_error: None,
        latency: Latency {
            p50_us,
            count: 100,
            ..Latency::default()
        },
    }
}

#[test]
fn handoffs_across_processes_are_shown_and_judged_apart() {
    let mut r = run();
    r.stores[0].name = "sqlite".into();
    r.handoff = vec![
        handoff(1, HandoffMode::Push, false, 900),
        handoff(1, HandoffMode::Poll, false, 50_000),
        handoff(1, HandoffMode::Push, true, 3_000),
        handoff(1, HandoffMode::Poll, true, 60_000),
    ];
    let v = goals(&r);
    let handoffs: Vec<&Verdict> = v.iter().filter(|v| v.goal == GOAL_HANDOFF).collect();
    assert_eq!(handoffs.len(), 2, "one verdict per place of the waiters");
    // 900 µs against 2 × 500: met in one process.
    assert_eq!(
        (handoffs[0].store.as_str(), handoffs[0].met),
        ("sqlite", Some(true))
    );
    // 3 ms across processes: 6 round trips, not met, and explained.
    let across = format!("sqlite{ACROSS_PROCESSES}");
    assert_eq!(
        (handoffs[1].store.as_str(), handoffs[1].met),
        (across.as_str(), Some(false))
    );
    assert!(
        handoffs[1].measured.contains("6.0 round trips"),
        "{}",
        handoffs[1].measured
    );
    let md = markdown(&r, "run.json", &[]);
    assert!(
        md.contains("| sqlite | 1 | other processes | push | 3.00 |"),
        "{md}"
    );
    assert!(
        md.contains("| sqlite | 1 | this process | poll | 50.0 |"),
        "{md}"
    );
    assert!(
        md.contains(&format!("- **{across}**: {GOAL_HANDOFF}")),
        "{md}"
    );
    assert!(md.contains("through the database file"), "{md}");
}

/// A scale row of `store` at `leases`, all acquired, renewed every
/// 3.333 s over a window of 6 ticks, each lease on schedule.
fn scale(store: &str, leases: usize, calls: u64, cpu_per_sec: f64) -> ScaleRow {
    ScaleRow {
        store: store.into(),
        leases,
        acquired: leases,
        ttl_ms: 10_000,
        renew_interval_ms: 3_333,
        acquire_secs: 1.0,
        window_secs: 20.0,
        cpu_per_sec,
        rss_per_lease_bytes: 1500.0,
        renewals_due: leases as u64 * 6,
        renewals_ok: leases as u64 * 6,
        renewal_failures: 0,
        missed: 0,
        min_left_ms: Some(5000.0),
        max_batch: Some(256),
        ticks: Some(6),
        renew_calls: Some(calls),
        renew_call_secs: Some(calls as f64 * 0.002),
        register_requests_per_sec: None,
    }
}

#[test]
fn scale_goals_count_calls_cpu_and_memory() {
    let mut r = run();
    // 100,000 / 256 → at least 391 calls a tick: 2,346 in 6 ticks is 391.
    r.scale = vec![
        scale("redis", 10_000, 6 * 40, 0.03),
        scale("redis", 100_000, 6 * 391, 0.3),
    ];
    let v = goals(&r);
    assert_eq!(verdict(&v, GOAL_SCALE).met, Some(true));
    assert_eq!(verdict(&v, GOAL_CALLS).met, Some(true));
    assert!(verdict(&v, GOAL_CALLS)
        .measured
        .contains("100,000: 391.0 per tick for 100,000 due (bound 391)"));
    // 0.3 CPU s/s × 20 s / 600,000 renewals = 10 µs.
    assert_eq!(verdict(&v, GOAL_CPU).met, Some(false));
    assert!(verdict(&v, GOAL_CPU).measured.starts_with("10.0 µs"));
    assert_eq!(verdict(&v, GOAL_RSS).met, Some(true));
    // One call more than the bound at 10,000.
    r.scale[0].renew_calls = Some(6 * 40 + 1);
    let v = goals(&r);
    assert_eq!(verdict(&v, GOAL_CALLS).met, Some(false));
    let md = markdown(&r, "run.json", &[]);
    assert!(md.contains("### Store calls and cost per renewal"));
    assert!(md.contains("partial batches"));
    assert!(md.contains("µs of CPU per renewal"));
    // Leases lost: CPU and memory per lease are no figures at 100,000.
    r.scale[1].missed = 10;
    let v = goals(&r);
    assert_eq!(verdict(&v, GOAL_SCALE).met, Some(false));
    assert_eq!(verdict(&v, GOAL_CPU).met, None);
    assert_eq!(verdict(&v, GOAL_RSS).met, None);
    assert!(verdict(&v, GOAL_RSS)
        .measured
        .contains("no figure at 100,000"));
}

#[test]
fn a_register_store_states_its_ceiling_at_1000_leases() {
    let mut r = run();
    r.stores[0].name = "s3".into();
    r.stores[0].register = true;
    let mut s = scale("s3", 1_000, 6 * 63, 0.1);
    s.max_batch = Some(16);
    s.missed = 12;
    s.register_requests_per_sec = Some(550.0);
    r.scale = vec![s];
    let v = goals(&r);
    // 550 requests/s × 3.333 s / 2 = 916 leases.
    let g = verdict(&v, GOAL_SCALE_REGISTER);
    assert_eq!(g.met, Some(false));
    assert!(g.measured.contains("ceiling 916 leases"), "{}", g.measured);
    // A register store is not held to the 100,000-lease goals.
    assert!(v.iter().all(|v| v.goal != GOAL_SCALE && v.goal != GOAL_CPU));
    let md = markdown(&r, "run.json", &[]);
    assert!(md.contains("= 916 leases renewed every 3.33 s"));
    assert!(md.contains("Sizes: a register store (s3)"));
}

#[test]
fn the_etcd_cycle_is_set_against_two_transactions() {
    let mut r = run();
    r.stores[0].name = "etcd".into();
    r.cycle = vec![
        op("etcd", 16, Variant::Ours, 1800.0, 1000),
        op("etcd", 16, Variant::Baseline, 3500.0, 1000),
    ];
    r.cycle_reused = vec![
        op("etcd", 16, Variant::Ours, 3200.0, 1000),
        op("etcd", 16, Variant::Baseline, 3500.0, 1000),
    ];
    let v = goals(&r);
    let etcd: Vec<&Verdict> = v.iter().filter(|v| v.goal == GOAL_ETCD).collect();
    assert_eq!(etcd.len(), 2);
    assert_eq!(etcd[0].met, Some(false));
    assert!(etcd[0]
        .measured
        .starts_with("fresh IDs, 16 clients: 0.51 ×"));
    assert_eq!(etcd[1].met, Some(true));
    let md = markdown(&r, "run.json", &[]);
    assert!(md.contains("## Cycle (reused IDs)"));
    assert!(md.contains("an acquisition is one transaction"));
}

#[test]
fn figures_are_formatted_for_reading() {
    assert_eq!(rate(1_234_567.4), "1,234,567");
    assert_eq!(rate(999.0), "999");
    assert_eq!(rate(2.25), "2.2");
    assert_eq!(count(0), "0");
    assert_eq!(count(100_000), "100,000");
    assert_eq!(ms(150), "0.150");
    assert_eq!(ms(5_250), "5.25");
    assert_eq!(ms(63_135), "63.1");
    assert_eq!(ms(6_705_000), "6705");
}
