//! The PostgreSQL store (feature `postgres`): many hosts, one database.
//!
//! * **One statement per operation.** Acquire, renew, checkpoint, read,
//!   release, inspect and revoke are each ONE SQL statement (one round trip
//!   on a pooled connection whose prepared statement is cached), decided
//!   inside the server. Acquire is an `INSERT ... ON CONFLICT DO UPDATE ...
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

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures_util::future::BoxFuture;
use futures_util::stream::{BoxStream, StreamExt};
use rand::Rng;
use tokio::sync::{watch, OnceCell};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, NoTls, Row, Socket};
use tokio_util::sync::CancellationToken;

pub use deadpool_postgres;
pub use tokio_postgres;

use crate::error::{Error, InvalidInput, Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::notify::Watchers;
use crate::store::record::{self, Phase};
use crate::store::url_parts::url_error;
use crate::store::{
    Checkpoint, Grant, Handoff, LeaseEnd, LeaseInfo, LeaseRef, LeaseStore, PreviousHolder,
};
use crate::token::Token;

const KIND: &str = "postgres";

/// The schema version this code writes, recorded in the table's comment.
pub const SCHEMA_VERSION: u32 = 1;

/// The table name used when none is configured.
pub const DEFAULT_TABLE: &str = "worklease_leases";

/// The longest table name (without schema), in bytes: leaves room for the
/// sequence's suffix `_fencing_seq` within PostgreSQL's 63-byte names.
pub const MAX_TABLE_NAME_BYTES: usize = 48;

/// The longest `schema.table` (or `table`), in bytes: the notification
/// channel `worklease:<schema.table>` must fit PostgreSQL's 63-byte names.
pub const MAX_QUALIFIED_NAME_BYTES: usize = 63 - CHANNEL_PREFIX.len();

const CHANNEL_PREFIX: &str = "worklease:";
const SEQUENCE_SUFFIX: &str = "_fencing_seq";
const COMMENT_PREFIX: &str = "worklease lease table, schema version ";

/// The first wait before the listener reconnects; doubled per failure.
const LISTEN_RETRY_INITIAL: Duration = Duration::from_millis(100);
/// The longest wait between the listener's reconnection attempts.
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(5);

/// The name of the lease table: `table` or `schema.table`, each part
/// matching `^[a-z_][a-z0-9_]*$` (lower-case, so it never needs case
/// folding), the table at most [`MAX_TABLE_NAME_BYTES`] bytes and the whole
/// at most [`MAX_QUALIFIED_NAME_BYTES`]. Always quoted in SQL. The schema
/// must exist; an unqualified table goes where `search_path` puts it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: Option<String>,
    table: String,
}

impl TableName {
    /// Checks and wraps a table name.
    ///
    /// # Errors
    /// [`InvalidInput::Config`] naming the rule `name` breaks.
    pub fn new(name: &str) -> Result<Self, InvalidInput> {
        let bad = |why: String| {
            InvalidInput::Config(format!(
                "PostgreSQL table name {name:?}: {why} (expected table or schema.table, \
                 each part matching ^[a-z_][a-z0-9_]*$)"
            ))
        };
        let (schema, table) = match name.split_once('.') {
            Some((s, t)) => (Some(s), t),
            None => (None, name),
        };
        for part in schema.iter().chain([&table]) {
            let mut chars = part.chars();
            let first_ok = chars
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
            if !first_ok || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                return Err(bad(format!("{part:?} is not a plain lower-case name")));
            }
        }
        if table.len() > MAX_TABLE_NAME_BYTES {
            return Err(bad(format!(
                "the table name is {} bytes: the limit is {MAX_TABLE_NAME_BYTES}",
                table.len()
            )));
        }
        if name.len() > MAX_QUALIFIED_NAME_BYTES {
            return Err(bad(format!(
                "the name is {} bytes: the limit is {MAX_QUALIFIED_NAME_BYTES} \
                 (the notification channel must fit 63 bytes)",
                name.len()
            )));
        }
        Ok(Self {
            schema: schema.map(str::to_string),
            table: table.to_string(),
        })
    }

    /// The table as quoted SQL: `"table"` or `"schema"."table"`.
    pub fn quoted(&self) -> String {
        self.quoted_with(&self.table)
    }

    /// The fencing sequence as quoted SQL: `"<table>_fencing_seq"`, in the
    /// table's schema.
    pub fn sequence_quoted(&self) -> String {
        self.quoted_with(&format!("{}{SEQUENCE_SUFFIX}", self.table))
    }

    /// The notification channel: `worklease:<schema.table>`.
    pub fn channel(&self) -> String {
        format!("{CHANNEL_PREFIX}{self}")
    }

    fn quoted_with(&self, name: &str) -> String {
        match &self.schema {
            Some(s) => format!("\"{s}\".\"{name}\""),
            None => format!("\"{name}\""),
        }
    }
}

impl Default for TableName {
    fn default() -> Self {
        Self {
            schema: None,
            table: DEFAULT_TABLE.to_string(),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "{s}.{}", self.table),
            None => f.write_str(&self.table),
        }
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_string(), f)
    }
}

/// Settings of a [`PostgresStore`] beyond the connection itself.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    table: TableName,
    max_connections: usize,
    connect_timeout: Duration,
    wake_jitter: Duration,
    max_connection_lifetime: Option<Duration>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            table: TableName::default(),
            max_connections: 16,
            connect_timeout: Duration::from_secs(5),
            wake_jitter: Duration::from_millis(5),
            max_connection_lifetime: None,
        }
    }
}

impl PostgresOptions {
    /// Defaults: table [`DEFAULT_TABLE`], at most 16 pooled connections, a
    /// 5 s connect timeout, a wake jitter of up to 5 ms, connections kept
    /// as long as they work.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lease table (see [`TableName`]).
    pub fn table(mut self, table: TableName) -> Self {
        self.table = table;
        self
    }

    /// The most pooled connections (at least 1; the listener's connection
    /// comes on top).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long opening a connection, or waiting for a free one in the
    /// pool, may take before the call fails with a store error. Applies
    /// where the connection settings name no `connect_timeout` of their own.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// A woken waiter waits a random time from zero to this before its
    /// attempt, so that the waiters of one release do not all try at the
    /// same instant. Zero turns it off.
    pub fn wake_jitter(mut self, jitter: Duration) -> Self {
        self.wake_jitter = jitter;
        self
    }

    /// Closes pooled connections older than this when they come back to the
    /// pool (for servers or proxies that want connections refreshed).
    /// Default: never.
    pub fn max_connection_lifetime(mut self, lifetime: Duration) -> Self {
        self.max_connection_lifetime = Some(lifetime);
        self
    }

    /// The configured table.
    pub fn table_name(&self) -> &TableName {
        &self.table
    }
}

/// A `postgres://` (or `postgresql://`) store URL, checked: the connection
/// settings tokio-postgres accepts (`postgres://user:password@host:port/db?
/// sslmode=...&application_name=...`) plus `table=NAME` for the lease
/// table (see [`TableName`]). Its `Debug` form hides the password
/// ([`crate::store::url::redact`]); [`PostgresUrl::as_str`] does not, since
/// a child process needs it to connect.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresUrl {
    url: String,
}

impl PostgresUrl {
    /// Checks a URL.
    ///
    /// # Errors
    /// [`InvalidInput::StoreUrl`] (URL redacted) for another scheme, a
    /// malformed or unknown connection setting, or a bad table name.
    pub fn parse(url: &str) -> Result<Self> {
        let _ = parse_url(url)?;
        Ok(Self {
            url: url.trim().to_string(),
        })
    }

    /// The URL as given, password included: keep it out of logs (use
    /// [`crate::store::url::redact`]).
    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// Opens the store the URL names (connecting lazily, on first use).
    ///
    /// # Errors
    /// As [`PostgresStore::from_url`].
    pub fn open(&self) -> Result<PostgresStore> {
        PostgresStore::from_url(&self.url)
    }
}

impl fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&crate::store::url_parts::redact(&self.url), f)
    }
}

/// A parsed URL: tokio-postgres's settings and ours.
#[cfg_attr(test, derive(Debug))]
#[cfg_attr(not(feature = "postgres-tls"), allow(dead_code))]
struct UrlParts {
    config: tokio_postgres::Config,
    table: TableName,
    /// `sslrootcert`: a PEM file of the certificates to trust.
    root_cert: Option<std::path::PathBuf>,
    /// TLS is asked for (`sslmode=require` or `verify-full`).
    tls: bool,
}

/// Splits the worklease settings (`table`, `sslrootcert`) off a URL, maps
/// `sslmode=verify-full` to tokio-postgres's `require` (which verifies
/// here), and parses the rest with tokio-postgres.
fn parse_url(url: &str) -> Result<UrlParts> {
    let url = url.trim();
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(url_error(url, "a PostgreSQL URL starts with postgres://"));
    };
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "postgres" && scheme != "postgresql" {
        return Err(url_error(url, "a PostgreSQL URL starts with postgres://"));
    }
    let (base, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let mut table = TableName::default();
    let mut root_cert = None;
    let mut kept: Vec<&str> = Vec::new();
    // A parameter given twice is refused: "last one wins" would let a
    // copy-paste slip put two fleets on two tables.
    let mut seen = std::collections::HashSet::new();
    for param in query.into_iter().flat_map(|q| q.split('&')) {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| url_error(url, format!("query parameter {key:?} is not UTF-8")))
        };
        let name = decode(key)?;
        if !param.is_empty() && !seen.insert(name.clone()) {
            return Err(url_error(
                url,
                format!("the parameter {name:?} appears twice"),
            ));
        }
        match name.as_str() {
            "table" => {
                table =
                    TableName::new(&decode(value)?).map_err(|e| url_error(url, e.to_string()))?
            }
            "sslrootcert" => root_cert = Some(std::path::PathBuf::from(decode(value)?)),
            "sslmode" if decode(value)? == "verify-full" => kept.push("sslmode=require"),
            _ if param.is_empty() => {}
            _ => kept.push(param),
        }
    }
    let rebuilt = if kept.is_empty() {
        format!("{scheme}://{base}")
    } else {
        format!("{scheme}://{base}?{}", kept.join("&"))
    };
    let config = tokio_postgres::Config::from_str(&rebuilt).map_err(|e| {
        url_error(
            url,
            format!("{e} (settings are tokio-postgres's, plus table=NAME and sslrootcert=PATH)"),
        )
    })?;
    let tls = matches!(
        config.get_ssl_mode(),
        tokio_postgres::config::SslMode::Require
    );
    if (tls || root_cert.is_some()) && !cfg!(feature = "postgres-tls") {
        return Err(url_error(
            url,
            "sslmode=require, verify-full and sslrootcert need the cargo feature `postgres-tls`",
        ));
    }
    Ok(UrlParts {
        config,
        table,
        root_cert,
        tls,
    })
}

/// The rustls connector of `postgres-tls`: trusts the certificates of the
/// PEM file `root_cert`, or else the system's roots (`SSL_CERT_FILE` and
/// `SSL_CERT_DIR` are honoured), and verifies the server's name.
#[cfg(feature = "postgres-tls")]
fn rustls_connector(
    root_cert: Option<&std::path::Path>,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    let tls_err = |what: String| StoreError::new(KIND, what);
    let mut roots = rustls::RootCertStore::empty();
    match root_cert {
        Some(path) => {
            let shown = path.display();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| tls_err(format!("cannot read sslrootcert {shown}: {e}")))?;
            for cert in certs {
                let cert =
                    cert.map_err(|e| tls_err(format!("cannot read sslrootcert {shown}: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| tls_err(format!("sslrootcert {shown}: {e}")))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (_, ignored) = roots.add_parsable_certificates(found.certs);
            if ignored > 0 || !found.errors.is_empty() {
                tracing::debug!(
                    ignored,
                    errors = found.errors.len(),
                    "some system root certificates were not usable"
                );
            }
        }
    }
    if roots.is_empty() {
        return Err(tls_err(
            "no trusted root certificates for TLS: name a PEM file with sslrootcert=PATH".into(),
        )
        .into());
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| StoreError::with_source(KIND, "cannot set up TLS", e))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// How the error of a failed fenced transaction came about.
#[derive(Debug, thiserror::Error)]
pub enum FencedTransactionError<E> {
    /// The lease check failed ([`Error::Fenced`], [`Error::Expired`]) or the
    /// store did (connecting, beginning, locking, committing:
    /// [`Error::Store`]). Nothing was written, except that a commit that
    /// failed for a lost connection may or may not have committed.
    #[error(transparent)]
    Lease(Error),
    /// The caller's body returned an error; the transaction was rolled back.
    #[error("the body of a fenced transaction failed; it was rolled back")]
    Body(#[source] E),
}

/// The SQL texts of one table.
struct Sql {
    acquire: String,
    renew: String,
    checkpoint: String,
    release: String,
    read: String,
    inspect: String,
    revoke: String,
    lock_current: String,
}

/// The verdict of a token check, as SQL: `fenced` when the row is missing,
/// names another acquisition or was revoked; `expired` when it is this
/// acquisition but released or past its expiry; else `ok`. The same rules
/// as `record::check_current`.
fn verdict_sql(l: &str) -> String {
    format!(
        "CASE WHEN {l}.holder_id IS NULL OR {l}.holder_id <> $2::text \
              OR {l}.fencing_token <> $3::bigint OR {l}.phase = 'revoked' THEN 'fenced' \
         WHEN {l}.phase = 'released' OR NOT {l}.unexpired THEN 'expired' \
         ELSE 'ok' END"
    )
}

impl Sql {
    fn new(table: &TableName) -> Self {
        let t = table.quoted();
        let seq = table.sequence_quoted();
        let now = "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t)";
        let ms = "interval '1 millisecond'";
        let remaining = "(EXTRACT(EPOCH FROM (l.expires_at - now.t)) * 1000000)::bigint";
        // The current row, locked: the latest committed version, also when
        // a concurrent statement changed it after this one began.
        let cur = format!(
            "cur AS MATERIALIZED (\
                SELECT l.holder_id, l.fencing_token, l.phase, l.wanted, \
                       (l.expires_at >= now.t) AS unexpired, {remaining} AS remaining_us \
                FROM {t} AS l, now WHERE l.work_id = $1::text FOR UPDATE OF l)"
        );
        let acquire = format!(
            "{now}, {cur}, \
             up AS (\
                INSERT INTO {t} AS l (work_id, holder_id, fencing_token, ttl_ms, phase, acquired_at, expires_at) \
                SELECT $1::text, $2::text, nextval('{seq}'::regclass), $3::bigint, 'held', now.t, \
                       now.t + $3::bigint * {ms} \
                FROM now WHERE (SELECT count(*) FROM cur) >= 0 \
                ON CONFLICT (work_id) DO UPDATE SET \
                    holder_id = EXCLUDED.holder_id, \
                    fencing_token = GREATEST(EXCLUDED.fencing_token, l.fencing_token + 1), \
                    ttl_ms = EXCLUDED.ttl_ms, phase = 'held', \
                    acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at, \
                    prev_holder_id = l.holder_id, prev_fencing_token = l.fencing_token, \
                    prev_end = CASE WHEN l.phase = 'held' THEN 'expired' ELSE l.phase END, \
                    wanted = false \
                WHERE l.phase <> 'held' OR l.expires_at < EXCLUDED.acquired_at \
                RETURNING l.fencing_token, l.prev_holder_id, l.prev_fencing_token, l.prev_end), \
             mark AS (\
                UPDATE {t} AS l SET wanted = true \
                WHERE l.work_id = $1::text AND $4::boolean AND NOT l.wanted \
                  AND NOT EXISTS (SELECT 1 FROM up) \
                RETURNING 1) \
             SELECT up.fencing_token, up.prev_holder_id, up.prev_fencing_token, up.prev_end, \
                    NULL::text AS holder_id, NULL::bigint AS remaining_us FROM up \
             UNION ALL \
             SELECT NULL, NULL, NULL, NULL, cur.holder_id, GREATEST(cur.remaining_us, 0) \
             FROM cur WHERE NOT EXISTS (SELECT 1 FROM up)"
        );
        // Renew, checkpoint and release: update the row only for the
        // current, live acquisition; the verdict comes from the locked row.
        let update = |set: &str, notify: bool| {
            let (n_cte, n_col) = if notify {
                (
                    ", n AS (SELECT pg_notify($4::text, $1::text) FROM up, cur WHERE cur.wanted)",
                    ", (SELECT count(*) FROM n) AS notified",
                )
            } else {
                ("", "")
            };
            let verdict = verdict_sql("cur");
            format!(
                "{now}, {cur}, \
                 up AS (\
                    UPDATE {t} AS l SET {set} FROM now \
                    WHERE l.work_id = $1::text AND l.holder_id = $2::text \
                      AND l.fencing_token = $3::bigint AND l.phase = 'held' \
                      AND l.expires_at >= now.t AND (SELECT count(*) FROM cur) >= 0 \
                    RETURNING l.work_id){n_cte} \
                 SELECT CASE WHEN EXISTS (SELECT 1 FROM up) THEN 'ok' ELSE {verdict} END AS verdict{n_col} \
                 FROM now LEFT JOIN cur ON true"
            )
        };
        let extend = format!("ttl_ms = $4::bigint, expires_at = now.t + $4::bigint * {ms}");
        let read_verdict = verdict_sql("r");
        let read = format!(
            "{now}, \
             r AS (SELECT l.*, (l.expires_at >= now.t) AS unexpired FROM {t} AS l, now \
                   WHERE l.work_id = $1::text), \
             v AS (SELECT {read_verdict} AS verdict, r.checkpoint, r.prev_holder_id, \
                          r.prev_fencing_token, r.prev_end \
                   FROM now LEFT JOIN r ON true) \
             SELECT verdict, CASE WHEN verdict = 'ok' THEN checkpoint END, \
                    prev_holder_id, prev_fencing_token, prev_end FROM v"
        );
        let info_cols = format!(
            "l.work_id, l.holder_id, l.fencing_token, l.phase, (l.expires_at >= now.t) AS unexpired, \
             {remaining} AS delta_us, COALESCE(octet_length(l.checkpoint), 0)::bigint AS checkpoint_bytes, \
             l.prev_holder_id, l.prev_fencing_token, l.prev_end"
        );
        let inspect = format!(
            "{now} SELECT {info_cols} FROM {t} AS l, now \
             WHERE cardinality($1::text[]) = 0 OR l.work_id = ANY($1::text[]) \
             ORDER BY l.work_id"
        );
        let revoke = format!(
            "{now}, \
             before AS MATERIALIZED (SELECT {info_cols} FROM {t} AS l, now \
                                     WHERE l.work_id = $1::text FOR UPDATE OF l), \
             up AS (\
                UPDATE {t} AS l SET phase = 'revoked', expires_at = now.t FROM now \
                WHERE l.work_id = $1::text AND l.phase = 'held' AND l.expires_at >= now.t \
                  AND (SELECT count(*) FROM before) >= 0 \
                RETURNING l.work_id), \
             n AS (SELECT pg_notify($2::text, $1::text) FROM up) \
             SELECT before.*, (SELECT count(*) FROM n) AS notified FROM before"
        );
        let lock_verdict = verdict_sql("cur");
        let lock_current = format!(
            "{now}, \
             cur AS MATERIALIZED (SELECT l.holder_id, l.fencing_token, l.phase, \
                                         (l.expires_at >= now.t) AS unexpired \
                                  FROM {t} AS l, now WHERE l.work_id = $1::text FOR SHARE OF l) \
             SELECT {lock_verdict} AS verdict FROM now LEFT JOIN cur ON true"
        );
        Self {
            acquire,
            renew: update(&extend, false),
            checkpoint: update(&format!("{extend}, checkpoint = $5::bytea"), false),
            release: update("phase = 'released', expires_at = now.t", true),
            read,
            inspect,
            revoke,
            lock_current,
        }
    }
}

/// What the listener and the watch futures share.
#[derive(Default)]
struct Shared {
    watchers: Watchers,
    /// Work IDs with waiters since their last wake-up: woken all at once
    /// when the listener (re)connects, as notifications may have been lost.
    watched: Mutex<HashSet<WorkId>>,
}

impl Shared {
    fn notify(&self, work_id: &WorkId) {
        if let Ok(mut w) = self.watched.lock() {
            w.remove(work_id);
        }
        self.watchers.notify(work_id);
    }

    fn notify_all(&self) {
        let ids: Vec<WorkId> = match self.watched.lock() {
            Ok(mut w) => w.drain().collect(),
            Err(_) => return,
        };
        for id in &ids {
            self.watchers.notify(id);
        }
    }
}

type MessageStream = BoxStream<'static, Result<AsyncMessage, tokio_postgres::Error>>;
type ListenerConnect = Arc<
    dyn Fn() -> BoxFuture<
            'static,
            Result<(tokio_postgres::Client, MessageStream), tokio_postgres::Error>,
        > + Send
        + Sync,
>;

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

/// `postgres://user@host:port/db` from a configuration: never the password.
fn describe(config: &tokio_postgres::Config) -> String {
    let user = config
        .get_user()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            };
            match config.get_ports().get(i).or(config.get_ports().first()) {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }
        })
        .collect();
    let db = config.get_dbname().unwrap_or_default();
    format!("postgres://{user}{}/{db}", hosts.join(","))
}

/// Whether `e` on `client` means the server had ended the session (the
/// statement did not run to a result on it).
fn session_ended(e: &tokio_postgres::Error, client: &tokio_postgres::Client) -> bool {
    e.is_closed() || client.is_closed() || e.code().is_some_and(|c| c.code().starts_with("57P"))
}

fn pool_err(shown: &str) -> impl FnOnce(deadpool_postgres::PoolError) -> Error + '_ {
    move |e| StoreError::with_source(KIND, format!("cannot get a connection to {shown}"), e).into()
}

fn db_err(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Error {
    move |e| StoreError::with_source(KIND, context, e).into()
}

fn corrupt(what: &str) -> Error {
    StoreError::new(KIND, format!("a lease row is corrupt: {what}")).into()
}

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a Row, idx: usize) -> Result<T> {
    row.try_get(idx)
        .map_err(|e| StoreError::with_source(KIND, format!("cannot read column {idx}"), e).into())
}

/// `ttl` in whole milliseconds (rounded up), as the statements take it.
fn ttl_millis(ttl: Duration) -> Result<i64> {
    i64::try_from(crate::limits::ceil_millis(ttl)).map_err(|_| {
        Error::from(InvalidInput::TtlTooLong {
            ttl,
            max: crate::limits::MAX_TTL,
        })
    })
}

fn token_u64(v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|_| corrupt("negative fencing token"))
}

fn previous(
    holder: Option<String>,
    token: Option<i64>,
    end: Option<String>,
) -> Result<Option<PreviousHolder>> {
    match (holder, token, end) {
        (Some(holder_id), Some(t), Some(end)) => Ok(Some(PreviousHolder {
            holder_id,
            fencing_token: token_u64(t)?,
            ended: LeaseEnd::from_str(&end).ok_or_else(|| corrupt("prev_end"))?,
        })),
        _ => Ok(None),
    }
}

/// This host's wall-clock estimate of a server time `delta_us` from now.
fn wall_at(delta_us: i64) -> SystemTime {
    let d = Duration::from_micros(delta_us.unsigned_abs());
    if delta_us >= 0 {
        SystemTime::now() + d
    } else {
        SystemTime::now()
            .checked_sub(d)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }
}

/// A [`LeaseInfo`] from the columns of `info_cols` starting at 0.
fn info_from(row: &Row) -> Result<LeaseInfo> {
    let work_id: String = get(row, 0)?;
    let work_id = WorkId::new(work_id)
        .map_err(|e| StoreError::with_source(KIND, "a stored work ID is invalid", e))?;
    let phase: String = get(row, 3)?;
    let phase = Phase::parse(&phase).ok_or_else(|| corrupt("phase"))?;
    let unexpired: bool = get(row, 4)?;
    let delta_us: i64 = get(row, 5)?;
    let live = phase == Phase::Held && unexpired;
    let ended = match phase {
        Phase::Held => LeaseEnd::Expired,
        Phase::Released => LeaseEnd::Released,
        Phase::Revoked => LeaseEnd::Revoked,
    };
    let checkpoint_bytes: i64 = get(row, 6)?;
    Ok(LeaseInfo {
        work_id,
        holder_id: get(row, 1)?,
        fencing_token: token_u64(get(row, 2)?)?,
        expires_at: wall_at(delta_us),
        expires_in: live.then(|| Duration::from_micros(delta_us.max(0).unsigned_abs())),
        expired: !live,
        released: phase == Phase::Released,
        ended: (!live).then_some(ended),
        checkpoint_bytes: usize::try_from(checkpoint_bytes)
            .map_err(|_| corrupt("checkpoint size"))?,
        handoff: Handoff {
            previous: previous(get(row, 7)?, get(row, 8)?, get(row, 9)?)?,
        },
    })
}

fn expired(lease: LeaseRef<'_>) -> Error {
    Error::Expired {
        work_id: lease.work_id.to_string(),
        fencing_token: lease.fencing_token,
    }
}

/// Turns a verdict column into the lease outcome.
fn check_verdict(verdict: &str, lease: LeaseRef<'_>) -> Result<()> {
    match verdict {
        "ok" => Ok(()),
        "fenced" => Err(record::fenced(lease)),
        "expired" => Err(expired(lease)),
        other => Err(StoreError::new(KIND, format!("unexpected verdict {other:?}")).into()),
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

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.initialize().await?;
        self.pool.get().await.map_err(pool_err(&self.shown))
    }

    /// Runs one prepared (cached) statement and returns its rows.
    ///
    /// A pooled connection whose session the server has already ended
    /// (`pg_terminate_backend`, a restart: SQLSTATE class 57P, or a closed
    /// client) is dropped and the statement tried once more on a fresh
    /// connection. That is safe for every lease statement: each is
    /// conditioned on the work ID, holder and fencing token, so running
    /// one twice cannot break S1–S3 (at worst a release that did apply
    /// reports `Expired`, an acquisition that did apply reports `Held`).
    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        context: &'static str,
    ) -> Result<Vec<Row>> {
        let mut retried = false;
        loop {
            let client = self.client().await?;
            let result = match client.prepare_cached(sql).await {
                Ok(stmt) => client.query(&stmt, params).await,
                Err(e) => Err(e),
            };
            match result {
                Err(e) if !retried && session_ended(&e, &client) => {
                    tracing::debug!(error = %e, "the server ended a pooled session: trying once more");
                    retried = true;
                }
                other => return other.map_err(db_err(context)),
            }
        }
    }

    async fn migrate(&self) -> Result<()> {
        let table = &self.options.table;
        let mut client = self.pool.get().await.map_err(pool_err(&self.shown))?;
        let tx = client
            .transaction()
            .await
            .map_err(db_err("cannot begin the schema transaction"))?;
        // One migration at a time per table, across every process; the lock
        // ends with the transaction.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext($1::text))",
            &[&format!("worklease:migrate:{table}")],
        )
        .await
        .map_err(db_err("cannot take the schema lock"))?;
        let (t, seq) = (table.quoted(), table.sequence_quoted());
        let row = tx
            .query_one(
                "SELECT to_regclass($1::text) IS NOT NULL, \
                        obj_description(to_regclass($1::text), 'pg_class'), \
                        to_regclass($2::text) IS NOT NULL",
                &[&t, &seq],
            )
            .await
            .map_err(db_err("cannot read the schema"))?;
        let (has_table, comment, has_seq): (bool, Option<String>, bool) =
            (get(&row, 0)?, get(&row, 1)?, get(&row, 2)?);
        if has_table {
            let version = comment
                .as_deref()
                .and_then(|c| c.strip_prefix(COMMENT_PREFIX))
                .and_then(|v| v.trim().parse::<u32>().ok());
            match version {
                None => {
                    return Err(StoreError::new(
                        KIND,
                        format!(
                            "table {table} in {} is not a worklease table (its comment does not \
                             name a worklease schema version): choose another table name",
                            self.shown
                        ),
                    )
                    .into())
                }
                Some(v) if v > SCHEMA_VERSION => {
                    return Err(StoreError::new(
                        KIND,
                        format!(
                            "table {table} has schema version {v}: newer than this worklease's \
                             {SCHEMA_VERSION} (upgrade worklease)"
                        ),
                    )
                    .into())
                }
                Some(_) => {}
            }
        }
        tx.batch_execute(&format!(
            "CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint MINVALUE 1 NO CYCLE CACHE 1"
        ))
        .await
        .map_err(db_err("cannot create the fencing sequence"))?;
        if !has_table {
            tx.batch_execute(&format!(
                "CREATE TABLE {t} (\
                    work_id            text COLLATE \"C\" PRIMARY KEY, \
                    holder_id          text NOT NULL, \
                    fencing_token      bigint NOT NULL, \
                    ttl_ms             bigint NOT NULL, \
                    phase              text NOT NULL CHECK (phase IN ('held', 'released', 'revoked')), \
                    acquired_at        timestamptz NOT NULL, \
                    expires_at         timestamptz NOT NULL, \
                    checkpoint         bytea, \
                    prev_holder_id     text, \
                    prev_fencing_token bigint, \
                    prev_end           text CHECK (prev_end IN ('released', 'expired', 'revoked')), \
                    wanted             boolean NOT NULL DEFAULT false\
                 ); \
                 COMMENT ON TABLE {t} IS '{COMMENT_PREFIX}{SCHEMA_VERSION}'"
            ))
            .await
            .map_err(db_err("cannot create the lease table"))?;
        } else if !has_seq {
            // The sequence was dropped by hand: continue above every token
            // the table has seen.
            tx.batch_execute(&format!(
                "SELECT setval('{seq}'::regclass, m) FROM (\
                    SELECT GREATEST(max(fencing_token), max(prev_fencing_token)) AS m FROM {t}\
                 ) AS s WHERE m IS NOT NULL"
            ))
            .await
            .map_err(db_err("cannot advance the fencing sequence"))?;
        }
        tx.commit()
            .await
            .map_err(db_err("cannot commit the schema"))?;
        Ok(())
    }

    /// Runs `body` in a transaction on this store's database that first
    /// locks the lease row of `token` (`SELECT ... FOR SHARE`) and checks,
    /// by the server's clock, that the token is the current, live
    /// acquisition; then commits. The way to fence writes to tables in the
    /// same database: a stale holder's writes never commit.
    ///
    /// While the transaction runs, the row stays locked: a contender's
    /// acquisition (and this holder's own renewal or release) waits for the
    /// commit, so every write committed here precedes any later holder's
    /// acquisition. Keep the body short, well under the renewal interval.
    /// The transaction is READ COMMITTED, PostgreSQL's default.
    ///
    /// The body gets the transaction and returns a boxed future:
    ///
    /// ```no_run
    /// # async fn demo(store: &worklease::store::postgres::PostgresStore, token: &worklease::Token)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// let rows = store
    ///     .fenced_transaction(token, |tx| {
    ///         Box::pin(async move {
    ///             tx.execute("INSERT INTO results (shard, value) VALUES (7, 42)", &[])
    ///                 .await
    ///         })
    ///     })
    ///     .await?;
    /// # let _ = rows; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FencedTransactionError::Lease`] with [`Error::Fenced`] (taken
    /// over, revoked, never issued) or [`Error::Expired`] (expired or
    /// released), or a store error; [`FencedTransactionError::Body`] with
    /// the body's own error. In each case nothing was committed.
    pub async fn fenced_transaction<T, E, F>(
        &self,
        token: &Token,
        body: F,
    ) -> std::result::Result<T, FencedTransactionError<E>>
    where
        F: for<'t> FnOnce(&'t tokio_postgres::Transaction<'t>) -> BoxFuture<'t, Result<T, E>>,
    {
        let lease = LeaseRef {
            work_id: token.work_id(),
            holder_id: token.holder_id(),
            fencing_token: token.fencing_token(),
        };
        let fencing = i64::try_from(lease.fencing_token)
            .map_err(|_| FencedTransactionError::Lease(record::fenced(lease)))?;
        let lease_err = FencedTransactionError::Lease;
        let mut client = self.client().await.map_err(lease_err)?;
        let stmt = client
            .prepare_cached(&self.sql.lock_current)
            .await
            .map_err(|e| lease_err(db_err("cannot prepare the lease check")(e)))?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| lease_err(db_err("cannot begin the fenced transaction")(e)))?;
        let row = tx
            .query_one(
                &stmt,
                &[&lease.work_id.as_str(), &lease.holder_id.as_str(), &fencing],
            )
            .await
            .map_err(|e| lease_err(db_err("cannot lock the lease row")(e)))?;
        let verdict: String = get(&row, 0).map_err(lease_err)?;
        // On an error, dropping `tx` rolls back.
        check_verdict(&verdict, lease).map_err(lease_err)?;
        let out = body(&tx).await.map_err(FencedTransactionError::Body)?;
        tx.commit()
            .await
            .map_err(|e| lease_err(db_err("cannot commit the fenced transaction")(e)))?;
        Ok(out)
    }

    /// Runs renew, checkpoint or release (`sql`) and maps the verdict.
    async fn update_current(
        &self,
        sql: &str,
        lease: LeaseRef<'_>,
        extra: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        context: &'static str,
    ) -> Result<()> {
        let Ok(fencing) = i64::try_from(lease.fencing_token) else {
            return Err(record::fenced(lease));
        };
        let (work_id, holder_id) = (lease.work_id.as_str(), lease.holder_id.as_str());
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            vec![&work_id, &holder_id, &fencing];
        params.extend_from_slice(extra);
        let rows = self.query(sql, &params, context).await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::new(KIND, format!("{context}: no answer row")))?;
        let verdict: String = get(row, 0)?;
        check_verdict(&verdict, lease)
    }
}

/// The listener: one connection that `LISTEN`s on the channel and wakes
/// waiters, reconnecting with backoff until `stop`.
async fn listen(
    connect: ListenerConnect,
    channel: String,
    shared: Arc<Shared>,
    stop: CancellationToken,
    tried: watch::Sender<bool>,
    connect_timeout: Duration,
) {
    let mut retry = LISTEN_RETRY_INITIAL;
    let mut connected_before = false;
    let listen_sql = format!("LISTEN \"{channel}\"");
    let deliver = |msg: AsyncMessage| {
        if let AsyncMessage::Notification(n) = msg {
            if n.channel() == channel {
                if let Ok(id) = WorkId::new(n.payload()) {
                    shared.notify(&id);
                }
            }
        }
    };
    loop {
        let attempt = async {
            let (client, mut messages) = connect().await?;
            {
                // Drive the connection while LISTEN is confirmed.
                let confirm = client.batch_execute(&listen_sql);
                tokio::pin!(confirm);
                loop {
                    tokio::select! {
                        r = &mut confirm => { r?; break; }
                        m = messages.next() => match m {
                            Some(Ok(msg)) => deliver(msg),
                            Some(Err(e)) => return Err(e),
                            None => return Ok(None),
                        },
                    }
                }
            }
            Ok(Some((client, messages)))
        };
        let outcome = tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio::time::timeout(connect_timeout, attempt) => r,
        };
        tried.send_replace(true);
        match outcome {
            Ok(Ok(Some((client, mut messages)))) => {
                retry = LISTEN_RETRY_INITIAL;
                if connected_before {
                    // Notifications sent while we were away are lost.
                    shared.notify_all();
                }
                connected_before = true;
                tracing::debug!(channel = %channel, "postgres listener connected");
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        m = messages.next() => match m {
                            Some(Ok(msg)) => deliver(msg),
                            Some(Err(e)) => {
                                tracing::warn!(channel = %channel, error = %e, "postgres listener lost its connection");
                                break;
                            }
                            None => {
                                tracing::warn!(channel = %channel, "postgres listener connection closed");
                                break;
                            }
                        },
                    }
                }
                drop(client);
                shared.notify_all();
            }
            Ok(Ok(None)) => {
                tracing::warn!(channel = %channel, "postgres listener closed while starting")
            }
            Ok(Err(e)) => {
                tracing::warn!(channel = %channel, error = %e, "postgres listener cannot connect")
            }
            Err(_) => tracing::warn!(channel = %channel, "postgres listener timed out connecting"),
        }
        let nap = retry.mul_f64(rand::thread_rng().gen_range(0.5..1.0));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(nap) => {}
        }
        retry = (retry * 2).min(LISTEN_RETRY_MAX);
    }
}

#[async_trait]
impl LeaseStore for PostgresStore {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn acquire(
        &self,
        work_id: &WorkId,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> Result<Grant> {
        let ttl_ms = ttl_millis(ttl)?;
        // A first insertion racing another one can leave the statement with
        // no row to report (the winner's row is not in its snapshot): the
        // statement changed nothing then, and is run again.
        const ATTEMPTS: usize = 3;
        // A waiter (it called `watch` first) marks a held lease as wanted,
        // so that its release notifies; releases nobody waits for skip
        // NOTIFY, whose commit-time lock serializes every notifying commit
        // of the server.
        let waiting = self
            .shared
            .watched
            .lock()
            .map(|w| w.contains(work_id))
            .unwrap_or(true);
        for _ in 0..ATTEMPTS {
            let rows = self
                .query(
                    &self.sql.acquire,
                    &[&work_id.as_str(), &holder_id.as_str(), &ttl_ms, &waiting],
                    "cannot acquire",
                )
                .await?;
            let Some(row) = rows.first() else { continue };
            let token: Option<i64> = get(row, 0)?;
            match token {
                Some(t) => {
                    if let Ok(mut w) = self.shared.watched.lock() {
                        w.remove(work_id);
                    }
                    return Ok(Grant {
                        fencing_token: token_u64(t)?,
                        expires_at: SystemTime::now() + ttl,
                        handoff: Handoff {
                            previous: previous(get(row, 1)?, get(row, 2)?, get(row, 3)?)?,
                        },
                    });
                }
                None => {
                    let holder: String = get(row, 4)?;
                    let remaining_us: i64 = get(row, 5)?;
                    return Err(Error::Held {
                        work_id: work_id.to_string(),
                        holder_id: holder,
                        expires_in: Some(Duration::from_micros(remaining_us.max(0).unsigned_abs())),
                    });
                }
            }
        }
        Err(StoreError::new(
            KIND,
            format!("acquisition of {work_id:?} kept racing concurrent first acquisitions"),
        )
        .into())
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        let ttl_ms = ttl_millis(ttl)?;
        self.update_current(&self.sql.renew, lease, &[&ttl_ms], "cannot renew")
            .await?;
        Ok(SystemTime::now() + ttl)
    }

    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime> {
        let ttl_ms = ttl_millis(ttl)?;
        let data: &[u8] = &data;
        self.update_current(
            &self.sql.checkpoint,
            lease,
            &[&ttl_ms, &data],
            "cannot checkpoint",
        )
        .await?;
        Ok(SystemTime::now() + ttl)
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        let Ok(fencing) = i64::try_from(lease.fencing_token) else {
            return Err(record::fenced(lease));
        };
        let rows = self
            .query(
                &self.sql.read,
                &[&lease.work_id.as_str(), &lease.holder_id.as_str(), &fencing],
                "cannot read the checkpoint",
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::new(KIND, "read checkpoint: no answer row"))?;
        let verdict: String = get(row, 0)?;
        check_verdict(&verdict, lease)?;
        let data: Option<Vec<u8>> = get(row, 1)?;
        Ok(Checkpoint {
            data: data.map(Bytes::from),
            handoff: Handoff {
                previous: previous(get(row, 2)?, get(row, 3)?, get(row, 4)?)?,
            },
        })
    }

    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        let channel = self.channel.as_str();
        self.update_current(&self.sql.release, lease, &[&channel], "cannot release")
            .await?;
        // Waiters of this value need not wait for the notification's trip.
        self.shared.notify(lease.work_id);
        Ok(())
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        let ids: Vec<&str> = work_ids.iter().map(WorkId::as_str).collect();
        let rows = self
            .query(&self.sql.inspect, &[&ids], "cannot list leases")
            .await?;
        rows.iter().map(info_from).collect()
    }

    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        let channel = self.channel.as_str();
        let rows = self
            .query(
                &self.sql.revoke,
                &[&work_id.as_str(), &channel],
                "cannot revoke",
            )
            .await?;
        let before = rows.first().map(info_from).transpose()?;
        self.shared.notify(work_id);
        Ok(before)
    }

    fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        let woken = self.shared.watchers.watch(work_id)?;
        if let Ok(mut w) = self.shared.watched.lock() {
            w.insert(work_id.clone());
        }
        let jitter = self
            .options
            .wake_jitter
            .mul_f64(rand::thread_rng().gen_range(0.0..=1.0));
        Some(Box::pin(async move {
            woken.await;
            if !jitter.is_zero() {
                tokio::time::sleep(jitter).await;
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_checked() {
        assert_eq!(TableName::new("leases").unwrap().quoted(), "\"leases\"");
        let t = TableName::new("app.leases_2").unwrap();
        assert_eq!(t.quoted(), "\"app\".\"leases_2\"");
        assert_eq!(t.sequence_quoted(), "\"app\".\"leases_2_fencing_seq\"");
        assert_eq!(t.channel(), "worklease:app.leases_2");
        for bad in [
            "",
            "Leases",
            "1x",
            "a.b.c",
            "x;drop table y",
            "a\"b",
            ".x",
            "x.",
            "le ases",
        ] {
            let e = TableName::new(bad).unwrap_err().to_string();
            assert!(e.contains("[a-z_]"), "{bad:?}: {e}");
        }
        let long = "t".repeat(MAX_TABLE_NAME_BYTES + 1);
        assert!(TableName::new(&long)
            .unwrap_err()
            .to_string()
            .contains(&MAX_TABLE_NAME_BYTES.to_string()));
        let qualified = format!("{}.{}", "s".repeat(20), "t".repeat(MAX_TABLE_NAME_BYTES));
        assert!(TableName::new(&qualified)
            .unwrap_err()
            .to_string()
            .contains("channel"));
        assert!(TableName::new(&"t".repeat(MAX_TABLE_NAME_BYTES)).is_ok());
    }

    #[test]
    fn urls_are_parsed_and_redacted() {
        let UrlParts {
            config, table, tls, ..
        } = parse_url(
            "postgres://app:s3cret@db.internal:6543/leases?table=wl.t&application_name=x",
        )
        .unwrap();
        assert!(!tls);
        assert_eq!(table.to_string(), "wl.t");
        assert_eq!(config.get_dbname(), Some("leases"));
        assert_eq!(config.get_application_name(), Some("x"));
        assert_eq!(config.get_ports(), &[6543]);
        assert_eq!(describe(&config), "postgres://app@db.internal:6543/leases");
        let parts = parse_url("PostgreSQL://h/db").unwrap();
        assert_eq!(parts.table, TableName::default());
        let twice = parse_url("postgres://u:s3cret@h/db?table=a&table=b")
            .err()
            .unwrap()
            .to_string();
        assert!(
            twice.contains("\"table\" appears twice") && !twice.contains("s3cret"),
            "{twice}"
        );
        let tls = parse_url("postgres://h/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem");
        if cfg!(feature = "postgres-tls") {
            let parts = tls.unwrap();
            assert!(parts.tls);
            assert_eq!(
                parts.root_cert.as_deref(),
                Some(std::path::Path::new("/etc/ca.pem"))
            );
        } else {
            assert!(tls.unwrap_err().to_string().contains("postgres-tls"));
        }
        for (url, want) in [
            ("postgres://u:pw@h/db?table=Bad", "[a-z_]"),
            ("postgres://u:pw@h/db?bogus=1", "bogus"),
            ("postgres://u:pw@h:notaport/db", "port"),
            ("mysql://u:pw@h/db", "postgres://"),
        ] {
            let e = parse_url(url).unwrap_err().to_string();
            assert!(e.contains(want), "{url}: {e}");
            assert!(!e.contains("pw"), "the password leaked: {e}");
        }
        let u = PostgresUrl::parse("postgres://u:pw@h/db?table=t").unwrap();
        assert!(!format!("{u:?}").contains("pw"));
        assert_eq!(u.as_str(), "postgres://u:pw@h/db?table=t");
    }
}
