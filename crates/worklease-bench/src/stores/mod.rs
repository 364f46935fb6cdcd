//! The stores under test. Each is ONE entry of [`table`]: its URL scheme,
//! how to open ours on a fresh namespace (a table, a key prefix, a file),
//! its baseline (the store's minimal single-round-trip compare-and-set, on
//! the same client library and pool/connection as ours) and, where one runs
//! here, its peer (the lock users already have on that server).
//!
//! Adding a store is adding a module with an [`Entry`] and listing it in
//! [`table`]; a store on a server implements [`server::Server`], which
//! keeps the set-up every server store shares in one place. etcd (`etcd://`, bench feature `etcd`) and S3 on moto
//! (`s3://`, bench feature `object-store`) are entries like the others:
//! etcd's baseline is one `Txn` comparing the key's `mod_revision` and
//! putting the new value on the store's client, its peer the server's
//! `Lock`/`Unlock` RPC; S3's baseline is one conditional `PUT`
//! (`If-Match: <ETag>`) through the store's `object_store` client, its
//! peer a hand-rolled `PUT If-None-Match: *` / `DELETE` lock. DynamoDB
//! on dynalite (`dynamodb://`, bench feature `dynamodb`): its baseline is
//! one conditional `PutItem` on the store's `aws-sdk-dynamodb` client, its
//! peer the AWS DynamoDB Lock Client's pattern, hand-rolled.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use worklease::store::{Checkpoint, ExpiryClock, Grant, LeaseInfo, LeaseRef};
use worklease::{HolderId, LeaseStore, WorkId};

use crate::Result;

#[cfg(feature = "dynamodb")]
pub mod dynamodb;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod memory;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "object-store")]
pub mod object;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "server")]
pub mod server;
pub mod sqlite;

/// Where the servers are, and what names this run may use.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A random tag of this run, in every table, key prefix and file name.
    pub run: String,
    /// The PostgreSQL server (without `table=`).
    #[cfg(feature = "postgres")]
    pub postgres_url: String,
    /// The MySQL / MariaDB server (without `table=`).
    #[cfg(feature = "mysql")]
    pub mysql_url: String,
    /// The Redis server (without `prefix=`).
    #[cfg(feature = "redis")]
    pub redis_url: String,
    /// The etcd cluster (without `prefix=`).
    #[cfg(feature = "etcd")]
    pub etcd_url: String,
    /// The S3 bucket and prefix, with its endpoint (`s3://` URL).
    #[cfg(feature = "object-store")]
    pub s3_url: String,
    /// The DynamoDB table, with its endpoint and region (`dynamodb://` URL).
    #[cfg(feature = "dynamodb")]
    pub dynamodb_url: String,
    /// The TTL of the peers' locks (as ours).
    #[cfg_attr(
        not(any(feature = "redis", feature = "etcd", feature = "dynamodb")),
        allow(dead_code)
    )]
    pub ttl: Duration,
}

/// One store of the benchmark.
pub struct Entry {
    /// `memory`, `sqlite`, `postgres`, `mysql`, `redis`, `etcd`, `s3`,
    /// `dynamodb`.
    pub name: &'static str,
    /// The URL scheme ours opens from.
    pub scheme: &'static str,
    /// Connects (checks the server answers); `None` when this build lacks
    /// the store, with the reason.
    pub connect: std::result::Result<Connect, &'static str>,
}

/// Connects to a store's server.
pub type Connect = for<'a> fn(&'a Settings) -> BoxFuture<'a, Result<Arc<dyn Bench>>>;

/// Every store, in report order: those this build has, then slots for the
/// ones still being built.
pub fn table() -> Vec<Entry> {
    #[allow(unused_mut)]
    let mut stores = vec![memory::ENTRY, sqlite::ENTRY];
    #[cfg(feature = "postgres")]
    stores.push(postgres::ENTRY);
    #[cfg(not(feature = "postgres"))]
    stores.push(Entry {
        name: "postgres",
        scheme: "postgres",
        connect: Err("built without the bench feature `postgres`"),
    });
    #[cfg(feature = "mysql")]
    stores.push(mysql::ENTRY);
    #[cfg(not(feature = "mysql"))]
    stores.push(Entry {
        name: "mysql",
        scheme: "mysql",
        connect: Err("built without the bench feature `mysql`"),
    });
    #[cfg(feature = "redis")]
    stores.push(redis::ENTRY);
    #[cfg(not(feature = "redis"))]
    stores.push(Entry {
        name: "redis",
        scheme: "redis",
        connect: Err("built without the bench feature `redis`"),
    });
    #[cfg(feature = "etcd")]
    stores.push(etcd::ENTRY);
    #[cfg(not(feature = "etcd"))]
    stores.push(Entry {
        name: "etcd",
        scheme: "etcd",
        connect: Err("built without the bench feature `etcd`"),
    });
    #[cfg(feature = "object-store")]
    stores.push(object::ENTRY);
    #[cfg(not(feature = "object-store"))]
    stores.push(Entry {
        name: "s3",
        scheme: "s3",
        connect: Err("built without the bench feature `object-store`"),
    });
    #[cfg(feature = "dynamodb")]
    stores.push(dynamodb::ENTRY);
    #[cfg(not(feature = "dynamodb"))]
    stores.push(Entry {
        name: "dynamodb",
        scheme: "dynamodb",
        connect: Err("built without the bench feature `dynamodb`"),
    });
    stores
}

/// A store under test, connected.
#[async_trait]
pub trait Bench: Send + Sync {
    /// The store's name (as in [`Entry::name`]).
    fn name(&self) -> &'static str;

    /// Where it is (URL without password).
    fn shown_url(&self) -> String;

    /// The server's version, where there is a server.
    async fn server(&self) -> Option<String>;

    /// Opens ours on a new, empty namespace named by `tag` (a table, a key
    /// prefix, a file; lower-case letters, digits and `_`), from a store
    /// URL, with the baseline and the peer on the same client and pool.
    async fn open(&self, tag: &str) -> Result<Opened>;

    /// Whether another process opening [`Opened::url`] sees the same
    /// leases (not so for `memory:`).
    fn shared_across_processes(&self) -> bool {
        true
    }

    /// Whether the hand-off scenario also runs with every participant in
    /// a process of its own: where a store value's waiters are woken
    /// another way by other processes than by the value itself (SQLite:
    /// through the database file). On a server store every value has its
    /// own notification connection, so other processes take the same
    /// path as one.
    fn handoff_across_processes(&self) -> bool {
        false
    }

    /// Removes every namespace [`Bench::open`] made.
    async fn cleanup(&self) -> Result<()>;
}

/// Ours on a fresh namespace, and the baseline beside it.
pub struct Opened {
    /// The store URL (with its password: for a child process only).
    pub url: String,
    /// Ours, opened from [`Opened::url`].
    pub store: Arc<dyn LeaseStore>,
    /// The baseline on the same client library and pool.
    pub baseline: Arc<dyn Baseline>,
    /// The peer lock, if one runs here.
    pub peer: Option<Arc<dyn Peer>>,
}

/// The store's minimal single-round-trip compare-and-set.
#[async_trait]
pub trait Baseline: Send + Sync {
    /// What one compare-and-set is.
    fn describe(&self) -> String;

    /// A register of its own (a row, a key) for one client, at version 0.
    async fn register(&self) -> Result<Box<dyn Register>>;
}

/// One client's register.
#[async_trait]
pub trait Register: Send {
    /// One round trip: writes `data` and version + 1 where the stored
    /// version is the one this client last wrote; an error otherwise.
    async fn cas(&mut self, data: &Bytes) -> Result<()>;
}

/// The lock users already have on a server.
#[async_trait]
pub trait Peer: Send + Sync {
    /// What it is.
    fn describe(&self) -> String;

    /// A client: `dedicated` for one that waits (its own connection or
    /// session), else one sharing a pool or connection like ours.
    async fn client(&self, dedicated: bool) -> Result<Box<dyn PeerClient>>;
}

/// One client of a peer lock.
#[async_trait]
pub trait PeerClient: Send {
    /// Takes `key` if it is free, without waiting; an error when it is held.
    async fn try_lock(&mut self, key: &str) -> Result<()>;

    /// Takes `key`, waiting the peer's own way while it is held.
    async fn lock(&mut self, key: &str) -> Result<()>;

    /// Frees `key`.
    async fn unlock(&mut self, key: &str) -> Result<()>;

    /// Extends the held `key` by the TTL, where the peer has such a thing
    /// (`None` where it has not: a session lock needs no renewal).
    async fn extend(&mut self, _key: &str) -> Option<Result<()>> {
        None
    }
}

/// A store with its notifications hidden: waiters only poll. Everything
/// else goes to the store unchanged.
pub struct PollOnly(pub Arc<dyn LeaseStore>);

#[async_trait]
impl LeaseStore for PollOnly {
    fn kind(&self) -> &'static str {
        self.0.kind()
    }

    async fn acquire(
        &self,
        work_id: &WorkId,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> worklease::Result<Grant> {
        self.0.acquire(work_id, holder_id, ttl).await
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> worklease::Result<SystemTime> {
        self.0.renew(lease, ttl).await
    }

    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> worklease::Result<SystemTime> {
        self.0.checkpoint(lease, ttl, data).await
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> worklease::Result<Checkpoint> {
        self.0.read_checkpoint(lease).await
    }

    async fn release(&self, lease: LeaseRef<'_>) -> worklease::Result<()> {
        self.0.release(lease).await
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> worklease::Result<Vec<LeaseInfo>> {
        self.0.inspect(work_ids).await
    }

    async fn revoke(&self, work_id: &WorkId) -> worklease::Result<Option<LeaseInfo>> {
        self.0.revoke(work_id).await
    }

    async fn inspect_checkpoint(
        &self,
        work_id: &WorkId,
    ) -> worklease::Result<Option<worklease::StoredCheckpoint>> {
        self.0.inspect_checkpoint(work_id).await
    }

    async fn delete_ended(&self, work_id: &WorkId, fencing_token: u64) -> worklease::Result<bool> {
        self.0.delete_ended(work_id, fencing_token).await
    }

    fn expiry_clock(&self) -> ExpiryClock {
        self.0.expiry_clock()
    }

    fn max_batch(&self) -> usize {
        self.0.max_batch()
    }

    fn max_checkpoint_bytes(&self) -> usize {
        self.0.max_checkpoint_bytes()
    }

    // `watch` keeps its default: no notifications. The batch calls keep
    // theirs (one call per lease): the figures of hand-off are single
    // calls.
}

/// An error for a compare-and-set that found another version.
pub fn cas_lost(what: &str) -> crate::BoxError {
    format!("the baseline's compare-and-set on {what} found another version").into()
}
