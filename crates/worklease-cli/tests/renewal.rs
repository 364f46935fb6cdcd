//! End-to-end tests of `worklease run` when renewal fails: the child is
//! gone by the lease deadline, before anyone else holds the lease.
//!
//! Real `worklease` processes against a SQLite file in a temporary
//! directory. Synchronisation is by signals the processes give (a file a
//! child creates, a line `worklease` writes to stderr), polled in bounded
//! loops; no sleep stands in for an event.

mod common;
use common::{
    assert_exit, code, holder_script, poll_until, probe_script, process_gone, term_trapping_script,
    World, LONG,
};

use std::time::Duration;

// ---------------------------------------------------------------------------
// The child is gone by the lease deadline when renewal fails.

#[test]
fn when_renewal_fails_the_child_is_killed_by_the_deadline_before_anyone_else_holds_the_lease() {
    let w = World::new();
    // TTL 6s: the default --grace is 1.5s; the holder's deadline is 5.4s
    // after the last successful renewal was sent, the store's expiry 6s.
    let mut a = w.start_sh(
        &["run", "--ttl", "6s", "--holder", "alpha", "job"],
        &term_trapping_script("a", ""),
        "a",
    );
    let child: i32 = w.read_pid("a.pid");
    let lock = w.lock_store();
    a.wait_for_line("lease renewal is failing", LONG);
    a.wait_for_line("renewal failed until the lease window ran out", LONG);
    drop(lock);
    let err = a.exits(76);
    assert!(
        w.path("got_term").exists(),
        "no SIGTERM before the SIGKILL: {err}"
    );
    assert!(process_gone(child), "the child outlived the lease: {err}");

    // The next holder gets the lease once it expired by the store's clock;
    // by then the first child was dead (it ignores SIGTERM: SIGKILL at the
    // holder's deadline, not --grace after it).
    let out = w.sh(
        &["run", "--wait", "--poll", "50ms", "--holder", "beta", "job"],
        &probe_script("a.pid", "verdict"),
    );
    assert_exit(&out, 0);
    let verdict = w.read("verdict");
    assert!(
        matches!(verdict.trim(), "gone" | "Z"),
        "the first holder's child still ran when the next holder started: {verdict}"
    );
}

#[test]
fn a_renewal_that_succeeds_after_the_sigterm_cancels_the_sigkill() {
    let w = World::new();
    let mut a = w.start_sh(
        &["run", "--ttl", "6s", "--grace", "2s", "job"],
        &term_trapping_script("a", ""),
        "a",
    );
    let child: i32 = w.read_pid("a.pid");
    let lock = w.lock_store();
    a.wait_for_line("lease renewal is failing", LONG);
    drop(lock);
    a.wait_for_line("renewed after all", LONG);
    assert!(
        !process_gone(child),
        "the child was killed although the lease was renewed"
    );
    w.touch("a.stop");
    let err = a.exits(0);
    assert!(w.path("got_term").exists(), "{err}");
    assert!(
        !err.contains("worklease:"),
        "the status is the child's: {err}"
    );
    let out = w.output(&["status", "--json", "job"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["ended"], "released");
}

#[test]
fn a_child_stopped_because_renewal_keeps_failing_makes_run_exit_76() {
    let w = World::new();
    // The child exits at once on SIGTERM (the shell's default); worklease
    // sent it because the lease was about to run out: that is a loss (76),
    // not the child's own 143.
    let mut a = w.hold(&["run", "--ttl", "6s", "--holder", "alpha", "job"], "a");
    let lock = w.lock_store();
    a.wait_for_line("lease renewal is failing", LONG);
    let (status, err) = a.wait(LONG);
    drop(lock);
    assert_eq!(code(status), 76, "{err}");
    assert!(err.contains("worklease: exit 76"), "{err}");
}

#[test]
fn a_child_that_exits_inside_its_lease_keeps_its_status_when_the_release_fails() {
    let w = World::new();
    // TTL 3s; the release waits on the store's write lock, which the test
    // holds until the lease has expired by the store's clock: the release
    // then finds it expired. The child had exited long before.
    let a = w.spawn_sh(
        &["run", "--ttl", "3s", "--holder", "alpha", "job"],
        &format!("{}; exit 0", holder_script("a")),
    );
    w.wait_for_file("a.started", LONG);
    let lock = w.lock_store();
    w.touch("a.stop");
    let child: i32 = w.read_pid("a.pid");
    assert!(
        poll_until(LONG, || process_gone(child)),
        "the child did not exit"
    );
    // No renewal can commit while the test holds the write lock: the
    // lease's expiry is the one in its row now (read inside the test's own
    // transaction). Let the release through once that has passed (the
    // store's clock has millisecond steps: a little after).
    let expires_ms: u64 = lock
        .query_row(
            "SELECT expires_at_unix_ms FROM worklease_leases WHERE work_id = 'job'",
            [],
            |r| r.get(0),
        )
        .expect("the lease row");
    let expired = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970");
        now > Duration::from_millis(expires_ms + 100)
    };
    assert!(poll_until(LONG, expired), "the lease never expired");
    drop(lock);
    let err = a.exits(0);
    assert!(
        err.contains("the lease could not be released"),
        "no warning that the release failed: {err}"
    );
    assert!(
        !err.contains("exit 76") && !err.contains("worklease:"),
        "the status is the child's: {err}"
    );
    let out = w.output(&["status", "--json", "job"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["ended"], "expired", "{v}");
}
