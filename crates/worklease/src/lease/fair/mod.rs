//! Fair waiting ([`AcquireOptions::fair`]): waiters of a lease or of a
//! semaphore's permits are served in the order they arrived, on every
//! store, built from leases and checkpoints only (ADR 0015).
//!
//! The queue of a target `T` (the work ID of a lease, or the name of a
//! semaphore) is two kinds of leases next to it:
//! * `T/fair-queue`, held for a moment by each arriving waiter, like a
//!   mutex: its checkpoint is the line, the waiters in arrival order.
//!   **Arrival** is the moment a waiter holds this lease.
//! * `T/fair-waiter/<slot>`, one per waiter in line, held (and renewed by
//!   the handle's session) while it waits: a waiter that dies, or whose
//!   process is cut off, leaves the line when that lease expires, within
//!   its TTL; one that gives up or is served releases it at once. A slot
//!   is used again by a later waiter once free, so the store keeps one
//!   record per slot (as many as waiters were ever in line at once), not
//!   one per wait; the line names each waiter by slot and the fencing
//!   token of its waiter lease, so a slot used again is never taken for
//!   the waiter that left it.
//!
//! A fair acquisition: take `T/fair-queue` (waiting for it: it is held for
//! a few round trips at a time), read the line, keep the waiters whose
//! waiter lease is live (one `inspect`). If none is left, try the target at
//! once (fast path: nobody is ahead) and, when it is free, take it before
//! letting the queue lease go. Otherwise take the lowest free slot's
//! waiter lease, write the line with itself at the end, release the queue
//! lease, and wait until no waiter before it is live: it watches the one
//! just before it (woken by the store's notification of its release, by
//! its expiry, or by the poll interval) and looks at the others again
//! when that one left, so a release wakes one waiter, not the whole line;
//! then acquire the target as an unfair waiter would (only later waiters,
//! who wait for it, and unfair acquirers compete), and release its waiter
//! lease.
//!
//! The order is strict among fair waiters; acquirers that do not ask for
//! fairness are not queued and may take a free lease or permit before a
//! queued waiter. Waiters arriving at the same moment are ordered by who
//! takes the queue lease first. Cost: the fast path is one round trip for
//! the queue lease, a checkpoint read, the target's acquisition and the
//! queue lease's release (four, plus an `inspect` when the queue is not
//! empty); a queued waiter adds its waiter lease, a checkpoint write, an
//! `inspect` per wake-up (of the waiter just before it, or of all before
//! it once that one left) and the release of its waiter lease.

use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::lease::acquire::{WaitEnd, Woken};
use crate::lease::renewal::RenewalOptions;
use crate::lease::{AcquireOptions, Leases};
use crate::store::{Handoff, LeaseInfo, LeaseStore};
use crate::token::Token;

pub(crate) mod line;

use line::{decode, encode, free_slot, Entry, Hold, Line};
pub use line::{MAX_WAITERS, QUEUE_SUFFIX, WAITER_INFIX};

/// How often a fair acquisition arrives again after its queue lease was
/// taken away.
const REQUEUE_TRIES: u32 = 3;

/// Whether `e` is the loss of `line`'s queue lease.
fn held_queue_lost(e: &Error, line: &Line) -> bool {
    match e {
        Error::Fenced { work_id, .. }
        | Error::Expired { work_id, .. }
        | Error::WindowExhausted { work_id, .. } => work_id == line.queue.as_str(),
        _ => false,
    }
}

/// How a fair acquisition tries its target (a lease, or any permit of a
/// semaphore) with the given options: the token and, where the store told
/// it, the hand-off of the grant.
pub(crate) type TryTarget<'a> = Box<
    dyn Fn(AcquireOptions) -> BoxFuture<'a, Result<(Token, Option<Handoff>)>> + Send + Sync + 'a,
>;

impl Leases {
    /// A fair acquisition of `target` (see the module docs): `try_target`
    /// acquires it with the options it is given (never fair ones). Lets go
    /// of the queue and waiter leases on every way out: before it returns
    /// an error (a cancellation and a timeout included), in the background
    /// once served.
    pub(crate) async fn acquire_fair(
        &self,
        target: &str,
        options: AcquireOptions,
        try_target: TryTarget<'_>,
    ) -> Result<(Token, Option<Handoff>)> {
        let line = Line::new(target)?;
        // This handle's earlier places, still being let go of in the
        // background, must not stand in line ahead of it.
        self.inner.letting_go.settled().await;
        let mut tries = 0;
        loop {
            let mut held = Hold {
                leases: self.clone(),
                queue: None,
                waiter: None,
            };
            let result = self
                .fair_steps(&line, &options, &try_target, &mut held)
                .await;
            if result.is_ok() {
                // Served: the waiter lease goes in the background (its
                // `Drop`), so the caller starts its work a round trip
                // sooner; the process lives on with the lease it got.
                drop(held);
                return result;
            }
            // Every other way out lets go before returning, so a process
            // that exits at once (an interrupted `worklease run`) leaves
            // nobody waiting behind a place it no longer wants.
            held.let_go().await;
            match result {
                // The queue lease was taken away under us (`release
                // --force` of `T/fair-queue`): the line is someone else's
                // now; arrive again.
                Err(e) if held_queue_lost(&e, &line) && tries < REQUEUE_TRIES => {
                    tries += 1;
                    tracing::debug!(error = %e, "a fair line's queue lease was taken away: arriving again");
                }
                other => return other,
            }
        }
    }

    async fn fair_steps(
        &self,
        line: &Line,
        options: &AcquireOptions,
        try_target: &TryTarget<'_>,
        held: &mut Hold,
    ) -> Result<(Token, Option<Handoff>)> {
        // One wait timeout for the whole acquisition: the queue lease, the
        // turn and the target share it.
        let give_up_at = options
            .wait_timeout
            .and_then(|t| Instant::now().checked_add(t));
        let unfair = |wait: bool| AcquireOptions {
            fair: false,
            wait,
            wait_timeout: give_up_at.map(|t| t.saturating_duration_since(Instant::now())),
            ..options.clone()
        };
        // The queue lease is a mutex held for a few round trips: a waiting
        // caller waits for it; one failing fast tries it once (`Held`
        // naming it when someone is arriving).
        let mut queue_options = unfair(options.wait);
        queue_options.poll_interval = options.poll_interval.min(Duration::from_millis(250));
        let q = match self
            .acquire_first(std::slice::from_ref(&line.queue), queue_options)
            .await
        {
            Ok(q) => q,
            // Someone is arriving: for a caller failing fast, as good as in
            // line before it.
            Err(Error::Held { .. }) if !options.wait => {
                return Err(Error::WaitersAhead {
                    target: line.target.clone(),
                    waiters: 1,
                })
            }
            Err(e) => return Err(e),
        };
        // Held (and let go of on every way out, a dropped future's
        // included) from the moment it is granted.
        held.queue = Some(self.start_renewal(q.clone(), RenewalOptions::new())?);
        let listed = decode(self.read_checkpoint(&q).await?.data.as_ref());
        let (ahead, _) = self.live_entries(line, &listed).await?;
        if ahead.is_empty() {
            if listed.len() != ahead.len() {
                // Best effort, before the target (a grant of the target is
                // returned at once: nothing may stand between it and the
                // caller): a stale record only costs the next arrival an
                // `inspect` of the waiters who left.
                if let Ok(q) = held.queue_token() {
                    let _ = self.checkpoint(&q, encode(&ahead)).await;
                }
            }
            match try_target(unfair(false)).await {
                Ok(token) => return Ok(token),
                Err(e @ (Error::Held { .. } | Error::PermitsHeld { .. })) if !options.wait => {
                    return Err(e)
                }
                Err(Error::Held { .. } | Error::PermitsHeld { .. }) => {}
                Err(e) => return Err(e),
            }
        } else if !options.wait {
            return Err(Error::WaitersAhead {
                target: line.target.clone(),
                waiters: ahead.len(),
            });
        }
        if ahead.len() >= MAX_WAITERS {
            return Err(crate::error::InvalidInput::Config(format!(
                "the fair line of {:?} is full: {MAX_WAITERS} waiters are in it",
                line.target
            ))
            .into());
        }
        // Join the line: the lowest free slot (one held by a waiter this
        // record does not name, after the record was lost, is skipped).
        let mut skip = Vec::new();
        let mine = loop {
            let slot = free_slot(&ahead, &skip);
            match self
                .acquire_first(&[line.waiter(slot)?], AcquireOptions::new())
                .await
            {
                Ok(t) => {
                    break (
                        Entry {
                            slot,
                            token: t.fencing_token(),
                        },
                        t,
                    )
                }
                Err(Error::Held { .. }) if skip.len() < 16 => skip.push(slot),
                Err(e) => return Err(e),
            }
        };
        let (me, token) = mine;
        held.waiter = Some(self.start_renewal(token, RenewalOptions::new())?);
        let mut record = ahead.clone();
        record.push(me);
        self.checkpoint(&held.queue_token()?, encode(&record))
            .await?;
        tracing::debug!(target = %line.target, slot = me.slot, ahead = ahead.len(), "joined a fair line");
        // In line: the queue lease goes while the turn is awaited (the
        // release is not on this waiter's way to the target).
        let (_, turn) = tokio::join!(
            held.release_queue(),
            self.wait_for_turn(line, ahead, options, give_up_at)
        );
        turn?;
        match try_target(unfair(true)).await {
            // The wait's timeout is the caller's whole one.
            Err(Error::WaitTimedOut { work_id, .. }) => Err(Error::WaitTimedOut {
                work_id,
                waited: options.wait_timeout.unwrap_or_default(),
            }),
            other => other,
        }
    }

    /// The entries of `listed` whose waiter lease is still theirs and
    /// live, in order, and those leases.
    async fn live_entries(
        &self,
        line: &Line,
        listed: &[Entry],
    ) -> Result<(Vec<Entry>, Vec<LeaseInfo>)> {
        if listed.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let ids = listed
            .iter()
            .map(|e| line.waiter(e.slot))
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
            .filter(|(e, id)| {
                infos
                    .iter()
                    .any(|i| &i.work_id == *id && i.fencing_token == e.token)
            })
            .map(|(e, _)| *e)
            .collect();
        Ok((live, infos))
    }

    /// Waits until no waiter of `ahead` (those in line before this one,
    /// in order) is in line any more, or `give_up_at` (the acquisition's
    /// wait timeout) passes. Only the last of them still in line, the
    /// waiter just before this one, is watched, and looked at while it
    /// stays: served in order, it leaves after all the others; when it
    /// leaves, all of them are looked at again (one `inspect`), and when
    /// some are still there (it gave up, or died, before them), the last
    /// of those is watched next. So a release wakes the one waiter behind
    /// it, not the whole line: a hand-off costs one waiter's `inspect`,
    /// not one per waiter (each waking on every release of one before it
    /// was a burst of `inspect`s quadratic in the line's length, which
    /// saturated etcd at 16 waiters). A dead waiter is found by the
    /// waiter just behind it, woken at its expiry.
    async fn wait_for_turn(
        &self,
        line: &Line,
        mut ahead: Vec<Entry>,
        options: &AcquireOptions,
        give_up_at: Option<Instant>,
    ) -> Result<()> {
        // Whether to look at every waiter of `ahead` (the one just before
        // this one left, or may have) or at that one only.
        let mut all = false;
        loop {
            let Some(&before) = ahead.last() else {
                return Ok(());
            };
            // Watch before looking, so a release in between still wakes us.
            let id = line.waiter(before.slot)?;
            let watches: Vec<_> = self.store().watch(&id).into_iter().collect();
            let looked = if all {
                &ahead[..]
            } else {
                std::slice::from_ref(&before)
            };
            let (live, infos) = self.live_entries(line, looked).await?;
            if live.last() != Some(&before) {
                // It left: look at those before it, or, having looked,
                // watch the last of them still in line.
                if all {
                    ahead = live;
                } else {
                    ahead.pop();
                }
                all = !all;
                continue;
            }
            if all {
                ahead = live;
            }
            let expires_in = infos
                .iter()
                .find(|i| i.work_id == id)
                .and_then(|i| i.expires_in);
            all = match crate::lease::acquire::nap(options, expires_in, watches, give_up_at).await {
                // Most likely it left: look at everyone at once.
                Ok(Woken::Notified) => true,
                Ok(Woken::Slept) => false,
                Err(WaitEnd::Cancelled) => {
                    return Err(Error::Cancelled {
                        work_id: line.target.clone(),
                    })
                }
                Err(WaitEnd::TimedOut) => {
                    return Err(Error::WaitTimedOut {
                        work_id: line.target.clone(),
                        waited: options.wait_timeout.unwrap_or_default(),
                    })
                }
            };
        }
    }

    /// The fair waiters of `target` in line now ([`waiters`]).
    ///
    /// # Errors
    /// As [`waiters`].
    pub async fn fair_waiters(&self, target: &str) -> Result<Vec<LeaseInfo>> {
        waiters(self.store().as_ref(), target).await
    }
}

/// The fair waiters of `target` (a work ID, or a semaphore's name) in line
/// now: their live waiter leases (`T/fair-waiter/<slot>`), by slot (the
/// order of the line is in the queue lease's record, which only a holder
/// of that lease reads). Lists the whole store (`inspect` of every work
/// ID): a call for operators (`worklease status`) and tests, not for a hot
/// path.
///
/// # Errors
/// [`Error::Invalid`] for a target too long for fair waiting;
/// [`Error::Store`] when the store fails.
pub async fn waiters(store: &dyn LeaseStore, target: &str) -> Result<Vec<LeaseInfo>> {
    Line::new(target)?;
    let prefix = format!("{target}{WAITER_INFIX}");
    let mut waiting: Vec<(usize, LeaseInfo)> = store
        .inspect(&[])
        .await?
        .into_iter()
        .filter(|i| !i.expired)
        .filter_map(|i| {
            let slot = i.work_id.as_str().strip_prefix(&prefix)?.parse().ok()?;
            Some((slot, i))
        })
        .collect();
    waiting.sort_by_key(|(s, _)| *s);
    Ok(waiting.into_iter().map(|(_, i)| i).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Holders `a` and `b` on one memory store (TTL 10 s), `a` holding `t`.
    async fn a_holds_t_b_waits() -> (Leases, Leases, crate::Token) {
        use crate::store::memory::MemoryStore;
        use crate::Config;
        use std::sync::Arc;
        let store = Arc::new(MemoryStore::new());
        let ttl = Duration::from_secs(10);
        let a = Leases::new(store.clone(), Config::new("a", ttl)).expect("config");
        let b = Leases::new(store, Config::new("b", ttl)).expect("config");
        let held = a
            .acquire("t", AcquireOptions::new())
            .await
            .expect("acquire");
        (a, b, held)
    }

    #[tokio::test(start_paused = true)]
    async fn a_served_waiter_is_not_ahead_of_its_own_next_acquisition() {
        let (a, b, held) = a_holds_t_b_waits().await;
        let waiting = tokio::spawn({
            let b = b.clone();
            async move {
                let options = AcquireOptions::new().fair().wait_for_lease();
                b.acquire("t", options).await
            }
        });
        line_of(&a, 1).await;
        a.release(held).await.expect("release");
        // b is served: its place in line goes in the background.
        let served = waiting.await.expect("task").expect("b is served");
        b.release(served).await.expect("release");
        // At once, failing fast: b's old place is not a waiter ahead of b.
        let again = b.acquire("t", AcquireOptions::new().fair()).await;
        assert!(again.is_ok(), "b's next fair acquisition: {again:?}");
    }

    /// Waits until `n` waiters are in the line of `t`.
    async fn line_of(leases: &Leases, n: usize) {
        while leases.fair_waiters("t").await.expect("waiters").len() != n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_whose_predecessor_gives_up_waits_for_those_before_it() {
        let (a, b, held) = a_holds_t_b_waits().await;
        let config = |h: &str| crate::Config::new(h, Duration::from_secs(10));
        let c = Leases::new(a.store().clone(), config("c")).expect("config");
        let d = Leases::new(a.store().clone(), config("d")).expect("config");
        let fair = AcquireOptions::new().fair().wait_for_lease();
        let wait =
            |l: Leases, o: AcquireOptions| tokio::spawn(async move { l.acquire("t", o).await });
        let b_waits = wait(b.clone(), fair.clone());
        line_of(&a, 1).await;
        let give_up = tokio_util::sync::CancellationToken::new();
        let c_waits = wait(c, fair.clone().cancel_on(give_up.clone()));
        line_of(&a, 2).await;
        let d_waits = wait(d.clone(), fair);
        line_of(&a, 3).await;
        // c, just before d, leaves first: d still waits for b.
        give_up.cancel();
        assert!(matches!(
            c_waits.await.expect("task"),
            Err(Error::Cancelled { .. })
        ));
        line_of(&a, 2).await;
        a.release(held).await.expect("release");
        let served = b_waits.await.expect("task").expect("b is served first");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!d_waits.is_finished(), "d went before b let go of t");
        b.release(served).await.expect("release");
        let got = d_waits.await.expect("task").expect("d is served next");
        d.release(got).await.expect("release");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fair_wait_times_out_once_and_leaves_the_line() {
        let (a, b, held) = a_holds_t_b_waits().await;
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
}
