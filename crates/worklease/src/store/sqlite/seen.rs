//! The check behind a wake-up across processes: has another connection
//! committed, and if so, which watched leases changed hands or ended.
//!
//! A check is one job on the value's connection queue: `PRAGMA
//! data_version`, which changes only when another connection committed
//! (this connection's own commits leave it as it was), and only then one
//! `SELECT` of the watched work IDs' fencing token and phase (a bound
//! array, `rarray(?1)`, whatever their number). [`Seen`] keeps what the
//! last reading showed of each watched work ID and names the ones to wake.

use std::collections::HashMap;
use std::rc::Rc;

use rusqlite::types::Value;
use rusqlite::Connection;

use crate::limits::WorkId;
use crate::store::record::Phase;

/// The fencing token and phase of the watched work IDs' rows.
const SELECT_WATCHED: &str =
    "SELECT work_id, fencing_token, phase FROM worklease_leases WHERE work_id IN rarray(?1)";

/// What a reading showed of one work ID: its fencing token and its phase
/// as stored (`held`, `released`, `revoked`), or no row.
type Sight = Option<(u64, String)>;

/// The rows of one reading, by work ID.
pub(super) type Reading = HashMap<String, (u64, String)>;

/// Reads the rows of `watched` unless no other connection committed since
/// the reading that returned `since`: `Ok(None)` then. Otherwise the new
/// `data_version` and the rows (a work ID without a row is left out).
///
/// # Errors
/// A failure of SQLite (the statement, I/O, a busy file past the busy
/// timeout); the caller checks again at the next change.
pub(super) fn read(
    conn: &Connection,
    since: Option<i64>,
    watched: &[WorkId],
) -> rusqlite::Result<Option<(i64, Reading)>> {
    let version: i64 = conn.query_row("PRAGMA data_version", [], |r| r.get(0))?;
    if since == Some(version) {
        return Ok(None);
    }
    // Read after the version: the rows are at least as new as it, so a
    // commit between the two is read now and again at the next change.
    let ids: Vec<Value> = watched
        .iter()
        .map(|id| Value::Text(id.as_str().to_string()))
        .collect();
    let mut stmt = conn.prepare_cached(SELECT_WATCHED)?;
    let rows = stmt
        .query_map([Rc::new(ids)], |r| {
            Ok((
                r.get::<_, String>(0)?,
                (r.get::<_, i64>(1)? as u64, r.get::<_, String>(2)?),
            ))
        })?
        .collect::<rusqlite::Result<Reading>>()?;
    Ok(Some((version, rows)))
}

/// What the last readings showed of each watched work ID, and the
/// `data_version` of the last one.
#[derive(Default)]
pub(super) struct Seen {
    /// The `data_version` of the last reading; `None` before the first.
    pub(super) version: Option<i64>,
    last: HashMap<WorkId, Sight>,
}

impl Seen {
    /// Takes a reading of the work IDs `watched` (each once): returns
    /// those whose waiters to wake, and forgets the work IDs no longer
    /// watched.
    ///
    /// The rule: a work ID seen before is woken when its fencing token or
    /// its phase changed (released, revoked, acquired again, its row
    /// deleted), not when only its expiry moved (a renewal, a checkpoint),
    /// so a fleet's renewals wake nobody. A work ID seen for the first
    /// time (watched since the last reading) is woken when its lease has
    /// ended or it has no row: the change may have come after its waiter
    /// subscribed, before this reading.
    pub(super) fn apply(
        &mut self,
        version: i64,
        watched: &[WorkId],
        rows: &Reading,
    ) -> Vec<WorkId> {
        self.version = Some(version);
        let mut last = HashMap::with_capacity(watched.len());
        let mut wake = Vec::new();
        for id in watched {
            let now: Sight = rows.get(id.as_str()).cloned();
            let changed = match self.last.remove(id) {
                Some(before) => before != now,
                None => !matches!(&now, Some((_, phase)) if phase == Phase::Held.as_str()),
            };
            if changed {
                wake.push(id.clone());
            }
            last.insert(id.clone(), now);
        }
        self.last = last;
        wake
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> WorkId {
        WorkId::new(s).expect("work ID")
    }

    fn rows(entries: &[(&str, u64, &str)]) -> Reading {
        entries
            .iter()
            .map(|(id, t, p)| (id.to_string(), (*t, p.to_string())))
            .collect()
    }

    #[test]
    fn first_sight_wakes_only_a_lease_that_ended_or_has_no_row() {
        let mut seen = Seen::default();
        let watched = [id("held"), id("released"), id("revoked"), id("none")];
        let r = rows(&[
            ("held", 1, "held"),
            ("released", 2, "released"),
            ("revoked", 3, "revoked"),
        ]);
        let woken = seen.apply(1, &watched, &r);
        assert_eq!(woken, vec![id("released"), id("revoked"), id("none")]);
        assert_eq!(seen.version, Some(1));
        // Nothing changed: nobody is woken again.
        assert!(seen.apply(2, &watched, &r).is_empty());
    }

    #[test]
    fn a_renewal_wakes_nobody_a_new_token_or_phase_does() {
        let mut seen = Seen::default();
        let watched = [id("a"), id("b"), id("c")];
        seen.apply(
            1,
            &watched,
            &rows(&[("a", 1, "held"), ("b", 2, "held"), ("c", 3, "held")]),
        );
        // a: renewed (same token and phase); b: released; c: taken over.
        let woken = seen.apply(
            2,
            &watched,
            &rows(&[("a", 1, "held"), ("b", 2, "released"), ("c", 4, "held")]),
        );
        assert_eq!(woken, vec![id("b"), id("c")]);
        // b acquired again: a new token.
        let woken = seen.apply(
            3,
            &watched,
            &rows(&[("a", 1, "held"), ("b", 5, "held"), ("c", 4, "held")]),
        );
        assert_eq!(woken, vec![id("b")]);
        // a's row deleted by hand.
        let woken = seen.apply(4, &watched, &rows(&[("b", 5, "held"), ("c", 4, "held")]));
        assert_eq!(woken, vec![id("a")]);
    }

    #[test]
    fn a_work_id_no_longer_watched_is_forgotten() {
        let mut seen = Seen::default();
        seen.apply(1, &[id("a")], &rows(&[("a", 1, "held")]));
        seen.apply(2, &[], &rows(&[]));
        // Watched again: a first sight, which does not wake a held lease
        // and does wake an ended one.
        assert!(seen
            .apply(3, &[id("a")], &rows(&[("a", 1, "held")]))
            .is_empty());
        seen.apply(4, &[], &rows(&[]));
        assert_eq!(
            seen.apply(5, &[id("a")], &rows(&[("a", 1, "released")])),
            vec![id("a")]
        );
    }
}
