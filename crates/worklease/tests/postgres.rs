//! The PostgreSQL store against a real server over TCP on loopback.
//!
//! The shared server comes from `WORKLEASE_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`; `.ci/services/postgres.sh`
//! makes sure one runs). Every test run uses its own table name. Tests that
//! stop or restart a server start their own throwaway cluster (`initdb` +
//! `pg_ctl` from `/usr/lib/postgresql/*/bin`, as the `postgres` user when
//! run as root) on a free loopback port, and never touch the shared one.
#![cfg(feature = "postgres")]

#[cfg(feature = "postgres-tls")]
use std::path::Path;
#[cfg(feature = "postgres-tls")]
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use worklease::conformance::Suite;
use worklease::store::fault::FaultStore;
use worklease::store::postgres::{
    tokio_postgres, FencedTransactionError, PostgresOptions, PostgresStore, TableName,
};
use worklease::{AcquireOptions, LeaseStore, Token};

#[path = "postgres/batch.rs"]
mod batch;
#[path = "postgres/cluster.rs"]
mod cluster;
#[path = "common/lease.rs"]
mod common_lease;
#[path = "common/net.rs"]
mod common_net;
#[path = "common/postgres.rs"]
mod common_postgres;
#[path = "common/privilege.rs"]
mod common_privilege;
#[path = "common/sql_isolation.rs"]
mod common_sql_isolation;
#[path = "common/sql_setup.rs"]
mod common_sql_setup;
#[path = "common/sql_store.rs"]
mod common_sql_store;
#[path = "postgres/privilege.rs"]
mod privilege;

use cluster::{forget_connections, Cluster};
use common_lease::acquire_checkpointed;
use common_postgres::{drop_table, serializable_database_url, server_url};
use common_sql_store::{assert_held, fresh_table, leases, with_params, Gate, SqlStore, Tokens};

/// The table every conformance check of this run shares (each check uses
/// its own work IDs).
fn run_table() -> &'static str {
    static TABLE: OnceLock<String> = OnceLock::new();
    TABLE.get_or_init(|| fresh_table("run"))
}

#[async_trait]
impl SqlStore for PostgresStore {
    type BodyError = tokio_postgres::Error;
    const KIND: &'static str = "postgres";

    fn shared_url() -> String {
        server_url()
    }

    async fn serializable_url() -> String {
        serializable_database_url().await
    }

    fn unopened(url: &str, table: &str) -> Self {
        PostgresStore::from_url(&with_params(url, &format!("table={table}"))).expect("valid URL")
    }

    async fn init(&self) -> worklease::Result<()> {
        self.initialize().await
    }

    async fn exec(&self, sql: &str) {
        let client = self.pool().get().await.expect("connection");
        client.batch_execute(sql).await.expect(sql);
    }

    async fn count(&self, sql: &str) -> i64 {
        let client = self.pool().get().await.expect("connection");
        client.query_one(sql, &[]).await.expect(sql).get(0)
    }

    async fn holder_rows(&self, sql: &str) -> Vec<(String, u64)> {
        let client = self.pool().get().await.expect("connection");
        let rows = client.query(sql, &[]).await.expect(sql);
        rows.iter()
            .map(|r| (r.get(0), r.get::<_, i64>(1) as u64))
            .collect()
    }

    async fn drop_table(&self) {
        drop_table(self).await;
    }

    fn forget_connections(&self) {
        forget_connections(self);
    }

    fn create_writes_sql(writes: &str) -> String {
        format!("CREATE TABLE {writes} (holder text NOT NULL, fencing_token bigint NOT NULL)")
    }

    fn schema_99_sql(&self) -> String {
        format!(
            "COMMENT ON TABLE {} IS 'worklease lease table, schema version 99'",
            self.table().quoted()
        )
    }

    fn count_named_like_sql(prefix: &str) -> String {
        format!("SELECT COUNT(*) FROM pg_class WHERE relname LIKE '{prefix}%'")
    }

    fn waiting_revocations_sql(table: &str) -> String {
        format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{table}_revoker' \
             AND wait_event_type = 'Lock'"
        )
    }

    async fn fenced(
        &self,
        token: &Token,
        statements: Vec<String>,
        gate: Option<Gate>,
    ) -> Result<(), FencedTransactionError<tokio_postgres::Error>> {
        self.fenced_transaction(token, move |tx| {
            Box::pin(async move {
                if let Some(gate) = gate {
                    gate.pass().await;
                }
                for sql in &statements {
                    tx.execute(sql.as_str(), &[]).await?;
                }
                Ok(())
            })
        })
        .await
    }

    async fn open_revoker(table: &str) -> Self {
        // Named, so that `waiting_revocations_sql` finds its session.
        let url = with_params(&server_url(), &format!("application_name={table}_revoker"));
        Self::open(&url, table).await
    }

    async fn open_recycled(table: &str, lifetime: Duration) -> Self {
        // Named, so that `kill_connections` finds its sessions (the
        // listener's too).
        let pg: tokio_postgres::Config =
            with_params(&server_url(), &format!("application_name={table}_holder"))
                .parse()
                .expect("a tokio-postgres URL");
        let store = PostgresStore::new(
            pg,
            PostgresOptions::new()
                .table(TableName::new(table).expect("valid"))
                .max_connection_lifetime(lifetime),
        )
        .expect("store");
        store.initialize().await.expect("the server answers");
        store
    }

    async fn kill_connections(&self, _holder: &Self, table: &str) -> u64 {
        let killed = self
            .count(&format!(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = '{table}_holder'"
            ))
            .await;
        killed as u64
    }
}

worklease::conformance_tests!(postgres, paused = false, async {
    Suite::new(Arc::new(PostgresStore::open_shared(run_table()).await))
});

// The contract in a database whose default isolation is SERIALIZABLE: the
// store pins READ COMMITTED on its connections (`common/sql_isolation.rs`).
worklease::conformance_tests!(postgres_serializable, paused = false, async {
    let url = serializable_database_url().await;
    Suite::new(Arc::new(PostgresStore::open(&url, run_table()).await))
});

/// The store's connections pin what its statements rely on, whatever the
/// database defaults to: READ COMMITTED, and `synchronous_commit` on.
#[tokio::test]
async fn connections_pin_read_committed_and_synchronous_commit() {
    let url = serializable_database_url().await;
    let store = PostgresStore::open(&url, &fresh_table("pinned")).await;
    let client = store.pool().get().await.expect("connection");
    for (setting, pinned) in [
        ("transaction_isolation", "read committed"),
        ("synchronous_commit", "on"),
    ] {
        let row = client
            .query_one(&format!("SHOW {setting}"), &[])
            .await
            .expect(setting);
        assert_eq!(row.get::<_, String>(0), pinned, "{setting}");
    }
    drop(client);
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_uses_and_waits_under_serializable() {
    common_sql_isolation::first_uses_and_waits_under_serializable::<PostgresStore>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_keeps_increasing_after_restart_crash_and_deleted_row() {
    let cluster = Cluster::start().await;
    let table = fresh_table("restart");
    let store = Arc::new(PostgresStore::open(&cluster.url(), &table).await);
    let ttl = Duration::from_secs(60);
    let a = leases(store.clone(), "restart-a", ttl);
    let b = leases(store.clone(), "restart-b", ttl);
    let mut seen = Tokens::default();

    let t = seen.note(acquire_checkpointed(&a, "job", b"progress").await);

    // A clean restart: the lease and its checkpoint are still there.
    cluster.stop("fast").await;
    cluster.start_again().await;
    forget_connections(&store);
    assert_held(&b, "a server restart does not end a lease").await;
    a.release(t).await.expect("release after a restart");
    let t = seen.acquire(&b).await;
    let c = b.read_checkpoint(&t).await.expect("read");
    assert_eq!(
        c.data.as_deref(),
        Some(&b"progress"[..]),
        "S4 across a restart"
    );
    assert!(c.clean_handoff());

    // A crash (immediate stop: no shutdown checkpoint, recovery from WAL).
    cluster.stop("immediate").await;
    cluster.start_again().await;
    forget_connections(&store);
    b.release(t).await.expect("release after a crash");
    // A new store value, as a new process would open.
    let fresh = Arc::new(PostgresStore::open(&cluster.url(), &table).await);
    let c = leases(fresh.clone(), "restart-c", ttl);
    seen.acquire_and_release(&c).await;

    // An operator deletes the row by hand.
    fresh
        .exec(&format!("DELETE FROM {}", fresh.table().quoted()))
        .await;
    assert!(fresh.inspect(&[]).await.expect("inspect").is_empty());
    seen.acquire_a_new_row(&c).await;

    seen.assert_increasing("restart, crash and deletion");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_outages_shorter_than_the_lease_are_ridden_out_longer_ones_lose_it() {
    let cluster = Cluster::start().await;
    common_sql_store::server_outages_shorter_than_the_lease_are_ridden_out::<PostgresStore>(
        &cluster,
        Duration::from_secs(3),
    )
    .await;
}

/// The hand-off bound the issue asks for on loopback.
const HANDOFF_TARGET: Duration = Duration::from_millis(50);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gets_a_released_lease_by_notification() {
    let table = fresh_table("handoff");
    // The waiter has a store (a connection, a listener) of its own, as
    // another process would.
    let holder_store = Arc::new(PostgresStore::open_shared(&table).await);
    let waiter_store = Arc::new(PostgresStore::open_shared(&table).await);
    // The test decorator reports each `Held` answer: the waiter is waiting
    // (its watch was subscribed before the attempt) once one was seen.
    let signal = Arc::new(FaultStore::over(waiter_store.clone()));
    let mut held_rx = signal.held_answers().subscribe();
    // On a slow or loaded server the bound grows with the measured round
    // trip (a hand-off is a notification and two statements).
    let mut probe = Suite::new(holder_store.clone());
    probe.calibrate().await;
    let target = HANDOFF_TARGET.max(probe.round_trip * 4);
    let ttl = Duration::from_secs(30);
    // The poll interval is far beyond the bound: only a notification can
    // hand the lease over in time.
    let poll = ttl;
    let a = leases(holder_store.clone(), "handoff-a", ttl);
    let b = leases(signal.clone(), "handoff-b", ttl);
    let rounds = 20;
    let mut took = Vec::new();
    for round in 0..rounds {
        let id = format!("handoff-{round}");
        let t = a
            .acquire(&id, AcquireOptions::new())
            .await
            .expect("acquire");
        let waiter = {
            let (b, id) = (b.clone(), id.clone());
            tokio::spawn(async move {
                let t = b
                    .acquire(
                        &id,
                        AcquireOptions::new().wait_for_lease().poll_interval(poll),
                    )
                    .await;
                (t, Instant::now())
            })
        };
        held_rx.mark_unchanged();
        held_rx.changed().await.expect("the waiter was told Held");
        let released = Instant::now();
        a.release(t).await.expect("release");
        let (t, got) = waiter.await.expect("waiter task");
        let t = t.expect("the waiter gets the lease");
        took.push(got - released);
        b.release(t).await.expect("release");
    }
    took.sort();
    let median = took[took.len() / 2];
    println!(
        "hand-off on loopback over {rounds} rounds: min {:?}, median {median:?}, max {:?}",
        took[0],
        took[took.len() - 1]
    );
    assert!(
        median <= target,
        "L1: the median hand-off took {median:?} (> {target:?}); all: {took:?}"
    );
    assert!(
        took[took.len() - 1] < poll / 10,
        "a hand-off waited for polling: {took:?}"
    );
    drop_table(&holder_store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holders_fenced_transaction_writes_nothing() {
    common_sql_store::a_stale_holders_fenced_transaction_writes_nothing::<PostgresStore>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycled_and_killed_connections_change_nothing() {
    common_sql_store::recycled_and_killed_connections_change_nothing::<PostgresStore>().await;
}

#[tokio::test]
async fn many_processes_create_the_table_at_once_and_foreign_tables_are_refused() {
    common_sql_store::many_processes_create_the_table_at_once_and_foreign_tables_are_refused::<
        PostgresStore,
    >()
    .await;
}

#[tokio::test]
async fn store_urls_open_the_store_and_hide_the_password() {
    common_sql_store::store_urls_open_the_store_and_hide_the_password::<PostgresStore>(
        &["postgres"],
        |port, table| {
            format!("postgres://app:s3cret@127.0.0.1:{port}/db?table={table}&connect_timeout=2")
        },
    )
    .await;
}

/// Writes a test CA (`ca.pem`), a server certificate for 127.0.0.1 signed
/// by it, and an unrelated CA (`other-ca.pem`) with the openssl tool;
/// returns the server options that turn TLS on.
#[cfg(feature = "postgres-tls")]
fn make_certificates(dir: &Path) -> String {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("the openssl tool");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for ca in ["ca", "other-ca"] {
        let (key, pem) = (format!("{ca}.key"), format!("{ca}.pem"));
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "2",
            "-subj",
            "/CN=worklease test CA",
        ]);
    }
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write");
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    ]);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("chmod");
    format!(
        "-c ssl=on -c ssl_cert_file={0}/server.crt -c ssl_key_file={0}/server.key",
        dir.display()
    )
}

#[cfg(feature = "postgres-tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connections_verify_the_server() {
    let cluster = Cluster::start_with(make_certificates).await;
    let dir = cluster.info.dir.display().to_string();
    let table = fresh_table("tls");
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={dir}/ca.pem",
        cluster.url()
    );
    let store = Arc::new(PostgresStore::open(&url, &table).await);
    let ssl: bool = store
        .pool()
        .get()
        .await
        .expect("connection")
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("query")
        .get(0);
    assert!(ssl, "the connection uses TLS");
    let a = leases(store.clone(), "tls-a", Duration::from_secs(5));
    let t = a
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    a.release(t).await.expect("release");

    // A server whose certificate the client does not trust is refused.
    let untrusted = PostgresStore::from_url(&with_params(
        &format!(
            "{}?sslmode=require&sslrootcert={dir}/other-ca.pem",
            cluster.url()
        ),
        &format!("table={table}"),
    ))
    .expect("valid URL");
    let e = untrusted.initialize().await.unwrap_err();
    let mut chain = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        chain.push_str(&format!(": {s}"));
        source = s.source();
    }
    assert!(e.is_transient(), "{chain}");
    assert!(chain.to_lowercase().contains("certificate"), "{chain}");
}

#[tokio::test]
async fn an_existing_only_store_creates_no_table() {
    common_sql_store::an_existing_only_store_creates_no_table::<PostgresStore>().await;
}

#[tokio::test]
async fn a_missing_database_or_user_is_a_setup_error() {
    common_sql_setup::a_missing_database_or_user_is_a_setup_error::<PostgresStore>().await;
}
