//! The lease table, its fencing sequence and its procedures: created on
//! first use (one process at a time, under a named lock), and the schema
//! version checked; the DDL and the privileges of a user that may not
//! create them.

use mysql_async::prelude::Queryable;

use crate::error::{Error, Result, StoreError};
use crate::store::sql_rows::{check_schema_comment, no_store};

use super::config::TableName;
use super::conn::db_err;
use super::sql::{Sql, SCHEMA_VERSION};
use super::{MysqlStore, KIND};

/// The privileges the store's user needs on the lease table once it
/// exists, for `GRANT ... ON db.table`. No `DELETE`: the lease operations
/// never delete a lease row; only garbage collection does
/// ([`GC_PRIVILEGES`]).
pub const TABLE_PRIVILEGES: &str = "SELECT, INSERT, UPDATE";

/// The privilege on the lease table that garbage collection
/// (`worklease gc`, [`crate::store::LeaseStore::delete_ended`]) needs
/// besides [`TABLE_PRIVILEGES`]: grant it only to the user that runs gc.
pub const GC_PRIVILEGES: &str = "DELETE";

/// The privileges the store's user needs on the fencing table
/// (`<table>_fencing`): each acquisition inserts a row for its
/// `AUTO_INCREMENT` value and deletes it by ID.
pub const FENCING_PRIVILEGES: &str = "SELECT, INSERT, DELETE";

/// The privilege the store's user needs on each of the table's procedures
/// ([`TableName::procedure_names`]), or on the database's routines.
pub const PROCEDURE_PRIVILEGES: &str = "EXECUTE";

/// The server's error codes of a missing privilege: on a table, a column,
/// a routine, the database, or a global one.
const ER_ACCESS_DENIED: [u16; 5] = [1142, 1143, 1370, 1044, 1227];

/// Whether the server refused `e` for a missing privilege.
pub(super) fn lacks_privilege(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(s) if ER_ACCESS_DENIED.contains(&s.code))
}

impl TableName {
    /// The statements that create this table, its fencing table and its
    /// procedures, one statement each (for a client library), the same
    /// the store runs on first use.
    pub fn ddl_statements(&self) -> Vec<String> {
        let sql = Sql::new(self);
        sql.create
            .iter()
            .cloned()
            .chain(sql.procedures.into_iter().map(|(_, create)| create))
            .collect()
    }

    /// [`TableName::ddl_statements`] as a script for the `mysql` or
    /// `mariadb` command-line client (procedures between `DELIMITER`
    /// lines), for an owner to run where the store's user may not create
    /// them (then grant it [`TABLE_PRIVILEGES`], [`FENCING_PRIVILEGES`] and
    /// [`PROCEDURE_PRIVILEGES`]).
    pub fn ddl(&self) -> String {
        let statements = self.ddl_statements();
        let (tables, procedures) = statements.split_at(2);
        let mut out: String = tables.iter().map(|s| format!("{s};\n")).collect();
        out.push_str("DELIMITER //\n");
        for p in procedures {
            out.push_str(&format!("{p} //\n"));
        }
        out.push_str("DELIMITER ;\n");
        out
    }
}

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
            return Err(Error::StoreSetup(StoreError::new(
                KIND,
                format!(
                    "{} lacks JSON_TABLE: the MySQL store needs MySQL 8.0.4+ or MariaDB 10.6+",
                    self.shown
                ),
            )));
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
        // Only what is missing: a user without CREATE goes on.
        if comment.is_none() || has_fencing.is_none() {
            for create in &self.sql.create {
                conn.query_drop(create)
                    .await
                    .map_err(|e| self.schema_err(e))?;
            }
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
            .map_err(|e| self.schema_err(e))?;
        }
        let existing: Vec<String> = conn
            .exec(
                "SELECT ROUTINE_NAME FROM information_schema.ROUTINES \
                 WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE' \
                   AND ROUTINE_NAME LIKE ? ESCAPE '!'",
                // `!` as the escape: `\` is none under NO_BACKSLASH_ESCAPES.
                (format!(
                    "{}!_v{SCHEMA_VERSION}!_%",
                    table
                        .as_str()
                        .replace('!', "!!")
                        .replace('_', "!_")
                        .replace('%', "!%")
                ),),
            )
            .await
            .map_err(db_err("cannot list the stored procedures"))?;
        for (name, create) in &self.sql.procedures {
            if !existing.contains(name) {
                conn.query_drop(create)
                    .await
                    .map_err(|e| self.schema_err(e))?;
            }
        }
        Ok(())
    }

    /// The error of a failed creation: where the user may not create,
    /// one that carries the DDL for an owner to run.
    fn schema_err(&self, e: mysql_async::Error) -> Error {
        let table = &self.options.table;
        if !lacks_privilege(&e) {
            return db_err("cannot create the lease tables and their procedures")(e);
        }
        Error::StoreSetup(StoreError::with_source(
            KIND,
            format!(
                "the user of {} may not create table {table}, its fencing table or its \
                 procedures: have an owner run\n{}and grant the user {TABLE_PRIVILEGES} ON \
                 {}, {FENCING_PRIVILEGES} ON {} and {PROCEDURE_PRIVILEGES} ON PROCEDURE {} \
                 (docs/operators.md, \"Least privilege\"; a procedure the user may not \
                 execute is hidden from it, and taken for missing); the cause",
                self.shown,
                table.ddl(),
                table.quoted(),
                table.fencing_quoted(),
                table.procedure_names().join(", ")
            ),
            e,
        ))
    }
}
