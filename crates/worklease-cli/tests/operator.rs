//! End-to-end tests of what operators watch: `status --watch`, and the
//! progress line of a long wait (`run --wait`, `elect`) on a terminal (a
//! pseudo-terminal here) and its absence elsewhere.
//!
//! Real `worklease` processes against a SQLite file in a temporary
//! directory; synchronisation is by files the children create and by lines
//! the processes write, polled in bounded loops, as in `tests/run.rs`.
//!
//! Also what an operator reads of an S3 store (expiry judged by
//! observation, a missing bucket, missing credentials), against the
//! S3-compatible server of `WORKLEASE_TEST_S3_URL` (default
//! `s3://worklease-test/worklease-test?endpoint=http://127.0.0.1:5000&region=us-east-1`;
//! `.ci/services/moto.sh` starts moto, creates the bucket and exports it
//! with dummy `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`), each test
//! under a prefix of its own; and the store URLs `--help` lists.

mod common;
use common::{holder_script, poll_until, BIN, LONG};

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

struct World {
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env_remove("WORKLEASE_TOKEN")
            .env_remove("WORKLEASE_HOME")
            .env_remove("RUST_LOG")
            .env(
                "WORKLEASE_STORE",
                format!("sqlite:{}", self.path("leases.db").display()),
            )
            .env("D", self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    }

    fn touch(&self, name: &str) {
        std::fs::write(self.path(name), b"").expect("touch");
    }

    fn wait_for_file(&self, name: &str) {
        let path = self.path(name);
        assert!(
            poll_until(LONG, || path.exists()),
            "{} did not appear within {LONG:?}",
            path.display()
        );
    }
}

/// A background process whose output (one stream) is collected as it
/// comes; killed and reaped if the test ends without waiting for it.
struct Watched {
    child: Child,
    out: Arc<Mutex<Vec<u8>>>,
}

impl Watched {
    /// Collects everything read from `source` (a pipe, a pty master).
    fn start(child: Child, mut source: impl Read + Send + 'static) -> Self {
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = out.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // A pty master reads EIO once the last slave is closed.
            while let Ok(n) = source.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Self { child, out }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    /// Waits (bounded) until the output satisfies `done`.
    fn wait_for(&self, what: &str, done: impl Fn(&str) -> bool) {
        assert!(
            poll_until(LONG, || done(&self.text())),
            "not seen within {LONG:?}: {what}; output so far: {:?}",
            self.text()
        );
    }

    fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), sig).expect("signal");
    }

    /// Waits (bounded) for the exit status.
    fn exit_code(&mut self) -> Option<i32> {
        let end = Instant::now() + LONG;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            assert!(Instant::now() < end, "no exit within {LONG:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `cmd` with its stderr on a new pseudo-terminal; the output is
/// what the terminal shows.
fn with_stderr_on_a_pty(mut cmd: Command) -> Watched {
    let pty = nix::pty::openpty(None, None).expect("openpty");
    cmd.stderr(Stdio::from(pty.slave));
    let child = cmd.spawn().expect("spawn worklease");
    // Our copy of the slave is gone with `cmd`: the master reads EOF (EIO)
    // once the child and its children are gone.
    drop(cmd);
    Watched::start(child, std::fs::File::from(pty.master))
}

/// Creates the store (status never creates one) with a lease in it.
fn store_with_a_lease(w: &World) {
    let status = w
        .cmd(&["run", "--holder", "alpha", "job", "--", "true"])
        .status()
        .expect("run worklease");
    assert_eq!(status.code(), Some(0));
}

fn start_status(w: &World, args: &[&str]) -> Watched {
    let mut cmd = w.cmd(args);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    Watched::start(child, stdout)
}

#[test]
fn status_watch_redraws_every_second_and_exits_0_on_sigint() {
    let w = World::new();
    store_with_a_lease(&w);
    let started = Instant::now();
    let mut watch = start_status(&w, &["status", "--watch"]);
    watch.wait_for("two tables", |t| t.matches("store: ").count() >= 2);
    // About a second apart, not back to back.
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        watch.text()
    );
    watch.signal(Signal::SIGINT);
    assert_eq!(watch.exit_code(), Some(0));
    let text = watch.text();
    // Not a terminal: no escape sequences, a blank line between tables.
    assert!(!text.contains('\x1b'), "{text:?}");
    assert!(text.contains("\n\nstore: "), "{text:?}");
    let tables: Vec<&str> = text.split("\n\n").filter(|t| !t.is_empty()).collect();
    assert!(tables.len() >= 2, "{text:?}");
    for table in tables {
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("store: sqlite:"), "{table:?}");
        assert!(lines[1].starts_with("WORK ID"), "{table:?}");
        assert!(
            lines[2].starts_with("job") && lines[2].contains("alpha"),
            "{table:?}"
        );
    }
}

#[test]
fn status_watch_json_prints_a_batch_a_second_and_exits_0_on_sigterm() {
    let w = World::new();
    store_with_a_lease(&w);
    let mut watch = start_status(&w, &["status", "--watch", "--json", "job"]);
    watch.wait_for("two batches", |t| t.lines().count() >= 2);
    watch.signal(Signal::SIGTERM);
    assert_eq!(watch.exit_code(), Some(0));
    for line in BufReader::new(watch.text().as_bytes()).lines() {
        let v: serde_json::Value =
            serde_json::from_str(&line.expect("line")).expect("every line is a JSON object");
        assert_eq!(v["work_id"], "job");
        assert_eq!(v["holder_id"], "alpha");
    }
}

#[test]
fn a_wait_on_a_terminal_shows_who_holds_the_lease_and_is_quiet_elsewhere() {
    let w = World::new();
    let mut holder = {
        let mut cmd = w.cmd(&[
            "run",
            "--ttl",
            "10s",
            "--holder",
            "alpha",
            "job",
            "--",
            "sh",
            "-c",
            &holder_script("a"),
        ]);
        Watched::start(cmd.spawn().expect("spawn"), std::io::empty())
    };
    w.wait_for_file("a.started");

    // First a waiter whose stderr is a pipe, then one on a terminal.
    let mut piped = {
        let mut cmd = w.cmd(&[
            "run",
            "--wait",
            "--poll",
            "100ms",
            "job",
            "--",
            "touch",
            "piped.ran",
        ]);
        cmd.current_dir(w.dir.path()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn");
        let stderr = child.stderr.take().expect("stderr");
        Watched::start(child, stderr)
    };
    let mut tty = {
        let mut cmd = w.cmd(&[
            "run", "--wait", "--poll", "100ms", "job", "--", "touch", "tty.ran",
        ]);
        cmd.current_dir(w.dir.path());
        with_stderr_on_a_pty(cmd)
    };
    // Two refreshes of the line, redrawn in place.
    tty.wait_for("two progress lines", |t| {
        t.matches("\r\x1b[Kwaiting for job: held by alpha, expires in ")
            .count()
            >= 2
    });
    let shown = tty.text();
    assert!(!shown.contains('\n'), "one line, redrawn: {shown:?}");

    w.touch("a.stop");
    assert_eq!(holder.exit_code(), Some(0));
    assert_eq!(tty.exit_code(), Some(0), "{:?}", tty.text());
    assert_eq!(piped.exit_code(), Some(0), "{:?}", piped.text());
    assert!(w.path("tty.ran").exists() && w.path("piped.ran").exists());
    // The line was erased when the wait ended.
    assert!(tty.text().ends_with("\r\x1b[K"), "{:?}", tty.text());
    // The piped waiter waited as long (it started first) and said nothing.
    assert_eq!(piped.text(), "", "a pipe gets no progress line");
}

#[test]
fn an_election_campaign_on_a_terminal_shows_the_leader() {
    let w = World::new();
    let mut leader = {
        let mut cmd = w.cmd(&[
            "elect",
            "--ttl",
            "10s",
            "--holder",
            "alpha",
            "sched",
            "--",
            "sh",
            "-c",
            &holder_script("a"),
        ]);
        Watched::start(cmd.spawn().expect("spawn"), std::io::empty())
    };
    w.wait_for_file("a.started");
    let mut standby = with_stderr_on_a_pty(w.cmd(&[
        "elect",
        "--poll",
        "100ms",
        "--holder",
        "beta",
        "sched",
        "--",
        "sh",
        "-c",
        &holder_script("b"),
    ]));
    standby.wait_for("the leader on the progress line", |t| {
        t.contains("\r\x1b[Kwaiting for sched: held by alpha, expires in ")
    });
    w.touch("a.stop");
    assert_eq!(leader.exit_code(), Some(0));
    w.wait_for_file("b.started");
    // Leading now: the line is erased, and stays so.
    standby.wait_for("the line erased", |t| t.ends_with("\r\x1b[K"));
    w.touch("b.stop");
    assert_eq!(standby.exit_code(), Some(0), "{:?}", standby.text());
    assert!(standby.text().ends_with("\r\x1b[K"), "{:?}", standby.text());
}

#[test]
fn status_watch_stops_when_its_store_file_is_deleted() {
    let w = World::new();
    store_with_a_lease(&w);
    let mut watch = start_status(&w, &["status", "--watch"]);
    watch.wait_for("a first table", |t| t.contains("store: "));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(w.path(&format!("leases.db{suffix}")));
    }
    // Not a frozen picture: it says so and exits 69.
    assert_eq!(watch.exit_code(), Some(69));
}

#[test]
fn metrics_addresses_take_host_names_and_refuse_port_0() {
    let w = World::new();
    let status = w
        .cmd(&["run", "--metrics-addr", "127.0.0.1:0", "job", "--", "true"])
        .status()
        .expect("run worklease");
    assert_eq!(status.code(), Some(64), "port 0 is refused");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr = format!("localhost:{port}");
    let status = w
        .cmd(&["run", "--metrics-addr", &addr, "job", "--", "true"])
        .status()
        .expect("run worklease");
    assert_eq!(status.code(), Some(0), "a host name is resolved");
}

/// The test S3 server's URL with a prefix of this test's own below the
/// URL's, so tests share nothing.
fn s3_url() -> String {
    let base = std::env::var("WORKLEASE_TEST_S3_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| {
            "s3://worklease-test/worklease-test?endpoint=http://127.0.0.1:5000&region=us-east-1"
                .to_string()
        });
    let unique = format!("/operator-{:016x}", rand::random::<u64>());
    match base.find('?') {
        Some(q) => format!("{}{unique}{}", base[..q].trim_end_matches('/'), &base[q..]),
        None => format!("{}{unique}", base.trim_end_matches('/')),
    }
}

/// `worklease ARGS` on the store `url`, its output captured.
fn on_store(w: &World, url: &str, args: &[&str]) -> Command {
    let mut cmd = w.cmd(args);
    cmd.env("WORKLEASE_STORE", url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn output(mut cmd: Command) -> (Option<i32>, String, String) {
    let out = cmd.output().expect("run worklease");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// After a holder crashed on S3, one look cannot tell whether the lease
/// still lives: `run` without `--wait` says so and claims no countdown,
/// `status` shows the lease `held?` (explained under the table) and in
/// JSON with no `expires_at` and `expiry: by-observation`; `status
/// --watch` shows it expired once it has watched it unchanged for the TTL.
#[test]
fn on_s3_run_and_status_say_expiry_is_judged_by_observation() {
    use std::os::unix::process::ExitStatusExt;
    let w = World::new();
    let url = s3_url();
    let ttl = Duration::from_secs(2);
    // The holder's child SIGKILLs the holder: a crash with the lease held.
    let crashed = w
        .cmd(&[
            "run",
            "--ttl",
            "2s",
            "--holder",
            "vm:1",
            "job",
            "--",
            "sh",
            "-c",
            "kill -9 $PPID",
        ])
        .env("WORKLEASE_STORE", &url)
        .status()
        .expect("run worklease");
    assert_eq!(crashed.signal(), Some(9), "{crashed:?}");

    let (code, _, err) = output(on_store(&w, &url, &["run", "job", "--", "true"]));
    assert_eq!(code, Some(75), "{err}");
    for want in [
        "\"job\" is held by \"vm:1\"",
        "not waiting: pass --wait",
        "s3 store judges expiry by observation",
        "one look cannot tell whether the holder is still renewing",
        "With --wait, worklease takes the lease over once it has seen it unchanged for the \
         holder's full TTL",
    ] {
        assert!(err.contains(want), "{want:?} missing: {err}");
    }
    assert!(!err.contains("expires in"), "no countdown: {err}");

    let (code, table, err) = output(on_store(&w, &url, &["status"]));
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("store: s3://"), "{table}");
    assert!(
        lines[2].starts_with("job") && lines[2].contains("vm:1") && lines[2].contains("held?"),
        "{table}"
    );
    assert!(!table.contains("live"), "{table}");
    assert!(
        lines[3].starts_with("held?: ") && lines[3].contains("judges expiry by observation"),
        "{table}"
    );

    let (code, json, err) = output(on_store(&w, &url, &["status", "--json"]));
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(json.trim()).expect("one JSON line");
    assert_eq!(v["holder_id"], "vm:1");
    assert_eq!(v["expires_at"], serde_json::Value::Null);
    assert_eq!(v["expired"], false);
    assert_eq!(v["ended"], serde_json::Value::Null);
    assert_eq!(v["expiry"], "by-observation");

    // A watching status keeps its observation: expired one TTL after its
    // first look, not sooner.
    let started = Instant::now();
    let mut cmd = on_store(&w, &url, &["status", "--watch", "--json", "job"]);
    cmd.stderr(Stdio::inherit());
    let mut child = cmd.spawn().expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let mut watch = Watched::start(child, stdout);
    watch.wait_for("the lease expired", |t| t.contains("\"expired\":true"));
    let waited = started.elapsed();
    watch.signal(Signal::SIGTERM);
    assert_eq!(watch.exit_code(), Some(0));
    assert!(
        waited >= ttl,
        "expired after {waited:?}, before the TTL {ttl:?}"
    );
    let last: serde_json::Value = serde_json::from_str(
        watch
            .text()
            .lines()
            .find(|l| l.contains("\"expired\":true"))
            .expect("the expired line"),
    )
    .expect("JSON");
    assert_eq!(last["ended"], "expired");
    assert!(last["expires_at"].is_string(), "{last}");
    for line in watch
        .text()
        .lines()
        .filter(|l| l.contains("\"expired\":false"))
    {
        assert!(line.contains("\"expires_at\":null"), "{line}");
    }
}

/// The AWS variables `object_store` takes credentials from.
const AWS_CREDENTIAL_VARIABLES: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_SKIP_SIGNATURE",
    "AWS_METADATA_ENDPOINT",
];

/// A bucket that does not exist is named as missing (not "contention"),
/// and an S3-compatible endpoint without credentials fails at once naming
/// the variables to set (not an instance-metadata error); the child never
/// runs and nothing is written.
#[test]
fn on_s3_a_missing_bucket_and_missing_credentials_are_named() {
    let w = World::new();
    let url = s3_url();
    let bucket = format!("worklease-missing-{:016x}", rand::random::<u64>());
    let rest = url
        .strip_prefix("s3://")
        .and_then(|r| r.find(['/', '?']).map(|i| &r[i..]))
        .expect("an s3:// URL with a bucket");
    let no_bucket = format!("s3://{bucket}{rest}");
    let ran = w.path("ran");
    let touch = [
        "run",
        "job",
        "--",
        "touch",
        ran.to_str().expect("UTF-8 path"),
    ];

    for args in [&touch[..], &["status"][..]] {
        let (code, _, err) = output(on_store(&w, &no_bucket, args));
        assert_eq!(code, Some(69), "{args:?}: {err}");
        assert!(
            err.contains(&format!("the bucket {bucket:?} does not exist")),
            "{args:?}: {err}"
        );
        assert!(!err.contains("contention"), "{args:?}: {err}");
    }

    for args in [&touch[..], &["status"][..]] {
        let mut cmd = on_store(&w, &url, args);
        for var in AWS_CREDENTIAL_VARIABLES {
            cmd.env_remove(var);
        }
        let (code, _, err) = output(cmd);
        assert_eq!(code, Some(69), "{args:?}: {err}");
        for want in [
            "no AWS credentials",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
        ] {
            assert!(err.contains(want), "{args:?}: {want} missing: {err}");
        }
        assert!(!err.contains("169.254"), "{args:?}: {err}");
    }
    assert!(!ran.exists(), "the child ran");
    let (code, table, err) = output(on_store(&w, &url, &["status"]));
    assert_eq!(code, Some(0), "{err}");
    assert!(table.contains("no leases"), "nothing written: {table}");
}

/// `--help` and every subcommand's `--store` help list the stores that are
/// built, with the default SQLite file's fallbacks.
#[test]
fn help_lists_every_store_url() {
    let w = World::new();
    let help = |args: &[&str]| output(on_store(&w, "memory:", args)).1;
    let main = help(&["--help"]);
    assert!(!main.contains("not built"), "{main}");
    for want in [
        "postgres://",
        "redis://",
        "etcd://",
        "s3://",
        "sqlite:PATH",
        "$XDG_DATA_HOME/worklease/leases.db",
        "/var/lib/worklease/leases.db",
    ] {
        assert!(main.contains(want), "{want} missing: {main}");
    }
    for sub in [
        &["run", "--help"][..],
        &["elect", "--help"],
        &["pool", "--help"],
        &["status", "--help"],
        &["release", "--help"],
        &["checkpoint", "set", "--help"],
        &["checkpoint", "get", "--help"],
    ] {
        let text = help(sub);
        let store = text
            .split("--store <URL>")
            .nth(1)
            .unwrap_or_else(|| panic!("{sub:?} has no --store: {text}"));
        let store = &store[..store.find("[env: WORKLEASE_STORE").unwrap_or(store.len())];
        for want in [
            "postgres://",
            "redis://",
            "etcd://",
            "s3://",
            "sqlite:PATH",
            "memory:",
            "/var/lib/worklease",
        ] {
            assert!(store.contains(want), "{sub:?}: {want} missing: {store}");
        }
    }
    let status = help(&["status", "--help"]);
    assert!(
        status.contains("held?") && status.contains("by-observation"),
        "{status}"
    );
}
