//! The command's Prometheus metrics: served on `--metrics-addr` while it
//! runs, written to `--metrics-file` when it ends (node_exporter's
//! textfile collector: what a cron job that lives seconds can give), or
//! both. See docs/metrics.md.
//!
//! A metrics address that cannot be bound (busy, not ours) is a warning:
//! the job runs anyway, as it would without metrics (issue 37). The file
//! is written whole and then renamed into place, so a collector never
//! reads half of it; a failure to write it is a warning too, and the exit
//! status stays the job's.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::SystemTime;

use clap::Args;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::exit::Failure;
use crate::say::say;

/// `--metrics-addr` and `--metrics-file`, of `run`, `elect` and `pool`.
#[derive(Args, Debug, Clone, Default)]
pub struct MetricsArg {
    /// Serve Prometheus metrics (text format, any path) on HOST:PORT, e.g. 127.0.0.1:9464 or
    /// localhost:9464 (port 0 is refused: nobody could find it). Any address given is bound,
    /// also a non-loopback one: the metrics show work IDs and elections, so expose them only
    /// where that is fine. An address that cannot be bound is a warning; the command runs.
    /// See docs/metrics.md.
    #[arg(long, value_name = "HOST:PORT", value_parser = crate::parse_metrics_addr)]
    metrics_addr: Option<SocketAddr>,

    /// Write the metrics, in Prometheus text format, to FILE when the command ends
    /// (whatever its exit status), for node_exporter's textfile collector: written to
    /// FILE.tmp.PID, then renamed over FILE. Every series gets the label
    /// worklease_job (the work ID, election or pool name), so that the files of
    /// several jobs in one directory do not collide; adds worklease_exit_status,
    /// worklease_end_time_seconds and worklease_child_started. See docs/metrics.md.
    #[arg(long, value_name = "FILE")]
    metrics_file: Option<PathBuf>,
}

/// The recorder's handle and where to write it at the end.
struct AtExit {
    handle: PrometheusHandle,
    file: PathBuf,
}

static AT_EXIT: OnceLock<AtExit> = OnceLock::new();

/// Whether this process started a child (the job ran, or began to).
static CHILD_STARTED: AtomicBool = AtomicBool::new(false);

/// Notes that a child was started, for `worklease_child_started`.
pub fn child_started() {
    CHILD_STARTED.store(true, Ordering::Relaxed);
}

impl MetricsArg {
    /// Installs the Prometheus recorder (when either option was given),
    /// registers the metrics' descriptions and starts the HTTP listener on
    /// the current runtime (with `--metrics-addr`). `job` (the work ID,
    /// election or pool name) labels the series of `--metrics-file`.
    ///
    /// # Errors
    /// A usage failure when `--metrics-file` names something other than a
    /// regular file (a device, a directory, a symbolic link) or a file in a
    /// directory that does not exist. A listener that cannot be bound is
    /// a warning.
    pub fn serve(&self, job: &str) -> Result<(), Failure> {
        if self.metrics_addr.is_none() && self.metrics_file.is_none() {
            return Ok(());
        }
        if let Some(file) = &self.metrics_file {
            check_file(file).map_err(|why| {
                Failure::usage(format!("refusing --metrics-file {}: {why}", file.display()))
            })?;
        }
        let builder = || {
            let builder = PrometheusBuilder::new();
            if self.metrics_file.is_some() {
                builder.add_global_label("worklease_job", job)
            } else {
                builder
            }
        };
        let recorder = match self.metrics_addr {
            Some(addr) => match builder().with_http_listener(addr).build() {
                Ok((recorder, exporter)) => {
                    tokio::spawn(exporter);
                    tracing::info!(%addr, "serving Prometheus metrics");
                    recorder
                }
                Err(e) => {
                    tracing::warn!(
                        %addr,
                        error = %e,
                        "cannot serve metrics on --metrics-addr; running without it"
                    );
                    builder().build_recorder()
                }
            },
            None => builder().build_recorder(),
        };
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            // Only a second `serve` in one process gets here: the first
            // recorder goes on recording.
            return Ok(());
        }
        worklease::metrics::describe();
        if let Some(file) = &self.metrics_file {
            let _ = AT_EXIT.set(AtExit {
                handle,
                file: file.clone(),
            });
        }
        Ok(())
    }
}

/// Writes `--metrics-file`, if one was given, for a command that ends
/// with exit status `code`: the metrics recorded, plus
/// `worklease_exit_status` and `worklease_end_time_seconds`.
pub fn write_at_exit(code: u8) {
    let Some(at_exit) = AT_EXIT.get() else {
        return;
    };
    metrics::describe_gauge!(
        "worklease_exit_status",
        "The exit status of the worklease command that wrote this file (see `worklease --help`)."
    );
    metrics::describe_gauge!(
        "worklease_end_time_seconds",
        metrics::Unit::Seconds,
        "When the worklease command that wrote this file ended, in seconds since the Unix epoch."
    );
    metrics::describe_gauge!(
        "worklease_child_started",
        "1 when the command that wrote this file started its child (the job ran), 0 when it did not (held, skipped, failed before)."
    );
    metrics::gauge!("worklease_exit_status").set(f64::from(code));
    let started = CHILD_STARTED.load(Ordering::Relaxed);
    metrics::gauge!("worklease_child_started").set(if started { 1.0 } else { 0.0 });
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    metrics::gauge!("worklease_end_time_seconds").set(now);
    at_exit.handle.run_upkeep();
    if let Err(e) = write_atomically(&at_exit.file, at_exit.handle.render().as_bytes()) {
        // Said also under -q: a collector would otherwise keep the last
        // run's file, and nobody would know.
        say!(
            "cannot write --metrics-file {}: {e}",
            at_exit.file.display()
        );
    }
}

/// Why `path` cannot be `--metrics-file`: it exists and is not a regular
/// file (`/dev/null`, a directory, a symbolic link: the rename would
/// replace it), or its directory does not exist.
fn check_file(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_file() => Ok(()),
        Ok(_) => Err("it exists and is not a regular file (a device, a directory or a symbolic link), which the file written would replace".into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if dir.is_dir() {
                Ok(())
            } else {
                Err(format!("its directory {} does not exist", dir.display()))
            }
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Writes `bytes` to a new `path.tmp.PID` (created, never opened if it
/// exists: a link planted there is not followed; mode 0644), then renames
/// it over `path` after checking again that `path` is a regular file or
/// missing.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    check_file(path).map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)?;
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
