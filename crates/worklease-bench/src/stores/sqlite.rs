//! The embedded SQLite store (`sqlite:PATH`), in files of a temporary
//! directory. Baseline: one autocommit `UPDATE ... WHERE id = ? AND n = ?`
//! through rusqlite on one connection with the store's settings (WAL,
//! `synchronous = FULL`, busy timeout), run on a blocking thread behind a
//! mutex as the store runs its own: one durable compare-and-set. No peer.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use rusqlite::{params, Connection};

use super::{cas_lost, Baseline, Bench, Entry, Opened, Register, Settings};
use crate::Result;

/// The SQLite store's entry.
pub const ENTRY: Entry = Entry {
    name: "sqlite",
    scheme: "sqlite",
    connect: Ok(connect),
};

fn connect(_settings: &Settings) -> BoxFuture<'_, Result<Arc<dyn Bench>>> {
    Box::pin(async {
        let dir = tempfile::Builder::new()
            .prefix("worklease-bench-")
            .tempdir()?;
        Ok(Arc::new(Sqlite { dir }) as Arc<dyn Bench>)
    })
}

struct Sqlite {
    dir: tempfile::TempDir,
}

impl Sqlite {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

#[async_trait]
impl Bench for Sqlite {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn shown_url(&self) -> String {
        format!("sqlite:{}/TAG.db", self.dir.path().display())
    }

    async fn server(&self) -> Option<String> {
        Some(format!("SQLite {} (bundled)", rusqlite::version()))
    }

    async fn open(&self, tag: &str) -> Result<Opened> {
        let url = format!("sqlite:{}", self.path(&format!("{tag}.db")).display());
        let store = worklease::store::url::open(&url)?;
        let cas = self.path(&format!("{tag}-baseline.db"));
        let conn = tokio::task::spawn_blocking(move || -> Result<Connection> {
            let conn = Connection::open(cas)?;
            conn.busy_timeout(Duration::from_secs(5))?;
            let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(format!("the baseline file stays in journal mode {mode}").into());
            }
            conn.execute_batch(
                "PRAGMA synchronous = FULL;
                 CREATE TABLE cas (id INTEGER PRIMARY KEY, n INTEGER NOT NULL, data BLOB);",
            )?;
            Ok(conn)
        })
        .await??;
        Ok(Opened {
            url,
            store,
            peer: None,
            baseline: Arc::new(Table {
                conn: Arc::new(Mutex::new(conn)),
                next: AtomicI64::new(0),
            }),
        })
    }

    fn handoff_across_processes(&self) -> bool {
        true
    }

    async fn cleanup(&self) -> Result<()> {
        // The temporary directory goes with `self`.
        Ok(())
    }
}

struct Table {
    conn: Arc<Mutex<Connection>>,
    next: AtomicI64,
}

#[async_trait]
impl Baseline for Table {
    fn describe(&self) -> String {
        "one autocommit UPDATE cas SET n = n + 1, data = ? WHERE id = ? AND n = ? (rusqlite, WAL, synchronous = FULL, on a blocking thread)".to_string()
    }

    async fn register(&self) -> Result<Box<dyn Register>> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let conn = conn.lock().map_err(|_| "poisoned")?;
            conn.execute("INSERT INTO cas VALUES (?1, 0, NULL)", [id])?;
            Ok(())
        })
        .await??;
        Ok(Box::new(Row {
            conn: self.conn.clone(),
            id,
            version: 0,
        }))
    }
}

struct Row {
    conn: Arc<Mutex<Connection>>,
    id: i64,
    version: i64,
}

#[async_trait]
impl Register for Row {
    async fn cas(&mut self, data: &Bytes) -> Result<()> {
        let (conn, id, version, data) = (self.conn.clone(), self.id, self.version, data.clone());
        let changed = tokio::task::spawn_blocking(move || -> Result<usize> {
            let conn = conn.lock().map_err(|_| "poisoned")?;
            let mut stmt = conn
                .prepare_cached("UPDATE cas SET n = n + 1, data = ?3 WHERE id = ?1 AND n = ?2")?;
            Ok(stmt.execute(params![id, version, data.as_ref()])?)
        })
        .await??;
        if changed != 1 {
            return Err(cas_lost("a SQLite row"));
        }
        self.version += 1;
        Ok(())
    }
}
