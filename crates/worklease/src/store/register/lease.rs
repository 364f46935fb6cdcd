//! The lease operations of [`RegisterStore`]: each one read, a decision by
//! the shared lease rules, and at most one conditional write (module docs).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;

use super::observe::{judge, Current};
use super::{Register, RegisterError, RegisterStore, MAX_ATTEMPTS};
use crate::error::{Error, Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::record::{self, Phase, Record};
use crate::store::{
    batch, Checkpoint, ExpiryClock, Grant, LeaseInfo, LeaseRef, LeaseStore, StoredCheckpoint,
};

impl<R: Register> RegisterStore<R> {
    /// Renew, checkpoint, release: check that `lease` is current and live,
    /// apply `change`, write it back; re-decide after a lost race.
    async fn update(
        &self,
        lease: LeaseRef<'_>,
        change: impl Fn(&mut Record),
    ) -> Result<SystemTime> {
        for _ in 0..MAX_ATTEMPTS {
            let Some(current) = self.load(lease.work_id).await? else {
                return Err(Error::fenced(lease));
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

    /// The register's fencing floor of `work_id` (a work ID without a
    /// record starts above it).
    async fn floor(&self, work_id: &WorkId) -> Result<u64> {
        match self.register.fencing_floor(work_id).await {
            Ok(floor) => Ok(floor),
            Err(RegisterError::Store(e)) => Err(e.into()),
            Err(RegisterError::Invalid(e)) => Err(e.into()),
            Err(RegisterError::Conflict) => {
                Err(self.error(work_id, "register reported a conflict on a read"))
            }
        }
    }

    /// Maps a register error of a call that cannot conflict.
    fn plain(&self, work_id: &WorkId, e: RegisterError, what: &str) -> Error {
        match e {
            RegisterError::Store(e) => e.into(),
            RegisterError::Invalid(e) => e.into(),
            RegisterError::Conflict => self.error(work_id, what),
        }
    }

    fn contention(&self, work_id: &WorkId) -> Error {
        self.error(
            work_id,
            &format!("contention: lost the compare-and-swap {MAX_ATTEMPTS} times in a row"),
        )
    }
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

    /// The register's [`super::Register::max_checkpoint_bytes`].
    fn max_checkpoint_bytes(&self) -> usize {
        self.register.max_checkpoint_bytes()
    }

    /// [`batch::EACH_CONCURRENCY`]: a register has no batch operation, so
    /// a batch is that many single calls at once (a renewal is a read and a
    /// conditional write each), one wave of requests.
    fn max_batch(&self) -> usize {
        batch::EACH_CONCURRENCY
    }

    async fn acquire(
        &self,
        work_id: &WorkId,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> Result<Grant> {
        for _ in 0..MAX_ATTEMPTS {
            let current = self.load(work_id).await?;
            // The floor is read after the record: a token in any record
            // that existed before this read is at or below it.
            let floor = self.floor(work_id).await?;
            let (unexpired, left, last) = match &current {
                None => (false, None, floor),
                Some(c) => {
                    let (unexpired, left) = judge(&c.stored.record, c.observed);
                    (
                        unexpired,
                        Some(left),
                        c.stored.record.fencing_token.max(floor),
                    )
                }
            };
            let next = last
                .checked_add(1)
                .ok_or_else(|| self.error(work_id, "fencing tokens exhausted"))?;
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
        prior.map(record::read).ok_or_else(|| Error::fenced(lease))
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

    async fn inspect_checkpoint(&self, work_id: &WorkId) -> Result<Option<StoredCheckpoint>> {
        Ok(self.load(work_id).await?.map(|c| StoredCheckpoint {
            lease: info(work_id, &c),
            data: c.stored.record.checkpoint.clone(),
        }))
    }

    /// Read the value; if it is `fencing_token`'s and released or revoked
    /// (one look cannot prove that a held lease expired: the observation
    /// rule needs a full TTL of watching, so held values are kept), raise
    /// the floor to `fencing_token`, then delete on the handle read. An
    /// acquisition racing it either changed the handle (the delete loses:
    /// nothing deleted) or reads the value after the delete, hence the
    /// floor after its raise: its token is above `fencing_token`.
    ///
    /// # Errors
    /// A store error when the register keeps no fencing floor
    /// ([`Register::raise_fencing_floor`] answers `false`): deleting would
    /// restart the work ID's tokens.
    async fn delete_ended(&self, work_id: &WorkId, fencing_token: u64) -> Result<bool> {
        let Some(current) = self.load(work_id).await? else {
            return Ok(false);
        };
        let r = &current.stored.record;
        if r.fencing_token != fencing_token || !matches!(r.phase, Phase::Released | Phase::Revoked)
        {
            return Ok(false);
        }
        let kept = self
            .register
            .raise_fencing_floor(work_id, fencing_token)
            .await
            .map_err(|e| {
                self.plain(work_id, e, "register reported a conflict raising its floor")
            })?;
        if !kept {
            return Err(self.error(
                work_id,
                "the register keeps no fencing floor: deleting the record would restart \
                 its fencing tokens (S2), so it is kept",
            ));
        }
        match self.register.delete(work_id, &current.handle).await {
            Ok(()) => Ok(true),
            Err(RegisterError::Conflict) => Ok(false),
            Err(e) => Err(self.plain(work_id, e, "unreachable")),
        }
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
