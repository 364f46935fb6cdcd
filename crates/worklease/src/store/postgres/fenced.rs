//! Fenced transactions: the application's writes, committed only while its
//! lease is current.

use futures_util::future::BoxFuture;

use crate::error::Result;
use crate::store::sql_rows::{check_verdict, FencedTransactionError};
use crate::token::{lease_ref, Token};

use super::pool::{db_err, get};
use super::{PostgresStore, KIND};

impl PostgresStore {
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
    /// [`FencedTransactionError::Lease`] with [`crate::Error::Fenced`] (taken
    /// over, revoked, never issued) or [`crate::Error::Expired`] (expired or
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
        let lease = lease_ref(token);
        let fencing = i64::try_from(lease.fencing_token)
            .map_err(|_| FencedTransactionError::Lease(crate::Error::fenced(lease)))?;
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
        check_verdict(KIND, &verdict, lease).map_err(lease_err)?;
        let out = body(&tx).await.map_err(FencedTransactionError::Body)?;
        tx.commit()
            .await
            .map_err(|e| lease_err(db_err("cannot commit the fenced transaction")(e)))?;
        Ok(out)
    }
}
