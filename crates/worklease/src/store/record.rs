//! The lease state machine shared by the stores that read, decide and write
//! inside one atomic step (memory, SQLite, the register adapter). Stores
//! that decide inside the server (one SQL statement, one Lua script) write
//! the same rules in their own language; the conformance suite holds them
//! all to one behaviour.

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::limits::{HolderId, WorkId};
use crate::store::{Checkpoint, Handoff, LeaseEnd, LeaseRef, PreviousHolder};

/// Where a lease stands, apart from its expiry, which each store keeps on its
/// own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Held,
    Released,
    Revoked,
}

impl Phase {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Held => "held",
            Phase::Released => "released",
            Phase::Revoked => "revoked",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "held" => Some(Phase::Held),
            "released" => Some(Phase::Released),
            "revoked" => Some(Phase::Revoked),
            _ => None,
        }
    }
}

/// One work ID's lease, minus its expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub holder_id: String,
    pub fencing_token: u64,
    pub ttl_ms: u64,
    pub phase: Phase,
    pub checkpoint: Option<Bytes>,
    pub previous: Option<PreviousHolder>,
}

impl Record {
    /// How this lease ended (or ends, if it is no longer live).
    pub(crate) fn end(&self) -> LeaseEnd {
        match self.phase {
            Phase::Held => LeaseEnd::Expired,
            Phase::Released => LeaseEnd::Released,
            Phase::Revoked => LeaseEnd::Revoked,
        }
    }

    pub(crate) fn handoff(&self) -> Handoff {
        Handoff {
            previous: self.previous.clone(),
        }
    }

    /// Live means held and not expired by the store's clock (`unexpired`).
    pub(crate) fn is_live(&self, unexpired: bool) -> bool {
        self.phase == Phase::Held && unexpired
    }
}

/// Decides an acquisition. `unexpired` is the store's judgement of the
/// current record's expiry; `next_token` is the store's next fencing token,
/// which must exceed the record's.
pub(crate) fn acquire(
    current: Option<&Record>,
    unexpired: bool,
    work_id: &WorkId,
    holder_id: &HolderId,
    ttl_ms: u64,
    next_token: u64,
    expires_in: Option<std::time::Duration>,
) -> Result<Record> {
    if let Some(r) = current {
        if r.is_live(unexpired) {
            return Err(Error::Held {
                work_id: work_id.to_string(),
                holder_id: r.holder_id.clone(),
                expires_in,
            });
        }
        debug_assert!(next_token > r.fencing_token);
    }
    Ok(Record {
        holder_id: holder_id.to_string(),
        fencing_token: next_token,
        ttl_ms,
        phase: Phase::Held,
        checkpoint: current.and_then(|r| r.checkpoint.clone()),
        previous: current.map(|r| PreviousHolder {
            holder_id: r.holder_id.clone(),
            fencing_token: r.fencing_token,
            ended: r.end(),
        }),
    })
}

/// Checks that `lease` is the current, live acquisition (S3 in the crate docs).
pub(crate) fn check_current(
    current: Option<&Record>,
    lease: LeaseRef<'_>,
    unexpired: bool,
) -> Result<()> {
    let fenced = || Error::fenced(lease);
    let r = current.ok_or_else(fenced)?;
    if r.fencing_token != lease.fencing_token || r.holder_id != lease.holder_id.as_str() {
        return Err(fenced());
    }
    match r.phase {
        Phase::Revoked => Err(fenced()),
        Phase::Released => Err(Error::expired(lease)),
        Phase::Held if !unexpired => Err(Error::expired(lease)),
        Phase::Held => Ok(()),
    }
}

/// The checkpoint as the current holder reads it.
pub(crate) fn read(r: &Record) -> Checkpoint {
    Checkpoint {
        data: r.checkpoint.clone(),
        handoff: r.handoff(),
    }
}
