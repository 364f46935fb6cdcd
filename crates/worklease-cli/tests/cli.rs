//! End-to-end tests: real `worklease` processes against a SQLite file in a
//! temporary directory.
//!
//! Synchronisation is by signals the processes give (a file a child
//! creates, a line `worklease` writes to stderr), polled in bounded loops;
//! no sleep stands in for an event.

mod common;
use common::{
    group_stopped, holder_script, poll_until, process_gone, process_state, stopped, World, LONG,
};

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use worklease::Token;

impl World {
    fn output(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run worklease")
    }

    /// Starts `worklease ARGS` in the background; its stderr lines arrive on
    /// a channel.
    fn spawn(&self, args: &[&str]) -> Running {
        Running::start(self.cmd(args))
    }

    /// The store file's path.
    fn store_path(&self) -> PathBuf {
        self.path("store/leases.db")
    }

    /// Holds the store's write lock until dropped: every renewal meanwhile
    /// waits for it and fails (a store that does not answer).
    fn lock_store(&self) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(self.store_path()).expect("open the store file");
        conn.busy_timeout(Duration::from_secs(10))
            .expect("busy timeout");
        conn.execute_batch("BEGIN IMMEDIATE")
            .expect("take the write lock");
        conn
    }
}

impl Running {
    /// Starts `cmd` in the background; its stderr lines arrive on a channel.
    fn start(mut cmd: Command) -> Running {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn worklease");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }
}

impl World {
    fn touch(&self, name: &str) {
        std::fs::write(self.path(name), b"").expect("touch");
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_else(|e| panic!("read {name}: {e}"))
    }

    fn read_token(&self, name: &str) -> u64 {
        self.read(name).trim().parse().expect("a fencing token")
    }

    /// Waits (bounded) until the file `name` exists.
    fn wait_for_file(&self, name: &str, timeout: Duration) {
        let path = self.path(name);
        assert!(
            poll_until(timeout, || path.exists()),
            "{} did not appear within {timeout:?}",
            path.display()
        );
    }
}

/// A background `worklease`; killed if the test ends without waiting.
struct Running {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid")
    }

    /// Waits (bounded) for a stderr line containing `needle`.
    fn wait_for_line(&mut self, needle: &str, timeout: Duration) {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(needle);
                    self.seen.push(line);
                    if found {
                        return;
                    }
                }
                Err(_) => panic!(
                    "no stderr line with {needle:?} within {timeout:?}; saw: {:#?}",
                    self.seen
                ),
            }
        }
    }

    /// Waits (bounded) for the exit; returns the status and all stderr.
    fn wait(mut self, timeout: Duration) -> (ExitStatus, String) {
        let end = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                Instant::now() < end,
                "worklease did not exit within {timeout:?}; stderr so far: {:#?}",
                self.seen
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        // The reader thread ends at EOF, which follows the exit (children of
        // the child inherit nothing of worklease's stderr pipe but theirs).
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.seen.push(line);
        }
        (status, self.seen.join("\n"))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).expect("send a signal");
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| panic!("worklease ended by a signal: {status:?}"))
}

#[test]
fn a_second_run_exits_75_naming_the_holder() {
    let w = World::new();
    let first = w.spawn(&[
        "run",
        "--ttl",
        "5s",
        "--holder",
        "alpha",
        "job",
        "--",
        "sh",
        "-c",
        &holder_script("a"),
    ]);
    w.wait_for_file("a.started", LONG);

    let second = w.output(&[
        "run",
        "--holder",
        "beta",
        "job",
        "--",
        "sh",
        "-c",
        "touch \"$D/b.ran\"",
    ]);
    assert_eq!(second.status.code(), Some(75), "{}", stderr(&second));
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
    let (status, err) = first.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
}

#[test]
fn a_waiting_run_runs_after_the_first_with_a_larger_fencing_token() {
    let w = World::new();
    let first = w.spawn(&[
        "run",
        "--ttl",
        "5s",
        "--holder",
        "alpha",
        "job",
        "--",
        "sh",
        "-c",
        &holder_script("a"),
    ]);
    w.wait_for_file("a.started", LONG);

    let script = "echo \"$WORKLEASE_FENCING_TOKEN\" > \"$D/b.token\"; test -e \"$D/a.stop\"";
    let mut second = w.spawn(&[
        "-v", "run", "--wait", "--poll", "100ms", "--holder", "beta", "job", "--", "sh", "-c",
        script,
    ]);
    second.wait_for_line("waiting for it", LONG);
    assert!(
        !w.path("b.token").exists(),
        "the second child ran while the first held the lease"
    );

    w.touch("a.stop");
    let (status, err) = first.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
    // The second child checks that the first was told to stop before it ran.
    let (status, err) = second.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
    assert!(w.read_token("b.token") > w.read_token("a.token"));
}

#[test]
fn sigkill_of_a_holder_lets_a_waiter_in_within_ttl_plus_poll() {
    let w = World::new();
    let ttl = Duration::from_secs(1);
    let poll = Duration::from_millis(200);
    let first = w.spawn(&[
        "run",
        "--ttl",
        "1s",
        "--holder",
        "alpha",
        "job",
        "--",
        "sh",
        "-c",
        &holder_script("a"),
    ]);
    w.wait_for_file("a.started", LONG);
    let first_child: i32 = w.read("a.pid").trim().parse().expect("pid");

    let mut second = w.spawn(&[
        "-v",
        "run",
        "--wait",
        "--poll",
        "200ms",
        "--holder",
        "beta",
        "job",
        "--",
        "sh",
        "-c",
        &holder_script("b"),
    ]);
    second.wait_for_line("waiting for it", LONG);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9 the holder");
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
    let (status, err) = second.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
}

#[test]
fn release_force_stops_the_child_and_run_exits_76() {
    let w = World::new();
    let script = format!(
        "trap 'touch \"$D/got_term\"; exit 0' TERM; {}",
        holder_script("a")
    );
    let run = w.spawn(&[
        "run", "--ttl", "5s", "--grace", "1s", "--holder", "alpha", "job", "--", "sh", "-c",
        &script,
    ]);
    w.wait_for_file("a.started", LONG);

    let refused = w.output(&["release", "job"]);
    assert_eq!(refused.status.code(), Some(64), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("--force"), "{}", stderr(&refused));

    let out = w.output(&["release", "--force", "job"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("revoked") && said.contains("\"alpha\""),
        "{said}"
    );

    let (status, err) = run.wait(LONG);
    assert_eq!(code(status), 76, "{err}");
    assert!(w.path("got_term").exists(), "the child did not get SIGTERM");
    assert!(err.contains("SIGTERM"), "{err}");

    let unknown = w.output(&["release", "--force", "no-such-job"]);
    assert_eq!(unknown.status.code(), Some(1), "{}", stderr(&unknown));
}

#[test]
fn the_child_sees_every_worklease_variable() {
    let w = World::new();
    let script = "env | grep '^WORKLEASE_' > \"$D/env.txt\"";
    let out = w.output(&[
        "run",
        "--holder",
        "alpha",
        "jobs/env test",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
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
    let run = w.spawn(&[
        "run",
        "job2",
        "--",
        "sh",
        "-c",
        "echo \"$WORKLEASE_HOLDER_ID\" > \"$D/holder\"",
    ]);
    let pid = run.pid();
    let (status, err) = run.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
    let host = nix::unistd::gethostname()
        .expect("hostname")
        .into_string()
        .expect("utf-8");
    assert_eq!(w.read("holder").trim(), format!("{host}:{pid}"));
}

#[test]
fn the_childs_exit_status_is_passed_through() {
    let w = World::new();
    let status = |script: &str| {
        w.output(&["run", "job", "--", "sh", "-c", script])
            .status
            .code()
    };
    assert_eq!(status("exit 0"), Some(0));
    assert_eq!(status("exit 3"), Some(3));
    assert_eq!(status("kill -TERM $$"), Some(128 + 15));
    assert_eq!(status("kill -KILL $$"), Some(128 + 9));
    let missing = w.output(&["run", "job", "--", "/no/such/command"]);
    assert_eq!(missing.status.code(), Some(127), "{}", stderr(&missing));
    // Every run above released the lease: the next one is not held.
    assert_eq!(status("true"), Some(0));
}

#[test]
fn sigterm_to_run_is_forwarded_to_the_child() {
    let w = World::new();
    let script = format!(
        "trap 'touch \"$D/got_term\"; exit 7' TERM; {}",
        holder_script("a")
    );
    let run = w.spawn(&["run", "job", "--", "sh", "-c", &script]);
    w.wait_for_file("a.started", LONG);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.pid()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal worklease");
    let (status, err) = run.wait(LONG);
    assert_eq!(code(status), 7, "{err}");
    assert!(w.path("got_term").exists());
    // Released: the next holder gets a clean hand-off at once.
    let out = w.output(&["status", "--json", "job"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["released"], true);
}

/// All 256 byte values, twice.
fn binary_data() -> Vec<u8> {
    (0..512u32).map(|i| (i % 256) as u8).collect()
}

fn checkpoint_json(w: &World, file: &str) -> serde_json::Value {
    serde_json::from_str(&w.read(file)).unwrap_or_else(|e| panic!("{file}: {e}: {}", w.read(file)))
}

#[test]
fn checkpoints_round_trip_binary_data_with_a_clean_hand_off() {
    let w = World::new();
    let data = binary_data();
    std::fs::write(w.path("data.bin"), &data).expect("write data");

    let set = "\"$WL\" checkpoint set < \"$D/data.bin\"";
    let out = w.output(&["run", "--holder", "alpha", "job", "--", "sh", "-c", set]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let get = "\"$WL\" checkpoint get > \"$D/out.bin\" 2> \"$D/get.err\" && \"$WL\" checkpoint get --json > \"$D/get.json\"";
    let out = w.output(&["run", "--holder", "beta", "job", "--", "sh", "-c", get]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(std::fs::read(w.path("out.bin")).expect("out.bin"), data);
    let note = w.read("get.err");
    assert!(
        note.contains("clean hand-off: yes") && note.contains("\"alpha\""),
        "{note}"
    );
    let json = checkpoint_json(&w, "get.json");
    assert_eq!(json["clean_handoff"], true);
    assert_eq!(json["checkpoint_bytes"], data.len());
    assert_eq!(
        json["checkpoint_text"],
        serde_json::Value::Null,
        "not UTF-8"
    );
    assert_eq!(json["previous_holder"]["holder_id"], "alpha");
    assert_eq!(json["previous_holder"]["ended"], "released");
    assert!(json["checkpoint_base64"]
        .as_str()
        .is_some_and(|s| s.len() == 684));

    // A text checkpoint given as an argument.
    let out = w.output(&[
        "run",
        "job",
        "--",
        "sh",
        "-c",
        "\"$WL\" checkpoint set 'page 7'",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = w.output(&[
        "run",
        "job",
        "--",
        "sh",
        "-c",
        "\"$WL\" checkpoint get --json > \"$D/text.json\"",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        checkpoint_json(&w, "text.json")["checkpoint_text"],
        "page 7"
    );
}

#[test]
fn after_a_sigkilled_holder_the_hand_off_is_not_clean() {
    let w = World::new();
    let script = format!("\"$WL\" checkpoint set 'page 7' && {}", holder_script("a"));
    let first = w.spawn(&[
        "run", "--ttl", "1s", "--holder", "alpha", "job", "--", "sh", "-c", &script,
    ]);
    w.wait_for_file("a.started", LONG);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9 the holder");
    drop(first);

    let get = "\"$WL\" checkpoint get > \"$D/out.txt\" 2> \"$D/get.err\" && \"$WL\" checkpoint get --json > \"$D/get.json\"";
    let out = w.output(&[
        "run", "--wait", "--poll", "100ms", "job", "--", "sh", "-c", get,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(w.read("out.txt"), "page 7");
    assert!(
        w.read("get.err").contains("clean hand-off: no"),
        "{}",
        w.read("get.err")
    );
    let json = checkpoint_json(&w, "get.json");
    assert_eq!(json["clean_handoff"], false);
    assert_eq!(json["previous_holder"]["ended"], "expired");
    assert_eq!(json["previous_holder"]["holder_id"], "alpha");
}

#[test]
fn a_checkpoint_from_a_stale_token_exits_76_and_writes_nothing() {
    let w = World::new();
    let first = "\"$WL\" checkpoint set first && printf %s \"$WORKLEASE_TOKEN\" > \"$D/token1\"";
    let out = w.output(&["run", "job", "--", "sh", "-c", first]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = w.output(&[
        "run",
        "job",
        "--",
        "sh",
        "-c",
        "\"$WL\" checkpoint set second",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let stale = w.read("token1");
    let out = w.output(&["checkpoint", "set", "--token", &stale, "stale"]);
    assert_eq!(out.status.code(), Some(76), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing was written"),
        "{}",
        stderr(&out)
    );
    let out = w.output(&["checkpoint", "get", "--token", &stale]);
    assert_eq!(out.status.code(), Some(76), "{}", stderr(&out));

    let out = w.output(&["status", "--json", "job"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["checkpoint_bytes"], "second".len());
}

#[test]
fn usage_errors_exit_64() {
    let w = World::new();
    let cases: &[&[&str]] = &[
        &["run", "--ttl", "0", "job", "--", "true"],
        &["run", "--ttl", "soon", "job", "--", "true"],
        &["run", "", "--", "true"],
        &["run", "--store", "bogus://x", "job", "--", "true"],
        &["run", "--store", "/tmp/leases.db", "job", "--", "true"],
        &["run", "job"],
        &["run", "job", "--", ""],
        &["elect", "job", "--", ""],
        &["run", "--poll", "0s", "job", "--", "true"],
        &["run", "--no-such-flag", "job", "--", "true"],
        &["status", "--store", "bogus://x"],
        &["release", "job"],
        &["checkpoint", "set", "data"],
        &["checkpoint", "get", "--token", "not-a-token"],
        &[],
    ];
    for args in cases {
        let out = w.output(args);
        assert_eq!(
            out.status.code(),
            Some(64),
            "worklease {args:?}: {}",
            stderr(&out)
        );
        assert!(
            !stderr(&out).trim().is_empty(),
            "worklease {args:?} said nothing"
        );
    }
    // An empty program name is refused before the store is touched.
    assert!(!w.store_path().exists(), "a usage error created the store");
    let out = w.output(&["run", "job", "--", ""]);
    assert!(
        stderr(&out).contains("no command: the program name after `--` is empty"),
        "{}",
        stderr(&out)
    );
    let out = w.output(&["run", "--store", "bogus://x", "job", "--", "true"]);
    assert!(
        stderr(&out).contains("unknown store scheme"),
        "{}",
        stderr(&out)
    );

    // Credentials never show, whatever this build says of the store (not
    // built in, or a malformed URL: BAD-NAME is no valid table name).
    for url in [
        "postgres://app:hunter2@db/leases?table=BAD-NAME",
        "postgres://app:hunter2?table=BAD-NAME",
        "host=db password=hunter2 user=app",
        "redis://:hunter2@cache:6379/0?prefix_typo=x",
    ] {
        let out = w.output(&["status", "--store", url]);
        assert_eq!(out.status.code(), Some(64), "{url}: {}", stderr(&out));
        assert!(
            !stderr(&out).contains("hunter2") && stderr(&out).contains("***"),
            "{url}: {}",
            stderr(&out)
        );
    }

    for args in [&["--help"][..], &["run", "--help"], &["--version"]] {
        let out = w.output(args);
        assert_eq!(out.status.code(), Some(0), "worklease {args:?}");
    }
    let help = String::from_utf8_lossy(&w.output(&["--help"]).stdout).into_owned();
    assert!(
        help.contains("75") && help.contains("76") && help.contains("64"),
        "{help}"
    );
}

#[test]
fn status_shows_live_and_released_leases() {
    let w = World::new();
    let out = w.output(&[
        "run",
        "done",
        "--",
        "sh",
        "-c",
        "\"$WL\" checkpoint set abc",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = w.output(&["run", "done", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let live = w.spawn(&[
        "run",
        "--ttl",
        "10s",
        "--holder",
        "alpha",
        "live",
        "--",
        "sh",
        "-c",
        &holder_script("a"),
    ]);
    w.wait_for_file("a.started", LONG);

    let out = w.output(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 2);
    let fields: BTreeSet<&str> = [
        "work_id",
        "holder_id",
        "fencing_token",
        "expires_at",
        "expired",
        "released",
        "checkpoint_bytes",
        "clean_handoff",
        "ended",
        "previous_holder",
        "expiry",
    ]
    .into();
    for v in &lines {
        let keys: BTreeSet<&str> = v
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, fields);
        humantime::parse_rfc3339(v["expires_at"].as_str().expect("string")).expect("RFC 3339");
        // SQLite judges expiry by its own clock (an s3:// store by observation).
        assert_eq!(v["expiry"], "by-store-clock");
    }
    let done = &lines[0];
    assert_eq!(done["work_id"], "done");
    assert_eq!(done["released"], true);
    assert_eq!(done["expired"], true);
    assert_eq!(done["checkpoint_bytes"], 3);
    assert_eq!(done["clean_handoff"], true);
    assert_eq!(done["ended"], "released");
    assert_eq!(done["previous_holder"]["ended"], "released");
    let held = &lines[1];
    assert_eq!(held["work_id"], "live");
    assert_eq!(held["holder_id"], "alpha");
    assert_eq!(held["fencing_token"], w.read_token("a.token"));
    assert_eq!(held["released"], false);
    assert_eq!(held["expired"], false);
    assert_eq!(held["clean_handoff"], false);
    assert_eq!(held["ended"], serde_json::Value::Null);
    assert_eq!(held["previous_holder"], serde_json::Value::Null);

    let out = w.output(&["status"]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        table.contains("WORK ID") && table.contains("CLEAN HAND-OFF"),
        "{table}"
    );
    assert!(
        table.contains("alpha") && table.contains("released"),
        "{table}"
    );

    let out = w.output(&["status", "--json", "live", "nope"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);

    w.touch("a.stop");
    let (status, err) = live.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
}

#[test]
fn a_child_that_ignores_sigterm_gets_sigkill_after_the_grace() {
    let w = World::new();
    let script = format!("trap '' TERM; {}", holder_script("a"));
    let run = w.spawn(&[
        "run", "--ttl", "1s", "--grace", "300ms", "job", "--", "sh", "-c", &script,
    ]);
    w.wait_for_file("a.started", LONG);
    let child: i32 = w.read("a.pid").trim().parse().expect("pid");

    let out = w.output(&["release", "--force", "job"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (status, err) = run.wait(LONG);
    assert_eq!(code(status), 76, "{err}");
    assert!(process_gone(child), "the child survived SIGKILL");
}

#[test]
fn a_signal_ends_a_wait_with_128_plus_n() {
    let w = World::new();
    let first = w.spawn(&[
        "run",
        "--ttl",
        "5s",
        "job",
        "--",
        "sh",
        "-c",
        &holder_script("a"),
    ]);
    w.wait_for_file("a.started", LONG);
    let mut second = w.spawn(&[
        "-v",
        "run",
        "--wait",
        "job",
        "--",
        "sh",
        "-c",
        &holder_script("b"),
    ]);
    second.wait_for_line("waiting for it", LONG);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(second.pid()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal the waiting worklease");
    let (status, err) = second.wait(LONG);
    assert_eq!(code(status), 128 + 15, "{err}");
    assert!(!w.path("b.started").exists());

    w.touch("a.stop");
    let (status, err) = first.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
}

/// Starts `worklease -v elect` for `name` in `election` with a 1 s TTL,
/// once it reports that it is campaigning.
fn elect(w: &World, election: &str, name: &str) -> Running {
    let script = holder_script(name);
    let mut r = w.spawn(&[
        "-v", "elect", "--ttl", "1s", "--poll", "100ms", "--holder", name, election, "--", "sh",
        "-c", &script,
    ]);
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
    let (status, err) = a.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
    w.wait_for_file("b.started", LONG);
    assert!(
        stopped.elapsed() < Duration::from_secs(1),
        "a graceful step-down hands over within a poll, not a TTL: {:?}",
        stopped.elapsed()
    );
    assert!(w.read_token("b.token") > a_token, "generations increase");
    w.touch("b.stop");
    let (status, err) = b.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
}

/// A standby whose campaign meets a store failure (here: the SQLite write
/// lock held past the busy timeout) keeps campaigning instead of exiting
/// 69, and leads once the leader steps down.
#[test]
fn elect_a_standby_survives_a_store_failure_while_campaigning() {
    let w = World::new();
    let start = |name: &str| {
        let script = holder_script(name);
        let mut r = w.spawn(&[
            "-v", "elect", "--ttl", "30s", "--poll", "100ms", "--holder", name, "outage", "--",
            "sh", "-c", &script,
        ]);
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
    let (status, err) = a.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
    w.wait_for_file("b.started", LONG);
    w.touch("b.stop");
    let (status, err) = b.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
}

#[test]
fn elect_after_sigkill_of_the_leader_a_standby_leads_within_ttl_plus_poll() {
    let w = World::new();
    let a = elect(&w, "compactor", "a");
    w.wait_for_file("a.started", LONG);
    let child_pid: i32 = w.read("a.pid").trim().parse().expect("pid");
    let b = elect(&w, "compactor", "b");
    let killed = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(a.pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
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
    let (status, err) = b.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
}

#[test]
fn elect_stops_the_child_and_exits_76_when_leadership_is_revoked() {
    let w = World::new();
    let a = elect(&w, "indexer", "a");
    w.wait_for_file("a.started", LONG);
    let out = w.output(&["release", "--force", "indexer"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (status, err) = a.wait(LONG);
    assert_eq!(code(status), 76, "{err}");
    assert!(
        err.contains("revoked"),
        "the message names the cause: {err}"
    );
}

// ---------------------------------------------------------------------------
// The child is gone by the lease deadline when renewal fails.

/// A child script that notes SIGTERM (`$D/got_term`) and runs on.
fn term_noting_script(name: &str) -> String {
    format!("trap 'touch \"$D/got_term\"' TERM; {}", holder_script(name))
}

/// `sh -c` text that writes `$D/<file>`: `gone` or the state letter of the
/// process whose PID is in `$D/<pid_file>`.
fn probe_script(pid_file: &str, file: &str) -> String {
    format!(
        "p=$(cat \"$D/{pid_file}\"); s=$(cut -d' ' -f3 \"/proc/$p/stat\" 2>/dev/null); \
         echo \"${{s:-gone}}\" > \"$D/{file}\""
    )
}

#[test]
fn when_renewal_fails_the_child_is_killed_by_the_deadline_before_anyone_else_holds_the_lease() {
    let w = World::new();
    // TTL 6s: the default --grace is 1.5s; the holder's deadline is 5.4s
    // after the last successful renewal was sent, the store's expiry 6s.
    let mut a = w.spawn(&[
        "run",
        "--ttl",
        "6s",
        "--holder",
        "alpha",
        "job",
        "--",
        "sh",
        "-c",
        &term_noting_script("a"),
    ]);
    w.wait_for_file("a.started", LONG);
    let child: i32 = w.read("a.pid").trim().parse().expect("pid");
    let lock = w.lock_store();
    a.wait_for_line("lease renewal is failing", LONG);
    a.wait_for_line("renewal failed until the lease window ran out", LONG);
    drop(lock);
    let (status, err) = a.wait(LONG);
    assert_eq!(code(status), 76, "{err}");
    assert!(
        w.path("got_term").exists(),
        "no SIGTERM before the SIGKILL: {err}"
    );
    assert!(process_gone(child), "the child outlived the lease: {err}");

    // The next holder gets the lease once it expired by the store's clock;
    // by then the first child was dead (it ignores SIGTERM: SIGKILL at the
    // holder's deadline, not --grace after it).
    let out = w.output(&[
        "run",
        "--wait",
        "--poll",
        "50ms",
        "--holder",
        "beta",
        "job",
        "--",
        "sh",
        "-c",
        &probe_script("a.pid", "verdict"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let verdict = w.read("verdict");
    assert!(
        matches!(verdict.trim(), "gone" | "Z"),
        "the first holder's child still ran when the next holder started: {verdict}"
    );
}

#[test]
fn a_renewal_that_succeeds_after_the_sigterm_cancels_the_sigkill() {
    let w = World::new();
    let mut a = w.spawn(&[
        "run",
        "--ttl",
        "6s",
        "--grace",
        "2s",
        "job",
        "--",
        "sh",
        "-c",
        &term_noting_script("a"),
    ]);
    w.wait_for_file("a.started", LONG);
    let child: i32 = w.read("a.pid").trim().parse().expect("pid");
    let lock = w.lock_store();
    a.wait_for_line("lease renewal is failing", LONG);
    drop(lock);
    a.wait_for_line("renewed after all", LONG);
    assert!(
        !process_gone(child),
        "the child was killed although the lease was renewed"
    );
    w.touch("a.stop");
    let (status, err) = a.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
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
fn grace_longer_than_half_the_ttl_is_a_usage_error() {
    let w = World::new();
    for args in [
        &["run", "--ttl", "10s", "--grace", "6s", "job", "--", "true"][..],
        &["run", "--grace", "1000000000000s", "job", "--", "true"],
        &[
            "elect", "--ttl", "1s", "--grace", "600ms", "e", "--", "true",
        ],
    ] {
        let out = w.output(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("TTL/2"), "{args:?}: {}", stderr(&out));
    }
    assert!(!w.path("store").exists(), "a refused run created the store");
}

#[test]
fn work_ids_worklease_keeps_for_itself_are_a_usage_error_before_the_store_is_touched() {
    let w = World::new();
    for args in [
        &["run", "jobs/fair-queue", "--", "true"][..],
        &[
            "run",
            "--fair",
            "--wait",
            "jobs/fair-waiter/3",
            "--",
            "true",
        ],
        &["run", "--permits", "2", "sched/step-down", "--", "true"],
        &["pool", "--work-ids", "a,jobs/fair-queue", "--", "true"],
        &["elect", "a/permit/line", "--", "true"],
        &["elect", "a/step-down", "--", "true"],
    ] {
        let out = w.output(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("is reserved for"),
            "{args:?}: {}",
            stderr(&out)
        );
        // Said once: not clap's "invalid value ...: invalid input: ...".
        assert_eq!(
            stderr(&out).matches("invalid").count(),
            1,
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert!(
        !w.path("store").exists(),
        "a refused command created the store"
    );
}

// ---------------------------------------------------------------------------
// Job control, signals and a stopped child.

#[test]
fn ctrl_z_stops_the_child_with_worklease_and_sigcont_continues_both() {
    let w = World::new();
    let run = w.spawn(&[
        "run",
        "--ttl",
        "5s",
        "job",
        "--",
        "sh",
        "-c",
        &holder_script("a"),
    ]);
    w.wait_for_file("a.started", LONG);
    let child: i32 = w.read("a.pid").trim().parse().expect("pid");
    signal(run.pid(), nix::sys::signal::Signal::SIGTSTP);
    assert!(
        poll_until(LONG, || stopped(run.pid()) && group_stopped(child)),
        "worklease {:?}, child {:?}",
        process_state(run.pid()),
        process_state(child)
    );
    signal(run.pid(), nix::sys::signal::Signal::SIGCONT);
    assert!(
        poll_until(LONG, || !group_stopped(child)),
        "the child was not continued"
    );
    w.touch("a.stop");
    let (status, err) = run.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
}

#[test]
fn sigcont_after_the_lease_expired_kills_the_stopped_child_and_exits_76() {
    let w = World::new();
    let run = w.spawn(&[
        "run",
        "--ttl",
        "1s",
        "job",
        "--",
        "sh",
        "-c",
        &holder_script("a"),
    ]);
    w.wait_for_file("a.started", LONG);
    let child: i32 = w.read("a.pid").trim().parse().expect("pid");
    signal(run.pid(), nix::sys::signal::Signal::SIGTSTP);
    assert!(
        poll_until(LONG, || stopped(run.pid()) && group_stopped(child)),
        "worklease {:?}, child {:?}",
        process_state(run.pid()),
        process_state(child)
    );
    // The lease runs out while both are stopped.
    assert!(
        poll_until(LONG, || {
            let out = w.output(&["status", "--json", "job"]);
            serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .is_ok_and(|v| v["expired"] == true)
        }),
        "the lease did not expire"
    );
    signal(run.pid(), nix::sys::signal::Signal::SIGCONT);
    let (status, err) = run.wait(LONG);
    assert_eq!(code(status), 76, "{err}");
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
    let script = format!(
        "trap 'touch \"$D/got_term\"; exit 7' TERM; {}",
        holder_script("a")
    );
    let run = w.spawn(&["run", "job", "--", "sh", "-c", &script]);
    w.wait_for_file("a.started", LONG);
    let child: i32 = w.read("a.pid").trim().parse().expect("pid");
    signal(child, nix::sys::signal::Signal::SIGSTOP);
    assert!(poll_until(LONG, || stopped(child)));
    signal(run.pid(), nix::sys::signal::Signal::SIGTERM);
    let (status, err) = run.wait(LONG);
    assert_eq!(code(status), 7, "{err}");
    assert!(w.path("got_term").exists());
}

#[test]
fn a_terminal_on_stdin_is_replaced_by_dev_null() {
    let w = World::new();
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let script = "if [ -t 0 ]; then echo tty; else echo not-a-tty; fi > \"$D/stdin.txt\"; \
                  cat > \"$D/read.txt\"";
    let mut cmd = w.cmd(&["-v", "run", "job", "--", "sh", "-c", script]);
    cmd.stdin(Stdio::from(pty.slave));
    let run = Running::start(cmd);
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
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(w.read("piped.txt"), "hello");
}

// ---------------------------------------------------------------------------
// Processes the child leaves behind.

#[test]
fn processes_left_in_the_childs_group_are_stopped_before_the_release() {
    let w = World::new();
    let script = "sleep 1000 & echo $! > \"$D/bg.pid\"; exit 3";
    let run = w.spawn(&["run", "job", "--", "sh", "-c", script]);
    let (status, err) = run.wait(LONG);
    assert_eq!(code(status), 3, "{err}");
    assert!(err.contains("still run in its process group"), "{err}");
    let bg: i32 = w.read("bg.pid").trim().parse().expect("pid");
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
    let mut a = w.spawn(&[
        "run", "--ttl", "4s", "--grace", "500ms", "job", "--", "sh", "-c", script,
    ]);
    a.wait_for_line("still run in its process group", LONG);
    // The next holder waits for the release, which follows the SIGKILL.
    let b = w.spawn(&[
        "run",
        "--wait",
        "--poll",
        "20ms",
        "job",
        "--",
        "sh",
        "-c",
        &probe_script("bg.pid", "verdict"),
    ]);
    let (status, err) = a.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
    let (status, err) = b.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
    let verdict = w.read("verdict");
    assert!(
        matches!(verdict.trim(), "gone" | "Z"),
        "a process of the first holder's child ran when the next holder started: {verdict}"
    );
}

// ---------------------------------------------------------------------------
// Nothing is written for arguments that cannot work; read-only commands
// create no store.

#[test]
fn a_ttl_too_short_to_renew_exits_64_and_writes_nothing() {
    let w = World::new();
    for args in [
        &["run", "--wait", "--ttl", "1ms", "job", "--", "true"][..],
        &["run", "--wait", "--ttl", "2ms", "job", "--", "true"],
        &["run", "--ttl", "2ms", "job", "--", "true"],
        &["elect", "--ttl", "2ms", "e", "--", "true"],
    ] {
        let out = w.output(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("at least 3ms"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert!(!w.path("store").exists(), "a refused run created the store");
}

#[test]
fn read_only_commands_on_a_missing_store_exit_69_and_create_nothing() {
    let w = World::new();
    let token = "wl1;work=job;holder=h;fencing_token=1;expires_at_ms=0;ttl_ms=1000";
    for args in [
        &["status"][..],
        &["status", "--json", "job"],
        &["release", "--force", "job"],
        &["checkpoint", "get", "--token", token],
        &["checkpoint", "set", "--token", token, "data"],
    ] {
        let out = w.output(args);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("no store at") && err.contains(&w.store_path().display().to_string()),
            "{args:?}: {err}"
        );
    }
    assert!(
        !w.path("store").exists(),
        "a read-only command created the store"
    );

    // A `~` no shell expanded.
    let out = w.output(&["status", "--store", "sqlite:~/leases.db"]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains("$HOME"), "{}", stderr(&out));
}

#[test]
fn a_store_url_with_four_slashes_reaches_the_child_as_the_same_file() {
    let mut w = World::new();
    w.store = format!("sqlite:///{}", w.store_path().display());
    let out = w.output(&[
        "run",
        "job",
        "--",
        "sh",
        "-c",
        "printf %s \"$WORKLEASE_STORE\" > \"$D/store.txt\"; \"$WL\" checkpoint set ok",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let url = w.read("store.txt");
    assert_eq!(url, format!("sqlite:///{}", w.store_path().display()));
    let out = w.output(&["status", "--json", "job"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["checkpoint_bytes"], 2);
}

#[test]
fn release_force_of_a_revoked_lease_says_revoked() {
    let w = World::new();
    let run = w.spawn(&[
        "run",
        "--ttl",
        "2s",
        "--grace",
        "200ms",
        "job",
        "--",
        "sh",
        "-c",
        &holder_script("a"),
    ]);
    w.wait_for_file("a.started", LONG);
    let out = w.output(&["release", "--force", "job"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (status, err) = run.wait(LONG);
    assert_eq!(code(status), 76, "{err}");
    // The last line says that the status is worklease's, and the child's.
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("worklease: exit 76: ") && last.contains("own status: 143"),
        "{err}"
    );
    let out = w.output(&["release", "--force", "job"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("already ended (revoked;"), "{said}");
    let out = w.output(&["status", "--json", "job"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["ended"], "revoked");
}

#[test]
fn help_is_honest_about_polling_and_exit_statuses() {
    let w = World::new();
    let help = |args: &[&str]| String::from_utf8_lossy(&w.output(args).stdout).into_owned();
    let main = help(&["--help"]);
    assert!(!main.contains("exactly one machine"), "{main}");
    assert!(
        main.contains("across") && main.contains("networked store"),
        "{main}"
    );
    for sub in ["run", "elect"] {
        let text = help(&[sub, "--help"]);
        assert!(!text.contains("at once when it releases"), "{text}");
        assert!(!text.contains("leads at once"), "{text}");
        // Woken at once where the store notifies (SQLite across processes
        // too, since issue 18), at the next poll on S3.
        assert!(
            text.contains("woken at once") && text.contains("S3"),
            "{text}"
        );
        assert!(text.contains("TTL/2") && text.contains("SIGSTOP"), "{text}");
        assert!(text.contains("`worklease:`"), "{text}");
    }
    let run = help(&["run", "--help"]);
    assert!(run.contains("/dev/null") && run.contains("Ctrl-Z"), "{run}");
    // A clap usage error says `worklease:` too.
    let out = w.output(&["run", "--no-such-flag", "job", "--", "true"]);
    assert!(stderr(&out).starts_with("worklease: "), "{}", stderr(&out));
}

#[test]
fn a_child_stopped_because_renewal_keeps_failing_makes_run_exit_76() {
    let w = World::new();
    // The child exits at once on SIGTERM (the shell's default); worklease
    // sent it because the lease was about to run out: that is a loss (76),
    // not the child's own 143.
    let mut a = w.spawn(&[
        "run",
        "--ttl",
        "6s",
        "--holder",
        "alpha",
        "job",
        "--",
        "sh",
        "-c",
        &holder_script("a"),
    ]);
    w.wait_for_file("a.started", LONG);
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
    let a = w.spawn(&[
        "run",
        "--ttl",
        "3s",
        "--holder",
        "alpha",
        "job",
        "--",
        "sh",
        "-c",
        &format!("{}; exit 0", holder_script("a")),
    ]);
    w.wait_for_file("a.started", LONG);
    let lock = w.lock_store();
    w.touch("a.stop");
    let child: i32 = w.read("a.pid").trim().parse().expect("pid");
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
    let (status, err) = a.wait(LONG);
    assert_eq!(code(status), 0, "{err}");
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
