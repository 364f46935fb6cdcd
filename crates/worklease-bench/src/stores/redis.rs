//! The Redis store (`redis://...?prefix=P`), one key prefix per scenario.
//!
//! * Baseline: one `EVALSHA` of a minimal compare-and-set script (`HGET`
//!   the version, compare, `HSET` version and data) on the store's own
//!   multiplexed connection.
//! * Peer: Redlock on one instance, the `rslock` crate: `lock` /
//!   `unlock` / `extend` through one `LockManager` (one multiplexed
//!   connection) shared by the clients; a waiter uses `acquire_no_guard`
//!   (retrying with rslock's default random delay of up to 200 ms) on a
//!   manager of its own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};
use rslock::LockManager;
use worklease::store::redis::{RedisConfig, RedisStore};
use worklease::store::url;

use super::server::{self, Parts, Server};
use super::{cas_lost, Baseline, Entry, Peer, PeerClient, Register, Settings};
use crate::Result;

/// The Redis store's entry.
pub const ENTRY: Entry = server::entry::<Redis>();

const CAS: &str = "local v = redis.call('HGET', KEYS[1], 'n')
if (v == false and ARGV[1] == '0') or v == ARGV[1] then
  redis.call('HSET', KEYS[1], 'n', ARGV[2], 'data', ARGV[3])
  return 1
end
return 0";

struct Redis {
    client: redis::Client,
    version: String,
}

/// Every key of run `run` starts with this.
fn run_prefix(run: &str) -> String {
    format!("wl-bench:{run}:")
}

#[async_trait]
impl Server for Redis {
    const NAME: &'static str = "redis";

    fn url(settings: &Settings) -> &str {
        &settings.redis_url
    }

    async fn connect(settings: &Settings) -> Result<Self> {
        let client = redis::Client::open(settings.redis_url.as_str())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| {
                format!(
                    "cannot connect to {}: {e}",
                    url::redact(&settings.redis_url)
                )
            })?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await?;
        let version = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("unknown")
            .trim()
            .to_string();
        Ok(Redis { client, version })
    }

    fn describe(&self) -> String {
        format!("Redis {}", self.version)
    }

    fn namespace(&self, run: &str, tag: &str) -> String {
        format!("{}{tag}:", run_prefix(run))
    }

    fn namespace_url(&self, settings: &Settings, prefix: &str) -> Result<String> {
        Ok(server::with_param(&settings.redis_url, "prefix", prefix))
    }

    async fn open(&self, settings: &Settings, url: &str, prefix: &str) -> Result<Parts> {
        let store = Arc::new(RedisStore::new(RedisConfig::from_url(url)?)?);
        store.ready().await?;
        let baseline = Arc::new(Cas {
            conn: store.connection().await?,
            script: Script::new(CAS),
            prefix: format!("{prefix}cas:{:08x}:", rand::random::<u32>()),
            next: AtomicU64::new(0),
        });
        let base = &settings.redis_url;
        let peer = Arc::new(Redlock {
            url: base.clone(),
            shared: LockManager::new(vec![base.clone()]),
            prefix: format!("{prefix}redlock:"),
            ttl: settings.ttl,
        });
        Ok(Parts {
            store,
            baseline,
            peer,
        })
    }

    async fn cleanup(&self, settings: &Settings) -> Result<()> {
        let mut conn = self.client.get_multiplexed_async_connection().await?;
        let keys: Vec<String> = conn
            .scan_match::<_, String>(format!("{}*", run_prefix(&settings.run)))
            .await?
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<redis::RedisResult<_>>()?;
        for chunk in keys.chunks(500) {
            let _: () = redis::cmd("UNLINK")
                .arg(chunk)
                .query_async(&mut conn)
                .await?;
        }
        Ok(())
    }
}

struct Cas {
    conn: ConnectionManager,
    script: Script,
    prefix: String,
    next: AtomicU64,
}

#[async_trait]
impl Baseline for Cas {
    fn describe(&self) -> String {
        "one EVALSHA of a compare-and-set script (HGET version, compare, HSET version and data) on the store's connection".to_string()
    }

    async fn register(&self) -> Result<Box<dyn Register>> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(Key {
            conn: self.conn.clone(),
            script: self.script.clone(),
            key: format!("{}{n}", self.prefix),
            version: 0,
        }))
    }
}

struct Key {
    conn: ConnectionManager,
    script: Script,
    key: String,
    version: u64,
}

#[async_trait]
impl Register for Key {
    async fn cas(&mut self, data: &Bytes) -> Result<()> {
        let swapped: i64 = self
            .script
            .key(&self.key)
            .arg(self.version)
            .arg(self.version + 1)
            .arg(data.as_ref())
            .invoke_async(&mut self.conn)
            .await?;
        if swapped != 1 {
            return Err(cas_lost("a Redis key"));
        }
        self.version += 1;
        Ok(())
    }
}

/// Redlock (rslock) on the one server.
struct Redlock {
    url: String,
    shared: LockManager,
    prefix: String,
    ttl: Duration,
}

#[async_trait]
impl Peer for Redlock {
    fn describe(&self) -> String {
        "Redlock on one instance (rslock 0.7): lock / unlock / extend on one shared LockManager; waiters: acquire_no_guard on a manager of their own (retries after a random delay of up to 200 ms)".to_string()
    }

    async fn client(&self, dedicated: bool) -> Result<Box<dyn PeerClient>> {
        let manager = if dedicated {
            LockManager::new(vec![self.url.clone()])
        } else {
            self.shared.clone()
        };
        // One attempt for `try_lock`; `lock` waits with rslock's defaults.
        let mut once = manager.clone();
        once.set_retry(1, Duration::from_millis(1));
        Ok(Box::new(RedlockClient {
            waiting: manager,
            once,
            prefix: self.prefix.clone(),
            ttl: self.ttl,
            held: HashMap::new(),
        }))
    }
}

struct RedlockClient {
    waiting: LockManager,
    once: LockManager,
    prefix: String,
    ttl: Duration,
    held: HashMap<String, rslock::Lock>,
}

#[async_trait]
impl PeerClient for RedlockClient {
    async fn try_lock(&mut self, key: &str) -> Result<()> {
        let resource = format!("{}{key}", self.prefix);
        let lock = self
            .once
            .lock(resource.as_bytes(), self.ttl)
            .await
            .map_err(|e| format!("Redlock {key:?}: {e}"))?;
        self.held.insert(key.to_string(), lock);
        Ok(())
    }

    async fn lock(&mut self, key: &str) -> Result<()> {
        let resource = format!("{}{key}", self.prefix);
        let lock = self
            .waiting
            .acquire_no_guard(resource.as_bytes(), self.ttl)
            .await
            .map_err(|e| format!("Redlock {key:?}: {e}"))?;
        self.held.insert(key.to_string(), lock);
        Ok(())
    }

    async fn unlock(&mut self, key: &str) -> Result<()> {
        let lock = self
            .held
            .remove(key)
            .ok_or_else(|| format!("Redlock {key:?} is not held"))?;
        self.once.unlock(&lock).await;
        Ok(())
    }

    async fn extend(&mut self, key: &str) -> Option<Result<()>> {
        let Some(lock) = self.held.remove(key) else {
            return Some(Err(format!("Redlock {key:?} is not held").into()));
        };
        Some(match self.once.extend(&lock, self.ttl).await {
            Ok(extended) => {
                self.held.insert(key.to_string(), extended);
                Ok(())
            }
            Err(e) => Err(format!("Redlock extend {key:?}: {e}").into()),
        })
    }
}
