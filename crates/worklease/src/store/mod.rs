//! The store abstraction: what a backend must do for the lease layer.
//!
//! There are two extension points:
//!
//! * [`LeaseStore`]: a store with its own clock and atomic operations
//!   (SQLite, PostgreSQL, Redis, etcd) implements every lease operation as
//!   one atomic step and judges expiry itself, by its own clock, in that
//!   step. The lease layer ([`crate::Leases`]) never compares two hosts'
//!   clocks.
//! * [`register::Register`]: a bare compare-and-swap register (the `hoplock`
//!   backend: read → value + handle, write with the previous handle, delete
//!   with a handle), such as one object in S3. [`register::RegisterStore`]
//!   turns any register into a [`LeaseStore`] with the observation rule of
//!   the crate docs' "Clocks".
//!
//! Every store keeps the contract of the crate docs (S1–S5, L1, bad input), which
//! the conformance suite (`worklease::conformance`, feature `testkit`)
//! checks. A store author's guide, with the contract per method, the clock
//! rules, batches, testing against the real server and the checklist, is
//! `docs/writing-a-store.md` in the repository; a complete store written
//! from outside the workspace is `examples/third-party-store`. Identifiers reach a store already checked ([`WorkId`],
//! [`HolderId`]); the lease layer checks TTLs and checkpoint sizes before a
//! store sees them, so a store only writes valid input.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::BoxFuture;

use crate::error::Result;
use crate::limits::{HolderId, WorkId};

pub mod batch;
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis",
    feature = "etcd"
))]
pub(crate) mod decode;
#[cfg(feature = "dynamodb")]
pub mod dynamodb;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "testkit")]
pub mod fault;
pub mod memory;
#[cfg(feature = "mysql")]
pub mod mysql;
pub(crate) mod notify;
#[cfg(feature = "object-store")]
pub mod object;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "testkit")]
pub mod proxy;
pub(crate) mod record;
#[cfg(feature = "redis")]
pub mod redis;
pub mod register;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod sql_config;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod sql_retry;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod sql_rows;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(any(feature = "etcd-tls", feature = "redis-tls"))]
pub(crate) mod tls_files;
pub mod url;
pub(crate) mod url_parts;
pub(crate) mod url_query;

// Defined with the token, below the store layer (errors name the lease
// they refuse), and part of the store contract.
pub use crate::token::LeaseRef;

/// A lease named by a call, owned so that it can go where the call's
/// borrows cannot (a blocking thread, a spawned request). Used by the
/// SQLite store and the simulation.
#[cfg(any(feature = "sqlite", feature = "testkit"))]
pub(crate) struct OwnedLease {
    work_id: WorkId,
    holder_id: HolderId,
    fencing_token: u64,
}

#[cfg(any(feature = "sqlite", feature = "testkit"))]
impl OwnedLease {
    /// `lease`, owned.
    pub(crate) fn of(lease: LeaseRef<'_>) -> Self {
        Self {
            work_id: lease.work_id.clone(),
            holder_id: lease.holder_id.clone(),
            fencing_token: lease.fencing_token,
        }
    }

    /// The lease, borrowed as a store call takes it.
    pub(crate) fn lease(&self) -> LeaseRef<'_> {
        LeaseRef {
            work_id: &self.work_id,
            holder_id: &self.holder_id,
            fencing_token: self.fencing_token,
        }
    }
}

/// How a previous holder's lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseEnd {
    /// The holder released it: a clean hand-off.
    Released,
    /// Its TTL ran out without a renewal.
    Expired,
    /// An operator took it away (`worklease release --force`,
    /// [`LeaseStore::revoke`]).
    Revoked,
}

impl LeaseEnd {
    /// `"released"`, `"expired"` or `"revoked"`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseEnd::Released => "released",
            LeaseEnd::Expired => "expired",
            LeaseEnd::Revoked => "revoked",
        }
    }

    pub(crate) fn from_str(s: &str) -> Option<Self> {
        match s {
            "released" => Some(LeaseEnd::Released),
            "expired" => Some(LeaseEnd::Expired),
            "revoked" => Some(LeaseEnd::Revoked),
            _ => None,
        }
    }
}

/// Who held a lease before the current acquisition, and how it ended: more
/// than the Go original's `cleanHandoff` flag, so a successor can tell a
/// crash (expired) from an operator's intervention (revoked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviousHolder {
    /// The previous holder's ID.
    pub holder_id: String,
    /// The previous acquisition's fencing token.
    pub fencing_token: u64,
    /// How its lease ended.
    pub ended: LeaseEnd,
}

/// What a successful acquisition learns about the hand-off it received.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Handoff {
    /// The previous acquisition of this work ID; `None` on the first one.
    pub previous: Option<PreviousHolder>,
}

impl Handoff {
    /// True exactly when the previous holder released (S5 in the crate docs).
    pub fn is_clean(&self) -> bool {
        matches!(&self.previous, Some(p) if p.ended == LeaseEnd::Released)
    }
}

/// A store's answer to a successful acquisition.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The new fencing token, larger than every earlier one of the work ID.
    pub fencing_token: u64,
    /// The expiry by this host's wall clock (informational).
    pub expires_at: SystemTime,
    /// Who held the lease before.
    pub handoff: Handoff,
}

/// The checkpoint of a work ID as its current holder reads it (Go:
/// `ReadCheckpoint`'s `(state, cleanHandoff)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The last acknowledged checkpoint; `None` when none was ever written.
    pub data: Option<Bytes>,
    /// How this holder's acquisition followed the previous one.
    pub handoff: Handoff,
}

impl Checkpoint {
    /// True exactly when the previous holder released (S5 in the crate docs).
    pub fn clean_handoff(&self) -> bool {
        self.handoff.is_clean()
    }
}

/// One lease as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// The work ID.
    pub work_id: WorkId,
    /// The last holder.
    pub holder_id: String,
    /// The last acquisition's fencing token.
    pub fencing_token: u64,
    /// The expiry by this host's wall clock (informational; for a released
    /// lease, the moment of release).
    pub expires_at: SystemTime,
    /// Time left by the store's clock; `None` once expired or released, and
    /// for a register store, which cannot tell.
    pub expires_in: Option<Duration>,
    /// The lease is no longer live (expired, released or revoked).
    pub expired: bool,
    /// The holder released it.
    pub released: bool,
    /// How the lease ended; `None` while it is live.
    pub ended: Option<LeaseEnd>,
    /// Size of the stored checkpoint, in bytes (0 when there is none).
    pub checkpoint_bytes: usize,
    /// How the last acquisition followed the one before it.
    pub handoff: Handoff,
}

/// A work ID's lease as [`LeaseStore::inspect`] shows it, with its
/// checkpoint bytes: what an operator reads with
/// [`LeaseStore::inspect_checkpoint`] (`worklease checkpoint get
/// --work-id`), whatever state the lease is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCheckpoint {
    /// The lease, as `inspect` shows it.
    pub lease: LeaseInfo,
    /// The last acknowledged checkpoint; `None` when none was ever written.
    pub data: Option<Bytes>,
}

/// Whose clock judges that a lease has expired (the crate docs' "Clocks"),
/// as [`LeaseStore::expiry_clock`] tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExpiryClock {
    /// The store's own clock (SQLite, PostgreSQL, Redis, etcd, memory): the
    /// store knows how long a live lease has left
    /// ([`LeaseInfo::expires_in`]), and a lease whose holder stopped
    /// renewing is free the moment its TTL runs out.
    Store,
    /// Observation, for a store without a clock
    /// ([`register::RegisterStore`], such as S3): a contender counts a
    /// lease expired only once it has itself seen the same version
    /// unchanged for a full TTL on its own monotonic clock. One look cannot
    /// tell whether the holder still renews: [`LeaseInfo::expires_in`] is
    /// `None` for a held lease, `expired` is true only once this process
    /// has watched the lease for a TTL, and [`crate::Error::Held`]'s
    /// `expires_in` is this process's own upper bound (a full TTL on a
    /// first look), not a countdown kept by the store.
    Observation,
}

/// A store with its own clock and atomic operations.
///
/// Each method is one atomic step of the store (one round trip where the
/// store allows it), decided by the store's own clock. The errors each
/// method returns are part of the contract:
///
/// * `Error::Held` from `acquire` when another acquisition is live;
/// * `Error::Fenced` when the named acquisition is not the current one
///   (taken over, revoked, or never made);
/// * `Error::Expired` when it is current but expired or released;
/// * `Error::Store` for failures of the store itself.
///
/// A failed call changes nothing.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// A short name of the store kind (`"memory"`, `"sqlite"`, ...), used in
    /// errors, logs and metrics.
    fn kind(&self) -> &'static str;

    /// Acquires `work_id` for `holder_id` for `ttl` if no live lease exists
    /// (a live lease of the same holder ID counts as held too: see
    /// `docs/adr/0002-same-holder-is-held.md`). The fencing token is larger
    /// than every earlier one of the work ID; the checkpoint is kept.
    async fn acquire(&self, work_id: &WorkId, holder_id: &HolderId, ttl: Duration)
        -> Result<Grant>;

    /// Extends the lease to `ttl` from now (store clock). Returns the new
    /// wall-clock expiry estimate.
    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime>;

    /// Stores `data` as the checkpoint and extends the lease to `ttl` from
    /// now, in one atomic step ("I am alive, and here is where I am").
    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime>;

    /// Reads the checkpoint and the hand-off facts for the current lease.
    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint>;

    /// Ends the lease at once and marks the hand-off clean; the checkpoint is
    /// kept.
    async fn release(&self, lease: LeaseRef<'_>) -> Result<()>;

    /// The leases of `work_ids`, or of every work ID the store knows when
    /// `work_ids` is empty; unknown work IDs are left out.
    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>>;

    /// An operator's forced release: ends the current lease at once, whoever
    /// holds it (its holder's next renew fails with `Fenced`); the next
    /// acquisition sees [`LeaseEnd::Revoked`]. Returns the lease as it was,
    /// or `None` for an unknown work ID.
    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>>;

    /// An operator's read: the lease of `work_id` as
    /// [`LeaseStore::inspect`] shows it and its checkpoint bytes, whatever
    /// state the lease is in (live, released, expired, revoked), read in
    /// one step so that the two agree; `None` for a work ID the store does
    /// not know. Writes nothing, extends nothing, and needs no token.
    ///
    /// # Errors
    /// `Store` when the store fails or holds a record it cannot decode.
    async fn inspect_checkpoint(&self, work_id: &WorkId) -> Result<Option<StoredCheckpoint>>;

    /// Garbage collection of one record (`worklease gc`, [`crate::gc`]):
    /// deletes `work_id`'s lease and checkpoint if, in one atomic step (or
    /// an order proven safe), its last acquisition is still
    /// `fencing_token` and the lease is not live (released, revoked, or
    /// expired by the store's own clock; a store judging expiry by
    /// observation deletes only released and revoked leases). The store
    /// first makes sure that a later acquisition of `work_id` gets a token
    /// above `fencing_token` (a store-wide sequence does already; otherwise
    /// a fencing floor kept apart from the record is raised before the
    /// delete can take effect: `docs/adr/0023-gc-and-the-token-floor.md`),
    /// so S2 survives the deletion. Returns whether it deleted; `false`
    /// for an unknown work ID, a live lease, or a newer acquisition. A
    /// live lease is never deleted, even racing an acquisition.
    ///
    /// # Errors
    /// `Store` when the store fails (whether the record was deleted is
    /// then unknown; calling again is safe).
    async fn delete_ended(&self, work_id: &WorkId, fencing_token: u64) -> Result<bool>;

    /// A future that completes when the lease of `work_id` may have become
    /// free (released or revoked), from the store's own notifications; it
    /// must observe changes made after this call returns, even before the
    /// future is first polled. `None` where the store has no notifications:
    /// waiters then poll. Spurious wake-ups are allowed.
    fn watch(&self, _work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        None
    }

    /// Whose clock judges expiry in this store: [`ExpiryClock::Store`]
    /// (the default) or [`ExpiryClock::Observation`] (register stores).
    /// A decorator over another store answers as the inner one does.
    fn expiry_clock(&self) -> ExpiryClock {
        ExpiryClock::Store
    }

    /// The most leases one batch call ([`LeaseStore::renew_many`],
    /// [`LeaseStore::acquire_many`], [`LeaseStore::release_many`]) names;
    /// the lease layer never sends more in one call. Default
    /// [`batch::DEFAULT_MAX_BATCH`]; a store sets it from its own limits
    /// (statement size, script keys, transaction operations) and documents
    /// it. A decorator answers as the inner store does.
    fn max_batch(&self) -> usize {
        batch::DEFAULT_MAX_BATCH
    }

    /// The largest checkpoint this store holds, in bytes: at most
    /// [`crate::limits::MAX_CHECKPOINT_BYTES`] (the default), lower for a
    /// store with a smaller value limit (a DynamoDB item). The lease layer
    /// refuses a larger checkpoint with
    /// [`crate::error::InvalidInput::CheckpointTooLarge`] naming this
    /// limit, before the store sees it. A decorator answers as the inner
    /// store does.
    fn max_checkpoint_bytes(&self) -> usize {
        crate::limits::MAX_CHECKPOINT_BYTES
    }

    /// Renews each of `leases` for `ttl`, as [`LeaseStore::renew`] would,
    /// in one atomic step or one round trip where the store allows it.
    /// `Ok` holds one outcome per lease, in order: the new wall-clock
    /// expiry, or the error its single renewal would have returned
    /// (`Fenced`, `Expired`, or a store error of that lease alone), so a
    /// fenced or expired lease fails alone and the others renew. `Err` is
    /// a failure of the whole call (the store is unreachable, the
    /// transaction was aborted): the caller knows nothing of any lease,
    /// and renewing again is safe. At most [`LeaseStore::max_batch`]
    /// leases, no work ID twice (the lease layer checks); an empty batch
    /// makes no store call.
    ///
    /// The default renews one lease at a time ([`batch::renew_each`]).
    async fn renew_many(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<SystemTime>>> {
        batch::renew_each(self, leases, ttl).await
    }

    /// Acquires up to `max` of `work_ids` for `holder_id`, trying them in
    /// order ("give me free ones from this list"), each as
    /// [`LeaseStore::acquire`] would, in one atomic step or one round trip
    /// where the store allows it. `Ok` holds the outcomes of the work IDs
    /// tried, in order, a prefix of `work_ids`: a [`Grant`], or the error
    /// of that work ID's single acquisition (`Held` with its holder and
    /// expiry); the store stops trying once `max` are granted. `Err` is a
    /// failure of the whole call, after which grants may have landed that
    /// nobody holds: they end with their TTL, as a lost reply to
    /// [`LeaseStore::acquire`] does. Limits as for
    /// [`LeaseStore::renew_many`]; `max` of 0 or an empty list makes no
    /// store call.
    ///
    /// The default acquires one work ID at a time
    /// ([`batch::acquire_each`]).
    async fn acquire_many(
        &self,
        work_ids: &[WorkId],
        holder_id: &HolderId,
        ttl: Duration,
        max: usize,
    ) -> Result<Vec<Result<Grant>>> {
        batch::acquire_each(self, work_ids, holder_id, ttl, max).await
    }

    /// Releases each of `leases`, as [`LeaseStore::release`] would, in one
    /// atomic step or one round trip where the store allows it; the
    /// outcomes as for [`LeaseStore::renew_many`].
    ///
    /// The default releases one lease at a time ([`batch::release_each`]).
    async fn release_many(&self, leases: &[LeaseRef<'_>]) -> Result<Vec<Result<()>>> {
        batch::release_each(self, leases).await
    }
}

/// How many leases [`inspect_each`] reads at once.
#[cfg(any(feature = "redis", feature = "etcd"))]
const INSPECT_CONCURRENCY: usize = 64;

/// `inspect` for a store that reads one lease per request: `work_ids`, or
/// every work ID that `list` returns when it is empty, each read with
/// `one` (up to 64 at once), in work-ID order, unknown ones left out.
#[cfg(any(feature = "redis", feature = "etcd"))]
pub(crate) async fn inspect_each<L, O, F>(
    work_ids: &[WorkId],
    list: L,
    one: O,
) -> Result<Vec<LeaseInfo>>
where
    L: std::future::Future<Output = Result<std::collections::BTreeSet<WorkId>>>,
    O: FnMut(WorkId) -> F,
    F: std::future::Future<Output = Result<Option<LeaseInfo>>>,
{
    use futures_util::{StreamExt, TryStreamExt};
    let ids = if work_ids.is_empty() {
        list.await?
    } else {
        work_ids.iter().cloned().collect()
    };
    let found: Vec<Option<LeaseInfo>> = futures_util::stream::iter(ids)
        .map(one)
        .buffered(INSPECT_CONCURRENCY)
        .try_collect()
        .await?;
    Ok(found.into_iter().flatten().collect())
}
