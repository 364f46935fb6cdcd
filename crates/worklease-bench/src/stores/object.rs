//! The S3 store (`s3://BUCKET/PREFIX?endpoint=...`), on moto here, one
//! key prefix per scenario. Credentials come from the `AWS_*` environment
//! variables, as for the store itself.
//!
//! * Baseline: one conditional `PUT` (`If-Match` on the ETag of the
//!   client's previous one) through the store's own `object_store` client,
//!   as the store writes its objects.
//! * Peer: the hand-rolled conditional-write lock users build on S3: lock
//!   is `PUT If-None-Match: *` of the lock object, unlock a `DELETE`; a
//!   waiter retries the `PUT` every 100 ms. It has no TTL, so nothing to
//!   renew (and a crashed holder's lock stays until someone deletes it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{
    Attribute, Attributes, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    UpdateVersion,
};
use worklease::store::object::S3Config;
use worklease::store::url;

use super::server::{self, Parts, Server};
use super::{cas_lost, Baseline, Entry, Peer, PeerClient, Register, Settings};
use crate::Result;

/// The S3 store's entry.
pub const ENTRY: Entry = server::entry::<S3>();

/// How often the hand-rolled lock's waiter tries again.
const PEER_RETRY: Duration = Duration::from_millis(100);

struct S3 {
    config: S3Config,
    objects: Arc<dyn ObjectStore>,
}

impl S3 {
    /// Every object of run `run` is under this.
    fn run_prefix(&self, run: &str) -> String {
        format!("{}/wl-bench-{run}", self.config.get_prefix())
    }
}

#[async_trait]
impl Server for S3 {
    const NAME: &'static str = "s3";

    fn url(settings: &Settings) -> &str {
        &settings.s3_url
    }

    async fn connect(settings: &Settings) -> Result<Self> {
        let config = S3Config::from_url(&settings.s3_url)?;
        let objects = config.register()?.object_store().clone();
        // One request, to see that the server answers.
        let prefix = Path::from(config.get_prefix());
        if let Some(Err(e)) = objects.list(Some(&prefix)).next().await {
            return Err(format!("cannot reach {}: {e}", url::redact(&settings.s3_url)).into());
        }
        Ok(S3 { config, objects })
    }

    fn describe(&self) -> String {
        "moto (S3 API)".to_string()
    }

    fn namespace(&self, run: &str, tag: &str) -> String {
        format!("{}/{tag}", self.run_prefix(run))
    }

    fn namespace_url(&self, _settings: &Settings, prefix: &str) -> Result<String> {
        Ok(self.config.clone().prefix(prefix.to_string())?.to_url())
    }

    async fn open(&self, _settings: &Settings, url: &str, prefix: &str) -> Result<Parts> {
        let store = Arc::new(S3Config::from_url(url)?.open()?);
        let objects = store.register().object_store().clone();
        let baseline = Arc::new(Cas {
            objects: objects.clone(),
            prefix: format!("{prefix}-baseline/{:08x}", rand::random::<u32>()),
            next: AtomicU64::new(0),
        });
        let peer = Arc::new(CreateLock {
            objects,
            prefix: format!("{prefix}-lock"),
        });
        Ok(Parts {
            store,
            baseline,
            peer,
        })
    }

    async fn cleanup(&self, settings: &Settings) -> Result<()> {
        let prefix = Path::from(self.run_prefix(&settings.run));
        let mut list = self.objects.list(Some(&prefix));
        while let Some(meta) = list.next().await {
            self.objects.delete(&meta?.location).await?;
        }
        Ok(())
    }
}

fn options(mode: PutMode) -> PutOptions {
    let mut attributes = Attributes::new();
    attributes.insert(Attribute::ContentType, "application/octet-stream".into());
    PutOptions {
        mode,
        attributes,
        ..PutOptions::default()
    }
}

struct Cas {
    objects: Arc<dyn ObjectStore>,
    prefix: String,
    next: AtomicU64,
}

#[async_trait]
impl Baseline for Cas {
    fn describe(&self) -> String {
        "one conditional PUT (If-Match: the ETag of the previous one) through the store's object_store client".to_string()
    }

    async fn register(&self) -> Result<Box<dyn Register>> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(Object {
            objects: self.objects.clone(),
            path: Path::from(format!("{}/{n}", self.prefix)),
            version: None,
        }))
    }
}

struct Object {
    objects: Arc<dyn ObjectStore>,
    path: Path,
    /// The version this client last wrote (`None`: no object yet).
    version: Option<UpdateVersion>,
}

#[async_trait]
impl Register for Object {
    async fn cas(&mut self, data: &Bytes) -> Result<()> {
        let mode = match &self.version {
            Some(v) => PutMode::Update(v.clone()),
            None => PutMode::Create,
        };
        let put = self
            .objects
            .put_opts(&self.path, PutPayload::from(data.clone()), options(mode))
            .await
            .map_err(|e| match e {
                object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. } => cas_lost("an S3 object"),
                other => other.into(),
            })?;
        self.version = Some(put.into());
        Ok(())
    }
}

/// The hand-rolled lock: create-if-absent, delete.
struct CreateLock {
    objects: Arc<dyn ObjectStore>,
    prefix: String,
}

#[async_trait]
impl Peer for CreateLock {
    fn describe(&self) -> String {
        format!("a hand-rolled conditional-write lock: PUT If-None-Match: * of the lock object, DELETE to unlock; waiters retry every {PEER_RETRY:?}")
    }

    async fn client(&self, _dedicated: bool) -> Result<Box<dyn PeerClient>> {
        Ok(Box::new(CreateLockClient {
            objects: self.objects.clone(),
            prefix: self.prefix.clone(),
        }))
    }
}

struct CreateLockClient {
    objects: Arc<dyn ObjectStore>,
    prefix: String,
}

impl CreateLockClient {
    fn path(&self, key: &str) -> Path {
        Path::from(format!("{}/{key}", self.prefix))
    }
}

#[async_trait]
impl PeerClient for CreateLockClient {
    async fn try_lock(&mut self, key: &str) -> Result<()> {
        self.objects
            .put_opts(
                &self.path(key),
                PutPayload::from_static(b"locked"),
                options(PutMode::Create),
            )
            .await
            .map_err(|e| match e {
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. } => {
                    format!("the lock object {key:?} exists").into()
                }
                other => crate::BoxError::from(other),
            })?;
        Ok(())
    }

    async fn lock(&mut self, key: &str) -> Result<()> {
        loop {
            match self.try_lock(key).await {
                Ok(()) => return Ok(()),
                Err(_) => tokio::time::sleep(PEER_RETRY).await,
            }
        }
    }

    async fn unlock(&mut self, key: &str) -> Result<()> {
        self.objects.delete(&self.path(key)).await?;
        Ok(())
    }
}
