//! Scale: one process acquires N leases (TTL 10 s) and renews each in the
//! background (`Leases::start_renewal`, every TTL/3), as a process of a
//! fleet holding many work IDs would. It runs in a process of its own
//! (this program again, `scale` subcommand), so that nothing of the other
//! scenarios counts. Measured over a window after acquiring: CPU seconds
//! per second of that process (`getrusage`), resident memory per held
//! lease (`/proc/self/statm`), renewals done, failed and missed.

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::process::Command;
use tokio::time::Instant;
use worklease::observe::RenewEvent;
use worklease::{AcquireOptions, Config, LeaseObserver, Leases, Renewal, RenewalOptions};

use crate::results::ScaleRow;
use crate::stores::Opened;
use crate::{sys, Result};

/// Counts the renewals whose request was sent inside the window. A
/// background renewal is sent every interval after the previous one's
/// send, so a lease kept on schedule sends exactly `window / interval`
/// renewals in a window of whole intervals, whatever its phase.
struct Counter {
    base: Instant,
    /// The window, in ns since `base`: [start, end).
    start_ns: AtomicU64,
    end_ns: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    /// The least lease time left when a renewal came back, µs.
    min_left_us: AtomicU64,
}

impl Counter {
    fn new() -> Self {
        Self {
            base: Instant::now(),
            start_ns: AtomicU64::new(u64::MAX),
            end_ns: AtomicU64::new(u64::MAX),
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            min_left_us: AtomicU64::new(u64::MAX),
        }
    }

    fn ns(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_nanos() as u64
    }
}

impl LeaseObserver for Counter {
    fn on_renew(&self, event: &RenewEvent<'_>) {
        let sent = self.ns(Instant::now() - event.duration);
        if sent < self.start_ns.load(Ordering::Relaxed)
            || sent >= self.end_ns.load(Ordering::Relaxed)
        {
            return;
        }
        if event.error.is_some() {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.ok.fetch_add(1, Ordering::Relaxed);
        let left = event.token.remaining().map_or(0, |d| d.as_micros() as u64);
        self.min_left_us.fetch_min(left, Ordering::Relaxed);
    }
}

/// What one scale measurement is asked to do.
#[derive(Debug, Clone)]
pub struct Job {
    /// Leases to hold.
    pub leases: usize,
    /// Their TTL.
    pub ttl: Duration,
    /// The window measured after acquiring (rounded to whole renewal
    /// intervals).
    pub window: Duration,
    /// Longest time to acquire them.
    pub acquire_limit: Duration,
    /// Acquisitions in flight at once.
    pub concurrency: usize,
}

/// Runs `job` in a process of its own (this program's `scale` subcommand)
/// on the store at `opened`'s URL, so that its CPU time and memory are
/// the job's alone; returns its row.
pub async fn in_child(opened: &Opened, job: &Job) -> Result<ScaleRow> {
    let output = Command::new(std::env::current_exe()?)
        .arg("scale")
        .arg("--store")
        .arg(&opened.url)
        .arg("--leases")
        .arg(job.leases.to_string())
        .arg("--ttl-ms")
        .arg(job.ttl.as_millis().to_string())
        .arg("--window-ms")
        .arg(job.window.as_millis().to_string())
        .arg("--acquire-limit-ms")
        .arg(job.acquire_limit.as_millis().to_string())
        .arg("--concurrency")
        .arg(job.concurrency.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .output()
        .await?;
    if !output.status.success() {
        return Err(format!("the scale process failed ({})", output.status).into());
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// One process holding `job.leases` leases on the store at `url`.
pub async fn run(url: &str, job: &Job) -> Result<ScaleRow> {
    let store = worklease::store::url::open(url)?;
    let counter = Arc::new(Counter::new());
    let leases = Leases::new(
        store.clone(),
        Config::new(format!("scale-{}", std::process::id()), job.ttl).observer(counter.clone()),
    )?;
    let options = RenewalOptions::new();
    let interval = options.check(&leases)?;
    let rounds = (job.window.as_secs_f64() / interval.as_secs_f64())
        .round()
        .max(1.0);
    let window = interval.mul_f64(rounds);
    let n = job.leases;
    let rss_before = sys::resident_bytes()?;

    // Acquire (each lease renewed from its acquisition on), with a bound
    // on the time it may take.
    let started = Instant::now();
    let deadline = started + job.acquire_limit;
    let mut acquisitions = futures_util::stream::iter(0..n)
        .map(|i| {
            let (leases, options) = (leases.clone(), options.clone());
            async move {
                let token = leases
                    .acquire(&format!("scale-{i}"), AcquireOptions::new())
                    .await?;
                Ok::<Renewal, crate::BoxError>(leases.start_renewal(token, options)?)
            }
        })
        .buffer_unordered(job.concurrency);
    let mut renewals = Vec::with_capacity(n);
    let mut acquire_errors = 0u64;
    while let Ok(Some(r)) = tokio::time::timeout_at(deadline, acquisitions.next()).await {
        match r {
            Ok(renewal) => renewals.push(renewal),
            Err(_) => acquire_errors += 1,
        }
    }
    drop(acquisitions);
    let acquire_secs = started.elapsed().as_secs_f64();
    if acquire_errors > 0 {
        eprintln!("  scale {n}: {acquire_errors} acquisitions failed");
    }

    // The window starts half an interval after the last acquisition, so
    // that a burst of acquisitions (and so of renewal sends) does not sit
    // on its edge. Renewals sent in it count, once they came back (a grace
    // of one interval after its end).
    tokio::time::sleep(interval / 2).await;
    let cpu_before = sys::cpu_time()?;
    let window_start = Instant::now();
    counter
        .start_ns
        .store(counter.ns(window_start), Ordering::Relaxed);
    counter
        .end_ns
        .store(counter.ns(window_start + window), Ordering::Relaxed);
    tokio::time::sleep_until(window_start + window).await;
    let cpu = sys::cpu_time()? - cpu_before;
    let rss_held = sys::resident_bytes()?;
    tokio::time::sleep(interval).await;

    let missed = renewals
        .iter()
        .filter(|r| r.lost_signal().is_cancelled())
        .count() as u64;
    let acquired = renewals.len();
    drop(renewals);
    let min_left = counter.min_left_us.load(Ordering::Relaxed);
    Ok(ScaleRow {
        store: store.kind().to_string(),
        leases: n,
        acquired,
        ttl_ms: job.ttl.as_millis() as u64,
        renew_interval_ms: interval.as_millis() as u64,
        acquire_secs,
        window_secs: window.as_secs_f64(),
        cpu_per_sec: cpu.as_secs_f64() / window.as_secs_f64(),
        renewals_due: acquired as u64 * rounds as u64,
        rss_per_lease_bytes: rss_held.saturating_sub(rss_before) as f64 / acquired.max(1) as f64,
        renewals_ok: counter.ok.load(Ordering::Relaxed),
        renewal_failures: counter.failed.load(Ordering::Relaxed),
        missed,
        min_left_ms: (min_left != u64::MAX).then(|| min_left as f64 / 1000.0),
    })
}
