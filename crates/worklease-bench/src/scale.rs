//! Scale: one process acquires N leases (TTL 10 s) with
//! `Leases::acquire_many`, in calls of up to 1,000 work IDs with several
//! in flight, and renews each in the background (`Leases::start_renewal`,
//! every TTL/3: the handle's session renews them in batches,
//! `LeaseStore::renew_many`), as a process of a fleet holding many work
//! IDs would. It runs in a process of its own (this program again, `scale`
//! subcommand), so that nothing of the other scenarios counts. Measured
//! over a window after acquiring: CPU seconds per second of that process
//! (`getrusage`), resident memory per held lease (`/proc/self/statm`),
//! renewals done, failed and missed, and the store calls the session made
//! (counted by a `metrics` recorder, [`crate::calls`]).
//!
//! A register store (S3) has no batch and no clock: each renewal is a
//! read and a conditional write. For it the scenario first measures the
//! server's request rate (the baseline's conditional writes), which bounds
//! the leases one process can keep: requests/s × interval / 2.

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::process::Command;
use tokio::time::Instant;
use worklease::observe::RenewEvent;
use worklease::{Config, LeaseObserver, Leases, Renewal, RenewalOptions};

use crate::calls::StoreCalls;
use crate::measure::{compare, Contestant};
use crate::results::{ScaleRow, Variant};
use crate::stores::{Bench, Opened};
use crate::{ops, sys, Plan, Result};

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
    /// Work IDs per `acquire_many` call (at most).
    pub batch: usize,
    /// `acquire_many` calls in flight at once.
    pub in_flight: usize,
}

impl Job {
    /// The plan's job for `leases` leases.
    pub fn new(plan: &Plan, leases: usize) -> Self {
        Self {
            leases,
            ttl: plan.scale_ttl,
            window: plan.scale_window,
            acquire_limit: plan.scale_acquire_limit,
            batch: plan.scale_acquire_batch,
            in_flight: plan.scale_acquire_in_flight,
        }
    }

    /// Work IDs per `acquire_many` call: the batch, or fewer so that every
    /// call in flight has some.
    fn per_call(&self) -> usize {
        self.batch
            .min(self.leases.div_ceil(self.in_flight.max(1)))
            .max(1)
    }
}

/// The scale scenario on one store: the plan's sizes (a register store's,
/// smaller, for a register store), each in a process of its own, on a
/// namespace of its own; the rows go to `rows` as they come.
pub async fn scenario(
    bench: &dyn Bench,
    plan: &Plan,
    register: bool,
    rows: &mut Vec<ScaleRow>,
) -> Result<()> {
    let (sizes, rate) = if register {
        let opened = bench.open("scale_rate").await?;
        let rate = register_rate(&opened, plan).await?;
        eprintln!(
            "  scale: {rate:.0} conditional writes/s at {} clients: at most {:.0} leases renewed every TTL/3",
            opened.store.max_batch(),
            rate * (plan.scale_ttl / 3).as_secs_f64() / ScaleRow::REGISTER_REQUESTS_PER_RENEWAL
        );
        (&plan.scale_register_sizes, Some(rate))
    } else {
        (&plan.scale_sizes, None)
    };
    for &n in sizes {
        let opened = bench.open(&format!("scale_{n}")).await?;
        let mut row = in_child(&opened, &Job::new(plan, n)).await?;
        row.register_requests_per_sec = rate;
        eprintln!(
            "  scale {n}: acquired {} in {:.1} s; {:.3} CPU s/s ({} µs/renewal), {:.0} B/lease, renewals {}/{} done, {} failed, {} missed; {} renew_many calls/tick (bound {})",
            row.acquired,
            row.acquire_secs,
            row.cpu_per_sec,
            row.cpu_us_per_renewal()
                .map_or("-".to_string(), |c| format!("{c:.1}")),
            row.rss_per_lease_bytes,
            row.renewals_ok,
            row.renewals_due,
            row.renewal_failures,
            row.missed,
            row.calls_per_tick()
                .map_or("-".to_string(), |c| format!("{c:.1}")),
            row.calls_bound()
                .map_or("-".to_string(), |b| b.to_string()),
        );
        rows.push(row);
    }
    Ok(())
}

/// A register store's request rate: the baseline's conditional writes per
/// second at as many clients as one batch renews at once (the store's
/// batch size: one wave of single calls).
async fn register_rate(opened: &Opened, plan: &Plan) -> Result<f64> {
    let clients = opened.store.max_batch().max(1);
    let mut contestants = [Contestant::new(
        Variant::Baseline,
        "1 compare-and-set",
        ops::cas_clients(opened, clients, 1, 0).await?,
    )];
    compare(&mut contestants, plan.timing).await?;
    Ok(contestants[0].tally.rate())
}

/// Runs `job` in a process of its own (this program's `scale` subcommand)
/// on the store at `opened`'s URL, so that its CPU time and memory are
/// the job's alone; returns its row.
async fn in_child(opened: &Opened, job: &Job) -> Result<ScaleRow> {
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
        .arg("--batch")
        .arg(job.batch.to_string())
        .arg("--in-flight")
        .arg(job.in_flight.to_string())
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

/// One process holding `job.leases` leases on the store at `url` (the
/// `scale` subcommand: it installs this process's metrics recorder).
pub async fn run(url: &str, job: &Job) -> Result<ScaleRow> {
    let calls = StoreCalls::install()?;
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
    let ids: Vec<String> = (0..n).map(|i| format!("scale-{i}")).collect();
    let rss_before = sys::resident_bytes()?;

    // Acquire in batches (each lease renewed from its acquisition on),
    // with a bound on the time it may take.
    let started = Instant::now();
    let deadline = started + job.acquire_limit;
    let mut acquisitions = futures_util::stream::iter(ids.chunks(job.per_call()))
        .map(|chunk| {
            let (leases, options) = (leases.clone(), options.clone());
            async move {
                let tokens = leases.acquire_many(chunk, chunk.len()).await?;
                let held = tokens
                    .into_iter()
                    .map(|t| leases.start_renewal(t, options.clone()))
                    .collect::<worklease::Result<Vec<Renewal>>>()?;
                Ok::<_, crate::BoxError>((chunk.len(), held))
            }
        })
        .buffer_unordered(job.in_flight.max(1));
    let mut renewals = Vec::with_capacity(n);
    let (mut refused, mut failed_calls) = (0usize, 0usize);
    while let Ok(Some(r)) = tokio::time::timeout_at(deadline, acquisitions.next()).await {
        match r {
            Ok((asked, held)) => {
                refused += asked - held.len();
                renewals.extend(held);
            }
            Err(e) => {
                if failed_calls == 0 {
                    eprintln!("  scale {n}: an acquire_many call failed: {e}");
                }
                failed_calls += 1;
            }
        }
    }
    drop(acquisitions);
    let acquire_secs = started.elapsed().as_secs_f64();
    if refused > 0 || failed_calls > 0 {
        eprintln!(
            "  scale {n}: {refused} work IDs not granted, {failed_calls} acquire_many calls failed"
        );
    }

    // The window starts half an interval after the last acquisition, so
    // that a burst of acquisitions (and so of renewal sends) does not sit
    // on its edge. Renewals sent in it count, once they came back (a grace
    // of one interval after its end).
    tokio::time::sleep(interval / 2).await;
    let cpu_before = sys::cpu_time()?;
    let calls_before = calls.tally("renew_many");
    let window_start = Instant::now();
    counter
        .start_ns
        .store(counter.ns(window_start), Ordering::Relaxed);
    counter
        .end_ns
        .store(counter.ns(window_start + window), Ordering::Relaxed);
    tokio::time::sleep_until(window_start + window).await;
    let cpu = sys::cpu_time()? - cpu_before;
    let renew_calls = calls.tally("renew_many").since(calls_before);
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
        max_batch: Some(store.max_batch()),
        ticks: Some(rounds as u64),
        renew_calls: Some(renew_calls.calls),
        renew_call_secs: Some(renew_calls.secs),
        register_requests_per_sec: None,
    })
}
