//! The PostgreSQL store's operations per second with 1 and 16 concurrent
//! clients, each beside a baseline measured in the same process through the
//! same connection pool: a single-row `UPDATE ... WHERE id = $1 RETURNING`
//! on a plain table (a prepared statement, one round trip), the least one
//! conditional write to the server costs.
//!
//! * acquire → release: ours is two statements (one cycle on a fresh work
//!   ID), so its baseline is two such updates;
//! * renew: one statement against one update;
//! * 1 KiB checkpoint: one statement against one update writing 1 KiB.
//!
//! Ours and the baseline are measured alternately in slices, so that a
//! change of the machine's load hits both alike. Every statement commits,
//! so single-client figures follow the disk's flush latency.
//!
//! Run: `cargo bench -p worklease --features postgres --bench postgres`
//! (optionally `-- --seconds 5`) against `WORKLEASE_TEST_POSTGRES_URL`
//! (default `postgres://postgres@127.0.0.1:5432/test`). It creates and drops
//! tables of its own.

mod common;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use worklease::store::postgres::{PostgresOptions, PostgresStore, TableName};
use worklease::{AcquireOptions, Config, Leases};

/// How many alternating slices ours and the baseline are measured in, so
/// that a change of the machine's load during a run hits both alike.
const SLICES: u32 = 4;

/// Measures `ours` and `base` alternately, each for `dur` in all; returns
/// both rates in operations per second.
async fn compare<F, Fut, G, Gut>(clients: usize, dur: Duration, ours: F, base: G) -> (f64, f64)
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
    G: Fn(usize, u64) -> Gut + Send + Sync + 'static,
    Gut: Future<Output = ()> + Send,
{
    let (ours, base) = (Arc::new(ours), Arc::new(base));
    let (mut a, mut b) = (0.0, 0.0);
    for _ in 0..SLICES {
        a += rate(clients, dur / SLICES, ours.clone()).await;
        b += rate(clients, dur / SLICES, base.clone()).await;
    }
    (a / SLICES as f64, b / SLICES as f64)
}

/// Runs `op(client, i)` on `clients` concurrent tasks for `dur` after a
/// short warm-up; returns operations per second over all clients.
async fn rate<F, Fut>(clients: usize, dur: Duration, op: Arc<F>) -> f64
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let warm_up = dur / 10;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (op, done) = (op.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while start.elapsed() < warm_up {
                op(c, i).await;
                i += 1;
            }
            let mut n = 0u64;
            while start.elapsed() < warm_up + dur {
                op(c, i).await;
                i += 1;
                n += 1;
            }
            done.fetch_add(n, Ordering::Relaxed);
        }));
    }
    for t in tasks {
        t.await.expect("bench task");
    }
    done.load(Ordering::Relaxed) as f64 / dur.as_secs_f64()
}

/// Runs `sql` (statements without parameters) on a pooled connection;
/// panics with `what` when it fails.
async fn batch(store: &PostgresStore, sql: &str, what: &str) {
    store
        .pool()
        .get()
        .await
        .expect("connection")
        .batch_execute(sql)
        .await
        .expect(what);
}

fn row(op: &str, clients: usize, ours: f64, base: f64) {
    println!(
        "{op:<18} {clients:>7} {ours:>12.0} {base:>15.0} {:>14.2}",
        ours / base
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let url = std::env::var("WORKLEASE_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".to_string());
    let dur = common::seconds();
    let table = format!("wl_bench_{:08x}", rand::random::<u32>());
    let max_clients = 16;
    let config: worklease::store::postgres::tokio_postgres::Config =
        url.parse().expect("a PostgreSQL URL");
    let store = Arc::new(
        PostgresStore::new(
            config,
            PostgresOptions::new()
                .table(TableName::new(&table).expect("valid table"))
                .max_connections(max_clients),
        )
        .expect("store"),
    );
    store.initialize().await.expect("the server answers");
    let baseline = format!("{table}_baseline");
    batch(
        &store,
        &format!(
            "CREATE TABLE {baseline} (id int PRIMARY KEY, n bigint NOT NULL, data bytea); \
             INSERT INTO {baseline} SELECT g, 0, NULL FROM generate_series(0, {max_clients}) AS g"
        ),
        "baseline table",
    )
    .await;
    let bump = Arc::new(format!(
        "UPDATE {baseline} SET n = n + 1 WHERE id = $1 RETURNING n"
    ));
    let write = Arc::new(format!(
        "UPDATE {baseline} SET n = n + 1, data = $2 WHERE id = $1 RETURNING n"
    ));
    let kib = Bytes::from(vec![0x5a; 1024]);
    let leases =
        Leases::new(store.clone(), Config::new("bench", Duration::from_secs(60))).expect("config");

    println!(
        "PostgreSQL store, {:.1} s per measurement, {} ({} cores)",
        dur.as_secs_f64(),
        worklease::store::url::redact(&url),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "{:<18} {:>7} {:>12} {:>15} {:>14}",
        "operation", "clients", "ours ops/s", "baseline ops/s", "ours/baseline"
    );
    for clients in [1, max_clients] {
        let updates = |sql: Arc<String>, n: usize, data: Option<Bytes>| {
            let store = store.clone();
            move |c: usize, _i: u64| {
                let (store, sql, data) = (store.clone(), sql.clone(), data.clone());
                async move {
                    let client = store.pool().get().await.expect("connection");
                    let stmt = client.prepare_cached(&sql).await.expect("prepare");
                    let id = c as i32;
                    for _ in 0..n {
                        match &data {
                            Some(d) => client.query_one(&stmt, &[&id, &d.as_ref()]).await,
                            None => client.query_one(&stmt, &[&id]).await,
                        }
                        .expect("update");
                    }
                }
            }
        };

        let l = leases.clone();
        let round = Arc::new(AtomicU64::new(0));
        let (ours, base) = compare(
            clients,
            dur,
            move |c, i| {
                let l = l.clone();
                // Slices restart `i`: a fresh work ID per cycle all the same.
                let r = round.fetch_add(1, Ordering::Relaxed);
                async move {
                    let t = l
                        .acquire(&format!("cycle-{c}-{i}-{r}"), AcquireOptions::new())
                        .await
                        .expect("acquire");
                    l.release(t).await.expect("release");
                }
            },
            updates(bump.clone(), 2, None),
        )
        .await;
        row("acquire→release", clients, ours, base);

        let mut tokens = Vec::new();
        for c in 0..clients {
            tokens.push(
                leases
                    .acquire(&format!("renew-{c}"), AcquireOptions::new())
                    .await
                    .expect("acquire"),
            );
        }
        let tokens = Arc::new(tokens);
        let (l, ts) = (leases.clone(), tokens.clone());
        let (ours, base) = compare(
            clients,
            dur,
            move |c, _| {
                let (l, ts) = (l.clone(), ts.clone());
                async move {
                    l.renew(&ts[c]).await.expect("renew");
                }
            },
            updates(bump.clone(), 1, None),
        )
        .await;
        row("renew", clients, ours, base);

        let (l, ts, data) = (leases.clone(), tokens.clone(), kib.clone());
        let (ours, base) = compare(
            clients,
            dur,
            move |c, _| {
                let (l, ts, data) = (l.clone(), ts.clone(), data.clone());
                async move {
                    l.checkpoint(&ts[c], data).await.expect("checkpoint");
                }
            },
            updates(write.clone(), 1, Some(kib.clone())),
        )
        .await;
        row("checkpoint 1 KiB", clients, ours, base);
        for t in tokens.iter() {
            leases.release(t.clone()).await.expect("release");
        }
    }

    batch(
        &store,
        &format!(
            "DROP TABLE {baseline}; DROP TABLE {}; DROP SEQUENCE {}",
            store.table().quoted(),
            store.table().sequence_quoted()
        ),
        "drop the bench tables",
    )
    .await;
}
