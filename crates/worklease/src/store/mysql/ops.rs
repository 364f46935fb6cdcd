//! The [`LeaseStore`] operations, each one round trip (a `CALL` of the
//! table's procedure, or one read; the batches' JSON in `batch.rs`), and
//! the decoding of their rows.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use mysql_async::{Params, Row, Value};

use crate::error::{Error, InvalidInput, Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::batch;
use crate::store::sql_rows::{self, check_verdict, previous, InfoColumns};
use crate::store::{Checkpoint, Grant, Handoff, LeaseInfo, LeaseRef, LeaseStore, StoredCheckpoint};

use super::batch::{acquisitions, encode};
use super::conn::get;
use super::{MysqlStore, KIND, MAX_BATCH};

/// `ttl` in whole milliseconds (rounded up), as the procedures take it.
pub(super) fn ttl_millis(ttl: Duration) -> Result<u64> {
    if ttl > crate::limits::MAX_TTL {
        return Err(InvalidInput::TtlTooLong {
            ttl,
            max: crate::limits::MAX_TTL,
        }
        .into());
    }
    Ok(crate::limits::ceil_millis(ttl))
}

/// A [`LeaseInfo`] from the columns of `sql::info_cols` starting at 0.
pub(super) fn info_from(row: &Row) -> Result<LeaseInfo> {
    InfoColumns {
        work_id: get(row, 0)?,
        holder_id: get(row, 1)?,
        fencing_token: get(row, 2)?,
        phase: get(row, 3)?,
        unexpired: get(row, 4)?,
        delta_us: get(row, 5)?,
        checkpoint_bytes: get(row, 6)?,
        prev_holder_id: get(row, 7)?,
        prev_fencing_token: get(row, 8)?,
        prev_end: get(row, 9)?,
    }
    .into_info(KIND)
}

/// The columns of one acquisition's outcome: the grant's token and
/// hand-off, or the holder and the microseconds it has left.
pub(super) type Outcome = (
    Option<u64>,
    Option<String>,
    Option<u64>,
    Option<String>,
    Option<String>,
    Option<i64>,
);

/// An acquisition's outcome: the grant or `Held`.
pub(super) fn acquired(outcome: Outcome, work_id: &WorkId, ttl: Duration) -> Result<Grant> {
    let (token, prev_holder, prev_token, prev_end, holder, remaining_us) = outcome;
    if let Some(fencing_token) = token {
        return Ok(Grant {
            fencing_token,
            expires_at: SystemTime::now() + ttl,
            handoff: Handoff {
                previous: previous(KIND, prev_holder, prev_token, prev_end)?,
            },
        });
    }
    let Some(holder_id) = holder else {
        return Err(StoreError::new(
            KIND,
            format!("acquisition of {work_id:?}: neither a grant nor a holder"),
        )
        .into());
    };
    Err(Error::Held {
        work_id: work_id.to_string(),
        holder_id,
        expires_in: Some(Duration::from_micros(
            remaining_us.unwrap_or(0).max(0).unsigned_abs(),
        )),
    })
}

/// The one answer row of a statement.
fn only_row(rows: Vec<Row>, context: &'static str) -> Result<Row> {
    rows.into_iter()
        .next()
        .ok_or_else(|| StoreError::new(KIND, format!("{context}: no answer row")).into())
}

impl MysqlStore {
    /// Renew, checkpoint or release (`op`) of one lease: its verdict.
    async fn update_one(
        &self,
        lease: LeaseRef<'_>,
        ttl_ms: u64,
        op: &str,
        data: Option<Bytes>,
        context: &'static str,
    ) -> Result<()> {
        let params = Params::Positional(vec![
            lease.work_id.as_str().into(),
            lease.holder_id.as_str().into(),
            lease.fencing_token.into(),
            ttl_ms.into(),
            op.into(),
            data.map_or(Value::NULL, |d| Value::Bytes(d.to_vec())),
        ]);
        let row = only_row(
            self.query(&self.sql.update, params, context).await?,
            context,
        )?;
        let verdict: String = get(&row, 0)?;
        check_verdict(KIND, &verdict, lease)
    }
}

#[async_trait]
impl LeaseStore for MysqlStore {
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
        let params = Params::from((work_id.as_str(), holder_id.as_str(), ttl_ms));
        let row = only_row(
            self.query(&self.sql.acquire, params, "cannot acquire")
                .await?,
            "acquire",
        )?;
        let outcome: Outcome = (
            get(&row, 0)?,
            get(&row, 1)?,
            get(&row, 2)?,
            get(&row, 3)?,
            get(&row, 4)?,
            get(&row, 5)?,
        );
        acquired(outcome, work_id, ttl)
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        let ttl_ms = ttl_millis(ttl)?;
        self.update_one(lease, ttl_ms, "renew", None, "cannot renew")
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
        self.update_one(lease, ttl_ms, "checkpoint", Some(data), "cannot checkpoint")
            .await?;
        Ok(SystemTime::now() + ttl)
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        let params = Params::from((
            lease.holder_id.as_str(),
            lease.fencing_token,
            lease.work_id.as_str(),
        ));
        let row = only_row(
            self.query(&self.sql.read, params, "cannot read the checkpoint")
                .await?,
            "read checkpoint",
        )?;
        let verdict: String = get(&row, 0)?;
        check_verdict(KIND, &verdict, lease)?;
        let data: Option<Vec<u8>> = get(&row, 1)?;
        Ok(Checkpoint {
            data: data.map(Bytes::from),
            handoff: Handoff {
                previous: previous(KIND, get(&row, 2)?, get(&row, 3)?, get(&row, 4)?)?,
            },
        })
    }

    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        self.update_one(lease, 0, "release", None, "cannot release")
            .await
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        let ids: Vec<&str> = work_ids.iter().map(WorkId::as_str).collect();
        let ids = serde_json::to_string(&ids)
            .map_err(|e| StoreError::with_source(KIND, "cannot encode the work IDs", e))?;
        let rows = self
            .query(
                &self.sql.inspect,
                Params::from((ids.as_str(), ids.as_str())),
                "cannot list leases",
            )
            .await?;
        rows.iter().map(info_from).collect()
    }

    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        let rows = self
            .query(
                &self.sql.revoke,
                Params::from((work_id.as_str(),)),
                "cannot revoke",
            )
            .await?;
        rows.first().map(info_from).transpose()
    }

    async fn inspect_checkpoint(&self, work_id: &WorkId) -> Result<Option<StoredCheckpoint>> {
        let rows = self
            .query(
                &self.sql.inspect_checkpoint,
                Params::from((work_id.as_str(),)),
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
        let changed = self
            .execute(
                &self.sql.delete_ended,
                Params::from((work_id.as_str(), fencing_token)),
                "cannot delete a lease row",
            )
            .await
            .map_err(|e| sql_rows::gc_setup(KIND, super::GC_PRIVILEGES, e))?;
        Ok(changed > 0)
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
            .update_many(leases, ttl_ms, "renew", "cannot renew")
            .await?;
        Ok(batch::renewed(out, ttl))
    }

    /// Acquires up to `max` of `work_ids` in order: one procedure call, one
    /// transaction, the outcomes of the work IDs tried.
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
        let ids: Vec<&str> = work_ids.iter().map(WorkId::as_str).collect();
        let max = u32::try_from(max).unwrap_or(u32::MAX);
        let params = Params::from((encode(&ids)?, holder_id.as_str(), ttl_ms, max));
        let rows = self
            .query(&self.sql.acquire_many, params, "cannot acquire")
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::new(KIND, "acquire many: no answer row"))?;
        let text: String = get(row, 0)?;
        acquisitions(&text, work_ids, ttl)
    }

    async fn release_many(&self, leases: &[LeaseRef<'_>]) -> Result<Vec<Result<()>>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        self.update_many(leases, 0, "release", "cannot release")
            .await
    }
}
