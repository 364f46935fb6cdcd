//! What a run measures, and for how long: the full plan (for
//! BENCHMARKS.md) and the `--quick` one (CI's smoke run).

use std::time::Duration;

use crate::measure::Timing;
use crate::results::PlanInfo;

/// What a run measures, and for how long.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Slices and their length, for cycle, renew and checkpoint.
    pub timing: Timing,
    /// Concurrent clients of cycle.
    pub cycle_clients: Vec<usize>,
    /// The fixed set of work IDs that cycle also goes over again and again.
    pub cycle_reused_ids: usize,
    /// Concurrent clients of renew and checkpoint.
    pub op_clients: Vec<usize>,
    /// Checkpoint sizes, bytes.
    pub checkpoint_sizes: Vec<usize>,
    /// TTL of the leases of cycle, renew, checkpoint and hand-off (and of
    /// the peers' locks).
    pub ttl: Duration,
    /// Waiters of hand-off.
    pub handoff_waiters: Vec<usize>,
    /// Hand-offs per configuration (at most).
    pub handoffs: usize,
    /// Longest time of one hand-off configuration.
    pub handoff_limit: Duration,
    /// How long a new holder keeps the lease.
    pub handoff_hold: Duration,
    /// Waiters' poll interval.
    pub handoff_poll: Duration,
    /// Failover trials per store.
    pub failover_trials: usize,
    /// Failover lease TTL.
    pub failover_ttl: Duration,
    /// Failover waiter's poll interval.
    pub failover_poll: Duration,
    /// Leases held at once in scale.
    pub scale_sizes: Vec<usize>,
    /// Leases held at once in scale on a register store (S3), whose
    /// renewals are two requests each with no batch: far fewer.
    pub scale_register_sizes: Vec<usize>,
    /// Scale lease TTL.
    pub scale_ttl: Duration,
    /// Scale measuring window.
    pub scale_window: Duration,
    /// Longest time to acquire the leases of scale.
    pub scale_acquire_limit: Duration,
    /// Work IDs per `acquire_many` call in scale (at most).
    pub scale_acquire_batch: usize,
    /// `acquire_many` calls in flight at once in scale.
    pub scale_acquire_in_flight: usize,
    /// Concurrent clients of the semaphore cycle (each with a semaphore
    /// of its own).
    pub semaphore_clients: Vec<usize>,
    /// Permits N of each client's semaphore.
    pub semaphore_permits: Vec<usize>,
    /// The N at which the fair permit cycle is also measured.
    pub semaphore_fair_permits: usize,
    /// Fair waiters of the fair hand-off.
    pub fair_handoff_waiters: Vec<usize>,
    /// Standby candidates of the election hand-overs.
    pub election_candidates: Vec<usize>,
    /// Pool coverage: (work IDs, TTL) of each measurement.
    pub pool_sizes: Vec<(usize, Duration)>,
    /// Pool coverage: `worklease pool` processes sharing the work IDs.
    pub pool_processes: usize,
    /// Pool coverage: how long the children are watched after every
    /// work ID's child started (restarts, lost leases).
    pub pool_window: Duration,
    /// Pool coverage: the longest wait for every child to start (ours or
    /// the baseline's), in rounds (TTL/3).
    pub pool_limit_rounds: u32,
}

impl Plan {
    /// The full plan, or the quick one; `seconds` overrides the time per
    /// figure of cycle, renew, checkpoint and semaphore.
    pub fn new(quick: bool, seconds: Option<f64>) -> Self {
        let mut plan = if quick {
            Plan {
                timing: Timing {
                    slices: 1,
                    slice: Duration::from_millis(100),
                    warm_up: Duration::from_millis(20),
                },
                cycle_clients: vec![1, 4],
                cycle_reused_ids: 16,
                op_clients: vec![1],
                checkpoint_sizes: vec![1024, 64 * 1024],
                ttl: Duration::from_secs(10),
                handoff_waiters: vec![1, 4],
                handoffs: 3,
                handoff_limit: Duration::from_secs(5),
                handoff_hold: Duration::from_millis(10),
                handoff_poll: Duration::from_millis(100),
                failover_trials: 1,
                failover_ttl: Duration::from_secs(1),
                failover_poll: Duration::from_millis(100),
                scale_sizes: vec![200],
                scale_register_sizes: vec![20],
                scale_ttl: Duration::from_secs(3),
                scale_window: Duration::from_secs(1),
                scale_acquire_limit: Duration::from_secs(5),
                scale_acquire_batch: 1000,
                scale_acquire_in_flight: 4,
                semaphore_clients: vec![2],
                semaphore_permits: vec![1, 16, 256],
                semaphore_fair_permits: 16,
                fair_handoff_waiters: vec![1, 4],
                election_candidates: vec![1, 4],
                pool_sizes: vec![(50, Duration::from_secs(3))],
                pool_processes: 3,
                pool_window: Duration::from_secs(1),
                pool_limit_rounds: 15,
            }
        } else {
            Plan {
                timing: Timing {
                    slices: 3,
                    slice: Duration::from_secs(1),
                    warm_up: Duration::from_millis(200),
                },
                cycle_clients: vec![1, 4, 16, 64],
                cycle_reused_ids: 1000,
                op_clients: vec![1, 16],
                checkpoint_sizes: vec![1024, 64 * 1024],
                ttl: Duration::from_secs(10),
                handoff_waiters: vec![1, 16, 64],
                handoffs: 100,
                handoff_limit: Duration::from_secs(20),
                handoff_hold: Duration::from_millis(20),
                handoff_poll: Duration::from_millis(100),
                failover_trials: 5,
                failover_ttl: Duration::from_secs(2),
                failover_poll: Duration::from_millis(250),
                scale_sizes: vec![1_000, 10_000, 100_000],
                scale_register_sizes: vec![1_000],
                scale_ttl: Duration::from_secs(10),
                scale_window: Duration::from_secs(60),
                scale_acquire_limit: Duration::from_secs(60),
                scale_acquire_batch: 1000,
                scale_acquire_in_flight: 4,
                semaphore_clients: vec![1, 16],
                semaphore_permits: vec![1, 16, 256],
                semaphore_fair_permits: 16,
                fair_handoff_waiters: vec![1, 16],
                election_candidates: vec![1, 16],
                pool_sizes: vec![
                    (2_000, Duration::from_secs(5)),
                    (10_000, Duration::from_secs(10)),
                ],
                pool_processes: 3,
                pool_window: Duration::from_secs(60),
                pool_limit_rounds: 30,
            }
        };
        if let Some(s) = seconds.filter(|s| *s > 0.0) {
            plan.timing.slice = Duration::from_secs_f64(s / f64::from(plan.timing.slices));
        }
        plan
    }

    /// The plan as recorded in the run.
    pub fn info(&self) -> PlanInfo {
        PlanInfo {
            seconds_per_figure: self.timing.slice.as_secs_f64() * f64::from(self.timing.slices),
            slices: self.timing.slices,
            ttl_ms: self.ttl.as_millis() as u64,
            cycle_reused_ids: self.cycle_reused_ids,
            handoffs: self.handoffs,
            handoff_hold_ms: self.handoff_hold.as_millis() as u64,
            handoff_poll_ms: self.handoff_poll.as_millis() as u64,
            failover_trials: self.failover_trials,
            scale_window_secs: self.scale_window.as_secs_f64(),
            scale_acquire_limit_secs: self.scale_acquire_limit.as_secs_f64(),
            scale_acquire_batch: self.scale_acquire_batch,
            scale_acquire_in_flight: self.scale_acquire_in_flight,
            pool_processes: self.pool_processes,
            pool_window_secs: self.pool_window.as_secs_f64(),
            pool_limit_rounds: self.pool_limit_rounds,
        }
    }
}
