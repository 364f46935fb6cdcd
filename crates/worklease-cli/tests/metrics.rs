//! End-to-end: `--metrics-addr` serves the documented metrics in
//! Prometheus text format while `worklease run` and `worklease elect` hold
//! their lease, scraped with a plain HTTP GET. Synchronisation is by files
//! the child creates and by bounded polls, as in `tests/run.rs`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{free_port, http_get};
use std::net::TcpListener;

const BIN: &str = env!("CARGO_BIN_EXE_worklease");

/// `GET /metrics` on `127.0.0.1:port`: the body, or `None` when nothing
/// answers (yet).
fn scrape(port: u16) -> Option<String> {
    let (status, body) = http_get(port, "/metrics")?;
    (status == 200).then_some(body)
}

/// The value of the sample `name{labels}` (labels as they are printed, in
/// order; `""` for none), if the scrape has it.
fn sample(body: &str, name: &str, labels: &str) -> Option<f64> {
    let want = if labels.is_empty() {
        name.to_string()
    } else {
        format!("{name}{{{labels}}}")
    };
    body.lines().find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        (series == want).then(|| value.parse().ok())?
    })
}

fn poll_until<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Kills and reaps `child` when dropped (a failed test leaves nothing).
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn worklease(dir: &Path, args: &[&str]) -> Reap {
    let store = format!("sqlite:{}", dir.join("leases.db").display());
    let child = Command::new(BIN)
        .args(args)
        .env_remove("WORKLEASE_TOKEN")
        .env_remove("RUST_LOG")
        .env("WORKLEASE_STORE", store)
        .env("D", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn worklease");
    Reap(child)
}

/// The child script: marks itself started, runs until `$D/stop` exists.
const CHILD: &str = "touch \"$D/started\"; while [ ! -e \"$D/stop\" ]; do sleep 0.02; done";

#[test]
fn run_serves_one_acquisition_and_growing_renewals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut run = worklease(
        dir.path(),
        &[
            "run",
            "--ttl",
            "600ms",
            "--metrics-addr",
            &addr,
            "job",
            "--",
            "sh",
            "-c",
            CHILD,
        ],
    );
    assert!(
        poll_until(Duration::from_secs(10), || dir
            .path()
            .join("started")
            .exists()
            .then_some(()))
        .is_some(),
        "the child never started"
    );
    let first = poll_until(Duration::from_secs(10), || {
        let body = scrape(port)?;
        let renewals = sample(
            &body,
            "worklease_renewals_total",
            r#"store="sqlite",outcome="ok""#,
        )?;
        (renewals >= 1.0).then_some((body, renewals))
    })
    .expect("no renewal in the metrics");
    let (body, renewals) = first;
    assert_eq!(
        sample(
            &body,
            "worklease_acquisitions_total",
            r#"store="sqlite",outcome="ok""#
        ),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(&body, "worklease_leases_held", r#"store="sqlite""#),
        Some(1.0),
        "{body}"
    );
    let left = sample(
        &body,
        "worklease_lease_remaining_seconds",
        r#"work_id="job""#,
    )
    .expect(&body);
    assert!(left > 0.0 && left <= 0.54, "{left}");
    assert_eq!(
        sample(&body, "worklease_lease_ttl_seconds", r#"work_id="job""#),
        Some(0.6)
    );
    assert!(
        body.contains("# TYPE worklease_renewals_total counter"),
        "{body}"
    );
    assert!(
        sample(
            &body,
            "worklease_operation_seconds_count",
            r#"store="sqlite",operation="acquire""#
        ) == Some(1.0),
        "{body}"
    );

    // Renewals go on: the counter grows; still one acquisition.
    let later = poll_until(Duration::from_secs(10), || {
        let body = scrape(port)?;
        let n = sample(
            &body,
            "worklease_renewals_total",
            r#"store="sqlite",outcome="ok""#,
        )?;
        (n > renewals).then_some(body)
    })
    .expect("renewals did not grow");
    assert_eq!(
        sample(
            &later,
            "worklease_acquisitions_total",
            r#"store="sqlite",outcome="ok""#
        ),
        Some(1.0)
    );

    std::fs::write(dir.path().join("stop"), b"").expect("stop file");
    let status = poll_until(Duration::from_secs(10), || run.0.try_wait().ok().flatten())
        .expect("run did not exit");
    assert!(status.success(), "{status:?}");
}

#[test]
fn elect_serves_is_leader_1_while_leading() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut elect = worklease(
        dir.path(),
        &[
            "elect",
            "--ttl",
            "1s",
            "--metrics-addr",
            &addr,
            "scheduler",
            "--",
            "sh",
            "-c",
            CHILD,
        ],
    );
    // The gauge reads 0 while the process campaigns, then 1 once it leads:
    // wait for the 1 (the campaign takes a store round trip or two).
    let mut last = String::new();
    let body = poll_until(Duration::from_secs(10), || {
        let body = scrape(port)?;
        let leading = sample(&body, "worklease_is_leader", r#"election="scheduler""#) == Some(1.0);
        last.clone_from(&body);
        leading.then_some(body)
    })
    .unwrap_or_else(|| panic!("is_leader never read 1 while leading; last scrape:\n{last}"));
    assert_eq!(
        sample(
            &body,
            "worklease_acquisitions_total",
            r#"store="sqlite",outcome="ok""#
        ),
        Some(1.0),
        "{body}"
    );
    std::fs::write(dir.path().join("stop"), b"").expect("stop file");
    let status = poll_until(Duration::from_secs(10), || {
        elect.0.try_wait().ok().flatten()
    })
    .expect("elect did not exit");
    assert!(status.success(), "{status:?}");
}

#[test]
fn an_address_in_use_is_a_warning_and_the_job_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let store = format!("sqlite:{}", dir.path().join("leases.db").display());
    let ran = dir.path().join("ran");
    let out = Command::new(BIN)
        .args(["run", "--metrics-addr", &addr, "job", "--", "touch"])
        .arg(&ran)
        .env("WORKLEASE_STORE", store)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run worklease");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(ran.exists(), "the job did not run: {err}");
    assert!(err.contains("cannot serve metrics"), "{err}");
}

/// `--metrics-file` (a cron job's metrics, for node_exporter's textfile
/// collector): written at exit, whole, with the exit status and the lease
/// operations of the run; also when the run fails (held: 75).
#[test]
fn metrics_file_is_written_at_exit_with_the_exit_status() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite:{}", dir.path().join("leases.db").display());
    let file = dir.path().join("worklease.prom");
    let run = |args: &[&str]| {
        Command::new(BIN)
            .arg("run")
            .arg("--metrics-file")
            .arg(&file)
            .args(args)
            .env("WORKLEASE_STORE", &store)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output()
            .expect("run worklease")
    };
    let out = run(&["job", "--", "sh", "-c", "exit 3"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&file).expect("metrics file");
    let value = |text: &str, name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(&format!("{name}{{worklease_job=\"job\"}}")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    assert_eq!(value(&text, "worklease_exit_status"), 3.0, "{text}");
    assert_eq!(value(&text, "worklease_child_started"), 1.0, "{text}");
    let ended = value(&text, "worklease_end_time_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    assert!(ended <= now && ended > 0.0, "{text}");
    // Every series carries the job's label: two jobs' files in one
    // textfile directory never collide.
    assert!(
        text.contains("worklease_acquisitions_total{worklease_job=\"job\","),
        "{text}"
    );
    // No temporary file is left beside it.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp."))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // A held lease (75) writes the file too.
    let holder = dir.path().join("holder.stop");
    let mut held = Command::new(BIN)
        .args(["run", "job", "--", "sh", "-c"])
        .arg(format!(
            "touch {0}.started; while [ ! -e {0} ]; do sleep 0.05; done",
            holder.display()
        ))
        .env("WORKLEASE_STORE", &store)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn holder");
    let started = dir.path().join("holder.stop.started");
    assert!(
        common::poll_until(common::LONG, || started.exists()),
        "holder did not start"
    );
    let out = run(&["job", "--", "true"]);
    assert_eq!(out.status.code(), Some(75));
    let text = std::fs::read_to_string(&file).expect("metrics file");
    assert_eq!(value(&text, "worklease_exit_status"), 75.0, "{text}");
    assert_eq!(value(&text, "worklease_child_started"), 0.0, "{text}");
    std::fs::write(&holder, "").expect("stop");
    assert!(held.wait().expect("holder").success());
}

#[test]
fn log_format_json_writes_json_lines_and_quiet_only_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite:{}", dir.path().join("leases.db").display());
    let out = Command::new(BIN)
        .args(["--log-format", "json", "-v", "run", "job", "--", "true"])
        .env("WORKLEASE_STORE", &store)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run worklease");
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|v| v["span"]["name"] == "worklease.acquire"
                && v["span"]["work_id"] == "job"
                && v["span"]["store"] == "sqlite"),
        "{err}"
    );

    // The memory: store warns; -q keeps only errors.
    let run = |quiet: bool| {
        let mut args = vec!["run", "--store", "memory:"];
        if quiet {
            args.push("-q");
        }
        args.extend(["job", "--", "true"]);
        let out = Command::new(BIN)
            .args(&args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output()
            .expect("run worklease");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(run(false).contains("WARN"));
    assert_eq!(run(true), "");
}
