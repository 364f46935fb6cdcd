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

use async_trait::async_trait;
use worklease::conformance::Suite;
use worklease::store::mysql::mysql_async::{self, prelude::Queryable};
use worklease::store::mysql::{FencedTransactionError, MysqlOptions, MysqlStore, TableName};
use worklease::{AcquireOptions, Error, LeaseEnd, LeaseStore, Token};

#[path = "common/lease.rs"]
mod common_lease;
#[path = "common/net.rs"]
mod common_net;
#[path = "common/privilege.rs"]
mod common_privilege;
#[path = "common/sql_isolation.rs"]
mod common_sql_isolation;
#[path = "common/sql_setup.rs"]
mod common_sql_setup;
#[path = "common/sql_store.rs"]
mod common_sql_store;
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

use common_lease::refusal_without;
use common_sql_store::{fresh_table, leases, with_params, Gate, SqlStore, Tokens};

/// The shared server's URL.
fn server_url() -> String {
    std::env::var("WORKLEASE_TEST_MYSQL_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "mysql://root@127.0.0.1:3306/test".to_string())
}

/// Runs `sql` on one of `store`'s connections.
async fn exec(store: &MysqlStore, sql: &str) {
    let mut conn = store.pool().get_conn().await.expect("connection");
    conn.query_drop(sql).await.expect(sql);
}

#[async_trait]
impl SqlStore for MysqlStore {
    type BodyError = mysql_async::Error;
    const KIND: &'static str = "mysql";

    fn shared_url() -> String {
        server_url()
    }

    async fn serializable_url() -> String {
        std::env::var("WORKLEASE_TEST_MYSQL_SERIALIZABLE_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .expect(
                "WORKLEASE_TEST_MYSQL_SERIALIZABLE_URL: a server whose global isolation is \
                 SERIALIZABLE (.ci/services/mysql.sh starts one)",
            )
    }

    fn unopened(url: &str, table: &str) -> Self {
        MysqlStore::from_url(&with_params(url, &format!("table={table}"))).expect("valid URL")
    }

    async fn init(&self) -> worklease::Result<()> {
        self.initialize().await
    }

    async fn exec(&self, sql: &str) {
        exec(self, sql).await;
    }

    async fn count(&self, sql: &str) -> i64 {
        let mut conn = self.pool().get_conn().await.expect("connection");
        let n: Option<i64> = conn.query_first(sql).await.expect(sql);
        n.expect("a row")
    }

    async fn holder_rows(&self, sql: &str) -> Vec<(String, u64)> {
        let mut conn = self.pool().get_conn().await.expect("connection");
        conn.query(sql).await.expect(sql)
    }

    /// Drops the store's table, fencing table and procedures.
    async fn drop_table(&self) {
        let t = self.table().as_str().to_string();
        exec(self, &format!("DROP TABLE IF EXISTS `{t}`, `{t}_fencing`")).await;
        for name in self.table().procedure_names() {
            exec(self, &format!("DROP PROCEDURE IF EXISTS `{name}`")).await;
        }
    }

    fn create_writes_sql(writes: &str) -> String {
        format!(
            "CREATE TABLE `{writes}` (holder VARCHAR(64) NOT NULL, \
             fencing_token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
        )
    }

    fn schema_99_sql(&self) -> String {
        format!(
            "ALTER TABLE `{}` COMMENT = 'worklease lease table, schema version 99'",
            self.table().as_str()
        )
    }

    fn count_named_like_sql(prefix: &str) -> String {
        format!(
            "SELECT COUNT(*) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE '{prefix}%'"
        )
    }

    fn waiting_revocations_sql(table: &str) -> String {
        // The revocation's locking read of the lease row (InnoDB lists a
        // transaction that waits in the optimizer's row read nowhere else).
        format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE INFO LIKE 'SELECT holder_id%FROM `{table}` WHERE work_id = %FOR UPDATE'"
        )
    }

    async fn fenced(
        &self,
        token: &Token,
        statements: Vec<String>,
        gate: Option<Gate>,
    ) -> Result<(), FencedTransactionError<mysql_async::Error>> {
        self.fenced_transaction(token, move |tx| {
            Box::pin(async move {
                if let Some(gate) = gate {
                    gate.pass().await;
                }
                for sql in statements {
                    tx.query_drop(sql).await?;
                }
                Ok(())
            })
        })
        .await
    }

    async fn open_revoker(table: &str) -> Self {
        Self::open_shared(table).await
    }

    async fn open_recycled(table: &str, lifetime: Duration) -> Self {
        let opts = mysql_async::Opts::from_url(&server_url()).expect("a mysql_async URL");
        let store = MysqlStore::new(
            opts,
            MysqlOptions::new()
                .table(TableName::new(table).expect("valid"))
                .max_connection_lifetime(lifetime),
        )
        .expect("store");
        store.initialize().await.expect("the server answers");
        let mut mine = store.pool().get_conn().await.expect("connection");
        let my_user: Option<String> = mine
            .query_first("SELECT CURRENT_USER()")
            .await
            .expect("user");
        assert!(my_user.is_some());
        drop(mine);
        store
    }

    /// Kills the connection the holder's pool hands out next, by its id on
    /// the server (its idle connections are those the pool keeps).
    async fn kill_connections(&self, holder: &Self, _table: &str) -> u64 {
        let mut probe = holder.pool().get_conn().await.expect("connection");
        let id: Option<u64> = probe
            .query_first("SELECT CONNECTION_ID()")
            .await
            .expect("id");
        // The killer's connection before the probed one goes back idle:
        // the kill follows at once, before its maximum lifetime can end it.
        let mut killer = self.pool().get_conn().await.expect("connection");
        drop(probe);
        let Some(id) = id else { return 0 };
        let killed = killer.query_drop(format!("KILL CONNECTION {id}")).await;
        u64::from(killed.is_ok())
    }
}

// Every check on a table of its own: some checks count every lease of the
// store (`inspect(&[])`), which other checks running at the same time
// would change.
worklease::conformance_tests!(mysql, paused = false, async {
    Suite::new(Arc::new(
        MysqlStore::open_shared(&fresh_table("check")).await,
    ))
});

// The contract on a server whose global isolation is SERIALIZABLE
// (`common/sql_isolation.rs`).
worklease::conformance_tests!(mysql_serializable, paused = false, async {
    let url = MysqlStore::serializable_url().await;
    Suite::new(Arc::new(
        MysqlStore::open(&url, &fresh_table("check")).await,
    ))
});

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_uses_and_waits_under_serializable() {
    common_sql_isolation::first_uses_and_waits_under_serializable::<MysqlStore>().await;
}

/// The GET_LOCK failure of JasperFx/wolverine#4284: a holder that acquires
/// its own lease again and again, then releases once, leaves it free (a
/// live lease is `Held` for its own holder too, ADR 0002: nothing stacks).
#[tokio::test]
async fn stacked_reacquisition_then_one_release_leaves_the_lease_free() {
    let table = fresh_table("stack");
    let store = Arc::new(MysqlStore::open_shared(&table).await);
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
    store.drop_table().await;
}

#[tokio::test]
async fn fencing_keeps_increasing_after_deleted_rows_and_truncate() {
    let table = fresh_table("delete");
    let store = Arc::new(MysqlStore::open_shared(&table).await);
    let a = leases(store.clone(), "delete-a", Duration::from_secs(30));
    let mut seen = Tokens::default();
    seen.acquire_and_release(&a).await;
    exec(&store, &format!("DELETE FROM `{table}`")).await;
    assert!(store.inspect(&[]).await.expect("inspect").is_empty());
    seen.acquire_a_new_row(&a).await;
    exec(&store, &format!("TRUNCATE TABLE `{table}`")).await;
    seen.acquire_and_release(&a).await;
    // The fencing table dropped by hand: created again above every token
    // the lease table has seen, by the next process to start.
    exec(&store, &format!("DROP TABLE `{table}_fencing`")).await;
    let fresh = Arc::new(MysqlStore::open_shared(&table).await);
    let c = leases(fresh.clone(), "delete-c", Duration::from_secs(30));
    seen.acquire_and_release(&c).await;
    seen.assert_increasing("deletion and TRUNCATE");
    store.drop_table().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holders_fenced_transaction_writes_nothing() {
    common_sql_store::a_stale_holders_fenced_transaction_writes_nothing::<MysqlStore>().await;
}

#[tokio::test]
async fn many_processes_create_the_table_at_once_and_foreign_tables_are_refused() {
    common_sql_store::many_processes_create_the_table_at_once_and_foreign_tables_are_refused::<
        MysqlStore,
    >()
    .await;
}

#[tokio::test]
async fn store_urls_open_the_store_and_hide_the_password() {
    common_sql_store::store_urls_open_the_store_and_hide_the_password::<MysqlStore>(
        &["mysql", "mariadb"],
        |port, table| format!("mysql://app:s3cret@127.0.0.1:{port}/db?table={table}"),
    )
    .await;
    // A wrong password: the server's refusal, without the password.
    let wrong = with_params(
        &server_url().replacen("root@", "root:wr0ngpw@", 1),
        &format!("table={}", fresh_table("url")),
    );
    let store = worklease::store::url::open(&wrong).expect("parses");
    refusal_without(store, "wr0ngpw").await;
}

#[tokio::test]
async fn checkpoints_and_handoffs_survive_a_round_trip_of_odd_ids() {
    let table = fresh_table("ids");
    let store = Arc::new(MysqlStore::open_shared(&table).await);
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
    store.drop_table().await;
}

#[tokio::test]
async fn an_existing_only_store_creates_no_table() {
    common_sql_store::an_existing_only_store_creates_no_table::<MysqlStore>().await;
}

#[tokio::test]
async fn a_missing_database_or_user_is_a_setup_error() {
    common_sql_setup::a_missing_database_or_user_is_a_setup_error::<MysqlStore>().await;
}
