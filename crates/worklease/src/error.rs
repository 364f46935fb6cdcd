//! The one error type of the library.
//!
//! The lease outcomes (`Held`, `Expired`, `Fenced`, `WindowExhausted`) are the
//! `ErrLeaseHeld`, `ErrLeaseExpired`, `ErrFenced` and `ErrLeaseWindowExhausted`
//! of the Go `worklease` package; `Invalid` covers every rejected argument
//! (nothing is written when it is returned); `Store` is a failure of the store
//! itself (unreachable, I/O, corrupt data), which background renewal retries.

use std::time::Duration;

/// Which limit a rejected argument broke. Every variant's message names the
/// limit, so a user can fix the call without reading the source.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// A work ID must have at least one byte.
    #[error("work ID is empty: it must be 1 to {max} bytes")]
    EmptyWorkId {
        /// The largest work ID accepted, in bytes.
        max: usize,
    },
    /// A work ID longer than the limit.
    #[error("work ID is {len} bytes: the limit is {max} bytes")]
    WorkIdTooLong {
        /// The length given, in bytes.
        len: usize,
        /// The limit, in bytes.
        max: usize,
    },
    /// A work ID that worklease keeps for itself beside the user's own
    /// (see [`crate::is_internal_work_id`]): `T/fair-queue` and
    /// `T/fair-waiter/<n>` hold the fair line of `T` (ADR 0015),
    /// `S/permit/line` is the target of semaphore `S`'s line, `E/step-down`
    /// the step-down requests of the election `E`. Acquiring
    /// one as a lease of one's own would collide with them.
    #[error(
        "work ID {work_id:?} is reserved for {purpose} {owner:?}: worklease keeps the work IDs \
         ending in /fair-queue, /fair-waiter/<number>, /permit/line, /step-down or /finished for itself; \
         choose another for a lease, election, semaphore or pool"
    )]
    ReservedWorkId {
        /// The work ID given.
        work_id: String,
        /// What worklease keeps it for (`"the fair line of"`, ...).
        purpose: &'static str,
        /// The work ID or election it belongs to.
        owner: String,
    },
    /// A holder ID must have at least one byte.
    #[error("holder ID is empty: it must be 1 to {max} bytes")]
    EmptyHolderId {
        /// The largest holder ID accepted, in bytes.
        max: usize,
    },
    /// A holder ID longer than the limit.
    #[error("holder ID is {len} bytes: the limit is {max} bytes")]
    HolderIdTooLong {
        /// The length given, in bytes.
        len: usize,
        /// The limit, in bytes.
        max: usize,
    },
    /// Work and holder IDs may not contain control characters (NUL, newline,
    /// ...) nor invisible format characters (bidirectional overrides,
    /// zero-width spaces): they end up in keys, logs and terminal output.
    #[error("{what} contains the control or invisible character {ch:?}: such characters are not allowed")]
    ControlCharacter {
        /// `"work ID"` or `"holder ID"`.
        what: &'static str,
        /// The first offending character.
        ch: char,
    },
    /// The TTL must be at least one millisecond (stores keep milliseconds).
    #[error("TTL is {ttl:?}: it must be at least 1ms")]
    ZeroTtl {
        /// The TTL given.
        ttl: Duration,
    },
    /// A TTL beyond the limit (which keeps every store's arithmetic in range).
    #[error("TTL is {ttl:?}: the limit is {max:?}")]
    TtlTooLong {
        /// The TTL given.
        ttl: Duration,
        /// The limit.
        max: Duration,
    },
    /// A checkpoint larger than the limit.
    #[error("checkpoint is {len} bytes: the limit is {max} bytes")]
    CheckpointTooLarge {
        /// The size given, in bytes.
        len: usize,
        /// The limit, in bytes.
        max: usize,
    },
    /// A value to publish with a leadership larger than the limit
    /// ([`crate::limits::MAX_PUBLISHED_VALUE_BYTES`]); nothing was written.
    #[error("the published value is {len} bytes: the limit is {max} bytes")]
    PublishedValueTooLarge {
        /// The size given, in bytes.
        len: usize,
        /// The limit, in bytes.
        max: usize,
    },
    /// A batch call naming more leases than the limit
    /// ([`crate::limits::MAX_BATCH`]); nothing was written.
    #[error("the batch names {len} leases: the limit is {max}")]
    BatchTooLarge {
        /// The number of leases given.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A batch call naming one work ID twice; nothing was written.
    #[error("the batch names the work ID {work_id:?} twice: each work ID may appear once")]
    DuplicateWorkId {
        /// The work ID named twice.
        work_id: String,
    },
    /// A setting that breaks a rule between settings (for example a renewal
    /// interval that is not shorter than the TTL). The message names the rule.
    #[error("{0}")]
    Config(String),
    /// A token whose text form does not parse.
    #[error("malformed lease token: {0}")]
    MalformedToken(String),
    /// A token used with a lease handle of another holder.
    #[error("token belongs to holder {token_holder:?}, not to this handle's holder {holder:?}")]
    ForeignToken {
        /// The holder named in the token.
        token_holder: String,
        /// The holder of the [`crate::Leases`] handle.
        holder: String,
    },
    /// A store URL that cannot be used. The URL in the message has its
    /// credentials removed.
    #[error("store URL {url:?}: {reason}")]
    StoreUrl {
        /// The URL, credentials redacted.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A failure of the store itself, as opposed to a lease outcome. Its
/// message ends with the underlying error's, so that a user sees the cause
/// ("database is locked", "Is a directory") without walking the chain.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind} store: {message}{}", fmt_source(.source))]
pub struct StoreError {
    /// The kind of store (`"memory"`, `"sqlite"`, ...).
    pub kind: &'static str,
    /// What failed, without credentials.
    pub message: String,
    /// The underlying error, where there is one.
    #[source]
    pub source: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
}

impl StoreError {
    /// A store error with a message and no underlying cause.
    pub fn new(kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// A store error wrapping the library error that caused it.
    pub fn with_source(
        kind: &'static str,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            kind,
            message: message.into(),
            source: Some(std::sync::Arc::new(source)),
        }
    }
}

/// Every error the library returns. Cloneable, so that the lost signal of
/// background renewal can hand its cause to every listener.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another holder's lease on the work ID is live (Go: `ErrLeaseHeld`).
    #[error("lease on {work_id:?} is held by {holder_id:?}{}", fmt_expires_in(*.expires_in))]
    Held {
        /// The work ID asked for.
        work_id: String,
        /// Who holds it.
        holder_id: String,
        /// How long the holder's lease has left by the store's clock, where
        /// the store can tell. A store that judges expiry by observation
        /// ([`crate::store::ExpiryClock::Observation`], a bare register such
        /// as S3) cannot: there it is this process's own upper bound, the
        /// time until it would count the lease expired if it sees no
        /// renewal (a full TTL on a first look), not a countdown; see
        /// [`crate::store::register`].
        expires_in: Option<Duration>,
    },
    /// The token's lease expired and nobody has taken it since
    /// (Go: `ErrLeaseExpired`). Nothing was changed.
    #[error("the lease of {holder_id:?} on {work_id:?} with fencing token {fencing_token} has expired or was released")]
    Expired {
        /// The work ID.
        work_id: String,
        /// The holder whose token it is (the caller's holder ID).
        holder_id: String,
        /// The stale token's fencing token.
        fencing_token: u64,
    },
    /// The token is no longer current: another acquisition followed it, an
    /// operator revoked it, or the work ID was never acquired with it (Go:
    /// `ErrFenced`). Nothing was changed; never retried.
    #[error("the lease of {holder_id:?} on {work_id:?} with fencing token {fencing_token} is fenced: it was taken over or revoked")]
    Fenced {
        /// The work ID.
        work_id: String,
        /// The holder whose token it is (the caller's holder ID), so that
        /// an operator can tell which holder was stale.
        holder_id: String,
        /// The stale token's fencing token.
        fencing_token: u64,
    },
    /// Background renewal kept failing until the lease could no longer be
    /// saved (Go: `ErrLeaseWindowExhausted`). The work must stop.
    #[error("lease on {work_id:?} with fencing token {fencing_token} was lost: renewal failed until the lease window ran out{}", fmt_last(.last_error))]
    WindowExhausted {
        /// The work ID.
        work_id: String,
        /// The lost token's fencing token.
        fencing_token: u64,
        /// The last renewal failure, as text.
        last_error: Option<String>,
    },
    /// Every permit of a semaphore is held ([`crate::Semaphore::acquire`]
    /// without waiting): the semaphore's `Held`.
    #[error("{} of semaphore {semaphore:?} {} held{}", if *.permits == 1 { "the 1 permit".to_string() } else { format!("all {} permits", .permits) }, if *.permits == 1 { "is" } else { "are" }, fmt_expires_in(*.expires_in))]
    PermitsHeld {
        /// The semaphore's name.
        semaphore: String,
        /// Its number of permits (the caller's setting).
        permits: usize,
        /// How long the first permit to expire has left, where the store
        /// can tell (as in [`Error::Held`]).
        expires_in: Option<Duration>,
    },
    /// A fail-fast fair acquisition ([`crate::AcquireOptions::fair`])
    /// found fair waiters in line for the lease or semaphore: it does not
    /// go before them.
    #[error("{waiters} fair waiter(s) are in line for {target:?}: a fair acquisition does not go before them")]
    WaitersAhead {
        /// The work ID, or the semaphore's name.
        target: String,
        /// How many fair waiters are in line.
        waiters: usize,
    },
    /// Nobody leads the election now (hoplock: `ErrNoLease`).
    #[error("election {election:?} has no leader")]
    NoLease {
        /// The election (its work ID).
        election: String,
    },
    /// This leader gave up its leadership ([`crate::election::Leadership::resign`]):
    /// the cause its lost signal reports, distinct from a loss.
    #[error("leadership of election {election:?} was given up (resigned)")]
    Resigned {
        /// The election (its work ID).
        election: String,
    },
    /// A waiting acquisition was cancelled through its cancellation token.
    #[error("waiting for the lease on {work_id:?} was cancelled")]
    Cancelled {
        /// The work ID waited for.
        work_id: String,
    },
    /// A waiting acquisition ran out of its wait timeout.
    #[error("waiting for the lease on {work_id:?} timed out after {waited:?}")]
    WaitTimedOut {
        /// The work ID waited for.
        work_id: String,
        /// The timeout that ran out.
        waited: Duration,
    },
    /// The SQLite store refused its database file because another local
    /// user could write it, and so take or forge any lease in it: its
    /// directory is writable by every user without the sticky bit, or the
    /// file (or its `-wal`, `-shm` or `-journal` companion) is owned by
    /// another user (see the module docs of `store::sqlite`). Nothing was
    /// written.
    #[error("refusing the SQLite store file {path:?}: {reason}")]
    UnsafeStoreFile {
        /// The database file's path.
        path: std::path::PathBuf,
        /// Why it is refused, and what to do about it.
        reason: String,
    },
    /// An argument broke a limit; nothing was written.
    #[error("invalid input: {0}")]
    Invalid(#[from] InvalidInput),
    /// The store failed (unreachable, I/O error, corrupt data, a transient
    /// refusal the store's own retries did not outlast): a retry may cure
    /// it ([`Error::is_transient`]).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store cannot be used as it is set up, and trying again does not
    /// help until an operator acts (the SQL stores): its table is another
    /// application's or has a newer schema version, does not exist where
    /// the store may not create it, the role lacks a privilege the store
    /// needs, the server does not know the user, role or database (or the
    /// password is wrong), or objects under the store's names are not the
    /// store's (ADR 0022 lists the server codes). Not transient: a waiting
    /// acquisition or a campaign stops on it. The message says what to do.
    #[error(transparent)]
    StoreSetup(StoreError),
}

impl Error {
    /// [`Error::Fenced`] for `lease`: another acquisition replaced it, it
    /// was revoked, or it never existed. For stores (S3 of the contract).
    pub fn fenced(lease: crate::token::LeaseRef<'_>) -> Self {
        Error::Fenced {
            work_id: lease.work_id.to_string(),
            holder_id: lease.holder_id.to_string(),
            fencing_token: lease.fencing_token,
        }
    }

    /// [`Error::Expired`] for `lease`: it is the current acquisition but
    /// expired or was released, and nobody has taken it since. For stores
    /// (S3 of the contract).
    pub fn expired(lease: crate::token::LeaseRef<'_>) -> Self {
        Error::Expired {
            work_id: lease.work_id.to_string(),
            holder_id: lease.holder_id.to_string(),
            fencing_token: lease.fencing_token,
        }
    }

    /// True for the errors that mean the token is no longer current and the
    /// work must stop: `Fenced`, `Expired` and `WindowExhausted`.
    pub fn is_lease_lost(&self) -> bool {
        matches!(
            self,
            Error::Fenced { .. } | Error::Expired { .. } | Error::WindowExhausted { .. }
        )
    }

    /// True for a failure of the store, which a retry may cure
    /// ([`Error::Store`]; not [`Error::StoreSetup`]).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Store(_))
    }
}

/// The underlying error and its own causes, each after ": ". Some client
/// libraries put the useful part ("password authentication failed",
/// "Connection refused") only in a cause of a cause.
fn fmt_source(s: &Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>) -> String {
    let mut out = String::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = s.as_deref().map(|e| e as _);
    while let Some(e) = next {
        let text = e.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = e.source();
    }
    out
}

fn fmt_expires_in(d: Option<Duration>) -> String {
    match d {
        Some(d) => format!(" (expires in {:.1}s)", d.as_secs_f64()),
        None => String::new(),
    }
}

fn fmt_last(e: &Option<String>) -> String {
    match e {
        Some(e) => format!(" (last error: {e})"),
        None => String::new(),
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
