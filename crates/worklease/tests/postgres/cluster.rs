//! A throwaway PostgreSQL cluster for the tests that stop or restart the
//! server, or need server settings of their own.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use worklease::store::postgres::PostgresStore;

use crate::common_sql_store::Throwaway;

pub(crate) struct ClusterInfo {
    bin: PathBuf,
    pub(crate) dir: PathBuf,
    port: u16,
    as_postgres: bool,
    /// More server options (`-c name=value ...`).
    extra: String,
}

impl ClusterInfo {
    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let exe = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        let out = cmd
            .args(args)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
            Err(format!(
                "{program} {args:?} failed: {}{}\nserver log:\n{log}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn start(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} {}",
            self.port,
            self.dir.display(),
            self.extra
        );
        let log = self.dir.join("log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-l",
                &log,
                "-o",
                &options,
                "-w",
                "start",
            ],
        )
    }

    fn stop(&self, mode: &str) -> Result<(), String> {
        self.run("pg_ctl", &["-D", &self.data(), "-m", mode, "-w", "stop"])
    }
}

/// A PostgreSQL cluster of its own in a temporary directory, stopped and
/// removed when dropped.
pub(crate) struct Cluster {
    pub(crate) info: Arc<ClusterInfo>,
    _dir: tempfile::TempDir,
}

/// The directory of `initdb` and `pg_ctl`: on PATH, or the newest
/// `/usr/lib/postgresql/*/bin`.
fn server_bin() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file())
    });
    if let Some(dir) = on_path {
        return dir;
    }
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, bin)| bin).expect(
        "PostgreSQL server binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql/*/bin",
    )
}

use crate::common_net::free_port;

impl Cluster {
    pub(crate) async fn start() -> Self {
        Self::start_with(|_| String::new()).await
    }

    /// Starts a cluster after `prepare` wrote what it needs into the
    /// cluster's directory; `prepare` returns more server options.
    pub(crate) async fn start_with(prepare: fn(&Path) -> String) -> Self {
        tokio::task::spawn_blocking(move || {
            let dir = tempfile::Builder::new()
                .prefix("worklease-pg-")
                .tempdir()
                .expect("temporary directory");
            let extra = prepare(dir.path());
            // initdb refuses to run as root: run the server as `postgres`.
            let as_postgres = std::fs::metadata("/proc/self")
                .map(|m| m.uid() == 0)
                .unwrap_or(false);
            if as_postgres {
                let ok = Command::new("chown")
                    .args(["-R", "postgres:", &dir.path().display().to_string()])
                    .status()
                    .expect("chown")
                    .success();
                assert!(ok, "cannot hand the cluster directory to the postgres user");
            }
            let mut last = String::new();
            // A free port can be taken between the check and the start: try
            // a few.
            for _ in 0..3 {
                let info = ClusterInfo {
                    bin: server_bin(),
                    dir: dir.path().to_path_buf(),
                    port: free_port(),
                    as_postgres,
                    extra: extra.clone(),
                };
                if !Path::new(&info.data()).exists() {
                    info.run(
                        "initdb",
                        &[
                            "-A",
                            "trust",
                            "-U",
                            "postgres",
                            "-E",
                            "UTF8",
                            "-D",
                            &info.data(),
                        ],
                    )
                    .expect("initdb");
                }
                match info.start() {
                    Ok(()) => {
                        return Cluster {
                            info: Arc::new(info),
                            _dir: dir,
                        }
                    }
                    Err(e) => last = e,
                }
            }
            panic!("cannot start a throwaway cluster: {last}");
        })
        .await
        .expect("cluster start task")
    }

    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.info.port)
    }

    pub(crate) async fn stop(&self, mode: &'static str) {
        let info = self.info.clone();
        tokio::task::spawn_blocking(move || info.stop(mode))
            .await
            .expect("stop task")
            .expect("pg_ctl stop");
    }

    pub(crate) async fn start_again(&self) {
        let info = self.info.clone();
        tokio::task::spawn_blocking(move || info.start())
            .await
            .expect("start task")
            .expect("pg_ctl start");
    }
}

#[async_trait::async_trait]
impl Throwaway for Cluster {
    fn server_url(&self) -> String {
        self.url()
    }

    async fn stop_cleanly(&self) {
        self.stop("fast").await;
    }

    async fn resume(&self) {
        self.start_again().await;
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.info.stop("immediate");
    }
}

/// Drops every pooled connection (they died with the server).
pub(crate) fn forget_connections(store: &PostgresStore) {
    store.pool().retain(|_, _| false);
}
