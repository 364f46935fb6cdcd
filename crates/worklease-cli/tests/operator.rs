//! End-to-end tests of what operators watch: `status --watch`, and the
//! progress line of a long wait (`run --wait`, `elect`) on a terminal (a
//! pseudo-terminal here) and its absence elsewhere.
//!
//! Real `worklease` processes against a SQLite file in a temporary
//! directory; synchronisation is by files the children create and by lines
//! the processes write, polled in bounded loops, as in `tests/cli.rs`.

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
