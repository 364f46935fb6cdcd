//! The lease table and its fencing sequence: created on first use, and the
//! schema version checked.

use crate::error::Result;
use crate::store::sql_rows::{check_schema_comment, no_store, COMMENT_PREFIX};

use super::pool::{db_err, get, pool_err};
use super::{PostgresStore, KIND};

/// The schema version this code writes, recorded in the table's comment.
pub const SCHEMA_VERSION: u32 = 1;

impl PostgresStore {
    pub(super) async fn migrate(&self) -> Result<()> {
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
            check_schema_comment(KIND, comment.as_deref(), SCHEMA_VERSION, table, &self.shown)?;
        } else if !self.options.create_schema {
            return Err(no_store(KIND, table, &self.shown));
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
}
