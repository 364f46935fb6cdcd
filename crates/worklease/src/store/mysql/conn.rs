//! Pooled connections: running a statement (again after a deadlock, or
//! once more when the server had closed the connection), and the store
//! errors of the pool and the driver.

use mysql_async::prelude::{FromValue, Queryable};
use mysql_async::{Params, Row};

use crate::error::{Error, Result, StoreError};

use super::schema::{lacks_privilege, FENCING_PRIVILEGES, PROCEDURE_PRIVILEGES, TABLE_PRIVILEGES};
use super::{MysqlStore, KIND};

/// How many times a statement runs while InnoDB picks it as a deadlock's
/// victim (its whole transaction was rolled back, so running it again is
/// the same as running it once).
const DEADLOCK_ATTEMPTS: usize = 4;

/// MySQL's "Deadlock found when trying to get lock".
const ER_LOCK_DEADLOCK: u16 = 1213;

impl MysqlStore {
    /// A pooled connection, within the connect timeout; no schema check.
    pub(super) async fn connection(&self) -> Result<mysql_async::Conn> {
        match tokio::time::timeout(self.options.connect_timeout, self.pool.get_conn()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(StoreError::with_source(
                KIND,
                format!("cannot get a connection to {}", self.shown),
                e,
            )
            .into()),
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
    /// A statement chosen as a deadlock's victim (its transaction rolled
    /// back whole) runs again, up to [`DEADLOCK_ATTEMPTS`] times. A pooled
    /// connection that the server had closed (a restart, `KILL`, its
    /// `wait_timeout`) is dropped and the statement tried once more on
    /// another. That is safe for every lease statement: each is
    /// conditioned on the work ID, holder and fencing token, so running
    /// one twice cannot break S1–S3 (at worst a release that did apply
    /// reports `Expired`, an acquisition that did apply reports `Held`).
    pub(super) async fn query(
        &self,
        sql: &str,
        params: Params,
        context: &'static str,
    ) -> Result<Vec<Row>> {
        let mut deadlocks = 0;
        let mut reconnected = false;
        loop {
            let mut conn = self.client().await?;
            match conn.exec::<Row, _, _>(sql, params.clone()).await {
                Ok(rows) => return Ok(rows),
                Err(mysql_async::Error::Server(e))
                    if e.code == ER_LOCK_DEADLOCK && deadlocks + 1 < DEADLOCK_ATTEMPTS =>
                {
                    deadlocks += 1;
                    tracing::debug!(error = %e, "deadlock victim: running the statement again");
                }
                Err(e) if !reconnected && connection_lost(&e) => {
                    reconnected = true;
                    tracing::debug!(error = %e, "the server closed a pooled connection: trying once more");
                }
                Err(e) => return Err(db_err(context)(e)),
            }
        }
    }
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

/// A driver error as a store error. A refusal for a missing privilege
/// (the server's message names the privilege and the object) says which
/// privileges the store needs.
pub(super) fn db_err(context: &'static str) -> impl FnOnce(mysql_async::Error) -> Error {
    move |e| {
        if lacks_privilege(&e) {
            let message = format!(
                "{context}: the user lacks a privilege: the store needs {TABLE_PRIVILEGES} on \
                 its table, {FENCING_PRIVILEGES} on its fencing table and \
                 {PROCEDURE_PRIVILEGES} on its procedures"
            );
            return StoreError::with_source(KIND, message, e).into();
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
