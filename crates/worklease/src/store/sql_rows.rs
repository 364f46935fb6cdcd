//! What the SQL stores (PostgreSQL, MySQL) share when they read their
//! answers: a token check's verdict, a lease's description, its previous
//! holder, a server time as this host's wall clock. Both decide in the
//! server and decode the same columns, so they say the same things.

use std::time::{Duration, SystemTime};

use crate::error::{Error, Result, StoreError};
use crate::limits::WorkId;
use crate::store::decode::{self, Corrupt};
use crate::store::record::Phase;
use crate::store::{Handoff, LeaseEnd, LeaseInfo, LeaseRef, PreviousHolder};

/// A set-up error of a gc deletion (`delete_ended`) of the store `kind`,
/// saying which privilege (`privileges`) gc needs beyond the lease
/// operations'; other errors unchanged.
pub(crate) fn gc_setup(kind: &'static str, privileges: &str, e: Error) -> Error {
    match e {
        Error::StoreSetup(e) => Error::StoreSetup(StoreError::new(
            kind,
            format!(
                "{e} (garbage collection also needs {privileges} on the lease table, which the \
                 lease operations do not: grant it to the user that runs `worklease gc`)"
            ),
        )),
        other => other,
    }
}

/// The error for a row that breaks the schema's rules.
pub(crate) fn corrupt(kind: &'static str, what: &str) -> Error {
    StoreError::new(kind, format!("a lease row is corrupt: {what}")).into()
}

/// The error for a field that [`decode`]'s checks refuse.
fn bad(kind: &'static str) -> impl Fn(Corrupt) -> Error {
    move |c| corrupt(kind, &c.to_string())
}

/// Turns a verdict (`ok`, `fenced`, `expired`: the rules of
/// `record::check_current`, applied in SQL) into the lease outcome.
pub(crate) fn check_verdict(kind: &'static str, verdict: &str, lease: LeaseRef<'_>) -> Result<()> {
    match verdict {
        "ok" => Ok(()),
        "fenced" => Err(Error::fenced(lease)),
        "expired" => Err(Error::expired(lease)),
        other => Err(StoreError::new(kind, format!("unexpected verdict {other:?}")).into()),
    }
}

/// This host's wall-clock estimate of a server time `delta_us` from now.
pub(crate) fn wall_at(delta_us: i64) -> SystemTime {
    let d = Duration::from_micros(delta_us.unsigned_abs());
    if delta_us >= 0 {
        SystemTime::now() + d
    } else {
        SystemTime::now()
            .checked_sub(d)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }
}

/// The previous holder from its three columns (all NULL on a first
/// acquisition, all set after; some set without the others is corrupt).
pub(crate) fn previous(
    kind: &'static str,
    holder: Option<String>,
    token: Option<u64>,
    end: Option<String>,
) -> Result<Option<PreviousHolder>> {
    decode::previous(holder, token, end.as_deref()).map_err(bad(kind))
}

/// The columns of a lease's description, as both stores select them.
#[cfg_attr(feature = "fuzzing", derive(Debug, arbitrary::Arbitrary))]
pub(crate) struct InfoColumns {
    pub(crate) work_id: String,
    pub(crate) holder_id: String,
    pub(crate) fencing_token: u64,
    /// `held`, `released` or `revoked`.
    pub(crate) phase: String,
    /// The expiry is not past by the server's clock.
    pub(crate) unexpired: bool,
    /// Microseconds from the server's now to the expiry.
    pub(crate) delta_us: i64,
    pub(crate) checkpoint_bytes: u64,
    pub(crate) prev_holder_id: Option<String>,
    pub(crate) prev_fencing_token: Option<u64>,
    pub(crate) prev_end: Option<String>,
}

impl InfoColumns {
    /// The [`LeaseInfo`] these columns describe.
    pub(crate) fn into_info(self, kind: &'static str) -> Result<LeaseInfo> {
        let work_id = WorkId::new(self.work_id)
            .map_err(|e| StoreError::with_source(kind, "a stored work ID is invalid", e))?;
        let phase = Phase::parse(&self.phase).ok_or_else(|| corrupt(kind, "phase"))?;
        let live = phase == Phase::Held && self.unexpired;
        let ended = match phase {
            Phase::Held => LeaseEnd::Expired,
            Phase::Released => LeaseEnd::Released,
            Phase::Revoked => LeaseEnd::Revoked,
        };
        Ok(LeaseInfo {
            work_id,
            holder_id: decode::holder_id("holder_id", self.holder_id).map_err(bad(kind))?,
            fencing_token: decode::fencing_token("fencing_token", self.fencing_token)
                .map_err(bad(kind))?,
            expires_at: wall_at(self.delta_us),
            expires_in: live.then(|| Duration::from_micros(self.delta_us.max(0).unsigned_abs())),
            expired: !live,
            released: phase == Phase::Released,
            ended: (!live).then_some(ended),
            checkpoint_bytes: usize::try_from(self.checkpoint_bytes)
                .map_err(|_| corrupt(kind, "checkpoint size"))?,
            handoff: Handoff {
                previous: previous(
                    kind,
                    self.prev_holder_id,
                    self.prev_fencing_token,
                    self.prev_end,
                )?,
            },
        })
    }
}

/// How the error of a failed fenced transaction came about (the SQL
/// stores' `fenced_transaction`).
#[derive(Debug, thiserror::Error)]
pub enum FencedTransactionError<E> {
    /// The lease check failed ([`Error::Fenced`], [`Error::Expired`]) or the
    /// store did (connecting, beginning, locking, committing:
    /// [`Error::Store`]). Nothing was written, except that a commit that
    /// failed for a lost connection may or may not have committed.
    #[error(transparent)]
    Lease(Error),
    /// The caller's body returned an error; the transaction was rolled back.
    #[error("the body of a fenced transaction failed; it was rolled back")]
    Body(#[source] E),
}

/// The comment of a lease table names its schema version after this.
pub(crate) const COMMENT_PREFIX: &str = "worklease lease table, schema version ";

/// The error of a store opened without schema creation
/// (`create_schema(false)`) whose lease table does not exist: a set-up
/// error, which waiting does not cure.
pub(crate) fn no_store(
    kind: &'static str,
    table: &dyn std::fmt::Display,
    shown: &str,
) -> crate::error::Error {
    Error::StoreSetup(StoreError::new(
        kind,
        format!(
            "no store: table {table} does not exist in {shown} (the first `worklease run`, \
             `elect` or `pool` creates it where its user may create tables, else an owner \
             creates it: docs/operators.md, \"Least privilege\"; `status`, `leader`, \
             `release` and `checkpoint` create nothing)"
        ),
    ))
}

/// Checks an existing lease table's comment: refused, as a set-up error
/// ([`Error::StoreSetup`]), when it names no worklease schema version
/// (another application's table) or a newer one than `version` (written
/// by a newer worklease).
pub(crate) fn check_schema_comment(
    kind: &'static str,
    comment: Option<&str>,
    version: u32,
    table: &dyn std::fmt::Display,
    shown: &str,
) -> Result<()> {
    let found = comment
        .and_then(|c| c.strip_prefix(COMMENT_PREFIX))
        .and_then(|v| v.trim().parse::<u32>().ok());
    match found {
        None => Err(Error::StoreSetup(StoreError::new(
            kind,
            format!(
                "table {table} in {shown} is not a worklease table (its comment does not \
                 name a worklease schema version): choose another table name"
            ),
        ))),
        Some(v) if v > version => Err(Error::StoreSetup(StoreError::new(
            kind,
            format!(
                "table {table} has schema version {v}: newer than this worklease's \
                 {version} (upgrade worklease)"
            ),
        ))),
        Some(_) => Ok(()),
    }
}
