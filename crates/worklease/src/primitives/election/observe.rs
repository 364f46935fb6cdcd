//! Watching an election without campaigning (etcd `Observe`, client-go
//! `OnNewLeader`, Curator `getLeader`): who leads, the value the leader
//! publishes, its term and the transitions so far, read from the
//! election's lease and its record, with reads only.
//!
//! An observer reads the lease ([`LeaseStore::inspect`]) and, where the
//! lease carries a checkpoint, the record in it
//! ([`LeaseStore::read_checkpoint`] with the current lease's identity: a
//! read, never a renewal). It reads again when the store notifies that the
//! lease may have become free ([`LeaseStore::watch`]), when the leader's
//! lease runs out by the store's clock, and at least once per poll
//! interval. After a notification that found nobody leading, and after
//! seeing a new term whose record its leader has not written yet (it does
//! while its work starts: one round trip after the acquisition, two when
//! it reads the record handed over first), it reads again at once for a
//! millisecond (the timer's resolution), then 8 times after twice the
//! read's round trip (at least a millisecond), then doubling up to the
//! poll interval, so that the next leader (woken by the same notification)
//! is seen with its record within a few round trips instead of a poll. A
//! new term is reported with its record (value, start, priority), and
//! without one only when none came within the poll interval. A new published value during a term, and a new leader on a
//! store without notifications, are seen within one poll interval.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{FutureExt, Stream, StreamExt};
use tokio::time::Instant;

use super::record::{transitions, Record};
use super::{Clock, State};
use crate::error::{InvalidInput, Result};
use crate::limits::{HolderId, WorkId};
use crate::store::{LeaseInfo, LeaseRef, LeaseStore};

/// For how long an observer reads again at once (no timer between reads,
/// only a yield to the runtime) after it saw a new term whose record is
/// not written yet, before it waits between reads: the timer's resolution,
/// which is many round trips on a fast store; at most
/// [`MAX_IMMEDIATE_REREADS`] reads (an in-process store, a paused clock).
const IMMEDIATE_REREADS: Duration = Duration::from_millis(1);
/// The most reads of one series of immediate re-reads.
const MAX_IMMEDIATE_REREADS: u32 = 256;
/// Re-reads at a steady pace after the immediate ones, before the pace
/// doubles.
const STEADY_REREADS: u32 = 8;

/// How often an observer reads to see a new leader where no notification
/// tells it: the default of [`observe`], as [`crate::DEFAULT_POLL_INTERVAL`].
pub const DEFAULT_OBSERVE_INTERVAL: Duration = crate::lease::DEFAULT_POLL_INTERVAL;

/// Reads who leads `election` on `store` now: `Ok(None)` when nobody does
/// (never led, released, revoked, or expired by the store's judgement).
/// Two reads at most (the lease, then its record); a lease that changes
/// between them is read again.
pub(crate) async fn read_leader(
    store: &Arc<dyn LeaseStore>,
    election: &WorkId,
    clock: &Arc<dyn Clock>,
) -> Result<Option<State>> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let infos = store.inspect(std::slice::from_ref(election)).await?;
        let Some(info) = infos.into_iter().find(|i| !i.expired) else {
            return Ok(None);
        };
        match read_record(store, &info).await {
            Ok(record) => return Ok(Some(State::observed(&info, record, clock))),
            // Taken over or ended between the two reads: read the new one.
            Err(crate::Error::Fenced { .. } | crate::Error::Expired { .. }) if attempts < 3 => {}
            Err(crate::Error::Fenced { .. } | crate::Error::Expired { .. }) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
}

/// The record in the checkpoint of the lease `info` shows, if it has one.
async fn read_record(store: &Arc<dyn LeaseStore>, info: &LeaseInfo) -> Result<Option<Record>> {
    if info.checkpoint_bytes == 0 {
        return Ok(None);
    }
    let holder = HolderId::new(info.holder_id.clone())?;
    let checkpoint = store
        .read_checkpoint(LeaseRef {
            work_id: &info.work_id,
            holder_id: &holder,
            fencing_token: info.fencing_token,
        })
        .await?;
    Ok(checkpoint.data.as_deref().and_then(Record::decode))
}

/// A stream of the leaders of one election ([`observe`],
/// [`super::Elector::observe`]): first who leads now, then one item per
/// change: a new leader (term), a new published value, or nobody leading
/// (`Ok(None)`). Renewals are not changes. A store failure is an
/// `Err` item; the stream goes on reading after one poll interval. It ends
/// only when dropped, and writes nothing to the store.
pub struct Observations {
    inner: BoxStream<'static, Result<Option<State>>>,
}

impl std::fmt::Debug for Observations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observations").finish_non_exhaustive()
    }
}

impl Stream for Observations {
    type Item = Result<Option<State>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

/// Watches `election` on `store` without campaigning: see [`Observations`].
/// `poll_interval` bounds how late a change the store does not notify is
/// seen ([`DEFAULT_OBSERVE_INTERVAL`] is 2 s); reads happen at most once per
/// round trip after a notification, and once per poll interval otherwise.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use futures_util::StreamExt;
/// use worklease::{election, store::memory::MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> worklease::Result<()> {
/// let store = Arc::new(MemoryStore::new());
/// let mut leaders = election::observe(store, "scheduler", Duration::from_millis(500))?;
/// // The first item is who leads now: nobody yet.
/// assert!(leaders.next().await.expect("endless")?.is_none());
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`crate::Error::Invalid`] for an election name that is not a valid work
/// ID, or a poll interval under 1 ms.
pub fn observe(
    store: Arc<dyn LeaseStore>,
    election: impl Into<String>,
    poll_interval: Duration,
) -> Result<Observations> {
    let election = WorkId::new(election.into())?;
    if poll_interval < Duration::from_millis(1) {
        return Err(InvalidInput::Config(format!(
            "observe poll interval {poll_interval:?} must be at least 1ms"
        ))
        .into());
    }
    Ok(observations(
        store,
        election,
        poll_interval,
        Arc::new(super::SystemClock),
    ))
}

/// The stream of [`observe`] over an election name and a poll interval
/// already checked.
pub(crate) fn observations(
    store: Arc<dyn LeaseStore>,
    election: WorkId,
    poll_interval: Duration,
    clock: Arc<dyn Clock>,
) -> Observations {
    let watcher = Watcher {
        store,
        election,
        clock,
        poll_interval,
        last: None,
        wait: None,
    };
    let inner = futures_util::stream::unfold(watcher, |mut w| async move {
        let item = w.next_change().await;
        Some((item, w))
    })
    .boxed();
    Observations { inner }
}

/// What makes a change: the leader, its term, and what its record says
/// (value, start, priority, transitions), so that a record written after
/// the acquisition was first seen is reported too.
type Seen = Option<(String, u64, Option<Bytes>, Option<SystemTime>, i32, u64)>;

struct Watcher {
    store: Arc<dyn LeaseStore>,
    election: WorkId,
    clock: Arc<dyn Clock>,
    poll_interval: Duration,
    /// What the last item reported (`None` before the first).
    last: Option<Seen>,
    /// What to wait for before the next read (`None` before the first).
    wait: Option<BoxFuture<'static, ()>>,
}

impl Watcher {
    async fn next_change(&mut self) -> Result<Option<State>> {
        // Quick re-reads while a change is under way: after a notification
        // that found nobody leading (the next leader was woken by the same
        // notification), or a new term seen before its record (the new
        // leader writes it while its work starts, a round trip after its
        // acquisition, or two when it reads the record handed over first).
        let mut series: Option<Rereads> = None;
        loop {
            let notified = match self.wait.take() {
                Some(wait) => {
                    wait.await;
                    true
                }
                None => false,
            };
            // Registered before the read, so no change after it is missed.
            let woken = self.store.watch(&self.election).map(|w| w.shared());
            let started = Instant::now();
            let read = read_leader(&self.store, &self.election, &self.clock).await;
            let round_trip = started.elapsed();
            let mut next = self.poll_interval;
            if let Ok(Some(s)) = &read {
                if let Some(left) = s.expires_in {
                    // Seen free once the store's clock has passed it.
                    next = next.min(left + Duration::from_millis(1));
                }
            }
            let expecting = match &read {
                Ok(None) => notified || series.is_some(),
                Ok(Some(s)) => s.since.is_none() && !self.reported(s.generation),
                Err(_) => false,
            };
            // A new term is held back until its record comes, rather than
            // reported without its value; once the series ran out, it is
            // reported as it is (a lease taken by something else than an
            // elector).
            let mut hold_back = false;
            if expecting {
                match series
                    .get_or_insert_with(|| Rereads::from(started))
                    .next(round_trip, self.poll_interval)
                {
                    Some(delay) => {
                        next = next.min(delay);
                        hold_back = matches!(&read, Ok(Some(_)));
                    }
                    None => series = None,
                }
            } else {
                series = None;
            }
            if next.is_zero() {
                // No timer: its millisecond resolution is many round trips.
                // A yield lets the writer run where it shares this runtime.
                self.wait = None;
                tokio::task::yield_now().await;
                continue;
            }
            let sleep = tokio::time::sleep(next);
            self.wait = Some(match woken {
                Some(w) => async move {
                    tokio::select! {
                        _ = w => {}
                        _ = sleep => {}
                    }
                }
                .boxed(),
                None => sleep.boxed(),
            });
            match read {
                Err(e) => return Err(e),
                Ok(state) => {
                    let seen: Seen = state.as_ref().map(|s| {
                        (
                            s.owner.clone(),
                            s.generation,
                            s.value.clone(),
                            s.since,
                            s.priority,
                            s.transitions,
                        )
                    });
                    if !hold_back && self.last.as_ref() != Some(&seen) {
                        self.last = Some(seen);
                        return Ok(state);
                    }
                }
            }
        }
    }

    /// Whether the last item reported the term `generation`.
    fn reported(&self, generation: u64) -> bool {
        matches!(&self.last, Some(Some((_, g, ..))) if *g == generation)
    }
}

/// A series of quick re-reads: at once (no timer between reads) for
/// [`IMMEDIATE_REREADS`], at most [`MAX_IMMEDIATE_REREADS`] reads; then
/// [`STEADY_REREADS`] reads after twice the last read's round trip (at
/// least the timer's millisecond), since a busy store (woken standbys'
/// attempts queued before the new leader's record) takes a few
/// milliseconds more; then doubling up to the poll interval.
struct Rereads {
    since: Instant,
    reads: u32,
    steady: u32,
    delay: Option<Duration>,
}

impl From<Instant> for Rereads {
    fn from(since: Instant) -> Self {
        Rereads {
            since,
            reads: 0,
            steady: 0,
            delay: None,
        }
    }
}

impl Rereads {
    /// The delay before the next read (zero: at once); `None` once the
    /// series reached `limit` and is over.
    fn next(&mut self, round_trip: Duration, limit: Duration) -> Option<Duration> {
        self.reads += 1;
        if self.since.elapsed() < IMMEDIATE_REREADS && self.reads <= MAX_IMMEDIATE_REREADS {
            return Some(Duration::ZERO);
        }
        if self.steady < STEADY_REREADS {
            self.steady += 1;
            return Some((round_trip * 2).clamp(Duration::from_millis(1), limit));
        }
        let delay;
        (self.delay, delay) = doubled(self.delay, round_trip, limit);
        self.delay.map(|_| delay)
    }
}

/// The next of a series of quick re-reads: twice the last read's round
/// trip, then doubling (at least 1 ms), up to `limit`. Returns the series'
/// state (`None` once it reached `limit`) and the delay before the read.
fn doubled(
    last: Option<Duration>,
    round_trip: Duration,
    limit: Duration,
) -> (Option<Duration>, Duration) {
    let d = last
        .map_or(round_trip * 2, |d| d * 2)
        .max(Duration::from_millis(1));
    ((d < limit).then_some(d), d.min(limit))
}

impl State {
    /// The state an observer reads: the lease, and its record where the
    /// current term wrote one (until it has, no value and no start time;
    /// transitions as the leader will count them).
    fn observed(info: &LeaseInfo, record: Option<Record>, clock: &Arc<dyn Clock>) -> State {
        let (value, since, transitions, priority) = match record {
            Some(r) if r.term == info.fencing_token => {
                (r.value, Some(r.since), r.transitions, r.priority)
            }
            other => (
                None,
                None,
                transitions(other.as_ref(), &info.handoff, &info.holder_id),
                0,
            ),
        };
        State {
            owner: info.holder_id.clone(),
            generation: info.fencing_token,
            expires_at: info.expires_at,
            expires_in: info.expires_in,
            value,
            since,
            transitions,
            priority,
            clock: clock.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::election::Elector;
    use crate::store::fault::FaultStore;
    use crate::store::memory::MemoryStore;
    use crate::{AcquireOptions, Config, Leases};

    const POLL: Duration = Duration::from_millis(500);

    /// A hand-over whose new leader hears every reply 100 ms late, so
    /// that its record is written 200 ms after the store granted its
    /// lease: the observer, reading every few milliseconds after the
    /// release's notification, sees the lease long before the record and
    /// must report the term with its record, not a leader without value.
    #[tokio::test(start_paused = true)]
    async fn a_new_term_is_reported_with_its_record_when_it_comes_late() {
        let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
        let old = Leases::new(store.clone(), Config::new("old", Duration::from_secs(10)))
            .expect("config");
        let held = old
            .acquire("sched", AcquireOptions::new())
            .await
            .expect("free");
        let slow = Arc::new(FaultStore::new(store.clone()));
        slow.set_reply_delay(Duration::from_millis(100));
        let next = Elector::builder(slow, "sched", "next")
            .ttl(Duration::from_secs(10))
            .poll_interval(POLL)
            .publish("next:1")
            .build()
            .expect("valid");
        let leading =
            tokio::spawn(async move { next.lead(|l| async move { l.state().generation }).await });
        let mut seen = observe(store.clone(), "sched", POLL).expect("valid");
        let first = seen.next().await.expect("endless").expect("answers");
        assert_eq!(first.expect("old leads").owner, "old");
        // The candidate is waiting (its first attempt answered, 100 ms
        // late); the release wakes it and the observer.
        tokio::time::sleep(Duration::from_millis(300)).await;
        old.release(held).await.expect("release");
        let mut reported = Vec::new();
        loop {
            let item = seen.next().await.expect("endless").expect("answers");
            let done = item.as_ref().is_some_and(|s| s.owner == "next");
            reported.push(item);
            if done {
                break;
            }
        }
        let term = leading.await.expect("task").expect("leads");
        let last = reported.last().and_then(Option::as_ref).expect("next");
        assert_eq!(last.generation, term);
        assert_eq!(last.value.as_deref(), Some(&b"next:1"[..]), "{reported:?}");
        assert!(
            last.since.is_some(),
            "reported before its record: {reported:?}"
        );
    }
}
