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
//! # Batches
//!
//! A register has no batch operation: [`LeaseStore::renew_many`] and the
//! other batch calls run single calls, [`crate::store::batch::EACH_CONCURRENCY`]
//! at once ([`RegisterStore`]'s batch size), and a session keeps up to four
//! such batches in flight. A renewal costs a read and a conditional write,
//! so one process renews at most about `R / 2 × TTL / 3` leases, where `R`
//! is the requests per second the register serves it (object stores
//! throttle per prefix: S3 documents 3,500 writes per second per prefix).
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
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::{Error, Result, StoreError};
use crate::limits::WorkId;
#[cfg(doc)]
use crate::store::{ExpiryClock, LeaseInfo, LeaseStore};

mod encoding;
mod lease;
mod memory;
mod observe;
#[cfg(test)]
mod tests;

pub use memory::MemoryRegister;

use observe::{Observation, OwnWrite};

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
    /// deletes only in garbage collection ([`LeaseStore::delete_ended`]),
    /// after [`Register::raise_fencing_floor`]; a deletion by anyone else
    /// restarts the work ID's fencing tokens at the floor + 1.
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

    /// The highest fencing token an acquisition of `key` ever wrote, kept
    /// by the register apart from the value so that deleting the value (by
    /// hand, or by [`Register::delete`]) does not restart the work ID's
    /// tokens; 0 when there is none. [`RegisterStore`] asks on every
    /// acquisition, after reading the value, and takes the next token above
    /// both. The default, for a register that keeps no such floor, is 0
    /// without a request: deleting a value then restarts its tokens at 1.
    ///
    /// # Errors
    /// [`RegisterError::Store`] when the register fails.
    async fn fencing_floor(&self, key: &WorkId) -> Result<u64, RegisterError> {
        let _ = key;
        Ok(0)
    }

    /// Raises the fencing floor ([`Register::fencing_floor`]) of `key` to
    /// at least `fencing_token`, never lowering it, and returns `true`
    /// once it has taken effect (a later `fencing_floor` read of `key`
    /// answers at least `fencing_token`). The floor may be per key or one
    /// for the whole register (an object beside the values, as
    /// [`crate::store::object::ObjectRegister`] keeps). Garbage collection
    /// calls it before it deletes a value, so that the work ID's next
    /// acquisition, which reads the value (gone) and then the floor, takes
    /// a larger token (`docs/adr/0023-gc-and-the-token-floor.md`).
    ///
    /// The default, for a register that keeps no floor, answers `false`
    /// without a request: [`RegisterStore`] then refuses to delete.
    ///
    /// # Errors
    /// [`RegisterError::Store`] when the register fails (whether the floor
    /// was raised is then unknown; raising again is safe).
    async fn raise_fencing_floor(
        &self,
        key: &WorkId,
        fencing_token: u64,
    ) -> Result<bool, RegisterError> {
        let _ = (key, fencing_token);
        Ok(false)
    }

    /// [`Register::write`] for an acquisition whose fencing token is
    /// `fencing_token`. A register that keeps a floor
    /// ([`Register::fencing_floor`]) raises it to `fencing_token` before
    /// the value can take effect (in the same atomic step, or in a step
    /// that completes before the write is sent), so the floor is never
    /// below a token any value holds, and it never lowers the floor. The
    /// default is [`Register::write`].
    ///
    /// # Errors
    /// As [`Register::write`]; a floor already above `fencing_token` (raised
    /// by another acquisition since the caller read it) is
    /// [`RegisterError::Conflict`], and nothing is written.
    async fn write_acquisition(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
        fencing_token: u64,
    ) -> Result<Handle, RegisterError> {
        let _ = fencing_token;
        self.write(key, previous, value).await
    }

    /// The largest checkpoint, in bytes, a value of this register can
    /// hold; the lease layer refuses a larger one as bad input
    /// ([`crate::error::InvalidInput::CheckpointTooLarge`], nothing
    /// written). Default [`crate::limits::MAX_CHECKPOINT_BYTES`]; a register
    /// with a smaller value limit (a DynamoDB item) lowers it.
    fn max_checkpoint_bytes(&self) -> usize {
        crate::limits::MAX_CHECKPOINT_BYTES
    }
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
    async fn fencing_floor(&self, key: &WorkId) -> Result<u64, RegisterError> {
        (**self).fencing_floor(key).await
    }
    async fn raise_fencing_floor(
        &self,
        key: &WorkId,
        fencing_token: u64,
    ) -> Result<bool, RegisterError> {
        (**self).raise_fencing_floor(key, fencing_token).await
    }
    async fn write_acquisition(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
        fencing_token: u64,
    ) -> Result<Handle, RegisterError> {
        (**self)
            .write_acquisition(key, previous, value, fencing_token)
            .await
    }
    fn max_checkpoint_bytes(&self) -> usize {
        (**self).max_checkpoint_bytes()
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
/// * **Per-work-ID fencing only**: the next token is one above both the
///   record's and the register's [`Register::fencing_floor`]; tokens do not increase across work IDs (the Go original allows
///   this). A global sequence would cost a second compare-and-swap on one
///   shared key for every acquisition, a hot spot with no atomicity across
///   the two keys. Garbage collection ([`LeaseStore::delete_ended`])
///   deletes a value only after raising the register's fencing floor
///   ([`Register::raise_fencing_floor`]), and only on a register that
///   keeps one.
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

impl<R: Register> std::fmt::Debug for RegisterStore<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisterStore")
            .field("register", &self.register.kind())
            .finish_non_exhaustive()
    }
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
}

/// The fuzz target of the lease record (`crate::fuzz::register_record`):
/// decoding never panics; a record that decodes encodes back to bytes
/// that decode to the same record.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_record(data: &[u8]) {
    if let Ok(stored) = encoding::decode_record(data) {
        let bytes = encoding::encode_record(&stored)
            .unwrap_or_else(|e| panic!("a decoded record does not encode: {e}"));
        let again = encoding::decode_record(&bytes)
            .unwrap_or_else(|e| panic!("an encoded record does not decode: {e}"));
        assert_eq!(again, stored, "a decoded record encodes back");
    }
}
