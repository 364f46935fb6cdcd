//! Issue 23 from outside: `worklease elect` and `worklease run --fair
//! --wait`, sent SIGTERM at points spread over their acquisition, exit
//! with 143 and leave no lease of their holder behind (not the election's,
//! not the target's, not the fair line's `<id>/fair-queue` or waiter
//! leases). Before the CLI awaited the library's background releases,
//! the process exited while a grant of the acquisition it gave up was
//! still being released, and the lease stayed until its TTL.
//!
//! Each process logs (`-v`) when it starts acquiring ("campaigning",
//! "waiting in line"): the test waits for that line, then for a delay
//! spread evenly over the acquisition's measured duration (from that line
//! to its child's first output, timed on the machine under test), then
//! sends SIGTERM. After all of them, `status --all --json` must show no
//! live lease of the holder: the TTL (one minute) outlasts the test, so a
//! lease left to expire is caught.
//!
//! SQLite always; PostgreSQL at `WORKLEASE_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`, as the library's tests), in
//! a table of its own.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{World, LONG};

/// Processes signalled per command and store: enough that the issue's
/// rates (11 % to 34 % on PostgreSQL, 1 % to 11 % on SQLite) leave some
/// lease behind, few enough for about a minute on a loaded 2-core machine.
const SIGNALLED: u32 = 40;

/// Acquisitions timed, undisturbed, to spread the signals over.
const TIMED: u32 = 3;

/// Outlasts the test: a lease left behind is still live when it is looked
/// for.
const TTL: &str = "60s";

/// The command under test.
#[derive(Clone, Copy, Debug)]
enum Acquiring {
    /// `worklease elect`: "campaigning" then the first acquisition.
    Elect,
    /// `worklease run --fair --wait`: "waiting in line" then the queue
    /// lease, the line, the target.
    RunFairWait,
}

impl Acquiring {
    /// The arguments for work ID `id`; the child prints "started" and
    /// sleeps (SIGTERM, forwarded to it, ends it).
    fn args<'a>(self, holder: &'a str, id: &'a str) -> Vec<&'a str> {
        let child = ["--", "sh", "-c", "echo started; exec sleep 30"];
        let mut args = vec!["-v"];
        args.extend(match self {
            Acquiring::Elect => vec!["elect", "--ttl", TTL, "--holder", holder, id],
            Acquiring::RunFairWait => {
                vec![
                    "run", "--fair", "--wait", "--ttl", TTL, "--holder", holder, id,
                ]
            }
        });
        args.extend(child);
        args
    }

    /// The log line that says the process starts acquiring.
    fn marker(self) -> &'static str {
        match self {
            Acquiring::Elect => "campaigning",
            Acquiring::RunFairWait => "waiting in line",
        }
    }
}

/// One `worklease` under test, with its marker line and its child's
/// output delivered as they come.
struct Process {
    child: Child,
    acquiring: mpsc::Receiver<Instant>,
    started: mpsc::Receiver<Instant>,
}

impl Process {
    fn spawn(w: &World, args: &[&str], marker: &'static str) -> Self {
        let mut child = w
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn worklease");
        let acquiring = forward_first(child.stderr.take().expect("stderr"), marker);
        let started = forward_first(child.stdout.take().expect("stdout"), "started");
        Self {
            child,
            acquiring,
            started,
        }
    }

    /// When it logged that it starts acquiring.
    fn acquiring(&self) -> Instant {
        self.acquiring
            .recv_timeout(LONG)
            .expect("worklease logs that it starts acquiring")
    }

    /// SIGTERM, then its exit status (bounded by [`LONG`]).
    fn terminate(mut self) -> ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(self.child.wait());
        });
        rx.recv_timeout(LONG)
            .expect("worklease exits after SIGTERM")
            .expect("wait")
    }
}

/// Reads `from` to its end on a thread of its own; sends the instant of
/// the first line containing `needle`.
fn forward_first(
    from: impl std::io::Read + Send + 'static,
    needle: &'static str,
) -> mpsc::Receiver<Instant> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            if line.contains(needle) {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(Instant::now());
                }
            }
        }
    });
    rx
}

/// How long an undisturbed acquisition takes here, from its marker line
/// to its child's output: the longest of [`TIMED`].
fn time_acquisition(w: &World, acquiring: Acquiring, holder: &str, tag: &str) -> Duration {
    (0..TIMED)
        .map(|i| {
            let id = format!("orphans-{tag}-timed-{i}");
            let p = Process::spawn(w, &acquiring.args(holder, &id), acquiring.marker());
            let from = p.acquiring();
            let to = p
                .started
                .recv_timeout(LONG)
                .expect("an undisturbed acquisition starts its child");
            let status = p.terminate();
            assert_eq!(
                status.code(),
                Some(143),
                "a signal while leading: the child's status"
            );
            to - from
        })
        .max()
        .expect("timed")
}

/// Signals [`SIGNALLED`] processes of `acquiring` (holder
/// `orphans-<tag>`) at spread points of their acquisition.
fn signal_during_acquisitions(w: &World, acquiring: Acquiring, tag: &str) {
    let holder = format!("orphans-{tag}");
    let window = time_acquisition(w, acquiring, &holder, tag);
    for i in 0..SIGNALLED {
        let id = format!("orphans-{tag}-{i}");
        let p = Process::spawn(w, &acquiring.args(&holder, &id), acquiring.marker());
        let delay = window * i / SIGNALLED;
        std::thread::sleep((p.acquiring() + delay).saturating_duration_since(Instant::now()));
        let status = p.terminate();
        // 143; or ended by the signal itself, when it came before
        // `worklease` caught signals (`elect` logs first).
        assert!(
            status.code() == Some(143) || status.signal() == Some(15),
            "{acquiring:?} {id}: SIGTERM {delay:?} into the acquisition must end it with 128 + 15, got {status:?}"
        );
    }
}

/// The live leases of `holder`, as `status --all --json` shows them (the
/// store is this test's own).
fn left_behind(w: &World, holder: &str) -> Vec<String> {
    let out = w
        .cmd(&["status", "--all", "--json"])
        .output()
        .expect("status");
    assert!(out.status.success(), "status: {}", common::stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .filter(|l| l["holder_id"] == holder && l["expired"] == false && l["released"] == false)
        .map(|l| l["work_id"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn no_orphans(w: &World, store: &str) {
    let tag = format!("{:08x}", rand::random::<u32>());
    let started = Instant::now();
    let mut failures = Vec::new();
    for acquiring in [Acquiring::Elect, Acquiring::RunFairWait] {
        let tag = format!("{tag}-{acquiring:?}");
        signal_during_acquisitions(w, acquiring, &tag);
        let left = left_behind(w, &format!("orphans-{tag}"));
        eprintln!(
            "{store}: {acquiring:?}: {} of {SIGNALLED} left a lease",
            left.len()
        );
        if !left.is_empty() {
            failures.push(format!("{acquiring:?}: {} left {left:?}", left.len()));
        }
    }
    eprintln!(
        "{store}: {} processes signalled in {:?}",
        2 * SIGNALLED,
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{store}: processes ended by SIGTERM during their acquisition (each {SIGNALLED}) left leases until their TTL: {failures:?}"
    );
}

#[test]
fn sigterm_during_acquisition_leaves_no_lease_sqlite() {
    let w = World::new();
    no_orphans(&w, "sqlite");
}

#[test]
fn sigterm_during_acquisition_leaves_no_lease_postgres() {
    let base = std::env::var("WORKLEASE_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".to_string());
    let sep = if base.contains('?') { '&' } else { '?' };
    let table = format!("wl_test_orphans_{:08x}", rand::random::<u32>());
    let mut w = World::new();
    w.store = format!("{base}{sep}table={table}");
    no_orphans(&w, "postgres");
}

/// A Redis server without replicas, a key prefix of this test's own, and
/// `worklease ARGS` blocked in a replica wait of 30 s there (seen in `WAIT`
/// through `CLIENT LIST`), its stderr piped; `None` when the test server
/// has replicas (its `WAIT` returns at once). Dropped, deletes the test's
/// keys.
struct BlockedInWait {
    conn: redis::Connection,
    prefix: String,
    /// One such test at a time: `CLIENT LIST` cannot tell whose client
    /// waits, and a process signalled before it catches signals dies of
    /// the signal.
    _alone: std::sync::MutexGuard<'static, ()>,
}

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl BlockedInWait {
    fn start(args: &[&str]) -> Option<(Self, Child)> {
        let alone = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let base = std::env::var("WORKLEASE_TEST_REDIS_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "redis://127.0.0.1:6379/0".to_string());
        let client = redis::Client::open(base.as_str()).expect("Redis URL");
        let mut conn = client
            .get_connection()
            .expect("the test Redis server answers (see WORKLEASE_TEST_REDIS_URL)");
        let replicas: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut conn)
            .expect("INFO");
        if !replicas.contains("connected_slaves:0") {
            eprintln!("skipped: the test Redis server has replicas, so its WAIT returns at once");
            return None;
        }
        let sep = if base.contains('?') { '&' } else { '?' };
        let prefix = format!("wl-test-sig-{:08x}:", rand::random::<u32>());
        let mut w = World::new();
        w.store = format!("{base}{sep}prefix={prefix}&wait_replicas=1&wait_timeout_ms=30000");
        let child = w
            .cmd(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn worklease");
        let waiting = common::poll_until(LONG, || {
            let clients: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query(&mut conn)
                .expect("CLIENT LIST");
            clients.lines().any(|l| l.contains("cmd=wait"))
        });
        assert!(waiting, "worklease never blocked in WAIT");
        Some((
            Self {
                conn,
                prefix,
                _alone: alone,
            },
            child,
        ))
    }
}

fn sigterm(child: &Child) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
}

impl Drop for BlockedInWait {
    fn drop(&mut self) {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query(&mut self.conn)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut self.conn);
        }
    }
}

/// Waits (bounded by [`LONG`]) for `child` to exit; its output.
fn exit_of(child: Child) -> std::process::Output {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    rx.recv_timeout(LONG)
        .expect("worklease exits after SIGTERM, before its 30 s replica wait ends")
        .expect("wait")
}

/// A first attempt that takes long (here a Redis replica wait of 30 s on
/// a server without replicas) is ended by SIGTERM too: `run` exits 143
/// within the settle bound (3 s with the default TTL), not when the store
/// call gives up. The process is seen blocked in `WAIT` on the server
/// (`CLIENT LIST`) before it is signalled.
#[test]
fn sigterm_during_a_long_first_attempt_ends_run_within_the_settle_bound() {
    let Some((_keys, child)) = BlockedInWait::start(&["run", "job", "--", "true"]) else {
        return;
    };
    let signalled = Instant::now();
    sigterm(&child);
    let out = exit_of(child);
    let took = signalled.elapsed();
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(143), "{err}");
    // The settle bound (min(TTL, 3 s)) and the process's own exit, far
    // below the 30 s the store call would have taken.
    assert!(
        took < Duration::from_secs(10),
        "exit {took:?} after SIGTERM: {err}"
    );
}

/// A second SIGTERM while `run` waits for its background releases on the
/// way out (the first attempt's store call, blocked in `WAIT`, would keep
/// it for the whole settle bound) ends that wait at once: exit 143, and a
/// line saying what is left to the TTL.
#[test]
fn a_second_sigterm_ends_the_wait_for_background_releases() {
    let Some((_keys, mut child)) = BlockedInWait::start(&["run", "job", "--", "true"]) else {
        return;
    };
    let lines = stderr_lines(&mut child);
    sigterm(&child);
    let mut seen = lines_until(&lines, "gave up");
    sigterm(&child);
    let out = exit_of(child);
    // The rest of stderr, to its end (the reader's channel closes there).
    seen.extend(lines.iter());
    assert_eq!(out.status.code(), Some(143), "{seen:?}");
    assert!(
        seen.iter().any(|l| l.contains("SIGTERM, a second signal")
            && l.contains("without waiting for the background releases")),
        "the second SIGTERM must end the settle wait: {seen:?}"
    );
}

/// `pool` stopped by SIGTERM while its store calls block (each write waits
/// 30 s for a replica that does not exist): it exits once its children's
/// grace and the settle bound have passed (here 1 s + 2 s), saying so,
/// not after every blocked release (148 s in the break test).
#[test]
fn a_stopping_pool_exits_within_its_bound_when_its_store_blocks() {
    let args = [
        "pool",
        "--ttl",
        "2s",
        "--grace",
        "1s",
        "--work-ids",
        "a,b",
        "--",
        "sleep",
        "30",
    ];
    let Some((_keys, child)) = BlockedInWait::start(&args) else {
        return;
    };
    sigterm(&child);
    let out = exit_of(child);
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(143), "{err}");
    assert!(err.contains("did not stop within 3.0s"), "{err}");
}

/// A second SIGTERM to a stopping `pool` ends its wait at once.
#[test]
fn a_second_sigterm_ends_a_stopping_pool() {
    let args = ["-v", "pool", "--work-ids", "a,b", "--", "sleep", "30"];
    let Some((_keys, mut child)) = BlockedInWait::start(&args) else {
        return;
    };
    let lines = stderr_lines(&mut child);
    sigterm(&child);
    // The first signal is handled once the pool says it stops.
    let mut seen = lines_until(&lines, "stopping every child");
    sigterm(&child);
    let out = exit_of(child);
    seen.extend(lines.iter());
    assert_eq!(out.status.code(), Some(143), "{seen:?}");
    assert!(
        seen.iter().any(|l| l.contains("a second signal")),
        "{seen:?}"
    );
}

/// The lines of `child`'s stderr, as they come (the channel closes at its
/// end).
fn stderr_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// The lines from `lines` up to the first containing `needle` (bounded by
/// [`LONG`]).
fn lines_until(lines: &mpsc::Receiver<String>, needle: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let line = lines
            .recv_timeout(LONG)
            .unwrap_or_else(|_| panic!("no {needle:?} line: {seen:?}"));
        let found = line.contains(needle);
        seen.push(line);
        if found {
            return seen;
        }
    }
}
