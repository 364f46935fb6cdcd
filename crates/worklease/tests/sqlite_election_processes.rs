//! Two OS processes elect a leader through one SQLite file (the
//! `elect_sqlite` example's code path); the leader is killed with SIGKILL
//! and the other leads within TTL + poll interval, with a larger generation.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_millis(1500);
const POLL: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_candidate() {
    let Ok(path) = std::env::var("WORKLEASE_TEST_ELECTION_DB") else {
        return; // run as an ordinary test: nothing to do
    };
    let owner = std::env::var("WORKLEASE_TEST_OWNER").expect("owner");
    let store =
        std::sync::Arc::new(worklease::store::sqlite::SqliteStore::open(path).expect("open"));
    let elector = worklease::election::Elector::builder(store, "processes", owner.as_str())
        .ttl(TTL)
        .poll_interval(POLL)
        .build()
        .expect("elector");
    elector
        .lead(|l| async move {
            println!("leading {} {}", l.state().owner, l.generation());
            l.lost().cancelled().await;
        })
        .await
        .expect("lead");
}

fn spawn(db: &std::path::Path, owner: &str, lines: mpsc::Sender<(String, Instant)>) -> Child {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "child_candidate",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("WORKLEASE_TEST_ELECTION_DB", db)
        .env("WORKLEASE_TEST_OWNER", owner)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            // The test harness may print its own prefix on the same line.
            if let Some(at) = line.find("leading ") {
                if lines
                    .send((line[at..].to_string(), Instant::now()))
                    .is_err()
                {
                    return;
                }
            }
        }
    });
    child
}

#[test]
fn sigkill_of_the_leader_hands_over_within_ttl_plus_poll() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("election.db");
    let (tx, rx) = mpsc::channel();
    let mut a = spawn(&db, "proc-a", tx.clone());
    let (first, _) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("proc-a leads");
    let mut b = spawn(&db, "proc-b", tx);
    // proc-b campaigns; give it a poll or two, then kill the leader.
    assert!(
        rx.recv_timeout(POLL * 3).is_err(),
        "S1: proc-b led while proc-a led"
    );
    let killed = Instant::now();
    a.kill().expect("SIGKILL proc-a");
    a.wait().expect("reap");
    let (second, at) = rx
        .recv_timeout(TTL * 4)
        .expect("proc-b leads after the kill");
    let took = at - killed;
    b.kill().expect("stop proc-b");
    b.wait().expect("reap");
    let gen = |l: &str| {
        l.rsplit(' ')
            .next()
            .and_then(|g| g.parse::<u64>().ok())
            .expect("generation")
    };
    assert!(second.starts_with("leading proc-b"), "{second}");
    assert!(
        gen(&second) > gen(&first),
        "generations increase: {first} then {second}"
    );
    // Margin for process scheduling on a loaded 2-core machine.
    let bound = TTL + POLL + Duration::from_millis(500);
    assert!(
        took <= bound,
        "proc-b led {took:?} after the SIGKILL, more than TTL + poll ({bound:?})"
    );
    println!("hand-over after SIGKILL took {took:?} (TTL {TTL:?}, poll {POLL:?})");
}
