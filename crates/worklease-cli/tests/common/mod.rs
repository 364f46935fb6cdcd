//! Helpers shared by the end-to-end test files that drive the real
//! `worklease` binary.
// Each test binary uses a part of them.
#![allow(dead_code)]

mod watched;

// As the rest: each test binary uses a part of them.
#[allow(unused_imports)]
pub use watched::{assert_exit, code, signal, Watched};

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// One test's world: a temporary directory with the SQLite store file in
/// it. Test files add their own methods (`impl World` in the test file).
pub struct World {
    pub dir: tempfile::TempDir,
    pub store: String,
}

impl World {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = format!("sqlite:{}", dir.path().join("store/leases.db").display());
        Self { dir, store }
    }

    /// `name` inside the world's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `worklease ARGS` with this world's store and `$D`, `$WL` for child
    /// scripts, and none of the caller's WORKLEASE_* variables.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env_remove("WORKLEASE_TOKEN")
            .env_remove("WORKLEASE_HOME")
            .env_remove("RUST_LOG")
            .env("WORKLEASE_STORE", &self.store)
            .env("D", self.dir.path())
            .env("WL", BIN)
            .stdin(Stdio::null());
        cmd
    }
}

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_worklease");

/// The bound of every wait for an event that should come much sooner.
pub const LONG: Duration = Duration::from_secs(20);

/// A child script that marks itself started (`$D/<name>.started`, its PID
/// in `$D/<name>.pid`, its fencing token in `$D/<name>.token`) and runs
/// until `$D/<name>.stop` exists.
pub fn holder_script(name: &str) -> String {
    format!(
        "echo $$ > \"$D/{name}.pid\"; echo \"$WORKLEASE_FENCING_TOKEN\" > \"$D/{name}.token\"; \
         touch \"$D/{name}.started\"; while [ ! -e \"$D/{name}.stop\" ]; do sleep 0.02; done"
    )
}

/// [`holder_script`] under a SIGTERM trap that creates `$D/got_term`,
/// then runs `then` (`exit 7`; empty: runs on).
pub fn term_trapping_script(name: &str, then: &str) -> String {
    let then = if then.is_empty() {
        String::new()
    } else {
        format!("; {then}")
    };
    format!(
        "trap 'touch \"$D/got_term\"{then}' TERM; {}",
        holder_script(name)
    )
}

/// `sh -c` text that writes `$D/<file>`: `gone` or the state letter of the
/// process whose PID is in `$D/<pid_file>`.
pub fn probe_script(pid_file: &str, file: &str) -> String {
    format!(
        "p=$(cat \"$D/{pid_file}\"); s=$(cut -d' ' -f3 \"/proc/$p/stat\" 2>/dev/null); \
         echo \"${{s:-gone}}\" > \"$D/{file}\""
    )
}

/// Polls `done` every 10 ms until it holds (true) or `timeout` passed
/// (false): for events no process signals.
pub fn poll_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The state letter of `pid` in `/proc/PID/stat` (`R`, `S`, `T`, `Z`...),
/// `None` once it is gone.
pub fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// True while `pid` is stopped (by a signal or a tracer).
pub fn stopped(pid: i32) -> bool {
    matches!(process_state(pid), Some('T' | 't'))
}

/// True when process group `group` has members, and none of them runs: each
/// is stopped, or waits uninterruptibly (a shell whose vfork child was
/// stopped before its exec), or is a zombie.
pub fn group_stopped(group: i32) -> bool {
    let mut states = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(group) {
            states.push(fields[0].to_string());
        }
    }
    states.iter().any(|s| s == "T")
        && states
            .iter()
            .all(|s| matches!(s.as_str(), "T" | "t" | "D" | "Z" | "X"))
}

/// True once `pid` no longer runs (gone, or a zombie nobody reaped yet).
pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// A background `worklease`; killed if the test ends first.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn spawn(w: &World, args: &[&str]) -> Running {
    Running(w.cmd(args).spawn().expect("spawn worklease"))
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Waits (bounded) for `name` in the world's directory.
pub fn wait_for_file(w: &World, name: &str) {
    let path = w.path(name);
    assert!(
        poll_until(LONG, || path.exists()),
        "{} did not appear within {LONG:?}",
        path.display()
    );
}

pub fn read(w: &World, name: &str) -> String {
    std::fs::read_to_string(w.path(name))
        .unwrap_or_else(|e| panic!("read {name}: {e}"))
        .trim()
        .to_string()
}

/// Waits (bounded) for a background `worklease` to exit; its status.
pub fn wait_exit(mut r: Running) -> i32 {
    let end = std::time::Instant::now() + LONG;
    loop {
        if let Some(status) = r.0.try_wait().expect("try_wait") {
            return status.code().expect("an exit status");
        }
        assert!(std::time::Instant::now() < end, "worklease did not exit");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("local addr").port()
}

/// `GET path` on `127.0.0.1:port` (HTTP/1.1, one request): the status and
/// the body, or `None` when nothing answers (yet).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}
