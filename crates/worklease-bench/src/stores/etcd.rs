//! The etcd store (`etcd://...?prefix=P`), one key prefix per scenario.
//!
//! * Baseline: one `Txn` comparing the key's `mod_revision` with the
//!   revision this client last wrote and putting the new value, on the
//!   store's own `etcd_client::Client`: one round trip, one Raft commit.
//! * Peer: the server's own `Lock` / `Unlock` RPC through `etcd-client`,
//!   each client on an etcd lease of its own (TTL as ours, kept alive while
//!   in use); a waiter's `Lock` blocks in the server until the unlock.
//!   Its extension is one `LeaseKeepAlive` round trip.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, LeaseKeepAliveStream, LeaseKeeper, LockOptions, Txn,
    TxnOp,
};
use worklease::store::etcd::{EtcdConfig, EtcdStore};
use worklease::store::url;

use super::server::{self, Parts, Server};
use super::{cas_lost, Baseline, Entry, Peer, PeerClient, Register, Settings};
use crate::Result;

/// The etcd store's entry.
pub const ENTRY: Entry = server::entry::<Etcd>();

struct Etcd {
    client: Client,
    version: String,
}

/// Every key of run `run` starts with this.
fn run_prefix(run: &str) -> String {
    format!("wl-bench/{run}/")
}

#[async_trait]
impl Server for Etcd {
    const NAME: &'static str = "etcd";

    fn url(settings: &Settings) -> &str {
        &settings.etcd_url
    }

    async fn connect(settings: &Settings) -> Result<Self> {
        let config = EtcdConfig::from_url(&settings.etcd_url)?;
        let store = EtcdStore::new(config);
        store
            .ready()
            .await
            .map_err(|e| format!("cannot reach {}: {e}", url::redact(&settings.etcd_url)))?;
        let mut client = store.client().await?;
        let version = client.status().await?.version().to_string();
        Ok(Etcd { client, version })
    }

    fn describe(&self) -> String {
        format!("etcd {}", self.version)
    }

    fn namespace(&self, run: &str, tag: &str) -> String {
        format!("{}{tag}/", run_prefix(run))
    }

    fn namespace_url(&self, settings: &Settings, prefix: &str) -> Result<String> {
        Ok(server::with_param(&settings.etcd_url, "prefix", prefix))
    }

    async fn open(&self, settings: &Settings, url: &str, prefix: &str) -> Result<Parts> {
        let store = Arc::new(EtcdStore::new(EtcdConfig::from_url(url)?));
        store.ready().await?;
        let client = store.client().await?;
        let baseline = Arc::new(Cas {
            client: client.clone(),
            prefix: format!("{prefix}cas/{:08x}/", rand::random::<u32>()),
            next: AtomicU64::new(0),
        });
        let peer = Arc::new(EtcdLock {
            client,
            prefix: format!("{prefix}lock/"),
            ttl: settings.ttl,
        });
        Ok(Parts {
            store,
            baseline,
            peer,
        })
    }

    async fn cleanup(&self, settings: &Settings) -> Result<()> {
        let mut client = self.client.clone();
        client
            .delete(
                run_prefix(&settings.run),
                Some(DeleteOptions::new().with_prefix()),
            )
            .await?;
        Ok(())
    }
}

struct Cas {
    client: Client,
    prefix: String,
    next: AtomicU64,
}

#[async_trait]
impl Baseline for Cas {
    fn describe(&self) -> String {
        "one Txn: compare mod_revision, put the new value (etcd-client, the store's client)"
            .to_string()
    }

    async fn register(&self) -> Result<Box<dyn Register>> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(Key {
            client: self.client.clone(),
            key: format!("{}{n}", self.prefix),
            revision: 0,
        }))
    }
}

struct Key {
    client: Client,
    key: String,
    /// The mod revision this client last wrote (0: no key yet).
    revision: i64,
}

#[async_trait]
impl Register for Key {
    async fn cas(&mut self, data: &Bytes) -> Result<()> {
        let txn = Txn::new()
            .when([Compare::mod_revision(
                self.key.as_str(),
                CompareOp::Equal,
                self.revision,
            )])
            .and_then([TxnOp::put(self.key.as_str(), data.to_vec(), None)]);
        let resp = self.client.txn(txn).await?;
        if !resp.succeeded() {
            return Err(cas_lost("an etcd key"));
        }
        self.revision = resp
            .header()
            .map(|h| h.revision())
            .ok_or("an etcd reply without a header")?;
        Ok(())
    }
}

/// etcd's Lock service.
struct EtcdLock {
    client: Client,
    prefix: String,
    ttl: Duration,
}

#[async_trait]
impl Peer for EtcdLock {
    fn describe(&self) -> String {
        "etcd's Lock / Unlock RPC (etcd-client) on an etcd lease per client with the same TTL; waiters block in Lock".to_string()
    }

    async fn client(&self, _dedicated: bool) -> Result<Box<dyn PeerClient>> {
        let mut client = self.client.clone();
        let lease = client
            .lease_grant(self.ttl.as_secs().max(1) as i64, None)
            .await?
            .id();
        let (keeper, stream) = client.lease_keep_alive(lease).await?;
        Ok(Box::new(EtcdLockClient {
            client,
            prefix: self.prefix.clone(),
            lease,
            keeper,
            stream,
            refreshed: Instant::now(),
            refresh_every: self.ttl / 3,
            held: std::collections::HashMap::new(),
        }))
    }
}

struct EtcdLockClient {
    client: Client,
    prefix: String,
    lease: i64,
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
    refreshed: Instant,
    refresh_every: Duration,
    /// Lock name → the key Lock returned (what Unlock takes).
    held: std::collections::HashMap<String, Vec<u8>>,
}

impl EtcdLockClient {
    /// One keep-alive round trip on the client's lease.
    async fn keep_alive(&mut self) -> Result<()> {
        self.keeper.keep_alive().await?;
        self.stream
            .message()
            .await?
            .ok_or("the keep-alive stream ended")?;
        self.refreshed = Instant::now();
        Ok(())
    }
}

#[async_trait]
impl PeerClient for EtcdLockClient {
    async fn try_lock(&mut self, key: &str) -> Result<()> {
        // etcd's Lock has no "try": on a free name it returns at once.
        self.lock(key).await
    }

    async fn lock(&mut self, key: &str) -> Result<()> {
        if self.refreshed.elapsed() >= self.refresh_every {
            self.keep_alive().await?;
        }
        let resp = self
            .client
            .lock(
                format!("{}{key}", self.prefix),
                Some(LockOptions::new().with_lease(self.lease)),
            )
            .await?;
        self.held.insert(key.to_string(), resp.key().to_vec());
        Ok(())
    }

    async fn unlock(&mut self, key: &str) -> Result<()> {
        let lock_key = self
            .held
            .remove(key)
            .ok_or_else(|| format!("etcd lock {key:?} is not held"))?;
        self.client.unlock(lock_key).await?;
        Ok(())
    }

    async fn extend(&mut self, key: &str) -> Option<Result<()>> {
        if !self.held.contains_key(key) {
            return Some(Err(format!("etcd lock {key:?} is not held").into()));
        }
        Some(self.keep_alive().await)
    }
}
