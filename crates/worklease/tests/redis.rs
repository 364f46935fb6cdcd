//! The Redis store against a real `redis-server` on loopback: the shared
//! conformance suite and the Redis-specific guarantees (millisecond TTLs on
//! the server, fencing that survives deleted keys and restarts, distinct
//! work IDs, push hand-off to many waiters, resubscription, replica waits,
//! batches of one command each).
//!
//! The server comes from `WORKLEASE_TEST_REDIS_URL` (default
//! `redis://127.0.0.1:6379/0`; `.ci/services/redis.sh` starts one). Every
//! test uses its own key prefix and deletes its keys when done. Tests that
//! restart a server start their own `redis-server` child on a free port.

#![cfg(feature = "redis")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use tokio::time::Instant;
use worklease::conformance::Suite;
use worklease::store::fault::{Counter, FaultStore};
use worklease::store::redis::{RedisConfig, RedisStore};
use worklease::store::{LeaseEnd, LeaseRef};
use worklease::{AcquireOptions, Config, Error, HolderId, LeaseStore, Leases, WorkId};

#[path = "redis/batch.rs"]
mod batch;
#[path = "common/lease.rs"]
mod common_lease;
#[path = "common/net.rs"]
mod common_net;
#[path = "redis/server.rs"]
mod server;
use batch::{command_counts, ran_since};
use common_lease::{acquire_checkpointed, unreachable_error_is_redacted};
use server::{raw, OwnServer, READY};

fn server_url() -> String {
    std::env::var("WORKLEASE_TEST_REDIS_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379/0".to_string())
}

fn unique_prefix() -> String {
    format!("worklease-test:{:016x}:", rand::random::<u64>())
}

/// `base` with `prefix` as the store's key prefix.
fn with_prefix(base: &str, prefix: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}prefix={prefix}")
}

/// Deletes every key under a prefix when dropped.
struct Cleanup {
    base: String,
    prefix: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let result = (|| -> redis::RedisResult<()> {
            let mut conn = redis::Client::open(self.base.as_str())?.get_connection()?;
            let keys =
                redis::Commands::scan_match::<_, Vec<u8>>(&mut conn, format!("{}*", self.prefix))?
                    .collect::<redis::RedisResult<Vec<Vec<u8>>>>()?;
            for chunk in keys.chunks(500) {
                redis::cmd("UNLINK").arg(chunk).exec(&mut conn)?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            eprintln!("cannot delete the test keys under {:?}: {e}", self.prefix);
        }
    }
}

/// A Redis store under test: the test decorator, counting acquire calls
/// (one per attempt of a waiting acquisition) and deleting the keys when
/// the last handle is dropped.
type TestStore = FaultStore<RedisStore>;

/// Test stores on one prefix of the test server.
struct Fixture {
    base: String,
    prefix: String,
    cleanup: Arc<Cleanup>,
}

impl Fixture {
    fn new() -> Self {
        Self::on(server_url())
    }

    fn on(base: String) -> Self {
        let prefix = unique_prefix();
        Self {
            cleanup: Arc::new(Cleanup {
                base: base.clone(),
                prefix: prefix.clone(),
            }),
            base,
            prefix,
        }
    }

    fn url(&self) -> String {
        with_prefix(&self.base, &self.prefix)
    }

    async fn store_with(&self, config: RedisConfig, acquires: &Counter) -> Arc<TestStore> {
        let inner = RedisStore::new(config).expect("store");
        inner.ready().await.expect("the test Redis server answers");
        Arc::new(
            FaultStore::over(Arc::new(inner))
                .count_acquires_in(acquires.clone())
                .with_guard(self.cleanup.clone()),
        )
    }

    async fn store(&self, acquires: &Counter) -> Arc<TestStore> {
        self.store_with(RedisConfig::from_url(&self.url()).expect("URL"), acquires)
            .await
    }

    fn leases(store: &Arc<TestStore>, holder: &str, ttl: Duration) -> Leases {
        Leases::new(store.clone(), Config::new(holder, ttl)).expect("config")
    }
}

worklease::conformance_tests!(redis_store, paused = false, async {
    let fixture = Fixture::new();
    Suite::new(fixture.store(&Counter::new()).await)
});

fn id(s: &str) -> WorkId {
    WorkId::new(s).expect("valid work ID")
}

/// The TTL of the lease is kept by the server, in milliseconds; the other
/// keys never expire.
#[tokio::test]
async fn server_side_ttl_is_in_milliseconds() {
    let f = Fixture::new();
    let store = f.store(&Counter::new()).await;
    let ttl = Duration::from_millis(1500);
    let a = Fixture::leases(&store, "ttl-a", ttl);
    let t = acquire_checkpointed(&a, "jobs/ttl", b"progress").await;
    let keys = store.inner().lease_keys(&id("jobs/ttl"));
    let mut conn = raw(&f.base).await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&keys.live)
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    // The bound: within 100 ms below the TTL, never above it.
    let ttl_ms = ttl.as_millis() as i64;
    let slack_ms = 100;
    assert!(
        (ttl_ms - slack_ms..=ttl_ms).contains(&pttl),
        "a {ttl_ms} ms lease has a server-side PTTL of {pttl} ms"
    );
    for key in [&keys.state, &keys.checkpoint, &keys.fence] {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        assert_eq!(pttl, -1, "{key} must never expire");
    }
    a.release(t).await.expect("release");
}

/// Deleting the lease keys by hand, or letting the lease expire, never
/// resets the fencing token; the checkpoint outlives the lease key.
#[tokio::test]
async fn fencing_survives_deleted_and_expired_keys() {
    let f = Fixture::new();
    let store = f.store(&Counter::new()).await;
    let ttl = Duration::from_millis(300);
    let a = Fixture::leases(&store, "fence-a", ttl);
    let b = Fixture::leases(&store, "fence-b", ttl);
    let work = "jobs/fence";
    let keys = store.inner().lease_keys(&id(work));
    let mut conn = raw(&f.base).await;
    let mut tokens = Vec::new();

    let t = a
        .acquire(work, AcquireOptions::new())
        .await
        .expect("acquire");
    a.checkpoint(&t, &b"kept"[..]).await.expect("checkpoint");
    tokens.push(t.fencing_token());

    // The lease key and the state hash deleted by hand: the counter remains.
    redis::cmd("DEL")
        .arg(&keys.live)
        .arg(&keys.state)
        .exec_async(&mut conn)
        .await
        .expect("DEL");
    assert!(
        matches!(a.renew(&t).await, Err(Error::Fenced { .. })),
        "a lease whose keys were deleted is gone"
    );
    let t = b
        .acquire(work, AcquireOptions::new())
        .await
        .expect("acquire");
    tokens.push(t.fencing_token());
    let c = b.read_checkpoint(&t).await.expect("read");
    assert_eq!(
        c.data.as_deref(),
        Some(&b"kept"[..]),
        "the checkpoint outlives the lease key"
    );

    // The lease key and the counter deleted: the state's token remains.
    redis::cmd("DEL")
        .arg(&keys.live)
        .arg(&keys.fence)
        .exec_async(&mut conn)
        .await
        .expect("DEL");
    let t = a
        .acquire(work, AcquireOptions::new())
        .await
        .expect("acquire");
    tokens.push(t.fencing_token());

    // The counter set back by hand.
    redis::cmd("SET")
        .arg(&keys.fence)
        .arg(0)
        .exec_async(&mut conn)
        .await
        .expect("SET");
    a.release(t).await.expect("release");
    let t = a
        .acquire(work, AcquireOptions::new())
        .await
        .expect("acquire");
    tokens.push(t.fencing_token());

    // Expiry: a waiting contender takes over when the server expires the key.
    let t = b
        .acquire(work, AcquireOptions::new().wait_for_lease())
        .await
        .expect("acquire after expiry");
    tokens.push(t.fencing_token());
    let c = b.read_checkpoint(&t).await.expect("read");
    assert_eq!(
        c.handoff.previous.expect("previous").ended,
        LeaseEnd::Expired
    );
    assert_eq!(c.data.as_deref(), Some(&b"kept"[..]));
    b.release(t).await.expect("release");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "S2: tokens must increase, saw {tokens:?}"
    );
}

/// Work IDs that differ only in characters that matter to keys are
/// independent leases, held at once and released one by one.
#[tokio::test]
async fn distinct_work_ids_are_independent() {
    let f = Fixture::new();
    let store = f.store(&Counter::new()).await;
    let ttl = Duration::from_secs(30);
    let piece = "dir/100%/\"quoted\"/'single'/🚀/{x}:";
    let mut long = String::new();
    while long.len() + piece.len() <= worklease::limits::MAX_WORK_ID_BYTES {
        long.push_str(piece);
    }
    while long.len() < worklease::limits::MAX_WORK_ID_BYTES {
        long.push('z');
    }
    assert_eq!(long.len(), worklease::limits::MAX_WORK_ID_BYTES);
    let ids: Vec<String> = [
        "jobs/a",
        "jobs/a/b",
        "jobs/ab",
        "jobs/{a}",
        "jobs/%7Ba%7D",
        "jobs/a b:ü",
        long.as_str(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let holders: Vec<Leases> = (0..ids.len())
        .map(|i| Fixture::leases(&store, &format!("holder-{i}"), ttl))
        .collect();
    let other = Fixture::leases(&store, "other", ttl);
    let mut tokens = Vec::new();
    for (i, work) in ids.iter().enumerate() {
        let t = holders[i]
            .acquire(work, AcquireOptions::new())
            .await
            .unwrap_or_else(|e| panic!("acquire {work:?}: {e}"));
        let t = holders[i]
            .checkpoint(&t, Bytes::from(format!("state of {i}")))
            .await
            .expect("checkpoint");
        tokens.push(t);
    }
    // All held at once, each by its own holder, each with its own keys.
    let listed = store.inspect(&[]).await.expect("inspect");
    let listed: Vec<(String, String)> = listed
        .into_iter()
        .map(|l| (l.work_id.to_string(), l.holder_id))
        .collect();
    let mut want: Vec<(String, String)> = ids
        .iter()
        .enumerate()
        .map(|(i, w)| (w.clone(), format!("holder-{i}")))
        .collect();
    want.sort();
    assert_eq!(listed, want, "inspect lists every work ID, decoded");
    for work in &ids {
        let keys = store.inner().lease_keys(&id(work));
        let tag = |k: &str| {
            let open = k.find('{').expect("tag");
            let close = open + k[open..].find('}').expect("tag end");
            k[open + 1..close].to_string()
        };
        for k in [&keys.live, &keys.checkpoint, &keys.fence] {
            assert!(k.starts_with(&f.prefix), "{k}");
            assert_eq!(tag(k), tag(&keys.state), "one hash slot per work ID");
        }
    }
    // Released one by one: the others stay held.
    for (i, (work, t)) in ids.iter().zip(tokens).enumerate() {
        holders[i].release(t).await.expect("release");
        let mine = other
            .acquire(work, AcquireOptions::new())
            .await
            .unwrap_or_else(|e| panic!("{work:?} is free after its release: {e}"));
        let c = other.read_checkpoint(&mine).await.expect("read");
        assert_eq!(c.data, Some(Bytes::from(format!("state of {i}"))));
        assert!(c.clean_handoff());
        for later in &ids[i + 1..] {
            assert!(
                matches!(
                    other.acquire(later, AcquireOptions::new()).await,
                    Err(Error::Held { .. })
                ),
                "{later:?} must stay held after {work:?} was released"
            );
        }
        other.release(mine).await.expect("release");
    }
}

/// Waits for `work` with `leases`, polling only every `poll` (longer than
/// the test: only a release announcement wakes the waiter in time).
async fn wait_woken(leases: &Leases, work: &str, poll: Duration) -> worklease::Token {
    leases
        .acquire(
            work,
            AcquireOptions::new().wait_for_lease().poll_interval(poll),
        )
        .await
        .expect("the waiter gets the lease")
}

/// What one waiter saw.
#[derive(Debug)]
struct Turn {
    waiter: usize,
    token: u64,
    acquired: Instant,
    released: Instant,
}

/// 50 waiters on one work ID; each holder releases after 100 ms. Every
/// release goes to exactly one waiter, at once (by the release
/// announcement: the waiters' poll interval and the TTL are far longer
/// than the test), and the store sees at most one acquire attempt per
/// waiting waiter per release:
///
/// attempts ≤ W (first tries) + Σ over releases of the waiters still
/// waiting = W + W(W+1)/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_take_each_release_once() {
    const WAITERS: usize = 50;
    let hold = Duration::from_millis(100);
    let long = Duration::from_secs(120);
    let f = Fixture::new();
    let work = "jobs/herd";
    let acquires = Counter::new();
    let first_store = f.store(&Counter::new()).await;
    let first = Fixture::leases(&first_store, "first", long);
    let t = first
        .acquire(work, AcquireOptions::new())
        .await
        .expect("acquire");

    let turns = Arc::new(Mutex::new(Vec::<Turn>::new()));
    let mut tasks = Vec::new();
    for waiter in 0..WAITERS {
        // One store per waiter, as for a fleet of processes.
        let store = f.store(&acquires).await;
        let turns = turns.clone();
        tasks.push(tokio::spawn(async move {
            let leases = Fixture::leases(&store, &format!("waiter-{waiter}"), long);
            let t = wait_woken(&leases, work, long).await;
            let acquired = Instant::now();
            tokio::time::sleep(hold).await;
            let released = Instant::now();
            let token = t.fencing_token();
            leases.release(t).await.expect("release");
            turns.lock().expect("turns").push(Turn {
                waiter,
                token,
                acquired,
                released,
            });
        }));
    }
    // Every waiter has tried once and is waiting.
    acquires.reaches(WAITERS as u64).await;
    let start = Instant::now();
    tokio::time::sleep(hold).await;
    let first_release = Instant::now();
    first.release(t).await.expect("release");
    for task in tasks {
        task.await.expect("waiter task");
    }
    let elapsed = start.elapsed();

    let mut turns = std::mem::take(&mut *turns.lock().expect("turns"));
    turns.sort_by_key(|t| t.acquired);
    assert_eq!(turns.len(), WAITERS);
    let waiters: std::collections::HashSet<usize> = turns.iter().map(|t| t.waiter).collect();
    assert_eq!(
        waiters.len(),
        WAITERS,
        "each waiter took exactly one release"
    );
    let mut previous_release = first_release;
    let mut gaps = Vec::new();
    for (k, turn) in turns.iter().enumerate() {
        assert!(
            turn.acquired > previous_release,
            "hand-off {k}: acquired before the previous holder released"
        );
        let gap = turn.acquired - previous_release;
        assert!(
            gap < hold,
            "hand-off {k} took {gap:?}: the waiters were not woken by the release"
        );
        gaps.push(gap);
        previous_release = turn.released;
    }
    assert!(
        turns.windows(2).all(|w| w[0].token < w[1].token),
        "tokens increase with every hand-off"
    );
    let attempts = acquires.get();
    let waiting_sum: u64 = (1..=WAITERS as u64).sum();
    let bound = WAITERS as u64 + waiting_sum;
    let hand_offs = WAITERS as u64;
    gaps.sort();
    eprintln!(
        "{WAITERS} waiters, {hand_offs} hand-offs in {elapsed:?}: {attempts} acquire attempts \
         ({:.1} per hand-off; bound {bound}, {:.1} per hand-off); hand-off latency median {:?}, max {:?}",
        attempts as f64 / hand_offs as f64,
        bound as f64 / hand_offs as f64,
        gaps[gaps.len() / 2],
        gaps[gaps.len() - 1],
    );
    assert!(
        attempts <= bound,
        "{attempts} acquire attempts for {hand_offs} hand-offs: more than the bound {bound} \
         (one first try per waiter plus one try per waiting waiter per release)"
    );
}

/// With `appendonly yes`, fencing tokens and checkpoints survive a restart
/// of the server; a token from before the restart is still known.
#[tokio::test]
async fn tokens_survive_a_restart_with_appendonly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let server = OwnServer::start(dir.path(), None, &aof, READY);
    let port = server.port;
    let url = with_prefix(&server.url(), "restart:");
    let ttl = Duration::from_secs(60);
    let work = "jobs/restart";
    let (last, stale) = {
        let store = Arc::new(RedisStore::connect(&url).await.expect("connect"));
        let a = Leases::new(store, Config::new("before", ttl)).expect("config");
        let mut last = 0;
        for _ in 0..3 {
            let t = a
                .acquire(work, AcquireOptions::new())
                .await
                .expect("acquire");
            assert!(t.fencing_token() > last);
            last = t.fencing_token();
            a.release(t).await.expect("release");
        }
        let t = a
            .acquire(work, AcquireOptions::new())
            .await
            .expect("acquire");
        let t = a
            .checkpoint(&t, &b"before restart"[..])
            .await
            .expect("checkpoint");
        (t.fencing_token(), t)
    };
    server.stop().await;
    let server = OwnServer::start(dir.path(), Some(port), &aof, READY);
    let store = Arc::new(RedisStore::connect(&url).await.expect("connect"));
    let b = Leases::new(store.clone(), Config::new("after", ttl)).expect("config");
    assert!(
        matches!(
            b.acquire(work, AcquireOptions::new()).await,
            Err(Error::Held { .. })
        ),
        "a live lease survives the restart"
    );
    store
        .revoke(&id(work))
        .await
        .expect("revoke")
        .expect("the lease is known after the restart");
    let t = b
        .acquire(work, AcquireOptions::new())
        .await
        .expect("acquire");
    assert!(
        t.fencing_token() > last,
        "S2 across a restart: {} after {last}",
        t.fencing_token()
    );
    let c = b.read_checkpoint(&t).await.expect("read");
    assert_eq!(c.data.as_deref(), Some(&b"before restart"[..]));
    let a = Leases::new(store.clone(), Config::new("before", ttl)).expect("config");
    assert!(matches!(a.renew(&stale).await, Err(Error::Fenced { .. })));
    b.release(t).await.expect("release");
    server.stop().await;
}

/// The subscriber connection comes back after the server restarts, wakes
/// every waiter (announcements may have been lost meanwhile), and later
/// releases reach the waiter at once again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_survives_a_server_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let server = OwnServer::start(dir.path(), None, &aof, READY);
    let port = server.port;
    let f = Fixture::on(server.url());
    let long = Duration::from_secs(120);
    let work = "jobs/resubscribe";
    let holder_store = f.store(&Counter::new()).await;
    let holder = Fixture::leases(&holder_store, "holder", long);
    let t = holder
        .acquire(work, AcquireOptions::new())
        .await
        .expect("acquire");
    let attempts = Counter::new();
    let waiter_store = f.store(&attempts).await;
    let waiter = tokio::spawn({
        let leases = Fixture::leases(&waiter_store, "waiter", long);
        async move {
            let t = wait_woken(&leases, work, long).await;
            (t, Instant::now())
        }
    });
    attempts.reaches(1).await;
    server.stop().await;
    let server = OwnServer::start(dir.path(), Some(port), &aof, READY);
    // The resubscription wakes the waiter, which finds the lease held.
    attempts.reaches(2).await;
    let released = Instant::now();
    // The holder's connection may report the restart once; a retry that
    // finds the lease already released (Expired) saw the first one land.
    let mut result = holder.release(t.clone()).await;
    for _ in 0..2 {
        match &result {
            Err(e) if e.is_transient() => result = holder.release(t.clone()).await,
            _ => break,
        }
    }
    match result {
        Ok(()) | Err(Error::Expired { .. }) => {}
        Err(e) => panic!("release: {e}"),
    }
    let (t, got) = waiter.await.expect("waiter task");
    assert!(
        got - released < long / 10,
        "the release reached the waiter after {:?}",
        got - released
    );
    assert_eq!(attempts.get(), 3, "one attempt per wake-up");
    let leases = Fixture::leases(&waiter_store, "waiter", long);
    leases.release(t).await.expect("release");
    drop((holder_store, waiter_store, f));
    server.stop().await;
}

/// An acquisition that too few replicas acknowledge is refused and ended
/// as expired; with a replica attached, the same setting grants it.
#[tokio::test]
async fn wait_for_replicas_refuses_unreplicated_acquisitions() {
    let f = Fixture::new();
    let wait = Duration::from_millis(50);
    let config = RedisConfig::from_url(&f.url())
        .expect("URL")
        .wait_for_replicas(1, wait)
        .expect("config");
    let store = f.store_with(config, &Counter::new()).await;
    let a = Fixture::leases(&store, "wait-a", Duration::from_secs(30));
    let work = "jobs/replicated";
    let started = Instant::now();
    match a.acquire(work, AcquireOptions::new()).await {
        Err(Error::Store(e)) => {
            assert!(e.message.contains("replicas"), "{e}");
            assert!(started.elapsed() >= wait, "WAIT waited");
        }
        other => panic!("a server without replicas cannot acknowledge: {other:?}"),
    }
    let plain = f.store(&Counter::new()).await;
    let b = Fixture::leases(&plain, "wait-b", Duration::from_secs(30));
    let t = b
        .acquire(work, AcquireOptions::new())
        .await
        .expect("the refused acquisition holds nothing");
    let c = b.read_checkpoint(&t).await.expect("read");
    let prev = c.handoff.previous.expect("the refused acquisition");
    assert_eq!(
        (prev.holder_id.as_str(), prev.ended),
        ("wait-a", LeaseEnd::Expired),
        "a refused acquisition is no clean hand-off"
    );
    // In a batch, each grant too few replicas acknowledged is refused.
    let batch = [id(work), id("jobs/replicated-2")];
    let wait_a = HolderId::new("wait-a").expect("holder");
    let ttl = Duration::from_secs(30);
    let out = store
        .acquire_many(&batch, &wait_a, ttl, 2)
        .await
        .expect("acquire_many");
    assert!(matches!(&out[0], Err(Error::Held { .. })), "{:?}", out[0]);
    assert!(
        matches!(&out[1], Err(Error::Store(e)) if e.message.contains("replicas")),
        "{:?}",
        out[1]
    );
    let t2 = b
        .acquire(batch[1].as_str(), AcquireOptions::new())
        .await
        .expect("the refused grant of the batch holds nothing");
    let c = b.read_checkpoint(&t2).await.expect("read");
    assert_eq!(
        c.handoff.previous.expect("the refused grant").ended,
        LeaseEnd::Expired
    );
    b.release(t2).await.expect("release");
    // Every write waits: a renewal, a checkpoint and a release that no
    // replica acknowledged fail with a store error (the lease layer
    // retries them; the holder's deadline stays that of its last
    // acknowledged extension).
    let wait_b = HolderId::new("wait-b").expect("holder");
    let work_id = id(work);
    let lease = LeaseRef {
        work_id: &work_id,
        holder_id: &wait_b,
        fencing_token: t.fencing_token(),
    };
    let unreplicated = |what: &str, r: Result<(), Error>| match r {
        Err(Error::Store(e)) => assert!(
            e.message.contains(what) && e.message.contains("replicas"),
            "{e}"
        ),
        other => panic!("{what} without replicas: {other:?}"),
    };
    unreplicated("renew", store.renew(lease, ttl).await.map(drop));
    let data = Bytes::from_static(b"unreplicated");
    unreplicated(
        "checkpoint",
        store.checkpoint(lease, ttl, data).await.map(drop),
    );
    unreplicated("release", store.release(lease).await);
    // The release did apply on the primary (it is not undone).
    assert!(matches!(b.release(t).await, Err(Error::Expired { .. })));

    // A primary with one replica acknowledges.
    let dir = tempfile::tempdir().expect("tempdir");
    let primary = OwnServer::start(dir.path(), None, &[], READY);
    let replica_dir = tempfile::tempdir().expect("tempdir");
    let primary_port = primary.port.to_string();
    let replica = OwnServer::start(
        replica_dir.path(),
        None,
        &["--replicaof", "127.0.0.1", &primary_port],
        "MASTER <-> REPLICA sync: Finished with success",
    );
    let url = with_prefix(&primary.url(), "replicated:");
    let config = RedisConfig::from_url(&url)
        .expect("URL")
        .wait_for_replicas(1, Duration::from_secs(5))
        .expect("config");
    let store = Arc::new(RedisStore::new(config).expect("store"));
    let a = Leases::new(store.clone(), Config::new("wait-a", ttl)).expect("config");
    let t = a
        .acquire(work, AcquireOptions::new())
        .await
        .expect("one replica acknowledges");
    a.release(t).await.expect("release");
    // A batch waits once, after its one script (the second batch: the
    // first one loaded the script).
    let mut conn = raw(&primary.url()).await;
    for round in 0..2 {
        let before = command_counts(&mut conn).await;
        let out = store
            .acquire_many(&batch, &wait_a, ttl, 2)
            .await
            .expect("acquire_many");
        let ran = ran_since(&mut conn, &before).await;
        if round == 1 {
            assert_eq!(
                (ran.get("evalsha"), ran.get("wait")),
                (Some(&1), Some(&1)),
                "{ran:?}"
            );
        }
        let leases: Vec<LeaseRef> = batch
            .iter()
            .zip(&out)
            .map(|(work_id, g)| LeaseRef {
                work_id,
                holder_id: &wait_a,
                fencing_token: g.as_ref().expect("one replica acknowledges").fencing_token,
            })
            .collect();
        store.release_many(&leases).await.expect("release_many");
    }
    replica.stop().await;
    primary.stop().await;
}

/// A store opened from a URL string through `store::url`.
#[tokio::test]
async fn opens_from_a_store_url() {
    let f = Fixture::new();
    let store = worklease::store::url::open(&f.url()).expect("open");
    assert_eq!(store.kind(), "redis");
    let a = Leases::new(store, Config::new("url-a", Duration::from_secs(5))).expect("config");
    let t = a
        .acquire("jobs/url", AcquireOptions::new())
        .await
        .expect("acquire");
    a.release(t).await.expect("release");
    drop(f);
}

/// An unreachable server is a store error (transient, so renewal retries
/// it) that names the server without its password.
#[tokio::test]
async fn unreachable_server_is_a_redacted_store_error() {
    // Port 1 on loopback: nothing listens there.
    let store = RedisStore::open("redis://app:s3cret@127.0.0.1:1/0").expect("valid URL");
    unreachable_error_is_redacted(Arc::new(store), "s3cret", "127.0.0.1:1").await;
}
