//! Pooled connections: running a statement (again after a transient
//! failure, once more when the server had ended the session), and the
//! store errors of the pool and the driver.

use tokio_postgres::error::SqlState;
use tokio_postgres::Row;

use crate::error::{Error, Result, StoreError};
use crate::store::sql_retry::{retry_transient, Failure};

use super::schema::{lacks_privilege, SEQUENCE_PRIVILEGES, TABLE_PRIVILEGES};
use super::{PostgresStore, KIND};

/// What every new pooled connection runs first: the session settings the
/// store's statements and their error handling rely on, pinned so that a
/// database's or role's defaults (`ALTER DATABASE ... SET`, `ALTER ROLE
/// ... SET`, `postgresql.conf`) cannot change them:
///
/// * `default_transaction_isolation = 'read committed'`: every lease
///   statement and the schema set-up are written for READ COMMITTED, where
///   a statement that finds its row changed by a concurrent commit
///   re-checks its `WHERE` against the newest version (and each statement
///   of the schema transaction reads what committed before it). Under
///   REPEATABLE READ or SERIALIZABLE the same race is a serialization
///   failure (SQLSTATE 40001), and a schema check reads a snapshot taken
///   before the lock it waited for (cirello-io/pglock#39). Fenced
///   transactions run at this level too.
/// * `synchronous_commit` back to `on` where a default turned it `off`: the
///   fencing sequence's crash guarantee needs the commit of an
///   acquisition flushed before its token is answered (`local`,
///   `remote_write`, `remote_apply` are kept).
///
/// The application's own statements on a connection of
/// [`PostgresStore::pool`] see these settings; one that changes session
/// settings there must set them back before the connection returns to the
/// pool.
pub(super) const PINNED_SESSION: &str = "SET default_transaction_isolation = 'read committed'; \
     SELECT set_config('synchronous_commit', 'on', false) \
     WHERE current_setting('synchronous_commit') = 'off'";

impl PostgresStore {
    pub(super) async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.initialize().await?;
        self.pool.get().await.map_err(pool_err(&self.shown))
    }

    /// Runs one prepared (cached) statement and returns its rows.
    ///
    /// A statement the server rolled back as transient (a serialization
    /// failure, a deadlock's victim, a lock or statement timeout:
    /// [`transient`]) runs again after a jittered pause, up to
    /// [`TRANSIENT_RETRIES`](crate::store::sql_retry::TRANSIENT_RETRIES)
    /// times. A pooled connection whose session the server has already ended
    /// (`pg_terminate_backend`, a restart: SQLSTATE class 57P, or a closed
    /// client) is dropped and the statement tried once more on a fresh
    /// connection. That is safe for every lease statement: each is
    /// conditioned on the work ID, holder and fencing token, so running
    /// one twice cannot break S1–S3 (at worst a release that did apply
    /// reports `Expired`, an acquisition that did apply reports `Held`).
    pub(super) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        context: &'static str,
    ) -> Result<Vec<Row>> {
        let once = || async {
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
                    other => return other.map_err(|e| Failure::Driver(context, e)),
                }
            }
        };
        retry_transient(once, transient, driver_err).await
    }
}

/// Whether the server rolled the statement of `e` back as transient, so
/// that running it again may succeed: a serialization failure (40001,
/// under an isolation level above READ COMMITTED that a session could
/// still have), a deadlock's victim (40P01), a lock not available in
/// `lock_timeout` (55P03), a statement cancelled by `statement_timeout` or
/// an operator (57014). Each ends the statement's transaction with
/// nothing written.
pub(super) fn transient(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        [
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::LOCK_NOT_AVAILABLE,
            SqlState::QUERY_CANCELED,
        ]
        .contains(c)
    })
}

/// Whether `e` on `client` means the server had ended the session (the
/// statement did not run to a result on it).
fn session_ended(e: &tokio_postgres::Error, client: &tokio_postgres::Client) -> bool {
    e.is_closed() || client.is_closed() || e.code().is_some_and(|c| c.code().starts_with("57P"))
}

/// A failure to get a pooled connection as a store error: a set-up error
/// ([`Error::StoreSetup`]) when the server refused the connection for a
/// reason only an operator can change ([`needs_operator`]: no such role
/// or database, a wrong password, no CONNECT privilege), else transient.
pub(super) fn pool_err(shown: &str) -> impl FnOnce(deadpool_postgres::PoolError) -> Error + '_ {
    move |e| {
        let setup = matches!(&e, deadpool_postgres::PoolError::Backend(b) if needs_operator(b));
        let e = StoreError::with_source(KIND, format!("cannot get a connection to {shown}"), e);
        if setup {
            Error::StoreSetup(e)
        } else {
            e.into()
        }
    }
}

/// Whether the server refused `e` for what no retry cures until an
/// operator acts: a missing privilege (42501: on the table, the sequence,
/// or CONNECT on the database), a role, password or database that does
/// not exist or does not match (28000, 28P01, 3D000), no schema to create
/// in or an unknown one (3F000), or objects under the store's names that
/// are not the store's (42P01, 42703, 42809: a missing table, column, or
/// a table where the fencing sequence should be). Not a read-only
/// transaction (25006): a failover that demotes the server looks the
/// same, and passes.
pub(super) fn needs_operator(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        [
            SqlState::INSUFFICIENT_PRIVILEGE,
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            SqlState::INVALID_PASSWORD,
            SqlState::INVALID_CATALOG_NAME,
            SqlState::INVALID_SCHEMA_NAME,
            SqlState::UNDEFINED_TABLE,
            SqlState::UNDEFINED_COLUMN,
            SqlState::WRONG_OBJECT_TYPE,
        ]
        .contains(c)
    })
}

/// [`db_err`] as a function of the context and the error, for
/// [`retry_transient`].
pub(super) fn driver_err(context: &'static str, e: tokio_postgres::Error) -> Error {
    db_err(context)(e)
}

/// A driver error as a store error: a set-up error ([`Error::StoreSetup`])
/// for what only an operator can change ([`needs_operator`]), else
/// transient. A refusal for a missing privilege (SQLSTATE 42501; the
/// server's message names the object) says which privileges the store
/// needs.
pub(super) fn db_err(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Error {
    move |e| {
        if lacks_privilege(&e) {
            let message = format!(
                "{context}: the role lacks a privilege (SQLSTATE 42501): the store needs \
                 {TABLE_PRIVILEGES} on its table and {SEQUENCE_PRIVILEGES} on its fencing sequence"
            );
            return Error::StoreSetup(StoreError::with_source(KIND, message, e));
        }
        if needs_operator(&e) {
            return Error::StoreSetup(StoreError::with_source(KIND, context, e));
        }
        StoreError::with_source(KIND, context, e).into()
    }
}

pub(super) fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    idx: usize,
) -> Result<T> {
    row.try_get(idx)
        .map_err(|e| StoreError::with_source(KIND, format!("cannot read column {idx}"), e).into())
}
