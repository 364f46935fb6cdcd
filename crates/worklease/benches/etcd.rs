//! Throughput of the etcd store against a real server, each figure beside
//! a baseline measured in the same process on the same client: one minimal
//! etcd transaction (compare a key's mod revision, put the key), the least
//! a transactional lease operation costs.
//!
//! * acquire→release: one cycle is an acquisition (a read, a lease grant,
//!   a transaction) and a release (a transaction; the etcd lease is
//!   revoked in the background), through [`Leases`];
//! * renew: a lease keep-alive and a transaction, on a held lease;
//! * checkpoint: the same, the transaction carrying 1 KiB.
//!
//! Each with 1 and 16 concurrent clients; a client is a task with a store
//! (and so a client and its connection) of its own, as a process of a
//! fleet would be. Figures are total ops/s over all clients.
//!
//! Run: `cargo bench -p worklease --features etcd --bench etcd` against
//! `WORKLEASE_TEST_ETCD_URL` (default `etcd://127.0.0.1:2379`); optionally
//! `-- --seconds 5` per measurement (default 2). Its keys live under a
//! random prefix and are deleted at the end.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp};
use worklease::store::etcd::{EtcdConfig, EtcdStore};
use worklease::{AcquireOptions, Config, Leases, Token};

fn server_url() -> String {
    std::env::var("WORKLEASE_TEST_ETCD_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "etcd://127.0.0.1:2379".to_string())
}

/// One client: a store of its own, a lease handle, and the store's etcd
/// client for the baseline.
struct Client {
    n: usize,
    leases: Leases,
    etcd: etcd_client::Client,
    prefix: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Cycle,
    Renew,
    Checkpoint,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Cycle => "acquire→release",
            Op::Renew => "renew",
            Op::Checkpoint => "checkpoint 1 KiB",
        }
    }
}

/// Operations before the clock starts, in each slice.
const WARM_UP: u64 = 20;
/// Each figure is measured in this many slices, alternating with its
/// baseline.
const SLICES: u32 = 4;

/// Counts the operations of one measurement: [`WARM_UP`] of them untimed,
/// then as many as `dur` allows.
struct Meter {
    dur: Duration,
    n: u64,
    start: Instant,
}

impl Meter {
    fn new(dur: Duration) -> Self {
        Self {
            dur,
            n: 0,
            start: Instant::now(),
        }
    }

    /// Whether to run one more operation (then counted).
    fn next(&mut self) -> bool {
        if self.n == WARM_UP {
            self.start = Instant::now();
        }
        if self.n > WARM_UP && self.start.elapsed() >= self.dur {
            return false;
        }
        self.n += 1;
        true
    }

    /// The timed operations per second.
    fn rate(&self) -> f64 {
        (self.n - WARM_UP) as f64 / self.start.elapsed().as_secs_f64()
    }
}

/// Runs `op` on the client for `dur` after a warm-up; returns ops/s.
async fn ours(c: &Client, op: Op, dur: Duration) -> f64 {
    let work = format!("bench/{}", c.n);
    let ckpt = Bytes::from(vec![b'x'; 1024]);
    let mut held: Option<Token> = None;
    if op != Op::Cycle {
        held = Some(
            c.leases
                .acquire(&work, AcquireOptions::new())
                .await
                .expect("acquire"),
        );
    }
    let mut meter = Meter::new(dur);
    while meter.next() {
        match op {
            Op::Cycle => {
                let t = c
                    .leases
                    .acquire(&work, AcquireOptions::new())
                    .await
                    .expect("acquire");
                c.leases.release(t).await.expect("release");
            }
            Op::Renew => {
                let t = held.take().expect("held");
                held = Some(c.leases.renew(&t).await.expect("renew"));
            }
            Op::Checkpoint => {
                let t = held.take().expect("held");
                held = Some(
                    c.leases
                        .checkpoint(&t, ckpt.clone())
                        .await
                        .expect("checkpoint"),
                );
            }
        }
    }
    let rate = meter.rate();
    if let Some(t) = held {
        c.leases.release(t).await.expect("release");
    }
    rate
}

/// The baseline: one transaction comparing the key's mod revision with
/// the one the last put gave it and putting a new value, on the client's
/// etcd client; returns ops/s.
async fn baseline(c: &Client, run: &str, dur: Duration) -> f64 {
    // A fresh key for each measurement: mod revision 0 means absent.
    let key = format!(
        "{}baseline/{run}/{}/{:016x}",
        c.prefix,
        c.n,
        rand::random::<u64>()
    );
    let mut etcd = c.etcd.clone();
    let mut revision = 0i64;
    let mut meter = Meter::new(dur);
    while meter.next() {
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::put(key.as_str(), revision.to_string(), None)]);
        let resp = etcd.txn(txn).await.expect("baseline transaction");
        assert!(
            resp.succeeded(),
            "the baseline's compare-and-put must succeed"
        );
        revision = resp.header().expect("header").revision();
    }
    meter.rate()
}

/// Runs `f` on every client at once; returns the sum of their ops/s.
async fn concurrently<F, Fut>(clients: &[Arc<Client>], f: F) -> f64
where
    F: Fn(Arc<Client>) -> Fut,
    Fut: std::future::Future<Output = f64> + Send + 'static,
{
    let tasks: Vec<_> = clients.iter().map(|c| tokio::spawn(f(c.clone()))).collect();
    let mut total = 0.0;
    for t in tasks {
        total += t.await.expect("client task");
    }
    total
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dur = common::seconds();
    let prefix = format!("worklease-bench/{:016x}/", rand::random::<u64>());
    let config = EtcdConfig::from_url(&server_url())
        .expect("WORKLEASE_TEST_ETCD_URL is an etcd URL")
        .prefix(prefix.clone())
        .expect("prefix");
    println!(
        "worklease etcd store vs 1 compare-and-put transaction on the same client ({:?} per figure)",
        dur
    );
    let mut cleanup = None;
    for n_clients in [1usize, 16] {
        let mut clients = Vec::new();
        for n in 0..n_clients {
            let store = Arc::new(EtcdStore::new(config.clone()));
            store
                .ready()
                .await
                .expect("the etcd server answers (WORKLEASE_TEST_ETCD_URL)");
            let etcd = store.client().await.expect("client");
            cleanup.get_or_insert_with(|| etcd.clone());
            // A TTL the benchmark never outlives.
            let leases = Leases::new(
                store,
                Config::new(format!("bench-{n}"), Duration::from_secs(30)),
            )
            .expect("config");
            clients.push(Arc::new(Client {
                n,
                leases,
                etcd,
                prefix: prefix.clone(),
            }));
        }
        for op in [Op::Cycle, Op::Renew, Op::Checkpoint] {
            // Ours and the baseline alternate in slices, so that a change
            // of the machine's load affects both alike.
            let slice = dur / SLICES;
            let (mut o, mut b) = (0.0, 0.0);
            for _ in 0..SLICES {
                o += concurrently(&clients, |c| async move { ours(&c, op, slice).await }).await;
                b += concurrently(
                    &clients,
                    |c| async move { baseline(&c, op.name(), slice).await },
                )
                .await;
            }
            let (o, b) = (o / f64::from(SLICES), b / f64::from(SLICES));
            println!(
                "{:<17} {n_clients:>2} client{}  ours {o:>8.0} ops/s   baseline {b:>8.0} ops/s   ours/baseline {:.2}",
                op.name(),
                if n_clients == 1 { " " } else { "s" },
                o / b
            );
        }
    }
    // Delete the benchmark's keys.
    if let Some(mut etcd) = cleanup {
        etcd.delete(prefix.as_str(), Some(DeleteOptions::new().with_prefix()))
            .await
            .expect("delete the benchmark's keys");
    }
}
