//! End-to-end tests of `worklease run`: one holder at a time, waiting
//! for the lease, the child's environment and exit status, signals to
//! `run`, and `release --force`.
//!
//! Real `worklease` processes against a SQLite file in a temporary
//! directory. Synchronisation is by signals the processes give (a file a
//! child creates, a line `worklease` writes to stderr), polled in bounded
//! loops; no sleep stands in for an event.

mod common;
use common::{
    assert_exit, code, holder_script, poll_until, process_gone, stderr, term_trapping_script,
    Watched, World, LONG,
};

use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use worklease::Token;

#[test]
fn a_second_run_exits_75_naming_the_holder() {
    let w = World::new();
    let first = w.hold(&["run", "--ttl", "5s", "--holder", "alpha", "job"], "a");

    let second = w.sh(&["run", "--holder", "beta", "job"], "touch \"$D/b.ran\"");
    assert_exit(&second, 75);
    let err = stderr(&second);
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected: {err}"
    );
    assert!(
        err.contains("\"alpha\"") && err.contains("expires in"),
        "{err}"
    );
    assert!(!w.path("b.ran").exists(), "the second child must not run");

    w.touch("a.stop");
    first.exits(0);
}

#[test]
fn a_waiting_run_runs_after_the_first_with_a_larger_fencing_token() {
    let w = World::new();
    let first = w.hold(&["run", "--ttl", "5s", "--holder", "alpha", "job"], "a");

    let script = "echo \"$WORKLEASE_FENCING_TOKEN\" > \"$D/b.token\"; test -e \"$D/a.stop\"";
    let mut second = w.spawn_sh(
        &[
            "-v", "run", "--wait", "--poll", "100ms", "--holder", "beta", "job",
        ],
        script,
    );
    second.wait_for_line("waiting for it", LONG);
    assert!(
        !w.path("b.token").exists(),
        "the second child ran while the first held the lease"
    );

    w.touch("a.stop");
    first.exits(0);
    // The second child checks that the first was told to stop before it ran.
    second.exits(0);
    assert!(w.read_token("b.token") > w.read_token("a.token"));
}

#[test]
fn sigkill_of_a_holder_lets_a_waiter_in_within_ttl_plus_poll() {
    let w = World::new();
    let ttl = Duration::from_secs(1);
    let poll = Duration::from_millis(200);
    let first = w.hold(&["run", "--ttl", "1s", "--holder", "alpha", "job"], "a");
    let first_child: i32 = w.read_pid("a.pid");

    let mut second = w.spawn_sh(
        &[
            "-v", "run", "--wait", "--poll", "200ms", "--holder", "beta", "job",
        ],
        &holder_script("b"),
    );
    second.wait_for_line("waiting for it", LONG);

    first.signal(Signal::SIGKILL);
    let killed = Instant::now();
    w.wait_for_file("b.started", LONG);
    let took = killed.elapsed();
    // TTL + poll interval, plus room for starting a process on a busy machine.
    assert!(
        took < ttl + poll + Duration::from_millis(1500),
        "took {took:?}"
    );
    assert!(w.read_token("b.token") > w.read_token("a.token"));

    // The dead holder's child did not outlive it.
    assert!(
        poll_until(Duration::from_secs(5), || process_gone(first_child)),
        "the child of the killed worklease still runs"
    );
    drop(first);

    w.touch("b.stop");
    second.exits(0);
}

#[test]
fn release_force_stops_the_child_and_run_exits_76() {
    let w = World::new();
    let script = term_trapping_script("a", "exit 0");
    let run = w.start_sh(
        &[
            "run", "--ttl", "5s", "--grace", "1s", "--holder", "alpha", "job",
        ],
        &script,
        "a",
    );

    let refused = w.output(&["release", "job"]);
    assert_exit(&refused, 64);
    assert!(stderr(&refused).contains("--force"), "{}", stderr(&refused));

    let out = w.output(&["release", "--force", "job"]);
    assert_exit(&out, 0);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("revoked") && said.contains("\"alpha\""),
        "{said}"
    );

    let err = run.exits(76);
    assert!(w.path("got_term").exists(), "the child did not get SIGTERM");
    assert!(err.contains("SIGTERM"), "{err}");

    let unknown = w.output(&["release", "--force", "no-such-job"]);
    assert_exit(&unknown, 4);
}

#[test]
fn release_force_of_a_revoked_lease_says_revoked() {
    let w = World::new();
    let run = w.hold(&["run", "--ttl", "2s", "--grace", "200ms", "job"], "a");
    let out = w.output(&["release", "--force", "job"]);
    assert_exit(&out, 0);
    let err = run.exits(76);
    // The last line says that the status is worklease's, and the child's.
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("worklease: exit 76: ") && last.contains("own status: 143"),
        "{err}"
    );
    let out = w.output(&["release", "--force", "job"]);
    assert_exit(&out, 0);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("already ended (revoked;"), "{said}");
    let out = w.output(&["status", "--json", "job"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["ended"], "revoked");
}

#[test]
fn the_child_sees_every_worklease_variable() {
    let w = World::new();
    let script = "env | grep '^WORKLEASE_' > \"$D/env.txt\"";
    let out = w.sh(&["run", "--holder", "alpha", "jobs/env test"], script);
    assert_exit(&out, 0);
    let env: std::collections::HashMap<String, String> = w
        .read("env.txt")
        .lines()
        .filter_map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    assert_eq!(env["WORKLEASE_WORK_ID"], "jobs/env test");
    assert_eq!(env["WORKLEASE_HOLDER_ID"], "alpha");
    assert_eq!(env["WORKLEASE_STORE"], w.store);
    let token: Token = env["WORKLEASE_TOKEN"]
        .parse()
        .expect("the token's text form");
    assert_eq!(token.work_id().as_str(), "jobs/env test");
    assert_eq!(token.holder_id().as_str(), "alpha");
    assert_eq!(
        env["WORKLEASE_FENCING_TOKEN"],
        token.fencing_token().to_string()
    );

    // The default holder ID is <hostname>:<pid of worklease>.
    let run = w.spawn_sh(
        &["run", "job2"],
        "echo \"$WORKLEASE_HOLDER_ID\" > \"$D/holder\"",
    );
    let pid = run.pid();
    run.exits(0);
    let host = nix::unistd::gethostname()
        .expect("hostname")
        .into_string()
        .expect("utf-8");
    assert_eq!(w.read("holder").trim(), format!("{host}:{pid}"));
}

#[test]
fn the_childs_exit_status_is_passed_through() {
    let w = World::new();
    let status = |script: &str| w.sh(&["run", "job"], script).status.code();
    assert_eq!(status("exit 0"), Some(0));
    assert_eq!(status("exit 3"), Some(3));
    assert_eq!(status("kill -TERM $$"), Some(128 + 15));
    assert_eq!(status("kill -KILL $$"), Some(128 + 9));
    let missing = w.output(&["run", "job", "--", "/no/such/command"]);
    assert_exit(&missing, 127);
    // Every run above released the lease: the next one is not held.
    assert_eq!(status("true"), Some(0));
}

#[test]
fn sigterm_to_run_is_forwarded_to_the_child() {
    let w = World::new();
    let run = w.start_sh(&["run", "job"], &term_trapping_script("a", "exit 7"), "a");
    run.signal(Signal::SIGTERM);
    run.exits(7);
    assert!(w.path("got_term").exists());
    // Released: the next holder gets a clean hand-off at once.
    let out = w.output(&["status", "--json", "job"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["released"], true);
}

#[test]
fn a_child_that_ignores_sigterm_gets_sigkill_after_the_grace() {
    let w = World::new();
    let script = format!("trap '' TERM; {}", holder_script("a"));
    let run = w.start_sh(
        &["run", "--ttl", "1s", "--grace", "300ms", "job"],
        &script,
        "a",
    );
    let child: i32 = w.read_pid("a.pid");

    let out = w.output(&["release", "--force", "job"]);
    assert_exit(&out, 0);
    run.exits(76);
    assert!(process_gone(child), "the child survived SIGKILL");
}

#[test]
fn a_signal_ends_a_wait_with_128_plus_n() {
    let w = World::new();
    let first = w.hold(&["run", "--ttl", "5s", "job"], "a");
    let mut second = w.spawn_sh(&["-v", "run", "--wait", "job"], &holder_script("b"));
    second.wait_for_line("waiting for it", LONG);

    second.signal(Signal::SIGTERM);
    second.exits(128 + 15);
    assert!(!w.path("b.started").exists());

    w.touch("a.stop");
    first.exits(0);
}

#[test]
fn a_store_url_with_four_slashes_reaches_the_child_as_the_same_file() {
    let mut w = World::new();
    w.store = format!("sqlite:///{}", w.store_path().display());
    let out = w.sh(
        &["run", "job"],
        "printf %s \"$WORKLEASE_STORE\" > \"$D/store.txt\"; \"$WL\" checkpoint set ok",
    );
    assert_exit(&out, 0);
    let url = w.read("store.txt");
    assert_eq!(url, format!("sqlite:///{}", w.store_path().display()));
    let out = w.output(&["status", "--json", "job"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["checkpoint_bytes"], 2);
}

#[test]
fn a_terminal_on_stdin_is_replaced_by_dev_null() {
    let w = World::new();
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let script = "if [ -t 0 ]; then echo tty; else echo not-a-tty; fi > \"$D/stdin.txt\"; \
                  cat > \"$D/read.txt\"";
    let mut cmd = w.cmd(&["-v", "run", "job", "--", "sh", "-c", script]);
    cmd.stdin(Stdio::from(pty.slave));
    let run = Watched::start(cmd);
    let (status, err) = run.wait(LONG);
    drop(pty.master);
    assert_eq!(code(status), 0, "{err}");
    assert_eq!(w.read("stdin.txt").trim(), "not-a-tty");
    assert_eq!(w.read("read.txt"), "");
    assert!(err.contains("/dev/null"), "not said: {err}");

    // Input through a pipe still reaches the child.
    let mut cmd = w.cmd(&["run", "job", "--", "sh", "-c", "cat > \"$D/piped.txt\""]);
    cmd.stdin(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), b"hello").expect("write");
    let out = child.wait_with_output().expect("wait");
    assert_exit(&out, 0);
    assert_eq!(w.read("piped.txt"), "hello");
}
