//! The MySQL / MariaDB store against a real server over TCP on loopback.
//!
//! The shared server comes from `WORKLEASE_TEST_MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306/test`; `.ci/services/mysql.sh` makes sure
//! one runs). Every test run uses its own table names. Tests that stop or
//! restart a server start their own throwaway `mariadbd` (a datadir made by
//! `mariadb-install-db`) on a free loopback port, and never touch the
//! shared one; so does the TLS test (feature `mysql-tls`), whose server
//! serves a certificate of a throwaway CA made by rcgen.
#![cfg(feature = "mysql")]

use std::sync::Arc;
use std::time::Duration;

use worklease::conformance::Suite;
use worklease::store::mysql::mysql_async::prelude::Queryable;
use worklease::store::mysql::{FencedTransactionError, MysqlStore};
use worklease::{AcquireOptions, Config, Error, LeaseEnd, LeaseStore, Leases, WorkId};

/// The shared server's URL.
fn server_url() -> String {
    std::env::var("WORKLEASE_TEST_MYSQL_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "mysql://root@127.0.0.1:3306/test".to_string())
}

/// `url` with extra query parameters.
fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// A fresh table name for this test run (or for one test).
fn fresh_table(what: &str) -> String {
    format!("wl_test_{what}_{:08x}", rand::random::<u32>())
}

async fn open(url: &str, table: &str) -> MysqlStore {
    let store =
        MysqlStore::from_url(&with_params(url, &format!("table={table}"))).expect("valid URL");
    store.initialize().await.expect("the server answers");
    store
}

async fn open_shared(table: &str) -> MysqlStore {
    open(&server_url(), table).await
}

/// Runs `sql` on one of `store`'s connections.
async fn exec(store: &MysqlStore, sql: &str) {
    let mut conn = store.pool().get_conn().await.expect("connection");
    conn.query_drop(sql).await.expect(sql);
}

/// Drops the store's table, fencing table and procedures.
async fn drop_table(store: &MysqlStore) {
    let t = store.table().as_str().to_string();
    exec(store, &format!("DROP TABLE IF EXISTS `{t}`, `{t}_fencing`")).await;
    for name in store.table().procedure_names() {
        exec(store, &format!("DROP PROCEDURE IF EXISTS `{name}`")).await;
    }
}

fn leases(store: Arc<dyn LeaseStore>, holder: &str, ttl: Duration) -> Leases {
    Leases::new(store, Config::new(holder, ttl)).expect("config")
}

// Every check on a table of its own: some checks count every lease of the
// store (`inspect(&[])`), which other checks running at the same time
// would change.
worklease::conformance_tests!(mysql, paused = false, async {
    Suite::new(Arc::new(open_shared(&fresh_table("check")).await))
});

#[path = "common/net.rs"]
mod common_net;
#[path = "common/privilege.rs"]
mod common_privilege;
#[cfg(feature = "mysql-tls")]
#[path = "common/tls.rs"]
mod common_tls;
#[path = "mysql/outages.rs"]
mod outages;
#[path = "mysql/privilege.rs"]
mod privilege;
#[path = "mysql/server.rs"]
mod server;
#[cfg(feature = "mysql-tls")]
#[path = "mysql/tls.rs"]
mod tls;

/// The GET_LOCK failure of JasperFx/wolverine#4284: a holder that acquires
/// its own lease again and again, then releases once, leaves it free (a
/// live lease is `Held` for its own holder too, ADR 0002: nothing stacks).
#[tokio::test]
async fn stacked_reacquisition_then_one_release_leaves_the_lease_free() {
    let table = fresh_table("stack");
    let store = Arc::new(open_shared(&table).await);
    let ttl = Duration::from_secs(30);
    let a = leases(store.clone(), "stack-a", ttl);
    let b = leases(store.clone(), "stack-b", ttl);
    let t = a
        .acquire("leader", AcquireOptions::new())
        .await
        .expect("acquire");
    for _ in 0..5 {
        match a.acquire("leader", AcquireOptions::new()).await {
            Err(Error::Held { holder_id, .. }) => assert_eq!(holder_id, "stack-a"),
            other => panic!("a live lease is Held for its own holder too, got {other:?}"),
        }
    }
    let fencing = t.fencing_token();
    a.release(t).await.expect("one release");
    let t = b
        .acquire("leader", AcquireOptions::new())
        .await
        .expect("one release leaves the lease free");
    assert!(t.fencing_token() > fencing);
    let c = b.read_checkpoint(&t).await.expect("read");
    assert!(c.clean_handoff());
    b.release(t).await.expect("release");
    drop_table(&store).await;
}

#[tokio::test]
async fn fencing_keeps_increasing_after_deleted_rows_and_truncate() {
    let table = fresh_table("delete");
    let store = Arc::new(open_shared(&table).await);
    let a = leases(store.clone(), "delete-a", Duration::from_secs(30));
    let mut seen = Vec::new();
    let t = a
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    seen.push(t.fencing_token());
    a.release(t).await.expect("release");
    exec(&store, &format!("DELETE FROM `{table}`")).await;
    assert!(store.inspect(&[]).await.expect("inspect").is_empty());
    let t = a
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    seen.push(t.fencing_token());
    let r = a.read_checkpoint(&t).await.expect("read");
    assert!(
        r.data.is_none() && r.handoff.previous.is_none(),
        "the row is new"
    );
    a.release(t).await.expect("release");
    exec(&store, &format!("TRUNCATE TABLE `{table}`")).await;
    let t = a
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    seen.push(t.fencing_token());
    a.release(t).await.expect("release");
    // The fencing table dropped by hand: created again above every token
    // the lease table has seen, by the next process to start.
    exec(&store, &format!("DROP TABLE `{table}_fencing`")).await;
    let fresh = Arc::new(open_shared(&table).await);
    let c = leases(fresh.clone(), "delete-c", Duration::from_secs(30));
    let t = c
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    seen.push(t.fencing_token());
    c.release(t).await.expect("release");
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "S2: tokens must keep increasing across deletion and TRUNCATE: {seen:?}"
    );
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holders_fenced_transaction_writes_nothing() {
    let table = fresh_table("fencedtx");
    let store = Arc::new(open_shared(&table).await);
    let writes = format!("{table}_writes");
    exec(
        &store,
        &format!("CREATE TABLE `{writes}` (holder VARCHAR(64) NOT NULL, fencing_token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"),
    )
    .await;
    let ttl = Duration::from_millis(300);
    let a = leases(store.clone(), "fenced-a", ttl);
    let b = leases(store.clone(), "fenced-b", ttl);
    let insert = |holder: &'static str, token: &worklease::Token| {
        let sql = format!("INSERT INTO `{writes}` (holder, fencing_token) VALUES (?, ?)");
        let fencing = token.fencing_token();
        let store = store.clone();
        let token = token.clone();
        async move {
            store
                .fenced_transaction(&token, move |tx| {
                    Box::pin(async move { tx.exec_drop(sql, (holder, fencing)).await })
                })
                .await
        }
    };

    // A's lease expires untaken: Expired, nothing written.
    let ta = a
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    insert("fenced-a", &ta)
        .await
        .expect("the current holder commits");
    tokio::time::sleep(ttl + Duration::from_millis(20)).await; // A is paused past its TTL
    match insert("fenced-a", &ta).await {
        Err(FencedTransactionError::Lease(Error::Expired { .. })) => {}
        other => panic!("an expired holder's transaction must fail with Expired, got {other:?}"),
    }
    // B takes over: A is fenced, B commits.
    let tb = b
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    match insert("fenced-a", &ta).await {
        Err(FencedTransactionError::Lease(Error::Fenced { .. })) => {}
        other => panic!("a stale holder's transaction must fail with Fenced, got {other:?}"),
    }
    insert("fenced-b", &tb)
        .await
        .expect("the current holder commits");
    // A body that fails rolls back.
    let sql = format!("INSERT INTO `{writes}` (holder, fencing_token) VALUES ('rolled-back', 0)");
    let failed = store
        .fenced_transaction(&tb, |tx| {
            Box::pin(async move {
                tx.query_drop(sql).await?;
                tx.query_drop("SELECT * FROM no_such_table_here").await
            })
        })
        .await;
    assert!(
        matches!(failed, Err(FencedTransactionError::Body(_))),
        "{failed:?}"
    );

    // The lock orders a takeover after a running transaction: a revocation
    // issued while B's transaction runs waits for its commit.
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (inside_tx, inside_rx) = tokio::sync::oneshot::channel::<()>();
    let running = {
        let (store, tb, writes) = (store.clone(), tb.clone(), writes.clone());
        tokio::spawn(async move {
            store
                .fenced_transaction(&tb, move |tx| {
                    Box::pin(async move {
                        let _ = inside_tx.send(());
                        let _ = go_rx.await;
                        tx.query_drop(format!(
                            "INSERT INTO `{writes}` (holder, fencing_token) VALUES ('fenced-b-late', 0)"
                        ))
                        .await
                    })
                })
                .await
        })
    };
    inside_rx.await.expect("the body runs");
    let revoker = Arc::new(open_shared(&table).await);
    let revoke = {
        let revoker = revoker.clone();
        tokio::spawn(async move { revoker.revoke(&WorkId::new("job").expect("valid")).await })
    };
    // Wait (by the server's own account) until the revocation runs its
    // locking read of the lease row (InnoDB lists a transaction that waits
    // in the optimizer's row read nowhere else).
    let mut watcher = store.pool().get_conn().await.expect("connection");
    let waiting = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE INFO LIKE 'SELECT holder_id%FROM `{table}` WHERE work_id = %FOR UPDATE'"
    );
    let started = tokio::time::Instant::now();
    loop {
        let n: Option<i64> = watcher.query_first(&waiting).await.expect("query");
        if n.unwrap_or(0) > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the revocation never waited for the lock (finished: {})",
            revoke.is_finished()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        !revoke.is_finished(),
        "the revocation waits for the transaction"
    );
    go_tx.send(()).expect("the body waits");
    running
        .await
        .expect("task")
        .expect("the current holder's transaction commits");
    let before = revoke
        .await
        .expect("task")
        .expect("revoke")
        .expect("the lease exists");
    assert_eq!(before.fencing_token, tb.fencing_token());
    match insert("fenced-b", &tb).await {
        Err(FencedTransactionError::Lease(Error::Fenced { .. })) => {}
        other => panic!("a revoked holder's transaction must fail with Fenced, got {other:?}"),
    }

    let mut conn = store.pool().get_conn().await.expect("connection");
    let rows: Vec<(String, u64)> = conn
        .query(format!(
            "SELECT holder, fencing_token FROM `{writes}` ORDER BY fencing_token, holder"
        ))
        .await
        .expect("select");
    assert_eq!(
        rows,
        vec![
            ("fenced-b-late".to_string(), 0),
            ("fenced-a".to_string(), ta.fencing_token()),
            ("fenced-b".to_string(), tb.fencing_token()),
        ],
        "only the current holders' writes are committed"
    );
    drop(conn);
    drop(watcher);
    exec(&store, &format!("DROP TABLE `{writes}`")).await;
    drop_table(&store).await;
}

#[tokio::test]
async fn many_processes_create_the_table_at_once_and_foreign_tables_are_refused() {
    let table = fresh_table("migrate");
    let stores: Vec<MysqlStore> = (0..8)
        .map(|_| {
            MysqlStore::from_url(&with_params(&server_url(), &format!("table={table}")))
                .expect("valid URL")
        })
        .collect();
    let results = futures_util::future::join_all(stores.iter().map(|s| s.initialize())).await;
    for r in results {
        r.expect("every concurrent start succeeds");
    }
    let store = Arc::new(stores.into_iter().next().expect("a store"));
    let a = leases(store.clone(), "migrate-a", Duration::from_secs(5));
    let t = a
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    a.release(t).await.expect("release");

    // A newer schema version is refused.
    exec(
        &store,
        &format!("ALTER TABLE `{table}` COMMENT = 'worklease lease table, schema version 99'"),
    )
    .await;
    let newer =
        MysqlStore::from_url(&with_params(&server_url(), &format!("table={table}"))).expect("URL");
    let e = newer.initialize().await.unwrap_err().to_string();
    assert!(e.contains("schema version 99"), "{e}");
    // A table of another application is refused, and left alone.
    let foreign = fresh_table("foreign");
    exec(&store, &format!("CREATE TABLE `{foreign}` (id INT)")).await;
    let s = MysqlStore::from_url(&with_params(&server_url(), &format!("table={foreign}")))
        .expect("URL");
    let e = s.initialize().await.unwrap_err().to_string();
    assert!(e.contains("not a worklease table"), "{e}");
    exec(&store, &format!("DROP TABLE `{foreign}`")).await;
    drop_table(&store).await;
}

#[tokio::test]
async fn store_urls_open_the_store_and_hide_the_password() {
    let table = fresh_table("url");
    for scheme in ["mysql", "mariadb"] {
        let url =
            with_params(&server_url(), &format!("table={table}")).replacen("mysql", scheme, 1);
        let store = worklease::store::url::open(&url).expect("open");
        assert_eq!(store.kind(), "mysql");
        let a = leases(store, "url-a", Duration::from_secs(5));
        let t = a
            .acquire("job", AcquireOptions::new())
            .await
            .expect("acquire");
        a.release(t).await.expect("release");
    }
    drop_table(&open_shared(&table).await).await;

    // Unreachable server with a password: a store error without the password.
    let port = server::free_port();
    let bad = format!("mysql://app:s3cret@127.0.0.1:{port}/db?table={table}");
    let store = worklease::store::url::open(&bad).expect("parses");
    let a = leases(store, "url-a", Duration::from_secs(5));
    let e = a.acquire("job", AcquireOptions::new()).await.unwrap_err();
    assert!(e.is_transient(), "{e}");
    let shown = format!("{e} {e:?}");
    assert!(!shown.contains("s3cret"), "the password leaked: {shown}");
    assert!(
        shown.contains(&port.to_string()),
        "the error names the server: {shown}"
    );
    // A wrong password: the server's refusal, without the password.
    let wrong = with_params(
        &server_url().replacen("root@", "root:wr0ngpw@", 1),
        &format!("table={table}"),
    );
    let store = worklease::store::url::open(&wrong).expect("parses");
    let a = leases(store, "url-a", Duration::from_secs(5));
    let e = a.acquire("job", AcquireOptions::new()).await.unwrap_err();
    let shown = format!("{e} {e:?}");
    assert!(!shown.contains("wr0ngpw"), "the password leaked: {shown}");
}

#[tokio::test]
async fn checkpoints_and_handoffs_survive_a_round_trip_of_odd_ids() {
    let table = fresh_table("ids");
    let store = Arc::new(open_shared(&table).await);
    let a = leases(store.clone(), "ids-a ", Duration::from_secs(30));
    let b = leases(store.clone(), "ids-a", Duration::from_secs(30));
    // Byte-exact IDs: a trailing space, case and accents tell work IDs apart.
    let ids = ["job", "job ", "JOB", "jöb", "j'ob\"; DROP TABLE x; --"];
    let mut tokens = Vec::new();
    for id in ids {
        let t = a.acquire(id, AcquireOptions::new()).await.expect("acquire");
        a.checkpoint(&t, id.as_bytes().to_vec())
            .await
            .expect("checkpoint");
        tokens.push(t);
    }
    for t in tokens {
        let id = t.work_id().as_str().to_string();
        a.release(t).await.expect("release");
        let t = b
            .acquire(&id, AcquireOptions::new())
            .await
            .expect("acquire");
        let c = b.read_checkpoint(&t).await.expect("read");
        assert_eq!(c.data.as_deref(), Some(id.as_bytes()));
        let prev = c.handoff.previous.expect("previous");
        assert_eq!(
            (prev.holder_id.as_str(), prev.ended),
            ("ids-a ", LeaseEnd::Released)
        );
        b.release(t).await.expect("release");
    }
    assert_eq!(store.inspect(&[]).await.expect("inspect").len(), ids.len());
    drop_table(&store).await;
}

/// A store opened for a read-only command (`StoreSpec::open_existing`:
/// `status`, `leader`, `release`, `checkpoint`) creates nothing: a missing
/// table is an error naming it, and stays missing; an existing one works.
#[tokio::test]
async fn an_existing_only_store_creates_no_table() {
    let table = fresh_table("existing");
    let url = with_params(&server_url(), &format!("table={table}"));
    let spec = worklease::store::url::parse(&url).expect("URL");
    let store = spec.open_existing().expect("opens lazily");
    let e = store.inspect(&[]).await.unwrap_err().to_string();
    assert!(e.contains("no store") && e.contains(&table), "{e}");
    let probe = open_shared(&fresh_table("probe")).await;
    let mut conn = probe.pool().get_conn().await.expect("connection");
    let found: Option<i64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE ?",
            (format!("{table}%"),),
        )
        .await
        .expect("query");
    assert_eq!(found, Some(0), "a read-only open created a table");
    drop(conn);
    let created = open_shared(&table).await;
    let store = spec.open_existing().expect("opens");
    assert!(store
        .inspect(&[])
        .await
        .expect("the table exists")
        .is_empty());
    drop_table(&created).await;
    drop_table(&probe).await;
}
