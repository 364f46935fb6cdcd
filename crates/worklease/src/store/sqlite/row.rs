//! A lease row: its columns, its statements, and its expiry on the store
//! clock.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use rusqlite::{params, CachedStatement, Connection, OptionalExtension, Transaction};

use crate::error::Result;
use crate::limits::WorkId;
use crate::store::decode::{self, Corrupt};
use crate::store::record::{Phase, Record};
use crate::store::{LeaseInfo, LeaseRef};

use super::{db_err, ClockReading};

/// A new expiry: a TTL from a reading of the store clock.
pub(super) struct Expiry {
    ttl_ms: u64,
    clock_ms: u64,
    unix_ms: u64,
    /// The wall-clock estimate the holder gets.
    pub(super) wall: SystemTime,
}

impl Expiry {
    pub(super) fn new(now: &ClockReading, ttl: Duration) -> Self {
        let ttl_ms = crate::limits::ceil_millis(ttl);
        let wall = SystemTime::now() + ttl;
        Self {
            ttl_ms,
            // The reading is truncated to the millisecond: the true now may
            // be up to 1 ms later. Rounding up keeps the store's expiry at
            // or after the holder's deadline (send time + TTL - margin).
            clock_ms: now.millis + 1 + ttl_ms,
            unix_ms: crate::token::unix_millis(wall),
            wall,
        }
    }
}

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
        let e = Expiry::new(now, ttl);
        self.record.ttl_ms = e.ttl_ms;
        self.clock_epoch = now.epoch.clone();
        self.expires_clock_ms = e.clock_ms;
        self.expires_at_unix_ms = e.unix_ms;
        e.wall
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
// An upsert that updates a row in place (`INSERT OR REPLACE` would delete
// and reinsert it, touching the primary-key index twice).
const UPSERT: &str = concat!(
    "INSERT INTO worklease_leases (work_id, ",
    columns!(),
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) \
     ON CONFLICT (work_id) DO UPDATE SET holder_id = excluded.holder_id, \
     fencing_token = excluded.fencing_token, ttl_ms = excluded.ttl_ms, phase = excluded.phase, \
     clock_epoch = excluded.clock_epoch, expires_clock_ms = excluded.expires_clock_ms, \
     expires_at_unix_ms = excluded.expires_at_unix_ms, checkpoint = excluded.checkpoint, \
     prev_holder_id = excluded.prev_holder_id, prev_fencing_token = excluded.prev_fencing_token, \
     prev_end = excluded.prev_end"
);
// A renewal of a live lease in one statement: the condition is
// `record::check_current`'s (this acquisition, held) and `Row::unexpired`
// (this epoch, not yet expired); the clock epoch stays what it is.
const EXTEND_LIVE: &str = "UPDATE worklease_leases \
     SET ttl_ms = ?1, expires_clock_ms = ?2, expires_at_unix_ms = ?3 \
     WHERE work_id = ?4 AND holder_id = ?5 AND fencing_token = ?6 AND phase = ?7 \
     AND clock_epoch = ?8 AND expires_clock_ms > ?9";
const READ_SEQUENCE: &str = "SELECT value FROM worklease_sequence WHERE name = 'fencing_token'";
const WRITE_SEQUENCE: &str =
    "UPDATE worklease_sequence SET value = ?1 WHERE name = 'fencing_token'";

fn corrupt(what: &str) -> rusqlite::Error {
    rusqlite::Error::InvalidColumnType(0, what.to_string(), rusqlite::types::Type::Text)
}

/// A lease row's columns as SQLite gives them (its integers are signed),
/// in `columns!()`'s order.
#[cfg_attr(feature = "fuzzing", derive(Debug, arbitrary::Arbitrary))]
pub(crate) struct Columns {
    pub(crate) holder_id: String,
    pub(crate) fencing_token: i64,
    pub(crate) ttl_ms: i64,
    pub(crate) phase: String,
    pub(crate) clock_epoch: String,
    pub(crate) expires_clock_ms: i64,
    pub(crate) expires_at_unix_ms: i64,
    pub(crate) checkpoint: Option<Vec<u8>>,
    pub(crate) prev_holder_id: Option<String>,
    pub(crate) prev_fencing_token: Option<i64>,
    pub(crate) prev_end: Option<String>,
}

impl Columns {
    /// The row these columns hold, or the field that breaks the schema's
    /// rules (a negative number, a token of 0, an invalid holder ID, an
    /// unknown phase, a predecessor half there).
    pub(super) fn decode(self) -> std::result::Result<Row, Corrupt> {
        let prev_token = self
            .prev_fencing_token
            .map(|t| decode::signed_token("prev_fencing_token", t))
            .transpose()?;
        Ok(Row {
            record: Record {
                holder_id: decode::holder_id("holder_id", self.holder_id)?,
                fencing_token: decode::signed_token("fencing_token", self.fencing_token)?,
                ttl_ms: decode::unsigned("ttl_ms", self.ttl_ms)?,
                phase: Phase::parse(&self.phase).ok_or_else(|| {
                    Corrupt::new("phase", format!("{:?} is no phase", self.phase))
                })?,
                checkpoint: self.checkpoint.map(Bytes::from),
                previous: decode::previous(
                    self.prev_holder_id,
                    prev_token,
                    self.prev_end.as_deref(),
                )?,
            },
            clock_epoch: self.clock_epoch,
            expires_clock_ms: decode::unsigned("expires_clock_ms", self.expires_clock_ms)?,
            expires_at_unix_ms: decode::unsigned("expires_at_unix_ms", self.expires_at_unix_ms)?,
        })
    }
}

/// Fuzzing (`crate::fuzz::sqlite_row`): the lease these columns describe
/// at `now`, or the field that is corrupt.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_row(
    columns: Columns,
    work_id: WorkId,
    now: &ClockReading,
) -> std::result::Result<LeaseInfo, Corrupt> {
    Ok(columns.decode()?.info(work_id, now))
}

pub(super) fn row_from(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<Row> {
    Columns {
        holder_id: r.get(at)?,
        fencing_token: r.get(at + 1)?,
        ttl_ms: r.get(at + 2)?,
        phase: r.get(at + 3)?,
        clock_epoch: r.get(at + 4)?,
        expires_clock_ms: r.get(at + 5)?,
        expires_at_unix_ms: r.get(at + 6)?,
        checkpoint: r.get(at + 7)?,
        prev_holder_id: r.get(at + 8)?,
        prev_fencing_token: r.get(at + 9)?,
        prev_end: r.get(at + 10)?,
    }
    .decode()
    .map_err(|c| corrupt(&c.to_string()))
}

/// The statements of the lease steps, each taken from the connection's
/// cache on its first use in a transaction and reused for every lease of
/// a batch.
pub(super) struct Statements<'tx> {
    conn: &'tx Connection,
    select: Option<CachedStatement<'tx>>,
    upsert: Option<CachedStatement<'tx>>,
    extend_live: Option<CachedStatement<'tx>>,
    read_sequence: Option<CachedStatement<'tx>>,
    write_sequence: Option<CachedStatement<'tx>>,
}

/// The statement in `slot`, prepared (from the cache) if it is not yet.
fn prepared<'s, 'tx>(
    conn: &'tx Connection,
    slot: &'s mut Option<CachedStatement<'tx>>,
    sql: &str,
) -> Result<&'s mut CachedStatement<'tx>> {
    let stmt = match slot.take() {
        Some(stmt) => stmt,
        None => conn
            .prepare_cached(sql)
            .map_err(db_err("cannot prepare a statement"))?,
    };
    Ok(slot.insert(stmt))
}

impl<'tx> Statements<'tx> {
    pub(super) fn new(tx: &'tx Transaction<'_>) -> Self {
        Self {
            conn: tx,
            select: None,
            upsert: None,
            extend_live: None,
            read_sequence: None,
            write_sequence: None,
        }
    }

    pub(super) fn load(&mut self, work_id: &WorkId) -> Result<Option<Row>> {
        Ok(prepared(self.conn, &mut self.select, SELECT_ONE)?
            .query_row(params![work_id.as_str()], |r| row_from(r, 0))
            .optional()
            .map_err(db_err("cannot read the lease"))?)
    }

    pub(super) fn save(&mut self, work_id: &WorkId, row: &Row) -> Result<()> {
        let r = &row.record;
        let prev = r.previous.as_ref();
        prepared(self.conn, &mut self.upsert, UPSERT)?
            .execute(params![
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

    /// Gives `lease` the new expiry if it is the current, live
    /// acquisition; false (nothing written) otherwise.
    pub(super) fn extend_if_live(
        &mut self,
        lease: LeaseRef<'_>,
        now: &ClockReading,
        e: &Expiry,
    ) -> Result<bool> {
        let changed = prepared(self.conn, &mut self.extend_live, EXTEND_LIVE)?
            .execute(params![
                e.ttl_ms as i64,
                e.clock_ms as i64,
                e.unix_ms as i64,
                lease.work_id.as_str(),
                lease.holder_id.as_str(),
                lease.fencing_token as i64,
                Phase::Held.as_str(),
                now.epoch,
                now.millis as i64,
            ])
            .map_err(db_err("cannot renew the lease"))?;
        Ok(changed == 1)
    }

    /// The last fencing token handed out.
    pub(super) fn last_token(&mut self) -> Result<u64> {
        Ok(prepared(self.conn, &mut self.read_sequence, READ_SEQUENCE)?
            .query_row([], |r| r.get::<_, i64>(0))
            .map_err(db_err("cannot read the fencing sequence"))? as u64)
    }

    pub(super) fn set_last_token(&mut self, token: u64) -> Result<()> {
        prepared(self.conn, &mut self.write_sequence, WRITE_SEQUENCE)?
            .execute(params![token as i64])
            .map_err(db_err("cannot advance the fencing sequence"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn columns() -> Columns {
        Columns {
            holder_id: "a".into(),
            fencing_token: 3,
            ttl_ms: 1000,
            phase: "held".into(),
            clock_epoch: "boot".into(),
            expires_clock_ms: 5000,
            expires_at_unix_ms: 1_700_000_000_000,
            checkpoint: None,
            prev_holder_id: None,
            prev_fencing_token: None,
            prev_end: None,
        }
    }

    fn field(c: Columns) -> &'static str {
        c.decode().err().expect("refused").field
    }

    // Before issue 23's fuzz target, negative numbers were cast to huge
    // ones and a half-written predecessor was dropped: a wrong lease.
    #[test]
    fn corrupt_columns_are_refused_naming_the_column() {
        assert!(columns().decode().is_ok());
        assert_eq!(
            field(Columns {
                fencing_token: -1,
                ..columns()
            }),
            "fencing_token"
        );
        assert_eq!(
            field(Columns {
                fencing_token: 0,
                ..columns()
            }),
            "fencing_token"
        );
        assert_eq!(
            field(Columns {
                ttl_ms: -1,
                ..columns()
            }),
            "ttl_ms"
        );
        assert_eq!(
            field(Columns {
                holder_id: String::new(),
                ..columns()
            }),
            "holder_id"
        );
        assert_eq!(
            field(Columns {
                phase: "gone".into(),
                ..columns()
            }),
            "phase"
        );
        assert_eq!(
            field(Columns {
                expires_at_unix_ms: -5,
                ..columns()
            }),
            "expires_at_unix_ms"
        );
        let half = Columns {
            prev_holder_id: Some("b".into()),
            ..columns()
        };
        assert_eq!(field(half), "prev_holder_id, prev_fencing_token, prev_end");
    }
}
