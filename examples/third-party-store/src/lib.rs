//! Two stores for worklease written against its public API only, the way
//! an author of a store in another crate writes one (see
//! `docs/writing-a-store.md` in the worklease repository):
//!
//! * [`TableStore`], a [`LeaseStore`] with its own clock and atomic steps:
//!   a table in this process's memory, every operation one step under its
//!   lock, expiry judged by tokio's monotonic clock, fencing tokens from
//!   one counter. It keeps the whole contract itself (S1–S5: who may
//!   acquire, `Held` / `Fenced` / `Expired`, hand-off facts, checkpoints
//!   kept across hand-offs).
//! * [`VersionedRegister`], a bare compare-and-swap [`Register`] (a value
//!   and a version number per key): worklease's [`RegisterStore`] turns it
//!   into a lease store by the observation rule, so the register needs no
//!   clock and no lease rules at all.
//!
//! Neither is shared between processes: they show the two routes to a
//! store, and `tests/conformance.rs` runs worklease's conformance suite on
//! both.
//!
//! [`RegisterStore`]: worklease::store::register::RegisterStore

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::time::Instant;
use worklease::store::register::{Handle, Register, RegisterError};
use worklease::store::{Checkpoint, Grant, Handoff, LeaseInfo, LeaseRef, PreviousHolder, StoredCheckpoint};
use worklease::{Error, HolderId, LeaseEnd, LeaseStore, Result, StoreError, WorkId};

const KIND: &str = "example-table";

/// One work ID's row.
#[derive(Clone)]
struct Row {
    holder_id: String,
    fencing_token: u64,
    expires: Instant,
    /// `None` while the lease runs (or ran out); how it ended otherwise.
    ended: Option<LeaseEnd>,
    checkpoint: Option<Bytes>,
    previous: Option<PreviousHolder>,
}

impl Row {
    fn live(&self, now: Instant) -> bool {
        self.ended.is_none() && self.expires > now
    }

    /// How the lease ended, judged at `now`.
    fn end(&self) -> LeaseEnd {
        self.ended.unwrap_or(LeaseEnd::Expired)
    }

    fn handoff(&self) -> Handoff {
        Handoff {
            previous: self.previous.clone(),
        }
    }
}

#[derive(Default)]
struct Table {
    rows: HashMap<WorkId, Row>,
    /// The last fencing token handed out, for every work ID: tokens only go
    /// up, whatever happens to a row.
    last_token: u64,
}

/// A lease store over a table in this process's memory; see the crate
/// docs. Not shared between processes and not durable.
#[derive(Default)]
pub struct TableStore {
    table: Mutex<Table>,
}

impl TableStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<MutexGuard<'_, Table>> {
        self.table
            .lock()
            .map_err(|_| StoreError::new(KIND, "table lock poisoned").into())
    }

    /// Runs `f` on `lease`'s row if `lease` is the current, live
    /// acquisition; the contract's errors otherwise.
    fn with_current<T>(&self, lease: LeaseRef<'_>, f: impl FnOnce(&mut Row) -> T) -> Result<T> {
        let mut table = self.lock()?;
        let fenced = || Error::fenced(lease);
        let row = table.rows.get_mut(lease.work_id).ok_or_else(fenced)?;
        if row.fencing_token != lease.fencing_token || row.holder_id != lease.holder_id.as_str() {
            return Err(fenced());
        }
        match row.ended {
            Some(LeaseEnd::Revoked) => Err(fenced()),
            Some(_) => Err(Error::expired(lease)),
            None if row.expires <= Instant::now() => Err(Error::expired(lease)),
            None => Ok(f(row)),
        }
    }
}


/// `ttl` from now by the wall clock: informational only.
fn wall(ttl: Duration) -> SystemTime {
    SystemTime::now() + ttl
}

#[async_trait]
impl LeaseStore for TableStore {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn acquire(&self, work_id: &WorkId, holder_id: &HolderId, ttl: Duration) -> Result<Grant> {
        let mut table = self.lock()?;
        let now = Instant::now();
        let current = table.rows.get(work_id);
        if let Some(row) = current.filter(|r| r.live(now)) {
            // A live lease is held for every holder, its own included.
            return Err(Error::Held {
                work_id: work_id.to_string(),
                holder_id: row.holder_id.clone(),
                expires_in: Some(row.expires - now),
            });
        }
        let fencing_token = table.last_token + 1;
        let row = Row {
            holder_id: holder_id.to_string(),
            fencing_token,
            expires: now + ttl,
            ended: None,
            checkpoint: current.and_then(|r| r.checkpoint.clone()),
            previous: current.map(|r| PreviousHolder {
                holder_id: r.holder_id.clone(),
                fencing_token: r.fencing_token,
                ended: r.end(),
            }),
        };
        let handoff = row.handoff();
        table.last_token = fencing_token;
        table.rows.insert(work_id.clone(), row);
        Ok(Grant {
            fencing_token,
            expires_at: wall(ttl),
            handoff,
        })
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        self.with_current(lease, |row| {
            row.expires = Instant::now() + ttl;
            wall(ttl)
        })
    }

    async fn checkpoint(&self, lease: LeaseRef<'_>, ttl: Duration, data: Bytes) -> Result<SystemTime> {
        self.with_current(lease, |row| {
            row.checkpoint = Some(data);
            row.expires = Instant::now() + ttl;
            wall(ttl)
        })
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        self.with_current(lease, |row| Checkpoint {
            data: row.checkpoint.clone(),
            handoff: row.handoff(),
        })
    }

    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        self.with_current(lease, |row| {
            row.ended = Some(LeaseEnd::Released);
            row.expires = Instant::now();
        })
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        let table = self.lock()?;
        let now = Instant::now();
        let mut out: Vec<LeaseInfo> = table
            .rows
            .iter()
            .filter(|(id, _)| work_ids.is_empty() || work_ids.contains(id))
            .map(|(id, row)| info(id, row, now))
            .collect();
        out.sort_by(|a, b| a.work_id.cmp(&b.work_id));
        Ok(out)
    }

    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        let mut table = self.lock()?;
        let now = Instant::now();
        let Some(row) = table.rows.get_mut(work_id) else {
            return Ok(None);
        };
        let before = info(work_id, row, now);
        if row.live(now) {
            row.ended = Some(LeaseEnd::Revoked);
            row.expires = now;
        }
        Ok(Some(before))
    }

    async fn inspect_checkpoint(&self, work_id: &WorkId) -> Result<Option<StoredCheckpoint>> {
        let table = self.lock()?;
        Ok(table.rows.get(work_id).map(|row| StoredCheckpoint {
            lease: info(work_id, row, Instant::now()),
            data: row.checkpoint.clone(),
        }))
    }

    /// One step under the lock; `last_token` (the floor of every work ID)
    /// stays, so tokens never go down.
    async fn delete_ended(&self, work_id: &WorkId, fencing_token: u64) -> Result<bool> {
        let mut table = self.lock()?;
        let ended = table
            .rows
            .get(work_id)
            .is_some_and(|row| row.fencing_token == fencing_token && !row.live(Instant::now()));
        if ended {
            table.rows.remove(work_id);
        }
        Ok(ended)
    }
}

fn info(work_id: &WorkId, row: &Row, now: Instant) -> LeaseInfo {
    let live = row.live(now);
    let expires_at = if row.expires >= now {
        SystemTime::now() + (row.expires - now)
    } else {
        SystemTime::now() - (now - row.expires)
    };
    LeaseInfo {
        work_id: work_id.clone(),
        holder_id: row.holder_id.clone(),
        fencing_token: row.fencing_token,
        expires_at,
        expires_in: live.then(|| row.expires - now),
        expired: !live,
        released: row.ended == Some(LeaseEnd::Released),
        ended: (!live).then(|| row.end()),
        checkpoint_bytes: row.checkpoint.as_ref().map_or(0, Bytes::len),
        handoff: row.handoff(),
    }
}

/// The register's state: the values, the last version handed out (one
/// counter for all keys, so a handle never repeats, not even after a
/// delete), and the fencing floor.
#[derive(Default)]
struct Values {
    map: HashMap<WorkId, (Bytes, u64)>,
    version: u64,
    floor: u64,
}

/// A compare-and-swap register: per key a value and a version number that
/// every write increases, and one fencing floor that garbage collection
/// raises before it deletes a value. See the crate docs.
#[derive(Default)]
pub struct VersionedRegister {
    values: Mutex<Values>,
}

impl VersionedRegister {
    /// An empty register.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::result::Result<MutexGuard<'_, Values>, RegisterError> {
        self.values
            .lock()
            .map_err(|_| StoreError::new("example-register", "register lock poisoned").into())
    }
}

fn handle(version: u64) -> Handle {
    Handle(version.to_string())
}

#[async_trait]
impl Register for VersionedRegister {
    fn kind(&self) -> &'static str {
        "example-register"
    }

    async fn read(&self, key: &WorkId) -> std::result::Result<Option<(Bytes, Handle)>, RegisterError> {
        Ok(self.lock()?.map.get(key).map(|(v, n)| (v.clone(), handle(*n))))
    }

    async fn write(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
    ) -> std::result::Result<Handle, RegisterError> {
        let mut values = self.lock()?;
        let current = values.map.get(key).map(|(_, n)| handle(*n));
        if current.as_ref() != previous {
            return Err(RegisterError::Conflict);
        }
        values.version += 1;
        let next = values.version;
        values.map.insert(key.clone(), (value, next));
        Ok(handle(next))
    }

    async fn delete(&self, key: &WorkId, expected: &Handle) -> std::result::Result<(), RegisterError> {
        let mut values = self.lock()?;
        match values.map.get(key) {
            Some((_, n)) if handle(*n) == *expected => {
                values.map.remove(key);
                Ok(())
            }
            _ => Err(RegisterError::Conflict),
        }
    }

    async fn list(&self) -> std::result::Result<Vec<WorkId>, RegisterError> {
        Ok(self.lock()?.map.keys().cloned().collect())
    }

    /// One floor for every key: a value deleted by garbage collection
    /// leaves its token here, and the next acquisition starts above it.
    async fn fencing_floor(&self, _key: &WorkId) -> std::result::Result<u64, RegisterError> {
        Ok(self.lock()?.floor)
    }

    async fn raise_fencing_floor(
        &self,
        _key: &WorkId,
        fencing_token: u64,
    ) -> std::result::Result<bool, RegisterError> {
        let mut values = self.lock()?;
        values.floor = values.floor.max(fencing_token);
        Ok(true)
    }
}
