//! # `worklease`: run commands under distributed work leases
//!
//! Like `flock` for a fleet: `worklease run WORK_ID -- CMD` runs CMD only
//! while this process holds the lease on WORK_ID in a shared store, so a
//! cron job or batch step runs in one process at a time (on one host with
//! the embedded SQLite store; across machines with a networked store), and
//! resumes from its checkpoint when a holder dies.
//!
//! ```text
//! worklease run    [--store URL] [--ttl 15s] [--wait] [--poll 2s] [--holder ID] [--grace TTL/4] WORK_ID -- CMD [ARGS...]
//! worklease status [--store URL] [--json] [--watch] [WORK_ID...]
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
//! embedded SQLite file at `worklease::store::url::default_sqlite_path()`:
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

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgAction, Args, CommandFactory, Parser, Subcommand};
use worklease::limits::{HolderId, WorkId};
use worklease::store::url::{self, StoreSpec};
use worklease::LeaseStore;
use worklease_cli::values::{
    parse_duration, parse_election, parse_holder_id, parse_permits, parse_poll, parse_ttl,
    parse_user_work_id, parse_work_id,
};

mod checkpoint;
mod demo;
mod elect;
mod exit;
mod generate;
mod health;
mod leader;
mod pool;
mod progress;
mod release;
mod run;
mod settle;
mod status;
mod supervise;

use exit::Failure;

const ABOUT: &str = "Run commands under distributed work leases: at most one holder per work ID, \
fencing tokens, checkpoints handed from one holder to the next.";

const MAIN_HELP: &str = "\
Examples:
  # Run the nightly report in one process at a time; the others exit 75.
  # (The default SQLite store coordinates the processes of one host; across
  # machines, all of them need one networked store such as PostgreSQL or Redis.)
  worklease run nightly-report -- ./report.sh

  # Queue up instead: wait until the current holder is done or dies.
  worklease run --wait nightly-report -- ./report.sh

  # Inside the child: save progress, and read it back after a crash.
  worklease checkpoint set \"page 7\"
  worklease checkpoint get

  # A fleet shares 12 shards: run this on every machine; each runs its
  # share, one child per shard (the shard in WORKLEASE_WORK_ID).
  worklease pool --work-ids shard-0,shard-1,...,shard-11 -- ./process-shard.sh

  # Who holds what?
  worklease status

Store: --store URL or WORKLEASE_STORE. Across machines:
postgres://user@host:5432/db?table=worklease_leases,
mysql://user@host:3306/db?table=worklease_leases (or mariadb://; waiters poll),
redis://host:6379/0?prefix=worklease: (rediss://...&cacert=PATH[&cert=PATH&key=PATH]
for TLS; redis+sentinel://S1:26379,S2:26379/PRIMARY?prefix=...;
redis+cluster://H1:7000,H2:7001?prefix=...), etcd://host:2379,host:2379?prefix=worklease/
(etcds://...&cacert=PATH[&cert=PATH&key=PATH] for TLS)
s3://BUCKET/PREFIX?endpoint=URL&region=REGION or
dynamodb://TABLE?region=REGION&prefix=P[&create=true] (endpoint and region
optional; credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or
another AWS_* source), or azblob://CONTAINER/PREFIX?account=NAME (credentials
from the AZURE_* variables); these judge expiry by observation, see
`status --help`.
Passwords are never printed. On one host: sqlite:PATH; the default is the SQLite file
$WORKLEASE_HOME/leases.db, else $XDG_DATA_HOME/worklease/leases.db, else
$HOME/.local/share/worklease/leases.db, else /var/lib/worklease/leases.db.
status, release and checkpoint never create a store: a missing SQLite file or
PostgreSQL/MySQL table is an error (exit 69).
Logs go to stderr (warnings by default; -v debug, -vv trace, -q errors only, or RUST_LOG;
--log-format json for one JSON object per line). run, elect and pool serve Prometheus metrics
with --metrics-addr 127.0.0.1:PORT (docs/metrics.md).
";

const RUN_HELP: &str = "\
The child gets WORKLEASE_WORK_ID, WORKLEASE_HOLDER_ID, WORKLEASE_FENCING_TOKEN,
WORKLEASE_TOKEN and WORKLEASE_STORE. It runs in its own process group; SIGINT,
SIGTERM, SIGHUP and SIGQUIT are forwarded to it, each followed by SIGCONT (so
that a stopped child acts on it), and so are SIGUSR1 and SIGUSR2. If stdin is
a terminal, the child gets /dev/null as stdin instead (reading the terminal
from its own process group would stop it while it holds the lease); input
through a pipe or a file reaches it as usual.

The lease is renewed every TTL/3 and released when the child exits. Processes
the child left running in its process group get SIGTERM, then SIGKILL after
--grace, before the lease is released.

The child is gone by the lease deadline: this holder counts the lease as its
own until the send time of its last successful renewal + TTL - TTL/10; after
that another holder may take it. While renewals fail, the child's process
group gets SIGTERM once less than --grace is left before that deadline, and
SIGKILL at the deadline (a renewal that succeeds meanwhile cancels the
SIGKILL). If the lease is taken away (revoked with `release --force`, taken
over, expired), the group gets SIGTERM at once and SIGKILL after --grace. Then
run exits 76. --grace defaults to TTL/4, at most 10s, and may not exceed TTL/2.
A renewal is sent TTL/3 after the last one, when 0.9 TTL - TTL/3 is left
before the deadline: one that has not succeeded --grace before the deadline
counts as failing. The default leaves a renewal 0.3 TTL or more to answer; a
--grace of TTL/2 only TTL/15.

Job control: Ctrl-Z (SIGTSTP; also SIGTTIN, SIGTTOU) stops the child's process
group, then worklease. On SIGCONT (fg, bg) the child continues if the lease is
still live; if its deadline passed meanwhile, the child's group gets SIGKILL
and run exits 76. A plain SIGSTOP of worklease cannot be caught: the child
runs on while worklease cannot renew, and the lease expires under it; the
fencing token is the guard then (`worklease checkpoint set` with the stale
token is refused with 76; pass WORKLEASE_FENCING_TOKEN to downstream writes).

With --permits N, WORK_ID names a semaphore: run holds any one of its N
permits (work IDs WORK_ID/permit/0 .. WORK_ID/permit/N-1), so at most N such
commands run at once across the fleet; the child's WORKLEASE_WORK_ID and
WORKLEASE_FENCING_TOKEN are its permit's (fence downstream writes per
permit). Without --wait, run exits 75 while all N are held. Every process of
one semaphore should give the same N: a smaller N takes effect as permits
are released (holders above it are not cut off), a larger one at once.

With --wait, a waiter is woken at once by a release or revocation on stores
with notifications (PostgreSQL, Redis, etcd, and SQLite also across
processes on one host, through the database file), and retries every --poll
otherwise. An expired lease is taken within TTL + --poll. An s3://
store has no clock and judges expiry by observation: without --wait, run
cannot say when the holder's lease expires; with --wait, a lease whose holder
stopped renewing is taken once the waiter has seen it unchanged for the
holder's TTL, that is within TTL + --poll of its last renewal or of the start
of the wait, whichever is later.

Exit status: the child's (128+N if signal N ended it); 75 held by another
(without --wait); 76 lease lost; 64 usage error; 69 store failure; 77 the
SQLite store file is refused (another user could write it); 126/127 the
command cannot be run / was not found. The child may exit with
64, 69, 75 or 76 itself. When the status is worklease's own, the last line
worklease writes to stderr starts with `worklease:` and says why (for 76:
`worklease: exit 76: ...`, with the child's own status); when it is the
child's, worklease writes no such line after the child ended (its log lines
start with a timestamp; `worklease checkpoint` run by the child writes
`worklease:` lines of its own, before the child ends).

Examples:
  worklease run nightly-report -- ./report.sh --date today
  worklease run --wait --poll 500ms --ttl 30s shard-7 -- ./process-shard 7
  worklease run --store sqlite:/srv/leases.db --holder web-1 migrate -- ./migrate.sh
  worklease run job -- sh -c 'echo \"token $WORKLEASE_FENCING_TOKEN\"; ./work'
";

const ELECT_HELP: &str = "\
Campaigns in ELECTION (a work ID) and runs CMD only while this process leads.
Candidates retry every --poll until the leader steps down or its lease
expires. The leader's generation (its fencing token, larger with every change
of leader) is in WORKLEASE_FENCING_TOKEN; the child gets the same WORKLEASE_*
environment as under `run`. When the child exits, leadership is released: with
SQLite (also in another process), PostgreSQL, Redis and etcd, a standby is
woken at once; on S3 at its next poll; after a crash, within TTL + --poll.

The child is supervised as under `run` (see `worklease run --help`): forwarded
signals, Ctrl-Z and SIGCONT, stdin /dev/null when it is a terminal, leftover
processes stopped before the release. While renewals fail, the child's process
group gets SIGTERM once less than --grace is left before the lease deadline
and SIGKILL at it; if leadership is taken away (revoked, taken over), SIGTERM
at once and SIGKILL after --grace; then elect exits 76. --grace defaults to
TTL/4, at most 10s, and may not exceed TTL/2. A plain SIGSTOP of elect cannot
be caught: the fencing token (the generation) is the guard then.

Exit status: the child's (128+N if signal N ended it); 76 leadership lost;
128+N a signal ended the campaign; 64 usage error; 69 store failure; 77 the
SQLite store file is refused (another user could write it). When the
status is elect's own, its last line on stderr starts with `worklease:` (for
76: `worklease: exit 76: ...`, with the child's own status), as under `run`.

Examples:
  # On every node: exactly one runs the scheduler; if it dies, another takes over.
  worklease elect --ttl 10s scheduler -- ./scheduler --generation-from-env
  worklease elect --store sqlite:/srv/leases.db --holder node-1 compactor -- ./compact
";

const POOL_HELP: &str = "\
Shares the work IDs between the pool processes of one --pool-name (on one
host with SQLite; across machines with a networked store): each holds a
membership lease <NAME>/members/<HOLDER> and, every TTL/3, takes its share
of the work IDs not done yet (W of them over n live pools: ceil(W/n) or
floor(W/n) each), gives back its surplus and takes free work IDs. A pool
starts its first commands one round (TTL/3) after it starts: it first
writes its membership, so that pools started together each start only
their share. Give every pool of one name the same work IDs; pools over
other sets need another name.

Work IDs and their checkpoints are global, not scoped by --pool-name (only
<NAME>/members/ and <NAME>/done/ are): give each run its own work IDs, e.g.
--work-ids reindex-2024-06/shard-0,reindex-2024-06/shard-1,... A work ID
reused from an earlier run resumes from that run's checkpoint (complete, if
it finished). One reuse is refused (64, nothing written): a work ID that a
pool of another name recorded done.

For each work ID it holds, the pool runs CMD in its own process group with
the environment of `worklease run` (WORKLEASE_WORK_ID, WORKLEASE_HOLDER_ID,
WORKLEASE_FENCING_TOKEN, WORKLEASE_TOKEN, WORKLEASE_STORE) and stdin
/dev/null; stdout and stderr are the pool's. Inside, `worklease checkpoint
get|set` read and save that work ID's progress.

When the child exits:
  0 (on its own, lease held)  the work ID is done: the pool records it as
                              <NAME>/done/<WORK_ID> and releases it; no pool
                              of that name runs CMD for it again
  non-zero, or a signal       the work ID is released and CMD started again
                              after --backoff (here, or at once elsewhere)
A child the pool stops is never done, whatever its status: when its lease
is lost (SIGTERM at once, SIGKILL after --grace, at the lease deadline at
the latest), when its work ID is handed to another pool for balance
(SIGTERM, SIGKILL after --grace, then a clean release), and on shutdown.
SIGINT, SIGTERM, SIGHUP or SIGQUIT to the pool: that signal to every child's
group, SIGKILL after --grace, every work ID released, exit 128+N. SIGUSR1 and
SIGUSR2 are forwarded to every child; Ctrl-Z stops them all, then the pool.
If the pool dies, its children get SIGKILL and the other pools take its work
IDs over within TTL + 2 rounds. Every round reads the done records before
acquiring anything: a done work ID is never taken again (its lease keeps
the holder and fencing token that finished it) and leaves the shares. The
children's stdout and stderr are all the pool's, interleaved. `worklease
status` shows the members, who holds each work ID and the done records.

Exactly once: one child at a time per work ID, each work ID done once. A
killed child's successor resumes from the last checkpoint and may redo what
came after it: make CMD idempotent given its checkpoint, and exit 0 at once
when its checkpoint says it is complete (a pool that died right after its
child exited 0 leaves that work ID to run once more). Done records stay, as
checkpoints do: to run the same work again, use new work IDs (and a new
--pool-name).

Exit status: 0 every work ID is done; 128+N a signal stopped the pool; 64
usage error (no work IDs, more than 100000, a duplicate or invalid one, an
empty or invalid --pool-name, no command, a work ID done by a pool of
another name); 69 store failure; 70 a work ID failed for good; 77 the SQLite
store file is refused (another user could write it); 126/127 CMD cannot
be executed / was not found (every child is stopped first).

Examples:
  worklease pool --work-ids shard-0,shard-1,shard-2,shard-3 -- ./process-shard.sh
  worklease pool --store postgres://wl@db/leases --ttl 30s --work-ids-file shards.txt -- ./consume
  worklease pool --pool-name nightly-2024-06-01 \\
      --work-ids nightly-2024-06-01/a,nightly-2024-06-01/b -- sh -c './work \"$WORKLEASE_WORK_ID\"'
";

const STATUS_HELP: &str = "\
Columns: work ID, holder, fencing token, expires in (or expired, released,
revoked, held?), checkpoint size, and whether the last hand-off was clean (the
holder before released). --json prints one JSON object per lease per line with
the fields work_id, holder_id, fencing_token, expires_at (RFC 3339), expired,
released, checkpoint_bytes, clean_handoff, ended (null while live, else
released, expired or revoked), previous_holder (null on the first acquisition,
else {holder_id, fencing_token, ended}) and expiry (by-store-clock or
by-observation).

held? (expiry by-observation, expires_at null): the store has no clock (s3://)
and judges expiry by observation: a lease counts as expired only once it has
been seen unchanged for a full TTL, so one look cannot tell whether a held
lease's holder still renews, and such a lease shows expired: false even if its
holder died. status --watch keeps looking and shows it expired one TTL after
its first look; run --wait takes it over then.

status never creates a store: a SQLite file that does not exist is an error.

--watch redraws every second until SIGINT (Ctrl-C) or SIGTERM, then exits 0:
on a terminal the screen is cleared before each table; otherwise a blank line
separates the tables. With --json, one batch of JSON lines per second. A work
ID named but unknown is left out while watching (it may appear later).

Exit status: 0; 1 when a named work ID is unknown; 64 usage error; 69 store
failure (also: no store at the path).

Examples:
  worklease status
  worklease status nightly-report shard-7
  worklease status --watch
  worklease status --json | jq 'select(.expired | not) | .work_id'
      (leases not known to have ended: on s3://, also held? ones)
";

const CHECKPOINT_HELP: &str = "\
Run inside `worklease run`: the token and store come from WORKLEASE_TOKEN and
WORKLEASE_STORE. A checkpoint also renews the lease. A checkpoint from a stale
token (the lease expired or was taken over) writes nothing and exits 76. A
store that does not exist is an error (69); none is created.

Examples:
  worklease checkpoint set \"page 7\"
  tar c state/ | worklease checkpoint set
  worklease checkpoint get > state.bin
  worklease checkpoint get --json
";

const SET_HELP: &str = "\
Exit status: 0 saved; 76 stale token (the lease expired or was taken over:
nothing was written); 64 usage error (no token, malformed token, checkpoint
over the 1 MiB limit); 69 store failure; 74 reading stdin failed.

Examples:
  worklease checkpoint set \"page 7\"
  printf 'offset=%d' \"$n\" | worklease checkpoint set
  worklease checkpoint set < state.bin
";

const GET_HELP: &str = "\
Writes the checkpoint's raw bytes to stdout (nothing when there is none) and
one line to stderr: its size, whether the hand-off was clean (the previous
holder released) and who held the lease before. With --json, prints instead
one JSON object: work_id, fencing_token, checkpoint_bytes, checkpoint_base64
(the data in standard base64, null when there is no checkpoint),
checkpoint_text (the data as a string when it is UTF-8, else null),
clean_handoff, and previous_holder ({holder_id, fencing_token, ended} with
ended one of released/expired/revoked; null on the first acquisition).

Exit status: 0; 76 stale token; 64 usage error; 69 store failure.

Examples:
  worklease checkpoint get > state.bin
  page=$(worklease checkpoint get 2>/dev/null)
  worklease checkpoint get --json | jq -r .checkpoint_text
";

const RELEASE_HELP: &str = "\
Ends the current lease on WORK_ID at once, whoever holds it: an operator's
tool for a stuck holder. The next acquirer may start at once, while the
revoked holder learns of it from the store's notification (milliseconds on
PostgreSQL, Redis, etcd and SQLite; with 100,000 leases on SQLite about two
seconds) or at its next renewal (within TTL/3; S3) and then stops its
child: for that window two children can run. Downstream writes
fenced by the fencing token reject the revoked one. The holder's next renewal fails, so `worklease run`
stops its child (SIGTERM, then SIGKILL after --grace) and exits 76; the next
acquirer sees an unclean hand-off (revoked). The checkpoint is kept.
A holder releases its own lease by ending: `worklease run` releases when its
child exits. release never creates a store.

Exit status: 0 revoked (or already ended); 1 unknown work ID; 64 usage error
(also without --force); 69 store failure (also: no store at the path).

Examples:
  worklease release --force nightly-report
  worklease release --force --store sqlite:/srv/leases.db shard-7
";

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

/// `--metrics-addr`, of `run` and `elect`.
#[derive(Args, Debug, Clone, Default)]
pub struct MetricsArg {
    /// Serve Prometheus metrics (text format, any path) on HOST:PORT, e.g. 127.0.0.1:9464 or
    /// localhost:9464 (port 0 is refused: nobody could find it). Any address given is bound,
    /// also a non-loopback one: the metrics show work IDs and elections, so expose them only
    /// where that is fine. See docs/metrics.md.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_metrics_addr)]
    metrics_addr: Option<std::net::SocketAddr>,
}

impl MetricsArg {
    /// Starts the Prometheus exporter (its HTTP listener on the current
    /// runtime) and registers the metrics' descriptions, when
    /// `--metrics-addr` was given.
    pub fn serve(&self) -> Result<(), Failure> {
        let Some(addr) = self.metrics_addr else {
            return Ok(());
        };
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install()
            .map_err(|e| {
                Failure::new(
                    exit::UNAVAILABLE,
                    format!("cannot serve metrics on {addr}: {e}"),
                )
            })?;
        worklease::metrics::describe();
        tracing::info!(%addr, "serving Prometheus metrics");
        Ok(())
    }
}

/// The store option shared by every subcommand.
#[derive(Args, Debug, Clone)]
pub struct StoreArg {
    /// Store URL: postgres://..., mysql://..., redis://..., etcd://..., s3://..., dynamodb://..., azblob://..., sqlite:PATH or memory:
    /// [default: the SQLite file leases.db under $WORKLEASE_HOME, $XDG_DATA_HOME/worklease,
    /// $HOME/.local/share/worklease or /var/lib/worklease]
    #[arg(
        long,
        value_name = "URL",
        env = "WORKLEASE_STORE",
        hide_env_values = true
    )]
    store: Option<String>,
}

impl StoreArg {
    /// The URL given, or the default SQLite URL.
    pub fn url(&self) -> String {
        self.store.clone().unwrap_or_else(url::default_url)
    }

    /// Opens the store, creating a missing SQLite file (and its
    /// directories): for `run` and `elect`. Returns the URL to hand to a
    /// child (a relative SQLite path made absolute; never to be printed:
    /// use [`url::redact`]) and the store.
    pub fn open(&self) -> Result<(String, Arc<dyn LeaseStore>), Failure> {
        let (spec, for_child) = self.spec()?;
        tracing::debug!(store = %url::redact(&for_child), "opening the store");
        let store = without_job_control(|| spec.open())?;
        Ok((for_child, store))
    }

    /// Opens a store that exists, creating nothing: for `status`,
    /// `release` and `checkpoint`. A SQLite file that does not exist is
    /// [`exit::UNAVAILABLE`] with a message naming the path.
    pub fn open_existing(&self) -> Result<(String, Arc<dyn LeaseStore>), Failure> {
        let (spec, for_child) = self.spec()?;
        tracing::debug!(store = %url::redact(&for_child), "opening the existing store");
        match without_job_control(|| spec.open_existing()) {
            Ok(store) => Ok((for_child, store)),
            Err(e) => {
                let mut failure = Failure::from(e);
                if let StoreSpec::Sqlite(path) = &spec {
                    if std::fs::symlink_metadata(path).is_err() {
                        failure.message.push_str(
                            " (`worklease run` and `worklease elect` create it; check --store \
                             and WORKLEASE_STORE)",
                        );
                    }
                }
                Err(failure)
            }
        }
    }

    /// The parsed URL, and the URL for a child.
    fn spec(&self) -> Result<(StoreSpec, String), Failure> {
        let given = self.url();
        let spec = url::parse(&given)?;
        let for_child = match spec.absolute() {
            StoreSpec::Sqlite(path) if path.to_str().is_some() => StoreSpec::Sqlite(path).to_url(),
            StoreSpec::Memory => StoreSpec::Memory.to_url(),
            _ => given.clone(),
        };
        Ok((spec, for_child))
    }
}

/// Arguments of `worklease run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    store: StoreArg,

    #[command(flatten)]
    metrics: MetricsArg,

    /// Lease TTL: how long the lease outlives a holder that stops renewing
    /// (it is renewed every TTL/3), e.g. 500ms, 15s, 1m.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_ttl)]
    ttl: Duration,

    /// Wait until the lease is free instead of exiting with 75.
    #[arg(long)]
    wait: bool,

    /// Wait in line: `run --fair` waiters of one work ID (or semaphore)
    /// are served in the order they arrived, and a fair run without
    /// --wait exits 75 while fair waiters are queued (ADR 0015). Runs
    /// without --fair are not queued and may go first.
    #[arg(long)]
    fair: bool,

    /// With --wait: how often to retry (a release wakes the waiter at once
    /// on every store but S3, and the wait also ends as soon as the
    /// holder's lease expires).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_poll)]
    poll: Duration,

    /// Holder ID [default: <hostname>:<pid>].
    #[arg(long, value_name = "ID", value_parser = parse_holder_id)]
    holder: Option<HolderId>,

    /// How long the child's process group has between SIGTERM and SIGKILL:
    /// SIGTERM comes --grace before the lease deadline while renewal fails,
    /// at once when the lease is taken away [default: TTL/4, at most 10s;
    /// at most TTL/2].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    grace: Option<Duration>,

    /// WORK_ID names a semaphore of N permits (1 to 10000): hold any one
    /// of them (the work IDs WORK_ID/permit/0 to WORK_ID/permit/N-1), so
    /// that at most N of these commands run at once across the fleet.
    /// Every process of one semaphore should give the same N. The child's
    /// WORKLEASE_WORK_ID and WORKLEASE_FENCING_TOKEN are its permit's.
    #[arg(long, value_name = "N", value_parser = parse_permits)]
    permits: Option<usize>,

    /// The work ID to hold (1 to 1024 bytes, no control characters, not
    /// ending in /fair-queue, /fair-waiter/N, /permit/line or /step-down,
    /// which worklease keeps for itself), or with --permits the semaphore's
    /// name.
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
    metrics: MetricsArg,

    /// TTL of each work ID's lease and of the pool's membership: renewed
    /// every TTL/3, which is also how often the pool rebalances; after a
    /// crash, the other pools take over within TTL + 2 rounds. E.g. 500ms,
    /// 15s, 1m.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_ttl)]
    ttl: Duration,

    /// Holder ID of this pool process, unique among the pools of one name
    /// [default: <hostname>:<pid>].
    #[arg(long, value_name = "ID", value_parser = parse_holder_id)]
    holder: Option<HolderId>,

    /// How long a child's process group has between SIGTERM and SIGKILL when
    /// the pool stops it (lease lost, hand-off, shutdown); while renewal
    /// fails, SIGTERM comes --grace before the lease deadline [default:
    /// TTL/4, at most 10s; at most TTL/2].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    grace: Option<Duration>,

    /// How long this pool waits before starting a work ID's command again
    /// after it failed (a non-zero exit); it is started again as soon as
    /// this has passed (if the pool's share allows); at least 1ms.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_poll)]
    backoff: Duration,

    /// The pools of one name share the work IDs (their membership leases
    /// are NAME/members/HOLDER, the done records NAME/done/WORK_ID); 1 to
    /// 1024 bytes, no control characters. It does not scope the work IDs
    /// nor their checkpoints: give each run its own work IDs.
    #[arg(long, value_name = "NAME", default_value = "pool")]
    pool_name: String,

    /// The work IDs, comma-separated; repeatable (each 1 to 1024 bytes, no
    /// control characters, none ending in /fair-queue, /fair-waiter/N or
    /// /step-down, no duplicates; 1 to 100,000 work IDs in all).
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

    /// With no WORK_ID: also the leases worklease keeps for itself beside
    /// yours (fair lines' `.../fair-queue` and `.../fair-waiter/N`, an
    /// election's `.../step-down` requests), hidden by default.
    #[arg(long)]
    all: bool,

    /// The work IDs to show [default: all but worklease's own].
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

fn parse_metrics_addr(s: &str) -> Result<std::net::SocketAddr, String> {
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
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
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
            let text = e.render().to_string();
            eprint!(
                "worklease: {}",
                text.strip_prefix("error: ").unwrap_or(&text)
            );
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
            eprintln!("worklease: cannot start the async runtime: {e}");
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
    match result {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            if !failure.message.is_empty() {
                eprintln!("worklease: {}", failure.message);
            }
            ExitCode::from(failure.code)
        }
    }
}
