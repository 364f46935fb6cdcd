//! The observation rule's bookkeeping (module docs, "The observation
//! rule"): what this adapter saw of each work ID (the handle and since
//! when), what it wrote itself as held (and when it sent that), the register
//! reads and writes that record both, and the expiry judgement from them.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::encoding::{decode_record, encode_record, Stored};
use super::{Handle, Register, RegisterError, RegisterStore};
use crate::error::{Result, StoreError};
use crate::limits::WorkId;
use crate::store::record::{Phase, Record};
use crate::store::LeaseRef;

/// How many times a read whose answer is older than what this adapter
/// already knows is made again before the call fails with a store error.
/// With a register whose reads take milliseconds (any remote one), a work
/// ID that this adapter writes again and again (a batch acquisition racing
/// single calls) makes several stale answers in a row ordinary: 3 failed
/// there with a 5 ms read delay; each retry is one more read.
const MAX_STALE_READS: usize = 16;

/// A lease this adapter wrote as held.
pub(super) struct OwnWrite {
    fencing_token: u64,
    holder_id: String,
    sent: Instant,
    ttl: Duration,
}

/// What this adapter knows of a work ID's current version.
pub(super) struct Observation {
    handle: Handle,
    since: Instant,
    /// The number of the call whose answer this is. An answer to an older
    /// call (a read that was slow to return) never replaces it: otherwise a
    /// stale read would restart the observation of a newer version, and a
    /// holder could renew a lease this adapter should count as expired.
    call: u64,
    /// The fencing token of the version. Tokens of a work ID only go up, so
    /// an answer with a lower one is stale whatever its call's number (a
    /// read sent after one of this adapter's writes was sent can still be
    /// answered from before that write landed).
    fencing_token: Option<u64>,
}

/// A decoded record as read, with its handle and how long it has been seen.
pub(super) struct Current {
    pub(super) stored: Stored,
    pub(super) handle: Handle,
    pub(super) observed: Duration,
}

impl<R: Register> RegisterStore<R> {
    /// Locks `mutex`; a lock an earlier panic poisoned fails the call with
    /// a store error naming it (`what`).
    fn locked<'a, T>(&self, mutex: &'a Mutex<T>, what: &str) -> Result<MutexGuard<'a, T>> {
        mutex.lock().map_err(|_| {
            StoreError::new(
                self.register.kind(),
                format!("{what} lock poisoned by an earlier panic"),
            )
            .into()
        })
    }

    fn seen(&self) -> Result<MutexGuard<'_, HashMap<WorkId, Observation>>> {
        self.locked(&self.seen, "observation")
    }

    /// The number of a call about to be sent.
    fn next_call(&self) -> u64 {
        self.calls.fetch_add(1, Ordering::SeqCst)
    }

    /// Notes the answer of call number `call`: `handle` is current (or the
    /// value is absent, `None`), as seen since `since`. Returns for how long
    /// this adapter has seen the answer's version unchanged (zero for a
    /// version new to it), or `None` for the stale answer of a call older
    /// than what the adapter already knows of another version: it changes
    /// nothing, and says nothing about the lease now (a holder must not
    /// judge its own lease live from it).
    fn observe(
        &self,
        work_id: &WorkId,
        handle: Option<&Handle>,
        fencing_token: Option<u64>,
        call: u64,
        since: Instant,
    ) -> Result<Option<Duration>> {
        let now = Instant::now();
        let mut seen = self.seen()?;
        match seen.get_mut(work_id) {
            // The same version: it has existed at least since the earliest
            // sighting. Every sighting is at or after the send of the write
            // that made it (a read's reply, or our own write's send), so the
            // earliest keeps contenders safe and lets a holder judge its own
            // expiry exactly.
            Some(o) if Some(&o.handle) == handle => {
                o.since = o.since.min(since);
                o.call = o.call.max(call);
                Ok(Some(now.saturating_duration_since(o.since)))
            }
            // A stale answer about another version: newer knowledge stays.
            Some(o) if o.call > call => Ok(None),
            // An older token than one already seen: stale too.
            Some(Observation {
                fencing_token: Some(known),
                ..
            }) if fencing_token.is_some_and(|t| t < *known) => Ok(None),
            _ => {
                match handle {
                    Some(h) => {
                        let handle = h.clone();
                        seen.insert(
                            work_id.clone(),
                            Observation {
                                handle,
                                since,
                                call,
                                fencing_token,
                            },
                        );
                    }
                    None => {
                        seen.remove(work_id);
                    }
                }
                Ok(Some(now.saturating_duration_since(since)))
            }
        }
    }

    /// Reads and decodes the record of `work_id`, observing its handle. The
    /// observation starts after the read returned: never before the write
    /// that made the handle was sent.
    ///
    /// A read whose answer is older than what the adapter already knows (a
    /// slow read that overlapped a newer write) is made again, up to
    /// [`MAX_STALE_READS`] times: its stale version must not be judged.
    pub(super) async fn load(&self, work_id: &WorkId) -> Result<Option<Current>> {
        for _ in 0..MAX_STALE_READS {
            if let Some(current) = self.load_once(work_id).await? {
                return Ok(current);
            }
        }
        Err(self.error(
            work_id,
            "the register kept answering with a version older than one this adapter has seen",
        ))
    }

    /// One read: `None` when its answer was stale.
    async fn load_once(&self, work_id: &WorkId) -> Result<Option<Option<Current>>> {
        let call = self.next_call();
        let read = match self.register.read(work_id).await {
            Ok(read) => read,
            Err(RegisterError::Store(e)) => return Err(e.into()),
            Err(RegisterError::Invalid(e)) => return Err(e.into()),
            Err(RegisterError::Conflict) => {
                return Err(self.error(work_id, "register reported a conflict on a read"))
            }
        };
        let Some((bytes, handle)) = read else {
            return Ok(self
                .observe(work_id, None, None, call, Instant::now())?
                .map(|_| None));
        };
        let stored = decode_record(&bytes).map_err(|why| {
            self.error(
                work_id,
                &format!("cannot decode the stored lease record: {why}"),
            )
        })?;
        let token = Some(stored.record.fencing_token);
        let Some(observed) = self.observe(work_id, Some(&handle), token, call, Instant::now())?
        else {
            return Ok(None);
        };
        Ok(Some(Some(Current {
            stored,
            handle,
            observed,
        })))
    }

    /// Writes `record` over `current`'s handle. `Some(wall clock at the
    /// write)` on success, `None` on a lost compare-and-swap.
    pub(super) async fn put(
        &self,
        work_id: &WorkId,
        current: Option<&Current>,
        record: Record,
    ) -> Result<Option<SystemTime>> {
        let wall = SystemTime::now();
        let own = (record.phase == Phase::Held).then(|| OwnWrite {
            fencing_token: record.fencing_token,
            holder_id: record.holder_id.clone(),
            sent: Instant::now(),
            ttl: Duration::from_millis(record.ttl_ms),
        });
        let stored = Stored {
            writes: current.map_or(0, |c| c.stored.writes).wrapping_add(1),
            written_at_ms: unix_ms(wall),
            record,
        };
        // An acquisition (a new token) goes through `write_acquisition`,
        // which raises a register's fencing floor in the same step.
        let token = stored.record.fencing_token;
        let acquisition = current.is_none_or(|c| c.stored.record.fencing_token != token);
        let bytes = encode_record(&stored).map_err(|why| self.error(work_id, &why))?;
        let call = self.next_call();
        let sent = Instant::now();
        let previous = current.map(|c| &c.handle);
        let written = if acquisition {
            self.register
                .write_acquisition(work_id, previous, bytes, token)
                .await
        } else {
            self.register.write(work_id, previous, bytes).await
        };
        match written {
            Ok(handle) => {
                // Our own write: observed since it was sent (module docs).
                self.observe(work_id, Some(&handle), Some(token), call, sent)?;
                let mut mine = self.own()?;
                match own {
                    Some(o) => mine.insert(work_id.clone(), OwnWrite { sent, ..o }),
                    None => mine.remove(work_id),
                };
                Ok(Some(wall))
            }
            Err(RegisterError::Conflict) => Ok(None),
            Err(RegisterError::Store(e)) => Err(e.into()),
            Err(RegisterError::Invalid(e)) => Err(e.into()),
        }
    }

    fn own(&self) -> Result<MutexGuard<'_, HashMap<WorkId, OwnWrite>>> {
        self.locked(&self.own, "own-writes")
    }

    /// Whether `lease` counts as unexpired for an operation of its holder:
    /// by this adapter's own last write of it when there is one (send time +
    /// TTL, the holder's own count), else by the observation rule (a token
    /// from another process).
    pub(super) fn unexpired_for(&self, lease: LeaseRef<'_>, current: &Current) -> Result<bool> {
        let own = self.own()?;
        match own.get(lease.work_id) {
            Some(o)
                if o.fencing_token == lease.fencing_token
                    && o.holder_id == lease.holder_id.as_str() =>
            {
                Ok(Instant::now() < o.sent + o.ttl)
            }
            _ => Ok(judge(&current.stored.record, current.observed).0),
        }
    }
}

/// Whether a record is unexpired by this adapter's observation, and the
/// upper bound of its time left.
pub(super) fn judge(r: &Record, observed: Duration) -> (bool, Duration) {
    let ttl = Duration::from_millis(r.ttl_ms);
    (observed < ttl, ttl.saturating_sub(observed))
}

/// A TTL in whole milliseconds, rounded up so the store never expires a
/// lease before the holder's own deadline.
fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
