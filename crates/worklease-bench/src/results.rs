//! The JSON of one run (`run.json`): everything BENCHMARKS.md and the plots
//! are made from. Latencies are in microseconds, rates per second.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// One run of the program.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    /// The format of this file.
    pub format: u32,
    /// When the run started (seconds since the Unix epoch).
    pub started_unix: u64,
    /// How long it took, in seconds.
    pub elapsed_secs: f64,
    /// The command that made it (store URLs without passwords).
    pub command: String,
    /// `--quick`: a smoke run whose figures mean little.
    pub quick: bool,
    /// The machine.
    pub machine: Machine,
    /// The settings of each scenario.
    pub plan: PlanInfo,
    /// The stores measured.
    pub stores: Vec<StoreInfo>,
    /// Stores or scenarios left out, and why.
    pub skipped: Vec<Skipped>,
    /// acquire → release of distinct work IDs.
    pub cycle: Vec<OpRow>,
    /// acquire → release over a fixed set of work IDs, acquired again and
    /// again.
    #[serde(default)]
    pub cycle_reused: Vec<OpRow>,
    /// renew of held leases.
    pub renew: Vec<OpRow>,
    /// checkpoint of held leases.
    pub checkpoint: Vec<OpRow>,
    /// hand-off from a releasing holder to one of N waiters.
    pub handoff: Vec<HandoffRow>,
    /// a SIGKILLed holder's lease taken by a waiter.
    pub failover: Vec<FailoverRow>,
    /// one process holding and renewing many leases.
    pub scale: Vec<ScaleRow>,
    /// permit acquire → release beside the lease cycle over reused work
    /// IDs.
    #[serde(default)]
    pub semaphore: Vec<PermitRow>,
    /// hand-off to the next fair waiter, beside the unfair push hand-off
    /// to one waiter.
    #[serde(default)]
    pub fair_handoff: Vec<FairHandoffRow>,
    /// election hand-overs after a resign or a step-down request, and an
    /// observer's view of them, beside the unfair push hand-off to one
    /// waiter.
    #[serde(default)]
    pub election: Vec<ElectionRow>,
    /// `worklease pool` processes covering N work IDs, beside this program
    /// spawning the same children.
    #[serde(default)]
    pub pool: Vec<PoolRow>,
}

/// The machine a run was made on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    /// Logical cores.
    pub cores: usize,
    /// CPU model name.
    pub cpu_model: String,
    /// Memory, GiB.
    pub memory_gib: f64,
    /// Kernel release.
    pub kernel: String,
    /// `rustc --version`, where rustc is on the PATH.
    pub rustc: Option<String>,
    /// Load averages (1, 5, 15 min) when the run started.
    pub load_average_start: Option<[f64; 3]>,
    /// Load averages when it ended.
    pub load_average_end: Option<[f64; 3]>,
}

/// The settings of a run's scenarios.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlanInfo {
    /// Measurement time of each figure (all its slices), seconds.
    pub seconds_per_figure: f64,
    /// Slices each figure is measured in, alternating with its baseline and
    /// peer.
    pub slices: u32,
    /// TTL of the leases in cycle, renew, checkpoint and hand-off, ms.
    pub ttl_ms: u64,
    /// Cycle over reused work IDs: the fixed set's size.
    #[serde(default)]
    pub cycle_reused_ids: usize,
    /// Hand-offs measured per configuration (at most).
    pub handoffs: usize,
    /// Time a new holder keeps the lease before it releases, ms.
    pub handoff_hold_ms: u64,
    /// Poll interval of waiting acquisitions in hand-off, ms.
    pub handoff_poll_ms: u64,
    /// Failover: trials per store.
    pub failover_trials: usize,
    /// Scale: renewal window, seconds.
    pub scale_window_secs: f64,
    /// Scale: longest time to acquire the leases, seconds.
    pub scale_acquire_limit_secs: f64,
    /// Scale: work IDs per `acquire_many` call (at most).
    #[serde(default)]
    pub scale_acquire_batch: usize,
    /// Scale: `acquire_many` calls in flight at once.
    #[serde(default)]
    pub scale_acquire_in_flight: usize,
    /// Pool coverage: `worklease pool` processes.
    #[serde(default)]
    pub pool_processes: usize,
    /// Pool coverage: the window watched after every child started, s.
    #[serde(default)]
    pub pool_window_secs: f64,
    /// Pool coverage: the longest wait for every child to start, in
    /// rounds.
    #[serde(default)]
    pub pool_limit_rounds: u32,
}

/// A store as measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoreInfo {
    /// `memory`, `sqlite`, `postgres`, `redis`, ...
    pub name: String,
    /// Where (URL without password).
    pub url: String,
    /// The server's version, where there is a server.
    pub server: Option<String>,
    /// What the baseline does.
    pub baseline: String,
    /// What the peer lock is, if one runs here.
    pub peer: Option<String>,
    /// A register store (no clock of its own,
    /// `ExpiryClock::Observation`, such as S3): every operation is a read
    /// and a conditional write, two requests.
    #[serde(default)]
    pub register: bool,
}

/// Something left out of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Skipped {
    /// The store.
    pub store: String,
    /// The scenario, or `None` for the whole store.
    pub scenario: Option<String>,
    /// Why.
    pub reason: String,
}

/// A latency distribution.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Latency {
    /// Samples.
    pub count: u64,
    /// Mean, µs.
    pub mean_us: f64,
    /// Median, µs.
    pub p50_us: u64,
    /// 90th percentile, µs.
    pub p90_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// 99.9th percentile, µs.
    pub p999_us: u64,
    /// Largest, µs.
    pub max_us: u64,
    /// (percentile, µs) points of the distribution, for plots.
    pub curve: Vec<(f64, u64)>,
}

/// The percentiles kept in [`Latency::curve`].
const CURVE: &[f64] = &[
    0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.99, 100.0,
];

impl Latency {
    /// The distribution of a histogram of microseconds.
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let q = |p: f64| h.value_at_quantile(p / 100.0);
        Self {
            count: h.len(),
            mean_us: h.mean(),
            p50_us: q(50.0),
            p90_us: q(90.0),
            p99_us: q(99.0),
            p999_us: q(99.9),
            max_us: h.max(),
            curve: CURVE.iter().map(|&p| (p, q(p))).collect(),
        }
    }
}

/// Who an operation row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// worklease.
    Ours,
    /// The store's minimal compare-and-set round trip(s).
    Baseline,
    /// The lock users already have on that server.
    Peer,
}

impl Variant {
    /// `ours`, `baseline` or `peer`.
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Ours => "ours",
            Variant::Baseline => "baseline",
            Variant::Peer => "peer",
        }
    }
}

/// One figure of cycle, renew or checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OpRow {
    /// The store.
    pub store: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Checkpoint size in bytes (checkpoint only).
    pub bytes: Option<usize>,
    /// Ours, the baseline or the peer.
    pub variant: Variant,
    /// What one operation is, in this variant.
    pub what: String,
    /// Operations per second over all clients.
    pub ops_per_sec: f64,
    /// CPU time of this process per operation, µs (the slices' CPU time
    /// less the warm-ups' share in proportion to their time). For a store
    /// with a server, the client's side only.
    #[serde(default)]
    pub cpu_us_per_op: Option<f64>,
    /// Operations timed.
    pub ops: u64,
    /// Operations that failed (not timed).
    pub errors: u64,
    /// The first failure, if any.
    pub first_error: Option<String>,
    /// Latency of one operation.
    pub latency: Latency,
}

/// How waiters learn of a release, in a hand-off row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HandoffMode {
    /// Ours, woken by the store's notification.
    Push,
    /// Ours, polling only (the store's notifications hidden).
    Poll,
    /// The peer lock's own way of waiting.
    Peer,
}

impl HandoffMode {
    /// `push`, `poll` or `peer`.
    pub fn as_str(self) -> &'static str {
        match self {
            HandoffMode::Push => "push",
            HandoffMode::Poll => "poll",
            HandoffMode::Peer => "peer",
        }
    }
}

/// Hand-offs with N waiters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandoffRow {
    /// The store.
    pub store: String,
    /// Waiters besides the holder.
    pub waiters: usize,
    /// Push, poll or the peer.
    pub mode: HandoffMode,
    /// How the waiters wait.
    pub what: String,
    /// Whether the store woke the waiters by a notification (false for a
    /// store without notifications, whose "push" waiters poll).
    #[serde(default)]
    pub notified: bool,
    /// Every participant ran in a process of its own, with its own store
    /// value (the `handoff-participant` subcommand): a release reaches the
    /// waiters only across processes. False (and absent from runs before
    /// these rows): all participants share one store value in this
    /// process.
    #[serde(default)]
    pub across_processes: bool,
    /// One store round trip (the baseline's median at 1 client), µs.
    pub round_trip_us: u64,
    /// Failed acquisitions or releases.
    pub errors: u64,
    /// The first failure, if any.
    pub first_error: Option<String>,
    /// From the start of the release to the next holder's acquire returning.
    pub latency: Latency,
}

/// Failover trials on one store.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FailoverRow {
    /// The store.
    pub store: String,
    /// How the holder dies.
    pub how: String,
    /// The lease TTL, ms.
    pub ttl_ms: u64,
    /// The waiter's poll interval, ms.
    pub poll_ms: u64,
    /// The goal: TTL + poll interval + 50 ms.
    pub bound_ms: u64,
    /// From the kill to the waiter's acquire returning, ms, per trial.
    pub trials_ms: Vec<f64>,
    /// Trials that failed, and the first failure.
    pub errors: u64,
    /// The first failure, if any.
    pub first_error: Option<String>,
}

/// One process holding and renewing many leases.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScaleRow {
    /// The store.
    pub store: String,
    /// Leases asked for.
    pub leases: usize,
    /// Leases acquired (fewer when acquiring hit the time limit).
    pub acquired: usize,
    /// The lease TTL, ms.
    pub ttl_ms: u64,
    /// The background renewal interval, ms.
    pub renew_interval_ms: u64,
    /// Time to acquire them (each renewed from its acquisition on), s.
    pub acquire_secs: f64,
    /// The measured window after acquiring, s.
    pub window_secs: f64,
    /// CPU seconds (user + system) of this process per second, in the
    /// window.
    pub cpu_per_sec: f64,
    /// Resident memory growth from before acquiring to the end of the
    /// window, per acquired lease, bytes.
    pub rss_per_lease_bytes: f64,
    /// Renewals the window asks for: acquired × window / interval (the
    /// window is whole intervals, and each lease sends a renewal every
    /// interval after the previous one's send).
    pub renewals_due: u64,
    /// Renewals sent in the window that succeeded (fewer than due: the
    /// renewals fell behind their schedule).
    pub renewals_ok: u64,
    /// Renewal attempts sent in the window that failed (retried while the
    /// lease could be saved).
    pub renewal_failures: u64,
    /// Renewals missed: leases whose renewal did not succeed before the
    /// holder's deadline, so the lease was lost (from the first acquisition
    /// to the end of the window).
    pub missed: u64,
    /// The least lease time left when a renewal came back, ms (how close
    /// the closest call came).
    pub min_left_ms: Option<f64>,
    /// The store's batch size (`LeaseStore::max_batch`).
    #[serde(default)]
    pub max_batch: Option<usize>,
    /// Renewal ticks in the window: window / interval.
    #[serde(default)]
    pub ticks: Option<u64>,
    /// Batch renewal store calls (`renew_many`) that ended in the window.
    #[serde(default)]
    pub renew_calls: Option<u64>,
    /// Their durations added up, seconds.
    #[serde(default)]
    pub renew_call_secs: Option<f64>,
    /// Register stores: the server's conditional writes per second at
    /// `max_batch` clients (the baseline's), measured just before the
    /// scale process ran.
    #[serde(default)]
    pub register_requests_per_sec: Option<f64>,
}

impl ScaleRow {
    /// Requests of one renewal on a register store: a read and a
    /// conditional write.
    pub const REGISTER_REQUESTS_PER_RENEWAL: f64 = 2.0;

    /// Batch renewal store calls per renewal tick, in the window.
    pub fn calls_per_tick(&self) -> Option<f64> {
        Some(self.renew_calls? as f64 / self.ticks?.max(1) as f64)
    }

    /// Leases due per renewal tick: the renewal attempts sent in the window
    /// per tick (the acquired leases, while their renewals keep their
    /// schedule; fewer once renewals fall behind or leases are lost).
    pub fn due_per_tick(&self) -> Option<f64> {
        Some((self.renewals_ok + self.renewal_failures) as f64 / self.ticks?.max(1) as f64)
    }

    /// The fewest store calls a tick can take: ceil(leases due per tick /
    /// batch size).
    pub fn calls_bound(&self) -> Option<u64> {
        Some((self.due_per_tick()? / self.max_batch?.max(1) as f64).ceil() as u64)
    }

    /// CPU time of the process per renewal done in the window, µs.
    pub fn cpu_us_per_renewal(&self) -> Option<f64> {
        (self.renewals_ok > 0)
            .then(|| self.cpu_per_sec * self.window_secs * 1e6 / self.renewals_ok as f64)
    }

    /// Register stores: the leases one process can keep renewed at the
    /// measured request rate: requests/s × interval / requests per renewal.
    pub fn register_ceiling(&self) -> Option<f64> {
        Some(
            self.register_requests_per_sec? * self.renew_interval_ms as f64
                / 1000.0
                / Self::REGISTER_REQUESTS_PER_RENEWAL,
        )
    }
}

/// One figure of the semaphore scenario: a permit cycle (ours) or the
/// lease cycle over reused work IDs measured beside it (the baseline).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PermitRow {
    /// Permits N of each client's semaphore (for the baseline: of the
    /// permit cycles it was measured beside).
    pub permits: usize,
    /// A fair acquisition (`AcquireOptions::fair()`).
    pub fair: bool,
    /// The figure; `variant` is ours for a permit cycle, baseline for the
    /// lease cycle.
    #[serde(flatten)]
    pub op: OpRow,
}

/// One row of the fair hand-off scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FairHandoffRow {
    /// Fair waiters (`AcquireOptions::fair()`). False: the unfair push
    /// hand-off to one waiter measured beside them, the release's round
    /// trip, one notification and the acquisition's round trip: the
    /// goal's bound.
    pub fair: bool,
    /// The hand-offs.
    #[serde(flatten)]
    pub handoff: HandoffRow,
}

/// How an election's leader gave up, in the election scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HandOver {
    /// Not an election: the unfair push hand-off to one waiter, the
    /// goals' bound (2 round trips + one notification).
    Bound,
    /// `Leadership::resign`.
    Resign,
    /// `election::request_step_down` from another task.
    StepDown,
}

impl HandOver {
    /// Its name in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            HandOver::Bound => "bound",
            HandOver::Resign => "resign",
            HandOver::StepDown => "step-down",
        }
    }
}

/// One row of the election scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ElectionRow {
    /// How the leader gave up (or the bound).
    pub how: HandOver,
    /// The hand-overs: `waiters` are the standby candidates; the latency
    /// is from the leader giving up (resign called, or its lost signal
    /// fired on a step-down request) to the next leader's function
    /// starting.
    #[serde(flatten)]
    pub handoff: HandoffRow,
    /// An observer's delay: from each term's start to its first report of
    /// it (0 when it reported the term first). `None` for the bound.
    pub observed: Option<Latency>,
    /// Terms the observer never reported (ended before it read them; a
    /// first leader of a free election is seen at the next poll, as no
    /// store notifies an acquisition). Terms after the last hand-over are
    /// not counted.
    pub observed_missed: u64,
    /// Step-down: from the request's start to the leader's lost signal.
    pub seen: Option<Latency>,
}

/// `worklease pool` processes covering N work IDs, and this program
/// spawning the same N children (the baseline: the machine's spawn
/// floor).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolRow {
    /// The store (SQLite).
    pub store: String,
    /// Work IDs, one child each.
    pub work_ids: usize,
    /// `worklease pool` processes sharing them.
    pub processes: usize,
    /// The lease TTL, ms.
    pub ttl_ms: u64,
    /// A round: TTL/3 (the pools' renewal and rebalancing interval), ms.
    pub round_ms: u64,
    /// The longest wait for every child to start, s.
    pub limit_secs: f64,
    /// From starting the pools to every work ID's child having started,
    /// s; `None` when not all started within the limit.
    pub coverage_secs: Option<f64>,
    /// Work IDs whose child started (by the end of the window).
    pub started: usize,
    /// Work IDs whose child started more than once.
    pub restarts: usize,
    /// Warnings and errors the pools logged (lost leases, failed
    /// renewals or rounds, ...).
    pub warnings: usize,
    /// Of them, those that say a lease was lost.
    pub lost_leases: usize,
    /// Pools that exited before they were killed.
    pub pools_exited: usize,
    /// The window watched after coverage, s.
    pub window_secs: f64,
    /// The baseline: from the first spawn to every child having started,
    /// s; `None` when not all started within the limit.
    pub baseline_secs: Option<f64>,
    /// The baseline's children that started.
    pub baseline_started: usize,
    /// Processes of this scenario still there after the cleanup (killed
    /// then): should be none.
    pub leftover: usize,
    /// What went wrong, if anything.
    pub first_error: Option<String>,
}

impl PoolRow {
    /// A round, s.
    pub fn round_secs(&self) -> f64 {
        self.round_ms.max(1) as f64 / 1000.0
    }

    /// Ours in rounds.
    pub fn coverage_rounds(&self) -> Option<f64> {
        Some(self.coverage_secs? / self.round_secs())
    }

    /// The baseline in rounds.
    pub fn baseline_rounds(&self) -> Option<f64> {
        Some(self.baseline_secs? / self.round_secs())
    }

    /// Ours / the baseline, by time.
    pub fn ratio(&self) -> Option<f64> {
        Some(self.coverage_secs? / self.baseline_secs?.max(1e-6))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_percentiles_come_from_the_histogram() {
        let mut h = crate::measure::histogram();
        for us in 1..=1000u64 {
            h.record(us).expect("in range");
        }
        let l = Latency::of(&h);
        assert_eq!(l.count, 1000);
        assert_eq!(l.p50_us, 500);
        assert_eq!(l.p99_us, 990);
        assert_eq!(l.max_us, 1000);
        assert_eq!(l.curve.first(), Some(&(0.0, 1)));
        assert_eq!(l.curve.last(), Some(&(100.0, 1000)));
    }

    #[test]
    fn an_empty_histogram_is_no_latency() {
        let l = Latency::of(&crate::measure::histogram());
        assert_eq!(l.count, 0);
        assert!(l.curve.is_empty());
    }
}
