//! Acquiring the first free one of some work IDs, waiting if asked: the
//! loop behind [`Leases::acquire`] and [`Leases::acquire_any`] (Go:
//! `Acquire` with `WithWaitForLease`, `WithPollInterval`).

use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::error::{Error, InvalidInput, Result};
use crate::lease::granting::granting;
use crate::lease::{AcquireOptions, Leases};
use crate::limits::WorkId;
use crate::metrics as m;
use crate::observe::AcquireEvent;
#[cfg(doc)]
use crate::store::LeaseStore;
use crate::store::{Grant, Handoff, LeaseRef};
use crate::token::Token;

/// How many work IDs the first store call of an acquisition of "the
/// first free one of these" tries; the next calls try
/// [`LeaseStore::max_batch`] each.
pub(crate) const FIRST_TRY: usize = 16;

impl Leases {
    /// Acquires the first of `work_ids` that is free (tried in order), as
    /// [`Leases::acquire`] does for one: waiting, when the options ask,
    /// until one of them is free, woken by a notification of any of them,
    /// by the earliest expiry among their holders, or by the poll
    /// interval. Errors name the first work ID unless one was granted.
    pub(crate) async fn acquire_first(
        &self,
        work_ids: &[WorkId],
        options: AcquireOptions,
    ) -> Result<Token> {
        self.acquire_granted(work_ids, options)
            .await
            .map(|(token, _)| token)
    }

    /// [`Leases::acquire_first`] with the hand-off the store reported with
    /// the grant (who held the lease before, and how it ended).
    pub(crate) async fn acquire_granted(
        &self,
        work_ids: &[WorkId],
        options: AcquireOptions,
    ) -> Result<(Token, Handoff)> {
        let first = &work_ids[0];
        if options.poll_interval < Duration::from_millis(1) {
            return Err(InvalidInput::Config(format!(
                "poll interval {:?} must be at least 1ms",
                options.poll_interval
            ))
            .into());
        }
        // A timeout too large for the clock (Duration::MAX) means no timeout.
        let wait_until = options
            .wait_timeout
            .and_then(|t| Instant::now().checked_add(t));
        // Shared with each attempt's task, copied once per acquisition (a
        // semaphore's waiter tries all its permits at every wake-up).
        let shared: std::sync::Arc<[WorkId]> = work_ids.into();
        let mut attempts = 0;
        loop {
            if options.wait && options.cancel.as_ref().is_some_and(|c| c.is_cancelled()) {
                let e = Error::Cancelled {
                    work_id: first.to_string(),
                };
                return Err(self.acquire_failed(first, attempts, Duration::ZERO, e));
            }
            // Subscribe before trying, so a release between our attempt and
            // our sleep still wakes us.
            let watches: Vec<_> = if options.wait {
                work_ids
                    .iter()
                    .filter_map(|id| self.inner.store.watch(id))
                    .collect()
            } else {
                Vec::new()
            };
            attempts += 1;
            let sent = Instant::now();
            let result = self.try_first_detached(&shared).await;
            let duration = sent.elapsed();
            m::store_call(self.inner.store.kind(), "acquire", duration);
            let expires_in = match result {
                // A grant whose deadline passed before its reply arrived (a
                // store that was busy or slow) is of no use: hand it back,
                // best effort, and wait on, or report the lease expired.
                Ok(Ok((i, grant))) if self.deadline_from(sent) <= Instant::now() => {
                    let lease = LeaseRef {
                        work_id: &work_ids[i],
                        holder_id: &self.inner.holder_id,
                        fencing_token: grant.fencing_token,
                    };
                    if let Err(e) = self.inner.store.release(lease).await {
                        tracing::debug!(error = %e, "could not hand back a grant that arrived too late");
                    }
                    if !options.wait {
                        let e = Error::expired(lease);
                        return Err(self.acquire_failed(&work_ids[i], attempts, duration, e));
                    }
                    Some(Duration::ZERO)
                }
                Ok(Ok((i, grant))) => {
                    let work_id = &work_ids[i];
                    let token = Token {
                        work_id: work_id.clone(),
                        holder_id: self.inner.holder_id.clone(),
                        fencing_token: grant.fencing_token,
                        expires_at: grant.expires_at,
                        ttl: self.inner.ttl,
                        deadline: Some(self.deadline_from(sent)),
                    };
                    tracing::Span::current().record("work_id", work_id.as_str());
                    self.inner.observer.on_acquire(&AcquireEvent {
                        work_id,
                        token: Some(&token),
                        error: None,
                        attempts,
                        duration,
                    });
                    tracing::debug!(work_id = %work_id, fencing_token = token.fencing_token, "lease acquired");
                    return Ok((token, grant.handoff));
                }
                Ok(Err(held)) if options.wait => held.expires_in,
                Ok(Err(held)) => {
                    return Err(self.acquire_failed(first, attempts, duration, held.error))
                }
                Err(e) => return Err(self.acquire_failed(first, attempts, duration, e)),
            };
            match nap(&options, expires_in, watches, wait_until).await {
                Ok(_) => {}
                Err(WaitEnd::Cancelled) => {
                    let e = Error::Cancelled {
                        work_id: first.to_string(),
                    };
                    return Err(self.acquire_failed(first, attempts, duration, e));
                }
                Err(WaitEnd::TimedOut) => {
                    let e = Error::WaitTimedOut {
                        work_id: first.to_string(),
                        waited: options.wait_timeout.unwrap_or_default(),
                    };
                    return Err(self.acquire_failed(first, attempts, duration, e));
                }
            }
        }
    }

    /// [`Leases::try_first`] on a task of its own, so that a grant whose
    /// acquisition was dropped while the call was in flight is released at
    /// once (`granting`).
    async fn try_first_detached(
        &self,
        work_ids: &std::sync::Arc<[WorkId]>,
    ) -> Result<std::result::Result<(usize, Grant), AllHeld>> {
        let (this, ids) = (self.clone(), work_ids.clone());
        let call = async move {
            let outcome = this.try_first(&ids).await?;
            Ok(outcome.map(|(i, grant)| (i, ids[i].clone(), grant)))
        };
        let outcome = granting(self, call, |outcome| match outcome {
            Ok((_, work_id, grant)) => vec![(work_id.clone(), grant.fencing_token)],
            Err(_) => Vec::new(),
        })
        .await?;
        Ok(outcome.map(|(i, _, grant)| (i, grant)))
    }

    /// One attempt at the first free one of `work_ids`: one store call for
    /// one work ID, one batch call per [`LeaseStore::max_batch`] of them
    /// (asking for one grant) until one is granted. `Ok(Ok)` with the
    /// grant and its index; `Ok(Err)` when every one is held.
    async fn try_first(
        &self,
        work_ids: &[WorkId],
    ) -> Result<std::result::Result<(usize, Grant), AllHeld>> {
        let (store, holder, ttl) = (&self.inner.store, &self.inner.holder_id, self.inner.ttl);
        if let [only] = work_ids {
            return match store.acquire(only, holder, ttl).await {
                Ok(g) => Ok(Ok((0, g))),
                Err(e @ Error::Held { .. }) => Ok(Err(AllHeld::from(e))),
                Err(e) => Err(e),
            };
        }
        let mut held: Option<AllHeld> = None;
        let max = store.max_batch().max(1);
        let mut start = 0;
        while start < work_ids.len() {
            // A first call over a few work IDs: one of them is free in the
            // common case, and a store's batch call costs more with more
            // IDs in it (a semaphore of 256 permits).
            let size = if start == 0 { FIRST_TRY.min(max) } else { max };
            let chunk = &work_ids[start..(start + size).min(work_ids.len())];
            let offset = start;
            start += chunk.len();
            for (i, outcome) in store
                .acquire_many(chunk, holder, ttl, 1)
                .await?
                .into_iter()
                .enumerate()
            {
                match outcome {
                    Ok(g) => return Ok(Ok((offset + i, g))),
                    Err(e @ Error::Held { .. }) => {
                        let this = AllHeld::from(e);
                        held = Some(match held {
                            Some(h) => h.earliest(this),
                            None => this,
                        });
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(Err(held.expect("a non-empty list whose IDs are all held")))
    }

    /// Tells the observer that the acquisition of `work_id` failed with
    /// `error` after `attempts` store calls (the last took `duration`);
    /// returns the error.
    fn acquire_failed(
        &self,
        work_id: &WorkId,
        attempts: u32,
        duration: Duration,
        error: Error,
    ) -> Error {
        self.inner.observer.on_acquire(&AcquireEvent {
            work_id,
            token: None,
            error: Some(&error),
            attempts,
            duration,
        });
        error
    }
}

/// Every work ID of an acquisition was held: the `Held` error of the one
/// that expires first, and when that is (`None` when no holder's expiry is
/// known).
struct AllHeld {
    error: Error,
    expires_in: Option<Duration>,
}

impl From<Error> for AllHeld {
    fn from(error: Error) -> Self {
        let expires_in = match &error {
            Error::Held { expires_in, .. } => *expires_in,
            _ => None,
        };
        Self { error, expires_in }
    }
}

impl AllHeld {
    /// Of two, the one whose holder's lease ends first (a known expiry
    /// before an unknown one).
    fn earliest(self, other: AllHeld) -> AllHeld {
        match (self.expires_in, other.expires_in) {
            (Some(a), Some(b)) if b < a => other,
            (None, Some(_)) => other,
            _ => self,
        }
    }
}

/// How a nap ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// One of its watches fired (a store notification).
    Notified,
    /// Its time was up (the poll interval, or the expiry waited for).
    Slept,
}

/// Why a wait ended before its nap did.
pub(crate) enum WaitEnd {
    /// The options' cancellation token fired.
    Cancelled,
    /// The wait's deadline (`wait_until`) passed.
    TimedOut,
}

/// One nap of a waiting acquisition: until the next poll, or just past
/// `expires_in` (the earliest expiry among the holders waited for) if that
/// comes first, with a jitter of up to 10% to spread many waiters; or until
/// one of `watches` (store notifications) fires, which it tells. Ends
/// early when the options' cancellation token fires or `wait_until` passes.
pub(crate) async fn nap(
    options: &AcquireOptions,
    expires_in: Option<Duration>,
    watches: Vec<futures_util::future::BoxFuture<'static, ()>>,
    wait_until: Option<Instant>,
) -> std::result::Result<Woken, WaitEnd> {
    let mut nap = options.poll_interval;
    if let Some(left) = expires_in {
        nap = nap.min(left + Duration::from_millis(1));
    }
    nap = nap.saturating_add(nap.mul_f64(rand::thread_rng().gen_range(0.0..0.1)));
    let woken = async {
        if watches.is_empty() {
            std::future::pending::<()>().await
        } else {
            futures_util::future::select_all(watches).await;
        }
    };
    tokio::select! {
        _ = tokio::time::sleep(nap) => Ok(Woken::Slept),
        _ = woken => Ok(Woken::Notified),
        _ = async { match &options.cancel { Some(c) => c.cancelled().await, None => std::future::pending().await } } => {
            Err(WaitEnd::Cancelled)
        }
        _ = async { match wait_until { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {
            Err(WaitEnd::TimedOut)
        }
    }
}
