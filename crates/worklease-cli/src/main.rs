//! # `worklease`: run commands under distributed work leases
//!
//! Over 600 lines: the clap definitions of every subcommand (about 490
//! lines; their long help texts are in help.rs), then logging set-up and
//! dispatch; clap derives the command tree from the definitions together.
//!
//! Like `flock` for a fleet: `worklease run WORK_ID -- CMD` runs CMD only
//! while this process holds the lease on WORK_ID in a shared store, so a
//! cron job or batch step runs in one process at a time (on one host with
//! the embedded SQLite store; across machines with a networked store), and
//! resumes from its checkpoint when a holder dies.
//!
//! ```text
//! worklease run    [--store URL] [--ttl 15s] [--wait] [--poll 2s] [--holder ID] [--grace TTL/4] [--if-held ok|fail] [--once] WORK_ID -- CMD [ARGS...]
//! worklease status [--store URL] [--json] [--watch] [--prefix P] [--sort KEY] [WORK_ID|PATTERN...]
//! worklease checkpoint set [--token T] [--store URL] [DATA]
//! worklease checkpoint get [--token T] [--store URL] [--json]
//! worklease release --force [--store URL] WORK_ID
//! worklease elect  [--store URL] [--ttl 15s] [--poll 2s] [--holder ID] [--grace TTL/4] ELECTION -- CMD [ARGS...]
//! worklease pool   [--store URL] [--ttl 15s] [--holder ID] [--grace TTL/4] [--backoff 1s] [--pool-name pool] --work-ids ID,ID,... [--work-ids-file FILE] -- CMD [ARGS...]
//! worklease completions bash|zsh|fish|elvish|powershell
//! worklease man [--out-dir DIR] [SUBCOMMAND...]
//! ```
//!
//! `pool` shares a fixed set of work IDs fairly between the pool processes
//! of one name and runs CMD once per work ID it holds (see [`pool`]).
//!
//! ## The store
//!
//! `--store URL`, else the environment variable `WORKLEASE_STORE`, else the
//! `store` of the configuration files ([`config`]: `/etc/worklease/config.toml`
//! and the user's), else the per-host SQLite file (said at the start of
//! `run`, `elect` and `pool`; `--require-shared-store` refuses it) at
//! `worklease::store::url::default_sqlite_path()`:
//! `$WORKLEASE_HOME/leases.db`, `$XDG_DATA_HOME/worklease/leases.db`,
//! `$HOME/.local/share/worklease/leases.db` or
//! `/var/lib/worklease/leases.db`, the first whose variable is set. URLs:
//! `sqlite:PATH`, `sqlite://PATH` (one host), `memory:` (private to one
//! process), `postgres://user@host:port/db?table=...`,
//! `mysql://user@host:3306/db?table=...` (or `mariadb://`; no
//! notifications: waiters poll),
//! `redis://host:port/db?prefix=...`, `etcd://host:2379,host:2379?prefix=...`
//! (`etcds://...&cacert=PATH` for TLS)
//! `s3://BUCKET/PREFIX?endpoint=URL&region=REGION` and
//! `dynamodb://TABLE?region=REGION&prefix=P` (across machines; credentials
//! from the `AWS_*` variables or another standard AWS source). An `s3://`
//! or `dynamodb://` store has no clock and judges expiry by observation: `status` shows its held leases
//! as `held?` and `run` without `--wait` cannot say when one expires. URLs
//! are shown only with their passwords masked. `run`, `elect` and `demo`
//! create a missing SQLite file (and its directories); `status`, `release`
//! and `checkpoint` refuse it ("no store at PATH", exit 69) and create
//! nothing. A SQLite path starting with `~` (which no shell expanded) is a
//! usage error.
//!
//! ## The child of `run`
//!
//! It gets `WORKLEASE_WORK_ID`, `WORKLEASE_HOLDER_ID`,
//! `WORKLEASE_FENCING_TOKEN`, `WORKLEASE_TOKEN` (the token's text form, which
//! `worklease checkpoint` reads) and `WORKLEASE_STORE` (the store URL, a
//! SQLite path made absolute). It runs in its own process group: SIGINT,
//! SIGTERM, SIGHUP, SIGQUIT (each followed by SIGCONT), SIGUSR1 and SIGUSR2
//! sent to `worklease` are forwarded to that group; Ctrl-Z stops the group,
//! then `worklease`. The group must be gone by the holder's deadline: while
//! renewal fails it gets SIGTERM `--grace` before the deadline and SIGKILL
//! at it; when the lease is taken away, SIGTERM at once and SIGKILL after
//! `--grace` (default TTL/4, at most 10s; at most TTL/2). Processes the
//! child leaves in its group are stopped before the lease is released. If
//! stdin is a terminal, the child gets `/dev/null`. On Linux the child also
//! gets SIGKILL if `worklease` itself dies (so it cannot outlive a lease
//! nobody renews); processes it started in the background do not.
//!
//! ## Exit status
//!
//! See [`exit::HELP`]: the child's own status (128 + N for signal N), 75
//! when the lease is held and `--wait` was not given, 76 when the lease was
//! lost while the child ran or a checkpoint came from a stale token, 64 for
//! usage errors, 69 when the store fails, 70 for internal errors.

use crate::say::say;
use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, Args, CommandFactory, Parser, Subcommand};
use worklease::limits::{HolderId, WorkId};
use worklease_cli::values::{
    parse_duration, parse_election, parse_holder_id, parse_permits, parse_poll, parse_ttl,
    parse_user_work_id, parse_work_id,
};

mod checkpoint;
mod config;
mod demo;
mod elect;
mod exit;
mod gc;
mod generate;
mod health;
mod help;
mod leader;
mod pool;
mod progress;
mod release;
mod run;
mod run_once;
mod say;
mod settle;
mod status;
mod status_select;
mod store_arg;
mod supervise;
mod telemetry;

use exit::Failure;
use help::{
    ABOUT, CHECKPOINT_HELP, ELECT_HELP, GET_HELP, MAIN_HELP, POOL_HELP, RELEASE_HELP, RUN_HELP,
    SET_HELP, STATUS_HELP,
};
pub use store_arg::{SharedStoreArg, StoreArg};
pub use telemetry::MetricsArg;

/// The `worklease` command line.
#[derive(Parser, Debug)]
#[command(name = "worklease", version, about = ABOUT, after_help = MAIN_HELP, after_long_help = format!("{MAIN_HELP}\n{}", exit::HELP))]
struct Cli {
    /// More logs on stderr: -v debug, -vv trace (default: warnings only).
    #[arg(short, long, global = true, action = ArgAction::Count, conflicts_with = "quiet")]
    verbose: u8,

    /// Fewer logs on stderr: errors only.
    #[arg(short, long, global = true)]
    quiet: bool,

    /// Log format on stderr: text (default) or json (one JSON object per line).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command while holding the lease on a work ID.
    #[command(after_help = RUN_HELP)]
    Run(RunArgs),
    /// Run a command only while this process leads an election.
    #[command(after_help = ELECT_HELP)]
    Elect(elect::ElectArgs),
    /// Run a command per work ID this process holds, sharing a set of work
    /// IDs fairly with the other pools of the same name.
    #[command(after_help = POOL_HELP)]
    Pool(PoolArgs),
    /// Show the leases in the store.
    #[command(after_help = STATUS_HELP)]
    Status(StatusArgs),
    /// Show who leads an election (and, with --watch, every change)
    /// without campaigning.
    #[command(after_help = leader::HELP)]
    Leader(leader::LeaderArgs),
    /// Save or read the checkpoint of the lease a child holds.
    #[command(subcommand, after_help = CHECKPOINT_HELP)]
    Checkpoint(CheckpointCommand),
    /// Take a lease away from whoever holds it (needs --force).
    #[command(after_help = RELEASE_HELP)]
    Release(ReleaseArgs),
    /// Delete the records of leases that ended long ago (never a live
    /// lease; fencing tokens never go down).
    #[command(after_help = gc::HELP)]
    Gc(gc::GcArgs),
    /// Demo: workers process a directory in shards; one gets SIGKILL,
    /// another resumes its shard from the checkpoint.
    #[command(after_help = demo::HELP)]
    Demo(demo::DemoArgs),
    /// The child of `worklease demo`: processes one shard (internal).
    #[command(hide = true)]
    DemoShard(demo::DemoShardArgs),
    /// Print the shell completion script for bash, zsh, fish, elvish or
    /// powershell.
    #[command(after_help = generate::COMPLETIONS_HELP)]
    Completions(generate::CompletionsArgs),
    /// Print the man page of worklease or of a subcommand (roff), or write
    /// them all into a directory.
    #[command(after_help = generate::MAN_HELP)]
    Man(generate::ManArgs),
}

/// Arguments of `worklease run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    store: StoreArg,

    #[command(flatten)]
    shared: SharedStoreArg,

    #[command(flatten)]
    metrics: MetricsArg,

    /// Lease TTL: how long the lease outlives a holder that stops renewing
    /// (it is renewed every TTL/3), e.g. 500ms, 15s, 1m.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_ttl, allow_hyphen_values = true)]
    ttl: Duration,

    /// Wait until the lease is free instead of exiting with 75.
    #[arg(long)]
    wait: bool,

    /// When the lease is held and --wait was not given: `fail` exits 75 with a line
    /// saying who holds it (without the line under -q); `ok` exits 0 and says nothing,
    /// as `flock -n -E 0` does, so that cron mails nothing from the hosts that lost the
    /// race.
    #[arg(long, value_enum, value_name = "ok|fail", default_value_t = run::IfHeld::Fail)]
    if_held: run::IfHeld,

    /// Run CMD only if WORK_ID's job has not finished yet: when the previous holder of
    /// WORK_ID ran it under --once to exit status 0, skip it (exit 0; a line says so
    /// unless -q), so that a late or clock-skewed cron on another host does not run a
    /// finished job again. After CMD exits 0, the finish is recorded in the store (the
    /// lease WORK_ID/finished). Any run of WORK_ID without --once (or one that fails)
    /// makes the next --once run. Not with --permits.
    #[arg(long, conflicts_with = "permits")]
    once: bool,

    /// Wait in line: `run --fair` waiters of one work ID (or semaphore)
    /// are served in the order they arrived, and a fair run without
    /// --wait exits 75 while fair waiters are queued (ADR 0015). Runs
    /// without --fair are not queued and may go first.
    #[arg(long)]
    fair: bool,

    /// With --wait: how often to retry (a release wakes the waiter at once
    /// on every store but S3, and the wait also ends as soon as the
    /// holder's lease expires).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_poll, allow_hyphen_values = true)]
    poll: Duration,

    /// Holder ID [default: <hostname>:<pid>].
    #[arg(long, value_name = "ID", value_parser = parse_holder_id)]
    holder: Option<HolderId>,

    /// How long the child's process group has between SIGTERM and SIGKILL:
    /// SIGTERM comes --grace before the lease deadline while renewal fails,
    /// at once when the lease is taken away [default: TTL/4, at most 10s;
    /// at most TTL/2].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    grace: Option<Duration>,

    /// WORK_ID names a semaphore of N permits (1 to 10000): hold any one
    /// of them (the work IDs WORK_ID/permit/0 to WORK_ID/permit/N-1), so
    /// that at most N of these commands run at once across the fleet.
    /// Every process of one semaphore should give the same N. The child's
    /// WORKLEASE_WORK_ID and WORKLEASE_FENCING_TOKEN are its permit's.
    #[arg(long, value_name = "N", value_parser = parse_permits)]
    permits: Option<usize>,

    /// The work ID to hold (1 to 1024 bytes, 1015 with --once; no control
    /// characters, not ending in /fair-queue, /fair-waiter/N, /permit/line,
    /// /step-down or /finished, which worklease keeps for itself), or with
    /// --permits the semaphore's name.
    #[arg(value_name = "WORK_ID", value_parser = parse_user_work_id)]
    work_id: WorkId,

    /// The command to run, after `--`, and its arguments.
    #[arg(value_name = "CMD", last = true, required = true, num_args = 1..)]
    command: Vec<OsString>,
}

/// Arguments of `worklease pool`.
#[derive(Args, Debug)]
pub struct PoolArgs {
    #[command(flatten)]
    store: StoreArg,

    #[command(flatten)]
    shared: SharedStoreArg,

    #[command(flatten)]
    metrics: MetricsArg,

    /// TTL of each work ID's lease and of the pool's membership: renewed
    /// every TTL/3, which is also how often the pool rebalances; after a
    /// crash, the other pools take over within TTL + 2 rounds. E.g. 500ms,
    /// 15s, 1m.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_ttl, allow_hyphen_values = true)]
    ttl: Duration,

    /// Holder ID of this pool process, unique among the pools of one name
    /// [default: <hostname>:<pid>].
    #[arg(long, value_name = "ID", value_parser = parse_holder_id)]
    holder: Option<HolderId>,

    /// How long a child's process group has between SIGTERM and SIGKILL when
    /// the pool stops it (lease lost, hand-off, shutdown); while renewal
    /// fails, SIGTERM comes --grace before the lease deadline [default:
    /// TTL/4, at most 10s; at most TTL/2].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    grace: Option<Duration>,

    /// How long this pool waits before starting a work ID's command again
    /// after it failed (a non-zero exit); it is started again as soon as
    /// this has passed (if the pool's share allows); at least 1ms.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_poll, allow_hyphen_values = true)]
    backoff: Duration,

    /// The pools of one name share the work IDs (their membership leases
    /// are NAME/members/HOLDER, the done records NAME/done/WORK_ID); 1 to
    /// 1024 bytes, no control characters. It does not scope the work IDs
    /// nor their checkpoints: give each run its own work IDs.
    #[arg(long, value_name = "NAME", default_value = "pool")]
    pool_name: String,

    /// The work IDs, comma-separated; repeatable (each 1 to 1024 bytes, no
    /// control characters, none ending in /fair-queue, /fair-waiter/N,
    /// /permit/line, /step-down or /finished, no duplicates; 1 to 100,000 work IDs in
    /// all).
    #[arg(long, value_name = "ID,ID,...")]
    work_ids: Vec<String>,

    /// A file with one work ID per line, added to --work-ids: each line is
    /// trimmed of surrounding whitespace (and a trailing \r); blank lines
    /// and lines starting with # are skipped.
    #[arg(long, value_name = "FILE")]
    work_ids_file: Option<std::path::PathBuf>,

    /// The command to run per work ID, after `--`, and its arguments.
    #[arg(value_name = "CMD", last = true, required = true, num_args = 1..)]
    command: Vec<OsString>,
}

/// Arguments of `worklease status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    store: StoreArg,

    /// One JSON object per lease per line (JSON Lines).
    #[arg(long)]
    json: bool,

    /// Redraw every second until SIGINT (Ctrl-C) or SIGTERM, then exit 0.
    #[arg(long)]
    watch: bool,

    /// Show the semaphore named by the one WORK_ID, with N permits (as
    /// `run --permits N` takes them): its permits' leases and a line of
    /// how many are held. A permit never taken is free and not listed.
    #[arg(long, value_name = "N", value_parser = parse_permits)]
    permits: Option<usize>,

    /// Also the leases worklease keeps for itself beside yours (fair lines'
    /// `.../fair-queue` and `.../fair-waiter/N`, a semaphore's under
    /// `NAME/permit/line/`, an election's `.../step-down` requests, run-once
    /// records `.../finished`), hidden unless named exactly.
    #[arg(long)]
    all: bool,

    /// Only work IDs that start with PREFIX.
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,

    /// The order of the rows: work-id (natural: shard-2 before shard-10),
    /// holder, token (highest first) or expires (soonest first).
    #[arg(long, value_enum, value_name = "KEY", default_value_t = status_select::SortKey::WorkId)]
    sort: status_select::SortKey,

    /// The work IDs to show, each exact or a glob pattern (`'reidx*'`,
    /// `'shard-?'`: `*` matches `/` too; quote it from the shell) [default:
    /// all but worklease's own].
    #[arg(value_name = "WORK_ID", value_parser = parse_work_id)]
    work_ids: Vec<WorkId>,
}

/// The lease token option of the `checkpoint` subcommands.
#[derive(Args, Debug, Clone)]
pub struct TokenArg {
    /// The lease token's text form [default: $WORKLEASE_TOKEN, set by
    /// `worklease run` for its child].
    #[arg(
        long,
        value_name = "TOKEN",
        env = "WORKLEASE_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
}

#[derive(Subcommand, Debug)]
enum CheckpointCommand {
    /// Save a checkpoint (raw bytes) with the lease, renewing it.
    #[command(after_help = SET_HELP)]
    Set(CheckpointSetArgs),
    /// Print the last checkpoint (raw bytes) and the hand-off it came with.
    #[command(after_help = GET_HELP)]
    Get(CheckpointGetArgs),
}

/// Arguments of `worklease checkpoint set`.
#[derive(Args, Debug)]
pub struct CheckpointSetArgs {
    #[command(flatten)]
    token: TokenArg,

    #[command(flatten)]
    store: StoreArg,

    /// The checkpoint's bytes [default: read standard input to its end].
    #[arg(value_name = "DATA")]
    data: Option<OsString>,
}

/// Arguments of `worklease checkpoint get`.
#[derive(Args, Debug)]
pub struct CheckpointGetArgs {
    #[command(flatten)]
    token: TokenArg,

    /// Read any work ID's last checkpoint, read-only, without a token
    /// (an operator's read: holder, fencing token and state with --json).
    #[arg(long, value_name = "ID", value_parser = parse_work_id)]
    work_id: Option<WorkId>,

    #[command(flatten)]
    store: StoreArg,

    /// Print one JSON object instead of the raw bytes.
    #[arg(long)]
    json: bool,
}

/// Arguments of `worklease release`.
#[derive(Args, Debug)]
pub struct ReleaseArgs {
    #[command(flatten)]
    store: StoreArg,

    /// Confirm taking the lease away from its holder, whoever it is.
    #[arg(long)]
    force: bool,

    /// The work ID whose lease to end.
    #[arg(value_name = "WORK_ID", value_parser = parse_work_id)]
    work_id: WorkId,
}

pub(crate) fn parse_metrics_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let addr = s
        .to_socket_addrs()
        .map_err(|e| format!("{e} (write HOST:PORT, for example 127.0.0.1:9464)"))?
        .next()
        .ok_or_else(|| format!("{s:?} resolves to no address"))?;
    if addr.port() == 0 {
        return Err(
            "port 0 would pick a port nobody can find: name the port, for example 127.0.0.1:9464"
                .into(),
        );
    }
    Ok(addr)
}

/// The format of the logs on stderr.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (with the fields of the current spans).
    Json,
}

fn init_logging(verbose: u8, quiet: bool, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = match (std::env::var_os("RUST_LOG"), verbose, quiet) {
        (_, _, true) => EnvFilter::new("error"),
        (Some(_), 0, _) => EnvFilter::from_default_env(),
        (_, 0, _) => EnvFilter::new("warn"),
        // The gRPC and HTTP stacks under the etcd and S3 stores log every
        // frame at debug: -v and -vv are about leases, so they stay at
        // warn / info there (RUST_LOG still opens them up).
        (_, 1, _) => EnvFilter::new(
            "debug,h2=warn,hyper=warn,hyper_util=warn,tower=warn,tonic=warn,reqwest=warn",
        ),
        _ => EnvFilter::new(
            "trace,h2=info,hyper=info,hyper_util=info,tower=info,tonic=info,reqwest=info",
        ),
    };
    // With -v, a line when each lease operation's span closes: it carries
    // the fields recorded at the end (outcome, duration_ms).
    let span_events = if verbose > 0 && !quiet {
        tracing_subscriber::fmt::format::FmtSpan::CLOSE
    } else {
        tracing_subscriber::fmt::format::FmtSpan::NONE
    };
    if format == LogFormat::Json {
        say::json();
    }
    if quiet {
        say::quiet();
    }
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // A closed stderr must not panic (the default reports the failed
        // write on that same stderr).
        .log_internal_errors(false)
        .with_env_filter(filter)
        .with_span_events(span_events)
        .with_target(false);
    // A second initialisation (impossible here) would only be refused.
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder.json().with_current_span(true).try_init(),
    };
}

/// Runs `open` with SIGTSTP, SIGTTIN and SIGTTOU blocked in this (the
/// main) thread: a thread a store starts (the SQLite store's connection
/// thread) inherits that mask, so the job-control handler keeps running on
/// the main thread only (see `supervise::job_control_mask`).
fn without_job_control<T>(open: impl FnOnce() -> T) -> T {
    use nix::sys::signal::SigmaskHow;
    let blocked = supervise::job_control_mask(SigmaskHow::SIG_BLOCK).is_ok();
    let out = open();
    if blocked {
        let _ = supervise::job_control_mask(SigmaskHow::SIG_UNBLOCK);
    }
    out
}

async fn dispatch(command: Command) -> Result<u8, Failure> {
    match command {
        Command::Run(args) => run::run(args).await,
        Command::Status(args) => status::status(args).await,
        Command::Leader(args) => leader::leader(args).await,
        Command::Checkpoint(CheckpointCommand::Set(args)) => checkpoint::set(args).await,
        Command::Checkpoint(CheckpointCommand::Get(args)) => checkpoint::get(args).await,
        Command::Release(args) => release::release(args).await,
        Command::Gc(args) => gc::gc(args).await,
        Command::Elect(args) => elect::elect(args).await,
        Command::Pool(args) => pool::pool(args).await,
        Command::Demo(args) => demo::demo(args).await,
        Command::DemoShard(args) => demo::demo_shard(args).await,
        Command::Completions(args) => generate::completions(args, Cli::command()),
        Command::Man(args) => generate::man(args, Cli::command()),
    }
}

fn main() -> ExitCode {
    // A child being started by a supervisor (see `supervise::exec`): it
    // becomes the command before anything else happens.
    #[cfg(target_os = "linux")]
    {
        let mut args = std::env::args_os().skip(1);
        if args.next().is_some_and(|a| a == supervise::EXEC_CHILD) {
            return ExitCode::from(supervise::exec_child(&args.collect::<Vec<_>>()));
        }
    }
    // A usage error is said before --log-format is parsed: as JSON too
    // when it was asked for.
    let mut args = std::env::args_os().skip(1).peekable();
    while let Some(arg) = args.next() {
        if arg == "--log-format=json"
            || (arg == "--log-format" && args.peek().is_some_and(|v| v == "json"))
        {
            say::json();
        }
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version print to stdout and succeed.
            let _ = e.print();
            return ExitCode::from(0);
        }
        Err(e) => {
            // Every other parse error is a usage error (clap's own status
            // would be 2), said on a line starting with `worklease:` as all
            // of worklease's own failures are.
            let mut text = e.render().to_string();
            // clap echoes a refused value whole: shorten a long one (a
            // 2,000-byte work ID) as worklease's own lines do.
            if let Some(clap::error::ContextValue::String(value)) =
                e.get(clap::error::ContextKind::InvalidValue)
            {
                if value.len() > 96 {
                    text =
                        text.replace(value.as_str(), &say::shorten_quoted(&format!("{value:?}")));
                }
            }
            say::failure(text.strip_prefix("error: ").unwrap_or(&text).trim_end());
            return ExitCode::from(exit::USAGE);
        }
    };
    init_logging(cli.verbose, cli.quiet, cli.log_format);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // Job-control signals are for the main thread only: see
        // `supervise::job_control_mask`.
        .on_thread_start(|| {
            let _ = supervise::job_control_mask(nix::sys::signal::SigmaskHow::SIG_BLOCK);
        })
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say!("cannot start the async runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let result = runtime.block_on(dispatch(cli.command));
    if matches!(result, Ok(code) if code > 128) {
        // Ended by a signal: what had to finish (background releases) was
        // waited for already, bounded (`settle`); a blocking store call
        // still running is one nobody awaits, and waiting for it would
        // only make the exit later than that bound.
        runtime.shutdown_background();
    } else {
        runtime.shutdown_timeout(Duration::from_secs(1));
    }
    let code = match result {
        Ok(code) => code,
        Err(failure) => {
            if !failure.message.is_empty() {
                say::failure(&failure.message);
            }
            failure.code
        }
    };
    telemetry::write_at_exit(code);
    ExitCode::from(code)
}
