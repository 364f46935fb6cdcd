//! Throughput of the Redis store against a real server, each figure beside
//! a baseline measured in the same process on the same connection: one
//! `EVALSHA` of a minimal compare-and-set script (GET, compare, SET), the
//! least a script-based lease operation costs.
//!
//! * acquire→release: one cycle is two scripts (acquire, then release) on
//!   the client's own work ID, through [`Leases`];
//! * renew: one script, on a held lease;
//! * checkpoint: one script carrying 1 KiB.
//!
//! Each with 1 and 16 concurrent clients; a client is a task with a store
//! (and so a connection) of its own, as a process of a fleet would be.
//! Figures are total ops/s over all clients.
//!
//! Run: `cargo bench -p worklease --features redis --bench redis` against
//! `WORKLEASE_TEST_REDIS_URL` (default `redis://127.0.0.1:6379/0`);
//! optionally `-- --seconds 5` per measurement (default 2). Its keys live
//! under a random prefix and are deleted at the end.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use redis::aio::ConnectionManager;
use redis::Script;
use worklease::store::redis::RedisStore;
use worklease::{AcquireOptions, Config, Leases, Token};

const CAS: &str = "local v = redis.call('GET', KEYS[1])
if (v == false and ARGV[1] == '0') or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0";

fn server_url() -> String {
    std::env::var("WORKLEASE_TEST_REDIS_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379/0".to_string())
}

/// One client: a store of its own, a lease handle, and the store's
/// connection for the baseline.
struct Client {
    n: usize,
    leases: Leases,
    conn: ConnectionManager,
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
const WARM_UP: u64 = 100;
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

/// The baseline: EVALSHA of the compare-and-set script, on the client's
/// store connection; returns ops/s.
async fn baseline(c: &Client, run: &str, dur: Duration) -> f64 {
    let script = Script::new(CAS);
    // A fresh key for each measurement.
    let key = format!(
        "{}baseline:{run}:{}:{:016x}",
        c.prefix,
        c.n,
        rand::random::<u64>()
    );
    let mut conn = c.conn.clone();
    let mut value = 0u64;
    let mut meter = Meter::new(dur);
    while meter.next() {
        let swapped: i64 = script
            .key(&key)
            .arg(value)
            .arg(value + 1)
            .invoke_async(&mut conn)
            .await
            .expect("baseline script");
        assert_eq!(swapped, 1, "the baseline's compare-and-set must succeed");
        value += 1;
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
    let base = server_url();
    let prefix = format!("worklease-bench:{:016x}:", rand::random::<u64>());
    let url = format!(
        "{base}{}prefix={prefix}",
        if base.contains('?') { '&' } else { '?' }
    );
    println!(
        "worklease Redis store vs 1 EVALSHA compare-and-set on the same connection ({:?} per figure)",
        dur
    );
    for n_clients in [1usize, 16] {
        let mut clients = Vec::new();
        for n in 0..n_clients {
            let store = Arc::new(
                RedisStore::connect(&url)
                    .await
                    .expect("the Redis server answers (WORKLEASE_TEST_REDIS_URL)"),
            );
            let conn = store.connection().await.expect("connection");
            let leases = Leases::new(
                store,
                Config::new(format!("bench-{n}"), Duration::from_secs(30)),
            )
            .expect("config");
            clients.push(Arc::new(Client {
                n,
                leases,
                conn,
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
                "{:<17} {n_clients:>2} client{}  ours {o:>9.0} ops/s   baseline {b:>9.0} ops/s   ours/baseline {:.2}",
                op.name(),
                if n_clients == 1 { " " } else { "s" },
                o / b
            );
        }
    }
    // Delete the benchmark's keys.
    let mut conn = redis::Client::open(base.as_str())
        .and_then(|c| c.get_connection())
        .expect("connect");
    let keys = redis::Commands::scan_match::<_, Vec<u8>>(&mut conn, format!("{prefix}*"))
        .expect("SCAN")
        .collect::<redis::RedisResult<Vec<Vec<u8>>>>()
        .expect("SCAN");
    for chunk in keys.chunks(500) {
        redis::cmd("UNLINK")
            .arg(chunk)
            .exec(&mut conn)
            .expect("UNLINK");
    }
}
