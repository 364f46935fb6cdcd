//! The DynamoDB store against two real implementations of DynamoDB's API:
//! dynalite (LevelDB underneath) and moto's DynamoDB. The shared
//! conformance suite on both, and the guarantees the store owes beyond it:
//! one winner among 32 concurrent acquirers, a reply dropped after the
//! server applied the write that neither loses the lease nor makes two
//! holders, fencing that survives the lease item's deletion by hand, the
//! checkpoint limit of an item, and the error for a missing table.
//!
//! The servers come from `WORKLEASE_TEST_DYNAMODB_URL` (dynalite; default
//! `dynamodb://worklease-test?endpoint=http://127.0.0.1:4567&region=us-east-1&create=true`,
//! `.ci/services/dynamodb.sh` starts one) and
//! `WORKLEASE_TEST_DYNAMODB_MOTO_URL` (moto; default on 127.0.0.1:5000,
//! `.ci/services/moto.sh`), both with dummy `AWS_ACCESS_KEY_ID` /
//! `AWS_SECRET_ACCESS_KEY`. Each URL names a table unique to the run, made
//! by the first store that uses it (`create=true`); every test works under
//! a key prefix of its own, whose items are deleted when it is done.

#![cfg(feature = "dynamodb")]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use bytes::Bytes;
use worklease::conformance::Suite;
use worklease::store::dynamodb::{DynamoConfig, DynamoRegister, MAX_CHECKPOINT_BYTES};
use worklease::store::fault::FaultStore;
use worklease::store::proxy::{Direction, FaultProxy};
use worklease::store::register::{Handle, Register, RegisterError, RegisterStore};
use worklease::{AcquireOptions, Config, Error, LeaseStore, Leases, WorkId};

#[path = "common/race.rs"]
mod common_race;

use common_race::one_winner;

/// Which implementation a test runs on.
#[derive(Clone, Copy, Debug)]
enum Server {
    Dynalite,
    Moto,
}

impl Server {
    fn url(self) -> String {
        let (var, port) = match self {
            Server::Dynalite => ("WORKLEASE_TEST_DYNAMODB_URL", 4567),
            Server::Moto => ("WORKLEASE_TEST_DYNAMODB_MOTO_URL", 5000),
        };
        assert!(
            std::env::var_os("AWS_ACCESS_KEY_ID").is_some(),
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (any values for dynalite and moto; \
             .ci/services/dynamodb.sh and moto.sh export them with {var})"
        );
        std::env::var(var)
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| {
                format!(
                    "dynamodb://worklease-test?endpoint=http://127.0.0.1:{port}&region=us-east-1&create=true"
                )
            })
    }
}

/// Deletes every item under a prefix when dropped.
struct Cleanup {
    config: DynamoConfig,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let config = self.config.clone();
        // A runtime of its own: drop may run inside or outside one.
        let result = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(delete_prefix(&config))
        })
        .join();
        if let Ok(Err(e)) | Err(e) = result.map_err(|_| "panicked".to_string()) {
            eprintln!(
                "cannot delete the test items under {:?}: {e}",
                self.config.get_prefix()
            );
        }
    }
}

async fn delete_prefix(config: &DynamoConfig) -> Result<(), String> {
    let register = config.register();
    let client = register.client().await.map_err(|e| e.to_string())?;
    let items: Vec<_> = client
        .scan()
        .table_name(config.table())
        .filter_expression("begins_with(pk, :p)")
        .expression_attribute_values(":p", AttributeValue::S(format!("{}#", config.get_prefix())))
        .into_paginator()
        .items()
        .send()
        .collect::<Result<Vec<_>, _>>()
        .await
        .map_err(|e| e.to_string())?;
    for item in items {
        if let Some(pk) = item.get("pk") {
            client
                .delete_item()
                .table_name(config.table())
                .key("pk", pk.clone())
                .send()
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Stores on one fresh prefix of a server's test table; each
/// [`Fixture::store`] is a new client, as another process would have.
struct Fixture {
    config: DynamoConfig,
    cleanup: Arc<Cleanup>,
}

impl Fixture {
    fn new(server: Server) -> Self {
        let base = DynamoConfig::from_url(&server.url()).expect("the test URL");
        let prefix = format!("{}/{:016x}", base.get_prefix(), rand::random::<u64>());
        let config = base.prefix(prefix).expect("prefix");
        Self {
            cleanup: Arc::new(Cleanup {
                config: config.clone(),
            }),
            config,
        }
    }

    fn store(&self) -> Arc<FaultStore<RegisterStore<DynamoRegister>>> {
        Arc::new(FaultStore::over(Arc::new(self.config.open())).with_guard(self.cleanup.clone()))
    }

    fn leases(&self, holder: &str, ttl: Duration) -> Leases {
        Leases::new(self.store(), Config::new(holder, ttl)).expect("config")
    }
}

worklease::conformance_tests!(dynalite, paused = false, async {
    Suite::new(Fixture::new(Server::Dynalite).store())
});

worklease::conformance_tests!(moto, paused = false, async {
    Suite::new(Fixture::new(Server::Moto).store())
});

fn id(s: &str) -> WorkId {
    WorkId::new(s).expect("valid work ID")
}

const SERVERS: [Server; 2] = [Server::Dynalite, Server::Moto];

/// 32 clients (each its own register and adapter, as 32 processes) race
/// for one free work ID: exactly one wins, every other one is told `Held`.
/// Then the winner releases, and 32 race for the released lease: again one.
#[tokio::test]
async fn thirty_two_concurrent_acquirers_have_one_winner() {
    for server in SERVERS {
        let f = Fixture::new(server);
        let ttl = Duration::from_secs(60);
        let clients: Vec<Leases> = (0..32)
            .map(|i| f.leases(&format!("racer-{i}"), ttl))
            .collect();
        let mut last_token = 0;
        for round in 0..2 {
            let race = format!("{server:?} round {round}");
            let (i, token) = one_winner(&clients, "jobs/contended", &race).await;
            assert!(token.fencing_token() > last_token, "{server:?}: S2");
            last_token = token.fencing_token();
            clients[i].release(token).await.expect("release");
        }
    }
}

/// A register that reads through one client and writes the lease item
/// through another (behind a fault proxy): an acquisition's only request
/// through the proxy is its conditional put.
struct SplitRegister {
    direct: DynamoRegister,
    proxied: DynamoRegister,
}

#[async_trait]
impl Register for SplitRegister {
    fn kind(&self) -> &'static str {
        self.direct.kind()
    }
    async fn read(&self, key: &WorkId) -> Result<Option<(Bytes, Handle)>, RegisterError> {
        self.direct.read(key).await
    }
    async fn write(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
    ) -> Result<Handle, RegisterError> {
        self.proxied.write(key, previous, value).await
    }
    async fn write_acquisition(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
        fencing_token: u64,
    ) -> Result<Handle, RegisterError> {
        self.direct.raise_floor(key, fencing_token).await?;
        self.proxied.write(key, previous, value).await
    }
    async fn fencing_floor(&self, key: &WorkId) -> Result<u64, RegisterError> {
        self.direct.fencing_floor(key).await
    }
    async fn raise_fencing_floor(&self, key: &WorkId, token: u64) -> Result<bool, RegisterError> {
        self.direct.raise_fencing_floor(key, token).await
    }
    async fn delete(&self, key: &WorkId, handle: &Handle) -> Result<(), RegisterError> {
        self.direct.delete(key, handle).await
    }
    async fn list(&self) -> Result<Vec<WorkId>, RegisterError> {
        self.direct.list().await
    }
    fn max_checkpoint_bytes(&self) -> usize {
        self.direct.max_checkpoint_bytes()
    }
}

/// The server's loopback address, from a test URL's endpoint.
fn upstream(config: &DynamoConfig) -> std::net::SocketAddr {
    let url = url::Url::parse(&config.to_url()).expect("URL");
    let endpoint = url
        .query_pairs()
        .find(|(k, _)| k == "endpoint")
        .map(|(_, v)| v.into_owned())
        .expect("the test URL names an endpoint");
    let endpoint = url::Url::parse(&endpoint).expect("endpoint");
    let host = endpoint.host_str().expect("host");
    let port = endpoint.port().expect("port");
    format!("{host}:{port}")
        .parse()
        .expect("a loopback address")
}

/// An acquisition whose conditional put the server applied but whose reply
/// was dropped: the SDK's retry (on a new connection) fails its condition
/// against the very write it repeats, the register reads the item back,
/// finds its own version, and the holder holds the lease. A contender is
/// told `Held`, and the holder renews: one holder, never two.
#[tokio::test]
async fn a_dropped_reply_after_apply_leaves_one_holder() {
    for server in SERVERS {
        let f = Fixture::new(server);
        let proxy = FaultProxy::start(upstream(&f.config)).await.expect("proxy");
        let proxied = f
            .config
            .clone()
            .endpoint(&format!("http://{}", proxy.local_addr()))
            .expect("endpoint");
        let register = SplitRegister {
            direct: f.config.register(),
            proxied: proxied.register(),
        };
        // Connect both clients before the fault (the table exists then).
        register.proxied.list().await.expect("proxied client");
        let ttl = Duration::from_secs(60);
        let store = Arc::new(
            FaultStore::over(Arc::new(RegisterStore::new(register))).with_guard(f.cleanup.clone()),
        );
        let a = Leases::new(store, Config::new("a", ttl)).expect("config");
        let b = f.leases("b", ttl);

        proxy.drop_replies();
        let acquire = tokio::spawn(async move {
            let token = a.acquire("jobs/lost-reply", AcquireOptions::new()).await;
            (a, token)
        });
        proxy.wait_for(|s| s.dropped(Direction::Reply) > 0).await;
        // Cuts the connection that lost the reply: the SDK retries.
        proxy.restore().await;
        let (a, token) = acquire.await.expect("task");
        let token = token.unwrap_or_else(|e| {
            panic!("{server:?}: the applied acquisition must be reconciled, got {e}")
        });
        match b.acquire("jobs/lost-reply", AcquireOptions::new()).await {
            Err(Error::Held { holder_id, .. }) => assert_eq!(holder_id, "a", "{server:?}"),
            other => panic!("{server:?}: S1: a contender got {other:?}"),
        }
        let info = f
            .store()
            .inspect(&[id("jobs/lost-reply")])
            .await
            .expect("inspect");
        assert_eq!(info[0].fencing_token, token.fencing_token(), "{server:?}");
        let token = a.renew(&token).await.expect("the holder renews");
        a.release(token).await.expect("release");
    }
}

/// S2 beyond the suite: deleting a work ID's lease item by hand keeps its
/// fencing floor, so the next acquisition's token is still larger.
#[tokio::test]
async fn fencing_survives_a_lease_item_deleted_by_hand() {
    for server in SERVERS {
        let f = Fixture::new(server);
        let a = f.leases("a", Duration::from_secs(60));
        let mut last = 0;
        for _ in 0..3 {
            let t = a
                .acquire("jobs/deleted", AcquireOptions::new())
                .await
                .expect("acquire");
            assert!(
                t.fencing_token() > last,
                "{server:?}: {} after {last}",
                t.fencing_token()
            );
            last = t.fencing_token();
            // Delete the lease item while the lease is held: the holder is
            // fenced (no record of it), and the next token is still larger.
            let register = f.config.register();
            let client = register.client().await.expect("client");
            client
                .delete_item()
                .table_name(f.config.table())
                .key(
                    "pk",
                    AttributeValue::S(register.lease_key(&id("jobs/deleted"))),
                )
                .send()
                .await
                .expect("delete the lease item by hand");
            assert!(
                matches!(a.renew(&t).await, Err(Error::Fenced { .. })),
                "{server:?}: a deleted lease is fenced"
            );
        }
        assert_eq!(last, 3, "{server:?}");
    }
}

/// The checkpoint limit of an item: at the limit it is stored and read
/// back whole; one byte over is bad input naming the limit, and nothing is
/// written.
#[tokio::test]
async fn checkpoints_up_to_the_item_limit() {
    for server in SERVERS {
        let f = Fixture::new(server);
        // The longest work ID and holder IDs (a long previous holder too)
        // make the largest record.
        let work = "w".repeat(1000);
        let a = f.leases(&"a".repeat(256), Duration::from_secs(60));
        let b = f.leases(&"b".repeat(256), Duration::from_secs(60));
        let t = a
            .acquire(&work, AcquireOptions::new())
            .await
            .expect("acquire");
        a.release(t).await.expect("release");
        let t = b
            .acquire(&work, AcquireOptions::new())
            .await
            .expect("acquire");
        let full = Bytes::from(vec![0xa5u8; MAX_CHECKPOINT_BYTES]);
        let t = b
            .checkpoint(&t, full.clone())
            .await
            .unwrap_or_else(|e| panic!("{server:?}: a checkpoint at the limit: {e}"));
        let e = b
            .checkpoint(&t, vec![1u8; MAX_CHECKPOINT_BYTES + 1])
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains(&MAX_CHECKPOINT_BYTES.to_string()),
            "{server:?}: {e}"
        );
        assert_eq!(b.read_checkpoint(&t).await.expect("read").data, Some(full));
        b.release(t).await.expect("release");
    }
}

/// A table that does not exist (and no `create=true`): a store error that
/// names the table and prints the command that makes it; nothing is made.
#[tokio::test]
async fn a_missing_table_is_named_with_its_create_command() {
    for server in SERVERS {
        let base = DynamoConfig::from_url(&server.url()).expect("URL");
        let table = format!("worklease-missing-{:016x}", rand::random::<u64>());
        let url = base
            .to_url()
            .replace(base.table(), &table)
            .replace("&create=true", "");
        let store = worklease::store::url::open(&url).expect("open");
        let a = Leases::new(store, Config::new("a", Duration::from_secs(5))).expect("config");
        let e = a
            .acquire("jobs/x", AcquireOptions::new())
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::Store(_)), "{server:?}: {text}");
        for want in [
            format!("{table:?}"),
            format!("aws dynamodb create-table --table-name {table}"),
            "create=true".to_string(),
        ] {
            assert!(text.contains(&want), "{server:?}: {want} missing in {text}");
        }
    }
}

/// `dynamodb://` URLs open through the dispatcher, and a store opened so
/// works.
#[tokio::test]
async fn opens_from_a_store_url() {
    let f = Fixture::new(Server::Dynalite);
    let store = worklease::store::url::open(&f.config.to_url()).expect("open");
    assert_eq!(store.kind(), "dynamodb");
    let _guard = f.cleanup.clone();
    let a = Leases::new(store, Config::new("a", Duration::from_secs(30))).expect("config");
    let t = a
        .acquire("jobs/url", AcquireOptions::new())
        .await
        .expect("acquire");
    a.release(t).await.expect("release");
}
