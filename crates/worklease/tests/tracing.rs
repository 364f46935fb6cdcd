//! Every lease and election operation has a `tracing` span with its facts:
//! work ID, holder, fencing token, store kind, outcome and duration.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use worklease::election::Elector;
use worklease::store::memory::MemoryStore;
use worklease::{AcquireOptions, Config, Error, Leases, TracingObserver};

/// A closed span: its name and its fields as text.
#[derive(Debug, Clone)]
struct Closed {
    name: &'static str,
    fields: HashMap<String, String>,
}

#[derive(Default)]
struct Fields(HashMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

/// Collects every span's fields, and the span when it closes.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Closed>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
                values.record(fields);
            }
        }
    }
    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            let fields = span
                .extensions()
                .get::<Fields>()
                .map(|f| f.0.clone())
                .unwrap_or_default();
            self.0.lock().unwrap().push(Closed {
                name: span.name(),
                fields,
            });
        }
    }
}

impl Capture {
    fn named(&self, name: &str) -> Vec<Closed> {
        let all = self.0.lock().unwrap();
        all.iter().filter(|c| c.name == name).cloned().collect()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn check(span: &Closed, want: &[(&str, &str)]) {
    for (k, v) in want {
        assert_eq!(
            span.fields.get(*k).map(String::as_str),
            Some(*v),
            "field {k} of {span:?}"
        );
    }
    let ms: f64 = span.fields["duration_ms"].parse().unwrap();
    assert!(ms >= 0.0, "{span:?}");
}

#[test]
fn acquire_renew_checkpoint_release_have_spans_with_their_facts() {
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    runtime().block_on(async {
        let leases = Leases::new(
            Arc::new(MemoryStore::new()),
            Config::new("worker-1", Duration::from_secs(15)).observer(Arc::new(TracingObserver)),
        )
        .unwrap();
        let token = leases
            .acquire("shard-7", AcquireOptions::new())
            .await
            .unwrap();
        // A second holder finds it held.
        let other = Leases::new(
            leases.store().clone(),
            Config::new("worker-2", Duration::from_secs(15)),
        )
        .unwrap();
        assert!(matches!(
            other.acquire("shard-7", AcquireOptions::new()).await,
            Err(Error::Held { .. })
        ));
        let token = leases.renew(&token).await.unwrap();
        leases.read_checkpoint(&token).await.unwrap();
        let token = leases.checkpoint(&token, &b"page 7"[..]).await.unwrap();
        leases.release(token.clone()).await.unwrap();
        // A stale token is fenced or expired: the outcome says which.
        assert!(leases.renew(&token).await.is_err());
    });

    let acquires = capture.named("worklease.acquire");
    assert_eq!(acquires.len(), 2, "{acquires:?}");
    check(
        &acquires[0],
        &[
            ("work_id", "shard-7"),
            ("holder", "worker-1"),
            ("store", "memory"),
            ("fencing_token", "1"),
            ("outcome", "ok"),
        ],
    );
    check(&acquires[1], &[("holder", "worker-2"), ("outcome", "held")]);
    assert!(!acquires[1].fields.contains_key("fencing_token"));

    let renews = capture.named("worklease.renew");
    assert_eq!(renews.len(), 2, "{renews:?}");
    check(
        &renews[0],
        &[
            ("work_id", "shard-7"),
            ("holder", "worker-1"),
            ("store", "memory"),
            ("fencing_token", "1"),
            ("attempt", "1"),
            ("outcome", "ok"),
        ],
    );
    let stale = &renews[1].fields["outcome"];
    assert!(stale == "expired" || stale == "fenced", "{stale}");

    let checkpoints = capture.named("worklease.checkpoint");
    assert_eq!(checkpoints.len(), 1);
    check(
        &checkpoints[0],
        &[("size", "6"), ("outcome", "ok"), ("fencing_token", "1")],
    );
    let reads = capture.named("worklease.read_checkpoint");
    assert_eq!(reads.len(), 1);
    check(&reads[0], &[("size", "0"), ("outcome", "ok")]);

    let releases = capture.named("worklease.release");
    assert_eq!(releases.len(), 1, "{releases:?}");
    check(
        &releases[0],
        &[
            ("work_id", "shard-7"),
            ("holder", "worker-1"),
            ("store", "memory"),
            ("fencing_token", "1"),
            ("outcome", "ok"),
        ],
    );
}

#[test]
fn election_operations_have_spans() {
    let capture = Capture::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
    runtime().block_on(async {
        let elector = Elector::builder(Arc::new(MemoryStore::new()), "scheduler", "host-a")
            .ttl(Duration::from_secs(15))
            .build()
            .unwrap();
        assert!(elector.leader().await.unwrap().is_none());
        let g = elector
            .lead(|l| async move { l.generation() })
            .await
            .unwrap();
        assert_eq!(g, 1);
    });
    let campaigns = capture.named("worklease.election.campaign");
    assert_eq!(campaigns.len(), 1, "{campaigns:?}");
    check(
        &campaigns[0],
        &[
            ("election", "scheduler"),
            ("holder", "host-a"),
            ("store", "memory"),
            ("generation", "1"),
            ("outcome", "ok"),
        ],
    );
    let leaders = capture.named("worklease.election.leader");
    assert_eq!(leaders.len(), 1);
    check(
        &leaders[0],
        &[("election", "scheduler"), ("outcome", "no_lease")],
    );
    // The campaign's acquisition is a child span with the same facts.
    assert_eq!(capture.named("worklease.acquire").len(), 1);
}
