//! Wake-ups across processes on SQLite: a waiter in this process, with a
//! poll interval of 30 s, is woken within milliseconds by a release in
//! another process; a holder here loses its lease at once when another
//! process revokes it (long before its next renewal); another process's
//! renewals wake nobody; and with the wake-ups turned off, a waiter still
//! gets the lease at its poll.
//!
//! The other process is a copy of this test binary running `child` (a
//! no-op unless `WORKLEASE_TEST_PUSH_DB` is set) in the role named by
//! `WORKLEASE_TEST_PUSH_ROLE`. It prints `push-child: WHAT` lines on
//! stdout when it reaches a step and waits for a line on stdin before its
//! next one, so that the parent times exactly the step it asked for.
//!
//! Bounds come from round trips measured here: 250 ms + 20 × the slowest
//! of five acquire + release cycles, which stays far below the poll
//! interval it must tell apart (checked).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use worklease::store::fault::FaultStore;
use worklease::store::sqlite::SqliteStore;
use worklease::{AcquireOptions, Config, Error, LeaseStore, Leases, RenewalOptions, WorkId};

const TTL: Duration = Duration::from_secs(60);
/// The waiters' poll interval: a wake-up that fell back to polling would
/// take this long.
const POLL: Duration = Duration::from_secs(30);
const WORK: &str = "push-job";
const SENTINEL: &str = "push-sentinel";
const OTHER: &str = "push-other";
const PREFIX: &str = "push-child: ";

/// Waits for a line on stdin (the parent's go-ahead).
async fn go_ahead() {
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await
    .expect("stdin task")
    .expect("stdin");
    assert!(!line.is_empty(), "the parent went away");
}

fn say(what: &str) {
    println!("{PREFIX}{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    let Ok(db) = std::env::var("WORKLEASE_TEST_PUSH_DB") else {
        return; // run as an ordinary test: nothing to do
    };
    let role = std::env::var("WORKLEASE_TEST_PUSH_ROLE").expect("role");
    let store: Arc<dyn LeaseStore> = Arc::new(SqliteStore::open(db).expect("open"));
    let leases =
        Leases::new(store.clone(), Config::new(format!("child-{role}"), TTL)).expect("config");
    match role.as_str() {
        // Holds WORK; releases it on the go-ahead.
        "release" => {
            let t = leases
                .acquire(WORK, AcquireOptions::new())
                .await
                .expect("acquire");
            say("held");
            go_ahead().await;
            leases.release(t).await.expect("release");
            say("released");
        }
        // Revokes WORK on the go-ahead, as `worklease release --force`.
        "revoke" => {
            say("ready");
            go_ahead().await;
            let id = WorkId::new(WORK).expect("work ID");
            store
                .revoke(&id)
                .await
                .expect("revoke")
                .expect("a lease to revoke");
            say("revoked");
        }
        // Holds WORK and SENTINEL; on the go-ahead renews and checkpoints
        // WORK again and again while it takes and releases OTHER (each
        // release signals the file), then releases SENTINEL; on the next,
        // releases WORK.
        "renew" => {
            let mut t = leases
                .acquire(WORK, AcquireOptions::new())
                .await
                .expect("acquire");
            let s = leases
                .acquire(SENTINEL, AcquireOptions::new())
                .await
                .expect("acquire");
            say("held");
            go_ahead().await;
            for round in 0..10 {
                t = leases.renew(&t).await.expect("renew");
                t = leases
                    .checkpoint(&t, format!("round {round}"))
                    .await
                    .expect("checkpoint");
                let o = leases
                    .acquire(OTHER, AcquireOptions::new())
                    .await
                    .expect("acquire other");
                leases.release(o).await.expect("release other");
            }
            leases.release(s).await.expect("release sentinel");
            say("sentinel");
            go_ahead().await;
            leases.release(t).await.expect("release");
            say("released");
        }
        other => panic!("unknown role {other:?}"),
    }
}

/// A child process in `role`, killed when dropped, with what it says
/// (`push-child:` lines) and its stdin.
struct Other {
    process: Child,
    stdin: ChildStdin,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Other {
    fn start(db: &Path, role: &str) -> Self {
        let mut process = Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "child", "--nocapture", "--test-threads=1"])
            .env("WORKLEASE_TEST_PUSH_DB", db)
            .env("WORKLEASE_TEST_PUSH_ROLE", role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the other process");
        let stdin = process.stdin.take().expect("stdin");
        let stdout = process.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                // The harness may have begun the line (`test child ... `).
                if let Some((_, what)) = line.split_once(PREFIX) {
                    if tx.send(what.to_string()).is_err() {
                        return;
                    }
                }
            }
        });
        Self {
            process,
            stdin,
            lines,
        }
    }

    /// Waits for the child to say `what` (within a minute: it may have to
    /// start up on a loaded machine).
    async fn reached(&mut self, what: &str) {
        let said = tokio::time::timeout(Duration::from_secs(60), self.lines.recv())
            .await
            .unwrap_or_else(|_| panic!("the other process did not say {what:?} within a minute"))
            .unwrap_or_else(|| panic!("the other process ended before it said {what:?}"));
        assert_eq!(said, what);
    }

    fn go(&mut self) {
        writeln!(self.stdin, "go").expect("write to the other process");
        self.stdin.flush().expect("flush");
    }

    fn finish(mut self) {
        let status = self.process.wait().expect("wait");
        assert!(status.success(), "the other process failed: {status}");
    }
}

impl Drop for Other {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// The bound on one wake-up across processes: 250 ms + 20 × the slowest
/// of five acquire + release cycles on `store` (so a slow or loaded
/// machine gets a larger one), checked to be far below [`POLL`].
async fn bound(store: &Arc<dyn LeaseStore>) -> Duration {
    let leases = Leases::new(store.clone(), Config::new("probe", TTL)).expect("config");
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let started = Instant::now();
        let t = leases
            .acquire("push-probe", AcquireOptions::new())
            .await
            .expect("acquire");
        leases.release(t).await.expect("release");
        worst = worst.max(started.elapsed());
    }
    let bound = Duration::from_millis(250) + worst * 20;
    assert!(
        bound < POLL / 4,
        "round trips of {worst:?} give a bound of {bound:?}: too close to the poll interval to tell a wake-up from a poll"
    );
    bound
}

/// A waiting acquisition: its outcome and when it came.
type Waiting = tokio::task::JoinHandle<(worklease::Result<worklease::Token>, Instant)>;

struct Waiter {
    fault: Arc<FaultStore<SqliteStore>>,
    leases: Leases,
}

/// A waiter's side: the store (wake-ups on or off) under a fault store
/// that counts acquisition attempts and hides the holder's expiry (so
/// that only a wake-up or the poll interval ends a wait).
fn waiter(db: &Path, wakeups: bool) -> Waiter {
    let store = Arc::new(
        SqliteStore::open(db)
            .expect("open")
            .cross_process_wakeups(wakeups),
    );
    let fault = Arc::new(FaultStore::over(store));
    fault.hide_expiry(true);
    let leases = Leases::new(fault.clone(), Config::new("waiter", TTL)).expect("config");
    Waiter { fault, leases }
}

impl Waiter {
    /// Starts waiting for WORK with `poll`; returns once the first attempt
    /// was refused (the wait's watch is subscribed before it).
    async fn wait(&self, poll: Duration) -> Waiting {
        let leases = self.leases.clone();
        let options = AcquireOptions::new().wait_for_lease().poll_interval(poll);
        let task = tokio::spawn(async move {
            let r = leases.acquire(WORK, options).await;
            (r, Instant::now())
        });
        self.fault.held_answers().reaches(1).await;
        task
    }
}

/// A waiter here (wake-ups on or off), its bound, and the other process
/// in `role`, holding WORK; the file is in the returned directory.
async fn setup(wakeups: bool, role: &str) -> (tempfile::TempDir, Waiter, Duration, Other) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("leases.db");
    let w = waiter(&db, wakeups);
    let bound = bound(&(w.fault.clone() as Arc<dyn LeaseStore>)).await;
    let mut other = Other::start(&db, role);
    other.reached("held").await;
    (dir, w, bound, other)
}

/// Lets the other process release WORK, and checks that the waiting
/// `task` gets it within `bound`, with exactly two acquisition attempts
/// since `probes` were counted: the refused one, and the one the release
/// woke (any other wake-up is one more).
async fn handed_off(
    w: &Waiter,
    other: &mut Other,
    task: Waiting,
    probes: u64,
    bound: Duration,
    what: &str,
) {
    let released = Instant::now();
    other.go();
    let (got, at) = tokio::time::timeout(bound, task)
        .await
        .unwrap_or_else(|_| {
            panic!("{what}: the waiter was not woken within {bound:?} of the release (its poll is {POLL:?})")
        })
        .expect("waiter task");
    got.expect("acquire");
    eprintln!(
        "{what}: hand-off across processes in {:?} (bound {bound:?})",
        at - released
    );
    assert_eq!(
        w.fault.acquires().get() - probes,
        2,
        "{what}: the waiter was woken by something else than the release"
    );
    other.reached("released").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_another_process_wakes_a_waiter_long_before_its_poll() {
    let (_dir, w, bound, mut other) = setup(true, "release").await;
    let probes = w.fault.acquires().get();
    let task = w.wait(POLL).await;
    handed_off(&w, &mut other, task, probes, bound, "after a plain wait").await;
    other.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_in_another_process_ends_the_holders_lease_long_before_its_renewal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("leases.db");
    let store: Arc<dyn LeaseStore> = Arc::new(SqliteStore::open(&db).expect("open"));
    let bound = bound(&store).await;
    let leases = Leases::new(store, Config::new("holder", TTL)).expect("config");
    let token = leases
        .acquire(WORK, AcquireOptions::new())
        .await
        .expect("acquire");
    // Renewed every TTL/3 = 20 s: the revocation must not wait for that.
    let renewal = leases
        .start_renewal(token, RenewalOptions::new())
        .expect("renewal");
    let mut other = Other::start(&db, "revoke");
    other.reached("ready").await;
    // A notification makes the renewal due at most once per 100 ms after
    // the last one (the session's EARLY_CHECK_GAP), and the last one was
    // the acquisition, just now.
    let bound = bound + Duration::from_millis(100);
    let revoked = Instant::now();
    other.go();
    let cause = tokio::time::timeout(bound, renewal.lost())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the holder did not lose the revoked lease within {bound:?} (it renews every 20 s)"
            )
        });
    eprintln!(
        "revocation across processes seen after {:?} (bound {bound:?})",
        revoked.elapsed()
    );
    assert!(matches!(cause, Error::Fenced { .. }), "lost with {cause}");
    other.reached("revoked").await;
    other.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_in_another_process_wake_no_waiter() {
    let (_dir, w, bound, mut other) = setup(true, "renew").await;
    let probes = w.fault.acquires().get();
    let task = w.wait(POLL).await;
    let sentinel = w
        .fault
        .inner()
        .watch(&WorkId::new(SENTINEL).expect("work ID"))
        .expect("watch the sentinel");
    other.go();
    // Woken by the check that also read WORK after all the renewals,
    // checkpoints and other releases.
    tokio::time::timeout(bound * 4, sentinel)
        .await
        .expect("the sentinel's release wakes its watch");
    other.reached("sentinel").await;
    handed_off(&w, &mut other, task, probes, bound, "after renewals").await;
    other.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wakeups_off_a_waiter_gets_the_lease_at_its_poll() {
    let poll = Duration::from_secs(1);
    let (_dir, w, bound, mut other) = setup(false, "release").await;
    let task = w.wait(poll).await;
    let refused = Instant::now();
    other.go();
    other.reached("released").await;
    let (got, at) = tokio::time::timeout(poll * 2 + bound, task)
        .await
        .expect("the waiter got the lease at its poll")
        .expect("waiter task");
    got.expect("acquire");
    // Not woken by the release: the next attempt came a poll interval
    // (less the moment between the refusal and this reading) after the
    // first.
    assert!(
        at - refused >= poll.mul_f64(0.9),
        "acquired {:?} after the refusal: woken, not polling",
        at - refused
    );
    other.finish();
}
