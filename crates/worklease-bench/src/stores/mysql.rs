//! The MySQL / MariaDB store (`mysql://...?table=T`), one table per
//! scenario.
//!
//! * Baseline: one prepared `UPDATE T_cas SET n = n + 1, data = ? WHERE
//!   id = ? AND n = ?` on a connection of the store's own pool: one round
//!   trip, one commit.
//! * Peer: `GET_LOCK` / `RELEASE_LOCK` (on a connection of the same pool,
//!   kept from lock to unlock); a waiter blocks in `GET_LOCK(key, 86400)` on
//!   a connection of its own, and the server wakes it at the release. The
//!   peer keeps nothing durable: the lock lives on its connection (a lost
//!   connection or a restart frees it), has no fencing token and stacks
//!   per session (a session that takes it N times must release it N
//!   times).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use worklease::store::mysql::mysql_async::{self, prelude::Queryable, Conn, Pool};
use worklease::store::mysql::MysqlUrl;
use worklease::store::url;

use super::server::{self, Parts, Server};
use super::{cas_lost, Baseline, Entry, Peer, PeerClient, Register, Settings};
use crate::Result;

/// The MySQL store's entry.
pub const ENTRY: Entry = server::entry::<Mysql>();

struct Mysql {
    opts: mysql_async::Opts,
    version: String,
    /// What cleanup drops.
    drops: Mutex<Vec<String>>,
}

#[async_trait]
impl Server for Mysql {
    const NAME: &'static str = "mysql";

    fn url(settings: &Settings) -> &str {
        &settings.mysql_url
    }

    async fn connect(settings: &Settings) -> Result<Self> {
        let opts = mysql_async::Opts::from_url(&settings.mysql_url)?;
        let mut conn = Conn::new(opts.clone()).await.map_err(|e| {
            format!(
                "cannot connect to {}: {e}",
                url::redact(&settings.mysql_url)
            )
        })?;
        let version: Option<String> = conn.query_first("SELECT VERSION()").await?;
        conn.disconnect().await?;
        Ok(Mysql {
            opts,
            version: version.unwrap_or_default(),
            drops: Mutex::default(),
        })
    }

    fn describe(&self) -> String {
        if self.version.contains("MariaDB") {
            format!("MariaDB {}", self.version)
        } else {
            format!("MySQL {}", self.version)
        }
    }

    fn namespace(&self, run: &str, tag: &str) -> String {
        format!("wl_bench_{run}_{tag}")
    }

    fn namespace_url(&self, settings: &Settings, table: &str) -> Result<String> {
        Ok(server::with_param(&settings.mysql_url, "table", table))
    }

    async fn open(&self, settings: &Settings, url: &str, table: &str) -> Result<Parts> {
        let store = Arc::new(MysqlUrl::parse(url)?.open()?);
        store.initialize().await?;
        let cas = format!("`{table}_cas`");
        {
            let mut drops = self.drops.lock().map_err(|_| "poisoned")?;
            drops.push(format!(
                "DROP TABLE IF EXISTS `{table}`, `{table}_fencing`, {cas}"
            ));
            for name in store.table().procedure_names() {
                drops.push(format!("DROP PROCEDURE IF EXISTS `{name}`"));
            }
        }
        store
            .pool()
            .get_conn()
            .await?
            .query_drop(format!(
                "CREATE TABLE {cas} (id INT PRIMARY KEY, n BIGINT NOT NULL, data LONGBLOB) \
                 ENGINE=InnoDB"
            ))
            .await?;
        let baseline = Arc::new(Table {
            pool: store.pool().clone(),
            insert: format!("INSERT INTO {cas} VALUES (?, 0, NULL)"),
            update: format!("UPDATE {cas} SET n = n + 1, data = ? WHERE id = ? AND n = ?"),
            next: AtomicU32::new(0),
        });
        let peer = Arc::new(NamedLocks {
            pool: store.pool().clone(),
            opts: self.opts.clone(),
            namespace: format!("{}:", settings.run),
        });
        Ok(Parts {
            store,
            baseline,
            peer,
        })
    }

    async fn cleanup(&self, _settings: &Settings) -> Result<()> {
        let drops = std::mem::take(&mut *self.drops.lock().map_err(|_| "poisoned")?);
        if drops.is_empty() {
            return Ok(());
        }
        let mut conn = Conn::new(self.opts.clone()).await?;
        for sql in drops {
            conn.query_drop(sql).await?;
        }
        conn.disconnect().await?;
        Ok(())
    }
}

struct Table {
    pool: Pool,
    insert: String,
    update: String,
    next: AtomicU32,
}

#[async_trait]
impl Baseline for Table {
    fn describe(&self) -> String {
        "one prepared UPDATE t SET n = n + 1, data = ? WHERE id = ? AND n = ? on the store's pool"
            .to_string()
    }

    async fn register(&self) -> Result<Box<dyn Register>> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.pool
            .get_conn()
            .await?
            .exec_drop(&self.insert, (id,))
            .await?;
        Ok(Box::new(Row {
            pool: self.pool.clone(),
            update: self.update.clone(),
            id,
            version: 0,
        }))
    }
}

struct Row {
    pool: Pool,
    update: String,
    id: u32,
    version: u64,
}

#[async_trait]
impl Register for Row {
    async fn cas(&mut self, data: &Bytes) -> Result<()> {
        let mut conn = self.pool.get_conn().await?;
        conn.exec_drop(&self.update, (data.as_ref(), self.id, self.version))
            .await?;
        if conn.affected_rows() != 1 {
            return Err(cas_lost("a MySQL row"));
        }
        self.version += 1;
        Ok(())
    }
}

/// `GET_LOCK` named locks, keyed by `SHA2(key, 256)` (names are at most 64
/// characters).
struct NamedLocks {
    pool: Pool,
    opts: mysql_async::Opts,
    /// Keeps this run's keys apart from others'.
    namespace: String,
}

const TRY_LOCK: &str = "SELECT GET_LOCK(SHA2(?, 256), 0)";
/// A day: MariaDB answers NULL to the negative ("forever") timeout MySQL takes.
const LOCK: &str = "SELECT GET_LOCK(SHA2(?, 256), 86400)";
const UNLOCK: &str = "SELECT RELEASE_LOCK(SHA2(?, 256))";

#[async_trait]
impl Peer for NamedLocks {
    fn describe(&self) -> String {
        "named locks: GET_LOCK(key, 0) / RELEASE_LOCK on a connection of the same pool (waiters: GET_LOCK(key, 86400) on a connection of their own); nothing durable, no fencing, stacks per session".to_string()
    }

    async fn client(&self, dedicated: bool) -> Result<Box<dyn PeerClient>> {
        let session = if dedicated {
            Session::Own(Conn::new(self.opts.clone()).await?)
        } else {
            Session::Pooled(self.pool.clone(), None)
        };
        Ok(Box::new(LockClient {
            session,
            namespace: self.namespace.clone(),
        }))
    }
}

/// Where a named lock client's session is.
enum Session {
    /// A connection of its own.
    Own(Conn),
    /// The pool, and the connection taken from it while a lock is held.
    Pooled(Pool, Option<Conn>),
}

struct LockClient {
    session: Session,
    namespace: String,
}

impl LockClient {
    /// Runs one statement taking the key, returning its 1/0/NULL column. A
    /// pooled client takes a connection from the pool and keeps it: a
    /// named lock lives on its connection.
    async fn run(&mut self, sql: &'static str, key: &str) -> Result<Option<i64>> {
        let key = format!("{}{key}", self.namespace);
        let conn = match &mut self.session {
            Session::Own(conn) => conn,
            Session::Pooled(pool, held) => match held {
                Some(conn) => conn,
                None => held.insert(pool.get_conn().await?),
            },
        };
        let got: Option<Option<i64>> = conn.exec_first(sql, (key,)).await?;
        Ok(got.flatten())
    }

    /// A pooled client gives its connection back.
    fn give_back(&mut self) {
        if let Session::Pooled(_, held) = &mut self.session {
            held.take();
        }
    }
}

#[async_trait]
impl PeerClient for LockClient {
    async fn try_lock(&mut self, key: &str) -> Result<()> {
        if self.run(TRY_LOCK, key).await? == Some(1) {
            return Ok(());
        }
        self.give_back();
        Err(format!("named lock {key:?} is held").into())
    }

    async fn lock(&mut self, key: &str) -> Result<()> {
        if self.run(LOCK, key).await? == Some(1) {
            Ok(())
        } else {
            Err(format!("GET_LOCK({key:?}) failed").into())
        }
    }

    async fn unlock(&mut self, key: &str) -> Result<()> {
        let released = self.run(UNLOCK, key).await?;
        self.give_back();
        if released == Some(1) {
            Ok(())
        } else {
            Err(format!("named lock {key:?} was not held").into())
        }
    }
}
