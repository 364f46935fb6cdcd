//! The lease table and its fencing sequence: created on first use, and the
//! schema version checked; the DDL and the privileges of a role that may
//! not create them.

use tokio_postgres::error::SqlState;
use tokio_postgres::IsolationLevel;

use crate::error::{Error, Result, StoreError};
use crate::store::sql_rows::{check_schema_comment, no_store, COMMENT_PREFIX};

use super::config::TableName;
use crate::store::sql_retry::{retry_transient, Failure};

use super::pool::{db_err, driver_err, get, pool_err, transient};
use super::{PostgresStore, KIND};

/// The schema version this code writes, recorded in the table's comment.
pub const SCHEMA_VERSION: u32 = 1;

/// The privileges the store's role needs on the lease table, once it
/// exists: for `GRANT ... ON TABLE`. No `DELETE`: the lease operations
/// never delete a row; only garbage collection does ([`GC_PRIVILEGES`]).
pub const TABLE_PRIVILEGES: &str = "SELECT, INSERT, UPDATE";

/// The privilege on the lease table that garbage collection
/// (`worklease gc`, [`crate::store::LeaseStore::delete_ended`]) needs
/// besides [`TABLE_PRIVILEGES`]: grant it only to the role that runs gc.
pub const GC_PRIVILEGES: &str = "DELETE";

/// The privilege the store's role needs on the fencing sequence
/// (`nextval`), for `GRANT ... ON SEQUENCE`.
pub const SEQUENCE_PRIVILEGES: &str = "USAGE";

impl TableName {
    /// The statements that create this table and its fencing sequence,
    /// for an owner to run where the store's role may not create them
    /// (then grant it [`TABLE_PRIVILEGES`] and [`SEQUENCE_PRIVILEGES`]).
    /// The same statements the store runs on first use.
    pub fn ddl(&self) -> String {
        let (t, seq) = (self.quoted(), self.sequence_quoted());
        format!(
            "CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint MINVALUE 1 NO CYCLE CACHE 1;\n\
             CREATE TABLE {t} (\
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
             );\n\
             COMMENT ON TABLE {t} IS '{COMMENT_PREFIX}{SCHEMA_VERSION}';\n"
        )
    }
}

/// Whether the server refused `e` for a missing privilege (SQLSTATE 42501).
pub(super) fn lacks_privilege(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE)
}

impl PostgresStore {
    /// Creates or checks the table and its sequence, in one READ COMMITTED
    /// transaction under a per-table advisory lock (so each statement after
    /// the lock reads what another process's set-up committed before it);
    /// run again after a transient failure, as a lease statement is.
    pub(super) async fn migrate(&self) -> Result<()> {
        retry_transient(|| self.migrate_once(), transient, driver_err).await
    }

    async fn migrate_once(&self) -> std::result::Result<(), Failure<tokio_postgres::Error>> {
        let table = &self.options.table;
        let mut client = self.pool.get().await.map_err(pool_err(&self.shown))?;
        let driver = |context| move |e| Failure::Driver(context, e);
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::ReadCommitted)
            .start()
            .await
            .map_err(driver("cannot begin the schema transaction"))?;
        // One migration at a time per table, across every process; the lock
        // ends with the transaction.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext($1::text))",
            &[&format!("worklease:migrate:{table}")],
        )
        .await
        .map_err(driver("cannot take the schema lock"))?;
        let (t, seq) = (table.quoted(), table.sequence_quoted());
        let row = tx
            .query_one(
                "SELECT to_regclass($1::text) IS NOT NULL, \
                        obj_description(to_regclass($1::text), 'pg_class'), \
                        to_regclass($2::text) IS NOT NULL",
                &[&t, &seq],
            )
            .await
            .map_err(driver("cannot read the schema"))?;
        let (has_table, comment, has_seq): (bool, Option<String>, bool) =
            (get(&row, 0)?, get(&row, 1)?, get(&row, 2)?);
        if has_table {
            check_schema_comment(KIND, comment.as_deref(), SCHEMA_VERSION, table, &self.shown)?;
        } else if !self.options.create_schema {
            return Err(no_store(KIND, table, &self.shown).into());
        }
        // Nothing to create: a role without CREATE goes on.
        let created = if !has_table {
            tx.batch_execute(&table.ddl()).await
        } else if !has_seq {
            // The sequence was dropped by hand: continue above every token
            // the table has seen.
            tx.batch_execute(&format!(
                "CREATE SEQUENCE {seq} AS bigint MINVALUE 1 NO CYCLE CACHE 1; \
                 SELECT setval('{seq}'::regclass, m) FROM (\
                    SELECT GREATEST(max(fencing_token), max(prev_fencing_token)) AS m FROM {t}\
                 ) AS s WHERE m IS NOT NULL"
            ))
            .await
        } else {
            Ok(())
        };
        match created {
            Err(e) if transient(&e) => {
                return Err(Failure::Driver("cannot create the lease table", e))
            }
            Err(e) => return Err(self.schema_err(e).into()),
            Ok(()) => {}
        }
        tx.commit()
            .await
            .map_err(driver("cannot commit the schema"))?;
        Ok(())
    }

    /// The error of a failed creation: where the role may not create,
    /// one that carries the DDL for an owner to run.
    fn schema_err(&self, e: tokio_postgres::Error) -> Error {
        let table = &self.options.table;
        if !lacks_privilege(&e) {
            return db_err("cannot create the lease table and its fencing sequence")(e);
        }
        // A table in a schema of its own needs the schema's USAGE too.
        let schema = table
            .schema_quoted()
            .map(|s| format!(", and USAGE ON SCHEMA {s}"))
            .unwrap_or_default();
        Error::StoreSetup(StoreError::with_source(
            KIND,
            format!(
                "the role of {} may not create table {table} or its fencing sequence \
                 (SQLSTATE 42501): have an owner run\n{}and grant the role {TABLE_PRIVILEGES} \
                 ON TABLE {}, {SEQUENCE_PRIVILEGES} ON SEQUENCE {}{schema}\n(docs/operators.md, \
                 \"Least privilege\"); the cause",
                self.shown,
                table.ddl(),
                table.quoted(),
                table.sequence_quoted()
            ),
            e,
        ))
    }
}
