//! End-to-end tests of `worklease elect`: one leader's child at a time,
//! hand-over on exit, on SIGKILL and on revocation, and a standby that
//! outlives a store failure.
//!
//! Real `worklease` processes against a SQLite file in a temporary
//! directory. Synchronisation is by signals the processes give (a file a
//! child creates, a line `worklease` writes to stderr), polled in bounded
//! loops; no sleep stands in for an event.

mod common;
use common::{assert_exit, holder_script, poll_until, process_gone, Watched, World, LONG};

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

/// Starts `worklease -v elect` for `name` in `election` with a 1 s TTL,
/// once it reports that it is campaigning.
fn elect(w: &World, election: &str, name: &str) -> Watched {
    let script = holder_script(name);
    let mut r = w.spawn_sh(
        &[
            "-v", "elect", "--ttl", "1s", "--poll", "100ms", "--holder", name, election,
        ],
        &script,
    );
    r.wait_for_line("campaigning", LONG);
    r
}

#[test]
fn elect_runs_the_child_of_one_leader_and_hands_over_when_it_exits() {
    let w = World::new();
    let a = elect(&w, "scheduler", "a");
    w.wait_for_file("a.started", LONG);
    let b = elect(&w, "scheduler", "b");
    // b campaigns while a leads and renews (three TTLs): it must not lead.
    let a_token = w.read_token("a.token");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !w.path("b.started").exists(),
        "S1: two leaders' children ran"
    );
    let stopped = Instant::now();
    w.touch("a.stop");
    a.exits(0);
    w.wait_for_file("b.started", LONG);
    assert!(
        stopped.elapsed() < Duration::from_secs(1),
        "a graceful step-down hands over within a poll, not a TTL: {:?}",
        stopped.elapsed()
    );
    assert!(w.read_token("b.token") > a_token, "generations increase");
    w.touch("b.stop");
    b.exits(0);
}

/// A standby whose campaign meets a store failure (here: the SQLite write
/// lock held past the busy timeout) keeps campaigning instead of exiting
/// 69, and leads once the leader steps down.
#[test]
fn elect_a_standby_survives_a_store_failure_while_campaigning() {
    let w = World::new();
    let start = |name: &str| {
        let script = holder_script(name);
        let mut r = w.spawn_sh(
            &[
                "-v", "elect", "--ttl", "30s", "--poll", "100ms", "--holder", name, "outage",
            ],
            &script,
        );
        r.wait_for_line("campaigning", LONG);
        r
    };
    let a = start("a");
    w.wait_for_file("a.started", LONG);
    let mut b = start("b");
    let lock = w.lock_store();
    b.wait_for_line("store failed while campaigning; retrying", LONG);
    drop(lock);
    assert!(
        !w.path("b.started").exists(),
        "S1: two leaders' children ran"
    );
    w.touch("a.stop");
    a.exits(0);
    w.wait_for_file("b.started", LONG);
    w.touch("b.stop");
    b.exits(0);
}

#[test]
fn elect_after_sigkill_of_the_leader_a_standby_leads_within_ttl_plus_poll() {
    let w = World::new();
    let a = elect(&w, "compactor", "a");
    w.wait_for_file("a.started", LONG);
    let child_pid: i32 = w.read_pid("a.pid");
    let b = elect(&w, "compactor", "b");
    let killed = Instant::now();
    a.signal(Signal::SIGKILL);
    w.wait_for_file("b.started", LONG);
    let took = killed.elapsed();
    // TTL 1 s + poll 100 ms, with slack for a loaded machine.
    assert!(
        took < Duration::from_millis(1100 + 1500),
        "standby led after {took:?}"
    );
    assert!(
        poll_until(LONG, || process_gone(child_pid)),
        "the dead leader's child was killed with it"
    );
    drop(a);
    w.touch("b.stop");
    b.exits(0);
}

#[test]
fn elect_stops_the_child_and_exits_76_when_leadership_is_revoked() {
    let w = World::new();
    let a = elect(&w, "indexer", "a");
    w.wait_for_file("a.started", LONG);
    let out = w.output(&["release", "--force", "indexer"]);
    assert_exit(&out, 0);
    let err = a.exits(76);
    assert!(
        err.contains("revoked"),
        "the message names the cause: {err}"
    );
}
