//! The PostgreSQL batch statements: one statement per batch (counted by the
//! server), measured against single renewals, and batch acquisitions racing
//! each other and single ones over the same rows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use worklease::store::postgres::{PostgresStore, MAX_BATCH};
use worklease::store::LeaseRef;
use worklease::{Error, HolderId, LeaseStore, WorkId};

use super::{drop_table, fresh_table, Cluster, SqlStore};

/// The statements the server ran since the last reset, by
/// `pg_stat_statements` (the statistics' own statements left out).
async fn statements_run(store: &PostgresStore) -> i64 {
    store
        .pool()
        .get()
        .await
        .expect("connection")
        .query_one(
            "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_statements \
             WHERE query NOT LIKE '%pg_stat_statements%'",
            &[],
        )
        .await
        .expect("read pg_stat_statements")
        .get(0)
}

async fn reset_statements(store: &PostgresStore) {
    store
        .pool()
        .get()
        .await
        .expect("connection")
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await
        .expect("reset pg_stat_statements");
}

/// A batch of [`MAX_BATCH`] leases is acquired, renewed and released in one
/// statement each, by the server's own count (`pg_stat_statements`, on a
/// cluster of this test's own, so that nothing else runs there); the
/// renewal is timed against as many single renewals, one after another
/// (one statement, and one round trip, each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_one_statement() {
    let cluster =
        Cluster::start_with(|_| "-c shared_preload_libraries=pg_stat_statements".into()).await;
    let table = fresh_table("stmts");
    let store = PostgresStore::open(&cluster.url(), &table).await;
    store
        .pool()
        .get()
        .await
        .expect("connection")
        .batch_execute("CREATE EXTENSION pg_stat_statements")
        .await
        .expect("the extension is available");
    let holder = HolderId::new("stmts-a").expect("valid");
    let ttl = Duration::from_secs(60);
    let ids: Vec<WorkId> = (0..MAX_BATCH)
        .map(|i| WorkId::new(format!("stmts/{i:05}")).expect("valid"))
        .collect();

    reset_statements(&store).await;
    let grants = store
        .acquire_many(&ids, &holder, ttl, ids.len())
        .await
        .expect("acquire_many");
    assert_eq!(statements_run(&store).await, 1, "acquire_many");
    let tokens: Vec<u64> = grants
        .into_iter()
        .map(|g| g.expect("every work ID is free").fencing_token)
        .collect();
    let leases: Vec<LeaseRef<'_>> = ids
        .iter()
        .zip(&tokens)
        .map(|(work_id, &fencing_token)| LeaseRef {
            work_id,
            holder_id: &holder,
            fencing_token,
        })
        .collect();

    reset_statements(&store).await;
    let started = Instant::now();
    let renewed = store.renew_many(&leases, ttl).await.expect("renew_many");
    let batch = started.elapsed();
    assert_eq!(statements_run(&store).await, 1, "renew_many");
    assert!(renewed.iter().all(Result::is_ok), "{renewed:?}");

    reset_statements(&store).await;
    let started = Instant::now();
    for lease in &leases {
        store.renew(*lease, ttl).await.expect("renew");
    }
    let singles = started.elapsed();
    assert_eq!(
        statements_run(&store).await,
        i64::try_from(MAX_BATCH).expect("small"),
        "single renewals"
    );
    println!(
        "renewing {MAX_BATCH} leases: renew_many {batch:?} (1 statement), \
         single renewals one after another {singles:?} ({MAX_BATCH} statements)"
    );
    assert!(
        batch * 10 < singles,
        "a batch renewal ({batch:?}) must be far faster than single ones ({singles:?})"
    );

    reset_statements(&store).await;
    let released = store.release_many(&leases).await.expect("release_many");
    assert_eq!(statements_run(&store).await, 1, "release_many");
    assert!(released.iter().all(Result::is_ok), "{released:?}");
}

/// One grant as its holder saw it.
struct Belief {
    holder: String,
    token: u64,
    /// When the grant's reply arrived.
    from: Instant,
    /// Until when the holder believed it held the lease: the send time of
    /// its last successful acquisition or renewal plus the TTL, or the send
    /// time of its release, whichever came first.
    until: Instant,
}

/// Batch acquisitions over overlapping lists in different orders, with
/// single acquisitions, batch renewals and releases, over work IDs that
/// start unknown (so that first insertions race too): no call fails (a
/// deadlock would surface as an error after `deadlock_timeout`), and no
/// work ID is ever believed held by two holders at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_batch_acquisitions_never_deadlock_nor_grant_twice() {
    let table = fresh_table("batchrace");
    let stores: Vec<Arc<PostgresStore>> = futures_util::future::join_all(
        (0..3).map(|_| async { Arc::new(PostgresStore::open_shared(&table).await) }),
    )
    .await;
    let ttl = Duration::from_millis(600);
    let (generations, per_generation, tasks) = (5, 12, 8u64);
    let ids: Vec<Vec<WorkId>> = (0..generations)
        .map(|g| {
            (0..per_generation)
                .map(|i| WorkId::new(format!("race/{g}/{i:02}")).expect("valid"))
                .collect()
        })
        .collect();
    let beliefs: Arc<Mutex<HashMap<WorkId, Vec<Belief>>>> = Arc::default();
    let start = Arc::new(tokio::sync::Barrier::new(tasks as usize));
    let mut running = Vec::new();
    for n in 0..tasks {
        let store = stores[n as usize % stores.len()].clone();
        let (ids, beliefs, start) = (ids.clone(), beliefs.clone(), start.clone());
        running.push(tokio::spawn(async move {
            let holder = HolderId::new(format!("race-{n}")).expect("valid");
            let mut rng = rand::rngs::StdRng::seed_from_u64(n);
            let mut grants = 0;
            for generation in &ids {
                // Every task starts a generation at once, on rows nobody
                // has inserted yet.
                start.wait().await;
                for _ in 0..6 {
                    let sent = Instant::now();
                    let got: Vec<(WorkId, u64)> = if n % 4 == 3 {
                        let id = generation.choose(&mut rng).expect("ids");
                        match store.acquire(id, &holder, ttl).await {
                            Ok(g) => vec![(id.clone(), g.fencing_token)],
                            Err(Error::Held { .. }) => Vec::new(),
                            Err(e) => panic!("acquire: {e}"),
                        }
                    } else {
                        let mut list: Vec<WorkId> = generation
                            .choose_multiple(&mut rng, per_generation * 2 / 3)
                            .cloned()
                            .collect();
                        if n % 2 == 1 {
                            list.sort_by(|a, b| b.cmp(a));
                        }
                        let max = rng.gen_range(1..=4);
                        let out = store
                            .acquire_many(&list, &holder, ttl, max)
                            .await
                            .expect("acquire_many never fails, nor deadlocks");
                        let granted = out.iter().filter(|r| r.is_ok()).count();
                        assert!(granted <= max, "{granted} grants for max {max}");
                        assert!(
                            out.len() == list.len() || granted == max,
                            "stopped after {} of {} with {granted} of {max} granted",
                            out.len(),
                            list.len()
                        );
                        list.into_iter()
                            .zip(out)
                            .filter_map(|(id, r)| match r {
                                Ok(g) => Some((id, g.fencing_token)),
                                Err(Error::Held { .. }) => None,
                                Err(e) => panic!("acquire_many of {id}: {e}"),
                            })
                            .collect()
                    };
                    let from = Instant::now();
                    grants += got.len();
                    let mut until: Vec<Instant> = vec![sent + ttl; got.len()];
                    if !got.is_empty() {
                        tokio::time::sleep(ttl.mul_f64(rng.gen_range(0.0..0.3))).await;
                        let leases: Vec<LeaseRef<'_>> = got
                            .iter()
                            .map(|(work_id, t)| LeaseRef {
                                work_id,
                                holder_id: &holder,
                                fencing_token: *t,
                            })
                            .collect();
                        let sent = Instant::now();
                        let renewed = store.renew_many(&leases, ttl).await.expect("renew_many");
                        for (u, r) in until.iter_mut().zip(&renewed) {
                            match r {
                                Ok(_) => *u = sent + ttl,
                                Err(e) if e.is_lease_lost() => {}
                                Err(e) => panic!("renew_many: {e}"),
                            }
                        }
                        tokio::time::sleep(ttl.mul_f64(rng.gen_range(0.0..0.3))).await;
                        if rng.gen_bool(0.8) {
                            let sent = Instant::now();
                            for u in &mut until {
                                *u = (*u).min(sent);
                            }
                            let released = store.release_many(&leases).await.expect("release_many");
                            for r in released {
                                match r {
                                    Ok(()) | Err(Error::Expired { .. } | Error::Fenced { .. }) => {}
                                    Err(e) => panic!("release_many: {e}"),
                                }
                            }
                        }
                        // else: abandoned, as by a crash.
                    }
                    let mut beliefs = beliefs.lock().expect("beliefs");
                    for ((id, token), until) in got.into_iter().zip(until) {
                        beliefs.entry(id).or_default().push(Belief {
                            holder: holder.to_string(),
                            token,
                            from,
                            until,
                        });
                    }
                }
            }
            grants
        }));
    }
    // The first task to fail fails the test at once (the others would wait
    // for it at the next generation's start).
    let grants: usize = futures_util::future::try_join_all(running)
        .await
        .expect("a racing task panicked (see above)")
        .into_iter()
        .sum();
    let beliefs = std::mem::take(&mut *beliefs.lock().expect("beliefs"));
    for (id, list) in &beliefs {
        let mut list: Vec<&Belief> = list.iter().collect();
        list.sort_by_key(|b| b.token);
        for pair in list.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert!(a.token < b.token, "{id}: token {} granted twice", a.token);
            assert!(
                a.until <= b.from,
                "S1 on {id}: {} (token {}) got it {:?} before {} (token {}) stopped believing it held it",
                b.holder,
                b.token,
                a.until - b.from,
                a.holder,
                a.token
            );
        }
    }
    assert!(
        grants >= generations * per_generation,
        "the race made too little progress: {grants} grants"
    );
    drop_table(&stores[0]).await;
}
