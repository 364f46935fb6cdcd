//! The election record: what a leader writes into the checkpoint of the
//! election's lease when its term starts and when it publishes a value
//! (ADR 0016). Observers read it with the lease; the next leader reads it
//! from the hand-off to count transitions.
//!
//! The record is the checkpoint of the election's work ID, so it is fenced
//! like any checkpoint (only the current term's token writes it), kept
//! across hand-offs and restarts of every process, and as durable as the
//! store. Encoding, version 1, all integers big-endian:
//!
//! ```text
//! "wlelect" 0x01 | term u64 | transitions u64 | since (ms since the Unix epoch) u64
//!   | priority i32 | holder length u16 | holder (UTF-8) | value flag u8 (0 none, 1 some) | value
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{InvalidInput, Result};
use crate::limits::MAX_PUBLISHED_VALUE_BYTES;
use crate::store::Handoff;

const MAGIC: &[u8; 8] = b"wlelect\x01";
/// Bytes before the holder: magic, term, transitions, since, priority,
/// holder length.
const HEADER: usize = 8 + 8 + 8 + 8 + 4 + 2;

/// One term's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The fencing token of the acquisition that wrote it.
    pub(crate) term: u64,
    /// Changes of leader (holder ID) since the election's first leader.
    pub(crate) transitions: u64,
    /// When the term started, by the leader's wall clock (informational).
    pub(crate) since: SystemTime,
    /// The leader's priority ([`super::ElectorBuilder::priority`]).
    pub(crate) priority: i32,
    /// The leader's holder ID.
    pub(crate) holder: String,
    /// The value the leader publishes.
    pub(crate) value: Option<Bytes>,
}

impl Record {
    /// The record of a term that starts now: `term` and `holder` of the new
    /// acquisition, transitions counted from the record it was handed
    /// (`previous`, if any, and if it was one) and the hand-off.
    pub(crate) fn first_of_term(
        term: u64,
        holder: &str,
        previous: Option<&Record>,
        handoff: &Handoff,
        value: Option<Bytes>,
        priority: i32,
    ) -> Record {
        Record {
            term,
            transitions: transitions(previous, handoff, holder),
            since: SystemTime::now(),
            priority,
            holder: holder.to_string(),
            value,
        }
    }

    /// The encoding above.
    pub(crate) fn encode(&self) -> Bytes {
        let holder = self.holder.as_bytes();
        let value = self.value.as_deref();
        let mut b =
            BytesMut::with_capacity(HEADER + holder.len() + 1 + value.map_or(0, <[u8]>::len));
        b.put_slice(MAGIC);
        b.put_u64(self.term);
        b.put_u64(self.transitions);
        b.put_u64(millis_since_epoch(self.since));
        b.put_i32(self.priority);
        // A holder ID is at most MAX_HOLDER_ID_BYTES (256), checked when the
        // `Leases` handle was made.
        b.put_u16(u16::try_from(holder.len()).unwrap_or(u16::MAX));
        b.put_slice(holder);
        match value {
            Some(v) => {
                b.put_u8(1);
                b.put_slice(v);
            }
            None => b.put_u8(0),
        }
        b.freeze()
    }

    /// The record in `data`, or `None` when it is not one (no checkpoint
    /// yet, or one written by something other than an elector).
    pub(crate) fn decode(data: &[u8]) -> Option<Record> {
        let rest = data.strip_prefix(MAGIC)?;
        let u64_at = |at: usize| -> Option<u64> {
            Some(u64::from_be_bytes(rest.get(at..at + 8)?.try_into().ok()?))
        };
        let term = u64_at(0)?;
        let transitions = u64_at(8)?;
        let since = UNIX_EPOCH.checked_add(Duration::from_millis(u64_at(16)?))?;
        let priority = i32::from_be_bytes(rest.get(24..28)?.try_into().ok()?);
        let holder_len = usize::from(u16::from_be_bytes(rest.get(28..30)?.try_into().ok()?));
        let holder = std::str::from_utf8(rest.get(30..30 + holder_len)?).ok()?;
        let value = match rest.get(30 + holder_len..)? {
            [0] => None,
            [1, v @ ..] => Some(Bytes::copy_from_slice(v)),
            _ => return None,
        };
        Some(Record {
            term,
            transitions,
            since,
            priority,
            holder: holder.to_string(),
            value,
        })
    }
}

/// Checks a value to publish against [`MAX_PUBLISHED_VALUE_BYTES`].
///
/// # Errors
/// [`InvalidInput::PublishedValueTooLarge`] above the limit.
pub(crate) fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > MAX_PUBLISHED_VALUE_BYTES {
        return Err(InvalidInput::PublishedValueTooLarge {
            len: value.len(),
            max: MAX_PUBLISHED_VALUE_BYTES,
        }
        .into());
    }
    Ok(())
}

/// Transitions of a term held by `holder`: those of the record it was
/// handed, plus one for each change of holder since that record's term. The
/// hand-off names the acquisition just before this one; when that leader
/// never wrote its record (it failed between its acquisition and its
/// write), its change of holder is counted from the hand-off. The first
/// leader of an election has 0, as Kubernetes' `leaseTransitions`.
pub(crate) fn transitions(previous: Option<&Record>, handoff: &Handoff, holder: &str) -> u64 {
    let Some(before) = &handoff.previous else {
        return 0;
    };
    let (mut n, recorded_holder) = match previous {
        Some(r) => (r.transitions, r.holder.as_str()),
        None => (0, before.holder_id.as_str()),
    };
    if previous.is_some_and(|r| r.term < before.fencing_token)
        && recorded_holder != before.holder_id
    {
        n += 1;
    }
    if before.holder_id != holder {
        n += 1;
    }
    n
}

fn millis_since_epoch(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{LeaseEnd, PreviousHolder};

    fn handoff(holder: &str, token: u64) -> Handoff {
        Handoff {
            previous: Some(PreviousHolder {
                holder_id: holder.into(),
                fencing_token: token,
                ended: LeaseEnd::Released,
            }),
        }
    }

    #[test]
    fn a_record_round_trips_and_anything_else_is_not_one() {
        let r = Record {
            term: 7,
            transitions: 3,
            since: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            priority: -3,
            holder: "host-ä".into(),
            value: Some(Bytes::from_static(b"10.0.0.7:8080")),
        };
        assert_eq!(Record::decode(&r.encode()), Some(r.clone()));
        let none = Record {
            value: None,
            ..r.clone()
        };
        assert_eq!(Record::decode(&none.encode()), Some(none));
        let empty = Record {
            value: Some(Bytes::new()),
            ..r.clone()
        };
        assert_eq!(Record::decode(&empty.encode()), Some(empty));
        // Cut anywhere before the value (which runs to the end): not a record.
        let enc = r.encode();
        for cut in 0..=HEADER + r.holder.len() {
            assert_eq!(Record::decode(&enc[..cut]), None, "cut at {cut}");
        }
        assert_eq!(Record::decode(b"a user's own checkpoint"), None);
    }

    #[test]
    fn transitions_count_each_change_of_holder_once() {
        // The first leader.
        assert_eq!(transitions(None, &Handoff::default(), "a"), 0);
        let rec = |term, transitions, holder: &str| Record {
            term,
            transitions,
            since: UNIX_EPOCH,
            priority: 0,
            holder: holder.into(),
            value: None,
        };
        // a (term 1, 0) → b: 1; b → b again: still 1; b → a: 2.
        assert_eq!(transitions(Some(&rec(1, 0, "a")), &handoff("a", 1), "b"), 1);
        assert_eq!(transitions(Some(&rec(2, 1, "b")), &handoff("b", 2), "b"), 1);
        assert_eq!(transitions(Some(&rec(3, 1, "b")), &handoff("b", 3), "a"), 2);
        // a wrote (term 1); b led at term 2 but never wrote; c now: a→b, b→c.
        assert_eq!(transitions(Some(&rec(1, 0, "a")), &handoff("b", 2), "c"), 2);
        // a wrote (term 1), re-acquired at 2 without writing; b now: a→b.
        assert_eq!(transitions(Some(&rec(1, 0, "a")), &handoff("a", 2), "b"), 1);
        // The first leader never wrote its record: a → b counts.
        assert_eq!(transitions(None, &handoff("a", 1), "b"), 1);
    }

    #[test]
    fn a_value_over_the_limit_is_refused_naming_it() {
        assert!(check_value(&vec![0; MAX_PUBLISHED_VALUE_BYTES]).is_ok());
        let e = check_value(&vec![0; MAX_PUBLISHED_VALUE_BYTES + 1]).unwrap_err();
        assert!(e.to_string().contains("4096"), "{e}");
    }
}
