//! Fenced transactions: the application's writes, committed only while its
//! lease is current.

use futures_util::future::BoxFuture;
use mysql_async::prelude::Queryable;
use mysql_async::{Params, Transaction, TxOpts};

use crate::error::{Result, StoreError};
use crate::store::sql_rows::{check_verdict, FencedTransactionError};
use crate::token::{lease_ref, Token};

use super::conn::db_err;
use super::{MysqlStore, KIND};

impl MysqlStore {
    /// Runs `body` in a transaction on this store's database that first
    /// locks the lease row of `token` (`SELECT ... LOCK IN SHARE MODE`) and
    /// checks, by the server's clock, that the token is the current, live
    /// acquisition; then commits. The way to fence writes to tables in the
    /// same database: a stale holder's writes never commit.
    ///
    /// While the transaction runs, the row stays locked: a contender's
    /// acquisition (and this holder's own renewal or release) waits for the
    /// commit, so every write committed here precedes any later holder's
    /// acquisition. Keep the body short, well under the renewal interval
    /// (and under `innodb_lock_wait_timeout`, 50 s by default, after which
    /// the waiting renewal fails). The transaction has the server's
    /// default isolation level (REPEATABLE READ unless configured). Only
    /// transactional tables (InnoDB) are fenced: writes to MyISAM tables
    /// are not rolled back.
    ///
    /// The body gets the transaction and returns a boxed future:
    ///
    /// ```no_run
    /// # async fn demo(store: &worklease::store::mysql::MysqlStore, token: &worklease::Token)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// use worklease::store::mysql::mysql_async::prelude::Queryable;
    /// store
    ///     .fenced_transaction(token, |tx| {
    ///         Box::pin(async move {
    ///             tx.exec_drop("INSERT INTO results (shard, value) VALUES (?, ?)", (7, 42))
    ///                 .await
    ///         })
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`FencedTransactionError::Lease`] with [`crate::Error::Fenced`]
    /// (taken over, revoked, never issued) or [`crate::Error::Expired`]
    /// (expired or released), or a store error;
    /// [`FencedTransactionError::Body`] with the body's own error. In each
    /// case nothing was committed.
    pub async fn fenced_transaction<T, E, F>(
        &self,
        token: &Token,
        body: F,
    ) -> std::result::Result<T, FencedTransactionError<E>>
    where
        F: for<'t> FnOnce(&'t mut Transaction<'static>) -> BoxFuture<'t, Result<T, E>>,
    {
        let lease = lease_ref(token);
        let lease_err = FencedTransactionError::Lease;
        self.initialize().await.map_err(lease_err)?;
        let mut tx = match tokio::time::timeout(
            self.options.connect_timeout,
            self.pool.start_transaction(TxOpts::default()),
        )
        .await
        {
            Ok(Ok(tx)) => tx,
            Ok(Err(e)) => return Err(lease_err(db_err("cannot begin the fenced transaction")(e))),
            Err(_) => {
                return Err(lease_err(
                    StoreError::new(
                        KIND,
                        format!("cannot get a connection to {} in time", self.shown),
                    )
                    .into(),
                ))
            }
        };
        let params = Params::from((
            lease.holder_id.as_str(),
            lease.fencing_token,
            lease.work_id.as_str(),
        ));
        let verdict: Option<String> = tx
            .exec_first(&self.sql.lock_current, params)
            .await
            .map_err(|e| lease_err(db_err("cannot lock the lease row")(e)))?;
        let verdict = verdict.ok_or_else(|| {
            lease_err(StoreError::new(KIND, "the lease check gave no answer").into())
        })?;
        // On an error, dropping `tx` rolls back.
        check_verdict(KIND, &verdict, lease).map_err(lease_err)?;
        let out = body(&mut tx).await.map_err(FencedTransactionError::Body)?;
        tx.commit()
            .await
            .map_err(|e| lease_err(db_err("cannot commit the fenced transaction")(e)))?;
        Ok(out)
    }
}
