//! acquire → release cycles on distinct work IDs, one thread of work, on
//! each store without a server, each against its own baseline measured in
//! the same process:
//!
//! * memory: a `Mutex<HashMap>` insert then remove (the least an in-memory
//!   lease table must do);
//! * sqlite: the same file settings (WAL, `synchronous = FULL`), two
//!   single-statement `BEGIN IMMEDIATE` transactions (an upsert, then an
//!   update), called directly: the least a durable acquire + release costs.
//!
//! Run: `cargo bench -p worklease --bench cycle` (optionally
//! `-- --seconds 5`). It prints ops/s of ours and of the baseline, and the
//! ratio ours / baseline.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use worklease::store::memory::MemoryStore;
use worklease::store::sqlite::SqliteStore;
use worklease::{AcquireOptions, Config, LeaseStore, Leases};

/// Runs `op(i)` for `dur` after a short warm-up; returns ops/s.
async fn rate<F, Fut>(dur: Duration, mut op: F) -> f64
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for i in 0..200 {
        op(u64::MAX - i).await;
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < dur {
        op(n).await;
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

async fn ours(store: Arc<dyn LeaseStore>, dur: Duration) -> f64 {
    let leases = Leases::new(store, Config::new("bench", Duration::from_secs(30))).expect("config");
    rate(dur, |i| {
        let leases = leases.clone();
        async move {
            let t = leases
                .acquire(&format!("work-{i}"), AcquireOptions::new())
                .await
                .expect("acquire");
            leases.release(t).await.expect("release");
        }
    })
    .await
}

fn report(store: &str, ours: f64, base: f64, baseline: &str) {
    println!(
        "{store:<7} cycle  ours {ours:>10.0} ops/s   baseline ({baseline}) {base:>10.0} ops/s   ours/baseline {:.2}",
        ours / base
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let dur = common::seconds();

    let table: Mutex<HashMap<String, u64>> = Mutex::default();
    let base = rate(dur, |i| {
        let key = format!("work-{i}");
        let mut t = table.lock().expect("lock");
        t.insert(key.clone(), i);
        t.remove(&key);
        std::future::ready(())
    })
    .await;
    let o = ours(Arc::new(MemoryStore::new()), dur).await;
    report("memory", o, base, "Mutex<HashMap> insert+remove");

    let dir = tempfile::tempdir().expect("tempdir");
    let raw = rusqlite::Connection::open(dir.path().join("raw.db")).expect("open");
    raw.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
        .expect("wal");
    raw.execute_batch(
        "PRAGMA synchronous = FULL;
         CREATE TABLE leases (work_id TEXT PRIMARY KEY, holder TEXT, token INTEGER, expires INTEGER, phase TEXT);",
    )
    .expect("schema");
    let base = rate(dur, |i| {
        let key = format!("work-{i}");
        raw.execute_batch("BEGIN IMMEDIATE").expect("begin");
        raw.execute(
            "INSERT OR REPLACE INTO leases VALUES (?1, 'bench', ?2, 0, 'held')",
            rusqlite::params![key, i as i64],
        )
        .expect("upsert");
        raw.execute_batch("COMMIT").expect("commit");
        raw.execute_batch("BEGIN IMMEDIATE").expect("begin");
        raw.execute(
            "UPDATE leases SET phase = 'released' WHERE work_id = ?1",
            [key],
        )
        .expect("update");
        raw.execute_batch("COMMIT").expect("commit");
        std::future::ready(())
    })
    .await;
    let store = SqliteStore::open(dir.path().join("leases.db")).expect("open");
    let o = ours(Arc::new(store), dur).await;
    report("sqlite", o, base, "2 direct single-statement transactions");
}
