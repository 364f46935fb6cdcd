//! `worklease-bench`: how close each store comes to its physical limit
//! (one round trip of the store) and how worklease compares with the lock
//! users already have on the same server, side by side in one run.
//!
//! ```sh
//! cargo run --release -p worklease-bench              # everything: BENCHMARKS.md, docs/benchmarks/
//! cargo run --release -p worklease-bench -- --quick   # a smoke run of a minute or two (target/worklease-bench-quick/)
//! cargo run --release -p worklease-bench -- report docs/benchmarks/run.json   # the report again from a run's JSON
//! cargo run --release -p worklease-bench -- replica-wait --url redis://HOST:PORT/0   # the Redis replica wait's cost
//! ```
//!
//! Scenarios ([`ops`], [`handoff`], [`failover`], [`scale`],
//! [`semaphore`], [`fair_handoff`], [`election`], [`pool`]; run by [`scenarios`]) run on
//! every store of [`stores::table`] this build has and whose server
//! answers (the pool scenario on SQLite only, with the `worklease` binary
//! beside this one: `cargo build --release -p worklease-cli -p
//! worklease-bench` builds both); each writes rows of [`results::Run`],
//! the JSON that [`report`] and [`plot`] turn into BENCHMARKS.md and its
//! PNG plots.

mod calls;
mod election;
mod failover;
mod fair_handoff;
mod handoff;
mod handoff_processes;
mod measure;
mod ops;
mod plan;
mod plot;
mod pool;
mod procs;
#[cfg(feature = "redis")]
mod replica_wait;
mod report;
mod results;
mod scale;
mod scenarios;
mod semaphore;
mod stores;
mod strict;
mod sys;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub use crate::plan::Plan;
use crate::results::{Run, Skipped};
use crate::scenarios::{run_store, Scenario};
#[cfg(feature = "server")]
use crate::stores::server::server_url;
use crate::stores::Settings;

/// Errors of the benchmark program: anything, with its message.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A result of the benchmark program.
pub type Result<T> = std::result::Result<T, BoxError>;

#[cfg(feature = "postgres")]
const DEFAULT_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/test";
#[cfg(feature = "mysql")]
const DEFAULT_MYSQL: &str = "mysql://root@127.0.0.1:3306/test";
#[cfg(feature = "redis")]
const DEFAULT_REDIS: &str = "redis://127.0.0.1:6379/0";
#[cfg(feature = "etcd")]
const DEFAULT_ETCD: &str = "etcd://127.0.0.1:2379";
#[cfg(feature = "object-store")]
const DEFAULT_S3: &str =
    "s3://worklease-test/worklease-test?endpoint=http://127.0.0.1:5000&region=us-east-1";
#[cfg(feature = "dynamodb")]
const DEFAULT_DYNAMODB: &str =
    "dynamodb://worklease-bench?endpoint=http://127.0.0.1:4567&region=us-east-1&create=true";

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
    /// A smoke run of a minute or two: every scenario at tiny sizes. It must
    /// run; its figures mean little. Writes under target/worklease-bench-quick
    /// unless --out / --markdown say otherwise.
    #[arg(long)]
    quick: bool,
    /// Stores to measure, comma-separated [default: all]: memory, sqlite,
    /// postgres, mysql, redis, etcd, s3, dynamodb.
    #[arg(long, value_delimiter = ',')]
    stores: Vec<String>,
    /// Scenarios to run, comma-separated [default: all]. `pool` runs on
    /// SQLite only and needs the `worklease` binary beside this program.
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
    /// The MySQL / MariaDB server [default: $WORKLEASE_TEST_MYSQL_URL, else
    /// mysql://root@127.0.0.1:3306/test]. Tables and procedures of this run
    /// are created and dropped.
    #[arg(long)]
    mysql_url: Option<String>,
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
    /// The DynamoDB table, endpoint and region [default:
    /// $WORKLEASE_TEST_DYNAMODB_URL, else
    /// dynamodb://worklease-bench?endpoint=http://127.0.0.1:4567&region=us-east-1&create=true
    /// (dynalite's port)]; credentials from the standard AWS sources
    /// (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY). Items of this run are
    /// deleted at the end; the table stays.
    #[arg(long)]
    dynamodb_url: Option<String>,
    /// Seconds per figure of cycle, renew, checkpoint and semaphore
    /// (overrides the plan's: 3 s, or 0.1 s with --quick).
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
    /// The Redis replica wait's cost: renew and checkpoint with and
    /// without `wait_replicas=1` on a primary that has a replica (skipped,
    /// with the reason, when none is connected).
    #[cfg(feature = "redis")]
    ReplicaWait {
        /// The primary [env: WORKLEASE_BENCH_REDIS_REPLICA_URL; default
        /// redis://127.0.0.1:6379/0].
        #[arg(long)]
        url: Option<String>,
        /// Concurrent clients, each figure in turn.
        #[arg(long, value_delimiter = ',', default_value = "1,16")]
        clients: Vec<usize>,
        /// Slices per variant.
        #[arg(long, default_value_t = 3)]
        slices: u32,
        /// Timed length of a slice, ms.
        #[arg(long, default_value_t = 1000)]
        slice_ms: u64,
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
            #[cfg(feature = "redis")]
            Some(Command::ReplicaWait {
                url,
                clients,
                slices,
                slice_ms,
            }) => {
                let url = server_url(url, replica_wait::URL_VAR, DEFAULT_REDIS);
                let timing = measure::Timing {
                    slices,
                    slice: Duration::from_millis(slice_ms),
                    warm_up: Duration::from_millis(slice_ms / 10),
                };
                replica_wait::run(&url, &clients, timing).await
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
        #[cfg(feature = "mysql")]
        mysql_url: server_url(
            args.mysql_url.clone(),
            "WORKLEASE_TEST_MYSQL_URL",
            DEFAULT_MYSQL,
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
        #[cfg(feature = "dynamodb")]
        dynamodb_url: server_url(
            args.dynamodb_url.clone(),
            "WORKLEASE_TEST_DYNAMODB_URL",
            DEFAULT_DYNAMODB,
        ),
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
        semaphore: Vec::new(),
        fair_handoff: Vec::new(),
        election: Vec::new(),
        pool: Vec::new(),
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
        let problems = strict::problems(&run);
        if !problems.is_empty() {
            return Err(format!("--strict: {}", problems.join("; ")).into());
        }
    }
    Ok(())
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
