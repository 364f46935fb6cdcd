//! The etcd store against real etcd servers on loopback: the shared
//! conformance suite on a single member, the etcd-specific guarantees (TTLs
//! rounded up to whole seconds, fencing tokens from etcd's revisions,
//! checkpoints that outlive the lease key, push hand-off through a watch,
//! renewals from another process, work IDs kept inside the prefix), a
//! three-member cluster whose Raft leader is killed while holders work, and
//! (feature `etcd-tls`) a member of its own serving TLS with a throwaway CA
//! made by rcgen.
//!
//! The single member comes from `WORKLEASE_TEST_ETCD_URL` (default
//! `etcd://127.0.0.1:2379`; `.ci/services/etcd.sh` starts one). Every test
//! uses its own key prefix and deletes its keys when done. The cluster test
//! starts three members of its own from the `etcd` binary
//! (`WORKLEASE_TEST_ETCD_BIN`, else `etcd` on PATH) on free loopback ports.
//! A missing server or binary fails the tests with a message saying so:
//! nothing is skipped.

#![cfg(feature = "etcd")]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use etcd_client::{Client, ConnectOptions, DeleteOptions, GetOptions};
use tokio::time::Instant;
use worklease::conformance::Suite;
use worklease::observe::{AcquireEvent, CheckpointEvent, RenewEvent};
use worklease::store::etcd::{EtcdConfig, EtcdStore};
use worklease::store::fault::FaultStore;
use worklease::store::LeaseEnd;
use worklease::{
    AcquireOptions, Config, Error, LeaseObserver, LeaseStore, Leases, RenewalOptions, Token, WorkId,
};

#[path = "common/net.rs"]
mod common_net;
use common_net::free_port;
#[path = "etcd/leader_changes.rs"]
mod leader_changes;
#[path = "etcd/privilege.rs"]
mod privilege;
#[path = "etcd/session_revision.rs"]
mod session_revision;
#[path = "etcd/sessions.rs"]
mod sessions;

/// How much later than its TTL etcd may end a lease: the TTL rounded up to
/// a whole second (under 1 s more), plus the leader's expiry sweep (every
/// 500 ms) and the revocation's round through Raft, with room for a busy
/// machine.
const EXPIRY_SLACK: Duration = Duration::from_millis(1500);

fn server_url() -> String {
    std::env::var("WORKLEASE_TEST_ETCD_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "etcd://127.0.0.1:2379".to_string())
}

fn unique_prefix() -> String {
    format!("worklease-test/{:016x}/", rand::random::<u64>())
}

fn id(s: &str) -> WorkId {
    WorkId::new(s).expect("valid work ID")
}

fn endpoints(config: &EtcdConfig) -> Vec<String> {
    config
        .hosts()
        .iter()
        .map(|h| format!("http://{h}"))
        .collect()
}

/// A client of the test server, beside the store.
async fn raw(config: &EtcdConfig) -> Client {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    Client::connect(endpoints(config), Some(options))
        .await
        .expect("an etcd client")
}

/// Deletes every key under a prefix when dropped.
struct Cleanup {
    config: EtcdConfig,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let config = self.config.clone();
        // Drop cannot await: delete from a runtime of its own.
        let done = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let mut client = raw(&config).await;
                // A few tries: the list may name a dead member.
                let mut result = Err(String::new());
                for _ in 0..10 {
                    result = client
                        .delete(
                            config.get_prefix(),
                            Some(DeleteOptions::new().with_prefix()),
                        )
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string());
                    if result.is_ok() {
                        break;
                    }
                }
                result
            })
        })
        .join();
        if !matches!(done, Ok(Ok(()))) {
            eprintln!(
                "cannot delete the test keys under {:?}: {done:?}",
                self.config.get_prefix()
            );
        }
    }
}

/// An etcd store under test, under a prefix of its own: the test
/// decorator, which counts acquire calls, can hide from waiters how long a
/// lease has left (so that only a notification wakes them before their
/// poll interval), and deletes the keys when the last handle is dropped.
type TestStore = FaultStore<EtcdStore>;

/// A store on the test server under a fresh prefix, connected.
async fn test_store() -> Arc<TestStore> {
    let config = EtcdConfig::from_url(&server_url())
        .expect("WORKLEASE_TEST_ETCD_URL is a valid etcd URL")
        .prefix(unique_prefix())
        .expect("valid prefix");
    test_store_on(config).await
}

async fn test_store_on(config: EtcdConfig) -> Arc<TestStore> {
    let inner = EtcdStore::new(config.clone());
    inner.ready().await.unwrap_or_else(|e| {
        panic!(
            "the test etcd server does not answer ({e}): start one with .ci/services/etcd.sh \
             or point WORKLEASE_TEST_ETCD_URL at one"
        )
    });
    Arc::new(FaultStore::over(Arc::new(inner)).with_guard(Arc::new(Cleanup { config })))
}

/// Another store (another process's) on the same keys.
fn twin(store: &TestStore) -> Arc<TestStore> {
    let inner = EtcdStore::new(store.inner().config().clone());
    let twin = FaultStore::over(Arc::new(inner));
    Arc::new(match store.guard() {
        Some(guard) => twin.with_guard(guard),
        None => twin,
    })
}

fn leases(store: Arc<dyn LeaseStore>, holder: &str, ttl: Duration) -> Leases {
    Leases::new(store, Config::new(holder, ttl)).expect("config")
}

worklease::conformance_tests!(etcd, paused = false, async {
    let mut suite = Suite::new(test_store().await);
    // etcd keeps whole seconds: a TTL of whole seconds is kept exactly.
    suite.ttl = Duration::from_secs(2);
    suite.expiry_slack = EXPIRY_SLACK;
    suite
});

/// The etcd lease behind a lease key: its granted TTL, in seconds.
async fn granted_ttl(client: &mut Client, key: &str) -> i64 {
    let live = client.get(key, None).await.expect("get");
    let lease = live.kvs().first().expect("the lease key exists").lease();
    client
        .lease_time_to_live(lease, None)
        .await
        .expect("TimeToLive")
        .granted_ttl()
}

/// TTLs are rounded up to whole seconds (and to etcd's minimum TTL): etcd
/// never ends a lease early, a contender gets it once etcd ends it, and
/// the holder still counts its own, shorter TTL. While the holder's store
/// lives, its sweep ends a lease its holder gave up at the holder's own
/// TTL instead (not before it), with millisecond precision.
#[tokio::test]
async fn ttls_are_rounded_up_to_whole_seconds() {
    let store = test_store().await;
    let mut client = raw(store.inner().config()).await;
    let ttl = Duration::from_millis(1200);
    let holder_store = twin(&store);
    let a = leases(holder_store.clone(), "round-a", ttl);
    let b = leases(store.clone(), "round-b", ttl);
    let sent = Instant::now();
    let t = a
        .acquire("jobs/round", AcquireOptions::new())
        .await
        .expect("acquire");
    assert!(
        t.deadline().expect("deadline") <= sent + ttl,
        "the holder counts its own TTL"
    );
    // The holder's process is gone: only etcd's expiry ends the lease.
    drop(a);
    drop(holder_store);
    let keys = store.inner().keys(&id("jobs/round"));
    let granted = granted_ttl(&mut client, &keys.live).await;
    assert!(
        granted >= 2,
        "1200 ms rounds up to 2 s, granted {granted} s"
    );
    tokio::time::sleep_until(sent + Duration::from_millis(1900)).await;
    assert!(
        matches!(
            b.acquire("jobs/round", AcquireOptions::new()).await,
            Err(Error::Held { .. })
        ),
        "held until the rounded-up TTL ran out"
    );
    let limit =
        sent + Duration::from_secs(u64::try_from(granted).expect("positive")) + EXPIRY_SLACK;
    let t_b = loop {
        match b.acquire("jobs/round", AcquireOptions::new()).await {
            Ok(t) => break t,
            Err(Error::Held { .. }) if Instant::now() < limit => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => {
                panic!("the lease must be free {granted} s + slack after acquisition: {other:?}")
            }
        }
    };
    assert!(t_b.fencing_token() > t.fencing_token());
    b.release(t_b).await.expect("release");

    // The holder's store lives (it holds another lease of the session):
    // its sweep ends the given-up lease at the holder's own TTL.
    let a = leases(store.clone(), "round-c", ttl);
    let other = a
        .acquire("jobs/round-other", AcquireOptions::new())
        .await
        .expect("acquire");
    let renewal = a
        .start_renewal(other, worklease::RenewalOptions::new())
        .expect("renewal");
    let sent = Instant::now();
    let t = a
        .acquire("jobs/round-swept", AcquireOptions::new())
        .await
        .expect("acquire");
    let t_b = loop {
        match b.acquire("jobs/round-swept", AcquireOptions::new()).await {
            Ok(t) => break t,
            Err(Error::Held { .. }) if sent.elapsed() < ttl + EXPIRY_SLACK => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            other => panic!("the sweep ends a given-up lease by TTL + slack: {other:?}"),
        }
    };
    assert!(
        Instant::now() > t.deadline().expect("deadline"),
        "S1: ended before the holder's deadline"
    );
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "ended at the holder's 1200 ms, not etcd's 2 s: {:?}",
        sent.elapsed()
    );
    b.release(t_b).await.expect("release");
    let other = renewal.stop().await.expect("stop");
    a.release(other).await.expect("release");
}

/// Fencing tokens are etcd revisions: the create revision of the lease
/// key, larger for every acquisition of any work ID, also after every key
/// was deleted by hand; the checkpoint outlives the lease key.
#[tokio::test]
async fn fencing_tokens_are_revisions_and_survive_deletion_by_hand() {
    let store = test_store().await;
    let config = store.inner().config().clone();
    let mut client = raw(&config).await;
    let a = leases(store.clone(), "rev-a", Duration::from_secs(2));
    let mut tokens = Vec::new();

    let t = a
        .acquire("jobs/rev", AcquireOptions::new())
        .await
        .expect("acquire");
    let keys = store.inner().keys(&id("jobs/rev"));
    let live = client.get(keys.live.as_str(), None).await.expect("get");
    let live = live.kvs().first().expect("the lease key");
    assert_eq!(
        u64::try_from(live.create_revision()).ok(),
        Some(t.fencing_token()),
        "the token is the lease key's create revision"
    );
    let t = a.checkpoint(&t, &b"kept"[..]).await.expect("checkpoint");
    tokens.push(t.fencing_token());
    // Another work ID's acquisition gets a larger token too (one counter).
    let other = a
        .acquire("jobs/rev-other", AcquireOptions::new())
        .await
        .expect("acquire");
    tokens.push(other.fencing_token());

    // The lease key deleted by hand: the lease is gone, the checkpoint stays.
    client
        .delete(keys.live.as_str(), None)
        .await
        .expect("delete");
    assert!(matches!(a.renew(&t).await, Err(Error::Expired { .. })));
    let t = a
        .acquire("jobs/rev", AcquireOptions::new())
        .await
        .expect("acquire after the key was deleted");
    tokens.push(t.fencing_token());
    let c = a.read_checkpoint(&t).await.expect("read");
    assert_eq!(c.data.as_deref(), Some(&b"kept"[..]));
    assert_eq!(
        c.handoff.previous.expect("previous").ended,
        LeaseEnd::Expired
    );

    // Every key under the prefix deleted by hand: tokens still go up.
    client
        .delete(
            config.get_prefix(),
            Some(DeleteOptions::new().with_prefix()),
        )
        .await
        .expect("delete the prefix");
    let t = a
        .acquire("jobs/rev", AcquireOptions::new())
        .await
        .expect("acquire after everything was deleted");
    tokens.push(t.fencing_token());
    assert!(
        a.read_checkpoint(&t).await.expect("read").data.is_none(),
        "the checkpoint was deleted by hand"
    );
    a.release(t).await.expect("release");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "S2: tokens must strictly increase: {tokens:?}"
    );
}

/// Waiters are woken by the store's watch, not by polling: a released
/// lease and one that etcd ends at expiry (it deletes the lease key) reach
/// a waiter that polls only every 30 s, after a handful of attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_the_watch() {
    let store = test_store().await;
    store.hide_expiry(true);
    let long = Duration::from_secs(10);
    let slow_poll = AcquireOptions::new()
        .wait_for_lease()
        .poll_interval(Duration::from_secs(30));
    let a = leases(store.clone(), "watch-a", long);
    let b = leases(store.clone(), "watch-b", long);
    let t = a
        .acquire("jobs/watch", AcquireOptions::new())
        .await
        .expect("acquire");
    let before = store.acquires().get();
    let waiter = {
        let (b, opts) = (b.clone(), slow_poll.clone());
        tokio::spawn(async move {
            let t = b.acquire("jobs/watch", opts).await;
            (t, Instant::now())
        })
    };
    // The waiter tried once (watching since before that attempt), and
    // naps now: it would poll again only after 30 s.
    let mut tries = store.acquires().subscribe();
    tries
        .wait_for(|n| *n > before)
        .await
        .expect("the waiter attempts");
    let released = Instant::now();
    a.release(t).await.expect("release");
    let (t, got) = waiter.await.expect("waiter task");
    let t = t.expect("the waiter gets the released lease");
    assert!(
        got - released < Duration::from_secs(2),
        "a release reached the waiter after {:?}: not pushed",
        got - released
    );
    assert!(
        store.acquires().get() - before <= 3,
        "the waiter polled: {} attempts",
        store.acquires().get() - before
    );
    b.release(t).await.expect("release");

    // A holder vanishes: etcd ends its lease and deletes the key.
    let ttl = Duration::from_secs(1);
    let d = leases(store.clone(), "watch-d", ttl);
    let abandoned = Instant::now();
    let _t = d
        .acquire("jobs/watch-expiry", AcquireOptions::new())
        .await
        .expect("acquire");
    let before = store.acquires().get();
    let c = leases(store.clone(), "watch-c", long);
    let t = c
        .acquire("jobs/watch-expiry", slow_poll)
        .await
        .expect("the waiter gets the expired lease");
    let waited = abandoned.elapsed();
    // etcd's minimum TTL (2 s by default) applies to the 1 s lease.
    let bound = Duration::from_secs(2) + EXPIRY_SLACK;
    assert!(
        waited <= bound,
        "an expired lease reached the waiter after {waited:?} (> {bound:?}): not pushed"
    );
    assert!(
        store.acquires().get() - before <= 5,
        "the waiter polled: {} attempts",
        store.acquires().get() - before
    );
    let prior = c.read_checkpoint(&t).await.expect("read");
    assert_eq!(
        prior.handoff.previous.expect("previous").ended,
        LeaseEnd::Expired
    );
    c.release(t).await.expect("release");
}

/// A renewal asking for a longer TTL than the etcd lease was granted with
/// moves the lease key to a new, longer etcd lease in its transaction.
#[tokio::test]
async fn a_longer_ttl_moves_to_a_longer_etcd_lease() {
    let store = test_store().await;
    let mut client = raw(store.inner().config()).await;
    let short = leases(store.clone(), "move-a", Duration::from_secs(2));
    let long = leases(store.clone(), "move-a", Duration::from_secs(6));
    let t = short
        .acquire("jobs/move", AcquireOptions::new())
        .await
        .expect("acquire");
    let keys = store.inner().keys(&id("jobs/move"));
    assert_eq!(granted_ttl(&mut client, &keys.live).await, 2);
    let t = long.renew(&t).await.expect("renew with a longer TTL");
    assert_eq!(granted_ttl(&mut client, &keys.live).await, 6);
    let t = short
        .checkpoint(&t, &b"still mine"[..])
        .await
        .expect("checkpoint with the shorter TTL keeps the longer lease");
    assert_eq!(granted_ttl(&mut client, &keys.live).await, 6);
    let live = client.get(keys.live.as_str(), None).await.expect("get");
    assert_eq!(
        u64::try_from(live.kvs()[0].create_revision()).ok(),
        Some(t.fencing_token()),
        "moving keeps the token"
    );
    short.release(t).await.expect("release");
}

/// Another process (a store that did not acquire the lease, as a child of
/// `worklease run` is) renews, checkpoints and releases with the token;
/// stale tokens get `Expired` and `Fenced` there too.
#[tokio::test]
async fn another_process_can_use_the_token() {
    let store = test_store().await;
    let twin = twin(&store);
    let ttl = Duration::from_secs(2);
    let a = leases(store.clone(), "twin-a", ttl);
    let a_elsewhere = leases(twin.clone(), "twin-a", ttl);
    let t = a
        .acquire("jobs/twin", AcquireOptions::new())
        .await
        .expect("acquire");
    let t = a_elsewhere.renew(&t).await.expect("renew elsewhere");
    let t = a_elsewhere
        .checkpoint(&t, &b"from the child"[..])
        .await
        .expect("checkpoint elsewhere");
    let c = a.read_checkpoint(&t).await.expect("read");
    assert_eq!(c.data.as_deref(), Some(&b"from the child"[..]));
    a_elsewhere
        .release(t.clone())
        .await
        .expect("release elsewhere");
    assert!(matches!(a.renew(&t).await, Err(Error::Expired { .. })));
    assert!(matches!(
        a_elsewhere.renew(&t).await,
        Err(Error::Expired { .. })
    ));
    let b = leases(store.clone(), "twin-b", ttl);
    let tb = b
        .acquire("jobs/twin", AcquireOptions::new())
        .await
        .expect("acquire");
    assert!(matches!(
        a_elsewhere.checkpoint(&t, &b"stale"[..]).await,
        Err(Error::Fenced { .. })
    ));
    let c = b.read_checkpoint(&tb).await.expect("read");
    assert_eq!(c.data.as_deref(), Some(&b"from the child"[..]));
    assert!(c.clean_handoff());
    b.release(tb).await.expect("release");
}

/// Work IDs are data: whatever they contain (slashes, `..`, percent
/// signs), each has its own four keys, one path segment under the prefix,
/// and `inspect` finds exactly them.
#[tokio::test]
async fn work_ids_stay_inside_the_prefix() {
    let store = test_store().await;
    let config = store.inner().config().clone();
    let mut client = raw(&config).await;
    let a = leases(store.clone(), "prefix-a", Duration::from_secs(2));
    let ids = [
        "jobs/a",
        "jobs/a/b",
        "jobs%2Fa",
        "../../escape",
        "/",
        "x y:ü",
    ];
    for work in ids {
        let t = a
            .acquire(work, AcquireOptions::new())
            .await
            .expect("acquire");
        a.release(t).await.expect("release");
    }
    // Nothing outside the prefix: the whole key space holds no key that
    // names a work ID without it.
    let all = client
        .get(
            config.get_prefix(),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("list");
    let keys: Vec<String> = all
        .kvs()
        .iter()
        .map(|kv| String::from_utf8(kv.key().to_vec()).expect("ASCII keys"))
        .collect();
    // Each ID has an acquisition and a state key (its live key is gone).
    assert_eq!(keys.len(), ids.len() * 2, "{keys:?}");
    for key in &keys {
        let rest = key
            .strip_prefix(config.get_prefix())
            .expect("under the prefix");
        let (_kind, escaped) = rest.split_once('/').expect("kind/ID");
        assert!(!escaped.contains('/'), "{key}: the ID is one segment");
    }
    let mut found: Vec<String> = store
        .inspect(&[])
        .await
        .expect("inspect")
        .into_iter()
        .map(|i| i.work_id.to_string())
        .collect();
    found.sort();
    let mut want: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(found, want);
}

/// `inspect` and `revoke` tell what happened: live with time left, then
/// revoked, with the previous holder and the checkpoint's size.
#[tokio::test]
async fn inspect_and_revoke() {
    let store = test_store().await;
    let a = leases(store.clone(), "ops-a", Duration::from_secs(3));
    let t = a
        .acquire("jobs/ops", AcquireOptions::new())
        .await
        .expect("acquire");
    let t = a.checkpoint(&t, &b"12345"[..]).await.expect("checkpoint");
    let info = store.inspect(&[id("jobs/ops")]).await.expect("inspect");
    let info = info.first().expect("the lease");
    assert_eq!(
        (info.holder_id.as_str(), info.fencing_token, info.expired),
        ("ops-a", t.fencing_token(), false)
    );
    let left = info.expires_in.expect("time left");
    assert!(
        left > Duration::ZERO && left <= Duration::from_secs(4),
        "{left:?}"
    );
    assert_eq!(info.checkpoint_bytes, 5);
    let before = store
        .revoke(&id("jobs/ops"))
        .await
        .expect("revoke")
        .expect("known");
    assert!(!before.expired);
    let info = store.inspect(&[id("jobs/ops")]).await.expect("inspect");
    let info = info.first().expect("the lease");
    assert_eq!(
        (info.expired, info.released, info.ended),
        (true, false, Some(LeaseEnd::Revoked))
    );
    assert!(matches!(a.renew(&t).await, Err(Error::Fenced { .. })));
    assert!(store
        .revoke(&id("jobs/never"))
        .await
        .expect("revoke")
        .is_none());
}

/// A URL naming a dead member besides a live one works: the client fails
/// over. A cluster that cannot be reached is a store error without the
/// password in it.
#[tokio::test]
async fn dead_members_are_skipped_and_errors_are_redacted() {
    let base = EtcdConfig::from_url(&server_url()).expect("valid URL");
    let dead = free_port();
    let mut hosts = vec![format!("127.0.0.1:{dead}")];
    hosts.extend(base.hosts().iter().cloned());
    let config = EtcdConfig::new(hosts)
        .expect("hosts")
        .prefix(unique_prefix())
        .expect("prefix")
        .request_timeout(Duration::from_secs(2));
    let store = test_store_on(config).await;
    let a = leases(store.clone(), "failover-a", Duration::from_secs(2));
    for n in 0..20 {
        let t = a
            .acquire(&format!("jobs/{n}"), AcquireOptions::new())
            .await
            .expect("the live member answers");
        a.release(t).await.expect("release");
    }

    let url = format!("etcd://app:s3cret@127.0.0.1:{dead}");
    let config = EtcdConfig::from_url(&url)
        .expect("valid URL")
        .connect_timeout(Duration::from_millis(300))
        .request_timeout(Duration::from_millis(500));
    let e = EtcdStore::new(config).ready().await.unwrap_err();
    assert!(e.is_transient(), "{e}");
    let text = format!("{e} {e:?}");
    assert!(!text.contains("s3cret"), "{text}");
    let spec = worklease::store::url::parse(&url).expect("parses");
    assert_eq!(spec.open().expect("opens lazily").kind(), "etcd");
}

// ---------------------------------------------------------------------
// A cluster of three members of our own.

fn etcd_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("WORKLEASE_TEST_ETCD_BIN").filter(|b| !b.is_empty()) {
        return PathBuf::from(bin);
    }
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join("etcd"))
                .find(|p| p.is_file())
        })
        .expect(
            "the etcd binary (WORKLEASE_TEST_ETCD_BIN, or etcd on PATH: apt-get install \
             etcd-server, or run .ci/services/etcd.sh)",
        )
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// The certificate (PEM files) a member serves its clients with, the CA
/// certificate that signed it (a PEM file), which the member also requires
/// of its clients' certificates (`--client-cert-auth`), and a client
/// certificate and key (PEM) it accepts.
#[cfg_attr(not(feature = "etcd-tls"), allow(dead_code))]
struct ServerTls {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    client_cert_pem: String,
    client_key_pem: String,
}

/// Etcd members on loopback, stopped and removed when dropped.
struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    initial: String,
    members: Vec<Member>,
    /// TLS for the client URLs (peers talk plain HTTP on loopback).
    tls: Option<ServerTls>,
}

impl Cluster {
    async fn start(n: usize) -> Self {
        Self::start_with(n, None).await
    }

    /// `n` members whose client URLs are `https://` with `tls`, when given.
    async fn start_with(n: usize, tls: Option<ServerTls>) -> Self {
        let mut used = std::collections::HashSet::new();
        let mut port = || loop {
            let p = free_port();
            if used.insert(p) {
                return p;
            }
        };
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: port(),
                peer_port: port(),
                child: None,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Self {
            bin: etcd_bin(),
            dir: tempfile::tempdir().expect("tempdir"),
            initial,
            members,
            tls,
        };
        for i in 0..n {
            cluster.spawn(i);
        }
        for i in 0..n {
            cluster.wait_ready(i).await;
        }
        cluster
    }

    fn spawn(&mut self, i: usize) {
        let m = &self.members[i];
        let client = self.endpoint(i);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", m.name)))
            .expect("log file");
        let mut command = Command::new(&self.bin);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--client-cert-auth")
                .arg("--trusted-ca-file")
                .arg(&tls.ca);
        }
        let child = command
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(self.dir.path().join(&m.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "worklease-test"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        self.members[i].child = Some(child);
    }

    fn endpoint(&self, i: usize) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.members[i].client_port)
    }

    fn hosts(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    async fn member_client(&self, i: usize) -> Option<Client> {
        #[cfg_attr(not(feature = "etcd-tls"), allow(unused_mut))]
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(500))
            .with_timeout(Duration::from_secs(1))
            .with_require_leader(true);
        #[cfg(feature = "etcd-tls")]
        if let Some(tls) = &self.tls {
            let ca = std::fs::read(&tls.ca).expect("the CA certificate");
            let identity =
                etcd_client::Identity::from_pem(&tls.client_cert_pem, &tls.client_key_pem);
            options = options.with_tls(
                etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(ca))
                    .identity(identity),
            );
        }
        Client::connect([self.endpoint(i)], Some(options))
            .await
            .ok()
    }

    /// Waits until member `i` answers a read with a leader elected.
    async fn wait_ready(&self, i: usize) {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(mut c) = self.member_client(i).await {
                if c.get("ready", None).await.is_ok() {
                    return;
                }
            }
            if Instant::now() > until {
                let log = std::fs::read_to_string(
                    self.dir
                        .path()
                        .join(format!("{}.log", self.members[i].name)),
                )
                .unwrap_or_default();
                panic!("etcd member {i} did not become ready; its log:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The index of the member that leads the Raft group.
    async fn leader(&self) -> usize {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            for i in 0..self.members.len() {
                if self.members[i].child.is_none() {
                    continue;
                }
                let Some(mut c) = self.member_client(i).await else {
                    continue;
                };
                if let Ok(status) = c.status().await {
                    let me = status.header().map(|h| h.member_id());
                    if me == Some(status.leader()) {
                        return i;
                    }
                }
            }
            assert!(Instant::now() < until, "no member leads");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills member `i` with SIGKILL.
    fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// What the holders did: S1 (no two holders of a work ID believe in their
/// leases at once: checked on the intervals of belief at the end), S2
/// (tokens never go back: checked at each grant) and S4 (a new holder
/// reads the last acknowledged checkpoint: checked at each read).
#[derive(Default)]
struct Journal {
    last_token: HashMap<String, u64>,
    /// (work ID, holder, token, believed from, believed until).
    held: Vec<(String, String, u64, Instant, Instant)>,
    /// Per work ID: the last acknowledged checkpoint, and the ones whose
    /// outcome is unknown (a store error: it may have been written).
    acked: HashMap<String, Bytes>,
    unsure: HashMap<String, Vec<Bytes>>,
    grants: usize,
    checkpoints: usize,
    lost: Vec<String>,
}

impl Journal {
    fn granted(&mut self, t: &Token) {
        let work = t.work_id().to_string();
        let last = self.last_token.insert(work.clone(), t.fencing_token());
        assert!(
            last < Some(t.fencing_token()),
            "S2 violated on {work}: token {} after {last:?}",
            t.fencing_token()
        );
        self.grants += 1;
    }

    /// The holder of `t` believed in it from `from` to `until` (the
    /// earlier of the moment it let go and its last deadline).
    fn held(&mut self, t: &Token, from: Instant, until: Instant) {
        self.held.push((
            t.work_id().to_string(),
            t.holder_id().to_string(),
            t.fencing_token(),
            from,
            until,
        ));
    }

    fn read(&self, t: &Token, data: &Option<Bytes>) {
        let work = t.work_id().to_string();
        let acked = self.acked.get(&work);
        let unsure = self.unsure.get(&work).map(Vec::as_slice).unwrap_or(&[]);
        let ok = data.as_ref() == acked || data.as_ref().is_some_and(|d| unsure.contains(d));
        assert!(
            ok,
            "S4 violated on {work}: read {data:?}, last acknowledged {acked:?}, unsure {unsure:?}"
        );
    }

    /// S1 on the intervals of belief: per work ID, in token order, each
    /// starts after every earlier one ended.
    fn check_no_overlap(&self) {
        let mut by_work: HashMap<&str, Vec<_>> = HashMap::new();
        for h in &self.held {
            by_work.entry(h.0.as_str()).or_default().push(h);
        }
        for (work, mut held) in by_work {
            held.sort_by_key(|h| h.2);
            for pair in held.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                assert!(
                    b.3 >= a.4,
                    "S1 violated on {work}: {} (token {}) believed {:?} into {}'s lease (token {})",
                    a.1,
                    a.2,
                    a.4 - b.3,
                    b.1,
                    b.2
                );
            }
        }
    }
}

/// Figures on the extensions of leases (renewals and checkpoints, which
/// renew too), from the observer of every holder.
#[derive(Default)]
struct Extensions {
    inner: Mutex<ExtensionFigures>,
}

#[derive(Default)]
struct ExtensionFigures {
    renewed: u64,
    /// Renewal attempts that failed (background renewal retries them).
    renew_failures: u64,
    checkpoints_failed: u64,
    /// The last successful extension of each lease, and the longest time
    /// a lease went without one.
    last_ok: HashMap<(String, u64), Instant>,
    longest_gap: Duration,
}

impl Extensions {
    fn extended(&self, t: &Token, failed: bool, renewal: bool) {
        let Ok(mut f) = self.inner.lock() else {
            return;
        };
        match (failed, renewal) {
            (true, true) => f.renew_failures += 1,
            (true, false) => f.checkpoints_failed += 1,
            (false, true) => f.renewed += 1,
            (false, false) => {}
        }
        if failed {
            return;
        }
        let now = Instant::now();
        let key = (t.work_id().to_string(), t.fencing_token());
        if let Some(prev) = f.last_ok.insert(key, now) {
            f.longest_gap = f.longest_gap.max(now - prev);
        }
    }
}

impl LeaseObserver for Extensions {
    fn on_acquire(&self, e: &AcquireEvent<'_>) {
        if let Some(t) = e.token {
            self.extended(t, false, false);
        }
    }
    fn on_renew(&self, e: &RenewEvent<'_>) {
        self.extended(e.token, e.error.is_some(), true);
    }
    fn on_checkpoint(&self, e: &CheckpointEvent<'_>) {
        self.extended(e.token, e.error.is_some(), false);
    }
}

/// One holder: takes any of `works` (waiting), reads its checkpoint,
/// renews in the background, checkpoints now and then, releases; until
/// `stop`.
async fn holder(
    leases: Leases,
    works: Vec<String>,
    journal: Arc<Mutex<Journal>>,
    stop: tokio_util::sync::CancellationToken,
) {
    let me = leases.holder_id().to_string();
    let mut round = 0usize;
    while !stop.is_cancelled() {
        round += 1;
        let work = &works[round % works.len()];
        let wait = AcquireOptions::new()
            .wait_for_lease()
            .poll_interval(Duration::from_millis(500))
            .wait_timeout(Duration::from_secs(3));
        let t = match leases.acquire(work, wait).await {
            Ok(t) => t,
            Err(Error::WaitTimedOut { .. } | Error::Store(_) | Error::Expired { .. }) => continue,
            Err(e) => panic!("{me}: acquire: {e}"),
        };
        let from = Instant::now();
        journal.lock().expect("journal").granted(&t);
        let read = match leases.read_checkpoint(&t).await {
            Ok(c) => c,
            Err(e) if e.is_transient() || e.is_lease_lost() => {
                journal.lock().expect("journal").held(
                    &t,
                    from,
                    Instant::now().min(t.deadline().expect("deadline")),
                );
                let _ = leases.release(t).await;
                continue;
            }
            Err(e) => panic!("{me}: read: {e}"),
        };
        journal.lock().expect("journal").read(&t, &read.data);
        let renewal = leases
            .start_renewal(t, RenewalOptions::new())
            .expect("renewal");
        for n in 0..16 {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(400)) => {}
                _ = renewal.lost() => break,
            }
            let Ok(t) = renewal.ensure_live() else { break };
            let data = Bytes::from(format!("{me}:{round}:{n}"));
            journal
                .lock()
                .expect("journal")
                .unsure
                .entry(work.clone())
                .or_default()
                .push(data.clone());
            match leases.checkpoint(&t, data.clone()).await {
                Ok(_) => {
                    let mut j = journal.lock().expect("journal");
                    j.unsure.remove(work);
                    j.acked.insert(work.clone(), data);
                    j.checkpoints += 1;
                }
                // A store error leaves it unsure: it may have been written.
                Err(e) if e.is_transient() => {}
                Err(e) if e.is_lease_lost() => break,
                Err(e) => panic!("{me}: checkpoint: {e}"),
            }
        }
        let last = renewal.token();
        match renewal.stop().await {
            Ok(t) => {
                let until = Instant::now().min(t.deadline().expect("deadline"));
                journal.lock().expect("journal").held(&t, from, until);
                // A failed release leaves the lease to expire: fine.
                let _ = leases.release(t).await;
            }
            Err(cause) => {
                let until = Instant::now().min(last.deadline().expect("deadline"));
                let mut j = journal.lock().expect("journal");
                j.held(&last, from, until);
                j.lost.push(format!("{me} on {work}: {cause}"));
            }
        }
    }
}

/// Three real members; holders work through all three endpoints while the
/// member that leads the Raft group is killed with SIGKILL and restarted:
/// no two holders overlap, tokens never go back, acknowledged checkpoints
/// survive. Then the cluster loses its quorum: a holder whose renewals keep
/// failing gives up by its deadline. Prints the figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_keeps_the_contract_while_its_leader_is_killed() {
    let mut cluster = Cluster::start(3).await;
    let config = EtcdConfig::new(cluster.hosts())
        .expect("hosts")
        .prefix(unique_prefix())
        .expect("prefix")
        .connect_timeout(Duration::from_millis(500))
        .request_timeout(Duration::from_secs(1));
    let store: Arc<dyn LeaseStore> = Arc::new(EtcdStore::new(config.clone()));
    let ttl = Duration::from_secs(5);
    let stats = Arc::new(Extensions::default());
    let journal = Arc::new(Mutex::new(Journal::default()));
    let stop = tokio_util::sync::CancellationToken::new();
    let works: Vec<String> = (0..2).map(|i| format!("jobs/cluster-{i}")).collect();
    let mut holders = Vec::new();
    for n in 0..4 {
        // Each holder a process of its own: its own store and client.
        let store: Arc<dyn LeaseStore> = Arc::new(EtcdStore::new(config.clone()));
        let leases = Leases::new(
            store,
            Config::new(format!("holder-{n}"), ttl).observer(stats.clone()),
        )
        .expect("config");
        holders.push(tokio::spawn(holder(
            leases,
            works.clone(),
            journal.clone(),
            stop.clone(),
        )));
    }

    tokio::time::sleep(Duration::from_secs(4)).await;
    let leader = cluster.leader().await;
    let grants_before = journal.lock().expect("journal").grants;
    let killed_at = Instant::now();
    cluster.kill(leader);
    let new_leader = cluster.leader().await;
    let elected_after = killed_at.elapsed();
    tokio::time::sleep(Duration::from_secs(6)).await;
    cluster.spawn(leader);
    cluster.wait_ready(leader).await;
    let restarted_after = killed_at.elapsed();
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.cancel();
    for h in holders {
        h.await.expect("holder task (see its panic above)");
    }
    let (grants, grants_after_kill, checkpoints, lost) = {
        let j = journal.lock().expect("journal");
        (
            j.grants,
            j.grants - grants_before,
            j.checkpoints,
            j.lost.clone(),
        )
    };
    assert!(
        grants_after_kill >= 2,
        "the holders must keep going after the leader died: {grants_after_kill} grants"
    );

    // A fresh holder reads the last acknowledged checkpoint of each work ID.
    let reader = Leases::new(store.clone(), Config::new("reader", ttl)).expect("config");
    for work in &works {
        let t = reader
            .acquire(
                work,
                AcquireOptions::new()
                    .wait_for_lease()
                    .poll_interval(Duration::from_millis(200)),
            )
            .await
            .expect("acquire");
        let from = Instant::now();
        let data = reader.read_checkpoint(&t).await.expect("read").data;
        {
            let mut j = journal.lock().expect("journal");
            j.granted(&t);
            j.read(&t, &data);
            j.held(&t, from, Instant::now());
        }
        reader.release(t).await.expect("release");
    }
    journal.lock().expect("journal").check_no_overlap();

    // The quorum is lost: renewals keep failing; the holder gives up by
    // its deadline, with WindowExhausted.
    let lone = Leases::new(store.clone(), Config::new("lone", ttl)).expect("config");
    let t = lone
        .acquire("jobs/quorum", AcquireOptions::new())
        .await
        .expect("acquire");
    let renewal = lone
        .start_renewal(t, RenewalOptions::new())
        .expect("renewal");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let follower = (0..3).find(|i| *i != new_leader).expect("a follower");
    cluster.kill(follower);
    cluster.kill(new_leader);
    let quorum_lost_at = Instant::now();
    let cause = tokio::time::timeout(ttl * 2, renewal.lost())
        .await
        .expect("the lost signal fires");
    let lost_at = Instant::now();
    let last = renewal.token();
    assert!(
        matches!(cause, Error::WindowExhausted { .. }),
        "lost with WindowExhausted, got {cause:?}"
    );
    // The deadline is the last successful renewal's send time + TTL −
    // safety margin; the contract's bound is that send time + TTL.
    let deadline = last.deadline().expect("deadline");
    let bound = deadline + lone.safety_margin();
    assert!(
        lost_at <= bound,
        "gave up {:?} after the last successful renewal's send time + TTL",
        lost_at - bound
    );

    let f = stats.inner.lock().expect("figures");
    println!(
        "etcd cluster test: 3 members, 4 holders on {} work IDs, TTL {ttl:?}, renewal every {:?}, request timeout 1s",
        works.len(),
        ttl / 3
    );
    println!(
        "  leader m{leader} killed (SIGKILL); new leader m{new_leader} seen after {elected_after:?}; m{leader} restarted after {restarted_after:?}"
    );
    println!(
        "  renewals: {} succeeded, {} attempts failed and were retried; {} checkpoints failed; the longest a lease went without a successful renewal or checkpoint: {:?} (renewal interval {:?}, checkpoints every 400ms)",
        f.renewed,
        f.renew_failures,
        f.checkpoints_failed,
        f.longest_gap,
        ttl / 3
    );
    println!(
        "  {grants} acquisitions ({grants_after_kill} after the kill), {checkpoints} checkpoints acknowledged, {} leases lost: {lost:?}",
        lost.len()
    );
    println!(
        "  quorum lost: the holder gave up (WindowExhausted) {:?} after the second of three members died: {:?} past its deadline (timer), {:?} before its last renewal's send time + TTL",
        lost_at - quorum_lost_at,
        lost_at.saturating_duration_since(deadline),
        bound.saturating_duration_since(lost_at)
    );
}

/// Sends `signal` (`STOP`, `CONT`) to member `i` with kill(1).
fn signal(cluster: &Cluster, i: usize, signal: &str) {
    let pid = cluster.members[i]
        .child
        .as_ref()
        .expect("the member runs")
        .id();
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("kill(1)");
    assert!(status.success(), "kill -{signal} {pid}: {status}");
}

/// One member hangs (SIGSTOP: its connections stay open, nothing answers)
/// for longer than the TTL while four holders, each sending to another
/// member first (their member lists are rotated), renew and checkpoint
/// with a 15 s TTL and the default 5 s request timeout. First a follower:
/// quorum holds, and no lease is lost (requests to the hung member time
/// out after TTL/5 and go to the next member). Then the leader: a new one
/// is elected (etcd's election timeout, 1 s by default, randomised up to
/// 2 s), which keeps every etcd lease alive; leases are lost only if the
/// election takes longer than the holders' window allows, which the test
/// states instead of asserting. Both: no two holders, tokens never go
/// back, acknowledged checkpoints survive. The holders stop before the
/// stopped leader gets SIGCONT: a resumed old leader revokes leases on
/// etcd without the fix of bug #15247 (module docs), which this test is
/// not about. Prints the longest stall and the failed attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_member_costs_no_lease() {
    let cluster = Cluster::start(3).await;
    // 15 s, the shortest etcd TTL the docs recommend: the window (0.9 ×
    // TTL) must hold a renewal interval, two attempts and an election.
    let ttl = Duration::from_secs(15);
    let hosts = cluster.hosts();
    let prefix = unique_prefix();
    let base = EtcdConfig::new(hosts.clone())
        .expect("hosts")
        .prefix(prefix.clone())
        .expect("prefix")
        .connect_timeout(Duration::from_millis(500));
    let _cleanup = Cleanup {
        config: base.clone(),
    };
    for case in ["follower", "leader"] {
        let leader = cluster.leader().await;
        let stopped = if case == "leader" {
            leader
        } else {
            (leader + 1) % 3
        };
        let stats = Arc::new(Extensions::default());
        let journal = Arc::new(Mutex::new(Journal::default()));
        let stop = tokio_util::sync::CancellationToken::new();
        let works: Vec<String> = (0..2).map(|i| format!("jobs/hung-{case}-{i}")).collect();
        let mut holders = Vec::new();
        for n in 0..4 {
            let mut rotated = hosts.clone();
            rotated.rotate_left(n % 3);
            let config = EtcdConfig::new(rotated)
                .expect("hosts")
                .prefix(prefix.clone())
                .expect("prefix")
                .connect_timeout(Duration::from_millis(500));
            let store: Arc<dyn LeaseStore> = Arc::new(EtcdStore::new(config));
            let leases = Leases::new(
                store,
                Config::new(format!("{case}-holder-{n}"), ttl).observer(stats.clone()),
            )
            .expect("config");
            holders.push(tokio::spawn(holder(
                leases,
                works.clone(),
                journal.clone(),
                stop.clone(),
            )));
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let grants_before = journal.lock().expect("journal").grants;
        signal(&cluster, stopped, "STOP");
        let stopped_at = Instant::now();
        let elected_after = if case == "leader" {
            let new_leader = cluster.leader().await;
            assert_ne!(new_leader, stopped, "a stopped member cannot lead");
            Some(stopped_at.elapsed())
        } else {
            None
        };
        let hung = ttl + Duration::from_secs(2);
        tokio::time::sleep(hung.saturating_sub(stopped_at.elapsed())).await;
        if case == "follower" {
            signal(&cluster, stopped, "CONT");
            tokio::time::sleep(Duration::from_secs(3)).await;
            stop.cancel();
        } else {
            stop.cancel();
        }
        for h in holders {
            h.await.expect("holder task (see its panic above)");
        }
        if case == "leader" {
            signal(&cluster, stopped, "CONT");
        }
        cluster.wait_ready(stopped).await;
        let (grants, grants_during, lost) = {
            let j = journal.lock().expect("journal");
            j.check_no_overlap();
            (j.grants, j.grants - grants_before, j.lost.clone())
        };
        let f = stats.inner.lock().expect("figures");
        println!(
            "etcd hung-member test ({case}): m{stopped} stopped (SIGSTOP) for {hung:?}, TTL {ttl:?}, request timeout 5s (attempts TTL/5 = {:?}); {}",
            ttl / 5,
            elected_after.map_or(String::new(), |e| format!("new leader seen after {e:?}"))
        );
        println!(
            "  renewals: {} succeeded, {} attempts failed; {} checkpoints failed; longest stall without a successful renewal or checkpoint: {:?}; {grants} acquisitions ({grants_during} after the stop); {} leases lost: {lost:?}",
            f.renewed,
            f.renew_failures,
            f.checkpoints_failed,
            f.longest_gap,
            lost.len()
        );
        assert!(
            grants_during >= 1 || f.renewed > 0,
            "the holders must keep working while m{stopped} hangs"
        );
        // The window: a lease is lost when no extension succeeds within
        // TTL − margin (TTL/10) of the last one's send. A hung member
        // costs one attempt (TTL/5) per holder; an election costs its
        // duration on top.
        // The last successful renewal may have been sent up to one
        // renewal interval (TTL/3) before the member stopped: that time
        // counts against the window too.
        let window = ttl - ttl / 10;
        let cost = ttl / 3 + ttl / 5 + elected_after.unwrap_or_default();
        if cost + ttl / 5 <= window {
            assert!(
                lost.is_empty(),
                "{case} m{stopped} hung: leases lost although quorum held{}: {lost:?}",
                elected_after.map_or(String::new(), |e| format!(" (new leader after {e:?})"))
            );
        } else {
            println!(
                "  the election took too long for a {ttl:?} TTL: lost leases are not a failure"
            );
        }
    }
}

// ---------------------------------------------------------------------
// TLS (`etcds://`, feature `etcd-tls`).

#[cfg(feature = "etcd-tls")]
#[path = "common/tls.rs"]
mod common_tls;
#[cfg(feature = "etcd-tls")]
use common_tls::{checkpoint_round_trip, signed_cert, test_ca};

/// A member serving `https://127.0.0.1:PORT` with a certificate of a
/// throwaway CA, and requiring client certificates of that CA, takes
/// `etcds://` URLs that trust that CA and give a client certificate (the
/// whole lifecycle works), and refuses, with an error that says what is
/// wrong, URLs without the client certificate, that trust the system's
/// roots or another CA, or that use plain `etcd://`.
#[cfg(feature = "etcd-tls")]
#[tokio::test]
async fn tls_members_take_etcds_urls_that_trust_their_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca_pem, issuer) = test_ca("worklease test CA");
    let (server_pem, server_key_pem) = signed_cert(&issuer, "127.0.0.1");
    let (client_pem, client_key_pem) = signed_cert(&issuer, "worklease-test");
    let (other_ca_pem, _) = test_ca("another CA");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write PEM");
        path
    };
    let ca = write("ca.pem", &ca_pem);
    let client_cert = write("client.pem", &client_pem);
    let client_key_file = write("client-key.pem", &client_key_pem);
    let tls = ServerTls {
        cert: write("server.pem", &server_pem),
        key: write("server-key.pem", &server_key_pem),
        ca: ca.clone(),
        client_cert_pem: client_pem,
        client_key_pem,
    };
    let other_ca = write("other-ca.pem", &other_ca_pem);
    let cluster = Cluster::start_with(1, Some(tls)).await;
    let host = cluster.hosts().remove(0);
    let prefix = unique_prefix();
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let path = |p: &std::path::Path| enc(&p.display().to_string());
    let with_ca = |ca: &std::path::Path| {
        format!("etcds://{host}?prefix={}&cacert={}", enc(&prefix), path(ca))
    };
    let url = format!(
        "{}&cert={}&key={}",
        with_ca(&ca),
        path(&client_cert),
        path(&client_key_file)
    );

    let store = EtcdStore::open(&url).expect("an etcds:// URL");
    assert!(store.config().is_tls());
    let ttl = Duration::from_secs(2);
    let a = leases(Arc::new(store), "tls-a", ttl);
    let t = checkpoint_round_trip(&a, "jobs/tls").await;
    let t2 = a.renew(&t).await.expect("renew over TLS");
    assert_eq!(t2.fencing_token(), t.fencing_token());
    a.release(t2).await.expect("release over TLS");

    let refused = |url: String| async move {
        let config = EtcdConfig::from_url(&url)
            .expect("valid URL")
            .connect_timeout(Duration::from_secs(1))
            .request_timeout(Duration::from_secs(1));
        let e = EtcdStore::new(config)
            .ready()
            .await
            .expect_err("the member must not be usable");
        // The message shows the causes.
        e.to_string()
    };
    // The system's roots do not hold the throwaway CA; the other CA did
    // not sign the member's certificate.
    for url in [
        format!("etcds://{host}?prefix={}", enc(&prefix)),
        with_ca(&other_ca),
    ] {
        let text = refused(url).await;
        assert!(text.contains("invalid peer certificate"), "{text}");
    }
    // The member wants a client certificate: a TLS alert
    // ("BadCertificate"), or a closed connection with a hint.
    let text = refused(with_ca(&ca)).await;
    assert!(
        text.contains("received fatal alert: BadCertificate")
            || text.contains("if it requires client certificates, add &cert=PATH&key=PATH"),
        "{text}"
    );
    // Plain HTTP/2 to a TLS listener.
    let text = refused(format!("etcd://{host}?prefix={}", enc(&prefix))).await;
    assert!(text.contains("if it serves TLS, write etcds://"), "{text}");
}
