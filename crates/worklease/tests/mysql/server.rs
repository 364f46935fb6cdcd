//! A throwaway MariaDB server for the tests that stop or restart the
//! server: its own datadir (`mariadb-install-db`), its own loopback port,
//! stopped and removed when dropped; with [`ServerTls`], serving TLS.
//! The shared server is never touched.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use worklease::store::mysql::mysql_async::{self, prelude::Queryable};

use crate::common_net::free_port;
use crate::common_sql_store::Throwaway;

/// A program of the server package, on PATH or in /usr/sbin, /usr/bin.
fn program(names: &[&str]) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).chain(["/usr/sbin".into(), "/usr/bin".into()]);
    for dir in dirs {
        for name in names {
            let p = dir.join(name);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!("none of {names:?} found: install mariadb-server (see .ci/services/mysql.sh)");
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// The server's TLS files, in PEM: written into its directory (so that
/// the `mysql` user can read them) and given as `--ssl-ca`, `--ssl-cert`
/// and `--ssl-key`.
pub(crate) struct ServerTls {
    pub(crate) ca: String,
    pub(crate) cert: String,
    pub(crate) key: String,
}

pub(crate) struct Server {
    dir: tempfile::TempDir,
    port: u16,
    tls: bool,
    child: Mutex<Option<Child>>,
}

impl Server {
    /// Initialises a datadir and starts the server on a free port; waits
    /// until it answers.
    pub(crate) async fn start() -> Self {
        Self::start_with(None).await
    }

    /// [`Server::start`], serving TLS with `tls` when given (plain
    /// connections are still taken).
    pub(crate) async fn start_with(tls: Option<ServerTls>) -> Self {
        let with_tls = tls.is_some();
        let (dir, port) = tokio::task::spawn_blocking(move || {
            let dir = tempfile::Builder::new()
                .prefix("worklease-mariadb-")
                .tempdir()
                .expect("temporary directory");
            if let Some(tls) = tls {
                for (name, pem) in [
                    ("ca.pem", tls.ca),
                    ("cert.pem", tls.cert),
                    ("key.pem", tls.key),
                ] {
                    std::fs::write(dir.path().join(name), pem).expect("write a TLS file");
                }
            }
            let mut install = Command::new(program(&["mariadb-install-db", "mysql_install_db"]));
            install
                .arg("--no-defaults")
                .arg(format!("--datadir={}", dir.path().join("data").display()))
                .arg("--auth-root-authentication-method=normal")
                .arg("--skip-test-db");
            if running_as_root() {
                let ok = Command::new("chown")
                    .args(["-R", "mysql:", &dir.path().display().to_string()])
                    .status()
                    .expect("chown")
                    .success();
                assert!(ok, "cannot hand the server directory to the mysql user");
                install.arg("--user=mysql");
            }
            let out = install.output().expect("mariadb-install-db runs");
            assert!(
                out.status.success(),
                "mariadb-install-db failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (dir, free_port())
        })
        .await
        .expect("install task");
        let server = Server {
            dir,
            port,
            tls: with_tls,
            child: Mutex::new(None),
        };
        server.start_again().await;
        let mut conn = server.connect_root("mysql").await;
        conn.query_drop("CREATE DATABASE test")
            .await
            .expect("create the test database");
        server
    }

    fn spawn(&self) -> Child {
        let d = self.dir.path();
        let mut cmd = Command::new(program(&["mariadbd", "mysqld"]));
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", d.join("data").display()))
            .arg(format!("--socket={}", d.join("sock").display()))
            .arg(format!("--pid-file={}", d.join("pid").display()))
            .arg(format!("--log-error={}", d.join("log").display()))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg("--innodb-buffer-pool-size=16M")
            .arg("--innodb-log-file-size=8M")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.tls {
            cmd.arg(format!("--ssl-ca={}", d.join("ca.pem").display()))
                .arg(format!("--ssl-cert={}", d.join("cert.pem").display()))
                .arg(format!("--ssl-key={}", d.join("key.pem").display()));
        }
        if running_as_root() {
            cmd.arg("--user=mysql");
        }
        cmd.spawn().expect("mariadbd starts")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    pub(crate) fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.port)
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) async fn connect_root(&self, db: &str) -> mysql_async::Conn {
        let url = format!("mysql://root@127.0.0.1:{}/{db}", self.port);
        let opts = mysql_async::Opts::from_url(&url).expect("URL");
        mysql_async::Conn::new(opts).await.expect("connect")
    }

    /// Starts the server (again) and waits until it answers, bounded.
    pub(crate) async fn start_again(&self) {
        let child = self.spawn();
        *self.child.lock().expect("lock") = Some(child);
        let url = format!("mysql://root@127.0.0.1:{}/mysql", self.port);
        let opts = mysql_async::Opts::from_url(&url).expect("URL");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(conn) = mysql_async::Conn::new(opts.clone()).await {
                let _ = conn.disconnect().await;
                return;
            }
            let exited = self
                .child
                .lock()
                .expect("lock")
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            assert!(
                exited.is_none(),
                "mariadbd exited: {exited:?}\n{}",
                self.log()
            );
            assert!(
                tokio::time::Instant::now() < deadline,
                "mariadbd did not answer within 60 s:\n{}",
                self.log()
            );
            // Readiness is polled: the server says nothing when it listens.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the server: `crash` kills it (SIGKILL: recovery from the redo
    /// log at the next start), else a clean shutdown (SIGTERM). Waits for
    /// the process to end.
    pub(crate) async fn stop(&self, crash: bool) {
        let child = self.child.lock().expect("lock").take();
        let Some(mut child) = child else { return };
        tokio::task::spawn_blocking(move || {
            let signal = if crash { "KILL" } else { "TERM" };
            let _ = Command::new("kill")
                .args([&format!("-{signal}"), &child.id().to_string()])
                .status();
            child.wait().expect("wait for mariadbd")
        })
        .await
        .expect("stop task");
    }
}

#[async_trait::async_trait]
impl Throwaway for Server {
    fn server_url(&self) -> String {
        self.url()
    }

    async fn stop_cleanly(&self) {
        self.stop(false).await;
    }

    async fn resume(&self) {
        self.start_again().await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.lock().ok().and_then(|mut c| c.take()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
