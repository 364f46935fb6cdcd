//! A lease row: its columns, its statements, and its expiry on the store
//! clock.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use rusqlite::{params, OptionalExtension};

use crate::error::Result;
use crate::limits::WorkId;
use crate::store::record::{Phase, Record};
use crate::store::{LeaseEnd, LeaseInfo, PreviousHolder};

use super::{db_err, ClockReading};

/// A lease row: the shared record plus its expiry on the store clock.
pub(super) struct Row {
    pub(super) record: Record,
    pub(super) clock_epoch: String,
    pub(super) expires_clock_ms: u64,
    pub(super) expires_at_unix_ms: u64,
}

impl Row {
    pub(super) fn unexpired(&self, now: &ClockReading) -> bool {
        self.clock_epoch == now.epoch && self.expires_clock_ms > now.millis
    }

    pub(super) fn remaining(&self, now: &ClockReading) -> Option<Duration> {
        self.unexpired(now)
            .then(|| Duration::from_millis(self.expires_clock_ms - now.millis))
    }

    pub(super) fn extend(&mut self, now: &ClockReading, ttl: Duration) -> SystemTime {
        self.record.ttl_ms = crate::limits::ceil_millis(ttl);
        self.clock_epoch = now.epoch.clone();
        // The reading is truncated to the millisecond: the true now may be
        // up to 1 ms later. Rounding up keeps the store's expiry at or after
        // the holder's deadline (send time + TTL - margin).
        self.expires_clock_ms = now.millis + 1 + self.record.ttl_ms;
        let wall = SystemTime::now() + ttl;
        self.expires_at_unix_ms = crate::token::unix_millis(wall);
        wall
    }

    pub(super) fn end_now(&mut self, now: &ClockReading, phase: Phase) {
        self.record.phase = phase;
        self.expires_clock_ms = now.millis;
        self.expires_at_unix_ms = crate::token::unix_millis(SystemTime::now());
    }

    pub(super) fn info(&self, work_id: WorkId, now: &ClockReading) -> LeaseInfo {
        let live = self.record.is_live(self.unexpired(now));
        LeaseInfo {
            work_id,
            holder_id: self.record.holder_id.clone(),
            fencing_token: self.record.fencing_token,
            expires_at: match self.remaining(now) {
                Some(left) => SystemTime::now() + left,
                None => SystemTime::UNIX_EPOCH + Duration::from_millis(self.expires_at_unix_ms),
            },
            expires_in: if live { self.remaining(now) } else { None },
            expired: !live,
            released: self.record.phase == Phase::Released,
            ended: (!live).then(|| self.record.end()),
            checkpoint_bytes: self.record.checkpoint.as_ref().map_or(0, Bytes::len),
            handoff: self.record.handoff(),
        }
    }
}

macro_rules! columns {
    () => {
        "holder_id, fencing_token, ttl_ms, phase, clock_epoch, expires_clock_ms, \
         expires_at_unix_ms, checkpoint, prev_holder_id, prev_fencing_token, prev_end"
    };
}
const SELECT_ONE: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM worklease_leases WHERE work_id = ?1"
);
pub(super) const SELECT_ALL: &str = concat!(
    "SELECT work_id, ",
    columns!(),
    " FROM worklease_leases ORDER BY work_id"
);
const UPSERT: &str = concat!(
    "INSERT OR REPLACE INTO worklease_leases (work_id, ",
    columns!(),
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
);
pub(super) const READ_SEQUENCE: &str =
    "SELECT value FROM worklease_sequence WHERE name = 'fencing_token'";
pub(super) const WRITE_SEQUENCE: &str =
    "UPDATE worklease_sequence SET value = ?1 WHERE name = 'fencing_token'";

fn corrupt(what: &str) -> rusqlite::Error {
    rusqlite::Error::InvalidColumnType(0, what.to_string(), rusqlite::types::Type::Text)
}

pub(super) fn row_from(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Row> {
    let phase: String = r.get(at + 3)?;
    let prev_holder: Option<String> = r.get(at + 8)?;
    let prev_token: Option<i64> = r.get(at + 9)?;
    let prev_end: Option<String> = r.get(at + 10)?;
    let previous = match (prev_holder, prev_token, prev_end) {
        (Some(holder_id), Some(t), Some(end)) => Some(PreviousHolder {
            holder_id,
            fencing_token: t as u64,
            ended: LeaseEnd::from_str(&end).ok_or_else(|| corrupt("prev_end"))?,
        }),
        _ => None,
    };
    let checkpoint: Option<Vec<u8>> = r.get(at + 7)?;
    Ok(Row {
        record: Record {
            holder_id: r.get(at)?,
            fencing_token: r.get::<_, i64>(at + 1)? as u64,
            ttl_ms: r.get::<_, i64>(at + 2)? as u64,
            phase: Phase::parse(&phase).ok_or_else(|| corrupt("phase"))?,
            checkpoint: checkpoint.map(Bytes::from),
            previous,
        },
        clock_epoch: r.get(at + 4)?,
        expires_clock_ms: r.get::<_, i64>(at + 5)? as u64,
        expires_at_unix_ms: r.get::<_, i64>(at + 6)? as u64,
    })
}

pub(super) fn load(tx: &rusqlite::Transaction<'_>, work_id: &WorkId) -> Result<Option<Row>> {
    let mut stmt = tx
        .prepare_cached(SELECT_ONE)
        .map_err(db_err("cannot read the lease"))?;
    Ok(stmt
        .query_row(params![work_id.as_str()], |r| row_from(r, 0))
        .optional()
        .map_err(db_err("cannot read the lease"))?)
}

pub(super) fn save(tx: &rusqlite::Transaction<'_>, work_id: &WorkId, row: &Row) -> Result<()> {
    let r = &row.record;
    let prev = r.previous.as_ref();
    let mut stmt = tx
        .prepare_cached(UPSERT)
        .map_err(db_err("cannot write the lease"))?;
    stmt.execute(params![
        work_id.as_str(),
        r.holder_id,
        r.fencing_token as i64,
        r.ttl_ms as i64,
        r.phase.as_str(),
        row.clock_epoch,
        row.expires_clock_ms as i64,
        row.expires_at_unix_ms as i64,
        r.checkpoint.as_deref(),
        prev.map(|p| p.holder_id.as_str()),
        prev.map(|p| p.fencing_token as i64),
        prev.map(|p| p.ended.as_str()),
    ])
    .map_err(db_err("cannot write the lease"))?;
    Ok(())
}
