//! The lease operations, each one IMMEDIATE transaction, and the step of
//! each inside its transaction, which the batches share.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use rusqlite::TransactionBehavior;

use crate::error::{Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::batch;
use crate::store::record::{self, Phase};
use crate::store::{
    Checkpoint, Grant, LeaseInfo, LeaseRef, LeaseStore, OwnedLease, StoredCheckpoint,
};

use super::batch::outcome;
use super::row::{row_from, Expiry, Row, Statements, SELECT_ALL};
use super::{db_err, push, ClockReading, SqliteStore, KIND, MAX_BATCH};

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
    pub(super) async fn tx<T: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>, &ClockReading) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.tx_as(Kind::Write, f).await
    }

    /// [`Self::tx`] for a step that may end leases (a release, a
    /// revocation): once it has committed, it signals the other
    /// processes' watchers of the file (see `push.rs`).
    pub(super) async fn ending_tx<T: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>, &ClockReading) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.tx_as(Kind::Ending, f).await
    }

    /// Runs `f` in one read transaction (DEFERRED: no write lock, so reads
    /// do not queue behind, nor hold up, other processes' writes), with the
    /// clock read after its snapshot was taken. `f` must only read.
    pub(super) async fn read_tx<T: Send + 'static>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>, &ClockReading) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.tx_as(Kind::Read, f).await
    }

    /// [`Self::tx`], [`Self::ending_tx`] or [`Self::read_tx`], queued for
    /// the connection: this value's calls run one after another in the
    /// order they came (see `queue.rs`).
    async fn tx_as<T: Send + 'static>(
        &self,
        kind: Kind,
        f: impl FnOnce(&rusqlite::Transaction<'_>, &ClockReading) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let behavior = match kind {
            Kind::Read => TransactionBehavior::Deferred,
            Kind::Write | Kind::Ending => TransactionBehavior::Immediate,
        };
        let clock = self.clock.clone();
        let (path, file) = (self.path.clone(), self.file);
        let abandoned = Arc::new(AtomicBool::new(false));
        let _guard = AbandonOnDrop(abandoned.clone());
        let run = move |conn: &mut rusqlite::Connection| -> Result<T> {
            let tx = conn
                .transaction_with_behavior(behavior)
                .map_err(db_err("cannot begin a transaction"))?;
            if matches!(behavior, TransactionBehavior::Deferred) {
                // A read transaction takes its snapshot at its first read:
                // take it now, so that the clock below is read after it.
                tx.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(()))
                    .map_err(db_err("cannot begin a read transaction"))?;
            }
            // Under the write lock (or in the snapshot): the file every
            // other process writes.
            file.check(&path)?;
            let now = clock.now()?;
            let out = f(&tx, &now)?;
            if abandoned.load(Ordering::SeqCst) {
                // Dropping `tx` rolls back.
                return Err(StoreError::new(KIND, "the caller gave up: rolled back").into());
            }
            tx.commit().map_err(db_err("cannot commit"))?;
            if kind == Kind::Ending {
                push::signal(&path);
            }
            Ok(out)
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.conn.push(Box::new(move |conn| {
            // The caller may have gone: then the answer is dropped.
            let _ = tx.send(run(conn));
        }));
        rx.await.map_err(|_| {
            StoreError::new(KIND, "the call was dropped: the runtime is shutting down")
        })?
    }

    /// `step` for `lease` in one transaction.
    async fn one<T: Send + 'static>(
        &self,
        lease: LeaseRef<'_>,
        step: impl FnOnce(&mut Statements<'_>, &ClockReading, LeaseRef<'_>) -> Result<T>
            + Send
            + 'static,
    ) -> Result<T> {
        let lease = OwnedLease::of(lease);
        self.tx(move |tx, now| step(&mut Statements::new(tx), now, lease.lease()))
            .await
    }
}

/// What a transaction does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Only reads (DEFERRED).
    Read,
    /// Writes (IMMEDIATE).
    Write,
    /// Writes and may end leases: signals other processes after its
    /// commit.
    Ending,
}

/// Runs `f` on the current, live row of `lease` and writes the row back
/// when `write` is set, inside a transaction: the step of a renewal,
/// checkpoint, read or release, alone or in a batch.
fn current_step<T>(
    st: &mut Statements<'_>,
    now: &ClockReading,
    lease: LeaseRef<'_>,
    write: bool,
    f: impl FnOnce(&mut Row, &ClockReading) -> T,
) -> Result<T> {
    let Some(mut row) = st.load(lease.work_id)? else {
        return Err(crate::Error::fenced(lease));
    };
    record::check_current(Some(&row.record), lease, row.unexpired(now))?;
    let out = f(&mut row, now);
    if write {
        st.save(lease.work_id, &row)?;
    }
    Ok(out)
}

/// A renewal inside a transaction, alone or in a batch. The current, live
/// acquisition is extended by one guarded UPDATE (the condition of
/// [`current_step`] in SQL); anything else takes [`current_step`], which
/// returns its error (or, should the two ever disagree, renews it).
fn renew_step(
    st: &mut Statements<'_>,
    now: &ClockReading,
    lease: LeaseRef<'_>,
    ttl: Duration,
) -> Result<SystemTime> {
    let expiry = Expiry::new(now, ttl);
    if st.extend_if_live(lease, now, &expiry)? {
        return Ok(expiry.wall);
    }
    current_step(st, now, lease, true, |row, now| row.extend(now, ttl))
}

/// A release inside a transaction, alone or in a batch.
fn release_step(st: &mut Statements<'_>, now: &ClockReading, lease: LeaseRef<'_>) -> Result<()> {
    current_step(st, now, lease, true, |row, now| {
        row.end_now(now, Phase::Released)
    })
}

/// An acquisition inside a transaction: the step of `acquire` and of each
/// work ID of `acquire_many`.
fn acquire_step(
    st: &mut Statements<'_>,
    now: &ClockReading,
    work_id: &WorkId,
    holder_id: &HolderId,
    ttl: Duration,
) -> Result<Grant> {
    let current = st.load(work_id)?;
    // max() guards against a sequence row edited by hand.
    let next = st
        .last_token()?
        .max(current.as_ref().map_or(0, |r| r.record.fencing_token))
        + 1;
    let record = record::acquire(
        current.as_ref().map(|r| &r.record),
        current.as_ref().is_some_and(|r| r.unexpired(now)),
        work_id,
        holder_id,
        crate::limits::ceil_millis(ttl),
        next,
        current.as_ref().and_then(|r| r.remaining(now)),
    )?;
    st.set_last_token(next)?;
    let mut row = Row {
        record,
        clock_epoch: String::new(),
        expires_clock_ms: 0,
        expires_at_unix_ms: 0,
    };
    let expires_at = row.extend(now, ttl);
    st.save(work_id, &row)?;
    Ok(Grant {
        fencing_token: next,
        expires_at,
        handoff: row.record.handoff(),
    })
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
            acquire_step(&mut Statements::new(tx), now, &work_id, &holder_id, ttl)
        })
        .await
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        self.one(lease, move |st, now, l| renew_step(st, now, l, ttl))
            .await
    }

    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime> {
        self.one(lease, move |st, now, l| {
            current_step(st, now, l, true, |row, now| {
                row.record.checkpoint = Some(data);
                row.extend(now, ttl)
            })
        })
        .await
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        let lease = OwnedLease::of(lease);
        self.read_tx(move |tx, now| {
            current_step(
                &mut Statements::new(tx),
                now,
                lease.lease(),
                false,
                |row, _| record::read(&row.record),
            )
        })
        .await
    }

    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        let owned = OwnedLease::of(lease);
        self.ending_tx(move |tx, now| release_step(&mut Statements::new(tx), now, owned.lease()))
            .await?;
        self.watchers.notify(lease.work_id);
        Ok(())
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        let mut work_ids = work_ids.to_vec();
        // In work ID order, each once, as the listing below gives them.
        work_ids.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
        work_ids.dedup();
        self.read_tx(move |tx, now| {
            if !work_ids.is_empty() {
                // The named leases only, each by its key (not a scan of
                // every row).
                let mut st = Statements::new(tx);
                let mut out = Vec::new();
                for id in work_ids {
                    if let Some(row) = st.load(&id)? {
                        out.push(row.info(id, now));
                    }
                }
                return Ok(out);
            }
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
                out.push(row.info(id, now));
            }
            Ok(out)
        })
        .await
    }

    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        let id = work_id.clone();
        let before = self
            .ending_tx(move |tx, now| {
                let mut st = Statements::new(tx);
                let Some(mut row) = st.load(&id)? else {
                    return Ok(None);
                };
                let before = row.info(id.clone(), now);
                if row.record.is_live(row.unexpired(now)) {
                    row.end_now(now, Phase::Revoked);
                    st.save(&id, &row)?;
                }
                Ok(Some(before))
            })
            .await?;
        self.watchers.notify(work_id);
        Ok(before)
    }

    async fn inspect_checkpoint(&self, work_id: &WorkId) -> Result<Option<StoredCheckpoint>> {
        let id = work_id.clone();
        self.read_tx(move |tx, now| {
            Ok(Statements::new(tx).load(&id)?.map(|row| StoredCheckpoint {
                data: row.record.checkpoint.clone(),
                lease: row.info(id, now),
            }))
        })
        .await
    }

    /// One IMMEDIATE transaction: the row is judged by the store's clock,
    /// the fencing sequence is raised to at least `fencing_token` (it is
    /// already, unless edited by hand: the sequence is the floor), then the
    /// row is deleted.
    async fn delete_ended(&self, work_id: &WorkId, fencing_token: u64) -> Result<bool> {
        let id = work_id.clone();
        self.tx(move |tx, now| {
            let mut st = Statements::new(tx);
            let Some(row) = st.load(&id)? else {
                return Ok(false);
            };
            if row.record.fencing_token != fencing_token || row.record.is_live(row.unexpired(now)) {
                return Ok(false);
            }
            if st.last_token()? < fencing_token {
                st.set_last_token(fencing_token)?;
            }
            drop(st);
            tx.execute(
                "DELETE FROM worklease_leases WHERE work_id = ?1",
                [id.as_str()],
            )
            .map_err(db_err("cannot delete a lease row"))?;
            Ok(true)
        })
        .await
    }

    fn max_batch(&self) -> usize {
        MAX_BATCH
    }

    async fn renew_many(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<SystemTime>>> {
        self.each(leases, false, move |st, now, l| renew_step(st, now, l, ttl))
            .await
    }

    /// `acquire_step` for each of `work_ids` in order, in one
    /// transaction, until `max` are granted.
    async fn acquire_many(
        &self,
        work_ids: &[WorkId],
        holder_id: &HolderId,
        ttl: Duration,
        max: usize,
    ) -> Result<Vec<Result<Grant>>> {
        if work_ids.is_empty() || max == 0 {
            return Ok(Vec::new());
        }
        let (work_ids, holder_id) = (work_ids.to_vec(), holder_id.clone());
        self.tx(move |tx, now| {
            let mut st = Statements::new(tx);
            batch::acquire_in_turn(&work_ids, max, |id| {
                outcome(acquire_step(&mut st, now, id, &holder_id, ttl))
            })
        })
        .await
    }

    async fn release_many(&self, leases: &[LeaseRef<'_>]) -> Result<Vec<Result<()>>> {
        let out = self.each(leases, true, release_step).await?;
        for work_id in batch::released(leases, &out) {
            self.watchers.notify(work_id);
        }
        Ok(out)
    }

    fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        let woken = self.watchers.watch(work_id)?;
        // Before returning: a change by another process from now on is
        // seen (see `push.rs`).
        let registration = self.push.register(work_id);
        Some(Box::pin(async move {
            let _registration = registration;
            woken.await;
        }))
    }
}
