//! Run once: remember, with the lease, that a work ID's job finished, so
//! that a late or clock-skewed cron on another host does not run it again
//! (`worklease run --once`, issue 37, ADR 0024).
//!
//! The record of work ID `W` is the lease on `W/finished` (reserved:
//! [`crate::is_internal_work_id`]), acquired and released by the holder of
//! `W` **while it still holds `W`**, with the holder ID
//! `<fencing token of W>/<finisher's token>/<finish time, ms>/<finisher>`:
//! two store round trips, on every
//! store, with nothing but the lease operations of the contract. `W` is
//! **finished** for an acquisition of `W` exactly when the record names the
//! acquisition just before it (its [`crate::Handoff`]'s previous fencing
//! token). So:
//!
//! * a job that ran to success under `--once` and recorded it makes the
//!   next `--once` skip; that skip records itself (the chain goes on), so a
//!   third late cron skips too;
//! * any acquisition of `W` that records nothing (a run without `--once`,
//!   a failed child, a lost lease) breaks the chain: the next `--once` runs;
//! * the record is written while `W` is held, and read while `W` is held,
//!   so two hosts cannot both judge `W` unfinished after it finished (S1 on
//!   `W` orders them). A holder that loses `W` between its job's end and the
//!   record (a store outage at that moment) leaves no record: the job may
//!   run again, as after any failure. The record never makes a job skip
//!   that did not finish.
//!
//! Fencing tokens never go down (S2), so an old record cannot name a later
//! acquisition: deleting `W/finished` ([`crate::LeaseStore`] clean-up)
//! only makes the next `--once` run.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::error::{Error, InvalidInput, Result};
use crate::internal::FINISHED_SUFFIX;
use crate::lease::{AcquireOptions, Config, Leases};
use crate::limits::{WorkId, MAX_WORK_ID_BYTES};
use crate::store::LeaseStore;
use crate::token::Token;

/// The TTL of the record's own lease (held for one round trip).
const RECORD_TTL: Duration = Duration::from_secs(10);

/// A work ID's run-once record: who finished its job, and the acquisition
/// the record names (the finisher's, or the last one that skipped it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The fencing token of the acquisition the record names: the next
    /// acquisition of the work ID skips the job when it follows this one.
    pub fencing_token: u64,
    /// The fencing token of the acquisition whose holder ran the job to
    /// success.
    pub finished_token: u64,
    /// That holder (carried unchanged by the skips after it).
    pub holder_id: String,
    /// When it finished, by its own wall clock (informational).
    pub at: SystemTime,
}

impl Finished {
    /// The record's holder ID: every fact of the record.
    fn holder(&self) -> String {
        let ms = self
            .at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        format!(
            "{}/{}/{ms}/{}",
            self.fencing_token, self.finished_token, self.holder_id
        )
    }

    /// The record a holder ID written by [`Finished::holder`] holds.
    fn parse(holder: &str) -> Option<Self> {
        let mut parts = holder.splitn(4, '/');
        let fencing_token = parts.next()?.parse().ok()?;
        let finished_token = parts.next()?.parse().ok()?;
        let ms: u64 = parts.next()?.parse().ok()?;
        let holder_id = parts.next()?.to_string();
        Some(Self {
            fencing_token,
            finished_token,
            holder_id,
            at: SystemTime::UNIX_EPOCH + Duration::from_millis(ms),
        })
    }
}

/// The work ID of `work_id`'s run-once record (`W/finished`).
///
/// # Errors
/// [`Error::Invalid`] when `work_id` is worklease's own or too long to
/// carry the suffix (at most [`MAX_WORK_ID_BYTES`] − 9 bytes).
pub fn record_id(work_id: &WorkId) -> Result<WorkId> {
    crate::internal::user_work_id(work_id.as_str())?;
    let id = format!("{work_id}{FINISHED_SUFFIX}");
    if id.len() > MAX_WORK_ID_BYTES {
        return Err(InvalidInput::Config(format!(
            "work ID is {} bytes: run once allows at most {} bytes (its record is the work ID \
             W{FINISHED_SUFFIX}, at most {MAX_WORK_ID_BYTES} bytes)",
            work_id.as_str().len(),
            MAX_WORK_ID_BYTES - FINISHED_SUFFIX.len()
        ))
        .into());
    }
    Ok(WorkId::new(id)?)
}

/// The most bytes a record adds to its finisher's holder ID: two fencing
/// tokens, a time in milliseconds and three `/`.
const RECORD_OVERHEAD: usize = 3 * 20 + 3;

/// Checks, before anything runs, that a finish of `work_id`'s job by
/// `holder_id` can be recorded: so that `run --once` refuses at once what
/// it could not record after the job ran.
///
/// # Errors
/// [`Error::Invalid`] naming the limit: `work_id` is worklease's own or
/// over [`MAX_WORK_ID_BYTES`] − 9 bytes ([`record_id`]), or `holder_id`
/// is over [`crate::limits::MAX_HOLDER_ID_BYTES`] − 63 bytes.
pub fn check(work_id: &WorkId, holder_id: &str) -> Result<()> {
    record_id(work_id)?;
    let max = crate::limits::MAX_HOLDER_ID_BYTES - RECORD_OVERHEAD;
    if holder_id.len() > max {
        return Err(InvalidInput::Config(format!(
            "holder ID is {} bytes: run once allows at most {max} bytes (its record carries the \
             holder ID with two fencing tokens and a time, at most {} bytes)",
            holder_id.len(),
            crate::limits::MAX_HOLDER_ID_BYTES
        ))
        .into());
    }
    Ok(())
}

/// Reads `work_id`'s run-once record: one store round trip
/// ([`LeaseStore::inspect`]); `None` when there is none.
///
/// # Errors
/// [`Error::Invalid`] as for [`record_id`]; [`Error::Store`] when the
/// store fails.
pub async fn read_record(
    store: &Arc<dyn LeaseStore>,
    work_id: &WorkId,
) -> Result<Option<Finished>> {
    let id = record_id(work_id)?;
    let info = store.inspect(std::slice::from_ref(&id)).await?;
    Ok(info
        .into_iter()
        .find(|i| i.work_id == id)
        .and_then(|i| Finished::parse(&i.holder_id)))
}

/// Whether the job of `token`'s work ID finished in the acquisition just
/// before `token`'s, whose fencing token is `previous` (from the hand-off
/// of `token`'s acquisition; `None` on a first acquisition). Returns the
/// record when it did. Call it while holding `token`.
///
/// # Errors
/// As [`read_record`].
pub async fn finished_before(
    store: &Arc<dyn LeaseStore>,
    token: &Token,
    previous: Option<u64>,
) -> Result<Option<Finished>> {
    let Some(previous) = previous else {
        return Ok(None);
    };
    Ok(read_record(store, token.work_id())
        .await?
        .filter(|record| record.fencing_token == previous))
}

/// Records that the holder of `token` finished its work ID's job, or, with
/// `carried` (the record a skip found), carries that record on to
/// `token`'s acquisition, keeping who finished and when. Call it while
/// `token`'s lease is live, before releasing it. Two store round trips;
/// it waits up to 10 seconds (the record lease's TTL) while another holder's record is being
/// written (only a holder that lost the work ID could be writing one).
///
/// # Errors
/// [`Error::Invalid`] as for [`record_id`] or a holder ID too long to
/// carry the record (over [`crate::limits::MAX_HOLDER_ID_BYTES`] less up to
/// 56 bytes); [`Error::WaitTimedOut`] when another record stayed
/// held; [`Error::Store`] when the store fails. Nothing is recorded then:
/// the next run once runs the job.
pub async fn record_finished(
    store: &Arc<dyn LeaseStore>,
    token: &Token,
    carried: Option<&Finished>,
) -> Result<()> {
    let id = record_id(token.work_id())?;
    let record = match carried {
        Some(found) => Finished {
            fencing_token: token.fencing_token(),
            ..found.clone()
        },
        None => Finished {
            fencing_token: token.fencing_token(),
            finished_token: token.fencing_token(),
            holder_id: token.holder_id().to_string(),
            at: SystemTime::now(),
        },
    };
    let holder = record.holder();
    let leases = Leases::new(store.clone(), Config::new(holder, RECORD_TTL))?;
    let wait = AcquireOptions::new()
        .wait_for_lease()
        .wait_timeout(RECORD_TTL + Duration::from_secs(1));
    // The record's work ID is reserved: not through `acquire`, which
    // refuses it to users.
    let record = leases
        .acquire_first(std::slice::from_ref(&id), wait)
        .await?;
    match leases.release(record).await {
        // Released or not, the acquisition is the record: a release that
        // failed leaves it to expire, which changes nothing it says.
        Ok(()) | Err(Error::Expired { .. } | Error::Fenced { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    fn store() -> Arc<dyn LeaseStore> {
        Arc::new(MemoryStore::new())
    }

    async fn acquire(
        store: &Arc<dyn LeaseStore>,
        w: &str,
        holder: &str,
    ) -> (Leases, Token, Option<u64>) {
        let leases =
            Leases::new(store.clone(), Config::new(holder, Duration::from_secs(10))).unwrap();
        let token = leases.acquire(w, AcquireOptions::new()).await.unwrap();
        let previous = leases
            .read_checkpoint(&token)
            .await
            .unwrap()
            .handoff
            .previous
            .map(|p| p.fencing_token);
        (leases, token, previous)
    }

    #[tokio::test]
    async fn a_recorded_finish_is_seen_by_the_next_acquisition_only() {
        let s = store();
        let (l, t, prev) = acquire(&s, "nightly", "a").await;
        assert_eq!(finished_before(&s, &t, prev).await.unwrap(), None);
        record_finished(&s, &t, None).await.unwrap();
        l.release(t.clone()).await.unwrap();

        let (l2, t2, prev2) = acquire(&s, "nightly", "b").await;
        let rec = finished_before(&s, &t2, prev2)
            .await
            .unwrap()
            .expect("finished");
        assert_eq!(
            (rec.fencing_token, rec.holder_id.as_str()),
            (t.fencing_token(), "a")
        );
        // A skip carries the record on, keeping who finished: a third
        // acquisition sees "a" too.
        record_finished(&s, &t2, Some(&rec)).await.unwrap();
        l2.release(t2).await.unwrap();
        let (l3, t3, prev3) = acquire(&s, "nightly", "c").await;
        let carried = finished_before(&s, &t3, prev3)
            .await
            .unwrap()
            .expect("carried");
        assert_eq!(
            (
                carried.finished_token,
                carried.holder_id.as_str(),
                carried.at
            ),
            (rec.finished_token, "a", rec.at)
        );
        // An acquisition that records nothing breaks the chain.
        l3.release(t3).await.unwrap();
        let (_, t4, prev4) = acquire(&s, "nightly", "d").await;
        assert_eq!(finished_before(&s, &t4, prev4).await.unwrap(), None);
    }

    #[test]
    fn the_record_is_reserved_and_long_work_ids_are_refused() {
        assert!(crate::is_internal_work_id("nightly/finished"));
        let long = WorkId::new("x".repeat(MAX_WORK_ID_BYTES)).unwrap();
        let e = record_id(&long).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{}", MAX_WORK_ID_BYTES - FINISHED_SUFFIX.len())),
            "{e}"
        );
    }
}
