//! A `redis-server` of a test's own (shared by `tests/redis.rs` and
//! `tests/redis_topologies.rs`): on a free loopback port, in a directory of
//! the test's, killed when dropped (even when the test fails).

// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A raw connection to the test server, beside the store.
pub(crate) async fn raw(base: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(base)
        .expect("valid URL")
        .get_multiplexed_async_connection()
        .await
        .expect("the test Redis server answers (see WORKLEASE_TEST_REDIS_URL)")
}

/// A `redis-server` of the test's own, on a free port, stopped on drop.
pub(crate) struct OwnServer {
    child: Child,
    /// The port it listens on (its TLS port for [`OwnServer::start_tls`]).
    pub(crate) port: u16,
}

pub(crate) use crate::common_net::free_port;

impl OwnServer {
    /// Starts `redis-server` with `args` on `port` (default: a free one)
    /// and returns once it logged `ready` (it logs to stdout with
    /// `--daemonize no`).
    pub(crate) fn start(
        dir: &std::path::Path,
        port: Option<u16>,
        args: &[&str],
        ready: &str,
    ) -> Self {
        let port = port.unwrap_or_else(free_port);
        Self::spawn(port, &["--port", &port.to_string()], dir, args, ready)
    }

    /// Starts `redis-server` listening with TLS only, on a free port
    /// (`--port 0 --tls-port N`); `args` name its certificates.
    pub(crate) fn start_tls(dir: &std::path::Path, args: &[&str]) -> Self {
        let port = free_port();
        let head = ["--port", "0", "--tls-port", &port.to_string()];
        Self::spawn(port, &head, dir, args, READY)
    }

    /// Runs `redis-server HEAD --bind 127.0.0.1 ... ARGS` (a configuration
    /// file, when HEAD names one, must come first) for a server on `port`.
    pub(crate) fn spawn(
        port: u16,
        head: &[&str],
        dir: &std::path::Path,
        args: &[&str],
        ready: &str,
    ) -> Self {
        let mut child = Command::new("redis-server")
            .args(head)
            .args([
                "--bind",
                "127.0.0.1",
                "--daemonize",
                "no",
                "--save",
                "",
                "--dir",
            ])
            .arg(dir)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("redis-server is installed (apt-get install redis-server)");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let mut log = Vec::new();
        loop {
            match lines.next() {
                Some(Ok(line)) => {
                    let done = line.contains(ready);
                    log.push(line);
                    if done {
                        break;
                    }
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "redis-server on port {port} stopped before {ready:?}:\n{}",
                        log.join("\n")
                    );
                }
            }
        }
        // Keep draining its log so that it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, port }
    }

    /// Kills the process at once (SIGKILL: no `SHUTDOWN`, nothing
    /// written), as a crash would.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// `SHUTDOWN` (which writes the append-only file), then waits for the
    /// process to exit.
    pub(crate) async fn stop(mut self) {
        let mut conn = raw(&self.url()).await;
        // The server closes the connection instead of answering.
        let _ = redis::cmd("SHUTDOWN").exec_async(&mut conn).await;
        let status = tokio::task::spawn_blocking(move || {
            let status = self.child.wait();
            drop(self);
            status
        })
        .await
        .expect("join");
        assert!(status.is_ok(), "redis-server exit: {status:?}");
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What `redis-server` logs once it accepts connections.
pub(crate) const READY: &str = "Ready to accept connections";
