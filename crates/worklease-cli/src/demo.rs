//! `worklease demo`: several workers process a real directory of text files
//! in shards under leases; one of them is killed with SIGKILL in the middle
//! of a shard, another resumes that shard from its checkpoint, and the demo
//! checks that every shard was processed exactly once to completion.
//!
//! The processes:
//!
//! * `worklease demo` ([`demo`]) collects the files, writes a manifest (the
//!   files of each shard) into a scratch directory, and runs the workers
//!   `worker-1`, `worker-2`, ...: each is a loop (a task of this process)
//!   that runs, for one shard after the other, a real
//!   `worklease run --wait --holder worker-N demo/shard-K -- worklease demo-shard ...`
//!   process;
//! * `worklease demo-shard` ([`demo_shard`], hidden) is the child that does
//!   the work of one shard: it reads the shard's checkpoint, resumes at the
//!   file it names, counts the lines, words and bytes of each remaining file
//!   and checkpoints after every file. Its result is its final checkpoint,
//!   so a file it counted but did not checkpoint before a crash is counted
//!   again by the next holder, and never twice in the result.
//!
//! The child reports on stdout, one JSON object per line ([`ChildEvent`]);
//! `worklease run` passes its stdout through. The demo synchronises on these
//! lines only: the SIGKILL follows the line of a checkpoint, and a worker
//! learns that a shard is complete from its child.

use std::collections::BTreeMap;
use std::ops::Range;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use worklease::store::url::{self, StoreSpec};
use worklease::{AcquireOptions, Config, Error, LeaseStore, Leases, Token};

use crate::exit::{self, Failure};
use crate::run::check_lease_args;
use crate::status::write_stdout;

/// The help text after the options of `worklease demo`.
pub const HELP: &str = "\
What it does:
  1. Collects the text files under DIR (regular files that are UTF-8 without
     NUL bytes; the directories target/ and .git/ and all symlinks are
     skipped), sorted by path, and splits them into --shards shards of
     consecutive files (fewer when there are fewer files); shard K is the
     work ID demo/shard-K.
  2. Uses a fresh SQLite store in a temporary directory, removed at the end
     (never your default store, nor WORKLEASE_STORE), unless --store.
  3. Starts --workers workers, worker-1 ... worker-N. Each goes over the
     shards, starting at a different one, and runs for each in turn
       worklease run --wait --ttl TTL --poll 100ms --holder worker-N demo/shard-K \\
         -- worklease demo-shard ...
     The child reads the shard's checkpoint, resumes at the file it names,
     counts each remaining file's lines, words and bytes (taking --pace per
     file) and checkpoints after every file: the next file index, the running
     totals, and which fencing token processed each file. A child that finds
     its shard complete exits at once.
  4. Unless --no-kill: as soon as a child has checkpointed a third of its
     shard, the demo sends SIGKILL to that worker's `worklease run` (the
     child dies with it) and the worker is gone. Another worker, waiting on
     that shard, takes it over when the lease runs out (within TTL + 100ms)
     and resumes from the checkpoint: a hand-off that is not clean, and a
     larger fencing token.
  5. Prints each shard's totals, who processed which files with which
     fencing token, who resumed which shard from which checkpoint, and checks
     the final checkpoints against a direct single pass over the same files.

DIR defaults to the worklease source tree this binary was built from (the
workspace root, CARGO_MANIFEST_DIR/../..) while it still exists, else the
current directory.

SIGINT (Ctrl-C) or SIGTERM stops the workers (SIGTERM to each `worklease
run`, which stops its child and releases), removes the scratch directory and
exits 130 or 143.

Exit status: 0 every shard was processed exactly once to completion; 1 the
check failed (the differences are printed); 64 usage error (also no text
files under DIR, or a TTL too short to renew); 69 the store failed; 74 the
scratch directory cannot be written; 130/143 interrupted.

Examples:
  worklease demo
  worklease demo --workers 4 --shards 8 --ttl 1s ~/notes
  worklease demo --no-kill --store sqlite:/tmp/demo.db .
";

/// The poll interval of the waiting workers.
const POLL: &str = "100ms";
/// How many times a worker goes over the shards it could not see complete
/// (a run that failed, for example because the store was busy).
const PASSES: usize = 3;
/// Files per shard above which the checkpoint could outgrow its 1 MiB limit.
const MAX_FILES_PER_SHARD: usize = 50_000;
/// The holder ID the demo reads the final checkpoints with.
const VERIFIER: &str = "demo-verifier";

/// Arguments of `worklease demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// How many workers (worker-1, worker-2, ...); each runs one
    /// `worklease run` after the other.
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u16).range(1..=32))]
    workers: u16,

    /// How many shards (work IDs demo/shard-0, ...); fewer when DIR has
    /// fewer text files.
    #[arg(long, value_name = "N", default_value_t = 6,
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    shards: u16,

    /// The workers' lease TTL: how long after the SIGKILL another worker
    /// takes the shard over.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = crate::parse_ttl)]
    ttl: Duration,

    /// Time the child takes per file on top of reading it, so that the
    /// SIGKILL lands in the middle of a shard.
    #[arg(long, value_name = "DURATION", default_value = "20ms", value_parser = crate::parse_duration)]
    pace: Duration,

    /// Kill no worker: every hand-off is clean.
    #[arg(long)]
    no_kill: bool,

    /// Store URL, sqlite:PATH [default: a fresh SQLite file in a temporary
    /// directory, removed at the end; WORKLEASE_STORE is not read].
    #[arg(long, value_name = "URL")]
    store: Option<String>,

    /// The directory of text files to process [default: the worklease
    /// source tree, else the current directory].
    #[arg(value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Arguments of `worklease demo-shard`, the child `worklease demo` runs
/// under `worklease run`.
#[derive(Args, Debug)]
pub struct DemoShardArgs {
    /// The manifest `worklease demo` wrote: the files of every shard.
    #[arg(long, value_name = "PATH")]
    manifest: PathBuf,

    /// Which shard to process.
    #[arg(long, value_name = "K")]
    shard: usize,

    /// Time taken per file on top of reading it.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = crate::parse_duration)]
    pace: Duration,

    /// The lease token (set by `worklease run`).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "WORKLEASE_TOKEN",
        hide_env_values = true
    )]
    token: String,

    /// The store URL (set by `worklease run`).
    #[arg(
        long,
        value_name = "URL",
        env = "WORKLEASE_STORE",
        hide_env_values = true
    )]
    store: String,
}

// ---------------------------------------------------------------------------
// What the demo and its children share: files, counts, manifest, checkpoint.

/// Lines, words and bytes of a text, as `wc` counts them (lines are
/// newline characters, words are runs of non-whitespace).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    lines: u64,
    words: u64,
    bytes: u64,
}

impl Counts {
    fn of(text: &str) -> Self {
        Self {
            lines: text.bytes().filter(|&b| b == b'\n').count() as u64,
            words: text.split_whitespace().count() as u64,
            bytes: text.len() as u64,
        }
    }

    fn add(&mut self, other: Counts) {
        self.lines += other.lines;
        self.words += other.words;
        self.bytes += other.bytes;
    }
}

/// The file's text, or `None` when it cannot be read, holds a NUL byte
/// (binary) or is not UTF-8.
fn read_text(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.contains(&0) {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// What `worklease demo` hands its children: the files of every shard.
#[derive(Serialize, Deserialize)]
struct Manifest {
    /// This run of the demo: a checkpoint of another run is not resumed.
    run: String,
    /// The directory the paths are relative to.
    root: PathBuf,
    /// The files of each shard, relative to `root`.
    shards: Vec<Vec<String>>,
}

/// A shard's checkpoint: its progress and, once complete, its result.
#[derive(Serialize, Deserialize, Debug, Clone)]
struct ShardState {
    /// The demo run ([`Manifest::run`]).
    demo: String,
    shard: usize,
    /// How many files the shard has.
    files: usize,
    /// The index of the next file to process.
    next: usize,
    /// `next == files`: the shard's result is final.
    complete: bool,
    /// The counts of files `0..next`.
    totals: Counts,
    /// `(file index, fencing token)` of every processed file, in order.
    processed: Vec<(usize, u64)>,
    /// The holder of each fencing token that processed files.
    holders: BTreeMap<u64, String>,
    /// The holder that wrote this checkpoint.
    holder: String,
}

impl ShardState {
    fn fresh(demo: &str, shard: usize, files: usize) -> Self {
        Self {
            demo: demo.to_string(),
            shard,
            files,
            next: 0,
            complete: false,
            totals: Counts::default(),
            processed: Vec::new(),
            holders: BTreeMap::new(),
            holder: String::new(),
        }
    }
}

/// One line of a child's stdout.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "event", rename_all = "snake_case")]
enum ChildEvent {
    /// The child read the checkpoint: where it starts.
    Start {
        pid: u32,
        holder: String,
        token: u64,
        next: usize,
        files: usize,
        complete: bool,
        clean_handoff: bool,
        previous: Option<Previous>,
        /// Why a checkpoint found was not resumed from (another demo run).
        discarded: Option<String>,
    },
    /// The checkpoint after a file was saved: `next` files are done.
    Checkpoint {
        token: u64,
        next: usize,
        files: usize,
    },
    /// The shard is complete (the last checkpoint says so).
    Complete { token: u64, files: usize },
}

/// The previous holder, as the child's acquisition saw it.
#[derive(Serialize, Deserialize, Debug, Clone)]
struct Previous {
    holder: String,
    token: u64,
    ended: String,
}

fn work_id(shard: usize) -> String {
    format!("demo/shard-{shard}")
}

fn holder(worker: usize) -> String {
    format!("worker-{}", worker + 1)
}

/// `1 file`, `2 files`: `n` and `noun`, in the plural unless `n` is 1.
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// A duration as `worklease run` parses it back exactly.
fn millis(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// Writes one line to stdout; a closed stdout (`| head`) is not an error.
fn say(line: impl AsRef<str>) {
    let mut text = line.as_ref().to_string();
    text.push('\n');
    let _ = write_stdout(text.as_bytes());
}

/// A lease error of the child, with what it means for its exit status.
fn lease_failure(error: Error, what: &str) -> Failure {
    if error.is_lease_lost() {
        Failure::new(exit::LOST, format!("{what}: {error}"))
    } else {
        error.into()
    }
}

// ---------------------------------------------------------------------------
// The child: `worklease demo-shard`.

/// Runs `worklease demo-shard`: processes one shard from its checkpoint on.
pub async fn demo_shard(args: DemoShardArgs) -> Result<u8, Failure> {
    let manifest: Manifest = std::fs::read(&args.manifest)
        .map_err(|e| e.to_string())
        .and_then(|data| serde_json::from_slice(&data).map_err(|e| e.to_string()))
        .map_err(|e| {
            Failure::usage(format!(
                "cannot read the manifest {}: {e}",
                args.manifest.display()
            ))
        })?;
    let files = manifest.shards.get(args.shard).ok_or_else(|| {
        Failure::usage(format!(
            "shard {} is not in the manifest ({} shards)",
            args.shard,
            manifest.shards.len()
        ))
    })?;
    let token: Token = args
        .token
        .parse()
        .map_err(|e| Failure::usage(format!("--token / WORKLEASE_TOKEN: {e}")))?;
    let store = url::open(&args.store)?;
    let leases = Leases::new(store, Config::new(token.holder_id().as_str(), token.ttl()))?;
    let holder = token.holder_id().as_str().to_string();
    let fencing_token = token.fencing_token();

    let checkpoint = leases
        .read_checkpoint(&token)
        .await
        .map_err(|e| lease_failure(e, "cannot read the checkpoint"))?;
    let fresh = || ShardState::fresh(&manifest.run, args.shard, files.len());
    let (mut state, discarded) = match checkpoint.data.as_deref() {
        None => (fresh(), None),
        Some(data) => match serde_json::from_slice::<ShardState>(data) {
            Ok(s) if s.demo == manifest.run && s.shard == args.shard && s.files == files.len() => {
                (s, None)
            }
            Ok(s) => (fresh(), Some(format!("from another demo run ({})", s.demo))),
            Err(e) => (fresh(), Some(format!("not a demo checkpoint: {e}"))),
        },
    };
    emit(&ChildEvent::Start {
        pid: std::process::id(),
        holder: holder.clone(),
        token: fencing_token,
        next: state.next,
        files: files.len(),
        complete: state.complete,
        clean_handoff: checkpoint.clean_handoff(),
        previous: checkpoint.handoff.previous.as_ref().map(|p| Previous {
            holder: p.holder_id.clone(),
            token: p.fencing_token,
            ended: p.ended.as_str().to_string(),
        }),
        discarded,
    })?;
    if state.complete {
        return Ok(0);
    }

    state.holders.insert(fencing_token, holder.clone());
    state.holder = holder;
    for (index, file) in files.iter().enumerate().skip(state.next) {
        let path = manifest.root.join(file);
        let text = read_text(&path).ok_or_else(|| {
            Failure::new(
                1,
                format!(
                    "{}: cannot be read, or is no longer UTF-8 text",
                    path.display()
                ),
            )
        })?;
        let counts = Counts::of(&text);
        tokio::time::sleep(args.pace).await;
        state.totals.add(counts);
        state.processed.push((index, fencing_token));
        state.next = index + 1;
        state.complete = state.next == files.len();
        let data = serde_json::to_vec(&state)
            .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot encode JSON: {e}")))?;
        leases
            .checkpoint(&token, data)
            .await
            .map_err(|e| lease_failure(e, "checkpoint not saved, nothing was written"))?;
        emit(&ChildEvent::Checkpoint {
            token: fencing_token,
            next: state.next,
            files: files.len(),
        })?;
    }
    emit(&ChildEvent::Complete {
        token: fencing_token,
        files: files.len(),
    })?;
    Ok(0)
}

fn emit(event: &ChildEvent) -> Result<(), Failure> {
    let mut line = serde_json::to_string(event)
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot encode JSON: {e}")))?;
    line.push('\n');
    write_stdout(line.as_bytes())
}

// ---------------------------------------------------------------------------
// The demo: files, workers, the kill, the report.

/// A text file of the demo's input, counted in the one direct pass.
struct TextFile {
    path: String,
    counts: Counts,
}

/// The text files under `root`, sorted by path, and how many files were
/// skipped (binary, not UTF-8, unreadable, or a path that is not UTF-8).
fn collect_text_files(root: &Path) -> Result<(Vec<TextFile>, usize), Failure> {
    let mut files = Vec::new();
    let mut skipped = 0;
    let mut dirs = vec![PathBuf::new()];
    while let Some(dir) = dirs.pop() {
        let entries = match std::fs::read_dir(root.join(&dir)) {
            Ok(entries) => entries,
            Err(e) if dir.as_os_str().is_empty() => {
                return Err(Failure::usage(format!(
                    "cannot read the directory {}: {e}",
                    root.display()
                )))
            }
            Err(_) => {
                skipped += 1;
                continue;
            }
        };
        for entry in entries {
            let Ok(entry) = entry else {
                skipped += 1;
                continue;
            };
            let name = entry.file_name();
            let path = dir.join(&name);
            // Symlinks are neither followed nor read: no loops, nothing
            // outside DIR.
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => {
                    if name != "target" && name != ".git" {
                        dirs.push(path);
                    }
                }
                Ok(kind) if kind.is_file() => match (path.to_str(), read_text(&root.join(&path))) {
                    (Some(name), Some(text)) => files.push(TextFile {
                        path: name.to_string(),
                        counts: Counts::of(&text),
                    }),
                    _ => skipped += 1,
                },
                Ok(_) => {}
                Err(_) => skipped += 1,
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((files, skipped))
}

/// `shards` ranges of consecutive indexes covering `0..files`, their sizes
/// differing by one at most.
fn split(files: usize, shards: usize) -> Vec<Range<usize>> {
    (0..shards)
        .map(|k| k * files / shards..(k + 1) * files / shards)
        .collect()
}

/// The directory the demo works on.
fn input_dir(dir: Option<PathBuf>) -> Result<PathBuf, Failure> {
    let dir = dir.unwrap_or_else(|| {
        let built_from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        if built_from.join("Cargo.toml").is_file() {
            built_from
        } else {
            PathBuf::from(".")
        }
    });
    std::fs::canonicalize(&dir).map_err(|e| Failure::usage(format!("DIR {}: {e}", dir.display())))
}

/// A private temporary directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn create() -> Result<Self, Failure> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let mut last = None;
        for attempt in 0..100u32 {
            let path = std::env::temp_dir().join(format!(
                "worklease-demo-{}-{}",
                std::process::id(),
                nanos + u128::from(attempt)
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(Self(path)),
                Err(e) => last = Some(e),
            }
        }
        Err(Failure::new(
            exit::IO,
            format!(
                "cannot create a scratch directory under {}: {}",
                std::env::temp_dir().display(),
                last.map_or_else(String::new, |e| e.to_string())
            ),
        ))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// SIGINT and SIGTERM, caught for the demo's clean-up.
struct Interrupts {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Interrupts {
    fn install() -> Result<Self, Failure> {
        use tokio::signal::unix::{signal, SignalKind};
        let failed =
            |e: std::io::Error| Failure::new(exit::SOFTWARE, format!("cannot catch signals: {e}"));
        Ok(Self {
            int: signal(SignalKind::interrupt()).map_err(failed)?,
            term: signal(SignalKind::terminate()).map_err(failed)?,
        })
    }

    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
        }
    }
}

/// `--store` checked and made absolute; `None` without `--store`.
fn given_store(given: Option<&str>) -> Result<Option<String>, Failure> {
    let Some(given) = given else {
        return Ok(None);
    };
    match url::parse(given)?.absolute() {
        StoreSpec::Memory => Err(Failure::usage(
            "--store memory: lives in one process, and the demo's workers are separate processes: \
             use sqlite:PATH",
        )),
        spec => Ok(Some(spec.to_url())),
    }
}

/// Whether the demo still has a `worklease run` to kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kill {
    /// `--no-kill`, or one worker only.
    Off,
    /// Waiting for a child to checkpoint a third of its shard.
    Armed,
    /// Sent; the killing worker learns whether it landed mid-shard.
    InFlight,
    /// A worker died in the middle of a shard.
    Done,
}

/// What every worker task shares.
struct Plan {
    exe: PathBuf,
    store_url: String,
    manifest: PathBuf,
    ttl: Duration,
    pace: Duration,
    /// The number of files of each shard.
    shard_files: Vec<usize>,
    workers: usize,
    kill: Mutex<Kill>,
    /// Workers still going over the shards.
    running: AtomicUsize,
    /// Cancelled when the demo is interrupted: the workers stop their
    /// `worklease run` and start no other.
    stop: CancellationToken,
}

impl Plan {
    /// True when the worker whose child just checkpointed `next` of `files`
    /// files is to be killed now: once, a third of the way into a shard,
    /// while another worker is still there to take the shard over.
    fn claim_kill(&self, next: usize, files: usize) -> bool {
        let Ok(mut kill) = self.kill.lock() else {
            return false;
        };
        let due = next >= (files / 3).max(1) && next < files;
        if *kill == Kill::Armed && due && self.running.load(Ordering::SeqCst) >= 2 {
            *kill = Kill::InFlight;
            return true;
        }
        false
    }

    /// The kill landed in the middle of a shard (done), or it did not and
    /// the next chance is taken.
    fn kill_landed(&self, mid_shard: bool) {
        if let Ok(mut kill) = self.kill.lock() {
            *kill = if mid_shard { Kill::Done } else { Kill::Armed };
        }
    }
}

/// What the worker tasks tell the demo.
enum Event {
    Child {
        worker: usize,
        shard: usize,
        event: ChildEvent,
    },
    KillSent {
        worker: usize,
        shard: usize,
        pid: u32,
        next: usize,
        files: usize,
    },
    Killed {
        worker: usize,
        shard: usize,
        mid_shard: bool,
    },
    KillMissed {
        worker: usize,
        shard: usize,
    },
    RunFailed {
        worker: usize,
        shard: usize,
        status: String,
        stderr: String,
    },
    Finished {
        worker: usize,
        unconfirmed: usize,
    },
}

/// How one `worklease run` of a worker ended.
enum Outcome {
    /// The child saw the shard complete, or completed it.
    Complete,
    /// It failed; the worker tries the shard again on its next pass.
    Incomplete,
    /// The demo killed it: the worker is gone.
    Killed,
    /// The demo was interrupted: the worker stops.
    Stopped,
}

/// A worker: goes over the shards, starting at its own, running one
/// `worklease run` per shard, until it has seen every shard complete (at
/// most [`PASSES`] times over) or it is killed.
async fn worker(plan: Arc<Plan>, worker: usize, events: mpsc::UnboundedSender<Event>) {
    let n = plan.shard_files.len();
    let first = worker * n / plan.workers;
    let mut todo: Vec<usize> = (0..n).map(|i| (first + i) % n).collect();
    for _ in 0..PASSES {
        let mut left = Vec::new();
        for &shard in &todo {
            if plan.stop.is_cancelled() {
                plan.running.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            match run_shard(&plan, worker, shard, &events).await {
                Outcome::Complete => {}
                Outcome::Incomplete => left.push(shard),
                Outcome::Killed | Outcome::Stopped => {
                    plan.running.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
            }
        }
        todo = left;
        if todo.is_empty() {
            break;
        }
    }
    plan.running.fetch_sub(1, Ordering::SeqCst);
    let _ = events.send(Event::Finished {
        worker,
        unconfirmed: todo.len(),
    });
}

/// One `worklease run --wait ... demo/shard-K -- worklease demo-shard ...`.
async fn run_shard(
    plan: &Plan,
    worker: usize,
    shard: usize,
    events: &mpsc::UnboundedSender<Event>,
) -> Outcome {
    let mut cmd = tokio::process::Command::new(&plan.exe);
    cmd.arg("run")
        .arg("--store")
        .arg(&plan.store_url)
        .args(["--wait", "--ttl", &millis(plan.ttl), "--poll", POLL])
        .args(["--holder", &holder(worker), &work_id(shard)])
        .arg("--")
        .arg(&plan.exe)
        .args(["demo-shard", "--shard", &shard.to_string()])
        .args(["--pace", &millis(plan.pace), "--manifest"])
        .arg(&plan.manifest)
        .env_remove("WORKLEASE_TOKEN")
        .env_remove("WORKLEASE_STORE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let failed = |status: String, stderr: String| {
        let _ = events.send(Event::RunFailed {
            worker,
            shard,
            status,
            stderr,
        });
        Outcome::Incomplete
    };
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => return failed(format!("cannot start: {e}"), String::new()),
    };
    let pid = child.id().unwrap_or(0);
    let stderr = child.stderr.take().map(|mut pipe| {
        tokio::spawn(async move {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text).await;
            text
        })
    });

    // The child's lines, until both `worklease run` and the child are gone.
    let mut complete = false;
    let mut killed = false;
    if let Some(stdout) = child.stdout.take() {
        let mut lines = BufReader::new(stdout).lines();
        loop {
            let line = tokio::select! {
                line = lines.next_line() => line,
                _ = plan.stop.cancelled() => {
                    stop_run(&mut child).await;
                    return Outcome::Stopped;
                }
            };
            let Ok(Some(line)) = line else {
                break;
            };
            let Ok(event) = serde_json::from_str::<ChildEvent>(&line) else {
                continue;
            };
            let kill_now = match &event {
                ChildEvent::Start { complete: true, .. } | ChildEvent::Complete { .. } => {
                    complete = true;
                    None
                }
                ChildEvent::Checkpoint { next, files, .. }
                    if !killed && plan.claim_kill(*next, *files) =>
                {
                    Some((*next, *files))
                }
                _ => None,
            };
            let _ = events.send(Event::Child {
                worker,
                shard,
                event,
            });
            if let Some((next, files)) = kill_now {
                // SIGKILL: `worklease run` cannot release the lease, and its
                // child gets SIGKILL from the kernel as it dies.
                let _ = child.start_kill();
                killed = true;
                let _ = events.send(Event::KillSent {
                    worker,
                    shard,
                    pid,
                    next,
                    files,
                });
            }
        }
    }
    let status = child.wait().await;
    let stderr = match stderr {
        Some(task) => task.await.unwrap_or_default(),
        None => String::new(),
    };

    if killed {
        if matches!(&status, Ok(s) if s.signal() == Some(Signal::SIGKILL as i32)) {
            plan.kill_landed(!complete);
            let _ = events.send(Event::Killed {
                worker,
                shard,
                mid_shard: !complete,
            });
            return Outcome::Killed;
        }
        // `worklease run` had ended already: the next chance is taken.
        plan.kill_landed(false);
        let _ = events.send(Event::KillMissed { worker, shard });
    }
    match status {
        Ok(s) if s.success() && complete => Outcome::Complete,
        Ok(s) => failed(format!("exit status {}", exit::of_status(s)), stderr),
        Err(e) => failed(format!("cannot wait for it: {e}"), stderr),
    }
}

/// Stops an interrupted worker's `worklease run`: SIGTERM, which it
/// forwards to its child before releasing the lease; SIGKILL if it has not
/// ended within a few seconds. Returns once it has ended.
async fn stop_run(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGTERM);
    }
    if tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .is_err()
    {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

/// A hand-off the demo saw a child resume from: the previous holder did not
/// release.
struct Resume {
    worker: usize,
    shard: usize,
    token: u64,
    next: usize,
    files: usize,
    previous: Previous,
}

/// What the demo remembers of the run for its report.
#[derive(Default)]
struct Record {
    resumes: Vec<Resume>,
    /// `(worker, shard, checkpointed files when the SIGKILL was sent)` of
    /// the kill that landed mid-shard.
    kill: Option<(usize, usize, usize)>,
    /// The last kill sent, until it is known to have landed.
    kill_sent: Option<(usize, usize, usize)>,
    failures: usize,
}

/// Runs `worklease demo`.
pub async fn demo(args: DemoArgs) -> Result<u8, Failure> {
    let started = Instant::now();
    let given_store = given_store(args.store.as_deref())?;
    let root = input_dir(args.dir)?;
    let (files, skipped) = collect_text_files(&root)?;
    if files.is_empty() {
        return Err(Failure::usage(format!(
            "no text files under {} ({skipped} skipped: binary, not UTF-8 or unreadable)",
            root.display()
        )));
    }
    let n_shards = usize::from(args.shards).min(files.len());
    let ranges = split(files.len(), n_shards);
    if ranges.iter().any(|r| r.len() > MAX_FILES_PER_SHARD) {
        return Err(Failure::usage(format!(
            "{} files in {n_shards} shards: over {MAX_FILES_PER_SHARD} files per shard would not fit \
             in a checkpoint; pass more --shards",
            files.len()
        )));
    }
    let workers = usize::from(args.workers);
    check_lease_args(VERIFIER, args.ttl, None)?;
    // From here on, SIGINT and SIGTERM stop the workers and remove the
    // scratch directory before the demo exits with 128 + N.
    let mut interrupts = Interrupts::install()?;
    let scratch = Scratch::create()?;
    let store_url = given_store
        .clone()
        .unwrap_or_else(|| StoreSpec::Sqlite(scratch.path().join("leases.db")).to_url());
    let store = url::open(&store_url)?;
    let exe = std::env::current_exe().map_err(|e| {
        Failure::new(
            exit::SOFTWARE,
            format!("cannot find the worklease executable: {e}"),
        )
    })?;

    let run = format!(
        "{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let manifest = Manifest {
        run: run.clone(),
        root: root.clone(),
        shards: ranges
            .iter()
            .map(|r| files[r.clone()].iter().map(|f| f.path.clone()).collect())
            .collect(),
    };
    let manifest_path = scratch.path().join("manifest.json");
    serde_json::to_vec(&manifest)
        .map_err(|e| e.to_string())
        .and_then(|data| std::fs::write(&manifest_path, data).map_err(|e| e.to_string()))
        .map_err(|e| {
            Failure::new(
                exit::IO,
                format!("cannot write {}: {e}", manifest_path.display()),
            )
        })?;

    let kill = if args.no_kill {
        Kill::Off
    } else if workers < 2 {
        say("note: with one worker there is nobody to take a shard over: no kill");
        Kill::Off
    } else {
        Kill::Armed
    };
    let plan = Arc::new(Plan {
        exe,
        store_url: store_url.clone(),
        manifest: manifest_path,
        ttl: args.ttl,
        pace: args.pace,
        shard_files: ranges.iter().map(Range::len).collect(),
        workers,
        kill: Mutex::new(kill),
        running: AtomicUsize::new(workers),
        stop: CancellationToken::new(),
    });

    print_plan(&plan, &root, &files, skipped, given_store.is_none(), kill);

    let (tx, mut rx) = mpsc::unbounded_channel();
    let tasks: Vec<_> = (0..workers)
        .map(|w| tokio::spawn(worker(Arc::clone(&plan), w, tx.clone())))
        .collect();
    drop(tx);
    let mut record = Record::default();
    let mut interrupted = None;
    loop {
        let event = tokio::select! {
            event = rx.recv() => event,
            sig = interrupts.recv(), if interrupted.is_none() => {
                interrupted = Some(sig);
                say(format!(
                    "[{:>5.2}s] {sig}: stopping the workers",
                    started.elapsed().as_secs_f64()
                ));
                plan.stop.cancel();
                continue;
            }
        };
        let Some(event) = event else {
            break;
        };
        if interrupted.is_some() {
            continue; // the timeline of an interrupted demo is over
        }
        let line = describe(&plan, &mut record, event);
        if let Some(line) = line {
            say(format!(
                "[{:>5.2}s] {line}",
                started.elapsed().as_secs_f64()
            ));
        }
    }
    for task in tasks {
        let _ = task.await;
    }
    if let Some(sig) = interrupted {
        drop(store);
        let removed = given_store.is_none();
        let scratch_path = scratch.path().display().to_string();
        drop(scratch);
        eprintln!(
            "worklease: demo interrupted by {sig}: workers stopped; scratch directory {scratch_path} removed{}",
            if removed { " with its store" } else { "" }
        );
        return Ok(128 + sig as u8);
    }

    say("");
    let finals = read_final_checkpoints(store, &plan).await?;
    let ok = report(&plan, &run, &files, &ranges, &finals, &record);
    say(format!(
        "({:.1}s; store {})",
        started.elapsed().as_secs_f64(),
        given_store.map_or_else(|| "removed".to_string(), |u| url::redact(&u))
    ));
    Ok(if ok { 0 } else { 1 })
}

fn print_plan(
    plan: &Plan,
    root: &Path,
    files: &[TextFile],
    skipped: usize,
    scratch_store: bool,
    kill: Kill,
) {
    let bytes: u64 = files.iter().map(|f| f.counts.bytes).sum();
    let n = plan.shard_files.len();
    let min = plan.shard_files.iter().min().copied().unwrap_or(0);
    let max = plan.shard_files.iter().max().copied().unwrap_or(0);
    let sizes = if min == max {
        format!("{min}")
    } else {
        format!("{min}-{max}")
    };
    say(format!(
        "worklease demo: {} ({bytes} bytes) under {}; {} skipped \
         (binary, not UTF-8 or unreadable; target/ and .git/ not searched)",
        count(files.len(), "text file"),
        root.display(),
        count(skipped, "file"),
    ));
    let ids = if n == 1 {
        format!("work ID {}", work_id(0))
    } else {
        format!("work IDs {} .. {}", work_id(0), work_id(n - 1))
    };
    let of = if max == 1 { "file" } else { "files" };
    say(format!("  {} of {sizes} {of}: {ids}", count(n, "shard")));
    say(format!(
        "  store: {}{}",
        url::redact(&plan.store_url),
        if scratch_store {
            " (fresh, removed at the end)"
        } else {
            ""
        }
    ));
    if plan.workers == 1 {
        say(format!(
            "  1 worker, {}; it runs, shard after shard:",
            holder(0)
        ));
    } else {
        say(format!(
            "  {} workers, {} .. {}; each runs, shard after shard:",
            plan.workers,
            holder(0),
            holder(plan.workers - 1)
        ));
    }
    say(format!(
        "    worklease run --wait --ttl {} --poll {POLL} --holder worker-N demo/shard-K -- worklease demo-shard ...",
        humantime::format_duration(plan.ttl)
    ));
    say(format!(
        "  the child checkpoints after every file ({} per file){}",
        humantime::format_duration(plan.pace),
        if kill == Kill::Armed {
            "; the first worker whose child has checkpointed a third of a shard gets SIGKILL"
        } else {
            "; no worker is killed"
        }
    ));
    say("");
}

/// The timeline line of an event (`None`: not shown), and what the report
/// needs of it.
fn describe(plan: &Plan, record: &mut Record, event: Event) -> Option<String> {
    match event {
        Event::Child {
            worker,
            shard,
            event,
        } => match event {
            ChildEvent::Start {
                complete: true,
                token,
                ..
            } => Some(format!(
                "{} found {} complete (fencing token {token}): nothing to do",
                holder(worker),
                work_id(shard)
            )),
            ChildEvent::Start {
                token,
                next,
                files,
                clean_handoff,
                previous,
                discarded,
                ..
            } => {
                let mut line = format!(
                    "{} took {} (fencing token {token}): ",
                    holder(worker),
                    work_id(shard)
                );
                if next == 0 {
                    line.push_str(&format!("{files} files, from the start"));
                } else {
                    line.push_str(&format!(
                        "resuming from the checkpoint at file {next} of {files}"
                    ));
                }
                if let Some(p) = &previous {
                    line.push_str(&format!(
                        "; clean hand-off: {} (previous holder {}, fencing token {}, {})",
                        if clean_handoff { "yes" } else { "no" },
                        p.holder,
                        p.token,
                        p.ended
                    ));
                }
                if let Some(why) = discarded {
                    line.push_str(&format!("; a checkpoint {why} was not resumed"));
                }
                if let (false, Some(previous)) = (clean_handoff, previous) {
                    record.resumes.push(Resume {
                        worker,
                        shard,
                        token,
                        next,
                        files,
                        previous,
                    });
                }
                Some(line)
            }
            ChildEvent::Checkpoint { .. } => None,
            ChildEvent::Complete { token, files } => Some(format!(
                "{} completed {} (fencing token {token}): {files} files checkpointed",
                holder(worker),
                work_id(shard)
            )),
        },
        Event::KillSent {
            worker,
            shard,
            pid,
            next,
            files,
        } => {
            record.kill_sent = Some((worker, shard, next));
            Some(format!(
                "SIGKILL to {}'s `worklease run` (pid {pid}) on {}: its child has just checkpointed \
                 {next} of {files} files",
                holder(worker),
                work_id(shard)
            ))
        }
        Event::Killed {
            worker,
            shard,
            mid_shard,
        } => {
            if mid_shard {
                record.kill = record.kill_sent.take();
            }
            Some(format!(
                "{} is dead: its `worklease run` ended by SIGKILL and its child's output ended with it; \
                 nobody released {}, whose lease runs out within the TTL ({}){}",
                holder(worker),
                work_id(shard),
                humantime::format_duration(plan.ttl),
                if mid_shard {
                    ""
                } else {
                    " (the shard had just been completed: the demo kills again)"
                }
            ))
        }
        Event::KillMissed { worker, shard } => Some(format!(
            "the SIGKILL came too late: {}'s run on {} had ended; the demo kills again",
            holder(worker),
            work_id(shard)
        )),
        Event::RunFailed {
            worker,
            shard,
            status,
            stderr,
        } => {
            record.failures += 1;
            let stderr = stderr.trim();
            Some(format!(
                "{}'s `worklease run` on {} failed ({status}){}{}: it tries again later",
                holder(worker),
                work_id(shard),
                if stderr.is_empty() { "" } else { ": " },
                stderr.replace('\n', " | ")
            ))
        }
        Event::Finished {
            worker,
            unconfirmed,
        } => Some(if unconfirmed == 0 {
            format!("{} has seen every shard complete: done", holder(worker))
        } else {
            format!(
                "{} gives up with {unconfirmed} shards it could not see complete",
                holder(worker)
            )
        }),
    }
}

/// Each shard's final checkpoint, read under a lease of its own (holder
/// [`VERIFIER`]): the result of the shard, or why there is none.
async fn read_final_checkpoints(
    store: Arc<dyn LeaseStore>,
    plan: &Plan,
) -> Result<Vec<Result<ShardState, String>>, Failure> {
    let leases = Leases::new(store, Config::new(VERIFIER, plan.ttl))?;
    // A shard whose last holder died is free once its lease runs out.
    let options = AcquireOptions::new()
        .wait_for_lease()
        .poll_interval(Duration::from_millis(100))
        .wait_timeout(plan.ttl * 2 + Duration::from_secs(2));
    let mut finals = Vec::new();
    for shard in 0..plan.shard_files.len() {
        let token = match leases.acquire(&work_id(shard), options.clone()).await {
            Ok(token) => token,
            Err(e) => {
                finals.push(Err(format!("cannot take the lease to read it: {e}")));
                continue;
            }
        };
        let read = leases.read_checkpoint(&token).await;
        if let Err(e) = leases.release(token).await {
            tracing::warn!(error = %e, "cannot release the verifier's lease");
        }
        finals.push(match read {
            Err(e) => Err(format!("cannot read the checkpoint: {e}")),
            Ok(c) => match c.data {
                None => Err("no checkpoint".to_string()),
                Some(data) => serde_json::from_slice::<ShardState>(&data)
                    .map_err(|e| format!("the checkpoint is not a shard's state: {e}")),
            },
        });
    }
    Ok(finals)
}

/// `worker-1 (fencing token 1): files 0-2; worker-3 (fencing token 4):
/// files 3-7`: who processed which files, in file order.
fn processed_by(state: &ShardState) -> String {
    let mut runs: Vec<(u64, usize, usize)> = Vec::new();
    for &(index, token) in &state.processed {
        match runs.last_mut() {
            Some((t, _, last)) if *t == token && *last + 1 == index => *last = index,
            _ => runs.push((token, index, index)),
        }
    }
    runs.iter()
        .map(|&(token, first, last)| {
            let who = state.holders.get(&token).map_or("?", String::as_str);
            let which = if first == last {
                format!("file {first}")
            } else {
                format!("files {first}-{last}")
            };
            format!("{who} (fencing token {token}): {which}")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The problems of one shard's final checkpoint against the direct pass.
fn check_shard(
    run: &str,
    shard: usize,
    range: &Range<usize>,
    files: &[TextFile],
    state: &ShardState,
) -> Vec<String> {
    let mut problems = Vec::new();
    let n = range.len();
    if state.demo != run || state.shard != shard || state.files != n {
        problems.push(format!(
            "the checkpoint is of another run or shard (run {}, shard {}, {} files)",
            state.demo, state.shard, state.files
        ));
        return problems;
    }
    if !state.complete || state.next != n {
        problems.push(format!("not complete: {} of {n} files done", state.next));
    }
    let mut times = vec![0usize; n];
    for &(index, token) in &state.processed {
        match times.get_mut(index) {
            Some(t) => *t += 1,
            None => problems.push(format!(
                "file index {index} (fencing token {token}) is not in the shard"
            )),
        }
    }
    for (index, &t) in times.iter().enumerate() {
        if t != 1 {
            problems.push(format!(
                "file index {index} ({}) processed {t} times",
                files[range.start + index].path
            ));
        }
    }
    let mut direct = Counts::default();
    for file in &files[range.clone()] {
        direct.add(file.counts);
    }
    if state.totals != direct {
        problems.push(format!(
            "totals {:?} differ from the direct pass {:?}",
            state.totals, direct
        ));
    }
    problems
}

/// Prints the per-shard results, the resumed shards and the check; true
/// when every shard was processed exactly once to completion.
fn report(
    plan: &Plan,
    run: &str,
    files: &[TextFile],
    ranges: &[Range<usize>],
    finals: &[Result<ShardState, String>],
    record: &Record,
) -> bool {
    say("Shards (each one's result is its final checkpoint):");
    say(format!(
        "  {:<14} {:>6} {:>8} {:>9} {:>10}  PROCESSED BY",
        "WORK ID", "FILES", "LINES", "WORDS", "BYTES"
    ));
    let mut problems = Vec::new();
    let mut total = Counts::default();
    for (shard, (range, state)) in ranges.iter().zip(finals).enumerate() {
        match state {
            Ok(state) => {
                say(format!(
                    "  {:<14} {:>6} {:>8} {:>9} {:>10}  {}",
                    work_id(shard),
                    state.processed.len(),
                    state.totals.lines,
                    state.totals.words,
                    state.totals.bytes,
                    processed_by(state)
                ));
                total.add(state.totals);
                for p in check_shard(run, shard, range, files, state) {
                    problems.push(format!("{}: {p}", work_id(shard)));
                }
            }
            Err(why) => {
                say(format!("  {:<14} {why}", work_id(shard)));
                problems.push(format!("{}: {why}", work_id(shard)));
            }
        }
    }
    say(format!(
        "  {:<14} {:>6} {:>8} {:>9} {:>10}",
        "total",
        finals
            .iter()
            .flatten()
            .map(|s| s.processed.len())
            .sum::<usize>(),
        total.lines,
        total.words,
        total.bytes
    ));

    say("");
    if record.resumes.is_empty() {
        say("No shard was resumed after an unclean hand-off.");
    } else {
        say("Resumed after an unclean hand-off:");
    }
    for r in &record.resumes {
        let killed = record
            .kill
            .is_some_and(|(w, s, _)| s == r.shard && holder(w) == r.previous.holder);
        say(format!(
            "  resumed: {} by {} with fencing token {} (> {}), from the checkpoint at file {} of {}; \
             clean hand-off: no (previous holder {}, fencing token {}, {}{})",
            work_id(r.shard),
            holder(r.worker),
            r.token,
            r.previous.token,
            r.next,
            r.files,
            r.previous.holder,
            r.previous.token,
            r.previous.ended,
            if killed { " after its SIGKILL" } else { "" }
        ));
        if r.token <= r.previous.token {
            problems.push(format!(
                "{}: the fencing token did not go up ({} after {})",
                work_id(r.shard),
                r.token,
                r.previous.token
            ));
        }
    }
    if let Some((w, s, next)) = record.kill {
        say(format!(
            "  {} had reported {next} files checkpointed on {} before its SIGKILL; a file its child \
             counted after that checkpoint, if any, was counted again by the next holder, and \
             appears once in the result",
            holder(w),
            work_id(s)
        ));
    } else if plan.kill.lock().map_or(Kill::Off, |k| *k) != Kill::Off {
        say("  note: no SIGKILL landed in the middle of a shard (each run finished first; try a larger --pace)");
    }
    if record.failures > 0 {
        say(format!(
            "  note: {} runs failed and were tried again (see above)",
            record.failures
        ));
    }

    say("");
    let direct = files.iter().fold(Counts::default(), |mut c, f| {
        c.add(f.counts);
        c
    });
    say(format!(
        "Check against a direct single pass over the same {} files: {} lines, {} words, {} bytes",
        files.len(),
        direct.lines,
        direct.words,
        direct.bytes
    ));
    if total != direct {
        problems.push(format!(
            "the shards' totals {total:?} differ from the direct pass {direct:?}"
        ));
    }
    if problems.is_empty() {
        say(format!(
            "  every shard's final checkpoint is complete, lists each of its files exactly once, \
             and its totals equal the direct pass ({} shards, {} files)",
            ranges.len(),
            files.len()
        ));
        say("OK: every shard processed exactly once to completion");
        true
    } else {
        for p in &problems {
            say(format!("  {p}"));
        }
        say(format!(
            "FAILED: {} problems: not every shard was processed exactly once to completion",
            problems.len()
        ));
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_wc_counts() {
        assert_eq!(
            Counts::of("one two\nthree\n\n  four"),
            Counts {
                lines: 3,
                words: 4,
                bytes: 21
            }
        );
        assert_eq!(Counts::of(""), Counts::default());
    }

    #[test]
    fn shards_cover_every_file_once_in_order() {
        for files in 1..40 {
            for shards in 1..=files.min(9) {
                let ranges = split(files, shards);
                assert_eq!(ranges.len(), shards);
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[shards - 1].end, files);
                for pair in ranges.windows(2) {
                    assert_eq!(pair[0].end, pair[1].start);
                }
                assert!(ranges.iter().all(|r| !r.is_empty()));
            }
        }
    }

    #[test]
    fn processed_by_groups_runs_of_one_token() {
        let mut state = ShardState::fresh("r", 0, 5);
        state.processed = vec![(0, 1), (1, 1), (2, 4), (3, 4), (4, 4)];
        state.holders = [(1, "worker-1".to_string()), (4, "worker-3".to_string())].into();
        assert_eq!(
            processed_by(&state),
            "worker-1 (fencing token 1): files 0-1; worker-3 (fencing token 4): files 2-4"
        );
    }

    #[test]
    fn the_check_finds_a_file_processed_twice() {
        let files: Vec<TextFile> = ["a", "b"]
            .iter()
            .map(|t| TextFile {
                path: (*t).to_string(),
                counts: Counts::of(t),
            })
            .collect();
        let mut state = ShardState::fresh("r", 0, 2);
        state.next = 2;
        state.complete = true;
        state.processed = vec![(0, 1), (0, 2), (1, 2)];
        state.totals = Counts {
            lines: 0,
            words: 3,
            bytes: 3,
        };
        let problems = check_shard("r", 0, &(0..2), &files, &state);
        assert!(problems.iter().any(|p| p.contains("processed 2 times")));
        assert!(problems.iter().any(|p| p.contains("differ")));
    }
}
