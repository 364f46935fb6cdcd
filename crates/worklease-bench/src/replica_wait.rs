//! The cost of the Redis store's replica wait (`wait_replicas=1`): renew
//! and checkpoint (32 bytes) of held leases on a primary that has a
//! replica, with and without the wait, measured alternately in slices in
//! one run, reported as a ratio. The primary's URL comes from
//! `--url` or `WORKLEASE_BENCH_REDIS_REPLICA_URL`; without a connected
//! replica there, the figure is skipped with the reason.
//!
//! ```sh
//! cargo run --release -p worklease-bench -- replica-wait --url redis://127.0.0.1:PORT/0
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use worklease::store::redis::RedisStore;
use worklease::store::url::redact;
use worklease::{AcquireOptions, Config, Leases, Token};

use crate::measure::{compare, Client, Contestant, Timing};
use crate::results::{Latency, Variant};
use crate::Result;

/// The environment variable naming the primary (with a replica).
pub const URL_VAR: &str = "WORKLEASE_BENCH_REDIS_REPLICA_URL";

/// How long the replica wait may take before a write is refused.
const WAIT_TIMEOUT_MS: u64 = 1000;

/// Renewals and checkpoints, in turn, of one held lease.
struct Held {
    leases: Leases,
    token: Token,
    checkpoint: bool,
}

#[async_trait]
impl Client for Held {
    async fn op(&mut self) -> Result<()> {
        self.checkpoint = !self.checkpoint;
        self.token = if self.checkpoint {
            let data = Bytes::from_static(b"replica-wait-bench-checkpoint-32");
            self.leases.checkpoint(&self.token, data).await?
        } else {
            self.leases.renew(&self.token).await?
        };
        Ok(())
    }

    async fn finish(self: Box<Self>) -> Result<()> {
        self.leases.release(self.token).await?;
        Ok(())
    }
}

/// `clients` holders on `url`, each with a lease of its own under
/// `prefix`.
async fn holders(url: &str, clients: usize, prefix: &str) -> Result<Vec<Box<dyn Client>>> {
    let store = Arc::new(RedisStore::connect(url).await?);
    let mut v: Vec<Box<dyn Client>> = Vec::new();
    for n in 0..clients {
        let leases = Leases::new(
            store.clone(),
            Config::new(format!("bench-{n}"), Duration::from_secs(30)),
        )?;
        let token = leases
            .acquire(&format!("{prefix}{clients}-{n}"), AcquireOptions::new())
            .await?;
        v.push(Box::new(Held {
            leases,
            token,
            checkpoint: false,
        }));
    }
    Ok(v)
}

/// The replicas connected to the primary at `url`, from `INFO
/// replication`.
async fn replicas(url: &str) -> Result<u64> {
    let client = redis::Client::open(url)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", redact(url)))?;
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut conn)
        .await?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0))
}

fn shown(l: &Latency) -> String {
    format!(
        "p50 {:.3} ms, p99 {:.3} ms",
        l.p50_us as f64 / 1e3,
        l.p99_us as f64 / 1e3
    )
}

/// Measures and prints the figure at each of `clients`.
pub async fn run(url: &str, clients: &[usize], timing: Timing) -> Result<()> {
    let n = replicas(url).await?;
    if n == 0 {
        println!(
            "replica wait: skipped: no replica is connected to {} (start one with \
             `redis-server --port P --replicaof HOST PORT`)",
            redact(url)
        );
        return Ok(());
    }
    let run = format!("wl-bench-wait:{:08x}:", rand::random::<u32>());
    let sep = if url.contains('?') { '&' } else { '?' };
    let plain = format!("{url}{sep}prefix={run}");
    let waiting = format!("{plain}&wait_replicas=1&wait_timeout_ms={WAIT_TIMEOUT_MS}");
    println!(
        "replica wait on {} ({n} replica(s) connected): renew and checkpoint (32 bytes) in turn, \
         {} slices of {:?} each",
        redact(url),
        timing.slices,
        timing.slice
    );
    for &c in clients {
        let mut contestants = vec![
            Contestant::new(
                Variant::Baseline,
                "plain",
                holders(&plain, c, "plain-").await?,
            ),
            Contestant::new(
                Variant::Ours,
                "wait_replicas=1",
                holders(&waiting, c, "wait-").await?,
            ),
        ];
        compare(&mut contestants, timing).await?;
        let [off, on] = &contestants[..] else {
            return Err("two variants".into());
        };
        let (off_row, on_row) = (
            off.tally.row("redis", c, None, off.variant, &off.what),
            on.tally.row("redis", c, None, on.variant, &on.what),
        );
        println!(
            "| {c} client(s) | plain {:.0} writes/s, {} | wait_replicas=1 {:.0} writes/s, {} | \
             throughput {:.2} x, p50 {:.2} x | errors {} / {} |",
            off_row.ops_per_sec,
            shown(&off_row.latency),
            on_row.ops_per_sec,
            shown(&on_row.latency),
            on_row.ops_per_sec / off_row.ops_per_sec.max(f64::MIN_POSITIVE),
            on_row.latency.p50_us as f64 / (off_row.latency.p50_us.max(1)) as f64,
            off_row.errors,
            on_row.errors,
        );
    }
    Ok(())
}
