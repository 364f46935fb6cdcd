//! The schema: its version (`PRAGMA user_version`) and its creation.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use crate::error::{Result, StoreError};

use super::{db_err, KIND};

/// The schema version this code writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 1;

pub(super) fn migrate(conn: &mut Connection, shown: &str) -> Result<()> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db_err("cannot begin the schema transaction"))?;
    let version: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(db_err("cannot read the schema version"))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::new(
            KIND,
            format!(
                "{shown:?} has schema version {version}: newer than this worklease's {SCHEMA_VERSION} \
                 (upgrade worklease), or not a worklease database"
            ),
        )
        .into());
    }
    if version < 1 {
        // Refuse to add our tables to another application's database.
        let foreign: Option<String> = tx
            .query_row(
                "SELECT name FROM sqlite_master WHERE type = 'table'
                 AND name NOT IN ('worklease_sequence', 'worklease_leases') LIMIT 1",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(db_err("cannot read the schema"))?;
        if let Some(table) = foreign {
            return Err(StoreError::new(
                KIND,
                format!("{shown:?} is not a worklease database (it has a table {table:?}): use a file of its own"),
            )
            .into());
        }
        tx.execute_batch(
            "CREATE TABLE IF NOT EXISTS worklease_sequence (
                 name  TEXT PRIMARY KEY,
                 value INTEGER NOT NULL
             );
             INSERT OR IGNORE INTO worklease_sequence (name, value) VALUES ('fencing_token', 0);
             CREATE TABLE IF NOT EXISTS worklease_leases (
                 work_id            TEXT PRIMARY KEY,
                 holder_id          TEXT NOT NULL,
                 fencing_token      INTEGER NOT NULL,
                 ttl_ms             INTEGER NOT NULL,
                 phase              TEXT NOT NULL,
                 clock_epoch        TEXT NOT NULL,
                 expires_clock_ms   INTEGER NOT NULL,
                 expires_at_unix_ms INTEGER NOT NULL,
                 checkpoint         BLOB,
                 prev_holder_id     TEXT,
                 prev_fencing_token INTEGER,
                 prev_end           TEXT
             );
             PRAGMA user_version = 1;",
        )
        .map_err(db_err("cannot create the schema"))?;
    }
    tx.commit().map_err(db_err("cannot commit the schema"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::sqlite::{SqliteStore, TokioClock};

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("leases.db");
        Connection::open(&path)
            .expect("open")
            .execute_batch("PRAGMA user_version = 99")
            .expect("set version");
        let e = SqliteStore::open_with_clock(&path, Arc::new(TokioClock::new())).unwrap_err();
        assert!(e.to_string().contains("schema version 99"), "{e}");
    }
}
