//! The adapter's tests: the observation rule, contention and the lease
//! operations over a [`MemoryRegister`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::time::advance;

use super::{Handle, MemoryRegister, Register, RegisterError, RegisterStore, MAX_ATTEMPTS};
use crate::error::{Error, Result};
use crate::limits::{HolderId, WorkId};
use crate::store::{ExpiryClock, LeaseEnd, LeaseRef, LeaseStore};

const TTL: Duration = Duration::from_secs(10);

fn wid(s: &str) -> WorkId {
    WorkId::new(s).unwrap()
}

fn hid(s: &str) -> HolderId {
    HolderId::new(s).unwrap()
}

fn lease<'a>(work_id: &'a WorkId, holder_id: &'a HolderId, fencing_token: u64) -> LeaseRef<'a> {
    LeaseRef {
        work_id,
        holder_id,
        fencing_token,
    }
}

type Shared = RegisterStore<Arc<MemoryRegister>>;

/// A holder's adapter and a contender's adapter over one register, as
/// two processes would have.
fn two_adapters() -> (Arc<MemoryRegister>, Shared, Shared) {
    let reg = Arc::new(MemoryRegister::new());
    (
        reg.clone(),
        RegisterStore::new(reg.clone()),
        RegisterStore::new(reg),
    )
}

async fn held_for(store: &Shared, w: &WorkId, h: &HolderId) -> Option<Duration> {
    match store.acquire(w, h, TTL).await {
        Err(Error::Held { expires_in, .. }) => expires_in,
        other => panic!("expected Held, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn undecodable_value_is_a_store_error_naming_the_work_id() {
    let (reg, store, _) = two_adapters();
    let w = wid("jobs/odd id");
    reg.write(&w, None, Bytes::from_static(b"{\"json\":1}"))
        .await
        .unwrap();
    let e = store.acquire(&w, &hid("h1"), TTL).await.unwrap_err();
    assert!(matches!(e, Error::Store(_)), "{e:?}");
    assert!(e.to_string().contains("jobs/odd id"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn abandoned_lease_is_taken_only_after_a_full_observed_ttl() {
    let (reg, holder, contender) = two_adapters();
    let (w, h1, h2) = (wid("shard-1"), hid("h1"), hid("h2"));
    assert_eq!(holder.acquire(&w, &h1, TTL).await.unwrap().fencing_token, 1);

    // The holder dies. Long after, its own adapter (which knows when it
    // sent the write) calls the lease expired, and writes nothing.
    advance(TTL * 3).await;
    let before = reg.read(&w).await.unwrap().unwrap().1;
    let e = holder.renew(lease(&w, &h1, 1), TTL).await.unwrap_err();
    assert!(matches!(e, Error::Expired { .. }), "{e:?}");
    assert_eq!(reg.read(&w).await.unwrap().unwrap().1, before);

    // A contender that looks only now must watch it for a full TTL.
    assert_eq!(held_for(&contender, &w, &h2).await, Some(TTL));
    advance(TTL - Duration::from_millis(1)).await;
    assert_eq!(
        held_for(&contender, &w, &h2).await,
        Some(Duration::from_millis(1))
    );
    advance(Duration::from_millis(1)).await;
    let grant = contender.acquire(&w, &h2, TTL).await.unwrap();
    assert_eq!(grant.fencing_token, 2);
    let prev = grant.handoff.previous.unwrap();
    assert_eq!(
        (prev.holder_id.as_str(), prev.fencing_token, prev.ended),
        ("h1", 1, LeaseEnd::Expired)
    );

    let e = holder.renew(lease(&w, &h1, 1), TTL).await.unwrap_err();
    assert!(matches!(e, Error::Fenced { .. }), "{e:?}");
    contender.renew(lease(&w, &h2, 2), TTL).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_renewal_restarts_the_contenders_observation() {
    let (_, holder, contender) = two_adapters();
    let (w, h1, h2) = (wid("shard-2"), hid("h1"), hid("h2"));
    holder.acquire(&w, &h1, TTL).await.unwrap();
    assert_eq!(held_for(&contender, &w, &h2).await, Some(TTL));

    // t=6: a checkpoint renews (new bytes, new handle).
    advance(Duration::from_secs(6)).await;
    holder
        .checkpoint(lease(&w, &h1, 1), TTL, Bytes::from_static(b"page 7"))
        .await
        .unwrap();
    // t=12: past the first write's TTL, but the contender sees a new
    // handle and starts over.
    advance(Duration::from_secs(6)).await;
    assert_eq!(held_for(&contender, &w, &h2).await, Some(TTL));
    // t=18: the holder's own adapter has seen its t=6 write for 12s.
    advance(Duration::from_secs(6)).await;
    let e = holder.renew(lease(&w, &h1, 1), TTL).await.unwrap_err();
    assert!(matches!(e, Error::Expired { .. }), "{e:?}");
    assert_eq!(
        held_for(&contender, &w, &h2).await,
        Some(Duration::from_secs(4))
    );
    // t=22: a full TTL since the contender first saw that handle.
    advance(Duration::from_secs(4)).await;
    let grant = contender.acquire(&w, &h2, TTL).await.unwrap();
    let cp = contender
        .read_checkpoint(lease(&w, &h2, grant.fencing_token))
        .await
        .unwrap();
    assert_eq!(cp.data.as_deref(), Some(&b"page 7"[..]));
    assert!(!cp.clean_handoff());
}

/// A register whose reads yield before returning, so that concurrent
/// operations interleave between read and write; counts lost CAS.
struct Interleaving {
    inner: Arc<MemoryRegister>,
    conflicts: AtomicUsize,
    always_conflict: bool,
}

#[async_trait]
impl Register for Interleaving {
    fn kind(&self) -> &'static str {
        "interleaving"
    }
    async fn read(&self, key: &WorkId) -> Result<Option<(Bytes, Handle)>, RegisterError> {
        let got = self.inner.read(key).await;
        tokio::task::yield_now().await;
        got
    }
    async fn write(
        &self,
        key: &WorkId,
        prev: Option<&Handle>,
        value: Bytes,
    ) -> Result<Handle, RegisterError> {
        let res = match self.always_conflict {
            true => Err(RegisterError::Conflict),
            false => self.inner.write(key, prev, value).await,
        };
        if matches!(res, Err(RegisterError::Conflict)) {
            self.conflicts.fetch_add(1, Ordering::SeqCst);
        }
        res
    }
    async fn delete(&self, key: &WorkId, handle: &Handle) -> Result<(), RegisterError> {
        self.inner.delete(key, handle).await
    }
    async fn list(&self) -> Result<Vec<WorkId>, RegisterError> {
        self.inner.list().await
    }
}

fn interleaving(always_conflict: bool) -> Arc<Interleaving> {
    Arc::new(Interleaving {
        inner: Arc::new(MemoryRegister::new()),
        conflicts: AtomicUsize::new(0),
        always_conflict,
    })
}

#[tokio::test(start_paused = true)]
async fn concurrent_acquisitions_have_exactly_one_winner() {
    let reg = interleaving(false);
    let (a, b) = (
        RegisterStore::new(reg.clone()),
        RegisterStore::new(reg.clone()),
    );
    let (w, h1, h2) = (wid("shard-3"), hid("h1"), hid("h2"));

    // On an absent key (both write with "must not exist") ...
    let (ra, rb) = tokio::join!(a.acquire(&w, &h1, TTL), b.acquire(&w, &h2, TTL));
    assert_eq!(reg.conflicts.load(Ordering::SeqCst), 1);
    let (winner, loser) = match (ra, rb) {
        (Ok(g), Err(e)) | (Err(e), Ok(g)) => (g, e),
        other => panic!("expected one winner, got {other:?}"),
    };
    assert_eq!(winner.fencing_token, 1);
    assert!(matches!(loser, Error::Held { .. }), "{loser:?}");

    // ... and on a released one (both write over the same handle).
    let holder = if a.release(lease(&w, &h1, 1)).await.is_ok() {
        "h1"
    } else {
        "h2"
    };
    if holder == "h2" {
        b.release(lease(&w, &h2, 1)).await.unwrap();
    }
    let (ra, rb) = tokio::join!(a.acquire(&w, &h1, TTL), b.acquire(&w, &h2, TTL));
    assert_eq!(reg.conflicts.load(Ordering::SeqCst), 2);
    let grant = match (ra, rb) {
        (Ok(g), Err(Error::Held { .. })) | (Err(Error::Held { .. }), Ok(g)) => g,
        other => panic!("expected one winner, got {other:?}"),
    };
    assert_eq!(grant.fencing_token, 2);
    assert!(grant.handoff.is_clean());
}

#[tokio::test(start_paused = true)]
async fn endless_contention_is_a_store_error() {
    let reg = interleaving(true);
    let store = RegisterStore::new(reg.clone());
    let e = store.acquire(&wid("w"), &hid("h"), TTL).await.unwrap_err();
    assert!(
        matches!(e, Error::Store(_)) && e.to_string().contains("contention"),
        "{e}"
    );
    assert_eq!(reg.conflicts.load(Ordering::SeqCst), MAX_ATTEMPTS);
}

#[tokio::test(start_paused = true)]
async fn release_keeps_a_tombstone_and_revoke_fences() {
    let (reg, a, b) = two_adapters();
    let (w, h1, h2) = (wid("shard-4"), hid("h1"), hid("h2"));
    a.acquire(&w, &h1, TTL).await.unwrap();
    a.release(lease(&w, &h1, 1)).await.unwrap();
    assert_eq!(reg.list().await.unwrap(), vec![w.clone()]);
    // A released lease is free at once, to anyone.
    let grant = b.acquire(&w, &h2, TTL).await.unwrap();
    assert_eq!(grant.fencing_token, 2);
    assert!(grant.handoff.is_clean());

    let info = a.inspect(&[]).await.unwrap();
    assert_eq!(info.len(), 1);
    assert!(!info[0].expired && info[0].expires_in.is_none());
    let before = a.revoke(&w).await.unwrap().unwrap();
    assert_eq!((before.holder_id.as_str(), before.expired), ("h2", false));
    let e = b.renew(lease(&w, &h2, 2), TTL).await.unwrap_err();
    assert!(matches!(e, Error::Fenced { .. }), "{e:?}");
    let grant = a.acquire(&w, &h1, TTL).await.unwrap();
    assert_eq!(grant.handoff.previous.unwrap().ended, LeaseEnd::Revoked);
    assert!(a.revoke(&wid("unknown")).await.unwrap().is_none());
}

/// What `status` shows of a register store: a held lease has no time
/// left to show and is not expired on a first look, however long ago
/// its holder stopped; an inspector that keeps watching (`status
/// --watch`) sees it expire one TTL after its first look.
#[tokio::test(start_paused = true)]
async fn inspect_judges_expiry_by_observation() {
    let (_, holder, inspector) = two_adapters();
    assert_eq!(inspector.expiry_clock(), ExpiryClock::Observation);
    let w = wid("shard-5");
    holder.acquire(&w, &hid("h1"), TTL).await.unwrap();
    advance(TTL * 5).await;
    let first = inspector.inspect(&[]).await.unwrap();
    assert!(
        !first[0].expired && first[0].expires_in.is_none() && first[0].ended.is_none(),
        "{first:?}"
    );
    advance(TTL - Duration::from_millis(1)).await;
    assert!(!inspector.inspect(&[]).await.unwrap()[0].expired);
    advance(Duration::from_millis(1)).await;
    let later = inspector.inspect(&[]).await.unwrap();
    assert!(later[0].expired, "{later:?}");
    assert_eq!(later[0].ended, Some(LeaseEnd::Expired));
}

/// A register that yields around every call (and long before a floor
/// raise), so that adapters interleave between a read, a floor read and a
/// compare-and-swap; its floor is the [`MemoryRegister`]'s.
struct Yielding(Arc<MemoryRegister>);

#[async_trait]
impl Register for Yielding {
    fn kind(&self) -> &'static str {
        "yielding"
    }
    async fn read(&self, key: &WorkId) -> Result<Option<(Bytes, Handle)>, RegisterError> {
        tokio::task::yield_now().await;
        let got = self.0.read(key).await;
        tokio::task::yield_now().await;
        got
    }
    async fn write(
        &self,
        key: &WorkId,
        prev: Option<&Handle>,
        value: Bytes,
    ) -> Result<Handle, RegisterError> {
        tokio::task::yield_now().await;
        self.0.write(key, prev, value).await
    }
    async fn delete(&self, key: &WorkId, handle: &Handle) -> Result<(), RegisterError> {
        tokio::task::yield_now().await;
        self.0.delete(key, handle).await
    }
    async fn list(&self) -> Result<Vec<WorkId>, RegisterError> {
        self.0.list().await
    }
    async fn fencing_floor(&self, key: &WorkId) -> Result<u64, RegisterError> {
        tokio::task::yield_now().await;
        self.0.fencing_floor(key).await
    }
    /// A slow write: many yields before it takes effect, so that an
    /// acquisition fits between a delete and a raise sent after it (the
    /// wrong order, which this test then catches).
    async fn raise_fencing_floor(&self, key: &WorkId, token: u64) -> Result<bool, RegisterError> {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        self.0.raise_fencing_floor(key, token).await
    }
}

/// Acquires and releases `w` 200 times through `store`, recording every
/// token granted.
async fn hold(
    store: &RegisterStore<Yielding>,
    w: &WorkId,
    h: HolderId,
    tokens: &std::sync::Mutex<Vec<u64>>,
) {
    for _ in 0..200 {
        match store.acquire(w, &h, TTL).await {
            Ok(g) => {
                tokens.lock().unwrap().push(g.fencing_token);
                store
                    .release(lease(w, &h, g.fencing_token))
                    .await
                    .expect("a held lease is never deleted under its holder");
                // Ended for a while: room for the collector to judge it.
                for _ in 0..20 {
                    tokio::task::yield_now().await;
                }
            }
            Err(Error::Held { .. } | Error::Store(_)) => tokio::task::yield_now().await,
            Err(e) => panic!("acquire: {e}"),
        }
    }
}

/// ADR 0023's proof, exercised: one adapter collects (raise the floor,
/// then delete on the handle read) while two others acquire and release
/// the same work ID, every register call interleaving; every acquisition's
/// token is above every earlier one, and a held lease is never deleted
/// under its holder (its release succeeds).
#[tokio::test(start_paused = true)]
async fn gc_racing_acquisitions_of_other_adapters_never_lowers_a_token() {
    let reg = Arc::new(MemoryRegister::new());
    let collector = RegisterStore::new(Yielding(reg.clone()));
    let holders = [
        RegisterStore::new(Yielding(reg.clone())),
        RegisterStore::new(Yielding(reg.clone())),
    ];
    let w = wid("raced");
    let tokens = std::sync::Mutex::new(Vec::new());
    let done = std::sync::atomic::AtomicBool::new(false);
    let deleted = AtomicUsize::new(0);
    let collect = async {
        while !done.load(Ordering::SeqCst) {
            if let Some(info) = collector
                .inspect(std::slice::from_ref(&w))
                .await
                .unwrap()
                .pop()
            {
                if collector
                    .delete_ended(&w, info.fencing_token)
                    .await
                    .expect("delete_ended")
                {
                    deleted.fetch_add(1, Ordering::SeqCst);
                }
            }
            tokio::task::yield_now().await;
        }
    };
    let holders_done = async {
        tokio::join!(
            hold(&holders[0], &w, hid("a"), &tokens),
            hold(&holders[1], &w, hid("b"), &tokens)
        );
        done.store(true, Ordering::SeqCst);
    };
    tokio::join!(collect, holders_done);
    let tokens = tokens.into_inner().unwrap();
    assert!(
        deleted.load(Ordering::SeqCst) > 0,
        "the collector deleted nothing: no race was exercised"
    );
    assert!(tokens.len() > 100, "few acquisitions: {}", tokens.len());
    assert!(
        tokens.windows(2).all(|p| p[0] < p[1]),
        "S2: tokens must strictly increase across deletions: {tokens:?}"
    );
}
