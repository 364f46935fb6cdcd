//! Deterministic simulation of the lease contract under faults (feature
//! `testkit`): many holders against one store, through fault-injecting
//! links, on a paused tokio clock and one seed, with a history checker for
//! S1–S5 of the crate docs.
//!
//! This is test support: the runner builds its own runtime and the checker
//! panics on nothing, but the harness does `expect` on impossible setup
//! failures (building a runtime, opening a store) and reports violations as
//! data for the caller to assert on.
//!
//! # A run
//!
//! [`run`] builds a current-thread tokio runtime with a paused clock
//! (`start_paused`), so simulated time jumps from timer to timer and a run
//! of 30 s of simulated time takes milliseconds. From the seed, one
//! [`rand::rngs::StdRng`] draws the scenario (number of holders and work
//! IDs, each holder's clock drift, the store's outage schedule) and then
//! hands each actor its own stream, forked in a fixed order: a behaviour
//! stream per holder, a fault stream and a wall-clock stream per link, a
//! fault stream per register adapter. Forked streams keep a seed's
//! decisions independent of the order in which concurrent actors happen to
//! draw, and let a test turn one fault kind off without shifting the
//! others (see `wall_clock_steps_change_nothing` in the tests).
//!
//! Each holder is a task with its own holder ID `h<i>` and [`crate::Leases`]
//! handle, whose store is a fault-injecting *link* to the shared store (a
//! decorator: a store that wraps a store). It loops: acquire a random work
//! ID (on `Held`, sleep a random time or, as an aggressive contender,
//! exactly until the expiry the store reported); read the checkpoint; then
//! either renew and checkpoint by hand, trusting each reply's token, or
//! renew in the background ([`crate::Leases::start_renewal`]) and
//! checkpoint only after [`crate::Renewal::ensure_live`]; between steps it
//! works for up to 0.45 TTL or freezes; at the end it releases or crashes
//! (abandons the lease).
//!
//! The stores ([`Backend`]): the in-memory store; the register adapter
//! ([`crate::store::register::RegisterStore`]) over one shared
//! [`crate::store::register::MemoryRegister`], with several adapter
//! instances (processes), holders spread over them, and register-level
//! faults underneath; and the SQLite store (several `SqliteStore` values,
//! i.e. processes, on one file, judging expiry by one shared
//! [`crate::store::sqlite::TokioClock`]).
//!
//! # Faults and what they model
//!
//! Each link draws, per call, from its own stream ([`FaultConfig`]):
//!
//! * **delay before** the store applies a call (a slow network or queue;
//!   sometimes longer than the TTL: a request that arrives after its sender
//!   gave up on it);
//! * **delay after** the store applied it (a slow reply);
//! * **error before** applying (connection reset before the request left);
//! * **reply lost after applying**: the store applied the call, the caller
//!   sees a store error at its reply timeout (the ambiguous outcome every
//!   network client faces);
//! * **store unreachable** for intervals drawn per run: every call sent
//!   then fails without reaching the store;
//! * **holder frozen** (GC pause, SIGSTOP, VM migration): the holder's task
//!   sleeps without touching its lease, and its link neither sends a
//!   request nor delivers a reply until the freeze ends, so its background
//!   renewal is frozen too. A freeze longer than the TTL must end with the
//!   lease lost: the next call with the old token must fail (checked as
//!   S3, "expired"), and the holder's belief ends at its deadline
//!   regardless (S1);
//! * **clock drift** per holder, see "Clocks" below;
//! * **wall-clock steps**, see "Clocks" below;
//! * for the register adapter, **register faults** underneath it: delayed
//!   reads and writes (so that adapters interleave between read and
//!   compare-and-swap), writes that fail before taking effect, and writes
//!   whose reply is lost after they took effect.
//!
//! Once sent, a request is in the network: it runs in a task of its own
//! and reaches the store whatever its caller does, as a request on a
//! socket does. A caller that stops waiting (background renewal at its
//! deadline) only stops waiting for the reply. Calls to the SQLite store
//! are applied with the simulated world stopped: the runtime's one thread
//! waits for the store's blocking thread, so no other task runs and no time
//! passes meanwhile (as with the memory store, whose calls never yield).
//! Otherwise the instant at which such a call's completion is noticed,
//! among the tasks of the same simulated instant, would depend on the
//! host's thread timing.
//!
//! # Clocks
//!
//! All tasks share tokio's clock, the store's clock included (the memory
//! store and the register adapter read tokio's `Instant`; the SQLite store
//! a [`crate::store::sqlite::TokioClock`]). The library computes a
//! holder's deadline on that clock too (send time + TTL − margin). So a
//! drifting holder clock cannot be injected into the library; what is
//! modelled is what drift changes for safety:
//!
//! * a holder whose clock runs at `1 + rho` times real time
//!   (`|rho| <= max_drift`, drawn per holder) believes in a token until its
//!   own clock has measured TTL − margin since the send, that is until
//!   `send + (TTL − margin) / (1 + rho)` of real time. The checker's belief
//!   intervals end there, so a slow clock (`rho < 0`) stretches them;
//! * all of that holder's own waits (work, back-off, waiting for an
//!   announced expiry) are scaled by `1 / (1 + rho)`.
//!
//! The store expires a lease no earlier than `send + TTL` (it applies the
//! call after it was sent, and adds the TTL on its own clock). So S1 holds
//! while `(TTL − margin) / (1 − max_drift) <= TTL`, i.e. `max_drift <=
//! margin / TTL` (default: drift 5%, margin 10%). Beyond that bound the
//! checker must find S1 violations, and the tests show it does. Not
//! modelled: drift of the store's clock against the holders' (equivalent to
//! the above for one holder), and drift of a register adapter's clock, with
//! which a contender measures its observation (with `rho_h` for the holder
//! and `rho_c` for the contender the bound becomes roughly `rho_h + rho_c
//! <= margin / TTL`).
//!
//! Wall clock: the library decides nothing by the wall clock (it judges
//! expiry by monotonic clocks only; `Token::expires_at`, a grant's
//! `expires_at` and the register's `written_at_ms` are informational).
//! The one wall-clock value a store hands the lease layer is the expiry in
//! its replies, so that is what the links step, forward and back by up to
//! `wall_step_max`, from a stream of their own. A test runs seeds with and
//! without steps and asserts identical histories. The stores' own
//! `SystemTime::now()` calls cannot be stepped from here; they only produce
//! those informational values.
//!
//! # Determinism
//!
//! A seed replays the same run: the same calls, answers, times and
//! beliefs, compared by [`Report::fingerprint`] (tested). What makes it so:
//! one current-thread runtime (tasks run in a fixed order), the paused
//! clock, the forked seeded streams, `biased` selects in the harness,
//! background renewal without jitter (the library draws jitter from the
//! thread's RNG, which no seed controls), no waiting acquisitions (same
//! reason), SQLite calls applied with the world stopped, and a holder
//! that lets its background renewal take every event of an instant before
//! it stops it (see below). What is not under the
//! seed's control: tokio's own RNG, which picks the first branch an
//! unbiased `select!` in the library polls; it is seeded only through the
//! `rng_seed` builder option, which needs `--cfg tokio_unstable`. It
//! matters when two branches of one library `select!` are ready in the
//! same poll: the renewal task's selects all race its work against its
//! stop signal, so a holder that stopped a renewal in the same poll as a
//! renewal reply arrived made the run diverge (seen: about one seed in
//! forty). Holders therefore yield until the run queue has drained before
//! they stop or drop a renewal, and the library's other unbiased selects
//! (waiting acquisitions, elections) are not used.
//!
//! # The history and the checker
//!
//! The links record every call: invocation, the store call's start and end
//! with the store's own answer (granted token and hand-off, checkpoint
//! read), what reached the caller (reply, lost reply, refusal, abandoned)
//! and when, and the faults injected into it. Holders record their
//! beliefs: from the moment they learn a token (an acquisition's or
//! renewal's reply, a token handed over by background renewal) to the
//! instant their own clock reaches its deadline, cut short when they send a
//! release or notice a loss. Every event carries a global sequence number,
//! which orders events of one simulated instant.
//!
//! The checker ([`Violation::code`] names each check):
//!
//! * **S1** `s1-overlap`: two beliefs in different tokens of one work ID
//!   overlap in simulated time.
//! * **S2** `s2-duplicate`, `s2-order`, `s2-handoff-order`: a token granted
//!   twice; a grant whose token does not exceed one granted (store call
//!   ended) before this grant's store call started; a token not above its
//!   hand-off's previous token.
//! * **S3** `s3-stale-token`: a renew, checkpoint, read or release accepted
//!   after a later token was granted; `s3-expired`: one accepted more than
//!   a TTL (plus the store clock's rounding) after the end of the lease's
//!   last extension, when no extension of unknown outcome could have kept
//!   it alive (this is also where a holder frozen past its TTL must find
//!   its lease lost); `s3-refused-changed-state`: a read returns the data
//!   of a checkpoint the store refused (or never received).
//! * **S4** `s4-missing`: a read returns no checkpoint although one was
//!   applied before the read started; `s4-overwritten`: it returns
//!   checkpoint C although another applied checkpoint started after C's
//!   store call ended and ended before the read started;
//!   `s4-unknown-data`, `s4-read-before-write`: data nobody wrote to the
//!   work ID, or written only after the read. Checkpoints of unknown
//!   outcome, or concurrent with the read, may or may not be what it
//!   returns.
//! * **S5** `s5-release-ignored`, `s5-clean-without-release`: the hand-off
//!   of a grant says "released" without an applied (or unknown) release of
//!   the previous token, or not "released" after an applied one (releases
//!   the library sends on its own, handing back a grant that arrived too
//!   late, count too); `s5-skipped`, `s5-wrong-holder`, `s5-not-first`,
//!   `s5-unknown-previous`, `s5-clean-from-unknown`, `s5-revoked`: the
//!   hand-off names the wrong previous acquisition; `s5-read-differs`: a
//!   read reports another hand-off than its grant.
//!
//! Calls of unknown outcome (a store error from the store itself: a
//! register write whose reply was lost) are allowed to have taken effect
//! or not, so every reported violation is a real one; the price is that
//! violations hidden behind such calls go unseen. Beliefs handed over by
//! background renewal are recorded when the holder takes them, which may
//! be later than the reply: such an interval only starts late, which can
//! hide an overlap but never invent one.
//!
//! Violations come back in the [`Report`] with the seed, a one-line replay
//! command and a trace of the calls and beliefs around them. A
//! [`Campaign`] can tolerate the codes of known, reported library issues:
//! it still lists each with its replay command, and fails on any other.

use std::path::PathBuf;
#[cfg(feature = "sqlite")]
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::store::memory::MemoryStore;
use crate::store::register::{MemoryRegister, RegisterStore};
use crate::store::LeaseStore;
use crate::{Config, Leases};

mod campaign;
mod check;
mod config;
mod history;
mod holder;
mod link;
mod register;
mod report;

pub use campaign::{Campaign, CampaignReport};
pub use check::{Rule, Violation};
pub use config::{Delay, FaultConfig, RegisterFaults, SimConfig, StoreWrapper};
pub use history::{
    AppCounts, Applied, Belief, Delivery, Effect, FaultKind, Finished, OpKind, OpRecord, Outcome,
    Stamp,
};
pub use report::{Report, Stats};

use history::World;
use holder::Holder;
use link::SimStore;

/// The store under simulation.
#[derive(Clone, Debug)]
pub enum Backend {
    /// One [`MemoryStore`].
    Memory,
    /// [`RegisterStore`] adapters (one per simulated process) over one
    /// shared [`MemoryRegister`], with register faults underneath each.
    Register {
        /// How many adapters; holders are spread over them.
        adapters: usize,
    },
    /// `SqliteStore` values (one per simulated process) on one fresh file
    /// per run in `dir`, judging expiry by one shared `TokioClock`.
    #[cfg(feature = "sqlite")]
    Sqlite {
        /// Where the per-run database files go (removed after each run).
        dir: PathBuf,
        /// How many store values (processes) share the file.
        processes: usize,
    },
    /// A store of the caller's (a third-party store's own tests):
    /// `open` gives the store values of one run (one per simulated
    /// process), all over one fresh shared state. Their clock must be
    /// tokio's (the simulated, paused clock), and a call must not wait on
    /// anything else (no real I/O, no threads): an in-process store, or a
    /// store's core behind an in-process stand-in for its server.
    Custom {
        /// The store's name in figures and replay commands.
        name: &'static str,
        /// Makes the store values of one run.
        open: StoreFactory,
    },
}

/// What [`Backend::Custom`] runs: a function giving the store values of
/// one run.
#[derive(Clone)]
pub struct StoreFactory(pub Arc<dyn Fn() -> Vec<Arc<dyn LeaseStore>> + Send + Sync>);

impl std::fmt::Debug for StoreFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreFactory(..)")
    }
}

impl Backend {
    /// The store's name in figures and replay commands: `memory`,
    /// `register`, `sqlite`, or a custom store's name.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Register { .. } => "register",
            #[cfg(feature = "sqlite")]
            Backend::Sqlite { .. } => "sqlite",
            Backend::Custom { name, .. } => name,
        }
    }

    /// Whether store calls are applied with the simulated world stopped
    /// (calls that run on blocking threads).
    fn stops_the_world(&self) -> bool {
        match self {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite { .. } => true,
            _ => false,
        }
    }

    /// Slack for the store clock's rounding in the expiry rule: SQLite
    /// stores whole milliseconds (and rounds expiries up by one).
    fn tolerance(&self) -> Duration {
        match self {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite { .. } => Duration::from_millis(2),
            _ => Duration::ZERO,
        }
    }
}

/// The environment variable naming one seed to replay.
pub const SEED_VAR: &str = "WORKLEASE_SIM_SEED";
/// The environment variable giving the number of seeds per store.
pub const SEEDS_VAR: &str = "WORKLEASE_SIM_SEEDS";
/// The environment variable giving the first seed of a campaign
/// (default 0).
pub const SEED_BASE_VAR: &str = "WORKLEASE_SIM_SEED_BASE";
/// The environment variable restricting a replay to one store.
pub const STORE_VAR: &str = "WORKLEASE_SIM_STORE";

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        // Test support: a typo in a replay command must not pass silently.
        Err(e) => panic!("{name}={v:?} is not a number: {e}"),
    }
}

/// The seeds to run: only `$WORKLEASE_SIM_SEED` when it is set; otherwise
/// `$WORKLEASE_SIM_SEEDS` seeds (default `default_count`) from
/// `$WORKLEASE_SIM_SEED_BASE` (default 0).
pub fn seeds_from_env(default_count: u64) -> Vec<u64> {
    if let Some(seed) = env_u64(SEED_VAR) {
        return vec![seed];
    }
    let n = env_u64(SEEDS_VAR).unwrap_or(default_count);
    let base = env_u64(SEED_BASE_VAR).unwrap_or(0);
    (base..base.saturating_add(n)).collect()
}

/// The one-line command that replays `seed` on `store`: the test named
/// after the store in this crate's `tests/simulation.rs`, which reads
/// these variables. `extra_env` (e.g. a mutant's name) goes before it.
pub fn replay_command(store: &str, seed: u64, extra_env: &str) -> String {
    let extra = if extra_env.is_empty() {
        String::new()
    } else {
        format!("{extra_env} ")
    };
    format!(
        "{SEED_VAR}={seed} {STORE_VAR}={store} {extra}cargo test -p worklease --test simulation -- --nocapture --exact {store}"
    )
}

/// Runs one seed on `backend` and checks its history.
///
/// # Panics
/// When the runtime cannot be built or a store cannot be opened (test
/// support).
pub fn run(backend: &Backend, config: &SimConfig, seed: u64) -> Report {
    run_with_env(backend, config, seed, "")
}

/// As [`run`]; `extra_env` goes into the replay command (see
/// [`replay_command`]).
///
/// # Panics
/// As [`run`].
pub fn run_with_env(backend: &Backend, config: &SimConfig, seed: u64, extra_env: &str) -> Report {
    let started = std::time::Instant::now();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let (finished, holders) = runtime.block_on(simulate(backend, config, seed));
    drop(runtime);
    let params = check::Params {
        ttl: config.ttl,
        tolerance: backend.tolerance(),
        holder_ids: (0..holders).map(holder_id).collect(),
    };
    let violations = check::check(&finished, &params);
    let mut stats = Stats::of(&finished, holders, config.duration);
    stats.violations = violations.len() as u64;
    Report {
        store: backend.name().to_string(),
        seed,
        fingerprint: report::fingerprint(&finished),
        trace: report::trace(&finished, &violations, config.ttl),
        replay: replay_command(backend.name(), seed, extra_env),
        stats,
        violations,
        elapsed: started.elapsed(),
        history: Arc::new(finished),
    }
}

fn holder_id(i: usize) -> String {
    format!("h{i}")
}

/// Distinguishes the database files of runs in one process.
#[cfg(feature = "sqlite")]
static RUN_COUNTER: AtomicU64 = AtomicU64::new(0);

async fn simulate(backend: &Backend, config: &SimConfig, seed: u64) -> (history::Finished, usize) {
    let mut master = StdRng::seed_from_u64(seed);
    let mut fork = move || StdRng::seed_from_u64(master.gen());
    let mut scenario = fork();
    let holders = scenario.gen_range(config.holders.clone()).max(1);
    let work_ids = scenario.gen_range(config.work_ids.clone()).max(1);
    let f = &config.faults;
    let drift: Vec<f64> = (0..holders)
        .map(|_| {
            let x = scenario.gen::<f64>();
            f.max_drift * (2.0 * x - 1.0)
        })
        .collect();
    let start = Instant::now();
    let outages: Vec<(Instant, Instant)> = (0..scenario.gen_range(0..=f.max_outages))
        .map(|_| {
            let at = config::whole_ms(config.duration.mul_f64(scenario.gen::<f64>()));
            let len = config::draw_in(&mut scenario, &f.outage);
            (start + at, start + at + len)
        })
        .collect();
    let window = config.ttl - config.safety_margin;
    let world = Arc::new(World::new(
        holders,
        drift.clone(),
        outages.clone(),
        window,
        backend.stops_the_world(),
    ));
    for _ in &outages {
        world.fault(FaultKind::Outage);
    }
    for d in &drift {
        if *d != 0.0 {
            world.fault(FaultKind::Drift);
        }
    }

    #[allow(unused_mut)]
    let mut files: Vec<PathBuf> = Vec::new();
    let bases: Vec<Arc<dyn LeaseStore>> = match backend {
        Backend::Memory => vec![Arc::new(MemoryStore::new())],
        Backend::Register { adapters } => {
            let register = Arc::new(MemoryRegister::new());
            (0..(*adapters).max(1))
                .map(|_| {
                    let r = register::SimRegister::new(
                        register.clone(),
                        world.clone(),
                        f.register.clone(),
                        fork(),
                    );
                    Arc::new(RegisterStore::new(r)) as Arc<dyn LeaseStore>
                })
                .collect()
        }
        #[cfg(feature = "sqlite")]
        Backend::Sqlite { dir, processes } => {
            use crate::store::sqlite::{SqliteStore, TokioClock};
            let n = RUN_COUNTER.fetch_add(1, Ordering::SeqCst);
            let path = dir.join(format!("sim-{}-{seed}-{n}.db", std::process::id()));
            for suffix in ["", "-wal", "-shm"] {
                files.push(PathBuf::from(format!("{}{suffix}", path.display())));
            }
            let clock = Arc::new(TokioClock::new());
            (0..(*processes).max(1))
                .map(|_| {
                    // Without the wake-ups across values (a watch of the
                    // file, events in real time on a thread of their own):
                    // a run must be the same for the same seed. The
                    // wake-ups have their tests (`tests/sqlite_push.rs`).
                    let store = SqliteStore::open_with_clock(&path, clock.clone())
                        .expect("open the simulation's SQLite file")
                        .cross_process_wakeups(false);
                    Arc::new(store) as Arc<dyn LeaseStore>
                })
                .collect()
        }
        Backend::Custom { open, .. } => {
            let stores = (open.0)();
            assert!(!stores.is_empty(), "a custom backend gave no store");
            stores
        }
    };
    let bases: Vec<Arc<dyn LeaseStore>> = match &config.wrap {
        Some(wrap) => bases.into_iter().map(|s| wrap(s)).collect(),
        None => bases,
    };

    let shared = Arc::new(config.clone());
    let ids: Arc<Vec<String>> = Arc::new((0..work_ids).map(|i| format!("w{i}")).collect());
    let end = start + config.duration;
    let mut tasks = Vec::new();
    for (i, rho) in drift.iter().enumerate() {
        let link = SimStore::new(
            bases[i % bases.len()].clone(),
            i,
            world.clone(),
            f.clone(),
            fork(),
            fork(),
        );
        let leases = Leases::new(
            Arc::new(link),
            Config::new(holder_id(i), config.ttl).safety_margin(config.safety_margin),
        )
        .expect("a valid simulation config");
        let holder = Holder {
            idx: i,
            leases,
            world: world.clone(),
            rng: fork(),
            drift: *rho,
            work_ids: ids.clone(),
            end,
            config: shared.clone(),
            written: 0,
        };
        tasks.push(tokio::spawn(holder.run()));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        if let Err(e) = t.await {
            world.note(format!("holder h{i}'s task failed: {e}"));
        }
    }
    world.quiesce().await;
    drop(bases);
    for file in files {
        let _ = std::fs::remove_file(file);
    }
    (world.finish(), holders)
}
