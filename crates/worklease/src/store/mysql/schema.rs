//! The lease table, its fencing sequence and its procedures: created on
//! first use (one process at a time, under a named lock), and the schema
//! version checked.

use mysql_async::prelude::Queryable;

use crate::error::{Result, StoreError};
use crate::store::sql_rows::{check_schema_comment, no_store};

use super::conn::db_err;
use super::sql::SCHEMA_VERSION;
use super::{MysqlStore, KIND};

/// How long a start waits for another process's schema creation, in
/// seconds (`GET_LOCK`'s timeout).
const MIGRATE_LOCK_SECS: u32 = 30;

impl MysqlStore {
    pub(super) async fn migrate(&self) -> Result<()> {
        let mut conn = self.connection().await?;
        // One creation at a time per table, across every process. The name
        // must fit 64 bytes: a hash of database and table.
        let lock_name = "CONCAT('worklease:', LEFT(SHA2(CONCAT(DATABASE(), '.', ?), 256), 40))";
        let got: Option<Option<i64>> = conn
            .exec_first(
                format!("SELECT GET_LOCK({lock_name}, ?)"),
                (self.options.table.as_str(), MIGRATE_LOCK_SECS),
            )
            .await
            .map_err(db_err("cannot take the schema lock"))?;
        if got.flatten() != Some(1) {
            return Err(StoreError::new(
                KIND,
                format!(
                    "another process kept the schema lock of table {} for {MIGRATE_LOCK_SECS} s",
                    self.options.table
                ),
            )
            .into());
        }
        let result = self.migrate_locked(&mut conn).await;
        let released = conn
            .exec_drop(
                format!("SELECT RELEASE_LOCK({lock_name})"),
                (self.options.table.as_str(),),
            )
            .await;
        result?;
        released.map_err(db_err("cannot release the schema lock"))?;
        Ok(())
    }

    async fn migrate_locked(&self, conn: &mut mysql_async::Conn) -> Result<()> {
        let table = &self.options.table;
        if conn
            .query_drop("SELECT 1 FROM JSON_TABLE('[]', '$[*]' COLUMNS (x INT PATH '$')) AS j")
            .await
            .is_err()
        {
            return Err(StoreError::new(
                KIND,
                format!(
                    "{} lacks JSON_TABLE: the MySQL store needs MySQL 8.0.4+ or MariaDB 10.6+",
                    self.shown
                ),
            )
            .into());
        }
        let comment: Option<String> = conn
            .exec_first(
                "SELECT TABLE_COMMENT FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
                (table.as_str(),),
            )
            .await
            .map_err(db_err("cannot read the schema"))?;
        let fencing_name = format!("{table}_fencing");
        let has_fencing: Option<i64> = conn
            .exec_first(
                "SELECT 1 FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
                (fencing_name.as_str(),),
            )
            .await
            .map_err(db_err("cannot read the schema"))?;
        if comment.is_some() {
            check_schema_comment(KIND, comment.as_deref(), SCHEMA_VERSION, table, &self.shown)?;
        } else if !self.options.create_schema {
            return Err(no_store(KIND, table, &self.shown));
        }
        for create in &self.sql.create {
            conn.query_drop(create)
                .await
                .map_err(db_err("cannot create the lease tables"))?;
        }
        if comment.is_some() && has_fencing.is_none() {
            // The sequence was dropped by hand: continue above every token
            // the table has seen.
            let max: Option<Option<u64>> = conn
                .query_first(format!(
                    "SELECT GREATEST(COALESCE(MAX(fencing_token), 0), \
                                     COALESCE(MAX(prev_fencing_token), 0)) FROM {}",
                    table.quoted()
                ))
                .await
                .map_err(db_err("cannot read the largest fencing token"))?;
            let next = max.flatten().unwrap_or(0).saturating_add(1);
            conn.query_drop(format!(
                "ALTER TABLE {} AUTO_INCREMENT = {next}",
                table.fencing_quoted()
            ))
            .await
            .map_err(db_err("cannot advance the fencing sequence"))?;
        }
        let existing: Vec<String> = conn
            .exec(
                "SELECT ROUTINE_NAME FROM information_schema.ROUTINES \
                 WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE' \
                   AND ROUTINE_NAME LIKE ?",
                (format!(
                    "{}\\_v{SCHEMA_VERSION}\\_%",
                    table.as_str().replace('_', "\\_")
                ),),
            )
            .await
            .map_err(db_err("cannot list the stored procedures"))?;
        for (name, create) in &self.sql.procedures {
            if !existing.contains(name) {
                conn.query_drop(create)
                    .await
                    .map_err(db_err("cannot create a stored procedure"))?;
            }
        }
        Ok(())
    }
}
