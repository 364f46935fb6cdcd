//! The object-storage store: the shared conformance suite on a real
//! S3-compatible server (moto) and on `object_store`'s in-memory store, and
//! the guarantees the store owes beyond it: one winner among 32 concurrent
//! acquirers, a dropped reply that neither loses the lease nor makes two
//! holders, tombstones that keep the fencing generation, takeover of a
//! vanished holder's lease between one TTL and a TTL plus a poll interval
//! after the contender first saw it, the error mapping on the wire, and
//! the operator's purge.
//!
//! The server comes from `WORKLEASE_TEST_S3_URL` (default
//! `s3://worklease-test/worklease-test?endpoint=http://127.0.0.1:5000&region=us-east-1`;
//! `.ci/services/moto.sh` starts moto, creates the bucket and exports it
//! with dummy `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`). Every test
//! works under a prefix of its own below the URL's, deleted when done.

#![cfg(feature = "object-store")]

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::{BoxStream, TryStreamExt};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use tokio::time::Instant;
use worklease::conformance::Suite;
use worklease::gc::{collect, GcOptions};
use worklease::store::object::{ObjectLeaseStore, ObjectRegister, S3Config};
use worklease::store::register::{Register, RegisterError, RegisterStore};
use worklease::{AcquireOptions, Config, Error, LeaseEnd, LeaseStore, Leases, WorkId};

#[path = "common/object_prefix.rs"]
mod common_object_prefix;
#[path = "common/race.rs"]
mod common_race;

use common_object_prefix::{fresh_prefix, Cleanup, Guarded};
use common_race::one_winner;

const DEFAULT_URL: &str =
    "s3://worklease-test/worklease-test?endpoint=http://127.0.0.1:5000&region=us-east-1";

fn base_config() -> S3Config {
    let url = std::env::var("WORKLEASE_TEST_S3_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| DEFAULT_URL.to_string());
    assert!(
        std::env::var_os("AWS_ACCESS_KEY_ID").is_some(),
        "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (any values for moto; \
         .ci/services/moto.sh exports them with WORKLEASE_TEST_S3_URL)"
    );
    S3Config::from_url(&url).expect("WORKLEASE_TEST_S3_URL")
}

/// Registers on one fresh prefix of the test server. Each
/// [`Fixture::register`] is a new client, as another process would have.
struct Fixture {
    config: S3Config,
    cleanup: Arc<Cleanup>,
}

impl Fixture {
    fn new() -> Self {
        let base = base_config();
        let prefix = fresh_prefix(base.get_prefix());
        let config = base.prefix(prefix.clone()).expect("prefix");
        let register = config.register().expect("S3 register");
        Self {
            cleanup: Cleanup::of(&register, &prefix),
            config,
        }
    }

    fn register(&self) -> Guarded<ObjectRegister> {
        Guarded {
            inner: self.config.register().expect("S3 register"),
            _cleanup: self.cleanup.clone(),
        }
    }

    /// A register whose object store goes through [`Faults`].
    fn faulty(&self, faults: &Arc<Faults>) -> Guarded<ObjectRegister> {
        let s3 = self.config.register().expect("S3 register");
        let store = Arc::new(FaultyStore {
            inner: s3.object_store().clone(),
            faults: faults.clone(),
        });
        Guarded {
            inner: ObjectRegister::new(store, self.config.get_prefix()).expect("register"),
            _cleanup: self.cleanup.clone(),
        }
    }

    fn store(&self) -> Arc<RegisterStore<Guarded<ObjectRegister>>> {
        Arc::new(RegisterStore::new(self.register()))
    }
}

fn memory_store(store: &Arc<InMemory>) -> ObjectLeaseStore {
    RegisterStore::new(ObjectRegister::new(store.clone(), "leases").expect("register"))
}

worklease::conformance_tests!(s3_moto, paused = false, async {
    Suite::new(Fixture::new().store())
});

worklease::conformance_tests!(in_memory_object_store, paused = true, async {
    let mut suite = Suite::new(Arc::new(memory_store(&Arc::new(InMemory::new()))));
    // object_store has no conditional delete: gc refuses (checked).
    suite.deletes = false;
    suite
});

fn id(s: &str) -> WorkId {
    WorkId::new(s).expect("valid work ID")
}

fn leases(store: Arc<dyn LeaseStore>, holder: &str, ttl: Duration) -> Leases {
    Leases::new(store, Config::new(holder, ttl)).expect("config")
}

/// 32 clients (each its own register and adapter, as 32 processes) race
/// for one free work ID: exactly one wins, every other one is told `Held`.
/// Then the winner releases, and 32 race for the released lease: again one.
#[tokio::test]
async fn thirty_two_concurrent_acquirers_have_one_winner() {
    let f = Fixture::new();
    let work = "jobs/contended";
    let ttl = Duration::from_secs(30);
    let clients: Vec<Leases> = (0..32)
        .map(|i| leases(f.store(), &format!("racer-{i}"), ttl))
        .collect();
    for round in 1..=2u64 {
        let (i, token) = one_winner(&clients, work, &format!("round {round}")).await;
        assert_eq!(token.fencing_token(), round);
        let info = f.store().inspect(&[id(work)]).await.expect("inspect");
        assert_eq!(info[0].holder_id, format!("racer-{i}"));
        assert_eq!(info[0].fencing_token, round);
        clients[i].release(token).await.expect("release");
    }
}

/// What [`FaultyStore`] does to the next put.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
enum Fault {
    None = 0,
    /// Applies the put, then loses its reply (a timeout after sending).
    DropReply = 1,
    /// Applies the put, then answers 412, as `object_store`'s own retry of
    /// an applied conditional put does.
    PreconditionReply = 2,
    /// Fails the put before it reaches the store.
    FailBeforeSending = 3,
}

/// One-shot faults for the next put through a [`FaultyStore`].
#[derive(Default)]
struct Faults {
    next: AtomicU8,
    /// The instants each get returned and each put was sent, for the
    /// takeover test.
    reads_returned: Mutex<Vec<Instant>>,
    puts_sent: Mutex<Vec<Instant>>,
}

impl Faults {
    fn arm(&self, fault: Fault) {
        self.next.store(fault as u8, Ordering::SeqCst);
    }
    fn take(&self) -> Fault {
        match self.next.swap(0, Ordering::SeqCst) {
            1 => Fault::DropReply,
            2 => Fault::PreconditionReply,
            3 => Fault::FailBeforeSending,
            _ => Fault::None,
        }
    }
    fn armed(&self) -> bool {
        self.next.load(Ordering::SeqCst) != 0
    }
}

/// An object store that injects [`Faults`] into puts and records when
/// gets return and puts are sent.
struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    faults: Arc<Faults>,
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

fn injected(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "faulty",
        source: what.to_string().into(),
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let fault = self.faults.take();
        if fault == Fault::FailBeforeSending {
            return Err(injected("connection refused (injected)"));
        }
        self.faults.puts_sent.lock().unwrap().push(Instant::now());
        let result = self.inner.put_opts(location, payload, opts).await;
        match (fault, result) {
            (Fault::DropReply, Ok(_)) => {
                Err(injected("reply lost after the put was applied (injected)"))
            }
            (Fault::PreconditionReply, Ok(_)) => Err(object_store::Error::Precondition {
                path: location.to_string(),
                source: "412 to a retry of an applied put (injected)".into(),
            }),
            (_, r) => r,
        }
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let r = self.inner.get_opts(location, options).await;
        self.faults
            .reads_returned
            .lock()
            .unwrap()
            .push(Instant::now());
        r
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A reply lost after the server applied the write (or turned into a 412
/// by a retry) leaves the holder holding: acquire, renew, checkpoint and
/// release all succeed, a second holder is told `Held`, and the tokens go
/// on from there. A put that never reached the server fails with a store
/// error and changes nothing.
async fn dropped_replies(register: impl Register, other: Arc<dyn LeaseStore>, faults: &Faults) {
    let ttl = Duration::from_secs(30);
    let store: Arc<dyn LeaseStore> = Arc::new(RegisterStore::new(register));
    let a = leases(store.clone(), "holder-a", ttl);
    let b = leases(other, "holder-b", ttl);
    let work = "jobs/lost-replies";

    faults.arm(Fault::DropReply);
    let t = a
        .acquire(work, AcquireOptions::new())
        .await
        .expect("acquired despite the lost reply");
    assert!(!faults.armed(), "the fault was used");
    assert_eq!(t.fencing_token(), 1);
    assert!(matches!(
        b.acquire(work, AcquireOptions::new()).await,
        Err(Error::Held { .. })
    ));

    faults.arm(Fault::PreconditionReply);
    let t = a
        .renew(&t)
        .await
        .expect("renewed despite the 412 to a retry");
    faults.arm(Fault::DropReply);
    let t = a
        .checkpoint(&t, &b"page 7"[..])
        .await
        .expect("checkpointed despite the lost reply");
    assert!(matches!(
        b.acquire(work, AcquireOptions::new()).await,
        Err(Error::Held { .. })
    ));

    faults.arm(Fault::FailBeforeSending);
    let e = a.renew(&t).await.unwrap_err();
    assert!(matches!(e, Error::Store(_)), "{e:?}");
    let t = a.renew(&t).await.expect("the next renewal succeeds");

    faults.arm(Fault::DropReply);
    a.release(t).await.expect("released despite the lost reply");
    let t2 = b
        .acquire(work, AcquireOptions::new())
        .await
        .expect("free after the release");
    assert_eq!(t2.fencing_token(), 2);
    let c = b.read_checkpoint(&t2).await.expect("read");
    assert!(c.clean_handoff());
    assert_eq!(c.data.as_deref(), Some(&b"page 7"[..]));

    // A failed acquisition that never reached the server leaves it free.
    faults.arm(Fault::FailBeforeSending);
    let e = a
        .acquire("jobs/never-sent", AcquireOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Store(_)), "{e:?}");
    let t = a
        .acquire("jobs/never-sent", AcquireOptions::new())
        .await
        .expect("acquire");
    assert_eq!(t.fencing_token(), 1);
}

#[tokio::test]
async fn dropped_reply_on_s3_neither_loses_the_lease_nor_makes_two_holders() {
    let f = Fixture::new();
    let faults = Arc::new(Faults::default());
    dropped_replies(f.faulty(&faults), f.store(), &faults).await;
}

#[tokio::test(start_paused = true)]
async fn dropped_reply_in_memory_neither_loses_the_lease_nor_makes_two_holders() {
    let memory = Arc::new(InMemory::new());
    let faults = Arc::new(Faults::default());
    let store = Arc::new(FaultyStore {
        inner: memory.clone(),
        faults: faults.clone(),
    });
    let register = ObjectRegister::new(store, "leases").expect("register");
    dropped_replies(register, Arc::new(memory_store(&memory)), &faults).await;
}

/// Release writes a tombstone: the object stays, and every later
/// acquisition, by anyone, gets a larger fencing token.
#[tokio::test]
async fn release_then_acquire_gives_a_larger_generation() {
    let f = Fixture::new();
    let ttl = Duration::from_secs(30);
    let (a, b) = (
        leases(f.store(), "gen-a", ttl),
        leases(f.store(), "gen-b", ttl),
    );
    let work = "jobs/generations";
    let register = f.register();
    let mut last = 0;
    for (holder, other) in [(&a, &b), (&b, &a), (&a, &b)] {
        let t = holder
            .acquire(work, AcquireOptions::new())
            .await
            .expect("acquire");
        assert!(
            t.fencing_token() > last,
            "{} after {last}",
            t.fencing_token()
        );
        last = t.fencing_token();
        assert!(matches!(
            other.acquire(work, AcquireOptions::new()).await,
            Err(Error::Held { .. })
        ));
        holder.release(t).await.expect("release");
        assert!(
            register.read(&id(work)).await.expect("read").is_some(),
            "the tombstone stays"
        );
        let info = f.store().inspect(&[id(work)]).await.expect("inspect");
        assert!(info[0].released && info[0].expired, "{info:?}");
        assert_eq!(info[0].fencing_token, last);
    }
    assert_eq!(last, 3);
}

/// A holder vanishes (no renewal, no release); a contender that first
/// looks some time later takes the lease over no sooner than one TTL after
/// it first saw the lease's version, and no later than a TTL plus a poll
/// interval after that (plus one request's latency on a real server).
async fn takeover_after_one_observed_ttl(
    holder: Arc<dyn LeaseStore>,
    contender: Arc<dyn LeaseStore>,
    faults: &Faults,
    latency: Duration,
) {
    let ttl = Duration::from_millis(1500);
    let poll = Duration::from_millis(200);
    let work = "jobs/vanished";
    let a = leases(holder, "vanishing", ttl);
    let t = a
        .acquire(work, AcquireOptions::new())
        .await
        .expect("acquire");
    drop(a); // The holder vanishes: nothing renews or releases.

    // The contender first looks half a TTL later.
    tokio::time::sleep(ttl / 2).await;
    let b = leases(contender, "successor", ttl);
    faults.reads_returned.lock().unwrap().clear();
    faults.puts_sent.lock().unwrap().clear();
    match b.acquire(work, AcquireOptions::new()).await {
        Err(Error::Held { holder_id, .. }) => assert_eq!(holder_id, "vanishing"),
        other => panic!("expected Held, got {other:?}"),
    }
    let first_seen = faults.reads_returned.lock().unwrap()[0];
    let t2 = b
        .acquire(
            work,
            AcquireOptions::new().wait_for_lease().poll_interval(poll),
        )
        .await
        .expect("taken over");
    let puts = faults.puts_sent.lock().unwrap().clone();
    assert_eq!(puts.len(), 1, "only the successful takeover writes");
    let waited = puts[0] - first_seen;
    assert!(
        waited >= ttl,
        "taken over {waited:?} after the contender first saw the lease: sooner than the TTL {ttl:?}"
    );
    assert!(
        waited <= ttl + poll + latency,
        "taken over {waited:?} after first seen: later than TTL {ttl:?} + poll {poll:?} + {latency:?}"
    );
    assert_eq!(t2.fencing_token(), t.fencing_token() + 1);
    let c = b.read_checkpoint(&t2).await.expect("read");
    let prev = c.handoff.previous.expect("previous holder");
    assert_eq!(
        (prev.holder_id.as_str(), prev.ended),
        ("vanishing", LeaseEnd::Expired)
    );
}

#[tokio::test]
async fn vanished_holder_is_taken_over_between_one_ttl_and_ttl_plus_poll_on_s3() {
    let f = Fixture::new();
    let faults = Arc::new(Faults::default());
    let contender = Arc::new(RegisterStore::new(f.faulty(&faults)));
    // One read and the decision: the latency of a request to a loopback
    // server under a loaded CI machine, generously.
    takeover_after_one_observed_ttl(f.store(), contender, &faults, Duration::from_millis(500))
        .await;
}

#[tokio::test(start_paused = true)]
async fn vanished_holder_is_taken_over_between_one_ttl_and_ttl_plus_poll_in_memory() {
    let memory = Arc::new(InMemory::new());
    let faults = Arc::new(Faults::default());
    let contender = Arc::new(RegisterStore::new(
        ObjectRegister::new(
            Arc::new(FaultyStore {
                inner: memory.clone(),
                faults: faults.clone(),
            }),
            "leases",
        )
        .expect("register"),
    ));
    // On the paused clock requests take no time: the bounds are exact.
    takeover_after_one_observed_ttl(
        Arc::new(memory_store(&memory)),
        contender,
        &faults,
        Duration::ZERO,
    )
    .await;
}

/// The register's answers on the wire: 412 to `If-None-Match: *` on an
/// existing object, to a stale `If-Match`, and to `If-Match` on a missing
/// object are lost compare-and-swaps; a stale `If-Match` on delete too.
/// Work IDs are single escaped keys under the prefix.
#[tokio::test]
async fn s3_register_maps_preconditions_to_conflicts() {
    let f = Fixture::new();
    let reg = f.register();
    let (k, other) = (id("jobs/a"), id("jobs%2Fa"));
    assert_eq!(reg.read(&k).await.expect("read"), None);
    let h1 = reg
        .write(&k, None, Bytes::from_static(b"one"))
        .await
        .expect("create");
    assert!(matches!(
        reg.write(&k, None, Bytes::from_static(b"two")).await,
        Err(RegisterError::Conflict)
    ));
    let h2 = reg
        .write(&k, Some(&h1), Bytes::from_static(b"two"))
        .await
        .expect("update");
    assert_ne!(h1, h2);
    assert!(matches!(
        reg.write(&k, Some(&h1), Bytes::from_static(b"three")).await,
        Err(RegisterError::Conflict)
    ));
    assert!(matches!(
        reg.write(&other, Some(&h2), Bytes::from_static(b"x")).await,
        Err(RegisterError::Conflict)
    ));
    assert_eq!(
        reg.read(&k).await.expect("read"),
        Some((Bytes::from_static(b"two"), h2.clone()))
    );
    reg.write(&other, None, Bytes::from_static(b"o"))
        .await
        .expect("create other");
    let mut listed = reg.list().await.expect("list");
    listed.sort();
    let mut want = vec![k.clone(), other.clone()];
    want.sort();
    assert_eq!(listed, want);
    let key = reg.inner.key(&k).expect("key");
    assert_eq!(key.as_ref(), format!("{}/jobs%2Fa", f.config.get_prefix()));

    assert!(matches!(
        reg.delete(&k, &h1).await,
        Err(RegisterError::Conflict)
    ));
    reg.delete(&k, &h2).await.expect("conditional delete");
    assert_eq!(reg.read(&k).await.expect("read"), None);
    assert!(matches!(
        reg.delete(&k, &h2).await,
        Err(RegisterError::Conflict)
    ));
}

/// Garbage collection on S3: old tombstones (released, revoked) are
/// deleted with a conditional delete, a held lease is kept, and a deleted
/// work ID's next token is above its last one (the prefix's fencing floor
/// object); the floor object is no work ID.
#[tokio::test]
async fn gc_deletes_only_old_tombstones_and_keeps_tokens_rising() {
    let f = Fixture::new();
    let store = RegisterStore::new(f.register());
    let shared: Arc<dyn LeaseStore> = f.store();
    let ttl = Duration::from_secs(30);
    let a = leases(shared.clone(), "purge-a", ttl);
    let released = a
        .acquire("jobs/released", AcquireOptions::new())
        .await
        .expect("acquire");
    let last = released.fencing_token();
    a.release(released).await.expect("release");
    let _held = a
        .acquire("jobs/held", AcquireOptions::new())
        .await
        .expect("acquire");
    a.acquire("jobs/revoked", AcquireOptions::new())
        .await
        .expect("acquire");
    shared.revoke(&id("jobs/revoked")).await.expect("revoke");

    let none = collect(&store, &GcOptions::older_than(Duration::from_secs(3600)))
        .await
        .expect("gc");
    assert!(none.collected.is_empty(), "{none:?}");
    let report = collect(&store, &GcOptions::older_than(Duration::ZERO))
        .await
        .expect("gc");
    let purged: Vec<String> = report
        .collected
        .iter()
        .map(|i| i.work_id.to_string())
        .collect();
    assert_eq!(
        purged,
        vec!["jobs/released".to_string(), "jobs/revoked".to_string()]
    );
    let left: Vec<String> = shared
        .inspect(&[])
        .await
        .expect("inspect")
        .into_iter()
        .map(|i| i.work_id.to_string())
        .collect();
    assert_eq!(
        left,
        vec!["jobs/held".to_string()],
        "the floor object is no lease"
    );
    let t = a
        .acquire("jobs/released", AcquireOptions::new())
        .await
        .expect("acquire");
    assert!(
        t.fencing_token() > last,
        "S2: a collected work ID's next token {} is above its last {last}",
        t.fencing_token()
    );

    // Without a conditional delete, gc refuses rather than risk one.
    let memory = Arc::new(memory_store(&Arc::new(InMemory::new())));
    let m = leases(memory.clone(), "purge-m", ttl);
    let t = m
        .acquire("jobs/released", AcquireOptions::new())
        .await
        .expect("acquire");
    m.release(t).await.expect("release");
    let e = collect(&*memory, &GcOptions::older_than(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("conditional delete"), "{e}");
}

/// A bucket that does not exist is named as such by an acquisition (a
/// read, then a conditional write), a read of one lease and a listing:
/// never taken for "no lease yet", nor for a lost compare-and-swap
/// ("contention").
#[tokio::test]
async fn a_missing_bucket_is_named_as_missing() {
    let base = base_config();
    let bucket = format!("worklease-missing-{:016x}", rand::random::<u64>());
    let url = base.to_url().replacen(
        &format!("s3://{}", base.bucket()),
        &format!("s3://{bucket}"),
        1,
    );
    let store: Arc<dyn LeaseStore> = Arc::new(
        S3Config::from_url(&url)
            .expect("URL")
            .open()
            .expect("open (nothing is sent yet)"),
    );
    let missing = format!("the bucket {bucket:?} does not exist");
    let check = |e: Error| {
        assert!(matches!(e, Error::Store(_)), "{e:?}");
        let text = e.to_string();
        assert!(text.contains(&missing), "{text}");
        assert!(!text.contains("contention"), "{text}");
    };
    let a = leases(store.clone(), "in-no-bucket", Duration::from_secs(30));
    check(
        a.acquire("jobs/a", AcquireOptions::new())
            .await
            .expect_err("no bucket, no lease"),
    );
    check(
        store
            .inspect(&[id("jobs/a")])
            .await
            .expect_err("no bucket to read from"),
    );
    check(store.inspect(&[]).await.expect_err("no bucket to list"));
}

/// A work ID whose object key would exceed the object store's limit is bad
/// input (so a pool or a retry loop gives up on it), not a store failure,
/// and nothing is written.
#[tokio::test]
async fn a_work_id_too_long_for_an_object_key_is_bad_input() {
    let memory = Arc::new(InMemory::new());
    let leases = Leases::new(
        Arc::new(memory_store(&memory)),
        Config::new("a", Duration::from_secs(5)),
    )
    .expect("config");
    let long = "x".repeat(1020);
    match leases.acquire(&long, AcquireOptions::new()).await {
        Err(Error::Invalid(e)) => assert!(e.to_string().contains("1024"), "{e}"),
        other => panic!("expected bad input, got {other:?}"),
    }
    let written: Vec<_> = memory.list(None).try_collect().await.expect("list");
    assert!(written.is_empty(), "something was written: {written:?}");
}
