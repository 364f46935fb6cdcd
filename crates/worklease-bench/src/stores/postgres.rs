//! The PostgreSQL store (`postgres://...?table=T`), one table per scenario.
//!
//! * Baseline: one prepared `UPDATE T_cas SET n = n + 1, data = $3 WHERE
//!   id = $1 AND n = $2` on a connection of the store's own pool: one
//!   round trip, one commit.
//! * Peer: session advisory locks, `pg_try_advisory_lock` /
//!   `pg_advisory_unlock` (on a connection of the same pool, kept from lock
//!   to unlock); a waiter blocks in `pg_advisory_lock` on a connection of
//!   its own, and the server wakes it at the unlock.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use worklease::store::postgres::deadpool_postgres::{Object, Pool};
use worklease::store::postgres::tokio_postgres::{self, NoTls, Statement};
use worklease::store::postgres::PostgresUrl;
use worklease::store::url;

use super::server::{self, Parts, Server};
use super::{cas_lost, Baseline, Entry, Peer, PeerClient, Register, Settings};
use crate::Result;

/// The PostgreSQL store's entry.
pub const ENTRY: Entry = server::entry::<Postgres>();

struct Postgres {
    config: tokio_postgres::Config,
    version: String,
    /// What cleanup drops.
    drops: Mutex<Vec<String>>,
}

#[async_trait]
impl Server for Postgres {
    const NAME: &'static str = "postgres";

    fn url(settings: &Settings) -> &str {
        &settings.postgres_url
    }

    async fn connect(settings: &Settings) -> Result<Self> {
        let config = tokio_postgres::Config::from_str(&settings.postgres_url)?;
        let (client, connection) = config.connect(NoTls).await.map_err(|e| {
            format!(
                "cannot connect to {}: {e}",
                url::redact(&settings.postgres_url)
            )
        })?;
        let task = tokio::spawn(connection);
        let version: String = client.query_one("SHOW server_version", &[]).await?.get(0);
        drop(client);
        let _ = task.await;
        Ok(Postgres {
            config,
            version,
            drops: Mutex::default(),
        })
    }

    fn describe(&self) -> String {
        format!("PostgreSQL {}", self.version)
    }

    fn namespace(&self, run: &str, tag: &str) -> String {
        format!("wl_bench_{run}_{tag}")
    }

    fn namespace_url(&self, settings: &Settings, table: &str) -> Result<String> {
        Ok(server::with_param(&settings.postgres_url, "table", table))
    }

    async fn open(&self, settings: &Settings, url: &str, table: &str) -> Result<Parts> {
        let store = Arc::new(PostgresUrl::parse(url)?.open()?);
        store.initialize().await?;
        let cas = format!("\"{table}_cas\"");
        {
            let mut drops = self.drops.lock().map_err(|_| "poisoned")?;
            drops.push(format!(
                "DROP TABLE IF EXISTS {}; DROP SEQUENCE IF EXISTS {}; DROP TABLE IF EXISTS {cas}",
                store.table().quoted(),
                store.table().sequence_quoted()
            ));
        }
        store
            .pool()
            .get()
            .await?
            .batch_execute(&format!(
                "CREATE TABLE {cas} (id int PRIMARY KEY, n bigint NOT NULL, data bytea)"
            ))
            .await?;
        let baseline = Arc::new(Table {
            pool: store.pool().clone(),
            insert: format!("INSERT INTO {cas} VALUES ($1, 0, NULL)"),
            update: format!("UPDATE {cas} SET n = n + 1, data = $3 WHERE id = $1 AND n = $2"),
            next: AtomicI32::new(0),
        });
        let peer = Arc::new(Advisory {
            pool: store.pool().clone(),
            config: self.config.clone(),
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
        let (client, connection) = self.config.connect(NoTls).await?;
        let task = tokio::spawn(connection);
        for sql in drops {
            client.batch_execute(&sql).await?;
        }
        drop(client);
        let _ = task.await;
        Ok(())
    }
}

struct Table {
    pool: Pool,
    insert: String,
    update: String,
    next: AtomicI32,
}

#[async_trait]
impl Baseline for Table {
    fn describe(&self) -> String {
        "one prepared UPDATE t SET n = n + 1, data = $3 WHERE id = $1 AND n = $2 on the store's pool"
            .to_string()
    }

    async fn register(&self) -> Result<Box<dyn Register>> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.pool.get().await?.execute(&self.insert, &[&id]).await?;
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
    id: i32,
    version: i64,
}

#[async_trait]
impl Register for Row {
    async fn cas(&mut self, data: &Bytes) -> Result<()> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached(&self.update).await?;
        let changed = client
            .execute(&stmt, &[&self.id, &self.version, &data.as_ref()])
            .await?;
        if changed != 1 {
            return Err(cas_lost("a PostgreSQL row"));
        }
        self.version += 1;
        Ok(())
    }
}

/// Session advisory locks, keyed by `hashtextextended(key, 0)`.
struct Advisory {
    pool: Pool,
    config: tokio_postgres::Config,
    /// Keeps this run's keys apart from others'.
    namespace: String,
}

const TRY_LOCK: &str = "SELECT pg_try_advisory_lock(hashtextextended($1, 0))";
const LOCK: &str = "SELECT pg_advisory_lock(hashtextextended($1, 0))";
const UNLOCK: &str = "SELECT pg_advisory_unlock(hashtextextended($1, 0))";

#[async_trait]
impl Peer for Advisory {
    fn describe(&self) -> String {
        "session advisory locks: pg_try_advisory_lock / pg_advisory_unlock on a connection of the same pool (waiters: pg_advisory_lock on a connection of their own)".to_string()
    }

    async fn client(&self, dedicated: bool) -> Result<Box<dyn PeerClient>> {
        let session = if dedicated {
            let (client, connection) = self.config.connect(NoTls).await?;
            tokio::spawn(connection);
            Session::Own(client, HashMap::new())
        } else {
            Session::Pooled(self.pool.clone(), None)
        };
        Ok(Box::new(AdvisoryClient {
            session,
            namespace: self.namespace.clone(),
        }))
    }
}

/// Where an advisory lock client's session is.
enum Session {
    /// A connection of its own, and its prepared statements.
    Own(tokio_postgres::Client, HashMap<&'static str, Statement>),
    /// The pool, and the connection taken from it while a lock is held.
    Pooled(Pool, Option<Object>),
}

struct AdvisoryClient {
    session: Session,
    namespace: String,
}

impl AdvisoryClient {
    /// Runs one prepared statement taking the key, returning its boolean
    /// (or void) column. A pooled client takes a connection from the pool
    /// and keeps it: a session lock lives on its connection.
    async fn run(&mut self, sql: &'static str, key: &str) -> Result<Option<bool>> {
        let key = format!("{}{key}", self.namespace);
        let row = match &mut self.session {
            Session::Own(client, cache) => {
                let stmt = match cache.get(sql) {
                    Some(s) => s.clone(),
                    None => {
                        let s = client.prepare(sql).await?;
                        cache.insert(sql, s.clone());
                        s
                    }
                };
                client.query_one(&stmt, &[&key]).await?
            }
            Session::Pooled(pool, held) => {
                if held.is_none() {
                    *held = Some(pool.get().await?);
                }
                let client = held.as_ref().expect("just taken");
                let stmt = client.prepare_cached(sql).await?;
                client.query_one(&stmt, &[&key]).await?
            }
        };
        Ok(row.try_get::<_, bool>(0).ok())
    }
}

#[async_trait]
impl PeerClient for AdvisoryClient {
    async fn try_lock(&mut self, key: &str) -> Result<()> {
        if self.run(TRY_LOCK, key).await? == Some(true) {
            return Ok(());
        }
        if let Session::Pooled(_, held) = &mut self.session {
            held.take();
        }
        Err(format!("advisory lock {key:?} is held").into())
    }

    async fn lock(&mut self, key: &str) -> Result<()> {
        self.run(LOCK, key).await?;
        Ok(())
    }

    async fn unlock(&mut self, key: &str) -> Result<()> {
        let released = self.run(UNLOCK, key).await?;
        if let Session::Pooled(_, held) = &mut self.session {
            // Back to the pool.
            held.take();
        }
        if released == Some(true) {
            Ok(())
        } else {
            Err(format!("advisory lock {key:?} was not held").into())
        }
    }
}
