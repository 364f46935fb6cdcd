//! The PostgreSQL store (feature `postgres`): many hosts, one database.
//!
//! * **One statement per operation.** Acquire, renew, checkpoint, read,
//!   release, inspect and revoke are each ONE SQL statement (one round trip
//!   on a pooled connection whose prepared statement is cached; preparing
//!   it costs one more, once per connection), decided inside the server;
//!   so are the batches (below). Acquire is an `INSERT ... ON CONFLICT DO UPDATE ...
//!   WHERE` that succeeds only when the row is free, released or expired;
//!   a CTE locks the current row first, so that a `Held` answer still names
//!   the holder and its remaining time from the same statement. Renew,
//!   checkpoint and release are `UPDATE`s conditioned on the work ID, the
//!   holder ID and the fencing token, and the same statement tells `Fenced`
//!   (taken over, revoked, never issued) from `Expired` (current but
//!   expired or released), with the rules of the other stores
//!   (`store/record.rs`).
//! * **Clock.** Expiry is judged by the server's `clock_timestamp()` only
//!   (the crate docs' "Clocks", ADR 0001), read once per statement. A lease is live
//!   while `expires_at >= clock_timestamp()`; `expires_at` is the server
//!   time at which the statement began plus the TTL in whole milliseconds,
//!   rounded up ([`crate::limits`]), so the server never ends a lease
//!   before its holder's own deadline (send time + TTL). The server's clock
//!   counts microseconds, so nothing is lost below the millisecond.
//! * **Fencing.** Tokens come from one PostgreSQL `SEQUENCE` per table
//!   (`<table>_fencing_seq`, `CACHE 1`), shared by all work IDs: global,
//!   as in the Go original (v0.5), where per work ID is the minimum the
//!   contract asks. A sequence never goes back: not after a release, an
//!   expiry, a `DELETE` of the row by an operator, a server restart or a
//!   crash (its WAL record is flushed by the commit of the acquisition
//!   that used the value). Values drawn by failed attempts
//!   leave gaps, which fencing allows. The sequence is deliberately not
//!   owned by the table: `DROP TABLE` leaves it, so a table created again
//!   under the same name keeps issuing larger tokens than before. To
//!   remove a store for good, drop both: `DROP TABLE t; DROP SEQUENCE
//!   t_fencing_seq;`. An acquisition also takes at least
//!   the row's token + 1, so a sequence reset by hand cannot make a work
//!   ID's tokens go back. Requires `synchronous_commit` on (the default) for
//!   the crash guarantee.
//! * **No session state.** A lease is a row; no advisory lock or other
//!   session state holds it, so pooled connections that are recycled,
//!   dropped or reset change nothing.
//! * **Push hand-off.** Release and revocation call `pg_notify` inside the
//!   same statement, on the channel `worklease:<table>` with the work ID as
//!   payload; a release only when a waiter has marked the row `wanted`
//!   (a waiting acquisition that is told `Held` sets the mark in its own
//!   statement, under the same row lock as the release, so no wake-up is
//!   lost), because `NOTIFY` takes a server-wide lock at commit that would
//!   serialize every release. Each store keeps ONE dedicated connection that `LISTEN`s on
//!   the channel and wakes the waiters of that work ID (after a random
//!   jitter of up to [`PostgresOptions::wake_jitter`], so many waiters do
//!   not stampede); it reconnects when it drops and then wakes every waiter,
//!   since notifications may have been missed. Polling stays the fallback.
//!   Expiry sends no notification (no server-side timer): waiters of an
//!   expiring lease wake at its expiry by their poll schedule.
//! * **Batches.** [`LeaseStore::renew_many`], [`LeaseStore::release_many`]
//!   and [`LeaseStore::acquire_many`] are each ONE statement over arrays
//!   (`unnest`), one round trip, for up to [`MAX_BATCH`] (2,000) leases
//!   (why that many: [`MAX_BATCH`]); each lease gets the verdict its single
//!   call would have given, by the same rules. A statement is one
//!   transaction: its changes commit together or not at all (then the call
//!   fails as a whole). Every batch statement locks its rows in work-ID
//!   order, and locks all of them before it changes any, so batches racing
//!   each other and single calls never deadlock (the application's own
//!   statements in a fenced transaction aside); a row locked by another
//!   statement is waited for (not skipped with `SKIP LOCKED`, which would
//!   leave its outcome unknown), so a batch takes as long as the slowest
//!   statement it meets on one of its rows (a fenced transaction's whole
//!   body, for its row). The verdicts are therefore not taken at one
//!   instant, but each at the moment its row was locked. A batch
//!   acquisition tries the work IDs in order and grants the first `max`
//!   that are free by their locked rows; work IDs never seen are inserted
//!   (in work-ID order, `ON CONFLICT DO NOTHING`) with tokens from the same
//!   sequence. When a concurrent first acquisition inserts one of them
//!   after the statement began, the statement decides nothing for it, and
//!   one more statement tries those work IDs first, then the untried rest
//!   (the single acquisition runs its statement again in that case): such
//!   a batch costs more than one round trip and is not one transaction.
//!   A batch release sends one `NOTIFY` per released work ID that a waiter
//!   marked, all in its one statement.
//! * **Fenced writes.** [`PostgresStore::fenced_transaction`] runs the
//!   caller's SQL in a transaction that first locks the lease row and
//!   checks the token: the way to fence writes to tables in the same
//!   database.
//! * **Schema.** One table (default [`DEFAULT_TABLE`], configurable, for
//!   example per application or per test run) and its sequence, created on
//!   first use inside one transaction under `pg_advisory_xact_lock`, so many
//!   processes may start at once. The table's comment records the schema
//!   version ([`SCHEMA_VERSION`]); a table without it is refused as not a
//!   worklease table, and a newer version as written by a newer worklease.
//!   Least privilege: a role that may not create them runs with only
//!   [`TABLE_PRIVILEGES`] on the table and [`SEQUENCE_PRIVILEGES`] on the
//!   sequence once an owner ran [`TableName::ddl`]; without `CREATE` and
//!   without the table, the error carries that DDL.
//!
//! * **Session settings.** Every pooled connection pins, when it opens,
//!   the settings the statements rely on, whatever the database or role
//!   defaults to: READ COMMITTED as the transaction isolation level, and
//!   `synchronous_commit` on where a default turned it off (what each is
//!   for: `PINNED_SESSION` in `pool.rs`). Transient failures (a
//!   serialization failure, a deadlock's victim, a lock or statement
//!   timeout: the statement was rolled back whole) run the statement again
//!   after a short jittered pause, a few times (about 0.5 s at most), then
//!   are store errors, which a waiting acquisition waits through and
//!   renewal retries. Not pinned, and so the role's: `search_path` (an
//!   unqualified table name resolves by it: give processes of different
//!   roles a schema-qualified name), `statement_timeout` and `lock_timeout`
//!   (a statement they cancel is retried as above),
//!   `default_transaction_read_only` (a read-only default refuses every
//!   write, with the server's error).
//!
//! Not supported: connection poolers in transaction mode (prepared
//! statements and `LISTEN` need a session: point the store at PostgreSQL or
//! at a session-mode pool); reading from replicas (every statement writes
//! or must see the latest row). A statement that hangs (a frozen server)
//! is bounded by the lease layer's deadlines for renewals, not by the
//! store.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::{sync::Arc, time::Duration};
//! use worklease::store::postgres::PostgresStore;
//! use worklease::{AcquireOptions, Config, Leases};
//!
//! let store = Arc::new(PostgresStore::from_url(
//!     "postgres://app@db.internal:5432/app?table=worklease_leases",
//! )?);
//! let leases = Leases::new(store.clone(), Config::new("worker-1", Duration::from_secs(15)))?;
//! let token = leases.acquire("shard-7", AcquireOptions::new()).await?;
//! // A write to the application's own table, fenced by the lease: it
//! // commits only while the token is current.
//! store
//!     .fenced_transaction(&token, |tx| {
//!         Box::pin(async move {
//!             tx.execute("UPDATE shards SET done = true WHERE id = 7", &[])
//!                 .await
//!         })
//!     })
//!     .await?;
//! leases.release(token).await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::{Arc, OnceLock};

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures_util::stream::StreamExt;
use tokio::sync::{watch, OnceCell};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{NoTls, Socket};
use tokio_util::sync::CancellationToken;

pub use deadpool_postgres;
pub use tokio_postgres;

#[cfg(doc)]
use crate::error::InvalidInput;
use crate::error::{Result, StoreError};
#[cfg(doc)]
use crate::store::LeaseStore;

mod batch;
mod config;
mod fenced;
mod listener;
mod ops;
mod pool;
mod schema;
mod sql;
#[cfg(feature = "postgres-tls")]
mod tls;

pub use crate::store::sql_rows::FencedTransactionError;
pub use batch::MAX_BATCH;
pub use config::{
    PostgresOptions, PostgresUrl, TableName, DEFAULT_TABLE, MAX_QUALIFIED_NAME_BYTES,
    MAX_TABLE_NAME_BYTES,
};
pub use schema::{GC_PRIVILEGES, SCHEMA_VERSION, SEQUENCE_PRIVILEGES, TABLE_PRIVILEGES};

use config::{describe, parse_url};
use listener::{listen, ListenerConnect, MessageStream, Shared};
use pool::PINNED_SESSION;
use sql::Sql;
#[cfg(feature = "postgres-tls")]
use tls::rustls_connector;

const KIND: &str = "postgres";

/// The PostgreSQL store. See the module docs for its guarantees and what it
/// does not support.
///
/// Connections are opened on first use ([`PostgresStore::initialize`]
/// does it at once). Share one value per process (in an `Arc`): each
/// value has its own pool and its own listening connection.
pub struct PostgresStore {
    pool: Pool,
    sql: Arc<Sql>,
    options: PostgresOptions,
    shown: String,
    channel: String,
    shared: Arc<Shared>,
    migrated: OnceCell<()>,
    listener_started: OnceLock<()>,
    listener_connect: ListenerConnect,
    /// True once the listener made its first connection attempt.
    listener_tried: (watch::Sender<bool>, watch::Receiver<bool>),
    stop: CancellationToken,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("server", &self.shown)
            .field("table", &self.options.table)
            .finish()
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl PostgresStore {
    /// A store for a `postgres://` URL (see [`PostgresUrl`]) with default
    /// [`PostgresOptions`] and the URL's `table`. Nothing is connected yet.
    ///
    /// TLS (feature `postgres-tls`): with `sslmode=require` (or
    /// `verify-full`) every connection uses TLS (rustls) and verifies the
    /// server's certificate and name against the PEM file
    /// `sslrootcert=PATH` or, without it, the system's roots. Without
    /// `sslmode`, or with `prefer` or `disable`, connections are plain (a
    /// TLS attempt that cannot verify would otherwise fail where libpq's
    /// `prefer` goes on). For other TLS set-ups use
    /// [`PostgresStore::with_tls`].
    ///
    /// # Errors
    /// [`InvalidInput::StoreUrl`] (URL redacted) for a malformed URL, or a
    /// TLS setting in a build without `postgres-tls`; a [`StoreError`] when
    /// `sslrootcert` cannot be read or no root certificate is found.
    pub fn from_url(url: &str) -> Result<Self> {
        let parts = parse_url(url)?;
        let options = PostgresOptions::new().table(parts.table);
        #[cfg(feature = "postgres-tls")]
        if parts.tls {
            let tls = rustls_connector(parts.root_cert.as_deref())?;
            return Self::with_tls(parts.config, options, tls);
        }
        Self::new(parts.config, options)
    }

    /// A store over a tokio-postgres configuration, without TLS. Nothing is
    /// connected yet.
    ///
    /// # Errors
    /// A [`StoreError`] when the pool cannot be built.
    pub fn new(config: tokio_postgres::Config, options: PostgresOptions) -> Result<Self> {
        Self::with_tls(config, options, NoTls)
    }

    /// A store over a tokio-postgres configuration whose connections (the
    /// pool's and the listener's) use `tls`, for example a
    /// `tokio_postgres_rustls::MakeRustlsConnect` or a
    /// `postgres_native_tls::MakeTlsConnector`; `sslmode` in the
    /// configuration decides whether TLS is required. Nothing is connected
    /// yet.
    ///
    /// # Errors
    /// A [`StoreError`] when the pool cannot be built.
    pub fn with_tls<T>(
        mut config: tokio_postgres::Config,
        options: PostgresOptions,
        tls: T,
    ) -> Result<Self>
    where
        T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
        T::Stream: Sync + Send,
        T::TlsConnect: Sync + Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        if config.get_application_name().is_none() {
            config.application_name("worklease");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(options.connect_timeout);
        }
        let shown = format!("{} (table {})", describe(&config), options.table);
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let mut builder = Pool::builder(manager)
            .max_size(options.max_connections)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.connect_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.connect_timeout));
        // The session settings the statements rely on, on every new
        // connection, whatever the database or role defaults to.
        builder = builder.post_create(Hook::async_fn(|client, _| {
            Box::pin(async move {
                client
                    .batch_execute(PINNED_SESSION)
                    .await
                    .map_err(HookError::Backend)
            })
        }));
        if let Some(lifetime) = options.max_connection_lifetime {
            builder = builder.pre_recycle(Hook::sync_fn(move |_, metrics| {
                if metrics.age() >= lifetime {
                    Err(HookError::message(
                        "connection reached its maximum lifetime",
                    ))
                } else {
                    Ok(())
                }
            }));
        }
        let pool = builder.build().map_err(|e| {
            StoreError::with_source(KIND, format!("cannot build the pool for {shown}"), e)
        })?;
        let listener_connect: ListenerConnect = Arc::new(move || {
            let (config, tls) = (config.clone(), tls.clone());
            Box::pin(async move {
                let (client, mut connection) = config.connect(tls).await?;
                let messages: MessageStream =
                    futures_util::stream::poll_fn(move |cx| connection.poll_message(cx)).boxed();
                Ok((client, messages))
            })
        });
        Ok(Self {
            pool,
            sql: Arc::new(Sql::new(&options.table)),
            channel: options.table.channel(),
            shown,
            options,
            shared: Arc::new(Shared::default()),
            migrated: OnceCell::new(),
            listener_started: OnceLock::new(),
            listener_connect,
            listener_tried: watch::channel(false),
            stop: CancellationToken::new(),
        })
    }

    /// The lease table.
    pub fn table(&self) -> &TableName {
        &self.options.table
    }

    /// The notification channel (`worklease:<table>`).
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// The connection pool, for the application's own statements on the
    /// same database (prefer [`PostgresStore::fenced_transaction`] for
    /// writes that must be fenced).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Connects now rather than on first use: creates or checks the table
    /// and starts the listener (waiting for its first connection attempt).
    /// Every operation does this first; calling it early only moves
    /// connection errors to start-up.
    ///
    /// # Errors
    /// A [`StoreError`] when the server cannot be reached, the table cannot
    /// be created, is not a worklease table, or has a newer schema.
    pub async fn initialize(&self) -> Result<()> {
        self.migrated.get_or_try_init(|| self.migrate()).await?;
        if self.listener_started.set(()).is_ok() {
            tokio::spawn(listen(
                self.listener_connect.clone(),
                self.channel.clone(),
                self.shared.clone(),
                self.stop.clone(),
                self.listener_tried.0.clone(),
                self.options.connect_timeout,
            ));
        }
        let mut tried = self.listener_tried.1.clone();
        // An error means the listener has stopped: operations go on, and
        // waiters poll.
        let _ = tried.wait_for(|t| *t).await;
        Ok(())
    }
}
