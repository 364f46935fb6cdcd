//! Latency of the object-storage store against a real S3-compatible server,
//! beside a baseline measured in the same process through the same
//! `object_store` client: one conditional PUT (`If-Match` on the ETag of
//! the previous one), the least any compare-and-swap on an object costs.
//!
//! * acquire→release: one cycle through [`Leases`] on a work ID of its own
//!   (acquire reads the object and writes it conditionally, release does
//!   the same: four requests);
//! * renew: on a held lease (a read and a conditional write: two requests).
//!
//! One client, one operation at a time: these are latencies, the median
//! (and mean) of every operation timed, ours and the baseline measured in
//! alternating slices so that a change of the machine's load affects both
//! alike. The ratio is ours / baseline of the medians.
//!
//! Run: `cargo bench -p worklease --features object-store --bench
//! object_store` against `WORKLEASE_TEST_S3_URL` (default
//! `s3://worklease-test/worklease-test?endpoint=http://127.0.0.1:5000&region=us-east-1`,
//! see `.ci/services/moto.sh`), with `AWS_ACCESS_KEY_ID` and
//! `AWS_SECRET_ACCESS_KEY` set (any values for moto); optionally
//! `-- --seconds 5` per figure (default 2). Its objects live under a random
//! prefix and are deleted at the end.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    Attribute, Attributes, ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion,
};
use worklease::store::object::S3Config;
use worklease::{AcquireOptions, Config, Leases, Token};

const DEFAULT_URL: &str =
    "s3://worklease-test/worklease-test?endpoint=http://127.0.0.1:5000&region=us-east-1";

/// Operations before the timing starts, in each slice.
const WARM_UP: usize = 10;
/// Each figure is measured in this many slices, alternating with its
/// baseline.
const SLICES: u32 = 4;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Cycle,
    Renew,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Cycle => "acquire→release",
            Op::Renew => "renew",
        }
    }
}

/// Times `op` over and over for `dur` after a warm-up, adding each
/// operation's latency to `samples`.
async fn time(dur: Duration, samples: &mut Vec<Duration>, mut op: impl AsyncFnMut()) {
    for _ in 0..WARM_UP {
        op().await;
    }
    let start = Instant::now();
    while start.elapsed() < dur {
        let t = Instant::now();
        op().await;
        samples.push(t.elapsed());
    }
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn mean(samples: &[Duration]) -> Duration {
    samples.iter().sum::<Duration>() / u32::try_from(samples.len()).unwrap_or(u32::MAX)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The baseline: one conditional PUT of 64 bytes over the previous one's
/// ETag, as the store writes its objects (same content type).
struct Baseline {
    store: Arc<dyn ObjectStore>,
    path: Path,
    version: UpdateVersion,
}

impl Baseline {
    async fn new(store: Arc<dyn ObjectStore>, path: Path) -> Self {
        let put = store
            .put_opts(&path, payload(), options(PutMode::Create))
            .await
            .expect("baseline create");
        Self {
            store,
            path,
            version: put.into(),
        }
    }

    async fn put(&mut self) {
        let put = self
            .store
            .put_opts(
                &self.path,
                payload(),
                options(PutMode::Update(self.version.clone())),
            )
            .await
            .expect("the baseline's conditional put must succeed");
        self.version = put.into();
    }
}

fn payload() -> PutPayload {
    Bytes::from(vec![b'x'; 64]).into()
}

fn options(mode: PutMode) -> PutOptions {
    let mut attributes = Attributes::new();
    attributes.insert(Attribute::ContentType, "application/octet-stream".into());
    PutOptions {
        mode,
        attributes,
        ..PutOptions::default()
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dur = common::seconds();
    let url = std::env::var("WORKLEASE_TEST_S3_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| DEFAULT_URL.to_string());
    let base = S3Config::from_url(&url).expect("WORKLEASE_TEST_S3_URL");
    let prefix = format!("{}/bench-{:016x}", base.get_prefix(), rand::random::<u64>());
    let config = base.prefix(prefix.clone()).expect("prefix");
    let store = Arc::new(config.open().expect("S3 store"));
    let objects = store.register().object_store().clone();
    let leases = Leases::new(store, Config::new("bench", Duration::from_secs(30))).expect("config");
    let mut baseline = Baseline::new(
        objects.clone(),
        Path::parse(format!("{prefix}/baseline")).expect("path"),
    )
    .await;

    println!(
        "worklease object-storage store ({}) vs 1 conditional PUT, latency ({dur:?} per figure)",
        worklease::store::url::redact(&url)
    );
    for op in [Op::Cycle, Op::Renew] {
        let work = format!("bench/{}", op.name());
        let mut held: Option<Token> = None;
        if op == Op::Renew {
            held = Some(
                leases
                    .acquire(&work, AcquireOptions::new())
                    .await
                    .expect("acquire"),
            );
        }
        let (mut o, mut b) = (Vec::new(), Vec::new());
        let slice = dur / SLICES;
        for _ in 0..SLICES {
            match op {
                Op::Cycle => {
                    time(slice, &mut o, async || {
                        let t = leases
                            .acquire(&work, AcquireOptions::new())
                            .await
                            .expect("acquire");
                        leases.release(t).await.expect("release");
                    })
                    .await
                }
                Op::Renew => {
                    time(slice, &mut o, async || {
                        let t = held.take().expect("held");
                        held = Some(leases.renew(&t).await.expect("renew"));
                    })
                    .await
                }
            }
            time(slice, &mut b, async || baseline.put().await).await;
        }
        if let Some(t) = held {
            leases.release(t).await.expect("release");
        }
        let (om, bm) = (median(&mut o), median(&mut b));
        println!(
            "{:<16} ours median {:>6.2} ms (mean {:>6.2}, n={:>5})   baseline median {:>6.2} ms (mean {:>6.2}, n={:>5})   ours/baseline {:.2}",
            op.name(),
            ms(om),
            ms(mean(&o)),
            o.len(),
            ms(bm),
            ms(mean(&b)),
            b.len(),
            om.as_secs_f64() / bm.as_secs_f64()
        );
    }

    // Delete the benchmark's objects.
    let prefix = Path::parse(&prefix).expect("prefix");
    let paths = objects.list(Some(&prefix)).map_ok(|m| m.location).boxed();
    objects
        .delete_stream(paths)
        .try_collect::<Vec<_>>()
        .await
        .expect("delete the benchmark's objects");
}
