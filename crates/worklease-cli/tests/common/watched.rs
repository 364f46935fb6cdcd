//! A background `worklease` whose stderr lines the test reads as they come
//! ([`Watched`]), and the [`World`] methods the end-to-end tests of `run`,
//! `elect`, `checkpoint` and `status` share: start a command with the
//! world's store, run a `sh -c` child under it, hold a lease, read what
//! the children wrote, check exit statuses.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::{holder_script, poll_until, stderr, World, LONG};

impl World {
    /// Runs `worklease ARGS` to its end.
    pub fn output(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run worklease")
    }

    /// Starts `worklease ARGS` in the background; its stderr lines arrive
    /// on a channel.
    pub fn spawn(&self, args: &[&str]) -> Watched {
        Watched::start(self.cmd(args))
    }

    /// Runs `worklease ARGS -- sh -c SCRIPT` to its end.
    pub fn sh(&self, args: &[&str], script: &str) -> Output {
        self.output(&with_script(args, script))
    }

    /// Starts `worklease ARGS -- sh -c SCRIPT` in the background.
    pub fn spawn_sh(&self, args: &[&str], script: &str) -> Watched {
        self.spawn(&with_script(args, script))
    }

    /// Starts `worklease ARGS -- sh -c SCRIPT` and waits (bounded) until
    /// the child has created `$D/<name>.started` ([`holder_script`] does).
    pub fn start_sh(&self, args: &[&str], script: &str, name: &str) -> Watched {
        let running = self.spawn_sh(args, script);
        self.wait_for_file(&format!("{name}.started"), LONG);
        running
    }

    /// Starts `worklease ARGS -- sh -c` [`holder_script`]`(name)` and waits
    /// (bounded) until its child has started.
    pub fn hold(&self, args: &[&str], name: &str) -> Watched {
        self.start_sh(args, &holder_script(name), name)
    }

    /// The store file's path.
    pub fn store_path(&self) -> PathBuf {
        self.path("store/leases.db")
    }

    /// Holds the store's write lock until dropped: every renewal meanwhile
    /// waits for it and fails (a store that does not answer).
    pub fn lock_store(&self) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(self.store_path()).expect("open the store file");
        conn.busy_timeout(Duration::from_secs(10))
            .expect("busy timeout");
        conn.execute_batch("BEGIN IMMEDIATE")
            .expect("take the write lock");
        conn
    }

    /// Creates the empty file `name` (a child script waits for it).
    pub fn touch(&self, name: &str) {
        std::fs::write(self.path(name), b"").expect("touch");
    }

    /// The text of the file `name`, untrimmed.
    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_else(|e| panic!("read {name}: {e}"))
    }

    /// The fencing token a child wrote to `name`.
    pub fn read_token(&self, name: &str) -> u64 {
        self.read(name).trim().parse().expect("a fencing token")
    }

    /// The PID a child wrote to `name`.
    pub fn read_pid(&self, name: &str) -> i32 {
        self.read(name).trim().parse().expect("pid")
    }

    /// Waits (bounded) until the file `name` exists.
    pub fn wait_for_file(&self, name: &str, timeout: Duration) {
        let path = self.path(name);
        assert!(
            poll_until(timeout, || path.exists()),
            "{} did not appear within {timeout:?}",
            path.display()
        );
    }

    /// `worklease status --json WORK_ID`, parsed.
    pub fn status_json(&self, work_id: &str) -> serde_json::Value {
        let out = self.output(&["status", "--json", work_id]);
        serde_json::from_slice(&out.stdout).expect("json")
    }
}

/// `ARGS -- sh -c SCRIPT`.
fn with_script<'a>(args: &[&'a str], script: &'a str) -> Vec<&'a str> {
    let mut all = args.to_vec();
    all.extend(["--", "sh", "-c", script]);
    all
}

/// Asserts that a finished `worklease` exited with `expected`, showing its
/// stderr otherwise.
pub fn assert_exit(out: &Output, expected: i32) {
    assert_eq!(out.status.code(), Some(expected), "{}", stderr(out));
}

/// Sends `sig` to `pid`.
pub fn signal(pid: i32, sig: Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).expect("send a signal");
}

/// The exit code of a status; a test fails on an end by a signal.
pub fn code(status: ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| panic!("worklease ended by a signal: {status:?}"))
}

/// A background `worklease`; killed if the test ends without waiting.
pub struct Watched {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Watched {
    /// Starts `cmd` in the background; its stderr lines arrive on a channel.
    pub fn start(mut cmd: Command) -> Watched {
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
        Watched {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// The process ID of this `worklease`.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid")
    }

    /// Sends `sig` to this `worklease`.
    pub fn signal(&self, sig: Signal) {
        signal(self.pid(), sig);
    }

    /// Waits (bounded) for a stderr line containing `needle`.
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) {
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
    pub fn wait(mut self, timeout: Duration) -> (ExitStatus, String) {
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

    /// Waits (bounded by [`LONG`]) for the exit, asserts its code is
    /// `expected`; returns all stderr.
    pub fn exits(self, expected: i32) -> String {
        let (status, err) = self.wait(LONG);
        assert_eq!(code(status), expected, "{err}");
        err
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
