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

use worklease::conformance::Suite;
use worklease::store::object::{AzureConfig, ObjectRegister};
use worklease::store::register::RegisterStore;
use worklease::{AcquireOptions, Config, Error, LeaseStore, Leases};

#[path = "common/object_prefix.rs"]
mod common_object_prefix;
#[path = "common/race.rs"]
mod common_race;

use common_object_prefix::{fresh_prefix, Cleanup, Guarded};
use common_race::one_winner;

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

/// Stores on one fresh prefix of the test container; each
/// [`Fixture::store`] is a new client, as another process would have.
struct Fixture {
    config: AzureConfig,
    cleanup: Arc<Cleanup>,
}

impl Fixture {
    fn new() -> Self {
        let base = base_config();
        let prefix = fresh_prefix(base.get_prefix());
        let config = base.prefix(prefix.clone()).expect("prefix");
        let register = config.register().expect("Azure register");
        Self {
            cleanup: Cleanup::of(&register, &prefix),
            config,
        }
    }

    fn store(&self) -> Arc<RegisterStore<Guarded<ObjectRegister>>> {
        Arc::new(RegisterStore::new(Guarded {
            inner: self.config.register().expect("Azure register"),
            _cleanup: self.cleanup.clone(),
        }))
    }
}

worklease::conformance_tests!(azurite, paused = false, async {
    let mut suite = Suite::new(Fixture::new().store());
    // object_store has no conditional delete for Azure: gc refuses
    // (checked).
    suite.deletes = false;
    suite
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
        let (i, token) = one_winner(&clients, "jobs/contended", &format!("round {round}")).await;
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
