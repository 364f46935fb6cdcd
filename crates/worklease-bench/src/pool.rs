//! Pool coverage (issue 17's CLI target): three real `worklease pool`
//! processes share N work IDs on a fresh SQLite file, with the child of
//! `crates/worklease-cli/tests/pool_scale.rs` (it appends
//! `$WORKLEASE_WORK_ID $WORKLEASE_FENCING_TOKEN` to `$D/starts`, then
//! `exec sleep 3600`, so one process per work ID stays). Measured: the
//! time from starting the pools until every work ID's child has started,
//! in rounds (a round is TTL/3, the pools' renewal and rebalancing
//! interval; a pool's first round only writes its membership, so no child
//! starts before one round); then, over a window, the work IDs whose
//! child started more than once and the warnings the pools logged (lost
//! leases among them).
//!
//! **The baseline**, in the same run: this program spawning the same N
//! children directly (std's `Command`, which is `posix_spawn` here: no
//! `pre_exec`, no working directory) of `/bin/sh child.sh` with the same
//! environment variables, each in a process group of its own; the time
//! from the first spawn until every child has started. It is the
//! machine's floor for starting N processes: if even it takes more than 3
//! rounds, so must the pools.
//!
//! The `worklease` binary is found beside this program
//! (`cargo build --release -p worklease-cli -p worklease-bench` builds
//! both); without it the scenario is skipped, saying so. Every process
//! group started is killed at the end (also on an error), and `/proc` is
//! searched for any process of the measurement left ([`crate::procs`]).

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::procs::Procs;
use crate::results::PoolRow;
use crate::stores::Bench;
use crate::{Plan, Result};

/// The child: records its start, then stays (as in `pool_scale.rs`).
const CHILD: &str =
    "echo \"$WORKLEASE_WORK_ID $WORKLEASE_FENCING_TOKEN\" >> \"$D/starts\"; exec sleep 3600\n";

/// How often the starts file is read.
const POLL: Duration = Duration::from_millis(10);

/// How long the processes have to be gone after they were killed.
const GRACE: Duration = Duration::from_secs(10);

/// The `worklease` binary beside this program, or why there is none.
fn worklease_binary() -> std::result::Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let bin = exe.with_file_name("worklease");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "the worklease binary is not beside this program ({}): build it with `cargo build{} -p worklease-cli`",
            bin.display(),
            if cfg!(debug_assertions) { "" } else { " --release" }
        ))
    }
}

/// The pool scenario on one store (SQLite only: issue 17's target). `Ok(Some(why))`
/// when it was skipped.
pub async fn scenario(
    bench: &dyn Bench,
    plan: &Plan,
    rows: &mut Vec<PoolRow>,
) -> Result<Option<String>> {
    if bench.name() != "sqlite" {
        return Ok(None);
    }
    let bin = match worklease_binary() {
        Ok(b) => b,
        Err(why) => return Ok(Some(why)),
    };
    for &(n, ttl) in &plan.pool_sizes {
        let url = bench.open(&format!("pool_{n}")).await?.url;
        let m = Measurement {
            bin: &bin,
            url: &url,
            dir: tempfile::Builder::new()
                .prefix("worklease-bench-pool-")
                .tempdir()?,
            n,
            ttl,
            processes: plan.pool_processes,
            window: plan.pool_window,
            limit: (ttl / 3) * plan.pool_limit_rounds,
            mark: format!("{}-{:08x}-{n}", std::process::id(), rand::random::<u32>()),
        };
        let row = m.run().await?;
        eprintln!(
            "  pool {n} work IDs, TTL {ttl:?}: ours {} ({}), baseline {} ({}); ours / baseline {}; {} restarts, {} warnings ({} lost leases), {} pools exited, {} processes left{}",
            secs(row.coverage_secs),
            rounds(row.coverage_rounds()),
            secs(row.baseline_secs),
            rounds(row.baseline_rounds()),
            row.ratio().map_or("-".into(), |r| format!("{r:.2} ×")),
            row.restarts,
            row.warnings,
            row.lost_leases,
            row.pools_exited,
            row.leftover,
            crate::scenarios::errors_note(u64::from(row.first_error.is_some()), row.first_error.as_deref()),
        );
        rows.push(row);
    }
    Ok(None)
}

fn secs(s: Option<f64>) -> String {
    s.map_or("not all within the limit".into(), |s| format!("{s:.2} s"))
}

fn rounds(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2} rounds"))
}

/// One size of the scenario.
struct Measurement<'a> {
    bin: &'a Path,
    url: &'a str,
    /// `ids.txt`, `child.sh`, `starts`, the pools' stderr.
    dir: tempfile::TempDir,
    n: usize,
    ttl: Duration,
    processes: usize,
    window: Duration,
    limit: Duration,
    /// The mark of this measurement's processes.
    mark: String,
}

impl Measurement<'_> {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn id(i: usize) -> String {
        format!("job-{i:05}")
    }

    async fn run(&self) -> Result<PoolRow> {
        let ids: Vec<String> = (0..self.n).map(Self::id).collect();
        std::fs::write(self.path("ids.txt"), ids.join("\n") + "\n")?;
        std::fs::write(self.path("child.sh"), CHILD)?;
        let round = self.ttl / 3;
        let mut row = PoolRow {
            store: "sqlite".into(),
            work_ids: self.n,
            processes: self.processes,
            ttl_ms: self.ttl.as_millis() as u64,
            round_ms: round.as_millis() as u64,
            limit_secs: self.limit.as_secs_f64(),
            coverage_secs: None,
            started: 0,
            restarts: 0,
            warnings: 0,
            lost_leases: 0,
            pools_exited: 0,
            window_secs: self.window.as_secs_f64(),
            baseline_secs: None,
            baseline_started: 0,
            leftover: 0,
            first_error: None,
        };
        // The baseline first: the machine's floor, on a quiet machine.
        let (secs, started, left) = self.baseline().await?;
        row.baseline_secs = secs;
        row.baseline_started = started;
        row.leftover += left;
        std::fs::remove_file(self.path("starts")).or_else(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(e)
            }
        })?;
        self.pools(&mut row).await?;
        if row.leftover > 0 {
            row.first_error.get_or_insert_with(|| {
                format!(
                    "{} processes were still there after the cleanup",
                    row.leftover
                )
            });
        }
        Ok(row)
    }

    /// The environment of child `i`, as a pool gives it (with a made-up
    /// token).
    fn child_env(&self, cmd: &mut Command, i: usize) {
        let id = Self::id(i);
        cmd.env("WORKLEASE_WORK_ID", &id)
            .env("WORKLEASE_HOLDER_ID", "bench-spawn")
            .env("WORKLEASE_FENCING_TOKEN", (i + 1).to_string())
            .env("WORKLEASE_TOKEN", format!("{id}@bench-spawn#{}", i + 1))
            .env("WORKLEASE_STORE", self.url)
            .env("D", self.dir.path());
    }

    /// This program spawning the N children: (seconds until all started,
    /// children started, processes left after the cleanup).
    async fn baseline(&self) -> Result<(Option<f64>, usize, usize)> {
        let (tx, rx) = std::sync::mpsc::channel::<Procs>();
        // Set when a spawn failed: the wait ends.
        let failed = Arc::new(AtomicBool::new(false));
        let script = self.path("child.sh");
        let started = Instant::now();
        let deadline = started + self.limit;
        let spawner = {
            let envs: Vec<Command> = (0..self.n)
                .map(|i| {
                    let mut cmd = Command::new("/bin/sh");
                    cmd.arg(&script)
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null());
                    self.child_env(&mut cmd, i);
                    cmd
                })
                .collect();
            let mark = format!("{}-spawn", self.mark);
            let deadline = deadline.into_std();
            let failed = failed.clone();
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                let mut procs = Procs::new(mark);
                let mut result = Ok(());
                for mut cmd in envs {
                    if std::time::Instant::now() >= deadline {
                        break;
                    }
                    if let Err(e) = procs.spawn(&mut cmd) {
                        failed.store(true, Ordering::Relaxed);
                        result = Err(e);
                        break;
                    }
                }
                // Handed back whatever happened, so that they are killed.
                let _ = tx.send(procs);
                result
            })
        };
        let mut starts = Starts::new(self.path("starts"));
        let all = starts
            .wait_for(self.n, deadline, || failed.load(Ordering::Relaxed))
            .await?;
        let secs = all.then(|| started.elapsed().as_secs_f64());
        let spawned = spawner.await?;
        let procs = rx.recv().map_err(|_| "the spawning thread ended early")?;
        let left = tokio::task::spawn_blocking(move || procs.end(GRACE)).await?;
        spawned?;
        Ok((secs, starts.counts.len(), left))
    }

    /// The pools: coverage, then the window; fills `row`.
    async fn pools(&self, row: &mut PoolRow) -> Result<()> {
        let mut procs = Procs::new(self.mark.clone());
        let started = Instant::now();
        for i in 0..self.processes {
            let holder = format!("bench-pool-{i}");
            let stderr = std::fs::File::create(self.path(&format!("{holder}.stderr")))?;
            procs.spawn(
                Command::new(self.bin)
                    .args(["pool", "--holder", &holder, "--pool-name", "bench"])
                    .args(["--ttl", &format!("{}ms", self.ttl.as_millis())])
                    .arg("--work-ids-file")
                    .arg(self.path("ids.txt"))
                    .arg("--")
                    .arg("sh")
                    .arg(self.path("child.sh"))
                    .env("WORKLEASE_STORE", self.url)
                    .env("D", self.dir.path())
                    .env_remove("WORKLEASE_TOKEN")
                    .env_remove("WORKLEASE_HOME")
                    .env_remove("RUST_LOG")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(stderr),
            )?;
        }
        let mut starts = Starts::new(self.path("starts"));
        let deadline = started + self.limit;
        let all = starts
            .wait_for(self.n, deadline, || procs.exited() > 0)
            .await?;
        row.coverage_secs = all.then(|| started.elapsed().as_secs_f64());
        // The window: restarts and complaints after coverage.
        let window_end = Instant::now() + self.window;
        while Instant::now() < window_end && procs.exited() == 0 {
            tokio::time::sleep(Duration::from_millis(100).min(self.window)).await;
        }
        starts.read()?;
        row.pools_exited = procs.exited();
        row.started = starts.counts.len();
        row.restarts = starts.counts.values().filter(|&&c| c > 1).count();
        for i in 0..self.processes {
            let log = std::fs::read_to_string(self.path(&format!("bench-pool-{i}.stderr")))
                .unwrap_or_default();
            for line in log
                .lines()
                .filter(|l| l.contains(" WARN ") || l.contains("ERROR"))
            {
                row.warnings += 1;
                // A slot's lost lease (`on_slot_lost`), or a child stopped
                // because its lease was lost.
                if line.contains("lost") || line.contains("takes the work ID again") {
                    row.lost_leases += 1;
                }
            }
        }
        if row.pools_exited > 0 {
            row.first_error = Some(format!(
                "{} of the {} pools exited before the end (their stderr: {})",
                row.pools_exited,
                self.processes,
                self.path("bench-pool-0.stderr").display()
            ));
        }
        row.leftover += tokio::task::spawn_blocking(move || procs.end(GRACE)).await?;
        Ok(())
    }
}

/// The starts file, read as it grows: work ID → how many times its child
/// started.
struct Starts {
    path: PathBuf,
    offset: u64,
    partial: String,
    counts: HashMap<String, usize>,
}

impl Starts {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            offset: 0,
            partial: String::new(),
            counts: HashMap::new(),
        }
    }

    /// Reads the lines added since the last read (whole lines only: a
    /// child may be writing the last one).
    fn read(&mut self) -> Result<()> {
        let mut file = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        file.seek(SeekFrom::Start(self.offset))?;
        let mut text = String::new();
        self.offset += file.read_to_string(&mut text)? as u64;
        self.partial.push_str(&text);
        if let Some(end) = self.partial.rfind('\n') {
            let whole: String = self.partial.drain(..=end).collect();
            for line in whole.lines() {
                let id = line.split(' ').next().unwrap_or_default();
                *self.counts.entry(id.to_string()).or_insert(0) += 1;
            }
        }
        Ok(())
    }

    /// Waits until `n` work IDs started (true), `deadline` passes or
    /// `stop` says so (false).
    async fn wait_for(
        &mut self,
        n: usize,
        deadline: Instant,
        mut stop: impl FnMut() -> bool,
    ) -> Result<bool> {
        loop {
            self.read()?;
            if self.counts.len() >= n {
                return Ok(true);
            }
            if Instant::now() >= deadline || stop() {
                return Ok(false);
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
