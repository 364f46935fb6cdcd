//! End-to-end tests of job control under `worklease run`: Ctrl-Z and
//! SIGCONT reach the child, and processes left in the child's group are
//! stopped before the release.
//!
//! Real `worklease` processes against a SQLite file in a temporary
//! directory. Synchronisation is by signals the processes give (a file a
//! child creates, a line `worklease` writes to stderr), polled in bounded
//! loops; no sleep stands in for an event.

mod common;
use common::{
    group_stopped, poll_until, probe_script, process_gone, process_state, signal, stopped,
    term_trapping_script, Watched, World, LONG,
};

use nix::sys::signal::Signal;

// ---------------------------------------------------------------------------
// Job control, signals and a stopped child.

/// Holds `job` with a TTL of `ttl` (child `a`), sends `worklease` SIGTSTP
/// (Ctrl-Z) and waits until it and its child's group are stopped; the
/// `worklease` and the child's PID.
fn hold_and_stop(w: &World, ttl: &str) -> (Watched, i32) {
    let run = w.hold(&["run", "--ttl", ttl, "job"], "a");
    let child = w.read_pid("a.pid");
    run.signal(Signal::SIGTSTP);
    assert!(
        poll_until(LONG, || stopped(run.pid()) && group_stopped(child)),
        "worklease {:?}, child {:?}",
        process_state(run.pid()),
        process_state(child)
    );
    (run, child)
}

#[test]
fn ctrl_z_stops_the_child_with_worklease_and_sigcont_continues_both() {
    let w = World::new();
    let (run, child) = hold_and_stop(&w, "5s");
    run.signal(Signal::SIGCONT);
    assert!(
        poll_until(LONG, || !group_stopped(child)),
        "the child was not continued"
    );
    w.touch("a.stop");
    run.exits(0);
}

#[test]
fn sigcont_after_the_lease_expired_kills_the_stopped_child_and_exits_76() {
    let w = World::new();
    let (run, child) = hold_and_stop(&w, "1s");
    // The lease runs out while both are stopped.
    assert!(
        poll_until(LONG, || {
            let out = w.output(&["status", "--json", "job"]);
            serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .is_ok_and(|v| v["expired"] == true)
        }),
        "the lease did not expire"
    );
    run.signal(Signal::SIGCONT);
    let err = run.exits(76);
    assert!(
        err.contains("worklease:") && err.contains("SIGKILL"),
        "{err}"
    );
    assert!(
        poll_until(LONG, || process_gone(child)),
        "the child still runs"
    );
}

#[test]
fn a_forwarded_sigterm_reaches_a_stopped_child() {
    let w = World::new();
    let run = w.start_sh(&["run", "job"], &term_trapping_script("a", "exit 7"), "a");
    let child: i32 = w.read_pid("a.pid");
    signal(child, Signal::SIGSTOP);
    assert!(poll_until(LONG, || stopped(child)));
    run.signal(Signal::SIGTERM);
    run.exits(7);
    assert!(w.path("got_term").exists());
}

// ---------------------------------------------------------------------------
// Processes the child leaves behind.

#[test]
fn processes_left_in_the_childs_group_are_stopped_before_the_release() {
    let w = World::new();
    let script = "sleep 1000 & echo $! > \"$D/bg.pid\"; exit 3";
    let run = w.spawn_sh(&["run", "job"], script);
    let err = run.exits(3);
    assert!(err.contains("still run in its process group"), "{err}");
    let bg: i32 = w.read_pid("bg.pid");
    assert!(process_gone(bg), "the background process survived");
    let out = w.output(&["status", "--json", "job"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["ended"], "released");
}

#[test]
fn a_leftover_that_ignores_sigterm_gets_sigkill_before_the_next_holder_runs() {
    let w = World::new();
    let script = "(trap '' TERM; touch \"$D/bg.started\"; while :; do sleep 0.05; done) & \
                  echo $! > \"$D/bg.pid\"; while [ ! -e \"$D/bg.started\" ]; do sleep 0.01; done";
    let mut a = w.spawn_sh(&["run", "--ttl", "4s", "--grace", "500ms", "job"], script);
    a.wait_for_line("still run in its process group", LONG);
    // The next holder waits for the release, which follows the SIGKILL.
    let b = w.spawn_sh(
        &["run", "--wait", "--poll", "20ms", "job"],
        &probe_script("bg.pid", "verdict"),
    );
    a.exits(0);
    b.exits(0);
    let verdict = w.read("verdict");
    assert!(
        matches!(verdict.trim(), "gone" | "Z"),
        "a process of the first holder's child ran when the next holder started: {verdict}"
    );
}
