//! What the SQL stores promise beyond the lease contract, as checks written
//! once and run on PostgreSQL and MySQL (a module of `tests/postgres.rs`
//! and `tests/mysql.rs`, as the conformance suite is for the contract):
//! outages of the server, pooled connections recycled and killed, fenced
//! transactions, tables created by many processes at once, store URLs that
//! hide the password, read-only opens that create nothing.
//!
//! Each test file implements [`SqlStore`] for its store with what differs
//! (the shared server's URL, the SQL dialect, how a fenced transaction's
//! body runs, how connections are told apart and killed) and
//! [`Throwaway`] for its throwaway server.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;
use tokio::time::Instant;
// Both SQL stores re-export the one `FencedTransactionError`: either path
// names it, whichever store this test file is built for.
#[cfg(not(feature = "postgres"))]
use worklease::store::mysql::FencedTransactionError;
#[cfg(feature = "postgres")]
use worklease::store::postgres::FencedTransactionError;
use worklease::{
    AcquireOptions, Config, Error, LeaseEnd, LeaseStore, Leases, RenewalOptions, Token, WorkId,
};

use crate::common_lease::unreachable_error_is_redacted;

/// `url` with extra query parameters.
pub(crate) fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// A fresh table name for this test run (or for one test).
pub(crate) fn fresh_table(what: &str) -> String {
    format!("wl_test_{what}_{:08x}", rand::random::<u32>())
}

/// A lease handle of `holder` on `store`.
pub(crate) fn leases(store: Arc<dyn LeaseStore>, holder: &str, ttl: Duration) -> Leases {
    Leases::new(store, Config::new(holder, ttl)).expect("config")
}

/// Asserts that `leases` is refused "job" as held by another; `why` says
/// what the lease outlived.
pub(crate) async fn assert_held(leases: &Leases, why: &str) {
    assert!(
        matches!(
            leases.acquire("job", AcquireOptions::new()).await,
            Err(Error::Held { .. })
        ),
        "{why}"
    );
}

/// The fencing tokens of "job" a test saw across disruptions of its store
/// (a restart, a crash, rows deleted by hand): S2 wants each larger than
/// the one before.
#[derive(Default)]
pub(crate) struct Tokens(Vec<u64>);

impl Tokens {
    /// Notes `t`'s fencing token; returns `t`.
    pub(crate) fn note(&mut self, t: Token) -> Token {
        self.0.push(t.fencing_token());
        t
    }

    /// Acquires "job" with `leases` and notes its token; returns the
    /// token, still held.
    pub(crate) async fn acquire(&mut self, leases: &Leases) -> Token {
        let t = leases
            .acquire("job", AcquireOptions::new())
            .await
            .expect("acquire");
        self.note(t)
    }

    /// [`Tokens::acquire`], then releases.
    pub(crate) async fn acquire_and_release(&mut self, leases: &Leases) {
        let t = self.acquire(leases).await;
        leases.release(t).await.expect("release");
    }

    /// [`Tokens::acquire`] of a lease whose row was deleted by hand: the
    /// row is new (no checkpoint, no previous holder); then releases.
    pub(crate) async fn acquire_a_new_row(&mut self, leases: &Leases) {
        let t = self.acquire(leases).await;
        let r = leases.read_checkpoint(&t).await.expect("read");
        assert!(
            r.data.is_none() && r.handoff.previous.is_none(),
            "the row is new"
        );
        leases.release(t).await.expect("release");
    }

    /// Asserts S2 over the tokens seen across `disruptions`.
    pub(crate) fn assert_increasing(&self, disruptions: &str) {
        let seen = &self.0;
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "S2: tokens must keep increasing across {disruptions}: {seen:?}"
        );
    }
}

/// The point where a fenced transaction's body stops: it tells `inside`
/// that it runs, then waits for `go` before its statements.
pub(crate) struct Gate {
    inside: oneshot::Sender<()>,
    go: oneshot::Receiver<()>,
}

impl Gate {
    /// Passes the gate (inside a fenced transaction's body).
    pub(crate) async fn pass(self) {
        let _ = self.inside.send(());
        let _ = self.go.await;
    }
}

/// A SQL store under test: what the shared checks need of it.
#[async_trait]
pub(crate) trait SqlStore: LeaseStore + Sized + 'static {
    /// The error of a fenced transaction's body (the driver's).
    type BodyError: std::fmt::Debug + Send + 'static;

    /// The store's kind, as [`LeaseStore::kind`] names it.
    const KIND: &'static str;

    /// The shared test server's URL.
    fn shared_url() -> String;

    /// The URL of a database (PostgreSQL) or server (MariaDB) whose
    /// default transaction isolation is SERIALIZABLE, as a DBA may set it:
    /// the store must not inherit it (`common/sql_isolation.rs`).
    async fn serializable_url() -> String;

    /// A store on `table` of the server at `url`, not yet initialised.
    fn unopened(url: &str, table: &str) -> Self;

    /// The store's `initialize` (creates or checks its table).
    async fn init(&self) -> worklease::Result<()>;

    /// Runs `sql` (statements without results) on one of the store's
    /// connections.
    async fn exec(&self, sql: &str);

    /// The number that `sql`, a query of one row and one integer column,
    /// answers.
    async fn count(&self, sql: &str) -> i64;

    /// The `(holder, fencing_token)` rows `sql` selects.
    async fn holder_rows(&self, sql: &str) -> Vec<(String, u64)>;

    /// Drops the store's table and whatever else it created.
    async fn drop_table(&self);

    /// Forgets the pooled connections that died with a stopped server, for
    /// a pool that does not find out by itself.
    fn forget_connections(&self) {}

    /// The statement that creates the application's table `writes`
    /// (`holder` text, `fencing_token` integer).
    fn create_writes_sql(writes: &str) -> String;

    /// The statement that marks the store's table with schema version 99.
    fn schema_99_sql(&self) -> String;

    /// A query counting the tables (and sequences) named `prefix...`.
    fn count_named_like_sql(prefix: &str) -> String;

    /// A query counting the revocations by a store of
    /// [`SqlStore::open_revoker`] that wait for a lease row of `table`.
    fn waiting_revocations_sql(table: &str) -> String;

    /// Runs `statements` in a fenced transaction of `token`; with `gate`,
    /// the body passes it first.
    async fn fenced(
        &self,
        token: &Token,
        statements: Vec<String>,
        gate: Option<Gate>,
    ) -> Result<(), FencedTransactionError<Self::BodyError>>;

    /// A store on `table` of the shared server whose waiting revocation
    /// [`SqlStore::waiting_revocations_sql`] sees.
    async fn open_revoker(table: &str) -> Self;

    /// A store on `table` of the shared server whose pooled connections
    /// live at most `lifetime`, and which [`SqlStore::kill_connections`]
    /// can find.
    async fn open_recycled(table: &str, lifetime: Duration) -> Self;

    /// Through this store's connections, kills connections of `holder`
    /// (opened by [`SqlStore::open_recycled`] on `table`); how many.
    async fn kill_connections(&self, holder: &Self, table: &str) -> u64;

    /// A store on `table` of the server at `url`, initialised.
    async fn open(url: &str, table: &str) -> Self {
        let store = Self::unopened(url, table);
        store.init().await.expect("the server answers");
        store
    }

    /// A store on `table` of the shared server, initialised.
    async fn open_shared(table: &str) -> Self {
        Self::open(&Self::shared_url(), table).await
    }
}

/// A throwaway server of a test of its own, which the test stops and
/// starts again.
#[async_trait]
pub(crate) trait Throwaway: Sync {
    /// The server's URL.
    fn server_url(&self) -> String;

    /// Stops the server cleanly; returns once it is down.
    async fn stop_cleanly(&self);

    /// Starts the server again; returns once it answers.
    async fn resume(&self);
}

/// An outage shorter than the lease's remaining time is ridden out (no new
/// acquisition, nobody else gets in); a longer one fires the lost signal by
/// the holder's deadline, and the lease passes on by expiry. `ttl` must
/// leave room for a stop, a wait and a start inside a third of it.
pub(crate) async fn server_outages_shorter_than_the_lease_are_ridden_out<S: SqlStore>(
    server: &impl Throwaway,
    ttl: Duration,
) {
    let table = fresh_table("outage");
    let store = Arc::new(S::open(&server.server_url(), &table).await);
    let a = leases(store.clone(), "outage-a", ttl);
    let b = leases(store.clone(), "outage-b", ttl);
    let t = a
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    let fencing = t.fencing_token();
    let mut renewal = a.start_renewal(t, RenewalOptions::new()).expect("renewal");

    // Right after a renewal, stop the server for a third of the time the
    // lease has left.
    let t = renewal.changed().await.expect("a first renewal");
    let left = t.remaining().expect("a deadline");
    let stopped = Instant::now();
    server.stop_cleanly().await;
    tokio::time::sleep((left / 3).saturating_sub(stopped.elapsed())).await;
    server.resume().await;
    let outage = stopped.elapsed();
    assert!(
        outage < left,
        "the outage ({outage:?}) outlasted the lease ({left:?})"
    );
    let t = tokio::time::timeout(left, renewal.changed())
        .await
        .expect("a renewal within the lease's remaining time")
        .expect("the lease survives an outage shorter than its remaining time");
    assert_eq!(t.fencing_token(), fencing, "no new acquisition");
    assert!(renewal.lost_cause().is_none());
    match b.acquire("job", AcquireOptions::new()).await {
        Err(Error::Held { holder_id, .. }) => assert_eq!(holder_id, "outage-a"),
        other => panic!("S1: the lease must still be held, got {other:?}"),
    }

    // Now a longer outage: the lost signal fires by the holder's deadline,
    // before the server could let anybody else in.
    let t = renewal.changed().await.expect("a renewal");
    let deadline = t.deadline().expect("a deadline");
    server.stop_cleanly().await;
    let cause = renewal.lost().await;
    let lost_at = Instant::now();
    assert!(
        matches!(cause, Error::WindowExhausted { .. }),
        "cause must be WindowExhausted, got {cause:?}"
    );
    assert!(
        lost_at <= deadline + a.safety_margin(),
        "the lost signal fired {:?} after the holder's deadline",
        lost_at - deadline
    );
    server.resume().await;
    store.forget_connections();
    let t = b
        .acquire(
            "job",
            AcquireOptions::new()
                .wait_for_lease()
                .poll_interval(ttl / 10)
                .wait_timeout(ttl * 2),
        )
        .await
        .expect("the expired lease passes on");
    let c = b.read_checkpoint(&t).await.expect("read");
    let prev = c.handoff.previous.expect("a previous holder");
    assert_eq!(
        (prev.holder_id.as_str(), prev.ended),
        ("outage-a", LeaseEnd::Expired)
    );
    assert!(t.fencing_token() > fencing);
}

/// For a few TTLs, every second the holder's pooled connections are
/// refreshed (maximum lifetime) and, besides, killed by the server: the
/// lease stays held, renewed under the same token, and is released cleanly.
pub(crate) async fn recycled_and_killed_connections_change_nothing<S: SqlStore>() {
    let table = fresh_table("recycle");
    let recycle = Duration::from_secs(1);
    let store = Arc::new(S::open_recycled(&table, recycle).await);
    let other = Arc::new(S::open_shared(&table).await);
    let ttl = Duration::from_secs(3);
    let a = leases(store.clone(), "recycle-a", ttl);
    let b = leases(other.clone(), "recycle-b", ttl);
    let t = a
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    let fencing = t.fencing_token();
    let renewal = a.start_renewal(t, RenewalOptions::new()).expect("renewal");

    let mut tick = tokio::time::interval(recycle);
    let mut killed = 0;
    let until = Instant::now() + ttl * 3;
    while Instant::now() < until {
        tick.tick().await;
        killed += other.kill_connections(&store, &table).await;
        match b.acquire("job", AcquireOptions::new()).await {
            Err(Error::Held { holder_id, .. }) => assert_eq!(holder_id, "recycle-a"),
            other => panic!("S1: the lease must stay held, got {other:?}"),
        }
        let info = other
            .inspect(&[WorkId::new("job").expect("valid")])
            .await
            .expect("inspect");
        assert_eq!(info.len(), 1);
        assert_eq!(
            (info[0].fencing_token, info[0].expired),
            (fencing, false),
            "no new acquisition"
        );
        assert!(
            renewal.lost_cause().is_none(),
            "lost: {:?}",
            renewal.lost_cause()
        );
    }
    assert!(killed > 0, "the test killed no connection");
    let t = renewal.stop().await.expect("the lease was never lost");
    assert_eq!(t.fencing_token(), fencing);
    a.release(t).await.expect("release");
    let t = b
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    let c = b.read_checkpoint(&t).await.expect("read");
    let prev = c.handoff.previous.expect("previous");
    assert_eq!(
        (prev.holder_id.as_str(), prev.fencing_token, prev.ended),
        ("recycle-a", fencing, LeaseEnd::Released)
    );
    b.release(t).await.expect("release");
    other.drop_table().await;
}

/// The statement of a fenced transaction that writes `holder` and
/// `fencing` into `writes`.
fn write(writes: &str, holder: &str, fencing: u64) -> String {
    format!("INSERT INTO {writes} (holder, fencing_token) VALUES ('{holder}', {fencing})")
}

/// Expects `r`, a fenced transaction's outcome, to be a lease error that
/// `expected` accepts; `message` says which and why.
fn expect_lease_error(
    r: Result<(), FencedTransactionError<impl std::fmt::Debug>>,
    expected: fn(&Error) -> bool,
    message: &str,
) {
    match r {
        Err(FencedTransactionError::Lease(e)) if expected(&e) => {}
        other => panic!("{message}, got {other:?}"),
    }
}

/// A fenced transaction commits only while its token holds the lease: an
/// expired holder's fails with `Expired`, a stale or revoked holder's with
/// `Fenced`, a failing body rolls back, and a revocation issued while the
/// current holder's transaction runs waits for its commit.
pub(crate) async fn a_stale_holders_fenced_transaction_writes_nothing<S: SqlStore>() {
    let table = fresh_table("fencedtx");
    let store = Arc::new(S::open_shared(&table).await);
    let writes = format!("{table}_writes");
    store.exec(&S::create_writes_sql(&writes)).await;
    let ttl = Duration::from_millis(300);
    let a = leases(store.clone(), "fenced-a", ttl);
    let b = leases(store.clone(), "fenced-b", ttl);
    let insert = |holder: &str, token: &Token| {
        let sql = write(&writes, holder, token.fencing_token());
        let (store, token) = (store.clone(), token.clone());
        async move { store.fenced(&token, vec![sql], None).await }
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
    expect_lease_error(
        insert("fenced-a", &ta).await,
        |e| matches!(e, Error::Expired { .. }),
        "an expired holder's transaction must fail with Expired",
    );
    // B takes over: A is fenced, B commits.
    let tb = b
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    expect_lease_error(
        insert("fenced-a", &ta).await,
        |e| matches!(e, Error::Fenced { .. }),
        "a stale holder's transaction must fail with Fenced",
    );
    insert("fenced-b", &tb)
        .await
        .expect("the current holder commits");
    // A body that fails rolls back.
    let failing = vec![
        write(&writes, "rolled-back", 0),
        "SELECT * FROM no_such_table_here".to_string(),
    ];
    let failed = store.fenced(&tb, failing, None).await;
    assert!(
        matches!(failed, Err(FencedTransactionError::Body(_))),
        "{failed:?}"
    );

    // The lock orders a takeover after a running transaction: a revocation
    // issued while B's transaction runs waits for its commit.
    let revoker = Arc::new(S::open_revoker(&table).await);
    let (go_tx, go) = oneshot::channel::<()>();
    let (inside, inside_rx) = oneshot::channel::<()>();
    let running = {
        let (store, tb) = (store.clone(), tb.clone());
        let late = vec![write(&writes, "fenced-b-late", 0)];
        tokio::spawn(async move { store.fenced(&tb, late, Some(Gate { inside, go })).await })
    };
    inside_rx.await.expect("the body runs");
    let revoke = {
        let revoker = revoker.clone();
        tokio::spawn(async move { revoker.revoke(&WorkId::new("job").expect("valid")).await })
    };
    // Wait (by the server's own account) until the revocation waits for
    // the row lock.
    let waiting = S::waiting_revocations_sql(&table);
    let started = Instant::now();
    while store.count(&waiting).await == 0 {
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
    expect_lease_error(
        insert("fenced-b", &tb).await,
        |e| matches!(e, Error::Fenced { .. }),
        "a revoked holder's transaction must fail with Fenced",
    );

    let rows = store
        .holder_rows(&format!(
            "SELECT holder, fencing_token FROM {writes} ORDER BY fencing_token, holder"
        ))
        .await;
    assert_eq!(
        rows,
        vec![
            ("fenced-b-late".to_string(), 0),
            ("fenced-a".to_string(), ta.fencing_token()),
            ("fenced-b".to_string(), tb.fencing_token()),
        ],
        "only the current holders' writes are committed"
    );
    store.exec(&format!("DROP TABLE {writes}")).await;
    store.drop_table().await;
}

/// Eight stores starting at once on a new table all succeed; a table of a
/// newer schema version, or of another application, is refused (and the
/// latter left alone).
pub(crate) async fn many_processes_create_the_table_at_once_and_foreign_tables_are_refused<
    S: SqlStore,
>() {
    let table = fresh_table("migrate");
    let stores: Vec<S> = (0..8)
        .map(|_| S::unopened(&S::shared_url(), &table))
        .collect();
    let results = futures_util::future::join_all(stores.iter().map(|s| s.init())).await;
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
    store.exec(&store.schema_99_sql()).await;
    let newer = S::unopened(&S::shared_url(), &table);
    let e = newer.init().await.unwrap_err();
    // A set-up error, which waiting does not cure.
    assert!(matches!(e, Error::StoreSetup(_)), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("schema version 99"), "{e}");
    // A table of another application is refused, and left alone.
    let foreign = fresh_table("foreign");
    store
        .exec(&format!("CREATE TABLE {foreign} (id INT)"))
        .await;
    let e = S::unopened(&S::shared_url(), &foreign)
        .init()
        .await
        .unwrap_err();
    assert!(matches!(e, Error::StoreSetup(_)), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("not a worklease table"), "{e}");
    store.exec(&format!("DROP TABLE {foreign}")).await;
    store.drop_table().await;
}

/// A store URL of the shared server opens the store, under each of
/// `schemes` (in place of the server URL's own); a URL with the password
/// `s3cret`, `unreachable(port, table)`, of a server nothing answers for is
/// a store error that names the server's port without the password.
pub(crate) async fn store_urls_open_the_store_and_hide_the_password<S: SqlStore>(
    schemes: &[&str],
    unreachable: impl Fn(u16, &str) -> String,
) {
    let table = fresh_table("url");
    let shared = with_params(&S::shared_url(), &format!("table={table}"));
    let own_scheme = shared.split_once("://").expect("a URL with ://").0;
    for scheme in schemes {
        let url = shared.replacen(own_scheme, scheme, 1);
        let store = worklease::store::url::open(&url).expect("open");
        assert_eq!(store.kind(), S::KIND);
        let a = leases(store, "url-a", Duration::from_secs(5));
        let t = a
            .acquire("job", AcquireOptions::new())
            .await
            .expect("acquire");
        a.release(t).await.expect("release");
    }
    S::open_shared(&table).await.drop_table().await;

    let port = crate::common_net::free_port();
    let store = worklease::store::url::open(&unreachable(port, &table)).expect("parses");
    unreachable_error_is_redacted(store, "s3cret", &port.to_string()).await;
}

/// A store opened for a read-only command (`StoreSpec::open_existing`:
/// `status`, `leader`, `release`, `checkpoint`) creates nothing: a missing
/// table is an error naming it, and neither it nor anything named after it
/// (a sequence, a fencing table) appears; an existing one works.
pub(crate) async fn an_existing_only_store_creates_no_table<S: SqlStore>() {
    let table = fresh_table("existing");
    let url = with_params(&S::shared_url(), &format!("table={table}"));
    let spec = worklease::store::url::parse(&url).expect("URL");
    let store = spec.open_existing().expect("opens lazily");
    let e = store.inspect(&[]).await.unwrap_err().to_string();
    assert!(e.contains("no store") && e.contains(&table), "{e}");
    let probe = S::open_shared(&fresh_table("probe")).await;
    let found = probe.count(&S::count_named_like_sql(&table)).await;
    assert_eq!(found, 0, "a read-only open created a table or sequence");
    let created = S::open_shared(&table).await;
    let store = spec.open_existing().expect("opens");
    assert!(store
        .inspect(&[])
        .await
        .expect("the table exists")
        .is_empty());
    created.drop_table().await;
    probe.drop_table().await;
}
