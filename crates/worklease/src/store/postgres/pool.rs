//! Pooled connections: running a statement (once more when the server had
//! ended the session), and the store errors of the pool and the driver.

use tokio_postgres::Row;

use crate::error::{Error, Result, StoreError};

use super::schema::{lacks_privilege, SEQUENCE_PRIVILEGES, TABLE_PRIVILEGES};
use super::{PostgresStore, KIND};

impl PostgresStore {
    pub(super) async fn client(&self) -> Result<deadpool_postgres::Object> {
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
    pub(super) async fn query(
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
}

/// Whether `e` on `client` means the server had ended the session (the
/// statement did not run to a result on it).
fn session_ended(e: &tokio_postgres::Error, client: &tokio_postgres::Client) -> bool {
    e.is_closed() || client.is_closed() || e.code().is_some_and(|c| c.code().starts_with("57P"))
}

pub(super) fn pool_err(shown: &str) -> impl FnOnce(deadpool_postgres::PoolError) -> Error + '_ {
    move |e| StoreError::with_source(KIND, format!("cannot get a connection to {shown}"), e).into()
}

/// A driver error as a store error. A refusal for a missing privilege
/// (SQLSTATE 42501; the server's message names the object) says which
/// privileges the store needs.
pub(super) fn db_err(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Error {
    move |e| {
        if lacks_privilege(&e) {
            let message = format!(
                "{context}: the role lacks a privilege (SQLSTATE 42501): the store needs \
                 {TABLE_PRIVILEGES} on its table and {SEQUENCE_PRIVILEGES} on its fencing sequence"
            );
            return StoreError::with_source(KIND, message, e).into();
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
