//! Running N concurrent clients for a while and recording each operation's
//! latency in an HDR histogram; measuring several variants (ours, the
//! baseline, the peer) alternately in slices, so that a change of the
//! machine's load during a run hits all of them alike.

use std::time::Duration;

use async_trait::async_trait;
use hdrhistogram::Histogram;
use tokio::time::Instant;

use crate::results::{Latency, OpRow, Variant};
use crate::{sys, Result};

/// One client of a measurement: a task that runs the same operation again
/// and again, with whatever state it keeps between them (a held token, the
/// expected version of a register).
#[async_trait]
pub trait Client: Send + 'static {
    /// One operation.
    async fn op(&mut self) -> Result<()>;

    /// Undoes what the client holds (releases its lease), after the last
    /// slice.
    async fn finish(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

/// A histogram of microseconds, from 1 µs to 10 minutes.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// Records `d` in microseconds (at least 1).
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record((d.as_micros() as u64).max(1));
}

/// Failed calls of concurrent participants: how many, and the first.
#[derive(Default)]
pub struct Failures {
    count: std::sync::atomic::AtomicU64,
    first: std::sync::Mutex<Option<String>>,
}

impl Failures {
    /// Counts `e`, keeping it when it is the first.
    pub fn add(&self, e: &dyn std::fmt::Display) {
        self.count
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut first) = self.first.lock() {
            first.get_or_insert_with(|| e.to_string());
        }
    }

    /// How many, and the first.
    pub fn get(&self) -> (u64, Option<String>) {
        let first = self.first.lock().ok().and_then(|f| f.clone());
        (self.count.load(std::sync::atomic::Ordering::Relaxed), first)
    }
}

/// What a measurement of one variant added up to over its slices.
pub struct Tally {
    hist: Histogram<u64>,
    ops: u64,
    secs: f64,
    /// CPU time of this process during the slices.
    cpu: Duration,
    errors: u64,
    first_error: Option<String>,
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            hist: histogram(),
            ops: 0,
            secs: 0.0,
            cpu: Duration::ZERO,
            errors: 0,
            first_error: None,
        }
    }
}

impl Tally {
    /// Operations per second.
    pub fn rate(&self) -> f64 {
        if self.secs > 0.0 {
            self.ops as f64 / self.secs
        } else {
            0.0
        }
    }

    /// The figure as a result row.
    pub fn row(
        &self,
        store: &str,
        clients: usize,
        bytes: Option<usize>,
        variant: Variant,
        what: &str,
    ) -> OpRow {
        OpRow {
            store: store.to_string(),
            clients,
            bytes,
            variant,
            what: what.to_string(),
            ops_per_sec: self.rate(),
            cpu_us_per_op: (self.ops > 0).then(|| self.cpu.as_secs_f64() * 1e6 / self.ops as f64),
            ops: self.ops,
            errors: self.errors,
            first_error: self.first_error.clone(),
            latency: Latency::of(&self.hist),
        }
    }
}

/// Runs every client for `warm_up` untimed, then for `dur` timed; adds
/// the timed operations to `tally` and gives the clients back.
pub async fn slice(
    clients: Vec<Box<dyn Client>>,
    warm_up: Duration,
    dur: Duration,
    tally: &mut Tally,
) -> Vec<Box<dyn Client>> {
    let start = Instant::now() + Duration::from_millis(5);
    let timed = start + warm_up;
    let end = timed + dur;
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let mut hist = histogram();
                let (mut ops, mut errors, mut first_error) = (0u64, 0u64, None);
                tokio::time::sleep_until(start).await;
                let mut last = timed;
                let mut yielded = Instant::now();
                loop {
                    // An operation that never waits (the memory store) would
                    // keep its worker thread from the other clients: give
                    // way at least every millisecond.
                    if yielded.elapsed() >= Duration::from_millis(1) {
                        tokio::task::yield_now().await;
                        yielded = Instant::now();
                    }
                    let began = Instant::now();
                    if began >= end {
                        break;
                    }
                    let result = c.op().await;
                    let done = Instant::now();
                    if began < timed {
                        continue;
                    }
                    match result {
                        Ok(()) => {
                            record(&mut hist, done - began);
                            ops += 1;
                        }
                        Err(e) => {
                            errors += 1;
                            first_error.get_or_insert_with(|| e.to_string());
                        }
                    }
                    last = done;
                }
                (c, hist, ops, errors, first_error, last)
            })
        })
        .collect();
    let mut back = Vec::with_capacity(tasks.len());
    let mut last_end = timed;
    for t in tasks {
        let (c, hist, ops, errors, first_error, last) = t.await.expect("a client task panicked");
        back.push(c);
        tally.hist.add(&hist).expect("histograms of one shape");
        tally.ops += ops;
        tally.errors += errors;
        if tally.first_error.is_none() {
            tally.first_error = first_error;
        }
        last_end = last_end.max(last);
    }
    // The last operations may end after `end`: count the time they took.
    tally.secs += (last_end - timed).as_secs_f64().max(dur.as_secs_f64());
    back
}

/// A variant to measure: its clients and what they added up to.
pub struct Contestant {
    /// Ours, the baseline or the peer.
    pub variant: Variant,
    /// What one operation is.
    pub what: String,
    clients: Vec<Box<dyn Client>>,
    /// The figures so far.
    pub tally: Tally,
}

impl Contestant {
    /// A variant with its clients.
    pub fn new(variant: Variant, what: impl Into<String>, clients: Vec<Box<dyn Client>>) -> Self {
        Self {
            variant,
            what: what.into(),
            clients,
            tally: Tally::default(),
        }
    }
}

/// How long each figure is measured.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Slices per figure.
    pub slices: u32,
    /// Timed length of one slice.
    pub slice: Duration,
    /// Untimed start of each slice.
    pub warm_up: Duration,
}

/// Measures the contestants alternately, `timing.slices` times each; then
/// lets every client finish (release what it holds).
pub async fn compare(contestants: &mut [Contestant], timing: Timing) -> Result<()> {
    for _ in 0..timing.slices {
        for c in contestants.iter_mut() {
            let clients = std::mem::take(&mut c.clients);
            let cpu = sys::cpu_time()?;
            c.clients = slice(clients, timing.warm_up, timing.slice, &mut c.tally).await;
            // Less the warm-up's share, in proportion to its time.
            let timed = timing.slice.as_secs_f64();
            c.tally.cpu += sys::cpu_time()?
                .saturating_sub(cpu)
                .mul_f64(timed / (timed + timing.warm_up.as_secs_f64()));
        }
    }
    for c in contestants.iter_mut() {
        for client in std::mem::take(&mut c.clients) {
            client.finish().await?;
        }
    }
    Ok(())
}
