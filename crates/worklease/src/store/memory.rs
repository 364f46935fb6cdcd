//! The in-memory store: for tests and single-process use.
//!
//! Expiry is judged by tokio's monotonic clock ([`tokio::time::Instant`]),
//! so a paused test clock drives it. Fencing tokens come from one sequence
//! for the whole store, so they increase across all work IDs (as in the Go
//! original since v0.5). Waiters are woken at once by a release or a revocation.
//!
//! Not supported: sharing between processes, and durability: everything,
//! fencing sequence included, is gone with the store value. Use the SQLite
//! store for more than one process.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::time::Instant;

use crate::error::{Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::batch;
use crate::store::notify::Watchers;
use crate::store::record::{self, Phase, Record};
use crate::store::{Checkpoint, Grant, LeaseInfo, LeaseRef, LeaseStore, StoredCheckpoint};

const KIND: &str = "memory";

/// The most leases one batch call names: a batch is one step under the
/// store's lock, so it is bounded only to keep that step short.
pub const MAX_BATCH: usize = 10_000;

#[derive(Default)]
struct State {
    leases: HashMap<WorkId, (Record, Instant)>,
    last_token: u64,
}

/// A store in this process's memory. See the module docs for what it does
/// not support.
#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
    watchers: Watchers,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let leases = self.state.lock().map(|s| s.leases.len()).ok();
        f.debug_struct("MemoryStore")
            .field("leases", &leases)
            .finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>> {
        // A poisoned lock means a panic mid-update; refuse rather than guess.
        self.state
            .lock()
            .map_err(|_| StoreError::new(KIND, "state lock poisoned by an earlier panic").into())
    }
}

impl State {
    /// Runs `f` on the current, live record of `lease`.
    fn with_current<T>(
        &mut self,
        lease: LeaseRef<'_>,
        f: impl FnOnce(&mut Record, &mut Instant) -> T,
    ) -> Result<T> {
        let now = Instant::now();
        let Some((r, exp)) = self.leases.get_mut(lease.work_id) else {
            return Err(crate::Error::fenced(lease));
        };
        record::check_current(Some(r), lease, *exp > now)?;
        Ok(f(r, exp))
    }

    fn acquire(&mut self, work_id: &WorkId, holder_id: &HolderId, ttl: Duration) -> Result<Grant> {
        let now = Instant::now();
        let current = self.leases.get(work_id);
        let unexpired = current.is_some_and(|(_, exp)| *exp > now);
        let expires_in = current.map(|(_, exp)| exp.saturating_duration_since(now));
        let next = self.last_token + 1;
        let rec = record::acquire(
            current.map(|(r, _)| r),
            unexpired,
            work_id,
            holder_id,
            crate::limits::ceil_millis(ttl),
            next,
            expires_in,
        )?;
        self.last_token = next;
        let grant = Grant {
            fencing_token: next,
            expires_at: SystemTime::now() + ttl,
            handoff: rec.handoff(),
        };
        self.leases.insert(work_id.clone(), (rec, now + ttl));
        Ok(grant)
    }

    fn renew(&mut self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        self.with_current(lease, |r, exp| {
            r.ttl_ms = crate::limits::ceil_millis(ttl);
            *exp = Instant::now() + ttl;
            SystemTime::now() + ttl
        })
    }

    fn release(&mut self, lease: LeaseRef<'_>) -> Result<()> {
        self.with_current(lease, |r, exp| {
            r.phase = Phase::Released;
            *exp = Instant::now();
        })
    }
}

fn wall_expiry(exp: Instant) -> SystemTime {
    let now = Instant::now();
    if exp >= now {
        SystemTime::now() + (exp - now)
    } else {
        SystemTime::now() - (now - exp)
    }
}

#[async_trait]
impl LeaseStore for MemoryStore {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn acquire(
        &self,
        work_id: &WorkId,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> Result<Grant> {
        self.lock()?.acquire(work_id, holder_id, ttl)
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        self.lock()?.renew(lease, ttl)
    }

    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime> {
        self.lock()?.with_current(lease, |r, exp| {
            r.checkpoint = Some(data);
            r.ttl_ms = crate::limits::ceil_millis(ttl);
            *exp = Instant::now() + ttl;
            SystemTime::now() + ttl
        })
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        self.lock()?.with_current(lease, |r, _| record::read(r))
    }

    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        self.lock()?.release(lease)?;
        self.watchers.notify(lease.work_id);
        Ok(())
    }

    // The batch operations: each one step under the lock, as one
    // transaction would be.

    fn max_batch(&self) -> usize {
        MAX_BATCH
    }

    async fn renew_many(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<SystemTime>>> {
        let mut st = self.lock()?;
        Ok(leases.iter().map(|l| st.renew(*l, ttl)).collect())
    }

    async fn acquire_many(
        &self,
        work_ids: &[WorkId],
        holder_id: &HolderId,
        ttl: Duration,
        max: usize,
    ) -> Result<Vec<Result<Grant>>> {
        let mut st = self.lock()?;
        batch::acquire_in_turn(work_ids, max, |id| Ok(st.acquire(id, holder_id, ttl)))
    }

    async fn release_many(&self, leases: &[LeaseRef<'_>]) -> Result<Vec<Result<()>>> {
        let out: Vec<Result<()>> = {
            let mut st = self.lock()?;
            leases.iter().map(|l| st.release(*l)).collect()
        };
        for work_id in batch::released(leases, &out) {
            self.watchers.notify(work_id);
        }
        Ok(out)
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        let st = self.lock()?;
        let mut out: Vec<LeaseInfo> = st
            .leases
            .iter()
            .filter(|(id, _)| work_ids.is_empty() || work_ids.contains(id))
            .map(|(id, (r, exp))| info(id, r, *exp))
            .collect();
        out.sort_by(|a, b| a.work_id.cmp(&b.work_id));
        Ok(out)
    }

    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        let mut st = self.lock()?;
        let Some((r, exp)) = st.leases.get_mut(work_id) else {
            return Ok(None);
        };
        let before = info(work_id, r, *exp);
        if r.is_live(*exp > Instant::now()) {
            r.phase = Phase::Revoked;
            *exp = Instant::now();
        }
        drop(st);
        self.watchers.notify(work_id);
        Ok(Some(before))
    }

    async fn inspect_checkpoint(&self, work_id: &WorkId) -> Result<Option<StoredCheckpoint>> {
        let st = self.lock()?;
        Ok(st.leases.get(work_id).map(|(r, exp)| StoredCheckpoint {
            lease: info(work_id, r, *exp),
            data: r.checkpoint.clone(),
        }))
    }

    /// One step under the store's lock. The store-wide sequence
    /// (`last_token`) is untouched, so tokens never go down.
    async fn delete_ended(&self, work_id: &WorkId, fencing_token: u64) -> Result<bool> {
        let mut st = self.lock()?;
        let ended = st.leases.get(work_id).is_some_and(|(r, exp)| {
            r.fencing_token == fencing_token && !r.is_live(*exp > Instant::now())
        });
        if ended {
            st.leases.remove(work_id);
        }
        Ok(ended)
    }

    fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        self.watchers.watch(work_id)
    }
}

fn info(work_id: &WorkId, r: &Record, exp: Instant) -> LeaseInfo {
    let now = Instant::now();
    let live = r.is_live(exp > now);
    LeaseInfo {
        work_id: work_id.clone(),
        holder_id: r.holder_id.clone(),
        fencing_token: r.fencing_token,
        expires_at: wall_expiry(exp),
        expires_in: live.then(|| exp - now),
        expired: !live,
        released: r.phase == Phase::Released,
        ended: (!live).then(|| r.end()),
        checkpoint_bytes: r.checkpoint.as_ref().map_or(0, Bytes::len),
        handoff: r.handoff(),
    }
}
