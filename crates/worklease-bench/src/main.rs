//! `worklease-bench`: how close each store comes to its physical limit
//! (one round trip of the store) and how worklease compares with the lock
//! users already have on the same server, side by side in one run.
//!
//! ```sh
//! cargo run --release -p worklease-bench              # everything: BENCHMARKS.md, docs/benchmarks/
//! cargo run --release -p worklease-bench -- --quick   # a smoke run in under a minute (target/worklease-bench-quick/)
//! cargo run --release -p worklease-bench -- report docs/benchmarks/run.json   # the report again from a run's JSON
//! ```
//!
//! Scenarios ([`ops`], [`handoff`], [`failover`], [`scale`]) run on every
//! store of [`stores::table`] this build has and whose server answers;
//! each writes rows of [`results::Run`], the JSON that [`report`] and
//! [`plot`] turn into BENCHMARKS.md and its PNG plots.

mod calls;
mod failover;
mod handoff;
mod handoff_processes;
mod measure;
mod ops;
mod plot;
mod report;
mod results;
mod scale;
mod stores;
mod sys;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use worklease::store::ExpiryClock;

use crate::measure::Timing;
use crate::ops::WorkSet;
use crate::results::{HandoffMode, HandoffRow, OpRow, PlanInfo, Run, Skipped, StoreInfo};
use crate::stores::{Bench, Settings};

/// Errors of the benchmark program: anything, with its message.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A result of the benchmark program.
pub type Result<T> = std::result::Result<T, BoxError>;

#[cfg(feature = "postgres")]
const DEFAULT_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/test";
#[cfg(feature = "redis")]
const DEFAULT_REDIS: &str = "redis://127.0.0.1:6379/0";
#[cfg(feature = "etcd")]
const DEFAULT_ETCD: &str = "etcd://127.0.0.1:2379";
#[cfg(feature = "object-store")]
const DEFAULT_S3: &str =
    "s3://worklease-test/worklease-test?endpoint=http://127.0.0.1:5000&region=us-east-1";

#[derive(Parser)]
#[command(
    name = "worklease-bench",
    about = "Benchmarks worklease on every store beside the store's minimal compare-and-set and the peer lock, and writes BENCHMARKS.md",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args)]
struct RunArgs {
    /// A smoke run in under a minute: every scenario at tiny sizes. It must
    /// run; its figures mean little. Writes under target/worklease-bench-quick
    /// unless --out / --markdown say otherwise.
    #[arg(long)]
    quick: bool,
    /// Stores to measure, comma-separated [default: all]: memory, sqlite,
    /// postgres, redis, etcd, s3.
    #[arg(long, value_delimiter = ',')]
    stores: Vec<String>,
    /// Scenarios to run, comma-separated [default: all].
    #[arg(long, value_delimiter = ',', value_enum)]
    scenarios: Vec<Scenario>,
    /// Directory for run.json and the plots [default: docs/benchmarks;
    /// with --quick: target/worklease-bench-quick].
    #[arg(long)]
    out: Option<PathBuf>,
    /// The Markdown report [default: BENCHMARKS.md; with --quick:
    /// OUT/BENCHMARKS.md].
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// The PostgreSQL server [default: $WORKLEASE_TEST_POSTGRES_URL, else
    /// postgres://postgres@127.0.0.1:5432/test]. Tables of this run are
    /// created and dropped.
    #[arg(long)]
    postgres_url: Option<String>,
    /// The Redis server [default: $WORKLEASE_TEST_REDIS_URL, else
    /// redis://127.0.0.1:6379/0]. Keys of this run are deleted at the end.
    #[arg(long)]
    redis_url: Option<String>,
    /// The etcd cluster [default: $WORKLEASE_TEST_ETCD_URL, else
    /// etcd://127.0.0.1:2379]. Keys of this run are deleted at the end.
    #[arg(long)]
    etcd_url: Option<String>,
    /// The S3 server, bucket and prefix [default: $WORKLEASE_TEST_S3_URL,
    /// else s3://worklease-test/worklease-test?endpoint=http://127.0.0.1:5000&region=us-east-1];
    /// credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY. Objects
    /// of this run are deleted at the end.
    #[arg(long)]
    s3_url: Option<String>,
    /// Seconds per figure of cycle, renew and checkpoint (overrides the
    /// plan's: 3 s, or 0.1 s with --quick).
    #[arg(long)]
    seconds: Option<f64>,
    /// Exit with a failure (after writing the report) when a store this
    /// build has could not be measured, a scenario failed, an operation of
    /// cycle, renew or checkpoint failed, a failover trial failed, or a
    /// scale run acquired nothing or counted no store call while renewing:
    /// for CI's smoke run.
    #[arg(long)]
    strict: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Writes BENCHMARKS.md and the plots again from a run's JSON.
    Report {
        /// The run's JSON (run.json).
        json: PathBuf,
        /// Directory for the plots [default: the JSON's directory].
        #[arg(long)]
        out: Option<PathBuf>,
        /// The Markdown report [default: BENCHMARKS.md].
        #[arg(long)]
        markdown: Option<PathBuf>,
    },
    /// The scale scenario's process (started by this program): prints its
    /// row as JSON.
    #[command(hide = true)]
    Scale {
        #[arg(long)]
        store: String,
        #[arg(long)]
        leases: usize,
        #[arg(long)]
        ttl_ms: u64,
        #[arg(long)]
        window_ms: u64,
        #[arg(long)]
        acquire_limit_ms: u64,
        #[arg(long)]
        batch: usize,
        #[arg(long)]
        in_flight: usize,
    },
    /// A participant of the hand-off scenario across processes (started
    /// by this program).
    #[command(hide = true)]
    HandoffParticipant {
        #[arg(long)]
        store: String,
        #[arg(long)]
        work_id: String,
        #[arg(long)]
        ttl_ms: u64,
        #[arg(long)]
        poll_ms: u64,
        #[arg(long)]
        hold_ms: u64,
        #[arg(long, action = clap::ArgAction::Set)]
        push: bool,
    },
    /// The failover scenario's holder process (started by this program).
    #[command(hide = true)]
    Hold {
        #[arg(long)]
        store: String,
        #[arg(long)]
        work_id: String,
        #[arg(long)]
        ttl_ms: u64,
        #[arg(long, default_value_t = 120)]
        max_secs: u64,
    },
}

/// The scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Cycle,
    Renew,
    Checkpoint,
    Handoff,
    Failover,
    Scale,
}

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
}

impl Plan {
    fn new(quick: bool, seconds: Option<f64>) -> Self {
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
            }
        };
        if let Some(s) = seconds.filter(|s| *s > 0.0) {
            plan.timing.slice = Duration::from_secs_f64(s / f64::from(plan.timing.slices));
        }
        plan
    }

    fn info(&self) -> PlanInfo {
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
        }
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("worklease-bench: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Some(Command::Report {
                json,
                out,
                markdown,
            }) => {
                let run: Run = serde_json::from_slice(&std::fs::read(&json)?)?;
                let out = out.unwrap_or_else(|| {
                    json.parent()
                        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
                });
                write_report(
                    &run,
                    &out,
                    &markdown.unwrap_or_else(|| "BENCHMARKS.md".into()),
                )
            }
            Some(Command::HandoffParticipant {
                store,
                work_id,
                ttl_ms,
                poll_ms,
                hold_ms,
                push,
            }) => {
                let p = handoff_processes::Participant {
                    work_id,
                    ttl: Duration::from_millis(ttl_ms),
                    poll: Duration::from_millis(poll_ms),
                    hold: Duration::from_millis(hold_ms),
                    push,
                };
                handoff_processes::participant(&store, &p).await
            }
            Some(Command::Hold {
                store,
                work_id,
                ttl_ms,
                max_secs,
            }) => {
                failover::hold(
                    &store,
                    &work_id,
                    Duration::from_millis(ttl_ms),
                    Duration::from_secs(max_secs),
                )
                .await
            }
            Some(Command::Scale {
                store,
                leases,
                ttl_ms,
                window_ms,
                acquire_limit_ms,
                batch,
                in_flight,
            }) => {
                let job = scale::Job {
                    leases,
                    ttl: Duration::from_millis(ttl_ms),
                    window: Duration::from_millis(window_ms),
                    acquire_limit: Duration::from_millis(acquire_limit_ms),
                    batch,
                    in_flight,
                };
                let row = scale::run(&store, &job).await?;
                println!("{}", serde_json::to_string(&row)?);
                Ok(())
            }
            None => run(cli.run).await,
        }
    });
    // Background tasks (renewals, listeners) end with the runtime.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("worklease-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The server URL from the flag, else the environment variable (when set
/// and not empty), else the default.
#[cfg(any(
    feature = "postgres",
    feature = "redis",
    feature = "etcd",
    feature = "object-store"
))]
fn server_url(flag: Option<String>, var: &str, default: &str) -> String {
    flag.or_else(|| std::env::var(var).ok())
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// The command line as run, passwords masked.
fn command_line() -> String {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .map(|a| worklease::store::url::redact(&a))
        .collect();
    let profile = if cfg!(debug_assertions) {
        ""
    } else {
        " --release"
    };
    let mut cmd = format!("cargo run{profile} -p worklease-bench");
    if !args.is_empty() {
        cmd.push_str(" -- ");
        cmd.push_str(&args.join(" "));
    }
    cmd
}

async fn run(args: RunArgs) -> Result<()> {
    let started = std::time::Instant::now();
    let plan = Plan::new(args.quick, args.seconds);
    let out = args.out.clone().unwrap_or_else(|| {
        if args.quick {
            "target/worklease-bench-quick".into()
        } else {
            "docs/benchmarks".into()
        }
    });
    let markdown = args.markdown.clone().unwrap_or_else(|| {
        if args.quick {
            out.join("BENCHMARKS.md")
        } else {
            "BENCHMARKS.md".into()
        }
    });
    // Each scenario once, in the order given.
    let mut scenarios: Vec<Scenario> = Vec::new();
    for s in if args.scenarios.is_empty() {
        Scenario::value_variants()
    } else {
        &args.scenarios[..]
    } {
        if !scenarios.contains(s) {
            scenarios.push(*s);
        }
    }
    let settings = Settings {
        run: format!("{:08x}", rand::random::<u32>()),
        #[cfg(feature = "postgres")]
        postgres_url: server_url(
            args.postgres_url.clone(),
            "WORKLEASE_TEST_POSTGRES_URL",
            DEFAULT_POSTGRES,
        ),
        #[cfg(feature = "redis")]
        redis_url: server_url(
            args.redis_url.clone(),
            "WORKLEASE_TEST_REDIS_URL",
            DEFAULT_REDIS,
        ),
        #[cfg(feature = "etcd")]
        etcd_url: server_url(
            args.etcd_url.clone(),
            "WORKLEASE_TEST_ETCD_URL",
            DEFAULT_ETCD,
        ),
        #[cfg(feature = "object-store")]
        s3_url: server_url(args.s3_url.clone(), "WORKLEASE_TEST_S3_URL", DEFAULT_S3),
        ttl: plan.ttl,
    };
    let mut run = Run {
        format: 1,
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        elapsed_secs: 0.0,
        command: command_line(),
        quick: args.quick,
        machine: sys::machine(),
        plan: plan.info(),
        stores: Vec::new(),
        skipped: Vec::new(),
        cycle: Vec::new(),
        cycle_reused: Vec::new(),
        renew: Vec::new(),
        checkpoint: Vec::new(),
        handoff: Vec::new(),
        failover: Vec::new(),
        scale: Vec::new(),
    };
    eprintln!(
        "worklease-bench: run {} ({} cores, load average {:?})",
        settings.run, run.machine.cores, run.machine.load_average_start
    );
    for entry in stores::table() {
        if !args.stores.is_empty() && !args.stores.iter().any(|s| s == entry.name) {
            continue;
        }
        let skip = |reason: String| Skipped {
            store: entry.name.to_string(),
            scenario: None,
            reason,
        };
        let connect = match entry.connect {
            Ok(c) => c,
            Err(reason) => {
                eprintln!("== {}: skipped: {reason}", entry.name);
                run.skipped
                    .push(skip(format!("{}:// URLs: {reason}", entry.scheme)));
                continue;
            }
        };
        let bench = match connect(&settings).await {
            Ok(b) => b,
            Err(e) => {
                eprintln!("== {}: skipped: {e}", entry.name);
                run.skipped
                    .push(skip(format!("the server does not answer: {e}")));
                continue;
            }
        };
        eprintln!("== {} ({})", entry.name, bench.shown_url());
        if let Err(e) = run_store(&*bench, &plan, &scenarios, &mut run).await {
            eprintln!("== {}: stopped: {e}", entry.name);
            run.skipped.push(skip(format!("stopped: {e}")));
        }
        if let Err(e) = bench.cleanup().await {
            eprintln!("== {}: cleanup failed: {e}", entry.name);
        }
    }
    run.elapsed_secs = started.elapsed().as_secs_f64();
    run.machine.load_average_end = sys::load_average();
    std::fs::create_dir_all(&out)?;
    let json = out.join("run.json");
    std::fs::write(&json, serde_json::to_vec_pretty(&run)?)?;
    eprintln!("wrote {}", json.display());
    write_report(&run, &out, &markdown)?;
    if args.strict {
        let problems = problems(&run);
        if !problems.is_empty() {
            return Err(format!("--strict: {}", problems.join("; ")).into());
        }
    }
    Ok(())
}

/// What went wrong in a run, for `--strict`: stores of this build left
/// out, failed scenarios, failed operations of cycle, renew and checkpoint,
/// failed failover trials, scale runs that acquired nothing or counted no
/// store call while renewing. (Failed calls of waiters in hand-off are the
/// store's answers under contention: reported, not fatal.)
fn problems(run: &Run) -> Vec<String> {
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

/// Writes the plots into `out` and the Markdown report to `markdown`.
fn write_report(run: &Run, out: &Path, markdown: &Path) -> Result<()> {
    std::fs::create_dir_all(out)?;
    let plots = plot::all(run, out)?;
    let md_dir = markdown
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(md_dir)?;
    let links: Vec<(String, String)> = plots
        .iter()
        .map(|(title, path)| (title.clone(), relative(md_dir, path)))
        .collect();
    std::fs::write(
        markdown,
        report::markdown(run, &relative(md_dir, &out.join("run.json")), &links),
    )?;
    eprintln!("wrote {}", markdown.display());
    Ok(())
}

/// `path` relative to the directory `from` where one is inside the other,
/// else absolute; with `/` separators, for Markdown links.
fn relative(from: &Path, path: &Path) -> String {
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let (from, path) = (abs(from), abs(path));
    path.strip_prefix(&from)
        .map(Path::to_path_buf)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

/// A progress line for the rows of one figure.
fn progress(scenario: &str, rows: &[OpRow]) {
    let Some(first) = rows.first() else {
        return;
    };
    let size = first.bytes.map(|b| format!(" {b} B")).unwrap_or_default();
    let parts: Vec<String> = rows
        .iter()
        .map(|r| {
            let errors = if r.errors > 0 {
                format!(
                    " ({} errors: {})",
                    r.errors,
                    r.first_error.as_deref().unwrap_or("")
                )
            } else {
                String::new()
            };
            format!(
                "{} {:.0}/s p99 {:.2} ms{errors}",
                r.variant.as_str(),
                r.ops_per_sec,
                r.latency.p99_us as f64 / 1000.0
            )
        })
        .collect();
    eprintln!(
        "  {scenario}{size} {} client(s): {}",
        first.clients,
        parts.join(" | ")
    );
}

/// A progress line for one hand-off row.
fn handoff_progress(row: &HandoffRow) {
    eprintln!(
        "  handoff {} waiter(s) {}{}: p50 {:.2} ms p99 {:.2} ms ({} samples, round trip {:.3} ms){}",
        row.waiters,
        row.mode.as_str(),
        if row.across_processes {
            " (other processes)"
        } else {
            ""
        },
        row.latency.p50_us as f64 / 1000.0,
        row.latency.p99_us as f64 / 1000.0,
        row.latency.count,
        row.round_trip_us as f64 / 1000.0,
        errors_note(row.errors, row.first_error.as_deref())
    );
}

/// `, N errors: FIRST` for a progress line, or nothing without errors.
fn errors_note(errors: u64, first: Option<&str>) -> String {
    if errors > 0 {
        format!(", {errors} errors: {}", first.unwrap_or(""))
    } else {
        String::new()
    }
}

/// Runs the scenarios on one store, each on a namespace of its own. A
/// scenario that fails is recorded as skipped, with its error, and the
/// next one runs.
async fn run_store(
    bench: &dyn Bench,
    plan: &Plan,
    scenarios: &[Scenario],
    run: &mut Run,
) -> Result<()> {
    let name = bench.name();
    {
        let probe = bench.open("probe").await?;
        run.stores.push(StoreInfo {
            name: name.to_string(),
            url: bench.shown_url(),
            server: bench.server().await,
            baseline: probe.baseline.describe(),
            peer: probe.peer.as_ref().map(|p| p.describe()),
            register: probe.store.expiry_clock() == ExpiryClock::Observation,
        });
    }
    let register = run.stores.last().is_some_and(|s| s.register);
    let failed = |run: &mut Run, scenario: Scenario, e: BoxError| {
        eprintln!("  {scenario:?} failed: {e}");
        run.skipped.push(Skipped {
            store: name.to_string(),
            scenario: Some(format!("{scenario:?}").to_lowercase()),
            reason: format!("failed: {e}"),
        });
    };
    for &scenario in scenarios {
        let result: Result<()> = async {
            match scenario {
                Scenario::Cycle => {
                    let opened = bench.open("cycle").await?;
                    for &c in &plan.cycle_clients {
                        let rows = ops::cycle(&opened, plan, c, WorkSet::Fresh).await?;
                        progress("cycle", &rows);
                        run.cycle.extend(rows);
                    }
                    let opened = bench.open("cycle_reused").await?;
                    let ids = ops::reused_ids(&opened, plan, plan.cycle_reused_ids).await?;
                    for &c in &plan.cycle_clients {
                        let rows = ops::cycle(&opened, plan, c, WorkSet::Reused(&ids)).await?;
                        progress("cycle (reused IDs)", &rows);
                        run.cycle_reused.extend(rows);
                    }
                }
                Scenario::Renew => {
                    let opened = bench.open("renew").await?;
                    for &c in &plan.op_clients {
                        let rows = ops::renew(&opened, plan, c).await?;
                        progress("renew", &rows);
                        run.renew.extend(rows);
                    }
                }
                Scenario::Checkpoint => {
                    let opened = bench.open("ckpt").await?;
                    for &bytes in &plan.checkpoint_sizes {
                        for &c in &plan.op_clients {
                            let rows = ops::checkpoint(&opened, plan, c, bytes).await?;
                            progress("checkpoint", &rows);
                            run.checkpoint.extend(rows);
                        }
                    }
                }
                Scenario::Handoff => {
                    let opened = bench.open("handoff").await?;
                    let rtt = handoff::round_trip(&opened, plan).await?;
                    for &n in &plan.handoff_waiters {
                        for mode in [HandoffMode::Push, HandoffMode::Poll, HandoffMode::Peer] {
                            if let Some(row) = handoff::handoff(&opened, plan, n, mode, rtt).await?
                            {
                                handoff_progress(&row);
                                run.handoff.push(row);
                            }
                        }
                    }
                    if bench.handoff_across_processes() {
                        for &n in &plan.handoff_waiters {
                            for mode in [HandoffMode::Push, HandoffMode::Poll] {
                                let row =
                                    handoff_processes::handoff(&opened, plan, n, mode, rtt).await?;
                                handoff_progress(&row);
                                run.handoff.push(row);
                            }
                        }
                    }
                }
                Scenario::Failover => {
                    let opened = bench.open("failover").await?;
                    let row = failover::failover(bench, &opened, plan).await?;
                    eprintln!(
                        "  failover TTL {} ms + poll {} ms: {:?} ms{}",
                        row.ttl_ms,
                        row.poll_ms,
                        row.trials_ms.iter().map(|t| t.round()).collect::<Vec<_>>(),
                        errors_note(row.errors, row.first_error.as_deref())
                    );
                    run.failover.push(row);
                }
                Scenario::Scale => scale::scenario(bench, plan, register, &mut run.scale).await?,
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            failed(run, scenario, e);
        }
    }
    Ok(())
}
