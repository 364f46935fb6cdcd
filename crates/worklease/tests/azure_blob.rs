//! The object-storage store on Azure Blob Storage: the shared conformance
//! suite on Azurite (Microsoft's Azure Storage emulator), one winner among
//! 32 concurrent acquirers, and credentials that stay out of URLs and
//! errors.
//!
//! The server comes from `WORKLEASE_TEST_AZURE_URL` (default
//! `azblob://worklease-test/ci?endpoint=http://127.0.0.1:10000/devstoreaccount1`,
//! Azurite's default port); `.ci/services/azurite.sh` starts Azurite,
//! creates the container and exports the URL with
//! `AZURE_STORAGE_ACCOUNT_NAME` / `AZURE_STORAGE_ACCOUNT_KEY` (Azurite's
//! well-known development account). Every test works under a prefix of
//! its own below the URL's, deleted when done.

#![cfg(feature = "azure")]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStore;
use worklease::conformance::Suite;
use worklease::store::object::{AzureConfig, ObjectRegister};
use worklease::store::register::{Handle, Register, RegisterError, RegisterStore};
use worklease::{AcquireOptions, Config, Error, LeaseStore, Leases, WorkId};

const DEFAULT_URL: &str =
    "azblob://worklease-test/ci?endpoint=http://127.0.0.1:10000/devstoreaccount1";

fn base_config() -> AzureConfig {
    let url = std::env::var("WORKLEASE_TEST_AZURE_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| DEFAULT_URL.to_string());
    assert!(
        std::env::var_os("AZURE_STORAGE_ACCOUNT_KEY").is_some(),
        "set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (Azurite's development \
         account; .ci/services/azurite.sh exports them with WORKLEASE_TEST_AZURE_URL)"
    );
    AzureConfig::from_url(&url).expect("WORKLEASE_TEST_AZURE_URL")
}

/// Deletes every blob under a prefix when dropped.
struct Cleanup {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (store, prefix) = (self.store.clone(), self.prefix.clone());
        // A runtime of its own: drop may run inside or outside one.
        let result = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let paths = store.list(Some(&prefix)).map_ok(|m| m.location).boxed();
                store
                    .delete_stream(paths)
                    .try_collect::<Vec<_>>()
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            })
        })
        .join();
        if let Ok(Err(e)) | Err(e) = result.map_err(|_| "panicked".to_string()) {
            eprintln!("cannot delete the test blobs under {}: {e}", self.prefix);
        }
    }
}

/// Stores on one fresh prefix of the test container; each
/// [`Fixture::store`] is a new client, as another process would have.
struct Fixture {
    config: AzureConfig,
    cleanup: Arc<Cleanup>,
}

impl Fixture {
    fn new() -> Self {
        let base = base_config();
        let prefix = format!("{}/{:016x}", base.get_prefix(), rand::random::<u64>());
        let config = base.prefix(prefix.clone()).expect("prefix");
        let register = config.register().expect("Azure register");
        Self {
            cleanup: Arc::new(Cleanup {
                store: register.object_store().clone(),
                prefix: Path::parse(&prefix).expect("prefix"),
            }),
            config,
        }
    }

    fn store(&self) -> Arc<RegisterStore<Guarded>> {
        Arc::new(RegisterStore::new(Guarded {
            inner: self.config.register().expect("Azure register"),
            _cleanup: self.cleanup.clone(),
        }))
    }
}

/// A register that keeps the test's [`Cleanup`] alive as long as it lives.
struct Guarded {
    inner: ObjectRegister,
    _cleanup: Arc<Cleanup>,
}

#[async_trait]
impl Register for Guarded {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn read(&self, key: &WorkId) -> Result<Option<(Bytes, Handle)>, RegisterError> {
        self.inner.read(key).await
    }
    async fn write(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
    ) -> Result<Handle, RegisterError> {
        self.inner.write(key, previous, value).await
    }
    async fn delete(&self, key: &WorkId, handle: &Handle) -> Result<(), RegisterError> {
        self.inner.delete(key, handle).await
    }
    async fn list(&self) -> Result<Vec<WorkId>, RegisterError> {
        self.inner.list().await
    }
}

worklease::conformance_tests!(azurite, paused = false, async {
    Suite::new(Fixture::new().store())
});

fn leases(store: Arc<dyn LeaseStore>, holder: &str, ttl: Duration) -> Leases {
    Leases::new(store, Config::new(holder, ttl)).expect("config")
}

/// 32 clients (each its own register and adapter, as 32 processes) race
/// for one free work ID on Azurite: exactly one wins, every other one is
/// told `Held`; then the winner releases and 32 race again: again one.
#[tokio::test]
async fn thirty_two_concurrent_acquirers_have_one_winner() {
    let f = Fixture::new();
    let ttl = Duration::from_secs(30);
    let clients: Vec<Leases> = (0..32)
        .map(|i| leases(f.store(), &format!("racer-{i}"), ttl))
        .collect();
    for round in 1..=2u64 {
        let results = futures_util::future::join_all(
            clients
                .iter()
                .map(|l| l.acquire("jobs/contended", AcquireOptions::new())),
        )
        .await;
        let mut winners = Vec::new();
        for (i, r) in results.into_iter().enumerate() {
            match r {
                Ok(t) => winners.push((i, t)),
                Err(Error::Held { .. }) => {}
                Err(e) => panic!("racer {i} failed otherwise than Held: {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        let (i, token) = winners.pop().expect("one winner");
        assert_eq!(token.fencing_token(), round);
        clients[i].release(token).await.expect("release");
    }
}

/// The account key is read from the environment only: a store error (a
/// container that does not exist) names the container, never the key,
/// and a URL with a key in it is refused without echoing it.
#[tokio::test]
async fn credentials_stay_out_of_urls_and_errors() {
    let key = std::env::var("AZURE_STORAGE_ACCOUNT_KEY").unwrap_or_default();
    let base = base_config();
    let url = base
        .to_url()
        .replacen("worklease-test", "no-such-container", 1);
    let store = AzureConfig::from_url(&url)
        .expect("URL")
        .open()
        .expect("store");
    let leases = leases(Arc::new(store), "alone", Duration::from_secs(5));
    let e = leases
        .acquire("jobs/a", AcquireOptions::new())
        .await
        .expect_err("no such container");
    let text = format!("{e} {e:?}");
    assert!(matches!(e, Error::Store(_)), "{text}");
    assert!(!key.is_empty() && !text.contains(&key), "{text}");
    let e = AzureConfig::from_url(&format!("azblob://devstoreaccount1:{key}@worklease-test/p"))
        .expect_err("a key in the URL");
    assert!(!e.to_string().contains(&key), "{e}");
}
