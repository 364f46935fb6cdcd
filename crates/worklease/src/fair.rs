//! Fair waiting ([`AcquireOptions::fair`]): waiters of a lease or of a
//! semaphore's permits are served in the order they arrived, on every
//! store, built from leases and checkpoints only (ADR 0015).
//!
//! The queue of a target `T` (the work ID of a lease, or the name of a
//! semaphore) is two kinds of leases next to it:
//! * `T/fair-queue`, held for a moment by each arriving waiter, like a
//!   mutex: its checkpoint lists the tickets of the waiters before it, and
//!   its fencing token (strictly increasing, S2) is the arriving waiter's
//!   ticket. **Arrival** is the moment a waiter holds this lease.
//! * `T/fair-waiter/<ticket>`, one per waiter, held (and renewed by the
//!   handle's session) while it waits: a waiter that dies, or whose
//!   process is cut off, leaves the queue when that lease expires, within
//!   its TTL; one that gives up or is served releases it at once.
//!
//! A fair acquisition: take `T/fair-queue` (waiting for it: it is held for
//! a few round trips at a time), read the tickets, keep those whose waiter
//! lease is live (one `inspect`). If none is left, try the target at once
//! (fast path: nobody is ahead) and, when it is free, take it before
//! letting the queue lease go. Otherwise take `T/fair-waiter/<ticket>`,
//! write the tickets with its own appended, release the queue lease, and
//! wait until no waiter before it is live (woken by the store's
//! notifications of their release, by the earliest expiry among them, or
//! by the poll interval); then acquire the target as an unfair waiter
//! would (only later waiters, who wait for it, and unfair acquirers
//! compete), and release its waiter lease.
//!
//! The order is strict among fair waiters; acquirers that do not ask for
//! fairness are not queued and may take a free lease or permit before a
//! queued waiter. Waiters arriving at the same moment are ordered by who
//! takes the queue lease first. Cost: the fast path is one round trip for
//! the queue lease, a checkpoint read, the target's acquisition and the
//! queue lease's release (four, plus an `inspect` when the queue is not
//! empty); a queued waiter adds its waiter lease, a checkpoint write, an
//! `inspect` per wake-up and the release of its waiter lease.

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::time::Instant;

use crate::acquire::WaitEnd;
use crate::error::{Error, InvalidInput, Result};
use crate::lease::{AcquireOptions, Leases};
use crate::limits::{WorkId, MAX_WORK_ID_BYTES};
use crate::renewal::{Renewal, RenewalOptions};
use crate::store::{LeaseInfo, LeaseStore};
use crate::token::Token;

/// The suffix of a target's queue lease.
pub const QUEUE_SUFFIX: &str = "/fair-queue";

/// What follows a target in its waiters' lease work IDs
/// (`T/fair-waiter/<ticket>`).
pub const WAITER_INFIX: &str = "/fair-waiter/";

/// The work IDs of the queue of `target`.
struct Queue {
    lease: WorkId,
    target: String,
}

impl Queue {
    fn new(target: &str) -> Result<Self> {
        // A ticket is a u64: at most 20 digits.
        let longest = target.len() + WAITER_INFIX.len().max(QUEUE_SUFFIX.len()) + 20;
        if longest > MAX_WORK_ID_BYTES {
            return Err(InvalidInput::Config(format!(
                "{target:?} is too long for fair waiting: its queue's work IDs \
                 ({target}{WAITER_INFIX}TICKET) are up to {longest} bytes, the limit is {MAX_WORK_ID_BYTES}"
            ))
            .into());
        }
        Ok(Self {
            lease: WorkId::new(format!("{target}{QUEUE_SUFFIX}"))?,
            target: target.to_string(),
        })
    }

    fn waiter(&self, ticket: u64) -> Result<WorkId> {
        Ok(WorkId::new(format!(
            "{}{WAITER_INFIX}{ticket}",
            self.target
        ))?)
    }
}

/// The tickets a queue lease's checkpoint lists: one decimal per line.
fn decode(data: Option<&Bytes>) -> Vec<u64> {
    let Some(data) = data else {
        return Vec::new();
    };
    let tickets: Option<Vec<u64>> = std::str::from_utf8(data)
        .ok()
        .map(|text| text.lines().map(|l| l.parse().ok()).collect())
        .unwrap_or(None);
    tickets.unwrap_or_else(|| {
        // Not ours (written by hand, or by another program): the queue
        // starts again; only the order of the waiters in it is lost.
        tracing::warn!("a fair queue's checkpoint could not be read: starting the queue again");
        Vec::new()
    })
}

fn encode(tickets: &[u64]) -> Bytes {
    let mut out = String::with_capacity(tickets.len() * 8);
    for t in tickets {
        out.push_str(&t.to_string());
        out.push('\n');
    }
    Bytes::from(out)
}

/// What a fair acquisition holds along the way; dropped early (the caller
/// gave up on the future), it lets go of both in the background so that
/// nobody waits for them until their TTL.
struct Hold {
    leases: Leases,
    /// The queue lease, renewed while held (on a slow store the steps in
    /// it may take longer than a TTL).
    queue: Option<Renewal>,
    waiter: Option<Renewal>,
}

impl Hold {
    /// The queue lease's latest token, if it is still ours.
    fn queue_token(&self) -> Result<Token> {
        match &self.queue {
            Some(r) => r.ensure_live(),
            None => {
                Err(crate::error::StoreError::new("fair", "the queue lease is not held").into())
            }
        }
    }

    async fn release_queue(&mut self) -> Result<()> {
        match self.queue.take() {
            Some(q) => self.leases.release(q.stop().await?).await,
            None => Ok(()),
        }
    }

    async fn leave(&mut self) {
        if let Some(w) = self.waiter.take() {
            match w.stop().await {
                Ok(t) => {
                    if let Err(e) = self.leases.release(t).await {
                        tracing::debug!(error = %e, "could not release a fair waiter's lease: it expires");
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "a fair waiter's lease was lost while it waited")
                }
            }
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let (queue, waiter) = (self.queue.take(), self.waiter.take());
        if queue.is_none() && waiter.is_none() {
            return;
        }
        let leases = self.leases.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let mut held = Hold {
                    leases,
                    queue,
                    waiter,
                };
                let _ = held.release_queue().await;
                held.leave().await;
            });
        }
    }
}

/// How a fair acquisition tries its target (a lease, or any permit of a
/// semaphore) with the given options.
pub(crate) type TryTarget<'a> =
    Box<dyn Fn(AcquireOptions) -> BoxFuture<'a, Result<Token>> + Send + Sync + 'a>;

impl Leases {
    /// A fair acquisition of `target` (see the module docs): `try_target`
    /// acquires it with the options it is given (never fair ones).
    pub(crate) async fn acquire_fair(
        &self,
        target: &str,
        options: AcquireOptions,
        try_target: TryTarget<'_>,
    ) -> Result<Token> {
        let queue = Queue::new(target)?;
        // One wait timeout for the whole acquisition: the queue lease, the
        // turn and the target share it.
        let give_up_at = options
            .wait_timeout
            .and_then(|t| Instant::now().checked_add(t));
        let unfair = |options: &AcquireOptions| AcquireOptions {
            fair: false,
            wait_timeout: give_up_at.map(|t| t.saturating_duration_since(Instant::now())),
            ..options.clone()
        };
        // The queue lease is a mutex held for a few round trips: wait for
        // it even when the caller fails fast.
        let mut queue_options = unfair(&options).wait_for_lease();
        queue_options.poll_interval = options.poll_interval.min(Duration::from_millis(250));
        let q = self
            .acquire_first(std::slice::from_ref(&queue.lease), queue_options)
            .await?;
        let ticket = q.fencing_token();
        let listed = decode(self.read_checkpoint(&q).await?.data.as_ref());
        let mut held = Hold {
            leases: self.clone(),
            queue: Some(self.start_renewal(q, RenewalOptions::new())?),
            waiter: None,
        };
        let ahead = self.live_waiters(&queue, &listed).await?;
        if ahead.is_empty() {
            match try_target(AcquireOptions {
                wait: false,
                ..unfair(&options)
            })
            .await
            {
                Ok(token) => {
                    if listed.len() != ahead.len() {
                        if let Ok(q) = held.queue_token() {
                            let _ = self.checkpoint(&q, encode(&ahead)).await;
                        }
                    }
                    held.release_queue().await?;
                    return Ok(token);
                }
                Err(e @ (Error::Held { .. } | Error::PermitsHeld { .. })) if !options.wait => {
                    held.release_queue().await?;
                    return Err(e);
                }
                Err(Error::Held { .. } | Error::PermitsHeld { .. }) => {}
                Err(e) => return Err(e),
            }
        } else if !options.wait {
            held.release_queue().await?;
            return Err(Error::WaitersAhead {
                target: target.to_string(),
                waiters: ahead.len(),
            });
        }
        // Join the queue.
        let mine = self
            .acquire_first(&[queue.waiter(ticket)?], AcquireOptions::new())
            .await?;
        held.waiter = Some(self.start_renewal(mine, RenewalOptions::new())?);
        let mut listed = ahead.clone();
        listed.push(ticket);
        self.checkpoint(&held.queue_token()?, encode(&listed))
            .await?;
        held.release_queue().await?;
        tracing::debug!(target, ticket, ahead = ahead.len(), "joined a fair queue");

        self.wait_for_turn(&queue, ahead, &options, give_up_at)
            .await?;
        let result = match try_target(unfair(&options)).await {
            // The wait's timeout is the caller's whole one.
            Err(Error::WaitTimedOut { work_id, .. }) => Err(Error::WaitTimedOut {
                work_id,
                waited: options.wait_timeout.unwrap_or_default(),
            }),
            other => other,
        };
        held.leave().await;
        result
    }

    /// The tickets of `listed` whose waiter lease is live, in order.
    async fn live_waiters(&self, queue: &Queue, listed: &[u64]) -> Result<Vec<u64>> {
        Ok(self.waiter_infos(queue, listed).await?.0)
    }

    /// The live tickets of `listed` and their leases.
    async fn waiter_infos(
        &self,
        queue: &Queue,
        listed: &[u64],
    ) -> Result<(Vec<u64>, Vec<LeaseInfo>)> {
        if listed.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let ids = listed
            .iter()
            .map(|t| queue.waiter(*t))
            .collect::<Result<Vec<_>>>()?;
        let infos: Vec<LeaseInfo> = self
            .store()
            .inspect(&ids)
            .await?
            .into_iter()
            .filter(|i| !i.expired)
            .collect();
        let live = listed
            .iter()
            .zip(&ids)
            .filter(|(_, id)| infos.iter().any(|i| &i.work_id == *id))
            .map(|(t, _)| *t)
            .collect();
        Ok((live, infos))
    }

    /// Waits until no waiter of `ahead` is live any more, or `give_up_at`
    /// (the acquisition's wait timeout) passes.
    async fn wait_for_turn(
        &self,
        queue: &Queue,
        mut ahead: Vec<u64>,
        options: &AcquireOptions,
        give_up_at: Option<Instant>,
    ) -> Result<()> {
        loop {
            // Watch before looking, so a release in between still wakes us.
            let watches: Vec<_> = ahead
                .iter()
                .filter_map(|t| queue.waiter(*t).ok())
                .filter_map(|id| self.store().watch(&id))
                .collect();
            let (live, infos) = self.waiter_infos(queue, &ahead).await?;
            if live.is_empty() {
                return Ok(());
            }
            ahead = live;
            let expires_in = infos.iter().filter_map(|i| i.expires_in).min();
            match crate::acquire::nap(options, expires_in, watches, give_up_at).await {
                Ok(()) => {}
                Err(WaitEnd::Cancelled) => {
                    return Err(Error::Cancelled {
                        work_id: queue.target.clone(),
                    })
                }
                Err(WaitEnd::TimedOut) => {
                    return Err(Error::WaitTimedOut {
                        work_id: queue.target.clone(),
                        waited: options.wait_timeout.unwrap_or_default(),
                    })
                }
            }
        }
    }

    /// The fair waiters of `target` now, in arrival order ([`waiters`]).
    ///
    /// # Errors
    /// As [`waiters`].
    pub async fn fair_waiters(&self, target: &str) -> Result<Vec<LeaseInfo>> {
        waiters(self.store().as_ref(), target).await
    }
}

/// The fair waiters of `target` (a work ID, or a semaphore's name) that
/// are waiting now, in arrival order: their waiter leases
/// (`T/fair-waiter/<ticket>`), as the store lists them. Lists the whole
/// store (`inspect` of every work ID): a call for operators (`worklease
/// status`) and tests, not for a hot path.
///
/// # Errors
/// [`Error::Invalid`] for a target too long for fair waiting;
/// [`Error::Store`] when the store fails.
pub async fn waiters(store: &dyn LeaseStore, target: &str) -> Result<Vec<LeaseInfo>> {
    Queue::new(target)?;
    let prefix = format!("{target}{WAITER_INFIX}");
    let mut waiting: Vec<(u64, LeaseInfo)> = store
        .inspect(&[])
        .await?
        .into_iter()
        .filter(|i| !i.expired)
        .filter_map(|i| {
            let ticket = i.work_id.as_str().strip_prefix(&prefix)?.parse().ok()?;
            Some((ticket, i))
        })
        .collect();
    waiting.sort_by_key(|(t, _)| *t);
    Ok(waiting.into_iter().map(|(_, i)| i).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_round_trip_and_garbage_starts_the_queue_again() {
        let t = vec![3, 17, u64::MAX];
        assert_eq!(decode(Some(&encode(&t))), t);
        assert_eq!(decode(None), Vec::<u64>::new());
        assert_eq!(
            decode(Some(&Bytes::from_static(b"3\nx\n"))),
            Vec::<u64>::new()
        );
        assert_eq!(
            decode(Some(&Bytes::from_static(b"\xff"))),
            Vec::<u64>::new()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_fair_wait_times_out_once_and_leaves_the_line() {
        use crate::store::memory::MemoryStore;
        use crate::Config;
        use std::sync::Arc;
        let store = Arc::new(MemoryStore::new());
        let ttl = Duration::from_secs(10);
        let a = Leases::new(store.clone(), Config::new("a", ttl)).expect("config");
        let b = Leases::new(store.clone(), Config::new("b", ttl)).expect("config");
        let held = a
            .acquire("t", AcquireOptions::new())
            .await
            .expect("acquire");
        let _kept = a
            .start_renewal(held, RenewalOptions::new())
            .expect("renewal");
        let timeout = Duration::from_secs(3);
        let started = Instant::now();
        let options = AcquireOptions::new()
            .fair()
            .wait_for_lease()
            .poll_interval(Duration::from_millis(500))
            .wait_timeout(timeout);
        match b.acquire("t", options).await {
            Err(Error::WaitTimedOut { waited, .. }) => assert_eq!(waited, timeout),
            other => panic!("expected WaitTimedOut, got {other:?}"),
        }
        let waited = started.elapsed();
        assert!(
            waited >= timeout && waited < timeout + Duration::from_secs(1),
            "one timeout for the whole fair wait: {waited:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            a.fair_waiters("t").await.expect("waiters").is_empty(),
            "the waiter left the line"
        );
    }

    #[test]
    fn a_target_too_long_for_its_queue_names_the_limit() {
        let e = Queue::new(&"x".repeat(MAX_WORK_ID_BYTES - 10))
            .err()
            .expect("too long")
            .to_string();
        assert!(
            e.contains(&format!("the limit is {MAX_WORK_ID_BYTES}")),
            "{e}"
        );
    }
}
