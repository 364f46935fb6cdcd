//! The documented metrics (see `worklease::metrics`), recorded through the
//! `metrics` facade into a local `DebuggingRecorder`.

use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use worklease::election::Elector;
use worklease::metrics as m;
use worklease::store::memory::MemoryStore;
use worklease::{AcquireOptions, Config, Error, Leases, RenewalOptions};

/// What a `DebuggingRecorder` recorded so far. Its snapshots are
/// destructive (counters and gauges are swapped to 0, histograms drained),
/// so every read takes a snapshot and adds it to what earlier reads saw:
/// counters and histogram sample counts add up; gauges keep the sum of
/// their readings (right for gauges moved by increments) and the last one
/// (right for gauges that are set).
/// A metric seen: kind, name, labels, sum of readings, last reading.
type Entry = (MetricKind, String, Vec<(String, String)>, f64, f64);

struct Seen {
    snap: Snapshotter,
    values: Vec<Entry>,
}

impl Seen {
    fn new(recorder: &DebuggingRecorder) -> Self {
        Self {
            snap: recorder.snapshotter(),
            values: Vec::new(),
        }
    }

    fn take(&mut self) {
        for (key, _, _, v) in self.snap.snapshot().into_vec() {
            let (kind, key) = (key.kind(), key.key().clone());
            let labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_string(), l.value().to_string()))
                .collect();
            let reading = match v {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(h) => h.len() as f64,
            };
            let name = key.name().to_string();
            match self
                .values
                .iter_mut()
                .find(|(k, n, l, _, _)| *k == kind && *n == name && *l == labels)
            {
                Some(entry) => {
                    entry.3 += reading;
                    entry.4 = reading;
                }
                None => self.values.push((kind, name, labels, reading, reading)),
            }
        }
    }

    /// (sum, last) of the metric, as of the last [`Seen::take`], `name` whose labels include `labels`.
    fn get(&mut self, kind: MetricKind, name: &str, labels: &[(&str, &str)]) -> Option<(f64, f64)> {
        let found: Vec<_> = self
            .values
            .iter()
            .filter(|(k, n, l, _, _)| {
                *k == kind
                    && n == name
                    && labels
                        .iter()
                        .all(|(ln, lv)| l.iter().any(|(a, b)| a == ln && b == lv))
            })
            .collect();
        (!found.is_empty()).then(|| {
            found
                .iter()
                .fold((0.0, 0.0), |(s, l), e| (s + e.3, l + e.4))
        })
    }

    fn counter(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.get(MetricKind::Counter, name, labels)
            .map_or(0, |v| v.0 as u64)
    }

    fn gauge_sum(&mut self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.get(MetricKind::Gauge, name, labels).map(|v| v.0)
    }

    fn gauge(&mut self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.get(MetricKind::Gauge, name, labels).map(|v| v.1)
    }

    fn histogram_count(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.get(MetricKind::Histogram, name, labels)
            .map_or(0, |v| v.0 as u64)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn lease_operations_are_counted_timed_and_gauged() {
    let recorder = DebuggingRecorder::new();
    let mut snap = Seen::new(&recorder);
    let _local = metrics::set_default_local_recorder(&recorder);
    m::describe();
    let store = Arc::new(MemoryStore::new());
    let ttl = Duration::from_millis(600);
    runtime().block_on(async {
        let a = Leases::new(store.clone(), Config::new("a", ttl)).unwrap();
        let b = Leases::new(store.clone(), Config::new("b", ttl)).unwrap();
        let token = a.acquire("job", AcquireOptions::new()).await.unwrap();
        assert!(matches!(
            b.acquire("job", AcquireOptions::new()).await,
            Err(Error::Held { .. })
        ));
        let mut renewal = a
            .start_renewal(
                token,
                RenewalOptions::new().interval(Duration::from_millis(50)),
            )
            .unwrap();
        for _ in 0..3 {
            renewal.changed().await.unwrap();
        }
        snap.take();
        assert_eq!(
            snap.gauge_sum(m::LEASES_HELD, &[("store", "memory")]),
            Some(1.0)
        );
        // The margin left at the last renewal: positive, below TTL - TTL/10.
        let left = snap
            .gauge(m::LEASE_REMAINING_SECONDS, &[("work_id", "job")])
            .unwrap();
        assert!(left > 0.0 && left <= 0.54, "{left}");
        assert_eq!(
            snap.gauge(m::LEASE_TTL_SECONDS, &[("work_id", "job")]),
            Some(0.6)
        );
        let token = renewal.stop().await.unwrap();
        snap.take();
        assert_eq!(
            snap.gauge_sum(m::LEASES_HELD, &[("store", "memory")]),
            Some(0.0)
        );
        let token = a.checkpoint(&token, &b"page 7"[..]).await.unwrap();
        a.read_checkpoint(&token).await.unwrap();
        a.release(token.clone()).await.unwrap();

        // b takes over; a's stale renewal is fenced and counts as a loss.
        b.acquire("job", AcquireOptions::new()).await.unwrap();
        let renewal = a
            .start_renewal(token.clone(), RenewalOptions::new())
            .unwrap();
        assert!(matches!(renewal.lost().await, Error::Fenced { .. }));
        assert!(matches!(
            a.checkpoint(&token, &b"x"[..]).await,
            Err(Error::Fenced { .. })
        ));
    });

    snap.take();
    let ok = [("store", "memory"), ("outcome", "ok")];
    assert_eq!(snap.counter(m::ACQUISITIONS_TOTAL, &ok), 2);
    assert_eq!(
        snap.counter(m::ACQUISITIONS_TOTAL, &[("outcome", "held")]),
        1
    );
    assert!(snap.counter(m::RENEWALS_TOTAL, &ok) >= 3);
    assert_eq!(snap.counter(m::RENEWALS_TOTAL, &[("outcome", "fenced")]), 1);
    assert_eq!(snap.counter(m::CHECKPOINTS_TOTAL, &ok), 1);
    assert_eq!(
        snap.counter(m::CHECKPOINTS_TOTAL, &[("outcome", "fenced")]),
        1
    );
    assert_eq!(snap.counter(m::RELEASES_TOTAL, &ok), 1);
    assert_eq!(snap.counter(m::FENCED_TOTAL, &[("operation", "renew")]), 1);
    assert_eq!(
        snap.counter(m::FENCED_TOTAL, &[("operation", "checkpoint")]),
        1
    );
    assert_eq!(
        snap.counter(m::LEASES_LOST_TOTAL, &[("cause", "fenced")]),
        1
    );
    assert_eq!(
        snap.gauge_sum(m::LEASES_HELD, &[("store", "memory")]),
        Some(0.0)
    );

    // Background renewals go to the store in batches (`renew_many`).
    for op in [
        "acquire",
        "renew_many",
        "checkpoint",
        "read_checkpoint",
        "release",
    ] {
        let n = snap.histogram_count(
            m::OPERATION_SECONDS,
            &[("store", "memory"), ("operation", op)],
        );
        assert!(n >= 1, "no {op} timings");
    }
    assert_eq!(
        snap.histogram_count(m::OPERATION_SECONDS, &[("operation", "acquire")]),
        3
    );
}

#[test]
fn is_leader_is_one_while_leading() {
    let recorder = DebuggingRecorder::new();
    let mut snap = Seen::new(&recorder);
    let _local = metrics::set_default_local_recorder(&recorder);
    let leading = runtime().block_on(async {
        let elector = Elector::builder(Arc::new(MemoryStore::new()), "scheduler", "host-a")
            .build()
            .unwrap();
        elector
            .lead(|_| async {
                snap.take();
                snap.gauge(m::IS_LEADER, &[("election", "scheduler")])
            })
            .await
            .unwrap()
    });
    assert_eq!(leading, Some(1.0));
    snap.take();
    assert_eq!(
        snap.gauge(m::IS_LEADER, &[("election", "scheduler")]),
        Some(0.0)
    );
}

#[test]
fn transitions_are_set_by_each_leader_when_its_term_starts() {
    let recorder = DebuggingRecorder::new();
    let mut snap = Seen::new(&recorder);
    let _local = metrics::set_default_local_recorder(&recorder);
    let store = Arc::new(MemoryStore::new());
    let seen = runtime().block_on(async {
        let mut seen = Vec::new();
        for owner in ["host-a", "host-b", "host-b", "host-a"] {
            Elector::builder(store.clone(), "scheduler", owner)
                .build()
                .unwrap()
                .lead(|_| async {})
                .await
                .unwrap();
            snap.take();
            seen.push(snap.gauge(m::ELECTION_TRANSITIONS, &[("election", "scheduler")]));
        }
        seen
    });
    assert_eq!(seen, [Some(0.0), Some(1.0), Some(1.0), Some(2.0)]);
}

#[test]
fn is_leader_drops_when_leadership_is_lost() {
    let recorder = DebuggingRecorder::new();
    let mut snap = Seen::new(&recorder);
    let _local = metrics::set_default_local_recorder(&recorder);
    let seen = &mut snap;
    runtime().block_on(async move {
        let store = Arc::new(MemoryStore::new());
        let elector = Elector::builder(store.clone(), "scheduler", "host-a")
            .ttl(Duration::from_millis(300))
            .build()
            .unwrap();
        elector
            .lead(|l| async move {
                // An operator takes the lease away; the next renewal is fenced.
                let t = l.token();
                let other = Leases::new(
                    store.clone(),
                    Config::new("host-b", Duration::from_millis(300)),
                )
                .unwrap();
                Leases::new(
                    store.clone(),
                    Config::new(t.holder_id().as_str(), Duration::from_millis(300)),
                )
                .unwrap()
                .release(t)
                .await
                .unwrap();
                other
                    .acquire("scheduler", AcquireOptions::new())
                    .await
                    .unwrap();
                l.lost().cancelled().await;
                tokio::task::yield_now().await;
                seen.take();
                seen.gauge(m::IS_LEADER, &[("election", "scheduler")])
            })
            .await
            .map(|g| assert_eq!(g, Some(0.0)))
            .unwrap();
    });
    snap.take();
    assert_eq!(
        snap.counter(m::LEASES_LOST_TOTAL, &[("cause", "fenced")]),
        1
    );
}
