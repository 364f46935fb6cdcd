//! The lease operations, each one IMMEDIATE transaction.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use rusqlite::{params, TransactionBehavior};

use crate::error::{Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::record::{self, Phase};
use crate::store::{Checkpoint, Grant, LeaseInfo, LeaseRef, LeaseStore};

use super::row::{load, row_from, save, Row, READ_SEQUENCE, SELECT_ALL, WRITE_SEQUENCE};
use super::{db_err, ClockReading, SqliteStore, KIND};

/// Marks a blocking transaction abandoned when the future awaiting it is
/// dropped (or has finished: the flag is then read by nobody).
struct AbandonOnDrop(Arc<AtomicBool>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl SqliteStore {
    /// Runs `f` in one IMMEDIATE transaction on a blocking thread, with the
    /// clock read after the write lock was taken.
    ///
    /// If the caller's future is dropped before the transaction commits
    /// (an abandoned acquisition, a renewal past its deadline), the
    /// transaction is rolled back: the blocking thread cannot be stopped,
    /// but it checks before committing.
    async fn tx<T: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>, &ClockReading) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let conn = self.conn.clone();
        let clock = self.clock.clone();
        let (path, file) = (self.path.clone(), self.file);
        let abandoned = Arc::new(AtomicBool::new(false));
        let _guard = AbandonOnDrop(abandoned.clone());
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().map_err(|_| {
                StoreError::new(KIND, "connection lock poisoned by an earlier panic")
            })?;
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(db_err("cannot begin a transaction"))?;
            // Under the write lock: the file every other process writes.
            file.check(&path)?;
            let now = clock.now()?;
            let out = f(&tx, &now)?;
            if abandoned.load(Ordering::SeqCst) {
                // Dropping `tx` rolls back.
                return Err(StoreError::new(KIND, "the caller gave up: rolled back").into());
            }
            tx.commit().map_err(db_err("cannot commit"))?;
            Ok(out)
        })
        .await
        .map_err(|e| StoreError::with_source(KIND, "store task failed", e))?
    }

    /// Runs `f` on the current, live row of `lease` and writes the row back
    /// when `write` is set.
    async fn update_current<T: Send + 'static>(
        &self,
        lease: LeaseRef<'_>,
        write: bool,
        f: impl FnOnce(&mut Row, &ClockReading) -> T + Send + 'static,
    ) -> Result<T> {
        let work_id = lease.work_id.clone();
        let holder_id = lease.holder_id.clone();
        let fencing_token = lease.fencing_token;
        self.tx(move |tx, now| {
            let lease = LeaseRef {
                work_id: &work_id,
                holder_id: &holder_id,
                fencing_token,
            };
            let Some(mut row) = load(tx, &work_id)? else {
                return Err(record::fenced(lease));
            };
            record::check_current(Some(&row.record), lease, row.unexpired(now))?;
            let out = f(&mut row, now);
            if write {
                save(tx, &work_id, &row)?;
            }
            Ok(out)
        })
        .await
    }
}

#[async_trait]
impl LeaseStore for SqliteStore {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn acquire(
        &self,
        work_id: &WorkId,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> Result<Grant> {
        let (work_id, holder_id) = (work_id.clone(), holder_id.clone());
        self.tx(move |tx, now| {
            let current = load(tx, &work_id)?;
            let last: i64 = tx
                .prepare_cached(READ_SEQUENCE)
                .and_then(|mut s| s.query_row([], |r| r.get(0)))
                .map_err(db_err("cannot read the fencing sequence"))?;
            // max() guards against a sequence row edited by hand.
            let next =
                (last as u64).max(current.as_ref().map_or(0, |r| r.record.fencing_token)) + 1;
            let record = record::acquire(
                current.as_ref().map(|r| &r.record),
                current.as_ref().is_some_and(|r| r.unexpired(now)),
                &work_id,
                &holder_id,
                crate::limits::ceil_millis(ttl),
                next,
                current.as_ref().and_then(|r| r.remaining(now)),
            )?;
            tx.prepare_cached(WRITE_SEQUENCE)
                .and_then(|mut s| s.execute(params![next as i64]))
                .map_err(db_err("cannot advance the fencing sequence"))?;
            let mut row = Row {
                record,
                clock_epoch: String::new(),
                expires_clock_ms: 0,
                expires_at_unix_ms: 0,
            };
            let expires_at = row.extend(now, ttl);
            save(tx, &work_id, &row)?;
            Ok(Grant {
                fencing_token: next,
                expires_at,
                handoff: row.record.handoff(),
            })
        })
        .await
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        self.update_current(lease, true, move |row, now| row.extend(now, ttl))
            .await
    }

    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime> {
        self.update_current(lease, true, move |row, now| {
            row.record.checkpoint = Some(data);
            row.extend(now, ttl)
        })
        .await
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        self.update_current(lease, false, |row, _| record::read(&row.record))
            .await
    }

    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        self.update_current(lease, true, |row, now| row.end_now(now, Phase::Released))
            .await?;
        self.watchers.notify(lease.work_id);
        Ok(())
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        let work_ids = work_ids.to_vec();
        self.tx(move |tx, now| {
            let mut stmt = tx
                .prepare_cached(SELECT_ALL)
                .map_err(db_err("cannot list leases"))?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, row_from(r, 1)?)))
                .map_err(db_err("cannot list leases"))?;
            let mut out = Vec::new();
            for row in rows {
                let (id, row) = row.map_err(db_err("cannot read a lease row"))?;
                let id = WorkId::new(id)
                    .map_err(|e| StoreError::with_source(KIND, "a stored work ID is invalid", e))?;
                if work_ids.is_empty() || work_ids.contains(&id) {
                    out.push(row.info(id, now));
                }
            }
            Ok(out)
        })
        .await
    }

    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        let id = work_id.clone();
        let before = self
            .tx(move |tx, now| {
                let Some(mut row) = load(tx, &id)? else {
                    return Ok(None);
                };
                let before = row.info(id.clone(), now);
                if row.record.is_live(row.unexpired(now)) {
                    row.end_now(now, Phase::Revoked);
                    save(tx, &id, &row)?;
                }
                Ok(Some(before))
            })
            .await?;
        self.watchers.notify(work_id);
        Ok(before)
    }

    fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        self.watchers.watch(work_id)
    }
}
