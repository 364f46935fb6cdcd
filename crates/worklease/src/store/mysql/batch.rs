//! The batch operations' JSON (their entry points are in `ops.rs`):
//! renewal and release are ONE locking read and ONE
//! `UPDATE` over all the leases (a JSON array turned into rows by
//! `JSON_TABLE`) inside one procedure; acquisition is one procedure that
//! decides the work IDs one after another in one transaction. Each is one
//! round trip for up to [`MAX_BATCH`] leases.

use std::time::Duration;

use mysql_async::Params;

use crate::error::{Result, StoreError};
use crate::limits::WorkId;
use crate::store::sql_rows::check_verdict;
use crate::store::{Grant, LeaseRef};

use super::conn::get;
use super::ops::{acquired, Outcome};
use super::{MysqlStore, KIND};

/// The most leases one batch call names ([`crate::LeaseStore::max_batch`]).
///
/// The verdicts of a batch come back as one `GROUP_CONCAT` of a letter per
/// lease, and MySQL's default `group_concat_max_len` is 1,024 bytes
/// (MariaDB's 1 MiB): 1,000 fits either without changing a session
/// setting. The JSON of 1,000 leases with the longest IDs (1 KiB work ID,
/// 256-byte holder) is about 1.3 MiB, under the smallest default
/// `max_allowed_packet` (MariaDB's 16 MiB).
pub const MAX_BATCH: usize = 1_000;

pub(super) fn encode<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::with_source(KIND, "cannot encode a batch as JSON", e).into())
}

impl MysqlStore {
    /// Renew (`op` "renew") or release ("release") of `leases`: each
    /// lease's verdict, in the order of `leases`. The leases go to the
    /// server sorted by work ID, so that every batch locks its rows in the
    /// same order.
    pub(super) async fn update_many(
        &self,
        leases: &[LeaseRef<'_>],
        ttl_ms: u64,
        op: &str,
        context: &'static str,
    ) -> Result<Vec<Result<()>>> {
        let mut order: Vec<usize> = (0..leases.len()).collect();
        order.sort_by(|&a, &b| leases[a].work_id.as_str().cmp(leases[b].work_id.as_str()));
        let json: Vec<(&str, &str, u64)> = order
            .iter()
            .map(|&i| {
                let l = &leases[i];
                (l.work_id.as_str(), l.holder_id.as_str(), l.fencing_token)
            })
            .collect();
        let params = Params::from((encode(&json)?, ttl_ms, op));
        let rows = self.query(&self.sql.update_many, params, context).await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::new(KIND, format!("{context}: no answer row")))?;
        let letters: String = get(row, 0)?;
        if letters.len() != leases.len() {
            return Err(StoreError::new(
                KIND,
                format!(
                    "{context}: {} verdicts for {} leases",
                    letters.len(),
                    leases.len()
                ),
            )
            .into());
        }
        let mut out: Vec<Option<Result<()>>> = leases.iter().map(|_| None).collect();
        for (&i, letter) in order.iter().zip(letters.chars()) {
            let verdict = match letter {
                'o' => "ok",
                'f' => "fenced",
                'e' => "expired",
                _ => "?",
            };
            out[i] = Some(check_verdict(KIND, verdict, leases[i]));
        }
        Ok(out.into_iter().flatten().collect())
    }
}

/// The outcomes of `acquire_many` from the procedure's JSON answer
/// (`text`): one per work ID tried, in the order of `work_ids`.
pub(super) fn acquisitions(
    text: &str,
    work_ids: &[WorkId],
    ttl: Duration,
) -> Result<Vec<Result<Grant>>> {
    let raw: Vec<[serde_json::Value; 6]> = serde_json::from_str(text).map_err(|e| {
        StoreError::with_source(KIND, "acquire many: the answer is not the expected JSON", e)
    })?;
    let outcomes = raw.into_iter().map(outcome).collect::<Result<Vec<_>>>()?;
    if outcomes.len() > work_ids.len() {
        return Err(StoreError::new(
            KIND,
            format!(
                "acquire many: {} outcomes for {} work IDs",
                outcomes.len(),
                work_ids.len()
            ),
        )
        .into());
    }
    Ok(outcomes
        .into_iter()
        .zip(work_ids)
        .map(|(o, work_id)| acquired(o, work_id, ttl))
        .collect())
}

/// One acquisition's outcome from its JSON array. MariaDB writes the
/// numbers of a procedure's variables into JSON as strings, MySQL as
/// numbers: both are read.
fn outcome(values: [serde_json::Value; 6]) -> Result<Outcome> {
    use serde_json::Value;
    fn text(v: &Value) -> Result<Option<String>> {
        match v {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.clone())),
            Value::Number(n) => Ok(Some(n.to_string())),
            other => Err(StoreError::new(KIND, format!("acquire many: unexpected {other}")).into()),
        }
    }
    fn number<T: std::str::FromStr>(v: &Value) -> Result<Option<T>> {
        text(v)?
            .map(|s| {
                s.parse().map_err(|_| {
                    StoreError::new(KIND, format!("acquire many: {s:?} is not a number")).into()
                })
            })
            .transpose()
    }
    let [token, prev_holder, prev_token, prev_end, holder, remaining_us] = &values;
    Ok((
        number(token)?,
        text(prev_holder)?,
        number(prev_token)?,
        text(prev_end)?,
        text(holder)?,
        number(remaining_us)?,
    ))
}
