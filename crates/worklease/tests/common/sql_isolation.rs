//! The SQL stores under a database's stricter defaults: a PostgreSQL
//! database and a MariaDB server whose default transaction isolation is
//! SERIALIZABLE (cirello-io/pglock#39), as a DBA may set them (the
//! MariaDB server's `sql_mode` is also `ANSI,NO_BACKSLASH_ESCAPES`). The stores
//! pin the isolation their statements are written for, and a transient
//! failure (a serialization failure, a deadlock's victim) is never an
//! acquisition's error. A module of `tests/postgres.rs` and
//! `tests/mysql.rs`; the conformance suite runs there too.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use worklease::{AcquireOptions, Error, LeaseStore};

use crate::common_sql_store::{fresh_table, leases, SqlStore};

/// How many stores start at once, each with its own pool, as that many
/// processes would (`worklease run --wait` on 16 hosts).
const STARTS: usize = 16;

/// 16 stores start at once on a table that does not exist yet, in a
/// database whose default isolation is SERIALIZABLE; each waits for the
/// same work ID (polling every 100 ms) and holds it a moment. Every one
/// gets the lease, one at a time, with tokens that only go up; none fails
/// with a serialization failure or mistakes the table another is creating
/// for a foreign one. Then 16 fail-fast acquisitions at once: each is
/// granted or told `Held`, never a store error.
pub(crate) async fn first_uses_and_waits_under_serializable<S: SqlStore>() {
    let url = S::serializable_url().await;
    let table = fresh_table("serializable");
    let stores: Vec<Arc<S>> = (0..STARTS)
        .map(|_| Arc::new(S::unopened(&url, &table)))
        .collect();
    let inside = Arc::new(AtomicUsize::new(0));
    let runs = stores.iter().enumerate().map(|(i, store)| {
        let store: Arc<dyn LeaseStore> = store.clone();
        let inside = inside.clone();
        async move {
            let l = leases(store, &format!("waiter-{i}"), Duration::from_secs(5));
            let options = AcquireOptions::new()
                .wait_for_lease()
                .poll_interval(Duration::from_millis(100));
            let token = l
                .acquire("shared", options)
                .await
                .unwrap_or_else(|e| panic!("waiter {i}: a waiting acquisition failed: {e}"));
            assert_eq!(
                inside.fetch_add(1, Ordering::SeqCst),
                0,
                "S1: two holders at once"
            );
            tokio::task::yield_now().await;
            inside.fetch_sub(1, Ordering::SeqCst);
            let fencing = token.fencing_token();
            l.release(token).await.expect("release");
            fencing
        }
    });
    let mut tokens = futures_util::future::join_all(runs).await;
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), STARTS, "S2: every grant has its own token");

    let tries = stores.iter().enumerate().map(|(i, store)| {
        let l = leases(store.clone(), &format!("racer-{i}"), Duration::from_secs(5));
        async move { (l.acquire("race", AcquireOptions::new()).await, l) }
    });
    let results = futures_util::future::join_all(tries).await;
    let mut granted = 0;
    for (result, l) in results {
        match result {
            Ok(token) => {
                granted += 1;
                l.release(token).await.expect("release");
            }
            Err(Error::Held { .. }) => {}
            Err(e) => panic!("a fail-fast acquisition must be granted or held, got {e}"),
        }
    }
    assert_eq!(granted, 1, "S1: one of the racers is granted");
    stores[0].drop_table().await;
}
