//! The MySQL / MariaDB store (feature `mysql`): many hosts, one database,
//! over mysql_async (ADR 0018).
//!
//! * **One round trip per operation.** Every operation that writes is one
//!   `CALL` of a stored procedure of the table (a cached prepared
//!   statement; preparing it costs one more round trip, once per pooled
//!   connection), which runs one READ COMMITTED transaction inside the
//!   server: it locks the lease row (`SELECT ... FOR UPDATE`), reads the
//!   server's clock, decides with the rules of the other stores
//!   (`store/record.rs`), writes, commits and answers in one result row.
//!   Acquire answers the grant (token and hand-off) or `Held` with the
//!   holder and its time left; renew, checkpoint and release answer `ok`,
//!   `fenced` (taken over, revoked, never issued) or `expired` (current
//!   but expired or released). Read checkpoint and inspect are one plain
//!   `SELECT` each; revoke is one `CALL`.
//!
//!   | operation | round trips | statements inside the server |
//!   |---|---|---|
//!   | acquire | 1 (`CALL <table>_v1_acquire`) | lock, insert or update, one insert and delete in the fencing table |
//!   | renew, checkpoint, release | 1 (`CALL <table>_v1_update`) | lock, update |
//!   | read checkpoint, inspect | 1 (`SELECT`) | — |
//!   | revoke | 1 (`CALL <table>_v1_revoke`) | lock, update |
//!   | renew_many, release_many | 1 (`CALL <table>_v1_update_many`) | one locking read, one `UPDATE` over all leases |
//!   | acquire_many | 1 (`CALL <table>_v1_acquire_many`) | the acquire steps per work ID tried, one transaction |
//!
//! * **Clock.** Expiry is judged by the server's clock only (the crate
//!   docs' "Clocks", ADR 0001): `UTC_TIMESTAMP(6)`, read after the row is
//!   locked, in microseconds and independent of the session's time zone,
//!   never the client's clock. A lease is live while `expires_at >=` that
//!   time; `expires_at` is it plus the TTL in whole milliseconds, rounded
//!   up ([`crate::limits`]), so the server never ends a lease before its
//!   holder's own deadline (send time + TTL). A step of the server's wall
//!   clock moves every expiry with it, as on PostgreSQL.
//! * **Fencing.** Tokens come from one sequence per table, shared by all
//!   work IDs: the `AUTO_INCREMENT` counter of `<table>_fencing` (an
//!   acquisition inserts a row, takes `LAST_INSERT_ID()` and deletes the
//!   row in its transaction). InnoDB keeps that counter across restarts
//!   and crashes on MySQL 8.0+ and MariaDB 10.2.4+ (older servers reset it
//!   to the largest id + 1 on restart, which an empty table would send back
//!   to 1: they are not supported, and the store needs JSON_TABLE, MySQL
//!   8.0.4+ or MariaDB 10.6+, anyway). The sequence never goes back: not
//!   after a release, an expiry, a `DELETE` or `TRUNCATE` of the lease
//!   table by an operator, or a restart. An acquisition also takes at
//!   least the row's token + 1, so a sequence reset by hand cannot make a
//!   work ID's tokens go back; a fencing table dropped by hand is created
//!   again above the lease table's largest token. Values drawn by failed
//!   attempts leave gaps. To remove a store for good, drop the table, the
//!   fencing table and the procedures `<table>_v1_*`.
//! * **No session state.** A lease is a row; no `GET_LOCK` or other
//!   session state holds it, so pooled connections that are recycled,
//!   killed or reset change nothing. The pool does not reset connections
//!   when they come back (`COM_RESET_CONNECTION` would drop the cached
//!   prepared statements, a round trip more per call).
//! * **No notifications.** MySQL has no `LISTEN`/`NOTIFY`: waiters poll
//!   (every 2 s by default, `AcquireOptions::poll_interval`), so a released
//!   lease passes to a waiter at its next poll, not at once
//!   ([`crate::LeaseStore::watch`] is `None`; `worklease status` says so).
//! * **Batches.** [`LeaseStore::renew_many`] and [`LeaseStore::release_many`]
//!   send up to [`MAX_BATCH`] (1,000) leases as one JSON array; the
//!   procedure locks their rows (sorted by work ID, so batches never wait
//!   for each other in a cycle), then ONE `UPDATE ... JOIN JSON_TABLE(...)`
//!   changes every lease that is current and live, and the verdicts come
//!   back in one row. [`LeaseStore::acquire_many`] decides the work IDs in
//!   order, as the single acquisition does, until `max` are granted, in
//!   one transaction and one round trip (a statement per work ID inside the
//!   server: MySQL has no `UPDATE ... RETURNING` to draw one sequence value
//!   per row in a single statement). A transaction InnoDB picks as a
//!   deadlock's victim (acquisition batches in different orders, or an
//!   application's fenced transaction) is rolled back whole and run again.
//! * **Fenced writes.** [`MysqlStore::fenced_transaction`] runs the
//!   caller's SQL in a transaction that first locks the lease row and
//!   checks the token: the way to fence writes to InnoDB tables in the
//!   same server.
//! * **Schema.** One table (default [`DEFAULT_TABLE`], configurable, for
//!   example per application or per test run), its fencing table and its
//!   procedures, created on first use under `GET_LOCK`, so many processes
//!   may start at once. The table's comment records the schema version
//!   ([`SCHEMA_VERSION`]), which also names the procedures; a table without
//!   it is refused as not a worklease table, and a newer version as written
//!   by a newer worklease. The user needs `CREATE`, `ALTER`, `CREATE
//!   ROUTINE` and `EXECUTE` on the database at the first start, then
//!   only [`TABLE_PRIVILEGES`] on the table, [`FENCING_PRIVILEGES`] on the
//!   fencing table and [`PROCEDURE_PRIVILEGES`] on the procedures: an
//!   owner may run [`TableName::ddl`] instead, and a user that may not
//!   create gets that DDL in its error.
//!
//! * **Session settings.** Every pooled connection pins `autocommit = 1`
//!   when it opens (after the options' own `setup`), whatever the server's
//!   `init_connect` or global default says: a plain read is its own
//!   transaction, never one left open on a pooled connection (what for:
//!   `PINNED_SESSION` in `conn.rs`). The isolation level needs no pin:
//!   every procedure sets READ COMMITTED for its own transaction, so a
//!   server whose global isolation is SERIALIZABLE changes nothing (the
//!   conformance suite runs on one, whose `sql_mode` is also
//!   `ANSI,NO_BACKSLASH_ESCAPES`); fenced transactions run at the
//!   session's level, the server's default. A statement the server rolled
//!   back as transient (a deadlock's victim, a lock wait timeout, a
//!   serialization failure) runs again after a short jittered pause, a few
//!   times (about 0.5 s at most), then is a store error, which a waiting
//!   acquisition waits through and renewal retries. Not pinned, and so the
//!   server's: `sql_mode` (the procedures keep the mode they were created
//!   under; the store's SQL uses no double-quoted strings, `||` or
//!   backslash escapes), `innodb_lock_wait_timeout` (a wait it ends is
//!   retried as above), `transaction_read_only`.
//!
//! Not guaranteed or not supported: durability beyond the server's own
//! (`innodb_flush_log_at_trx_commit=1`, the default, for an acknowledged
//! lease to survive a crash); replicas and asynchronous replication (a
//! failover to a replica that had not received the last acquisition can
//! hand out a lease twice and reuse a token); binary logging in
//! `STATEMENT` format (READ COMMITTED needs `ROW` or `MIXED`, the
//! defaults); proxies that multiplex transactions over server connections.
//! A statement that hangs (a frozen server) is bounded by the lease
//! layer's deadlines for renewals, not by the store. Tested on MariaDB
//! 10.11; the SQL is written for MySQL 8.0 as well.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::{sync::Arc, time::Duration};
//! use worklease::store::mysql::MysqlStore;
//! use worklease::{AcquireOptions, Config, Leases};
//!
//! let store = Arc::new(MysqlStore::from_url(
//!     "mysql://app@db.internal:3306/app?table=worklease_leases",
//! )?);
//! let leases = Leases::new(store.clone(), Config::new("worker-1", Duration::from_secs(15)))?;
//! let token = leases.acquire("shard-7", AcquireOptions::new()).await?;
//! leases.release(token).await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;

use mysql_async::{OptsBuilder, Pool, PoolConstraints};
use tokio::sync::OnceCell;

pub use mysql_async;

#[cfg(doc)]
use crate::error::InvalidInput;
use crate::error::{Result, StoreError};
#[cfg(doc)]
use crate::store::LeaseStore;

mod batch;
mod config;
mod conn;
mod fenced;
mod ops;
mod schema;
mod sql;
#[cfg(feature = "mysql-tls")]
mod tls;

pub use crate::store::sql_rows::FencedTransactionError;
pub use batch::MAX_BATCH;
pub use config::{MysqlOptions, MysqlUrl, TableName, DEFAULT_TABLE, MAX_TABLE_NAME_BYTES};
pub use schema::{FENCING_PRIVILEGES, GC_PRIVILEGES, PROCEDURE_PRIVILEGES, TABLE_PRIVILEGES};
pub use sql::SCHEMA_VERSION;

use config::{describe, parse_url};
use conn::PINNED_SESSION;
use sql::Sql;

const KIND: &str = "mysql";

/// The MySQL / MariaDB store. See the module docs for its guarantees and
/// what it does not support.
///
/// Connections are opened on first use ([`MysqlStore::initialize`] does
/// it at once). Share one value per process (in an `Arc`): each value has
/// its own pool.
pub struct MysqlStore {
    pool: Pool,
    sql: Arc<Sql>,
    options: MysqlOptions,
    shown: String,
    migrated: OnceCell<()>,
}

impl fmt::Debug for MysqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlStore")
            .field("server", &self.shown)
            .field("table", &self.options.table)
            .finish()
    }
}

impl MysqlStore {
    /// A store for a `mysql://` or `mariadb://` URL (see [`MysqlUrl`]) with
    /// default [`MysqlOptions`], the URL's `table` and its `pool_max` (if
    /// given). Nothing is connected yet.
    ///
    /// TLS (feature `mysql-tls`): `ssl-mode=REQUIRED` encrypts without
    /// verifying the server's certificate (MySQL's meaning: use it only
    /// where the network is trusted), `VERIFY_CA` verifies its chain and
    /// `VERIFY_IDENTITY` also its name, against the PEM file `ssl-ca=PATH`
    /// or, without it, the built-in web roots. Without `ssl-mode`, or with
    /// `DISABLED`, connections are plain. With TLS, connections to a
    /// loopback address do not try the server's Unix socket first (an
    /// attempt that fails under TLS) unless the URL sets `prefer_socket`.
    ///
    /// `VERIFY_CA` checks the name too for now: mysql_async 0.37.1 never
    /// skips a name mismatch under rustls 0.23 (blackbeam/mysql_async#404,
    /// fixed upstream by #408, not yet released), so it fails closed and
    /// acts as `VERIFY_IDENTITY`.
    ///
    /// # Errors
    /// [`InvalidInput::StoreUrl`] (URL redacted) for a malformed URL, or a
    /// TLS setting in a build without `mysql-tls`; a [`StoreError`] when
    /// `ssl-ca` cannot be read.
    pub fn from_url(url: &str) -> Result<Self> {
        let parts = parse_url(url)?;
        let max = parts.opts.pool_opts().constraints().max();
        let mut options = MysqlOptions::new().table(parts.table);
        if url.contains("pool_max=") {
            options = options.max_connections(max);
        }
        #[cfg(feature = "mysql-tls")]
        let opts = {
            let tls = tls::ssl_opts(parts.ssl_mode, parts.ssl_ca.as_deref())?;
            // mysql_async tries to move a loopback TCP connection to the
            // server's Unix socket (`prefer_socket`, on by default); with
            // TLS it asks for TLS there and never starts it, so every new
            // connection costs one the server counts as aborted. With TLS
            // asked for, stay on TCP unless the URL says otherwise.
            let keep_tcp = tls.is_some() && !url.contains("prefer_socket=");
            let mut builder = OptsBuilder::from_opts(parts.opts).ssl_opts(tls);
            if keep_tcp {
                builder = builder.prefer_socket(false);
            }
            mysql_async::Opts::from(builder)
        };
        #[cfg(not(feature = "mysql-tls"))]
        let opts = parts.opts;
        Self::new(opts, options)
    }

    /// A store over mysql_async's connection options (its TLS settings
    /// included); the pool's size and connection lifetime come from
    /// `options`. Nothing is connected yet.
    ///
    /// # Errors
    /// A [`StoreError`] when the pool's limits are inconsistent.
    pub fn new(opts: mysql_async::Opts, options: MysqlOptions) -> Result<Self> {
        let shown = format!("{} (table {})", describe(&opts), options.table);
        let constraints = PoolConstraints::new(0, options.max_connections)
            .ok_or_else(|| StoreError::new(KIND, format!("invalid pool size for {shown}")))?;
        let pool_opts = opts
            .pool_opts()
            .clone()
            .with_constraints(constraints)
            .with_reset_connection(false)
            .with_abs_conn_ttl(options.max_connection_lifetime);
        let mut setup = opts.setup().to_vec();
        setup.push(PINNED_SESSION.to_string());
        let opts = OptsBuilder::from_opts(opts)
            .pool_opts(pool_opts)
            .setup(setup);
        Ok(Self {
            pool: Pool::new(opts),
            sql: Arc::new(Sql::new(&options.table)),
            shown,
            options,
            migrated: OnceCell::new(),
        })
    }

    /// The lease table.
    pub fn table(&self) -> &TableName {
        &self.options.table
    }

    /// The connection pool, for the application's own statements on the
    /// same database (prefer [`MysqlStore::fenced_transaction`] for
    /// writes that must be fenced).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Connects now rather than on first use: creates or checks the table,
    /// its fencing table and its procedures. Every operation does this
    /// first; calling it early only moves connection errors to start-up.
    ///
    /// # Errors
    /// A [`StoreError`] when the server cannot be reached, lacks
    /// `JSON_TABLE`, the table cannot be created, is not a worklease table,
    /// or has a newer schema.
    pub async fn initialize(&self) -> Result<()> {
        self.migrated.get_or_try_init(|| self.migrate()).await?;
        Ok(())
    }
}
