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
//! The child reports on stdout, one JSON object per line
//! ([`ChildEvent`](protocol::ChildEvent)); `worklease run` passes its stdout
//! through. The demo synchronises on these lines only: the SIGKILL follows
//! the line of a checkpoint, and a worker learns that a shard is complete
//! from its child.
//!
//! The parts: `input` (the files under DIR, their shards, the store and the
//! scratch directory), `protocol` (the manifest, the checkpoint and the
//! child's lines), `child` (`demo-shard`), `worker` (the workers and the
//! kill), `timeline` (what the demo prints while it runs) and `report` (the
//! final checkpoints and the check); [`demo`] here runs them.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use worklease::store::url::{self, StoreSpec};

use crate::exit::{self, Failure};
use crate::run::check_lease_args;
use crate::say::say;
use crate::status::write_stdout;

mod child;
mod input;
mod protocol;
mod report;
mod timeline;
mod worker;

pub use child::{demo_shard, DemoShardArgs};
use input::{collect_text_files, given_store, input_dir, split, Scratch, TextFile};
use protocol::Manifest;
use report::{read_final_checkpoints, report};
use timeline::{describe, print_plan, Record};
use worker::{worker, Kill, Plan};

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
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = crate::parse_ttl, allow_hyphen_values = true)]
    ttl: Duration,

    /// Time the child takes per file on top of reading it, so that the
    /// SIGKILL lands in the middle of a shard.
    #[arg(long, value_name = "DURATION", default_value = "20ms", value_parser = crate::parse_duration, allow_hyphen_values = true)]
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
        say!(
            "demo interrupted by {sig}: workers stopped; scratch directory {scratch_path} removed{}",
            if removed { " with its store" } else { "" }
        );
        return Ok(128 + sig as u8);
    }

    say("");
    let finals = read_final_checkpoints(store, &plan).await?;
    let ok = report(&plan, &run, &files, &ranges, &finals, &record);
    if !ok {
        // The check compares the workers' counts with a pass made before
        // they started: a tree that changed meanwhile fails it whatever
        // the leases did.
        let changed = changed_files(&root, &files);
        if changed > 0 {
            say(format!(
                "  ({changed} file(s) under {} changed while the demo ran: the check counts the \
                 files as they were before it started, and the workers read them later. Run it \
                 on a tree nothing writes to, or on a copy.)",
                root.display()
            ));
        }
    }
    say(format!(
        "({:.1}s; store {})",
        started.elapsed().as_secs_f64(),
        given_store.map_or_else(|| "removed".to_string(), |u| url::redact(&u))
    ));
    Ok(if ok { 0 } else { 1 })
}

/// How many of `files` (counted before the run) read differently now, are
/// gone, or have been joined by new text files under `root`.
fn changed_files(root: &std::path::Path, files: &[TextFile]) -> usize {
    let Ok((now, _)) = collect_text_files(root) else {
        return 0;
    };
    let before: std::collections::HashMap<&str, _> =
        files.iter().map(|f| (f.path.as_str(), f.counts)).collect();
    let same = now
        .iter()
        .filter(|f| before.get(f.path.as_str()) == Some(&f.counts))
        .count();
    let added = now
        .iter()
        .filter(|f| !before.contains_key(f.path.as_str()))
        .count();
    (files.len() - same) + added
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

/// Writes one line to stdout; a closed stdout (`| head`) is not an error.
fn say(line: impl AsRef<str>) {
    let mut text = line.as_ref().to_string();
    text.push('\n');
    let _ = write_stdout(text.as_bytes());
}
