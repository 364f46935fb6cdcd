//! Counts the store calls of this process: a `metrics` recorder that keeps,
//! for each `operation` label of `worklease_operation_seconds` (the
//! histogram the library records once per store call, a batch call once
//! for all its leases; background renewals are `renew_many`), how many
//! calls ended and how long they took in all. Every other metric goes
//! nowhere. The scale process installs it (a recorder is global: one per
//! process).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use worklease::metrics::OPERATION_SECONDS;

use crate::Result;

/// The calls of one operation, as they end.
#[derive(Default)]
struct Ended {
    calls: AtomicU64,
    nanos: AtomicU64,
}

impl HistogramFn for Ended {
    fn record(&self, seconds: f64) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.nanos
            .fetch_add((seconds.max(0.0) * 1e9) as u64, Ordering::Relaxed);
    }
}

/// The store calls of one operation that ended so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tally {
    /// Calls.
    pub calls: u64,
    /// Their durations added up, seconds.
    pub secs: f64,
}

impl Tally {
    /// The calls that ended since `earlier` (a tally of the same operation).
    pub fn since(self, earlier: Tally) -> Tally {
        Tally {
            calls: self.calls - earlier.calls,
            secs: self.secs - earlier.secs,
        }
    }
}

/// The recorder, and the handle to read what it counted.
#[derive(Clone, Default)]
pub struct StoreCalls {
    operations: Arc<Mutex<HashMap<String, Arc<Ended>>>>,
}

impl StoreCalls {
    /// A recorder installed as this process's global one.
    ///
    /// # Errors
    /// When a recorder is installed already.
    pub fn install() -> Result<Self> {
        let calls = Self::default();
        metrics::set_global_recorder(calls.clone())
            .map_err(|_| "a metrics recorder is installed in this process already")?;
        Ok(calls)
    }

    /// The calls of `operation` (`renew_many`, `acquire_many`, ...) that
    /// ended so far.
    pub fn tally(&self, operation: &str) -> Tally {
        let operations = self
            .operations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        operations
            .get(operation)
            .map_or_else(Tally::default, |e| Tally {
                calls: e.calls.load(Ordering::Relaxed),
                secs: e.nanos.load(Ordering::Relaxed) as f64 / 1e9,
            })
    }
}

impl Recorder for StoreCalls {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        if key.name() != OPERATION_SECONDS {
            return Histogram::noop();
        }
        let Some(operation) = key.labels().find(|l| l.key() == "operation") else {
            return Histogram::noop();
        };
        let mut operations = self
            .operations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let ended = match operations.get(operation.value()) {
            Some(e) => e.clone(),
            None => operations
                .entry(operation.value().to_string())
                .or_default()
                .clone(),
        };
        Histogram::from_arc(ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_calls_are_counted_by_operation() {
        let calls = StoreCalls::default();
        metrics::with_local_recorder(&calls, || {
            for _ in 0..3 {
                metrics::histogram!(OPERATION_SECONDS, "store" => "memory", "operation" => "renew_many")
                    .record(0.5);
            }
            metrics::histogram!(OPERATION_SECONDS, "store" => "memory", "operation" => "acquire_many")
                .record(0.25);
            metrics::histogram!("another_histogram", "operation" => "renew_many").record(1.0);
            metrics::counter!("a_counter", "operation" => "renew_many").increment(1);
        });
        let renew = calls.tally("renew_many");
        assert_eq!(renew.calls, 3);
        assert!((renew.secs - 1.5).abs() < 1e-6);
        assert_eq!(calls.tally("acquire_many").calls, 1);
        assert_eq!(calls.tally("release"), Tally::default());
        let earlier = Tally {
            calls: 1,
            secs: 0.5,
        };
        assert_eq!(
            renew.since(earlier),
            Tally {
                calls: 2,
                secs: 1.0
            }
        );
    }
}
