//! Several OS processes contend for one work ID on one SQLite file: exactly
//! one holds at a time, and fencing tokens strictly increase.
//!
//! The parent test starts copies of this test binary that run
//! `child_contender` (a no-op unless `WORKLEASE_TEST_CHILD` is set). Each
//! child appends `acquired T` right after it acquires and `releasing T`
//! right before it releases, with `O_APPEND` (one line per write, atomic on
//! a local file system). Mutual exclusion means the log alternates
//! acquired/releasing with the same token, tokens increasing.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use worklease::store::sqlite::SqliteStore;
use worklease::{AcquireOptions, Config, Leases};

const PROCESSES: usize = 4;
const ROUNDS: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_contender() {
    let Ok(dir) = std::env::var("WORKLEASE_TEST_CHILD") else {
        return; // run as an ordinary test: nothing to do
    };
    let dir = PathBuf::from(dir);
    let me = std::env::var("WORKLEASE_TEST_CHILD_NAME").expect("child name");
    let store = Arc::new(SqliteStore::open(dir.join("leases.db")).expect("open"));
    let leases =
        Leases::new(store, Config::new(me.clone(), Duration::from_secs(5))).expect("config");
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("log"))
        .expect("log");
    for round in 0..ROUNDS {
        let opts = AcquireOptions::new()
            .wait_for_lease()
            .poll_interval(Duration::from_millis(10));
        let t = leases.acquire("shared-job", opts).await.expect("acquire");
        writeln!(log, "acquired {} {me}", t.fencing_token()).expect("log");
        let t = leases
            .checkpoint(&t, format!("{me}:{round}"))
            .await
            .expect("checkpoint");
        tokio::task::yield_now().await;
        writeln!(log, "releasing {} {me}", t.fencing_token()).expect("log");
        leases.release(t).await.expect("release");
    }
}

#[test]
fn processes_contend_for_one_work_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (0..PROCESSES)
        .map(|i| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "child_contender",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("WORKLEASE_TEST_CHILD", dir.path())
                .env("WORKLEASE_TEST_CHILD_NAME", format!("proc-{i}"))
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn child")
        })
        .collect();
    for mut c in children {
        assert!(c.wait().expect("wait").success(), "a child process failed");
    }
    let log = std::fs::read_to_string(dir.path().join("log")).expect("log");
    let lines: Vec<(&str, u64, &str)> = log
        .lines()
        .map(|l| {
            let mut p = l.split(' ');
            (
                p.next().unwrap(),
                p.next().unwrap().parse().unwrap(),
                p.next().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        lines.len(),
        2 * PROCESSES * ROUNDS,
        "every round logged twice:\n{log}"
    );
    let mut last = 0;
    for pair in lines.chunks(2) {
        let (a, r) = (pair[0], pair[1]);
        assert_eq!(
            (a.0, r.0),
            ("acquired", "releasing"),
            "S1: two holders overlapped:\n{log}"
        );
        assert_eq!(
            (a.1, a.2),
            (r.1, r.2),
            "S1: a release by another holder interleaved:\n{log}"
        );
        assert!(a.1 > last, "S2: token {} after {last}:\n{log}", a.1);
        last = a.1;
    }
    let holders: std::collections::HashSet<_> = lines.iter().map(|l| l.2).collect();
    assert_eq!(holders.len(), PROCESSES, "every process held the lease");
}
