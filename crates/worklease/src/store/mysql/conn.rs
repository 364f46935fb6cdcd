//! Pooled connections: the session settings they pin, running a statement
//! (again after a transient failure, once more when the server had closed
//! the connection), and the store errors of the pool and the driver.

use mysql_async::prelude::{FromValue, Queryable};
use mysql_async::{Params, Row};

use crate::error::{Error, Result, StoreError};
use crate::store::sql_retry::{retry_transient, Failure};

use super::schema::{lacks_privilege, FENCING_PRIVILEGES, PROCEDURE_PRIVILEGES, TABLE_PRIVILEGES};
use super::{MysqlStore, KIND};

/// What every new pooled connection runs first (after any `setup` of the
/// caller's options): the session settings the store relies on, pinned so
/// that a server's `init_connect` or global defaults cannot change them.
/// `autocommit` on: a plain read (read checkpoint, inspect) is its own
/// transaction, never one left open on a pooled connection with an old
/// snapshot or, under SERIALIZABLE, shared locks that would stall every
/// writer of its rows. The isolation level needs no pin: every procedure
/// sets READ COMMITTED for its own transaction.
pub(super) const PINNED_SESSION: &str = "SET SESSION autocommit = 1";

impl MysqlStore {
    /// A pooled connection, within the connect timeout; no schema check.
    pub(super) async fn connection(&self) -> Result<mysql_async::Conn> {
        match tokio::time::timeout(self.options.connect_timeout, self.pool.get_conn()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => {
                let setup = lacks_privilege(&e) || needs_operator(&e);
                let e = StoreError::with_source(
                    KIND,
                    format!("cannot get a connection to {}", self.shown),
                    e,
                );
                Err(if setup {
                    Error::StoreSetup(e)
                } else {
                    e.into()
                })
            }
            Err(_) => Err(StoreError::new(
                KIND,
                format!(
                    "cannot get a connection to {} within {:?}",
                    self.shown, self.options.connect_timeout
                ),
            )
            .into()),
        }
    }

    /// A pooled connection after the schema check ([`MysqlStore::initialize`]).
    pub(super) async fn client(&self) -> Result<mysql_async::Conn> {
        self.initialize().await?;
        self.connection().await
    }

    /// Runs one prepared (cached per connection) statement and returns its
    /// first result set: a `CALL` of one of the procedures or a read.
    ///
    /// A statement the server rolled back as transient (a deadlock's
    /// victim, a lock wait timeout: [`transient`]; its whole transaction
    /// rolled back, so running it again is the same as running it once)
    /// runs again after a jittered pause, up to
    /// [`TRANSIENT_RETRIES`](crate::store::sql_retry::TRANSIENT_RETRIES)
    /// times. A pooled connection that the server
    /// had closed (a restart, `KILL`, its `wait_timeout`) is dropped and
    /// the statement tried once more on another. That is safe for every
    /// lease statement: each is conditioned on the work ID, holder and
    /// fencing token, so running one twice cannot break S1–S3 (at worst a
    /// release that did apply reports `Expired`, an acquisition that did
    /// apply reports `Held`).
    pub(super) async fn query(
        &self,
        sql: &str,
        params: Params,
        context: &'static str,
    ) -> Result<Vec<Row>> {
        let once = || async {
            let mut reconnected = false;
            loop {
                let mut conn = self.client().await?;
                match conn.exec::<Row, _, _>(sql, params.clone()).await {
                    Ok(rows) => return Ok(rows),
                    Err(e) if !reconnected && connection_lost(&e) => {
                        reconnected = true;
                        tracing::debug!(error = %e, "the server closed a pooled connection: trying once more");
                    }
                    Err(e) => return Err(Failure::Driver(context, e)),
                }
            }
        };
        retry_transient(once, transient, driver_err).await
    }
}

impl MysqlStore {
    /// Runs one statement that writes (a `DELETE`) and returns how many
    /// rows it changed, with [`MysqlStore::query`]'s retries (safe for a
    /// statement conditioned on the row it changes).
    pub(super) async fn execute(
        &self,
        sql: &str,
        params: Params,
        context: &'static str,
    ) -> Result<u64> {
        let once = || async {
            let mut reconnected = false;
            loop {
                let mut conn = self.client().await?;
                match conn.exec_drop(sql, params.clone()).await {
                    Ok(()) => return Ok(conn.affected_rows()),
                    Err(e) if !reconnected && connection_lost(&e) => {
                        reconnected = true;
                        tracing::debug!(error = %e, "the server closed a pooled connection: trying once more");
                    }
                    Err(e) => return Err(Failure::Driver(context, e)),
                }
            }
        };
        retry_transient(once, transient, driver_err).await
    }
}

/// Whether the server rolled back the statement of `e` as transient, so
/// that running it again may succeed: a deadlock's victim (1213, SQLSTATE
/// 40001), a lock wait timeout (1205, `innodb_lock_wait_timeout`), a lock
/// not taken under `NOWAIT` (3572), a row changed under MariaDB's
/// `innodb_snapshot_isolation` (1020), or any other serialization failure
/// (SQLSTATE 40001).
fn transient(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(s)
        if matches!(s.code, 1020 | 1205 | 1213 | 3572) || s.state == "40001")
}

/// Whether `e` means the connection was gone (the statement's outcome on
/// it is unknown, and the connection is not given back to the pool).
fn connection_lost(e: &mysql_async::Error) -> bool {
    match e {
        mysql_async::Error::Io(_) => true,
        mysql_async::Error::Driver(d) => {
            matches!(d, mysql_async::DriverError::ConnectionClosed)
        }
        // 1927: "Connection was killed" (MariaDB), 1053: server shutdown
        // in progress, 2006/2013: gone away / lost during the query.
        mysql_async::Error::Server(s) => matches!(s.code, 1053 | 1927 | 2006 | 2013),
        _ => false,
    }
}

/// [`db_err`] as a function of the context and the error, for
/// [`retry_transient`].
fn driver_err(context: &'static str, e: mysql_async::Error) -> Error {
    db_err(context)(e)
}

/// The server's error codes for what no retry cures until an operator
/// acts (beyond a missing privilege, [`lacks_privilege`]): a wrong user or
/// password (1045), an unknown database (1049), objects under the store's
/// names that are not the store's or are gone (1054 unknown column, 1146
/// no such table, 1305 no such procedure). Not a read-only server (1290,
/// 1792): a failover that demotes it looks the same, and passes.
const NEEDS_OPERATOR: [u16; 5] = [1045, 1049, 1054, 1146, 1305];

/// Whether the server refused `e` for what only an operator can change
/// ([`NEEDS_OPERATOR`]).
fn needs_operator(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(s) if NEEDS_OPERATOR.contains(&s.code))
}

/// A driver error as a store error: a set-up error ([`Error::StoreSetup`])
/// for what only an operator can change, else transient. A refusal for a
/// missing privilege (the server's message names the privilege and the
/// object) says which privileges the store needs.
pub(super) fn db_err(context: &'static str) -> impl FnOnce(mysql_async::Error) -> Error {
    move |e| {
        if lacks_privilege(&e) {
            let message = format!(
                "{context}: the user lacks a privilege: the store needs {TABLE_PRIVILEGES} on \
                 its table, {FENCING_PRIVILEGES} on its fencing table and \
                 {PROCEDURE_PRIVILEGES} on its procedures"
            );
            return Error::StoreSetup(StoreError::with_source(KIND, message, e));
        }
        if needs_operator(&e) {
            return Error::StoreSetup(StoreError::with_source(KIND, context, e));
        }
        StoreError::with_source(KIND, context, e).into()
    }
}

/// Column `idx` of `row`, converted.
pub(super) fn get<T: FromValue>(row: &Row, idx: usize) -> Result<T> {
    match row.get_opt::<T, usize>(idx) {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => {
            Err(StoreError::with_source(KIND, format!("cannot read column {idx}"), e).into())
        }
        None => Err(StoreError::new(KIND, format!("the answer has no column {idx}")).into()),
    }
}
