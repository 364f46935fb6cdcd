//! Leases over a bare compare-and-swap register (the `hoplock` backend,
//! generalised to one key per work ID).
//!
//! A [`Register`] keeps one opaque value per work ID and a [`Handle`] (an
//! ETag, a version, a revision) that changes with every write; a write or a
//! delete succeeds only while the caller's handle is still current. One S3
//! object per work ID written with `If-None-Match: *` / `If-Match: <ETag>` is
//! such a register, and so is a database row with a version column.
//! [`RegisterStore`] turns any register into a [`LeaseStore`].
//!
//! # The observation rule (the crate docs' "Clocks")
//!
//! A register has no clock, and the wall clocks of two hosts are never
//! compared. Instead, each [`RegisterStore`] remembers, per work ID, the last
//! handle it saw and the instant it first saw it, on its own monotonic clock
//! ([`tokio::time::Instant`], so a paused test clock drives it). A held lease
//! counts as expired only once this adapter has seen the same handle
//! unchanged for at least the record's TTL. Every renewal writes new bytes,
//! hence a new handle, and so restarts every contender's observation.
//!
//! Why this is safe (S1): a contender first sees handle `H` at `t0` (the
//! instant its read *returned*), and a read returns only after the write
//! that made `H` took effect, which is after that write was *sent*, at `s`.
//! So `s <= t0`. The holder counts its lease lost at `s + TTL - margin`
//! (the crate docs' "Clocks"), which is before `t0 + TTL`, the earliest moment the contender
//! tries to take over. The takeover is itself a compare-and-swap on `H`: if
//! the holder renewed in the meantime, the handle changed and the takeover
//! loses. Only elapsed time on one host's monotonic clock is used, so
//! wall-clock jumps cannot break S1.
//!
//! The adapter's own writes are recorded at their *send* instant, not at the
//! reply: its holder then judges its own lease expired at `s + TTL` (so a
//! renewal after the TTL returns `Expired`, as S3 asks), and a contender in
//! the same process sees the lease expire at `s + TTL` too, which is safe
//! by the argument above.
//!
//! # Value encoding
//!
//! The value is the lease record in a small binary format, version 1. All
//! integers are big-endian; `str` and `bytes` are a u32 length then the
//! bytes; `opt(x)` is a u8 0 (absent) or 1 followed by `x`:
//!
//! ```text
//! "WLR1"                 magic and version
//! writes: u64            write counter, +1 on every write
//! written_at_ms: u64     writer's wall clock, ms since the Unix epoch
//!                        (informational, never used to judge expiry)
//! fencing_token: u64
//! ttl_ms: u64
//! phase: str             "held" | "released" | "revoked"
//! holder_id: str
//! checkpoint: opt(bytes)
//! previous: opt(holder_id: str, fencing_token: u64,
//!               ended: str  "released" | "expired" | "revoked")
//! ```
//!
//! The write counter makes every write change the bytes, so a register
//! whose handle is a hash of the content (an S3 ETag) still gives every
//! renewal a new handle.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::{BufMut, Bytes, BytesMut};
use tokio::time::Instant;

use crate::error::{Error, Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::record::{self, Phase, Record};
use crate::store::{
    Checkpoint, ExpiryClock, Grant, LeaseEnd, LeaseInfo, LeaseRef, LeaseStore, PreviousHolder,
};

/// The version of a register's value: an ETag, a version number, a
/// revision. Only compared for equality; it must change with every write.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Handle(pub String);

/// The errors of a [`Register`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// A conditional write or delete lost: the value's handle is not the one
    /// given (or a value exists where none was expected). Nothing changed.
    #[error("compare-and-swap lost: the value changed since it was read")]
    Conflict,
    /// The register itself failed (unreachable, I/O, refused). Whether a
    /// write that failed this way took effect is unknown.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The request can never succeed on this register, whatever its
    /// state: bad input for it (for example a work ID whose key would be
    /// longer than the register allows). Nothing was written; the adapter
    /// returns it as [`Error::Invalid`], so callers do not retry it.
    #[error(transparent)]
    Invalid(#[from] crate::error::InvalidInput),
}

/// A compare-and-swap register keyed by work ID (the `hoplock` `Backend`,
/// one value per key).
///
/// It must be linearizable (strongly consistent, as S3 is): a read sees
/// every write that succeeded before the read was sent, and a conditional
/// write checks the handle current at the moment it takes effect. The
/// observation rule's safety rests on this.
#[async_trait]
pub trait Register: Send + Sync + 'static {
    /// A short name of the register kind (`"memory-register"`, `"s3"`, ...),
    /// used in errors, logs and metrics.
    fn kind(&self) -> &'static str;

    /// The current value of `key` and its handle; `None` when there is none.
    ///
    /// # Errors
    /// [`RegisterError::Store`] when the register fails.
    async fn read(&self, key: &WorkId) -> Result<Option<(Bytes, Handle)>, RegisterError>;

    /// Writes `value` if the current handle of `key` is `previous`
    /// (`None`: only if `key` has no value, like `If-None-Match: *`) and
    /// returns the new handle.
    ///
    /// # Errors
    /// [`RegisterError::Conflict`] when the handle is not `previous`
    /// (nothing written); [`RegisterError::Store`] when the register fails
    /// (the write may or may not have taken effect).
    async fn write(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
    ) -> Result<Handle, RegisterError>;

    /// Deletes `key` if its current handle is `handle`. [`RegisterStore`]
    /// never deletes (a released lease stays as a tombstone that keeps the
    /// fencing generation); this is for an operator's purge, after which the
    /// work ID's fencing tokens start again at 1.
    ///
    /// # Errors
    /// [`RegisterError::Conflict`] when the handle is not current or the key
    /// is absent; [`RegisterError::Store`] when the register fails.
    async fn delete(&self, key: &WorkId, handle: &Handle) -> Result<(), RegisterError>;

    /// Every key that has a value, in any order.
    ///
    /// # Errors
    /// [`RegisterError::Store`] when the register fails.
    async fn list(&self) -> Result<Vec<WorkId>, RegisterError>;
}

#[async_trait]
impl<R: Register + ?Sized> Register for Arc<R> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }
    async fn read(&self, key: &WorkId) -> Result<Option<(Bytes, Handle)>, RegisterError> {
        (**self).read(key).await
    }
    async fn write(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
    ) -> Result<Handle, RegisterError> {
        (**self).write(key, previous, value).await
    }
    async fn delete(&self, key: &WorkId, handle: &Handle) -> Result<(), RegisterError> {
        (**self).delete(key, handle).await
    }
    async fn list(&self) -> Result<Vec<WorkId>, RegisterError> {
        (**self).list().await
    }
}

const MEMORY_KIND: &str = "memory-register";

#[derive(Default)]
struct MemoryValues {
    values: HashMap<WorkId, (Bytes, u64)>,
    version: u64,
}

/// A [`Register`] in this process's memory: the reference register, for
/// tests. Handles are a version counter shared by all keys (as text), so a
/// handle is never reused, not even after a delete. Tests can look at what
/// an adapter stored through the [`Register`] methods themselves.
#[derive(Default)]
pub struct MemoryRegister {
    state: Mutex<MemoryValues>,
}

impl MemoryRegister {
    /// An empty register.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<MutexGuard<'_, MemoryValues>, RegisterError> {
        self.state.lock().map_err(|_| {
            StoreError::new(MEMORY_KIND, "state lock poisoned by an earlier panic").into()
        })
    }
}

#[async_trait]
impl Register for MemoryRegister {
    fn kind(&self) -> &'static str {
        MEMORY_KIND
    }

    async fn read(&self, key: &WorkId) -> Result<Option<(Bytes, Handle)>, RegisterError> {
        let st = self.lock()?;
        Ok(st
            .values
            .get(key)
            .map(|(v, n)| (v.clone(), Handle(n.to_string()))))
    }

    async fn write(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
    ) -> Result<Handle, RegisterError> {
        let mut st = self.lock()?;
        let current = st.values.get(key).map(|(_, n)| Handle(n.to_string()));
        if current.as_ref() != previous {
            return Err(RegisterError::Conflict);
        }
        st.version += 1;
        let version = st.version;
        st.values.insert(key.clone(), (value, version));
        Ok(Handle(version.to_string()))
    }

    async fn delete(&self, key: &WorkId, handle: &Handle) -> Result<(), RegisterError> {
        let mut st = self.lock()?;
        match st.values.get(key) {
            Some((_, n)) if n.to_string() == handle.0 => {
                st.values.remove(key);
                Ok(())
            }
            _ => Err(RegisterError::Conflict),
        }
    }

    async fn list(&self) -> Result<Vec<WorkId>, RegisterError> {
        Ok(self.lock()?.values.keys().cloned().collect())
    }
}

/// How many times an operation reads and decides again after losing a
/// compare-and-swap before it gives up with a store error.
const MAX_ATTEMPTS: usize = 3;

/// Leases over any [`Register`], with expiry by the observation rule (see
/// the module docs). Each operation is one read, a decision by the shared
/// lease rules, and at most one conditional write on the handle read; a
/// lost compare-and-swap reads and decides again, up to 3 times, then fails
/// with a store error ("contention").
///
/// The value is the lease record in the versioned `WLR1` encoding (see the
/// module docs); a value that does not decode fails every operation on its
/// work ID with a store error naming the work ID.
///
/// Not supported, by the nature of a bare register:
///
/// * **No notifications**: [`LeaseStore::watch`] is `None`; waiters poll.
/// * **Per-work-ID fencing only**: the next token is the record's plus one;
///   tokens do not increase across work IDs (the Go original allows this). A global
///   sequence would cost a second compare-and-swap on one shared key for
///   every acquisition, a hot spot with no atomicity across the two keys. A
///   purge through [`Register::delete`] restarts the work ID's tokens at 1.
/// * **Slow takeover of an abandoned lease**: a contender must see the same
///   handle unchanged for a full TTL on its own clock, so an adapter that
///   first looks at a lease only after its holder died still waits a full
///   TTL. Likewise a freshly created adapter counts every held lease as live
///   for a full TTL, and lets its holder renew one it has not seen expire
///   (safe: the compare-and-swap decides against any contender).
/// * **No remaining time**: [`LeaseStore::expiry_clock`] is
///   [`ExpiryClock::Observation`]. [`crate::Error::Held`] carries
///   `expires_in = TTL - observed so far`, an upper bound by this adapter's
///   own observation (a full TTL on its first look, however long ago the
///   holder died), not a countdown; [`LeaseInfo::expires_in`] is always
///   `None`, and [`LeaseInfo::expired`] becomes true only once this adapter
///   has seen the lease unchanged for its TTL.
/// * **Ambiguous writes**: a write whose reply is lost may or may not have
///   taken effect; the next read reconciles it: if the record shows this
///   holder and token, it was applied. An acquisition whose reply was lost
///   thus reads as `Held` (by the same holder ID) until it expires.
pub struct RegisterStore<R: Register> {
    register: R,
    /// Per work ID: the last handle this adapter saw, and since when.
    seen: Mutex<HashMap<WorkId, Observation>>,
    /// Numbers every register call as it is sent, so that a slow reply can
    /// be told apart from a newer one.
    calls: AtomicU64,
    /// Per work ID: the lease this adapter itself last wrote as held, and
    /// when that write was sent. A holder's renew, checkpoint, read and
    /// release through this adapter are judged by it: the lease ends at
    /// that send + its TTL, exactly as its holder counts (S3 asks for
    /// `Expired` then), whatever reads of other callers observed meanwhile.
    own: Mutex<HashMap<WorkId, OwnWrite>>,
}

/// A lease this adapter wrote as held.
struct OwnWrite {
    fencing_token: u64,
    holder_id: String,
    sent: Instant,
    ttl: Duration,
}

/// What this adapter knows of a work ID's current version.
struct Observation {
    handle: Handle,
    since: Instant,
    /// The number of the call whose answer this is. An answer to an older
    /// call (a read that was slow to return) never replaces it: otherwise a
    /// stale read would restart the observation of a newer version, and a
    /// holder could renew a lease this adapter should count as expired.
    call: u64,
}

/// A decoded record as read, with its handle and how long it has been seen.
struct Current {
    stored: Stored,
    handle: Handle,
    observed: Duration,
}

impl<R: Register> RegisterStore<R> {
    /// An adapter over `register`, with an empty observation map.
    pub fn new(register: R) -> Self {
        Self {
            register,
            seen: Mutex::new(HashMap::new()),
            calls: AtomicU64::new(0),
            own: Mutex::new(HashMap::new()),
        }
    }

    /// The register underneath.
    pub fn register(&self) -> &R {
        &self.register
    }

    fn error(&self, work_id: &WorkId, what: &str) -> Error {
        StoreError::new(
            self.register.kind(),
            format!("work ID {:?}: {what}", work_id.as_str()),
        )
        .into()
    }

    /// Locks `mutex`; a lock an earlier panic poisoned fails the call with
    /// a store error naming it (`what`).
    fn locked<'a, T>(&self, mutex: &'a Mutex<T>, what: &str) -> Result<MutexGuard<'a, T>> {
        mutex.lock().map_err(|_| {
            StoreError::new(
                self.register.kind(),
                format!("{what} lock poisoned by an earlier panic"),
            )
            .into()
        })
    }

    fn seen(&self) -> Result<MutexGuard<'_, HashMap<WorkId, Observation>>> {
        self.locked(&self.seen, "observation")
    }

    /// The number of a call about to be sent.
    fn next_call(&self) -> u64 {
        self.calls.fetch_add(1, Ordering::SeqCst)
    }

    /// Notes the answer of call number `call`: `handle` is current (or the
    /// value is absent, `None`), as seen since `since`. Returns for how long
    /// this adapter has seen the answer's version unchanged: zero for a
    /// version new to it, or for the stale answer of a call older than what
    /// the adapter already knows (which then changes nothing).
    fn observe(
        &self,
        work_id: &WorkId,
        handle: Option<&Handle>,
        call: u64,
        since: Instant,
    ) -> Result<Duration> {
        let now = Instant::now();
        let mut seen = self.seen()?;
        match seen.get_mut(work_id) {
            // The same version: it has existed at least since the earliest
            // sighting. Every sighting is at or after the send of the write
            // that made it (a read's reply, or our own write's send), so the
            // earliest keeps contenders safe and lets a holder judge its own
            // expiry exactly.
            Some(o) if Some(&o.handle) == handle => {
                o.since = o.since.min(since);
                o.call = o.call.max(call);
                Ok(now.saturating_duration_since(o.since))
            }
            // A stale answer about another version: newer knowledge stays.
            Some(o) if o.call > call => Ok(Duration::ZERO),
            _ => {
                match handle {
                    Some(h) => {
                        let handle = h.clone();
                        seen.insert(
                            work_id.clone(),
                            Observation {
                                handle,
                                since,
                                call,
                            },
                        );
                    }
                    None => {
                        seen.remove(work_id);
                    }
                }
                Ok(now.saturating_duration_since(since))
            }
        }
    }

    /// Reads and decodes the record of `work_id`, observing its handle. The
    /// observation starts after the read returned: never before the write
    /// that made the handle was sent.
    async fn load(&self, work_id: &WorkId) -> Result<Option<Current>> {
        let call = self.next_call();
        let read = match self.register.read(work_id).await {
            Ok(read) => read,
            Err(RegisterError::Store(e)) => return Err(e.into()),
            Err(RegisterError::Invalid(e)) => return Err(e.into()),
            Err(RegisterError::Conflict) => {
                return Err(self.error(work_id, "register reported a conflict on a read"))
            }
        };
        let Some((bytes, handle)) = read else {
            self.observe(work_id, None, call, Instant::now())?;
            return Ok(None);
        };
        let stored = decode_record(&bytes).map_err(|why| {
            self.error(
                work_id,
                &format!("cannot decode the stored lease record: {why}"),
            )
        })?;
        let observed = self.observe(work_id, Some(&handle), call, Instant::now())?;
        Ok(Some(Current {
            stored,
            handle,
            observed,
        }))
    }

    /// Writes `record` over `current`'s handle. `Some(wall clock at the
    /// write)` on success, `None` on a lost compare-and-swap.
    async fn put(
        &self,
        work_id: &WorkId,
        current: Option<&Current>,
        record: Record,
    ) -> Result<Option<SystemTime>> {
        let wall = SystemTime::now();
        let own = (record.phase == Phase::Held).then(|| OwnWrite {
            fencing_token: record.fencing_token,
            holder_id: record.holder_id.clone(),
            sent: Instant::now(),
            ttl: Duration::from_millis(record.ttl_ms),
        });
        let stored = Stored {
            writes: current.map_or(0, |c| c.stored.writes).wrapping_add(1),
            written_at_ms: unix_ms(wall),
            record,
        };
        let bytes = encode_record(&stored).map_err(|why| self.error(work_id, &why))?;
        let call = self.next_call();
        let sent = Instant::now();
        match self
            .register
            .write(work_id, current.map(|c| &c.handle), bytes)
            .await
        {
            Ok(handle) => {
                // Our own write: observed since it was sent (module docs).
                self.observe(work_id, Some(&handle), call, sent)?;
                let mut mine = self.own()?;
                match own {
                    Some(o) => mine.insert(work_id.clone(), OwnWrite { sent, ..o }),
                    None => mine.remove(work_id),
                };
                Ok(Some(wall))
            }
            Err(RegisterError::Conflict) => Ok(None),
            Err(RegisterError::Store(e)) => Err(e.into()),
            Err(RegisterError::Invalid(e)) => Err(e.into()),
        }
    }

    /// Renew, checkpoint, release: check that `lease` is current and live,
    /// apply `change`, write it back; re-decide after a lost race.
    async fn update(
        &self,
        lease: LeaseRef<'_>,
        change: impl Fn(&mut Record),
    ) -> Result<SystemTime> {
        for _ in 0..MAX_ATTEMPTS {
            let Some(current) = self.load(lease.work_id).await? else {
                return Err(record::fenced(lease));
            };
            let unexpired = self.unexpired_for(lease, &current)?;
            record::check_current(Some(&current.stored.record), lease, unexpired)?;
            let mut next = current.stored.record.clone();
            change(&mut next);
            if let Some(wall) = self.put(lease.work_id, Some(&current), next).await? {
                return Ok(wall);
            }
        }
        Err(self.contention(lease.work_id))
    }

    fn own(&self) -> Result<MutexGuard<'_, HashMap<WorkId, OwnWrite>>> {
        self.locked(&self.own, "own-writes")
    }

    /// Whether `lease` counts as unexpired for an operation of its holder:
    /// by this adapter's own last write of it when there is one (send time +
    /// TTL, the holder's own count), else by the observation rule (a token
    /// from another process).
    fn unexpired_for(&self, lease: LeaseRef<'_>, current: &Current) -> Result<bool> {
        let own = self.own()?;
        match own.get(lease.work_id) {
            Some(o)
                if o.fencing_token == lease.fencing_token
                    && o.holder_id == lease.holder_id.as_str() =>
            {
                Ok(Instant::now() < o.sent + o.ttl)
            }
            _ => Ok(judge(&current.stored.record, current.observed).0),
        }
    }

    fn contention(&self, work_id: &WorkId) -> Error {
        self.error(
            work_id,
            &format!("contention: lost the compare-and-swap {MAX_ATTEMPTS} times in a row"),
        )
    }
}

/// Whether a record is unexpired by this adapter's observation, and the
/// upper bound of its time left.
fn judge(r: &Record, observed: Duration) -> (bool, Duration) {
    let ttl = Duration::from_millis(r.ttl_ms);
    (observed < ttl, ttl.saturating_sub(observed))
}

/// A TTL in whole milliseconds, rounded up so the store never expires a
/// lease before the holder's own deadline.
fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn info(work_id: &WorkId, c: &Current) -> LeaseInfo {
    let r = &c.stored.record;
    let (unexpired, left) = judge(r, c.observed);
    let live = r.is_live(unexpired);
    let now = SystemTime::now();
    let expires_at = match r.phase {
        // This host's estimate from its own observation.
        Phase::Held if live => now.checked_add(left),
        Phase::Held => now.checked_sub(c.observed.saturating_sub(Duration::from_millis(r.ttl_ms))),
        // The moment of the release or revocation, by its writer's clock.
        Phase::Released | Phase::Revoked => {
            UNIX_EPOCH.checked_add(Duration::from_millis(c.stored.written_at_ms))
        }
    };
    LeaseInfo {
        work_id: work_id.clone(),
        holder_id: r.holder_id.clone(),
        fencing_token: r.fencing_token,
        expires_at: expires_at.unwrap_or(now),
        expires_in: None,
        expired: !live,
        released: r.phase == Phase::Released,
        ended: (!live).then(|| r.end()),
        checkpoint_bytes: r.checkpoint.as_ref().map_or(0, Bytes::len),
        handoff: r.handoff(),
    }
}

#[async_trait]
impl<R: Register> LeaseStore for RegisterStore<R> {
    fn kind(&self) -> &'static str {
        self.register.kind()
    }

    /// Always [`ExpiryClock::Observation`]: a register has no clock.
    fn expiry_clock(&self) -> ExpiryClock {
        ExpiryClock::Observation
    }

    async fn acquire(
        &self,
        work_id: &WorkId,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> Result<Grant> {
        for _ in 0..MAX_ATTEMPTS {
            let current = self.load(work_id).await?;
            let (unexpired, left, next) = match &current {
                None => (false, None, 1),
                Some(c) => {
                    let (unexpired, left) = judge(&c.stored.record, c.observed);
                    let next = c.stored.record.fencing_token.checked_add(1);
                    let next =
                        next.ok_or_else(|| self.error(work_id, "fencing tokens exhausted"))?;
                    (unexpired, Some(left), next)
                }
            };
            let prior = current.as_ref().map(|c| &c.stored.record);
            let rec = record::acquire(
                prior,
                unexpired,
                work_id,
                holder_id,
                crate::limits::ceil_millis(ttl),
                next,
                left,
            )?;
            let handoff = rec.handoff();
            if let Some(wall) = self.put(work_id, current.as_ref(), rec).await? {
                return Ok(Grant {
                    fencing_token: next,
                    expires_at: wall.checked_add(ttl).unwrap_or(wall),
                    handoff,
                });
            }
            // Lost the race: the next read shows the winner's new handle,
            // which counts as live (observed for zero time) → `Held`.
        }
        Err(self.contention(work_id))
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        let wall = self
            .update(lease, |r| r.ttl_ms = crate::limits::ceil_millis(ttl))
            .await?;
        Ok(wall.checked_add(ttl).unwrap_or(wall))
    }

    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime> {
        let wall = self
            .update(lease, |r| {
                r.ttl_ms = crate::limits::ceil_millis(ttl);
                r.checkpoint = Some(data.clone());
            })
            .await?;
        Ok(wall.checked_add(ttl).unwrap_or(wall))
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        let current = self.load(lease.work_id).await?;
        let prior = current.as_ref().map(|c| &c.stored.record);
        let unexpired = match &current {
            Some(c) => self.unexpired_for(lease, c)?,
            None => false,
        };
        record::check_current(prior, lease, unexpired)?;
        prior.map(record::read).ok_or_else(|| record::fenced(lease))
    }

    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        // A tombstone, never a delete: it keeps the fencing generation.
        self.update(lease, |r| r.phase = Phase::Released)
            .await
            .map(drop)
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        let mut ids = if work_ids.is_empty() {
            match self.register.list().await {
                Ok(ids) => ids,
                Err(RegisterError::Store(e)) => return Err(e.into()),
                Err(RegisterError::Invalid(e)) => return Err(e.into()),
                Err(RegisterError::Conflict) => {
                    return Err(StoreError::new(
                        self.kind(),
                        "register reported a conflict on a list",
                    )
                    .into())
                }
            }
        } else {
            work_ids.to_vec()
        };
        ids.sort();
        ids.dedup();
        let mut out = Vec::with_capacity(ids.len());
        for id in &ids {
            // A key deleted since the listing is simply left out.
            if let Some(c) = self.load(id).await? {
                out.push(info(id, &c));
            }
        }
        Ok(out)
    }

    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        for _ in 0..MAX_ATTEMPTS {
            let Some(current) = self.load(work_id).await? else {
                return Ok(None);
            };
            let before = info(work_id, &current);
            if before.expired {
                return Ok(Some(before));
            }
            let mut next = current.stored.record.clone();
            next.phase = Phase::Revoked;
            if self.put(work_id, Some(&current), next).await?.is_some() {
                return Ok(Some(before));
            }
        }
        Err(self.contention(work_id))
    }
}

/// A lease record as stored: the record, a write counter (every write
/// changes the bytes) and the writer's wall clock at the write, in ms since
/// the Unix epoch (informational: `inspect` shows it for released leases;
/// never used to judge expiry).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stored {
    writes: u64,
    written_at_ms: u64,
    record: Record,
}

/// Magic and version of the encoding.
const MAGIC: &[u8; 4] = b"WLR1";

/// Encodes a record in the `WLR1` format of the module docs. Fails only for
/// a field longer than 4 GiB, which the limits rule out.
fn encode_record(s: &Stored) -> std::result::Result<Bytes, String> {
    fn put_bytes(buf: &mut BytesMut, b: &[u8]) -> std::result::Result<(), String> {
        let len = u32::try_from(b.len())
            .map_err(|_| format!("a field of {} bytes is too long to store", b.len()))?;
        buf.put_u32(len);
        buf.put_slice(b);
        Ok(())
    }
    let r = &s.record;
    let checkpoint_len = r.checkpoint.as_ref().map_or(0, Bytes::len);
    let mut buf = BytesMut::with_capacity(128 + r.holder_id.len() + checkpoint_len);
    buf.put_slice(MAGIC);
    buf.put_u64(s.writes);
    buf.put_u64(s.written_at_ms);
    buf.put_u64(r.fencing_token);
    buf.put_u64(r.ttl_ms);
    put_bytes(&mut buf, r.phase.as_str().as_bytes())?;
    put_bytes(&mut buf, r.holder_id.as_bytes())?;
    match &r.checkpoint {
        None => buf.put_u8(0),
        Some(data) => {
            buf.put_u8(1);
            put_bytes(&mut buf, data)?;
        }
    }
    match &r.previous {
        None => buf.put_u8(0),
        Some(p) => {
            buf.put_u8(1);
            put_bytes(&mut buf, p.holder_id.as_bytes())?;
            buf.put_u64(p.fencing_token);
            put_bytes(&mut buf, p.ended.as_str().as_bytes())?;
        }
    }
    Ok(buf.freeze())
}

/// A reader over an encoded record; every error says what was malformed.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> std::result::Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("truncated at {what}"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self, what: &str) -> std::result::Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }
    fn u64(&mut self, what: &str) -> std::result::Result<u64, String> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    fn bytes(&mut self, what: &str) -> std::result::Result<&'a [u8], String> {
        let b = self.take(4, what)?;
        let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let len = usize::try_from(len).map_err(|_| format!("{what} too long"))?;
        self.take(len, what)
    }
    fn str(&mut self, what: &str) -> std::result::Result<&'a str, String> {
        std::str::from_utf8(self.bytes(what)?).map_err(|_| format!("{what} is not UTF-8"))
    }
    fn present(&mut self, what: &str) -> std::result::Result<bool, String> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            n => Err(format!("bad presence flag {n} for {what}")),
        }
    }
}

/// Decodes [`encode_record`]'s format; the error says what is wrong.
fn decode_record(bytes: &[u8]) -> std::result::Result<Stored, String> {
    let mut rd = Reader(bytes);
    if rd.take(4, "the header")? != MAGIC {
        return Err("not a WLR1 lease record (unknown header or version)".into());
    }
    let writes = rd.u64("the write counter")?;
    let written_at_ms = rd.u64("the write time")?;
    let fencing_token = rd.u64("the fencing token")?;
    let ttl_ms = rd.u64("the TTL")?;
    let phase = rd.str("the phase")?;
    let phase = Phase::parse(phase).ok_or_else(|| format!("unknown phase {phase:?}"))?;
    let holder_id = rd.str("the holder ID")?.to_owned();
    let checkpoint = match rd.present("the checkpoint")? {
        false => None,
        true => Some(Bytes::copy_from_slice(rd.bytes("the checkpoint")?)),
    };
    let previous = match rd.present("the previous holder")? {
        false => None,
        true => {
            let holder_id = rd.str("the previous holder ID")?.to_owned();
            let fencing_token = rd.u64("the previous fencing token")?;
            let ended = rd.str("the previous lease's end")?;
            let ended =
                LeaseEnd::from_str(ended).ok_or_else(|| format!("unknown lease end {ended:?}"))?;
            Some(PreviousHolder {
                holder_id,
                fencing_token,
                ended,
            })
        }
    };
    if !rd.0.is_empty() {
        return Err(format!("{} unexpected bytes after the record", rd.0.len()));
    }
    Ok(Stored {
        writes,
        written_at_ms,
        record: Record {
            holder_id,
            fencing_token,
            ttl_ms,
            phase,
            checkpoint,
            previous,
        },
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::time::advance;

    use super::*;

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

    #[test]
    fn encoding_round_trips() {
        let ids = [
            "a".to_owned(),
            "jobs/a b:{ü}".into(),
            "WLR1".into(),
            "日本".into(),
            "x".repeat(256),
        ];
        let checkpoints = [
            None,
            Some(Bytes::new()),
            Some(Bytes::from_static(b"\0\x01WLR1\xff")),
        ];
        let ends = [
            None,
            Some(LeaseEnd::Released),
            Some(LeaseEnd::Expired),
            Some(LeaseEnd::Revoked),
        ];
        for id in &ids {
            for cp in &checkpoints {
                for (i, end) in ends.iter().enumerate() {
                    let stored = Stored {
                        writes: u64::MAX - i as u64,
                        written_at_ms: 1_700_000_000_000,
                        record: Record {
                            holder_id: id.clone(),
                            fencing_token: 7 + i as u64,
                            ttl_ms: 15_000,
                            phase: [Phase::Held, Phase::Released, Phase::Revoked][i % 3],
                            checkpoint: cp.clone(),
                            previous: end.map(|ended| PreviousHolder {
                                holder_id: format!("before {id}"),
                                fencing_token: 6,
                                ended,
                            }),
                        },
                    };
                    let bytes = encode_record(&stored).unwrap();
                    assert!(bytes.starts_with(b"WLR1"));
                    assert_eq!(decode_record(&bytes).unwrap(), stored);
                    // Every proper prefix and any trailing byte are rejected.
                    for n in 0..bytes.len() {
                        assert!(
                            decode_record(&bytes[..n]).is_err(),
                            "prefix of {n} bytes decoded"
                        );
                    }
                    let mut long = bytes.to_vec();
                    long.push(0);
                    assert!(decode_record(&long)
                        .unwrap_err()
                        .contains("unexpected bytes"));
                }
            }
        }
        assert!(decode_record(b"WLR2\0\0\0\0").unwrap_err().contains("WLR1"));
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

    #[tokio::test]
    async fn memory_register_compares_and_swaps() {
        let reg = MemoryRegister::new();
        let k = wid("k");
        let h1 = reg.write(&k, None, Bytes::from_static(b"1")).await.unwrap();
        assert!(matches!(
            reg.write(&k, None, Bytes::new()).await,
            Err(RegisterError::Conflict)
        ));
        let h2 = reg
            .write(&k, Some(&h1), Bytes::from_static(b"2"))
            .await
            .unwrap();
        assert_ne!(h1, h2);
        assert!(matches!(
            reg.write(&k, Some(&h1), Bytes::new()).await,
            Err(RegisterError::Conflict)
        ));
        assert!(matches!(
            reg.delete(&k, &h1).await,
            Err(RegisterError::Conflict)
        ));
        assert_eq!(
            reg.read(&k).await.unwrap(),
            Some((Bytes::from_static(b"2"), h2.clone()))
        );
        reg.delete(&k, &h2).await.unwrap();
        assert_eq!(reg.read(&k).await.unwrap(), None);
        assert!(reg.list().await.unwrap().is_empty());
    }
}
