//! The [`LeaseStore`] operations (each one statement, but `watch`; the
//! batches' array parameters are built in `batch.rs`) and the decoding of
//! their rows.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use rand::Rng;
use tokio_postgres::Row;

use crate::error::{Error, InvalidInput, Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::batch;
use crate::store::sql_rows::{self, check_verdict, corrupt, InfoColumns};
use crate::store::{
    Checkpoint, Grant, Handoff, LeaseInfo, LeaseRef, LeaseStore, PreviousHolder, StoredCheckpoint,
};

use super::pool::get;
use super::{PostgresStore, KIND, MAX_BATCH};

/// `ttl` in whole milliseconds (rounded up), as the statements take it.
pub(super) fn ttl_millis(ttl: Duration) -> Result<i64> {
    i64::try_from(crate::limits::ceil_millis(ttl)).map_err(|_| {
        Error::from(InvalidInput::TtlTooLong {
            ttl,
            max: crate::limits::MAX_TTL,
        })
    })
}

fn token_u64(v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|_| corrupt(KIND, "negative fencing token"))
}

/// The previous holder from its columns (PostgreSQL's `bigint` token).
fn previous(
    holder: Option<String>,
    token: Option<i64>,
    end: Option<String>,
) -> Result<Option<PreviousHolder>> {
    sql_rows::previous(KIND, holder, token.map(token_u64).transpose()?, end)
}

/// A [`LeaseInfo`] from the columns of `info_cols` starting at 0.
fn info_from(row: &Row) -> Result<LeaseInfo> {
    let checkpoint_bytes: i64 = get(row, 6)?;
    InfoColumns {
        work_id: get(row, 0)?,
        holder_id: get(row, 1)?,
        fencing_token: token_u64(get(row, 2)?)?,
        phase: get(row, 3)?,
        unexpired: get(row, 4)?,
        delta_us: get(row, 5)?,
        checkpoint_bytes: u64::try_from(checkpoint_bytes)
            .map_err(|_| corrupt(KIND, "checkpoint size"))?,
        prev_holder_id: get(row, 7)?,
        prev_fencing_token: get::<Option<i64>>(row, 8)?.map(token_u64).transpose()?,
        prev_end: get(row, 9)?,
    }
    .into_info(KIND)
}

/// How many times an acquisition runs its statement while a concurrent
/// first acquisition of the work ID leaves it nothing to report (the
/// winner's row is not in its snapshot: the statement changed nothing for
/// that work ID then, and is run again).
const ATTEMPTS: usize = 3;

/// The error of an acquisition that ran out of [`ATTEMPTS`].
fn kept_racing(work_id: &WorkId) -> Error {
    StoreError::new(
        KIND,
        format!("acquisition of {work_id:?} kept racing concurrent first acquisitions"),
    )
    .into()
}

/// The verdicts of renew, checkpoint or release statements (column 0 of
/// one row per lease, in order), each lease's outcome.
pub(super) fn verdicts(
    rows: &[Row],
    leases: &[LeaseRef<'_>],
    context: &'static str,
) -> Result<Vec<Result<()>>> {
    if rows.len() != leases.len() {
        return Err(StoreError::new(
            KIND,
            format!(
                "{context}: {} answer rows for {} leases",
                rows.len(),
                leases.len()
            ),
        )
        .into());
    }
    rows.iter()
        .zip(leases)
        .map(|(row, lease)| {
            let verdict: String = get(row, 0)?;
            Ok(check_verdict(KIND, &verdict, *lease))
        })
        .collect()
}

impl PostgresStore {
    /// An acquisition's answer row (`fencing_token, prev_holder_id,
    /// prev_fencing_token, prev_end, holder_id, remaining_us`): the grant
    /// (the waiters' interest in the work ID then ends), `Held`, or `None`
    /// when the statement decided nothing for the work ID (see
    /// [`ATTEMPTS`]).
    fn acquired(
        &self,
        row: &Row,
        work_id: &WorkId,
        ttl: Duration,
    ) -> Result<Option<Result<Grant>>> {
        if let Some(t) = get::<Option<i64>>(row, 0)? {
            self.shared.unwatch(work_id);
            return Ok(Some(Ok(Grant {
                fencing_token: token_u64(t)?,
                expires_at: SystemTime::now() + ttl,
                handoff: Handoff {
                    previous: previous(get(row, 1)?, get(row, 2)?, get(row, 3)?)?,
                },
            })));
        }
        let Some(holder_id) = get::<Option<String>>(row, 4)? else {
            return Ok(None);
        };
        let remaining_us: i64 = get(row, 5)?;
        Ok(Some(Err(Error::Held {
            work_id: work_id.to_string(),
            holder_id,
            expires_in: Some(Duration::from_micros(remaining_us.max(0).unsigned_abs())),
        })))
    }

    /// Runs renew, checkpoint or release (`sql`) and maps the verdict.
    async fn update_current(
        &self,
        sql: &str,
        lease: LeaseRef<'_>,
        extra: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        context: &'static str,
    ) -> Result<()> {
        let Ok(fencing) = i64::try_from(lease.fencing_token) else {
            return Err(Error::fenced(lease));
        };
        let (work_id, holder_id) = (lease.work_id.as_str(), lease.holder_id.as_str());
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            vec![&work_id, &holder_id, &fencing];
        params.extend_from_slice(extra);
        let rows = self.query(sql, &params, context).await?;
        verdicts(&rows, &[lease], context)?
            .pop()
            .unwrap_or_else(|| Err(StoreError::new(KIND, format!("{context}: no answer")).into()))
    }
}

#[async_trait]
impl LeaseStore for PostgresStore {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn acquire(
        &self,
        work_id: &WorkId,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> Result<Grant> {
        let ttl_ms = ttl_millis(ttl)?;
        // A waiter (it called `watch` first) marks a held lease as wanted,
        // so that its release notifies; releases nobody waits for skip
        // NOTIFY, whose commit-time lock serializes every notifying commit
        // of the server.
        let waiting = self.shared.is_watched(work_id);
        for _ in 0..ATTEMPTS {
            let rows = self
                .query(
                    &self.sql.acquire,
                    &[&work_id.as_str(), &holder_id.as_str(), &ttl_ms, &waiting],
                    "cannot acquire",
                )
                .await?;
            let Some(row) = rows.first() else { continue };
            if let Some(outcome) = self.acquired(row, work_id, ttl)? {
                return outcome;
            }
        }
        Err(kept_racing(work_id))
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        let ttl_ms = ttl_millis(ttl)?;
        self.update_current(&self.sql.renew, lease, &[&ttl_ms], "cannot renew")
            .await?;
        Ok(SystemTime::now() + ttl)
    }

    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime> {
        let ttl_ms = ttl_millis(ttl)?;
        let data: &[u8] = &data;
        self.update_current(
            &self.sql.checkpoint,
            lease,
            &[&ttl_ms, &data],
            "cannot checkpoint",
        )
        .await?;
        Ok(SystemTime::now() + ttl)
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        let Ok(fencing) = i64::try_from(lease.fencing_token) else {
            return Err(Error::fenced(lease));
        };
        let rows = self
            .query(
                &self.sql.read,
                &[&lease.work_id.as_str(), &lease.holder_id.as_str(), &fencing],
                "cannot read the checkpoint",
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::new(KIND, "read checkpoint: no answer row"))?;
        let verdict: String = get(row, 0)?;
        check_verdict(KIND, &verdict, lease)?;
        let data: Option<Vec<u8>> = get(row, 1)?;
        Ok(Checkpoint {
            data: data.map(Bytes::from),
            handoff: Handoff {
                previous: previous(get(row, 2)?, get(row, 3)?, get(row, 4)?)?,
            },
        })
    }

    fn max_batch(&self) -> usize {
        MAX_BATCH
    }

    async fn renew_many(
        &self,
        leases: &[LeaseRef<'_>],
        ttl: Duration,
    ) -> Result<Vec<Result<SystemTime>>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let ttl_ms = ttl_millis(ttl)?;
        let out = self
            .update_many(&self.sql.renew_many, leases, &ttl_ms, "cannot renew")
            .await?;
        Ok(batch::renewed(out, ttl))
    }

    /// Acquires up to `max` of `work_ids` in order, one statement for the
    /// whole list. A work ID whose row a concurrent first acquisition
    /// inserted after the statement began is left undecided by it; the
    /// undecided ones, then the untried rest, go to one more statement
    /// (with `max` less the grants so far), as the single acquisition runs
    /// its statement again. The undecided ones come first and number at
    /// most that `max`, so each is tried again before any untried one is
    /// granted, and the outcomes stay a prefix of `work_ids` in order.
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
        let ttl_ms = ttl_millis(ttl)?;
        let mut outcomes: Vec<Option<Result<Grant>>> = work_ids.iter().map(|_| None).collect();
        // The positions in `work_ids` the next statement tries, in order.
        let mut pending: Vec<usize> = (0..work_ids.len()).collect();
        let mut granted = 0;
        // Statements in a row that decided nothing.
        let mut idle = 0;
        loop {
            let ids: Vec<&str> = pending.iter().map(|&i| work_ids[i].as_str()).collect();
            // As in the single acquisition: a waiter marks a held lease as
            // wanted, so that its release notifies.
            let waiting: Vec<bool> = pending
                .iter()
                .map(|&i| self.shared.is_watched(&work_ids[i]))
                .collect();
            let left = i64::try_from(max - granted).unwrap_or(i64::MAX);
            let rows = self
                .query(
                    &self.sql.acquire_many,
                    &[&ids, &holder_id.as_str(), &ttl_ms, &waiting, &left],
                    "cannot acquire",
                )
                .await?;
            let mut undecided = Vec::new();
            for (row, &i) in rows.iter().zip(&pending) {
                match self.acquired(row, &work_ids[i], ttl)? {
                    Some(outcome) => {
                        granted += usize::from(outcome.is_ok());
                        outcomes[i] = Some(outcome);
                    }
                    None => undecided.push(i),
                }
            }
            if undecided.is_empty() {
                // Every work ID tried was decided: the statement stopped at
                // `max` grants or at the end of the list.
                break;
            }
            idle = if undecided.len() == rows.len() {
                idle + 1
            } else {
                0
            };
            if idle == ATTEMPTS {
                for i in undecided {
                    outcomes[i] = Some(Err(kept_racing(&work_ids[i])));
                }
                break;
            }
            undecided.extend_from_slice(&pending[rows.len().min(pending.len())..]);
            pending = undecided;
        }
        Ok(outcomes.into_iter().map_while(|o| o).collect())
    }

    async fn release_many(&self, leases: &[LeaseRef<'_>]) -> Result<Vec<Result<()>>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let channel = self.channel.as_str();
        let out = self
            .update_many(&self.sql.release_many, leases, &channel, "cannot release")
            .await?;
        // Waiters of these values need not wait for the notifications' trip.
        for work_id in batch::released(leases, &out) {
            self.shared.notify(work_id);
        }
        Ok(out)
    }

    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        let channel = self.channel.as_str();
        self.update_current(&self.sql.release, lease, &[&channel], "cannot release")
            .await?;
        // Waiters of this value need not wait for the notification's trip.
        self.shared.notify(lease.work_id);
        Ok(())
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        let ids: Vec<&str> = work_ids.iter().map(WorkId::as_str).collect();
        let rows = self
            .query(&self.sql.inspect, &[&ids], "cannot list leases")
            .await?;
        rows.iter().map(info_from).collect()
    }

    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        let channel = self.channel.as_str();
        let rows = self
            .query(
                &self.sql.revoke,
                &[&work_id.as_str(), &channel],
                "cannot revoke",
            )
            .await?;
        let before = rows.first().map(info_from).transpose()?;
        self.shared.notify(work_id);
        Ok(before)
    }

    async fn inspect_checkpoint(&self, work_id: &WorkId) -> Result<Option<StoredCheckpoint>> {
        let rows = self
            .query(
                &self.sql.inspect_checkpoint,
                &[&work_id.as_str()],
                "cannot read the checkpoint",
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let data: Option<Vec<u8>> = get(row, 10)?;
        Ok(Some(StoredCheckpoint {
            lease: info_from(row)?,
            data: data.map(Bytes::from),
        }))
    }

    /// One DELETE judged by the server's clock; the fencing sequence, which
    /// every new row's token is drawn from, is the floor and stays.
    async fn delete_ended(&self, work_id: &WorkId, fencing_token: u64) -> Result<bool> {
        let Ok(token) = i64::try_from(fencing_token) else {
            return Ok(false);
        };
        let rows = self
            .query(
                &self.sql.delete_ended,
                &[&work_id.as_str(), &token],
                "cannot delete a lease row",
            )
            .await
            .map_err(|e| sql_rows::gc_setup(KIND, super::GC_PRIVILEGES, e))?;
        Ok(!rows.is_empty())
    }

    fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        let woken = self.shared.watchers.watch(work_id)?;
        if let Ok(mut w) = self.shared.watched.lock() {
            w.insert(work_id.clone());
        }
        let jitter = self
            .options
            .wake_jitter
            .mul_f64(rand::thread_rng().gen_range(0.0..=1.0));
        Some(Box::pin(async move {
            woken.await;
            if !jitter.is_zero() {
                tokio::time::sleep(jitter).await;
            }
        }))
    }
}
