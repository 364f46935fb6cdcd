//! The batch calls of the lease API: acquire up to K of a list of work
//! IDs, acquire any one of them (waiting if asked), renew many and release
//! many, each one store call per [`LeaseStore::max_batch`] leases
//! ([`LeaseStore::acquire_many`], [`LeaseStore::renew_many`],
//! [`LeaseStore::release_many`]). The session of a [`Leases`] handle renews
//! its leases through [`Leases::renew_batch`].

use std::time::Duration;

use tokio::time::Instant;
use tracing::field::Empty;
use tracing::Instrument;

use crate::error::{Error, Result, StoreError};
use crate::lease::granting::{granting, Granted};
use crate::lease::{AcquireOptions, Leases};
use crate::limits::{check_batch, WorkId};
use crate::metrics::{self as m, finish_span};
use crate::observe::{AcquireEvent, Operation, ReleaseEvent, RenewEvent};
#[cfg(doc)]
use crate::store::LeaseStore;
use crate::store::{Grant, LeaseRef};
use crate::token::{lease_ref, Token};

impl Leases {
    /// Acquires up to `max` of `work_ids`, trying them in order, without
    /// waiting: the free ones are granted and the held ones left out
    /// (what a pool taking its share needs). One store call per
    /// [`LeaseStore::max_batch`] work IDs tried, stopping once `max` are
    /// granted. The tokens come in the order of `work_ids`; an empty list
    /// or a `max` of 0 makes no store call.
    ///
    /// # Errors
    /// * [`Error::Invalid`] for a bad or reserved work ID
    ///   ([`crate::is_internal_work_id`]), a work ID named twice, or
    ///   more than [`crate::limits::MAX_BATCH`] of them (nothing is
    ///   written);
    /// * [`Error::Store`] when a store call fails as a whole (the grants of
    ///   earlier calls are handed back first, best effort), or when every
    ///   work ID tried failed and one failed with a store error.
    pub async fn acquire_many<I, S>(&self, work_ids: I, max: usize) -> Result<Vec<Token>>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let ids = checked_ids(work_ids)?;
        let store = self.inner.store.kind();
        let span = tracing::info_span!(
            "worklease.acquire_many",
            holder = %self.inner.holder_id,
            store,
            work_ids = ids.len(),
            max,
            granted = Empty,
            outcome = Empty,
            duration_ms = Empty,
        );
        let started = Instant::now();
        let result = self
            .acquire_many_inner(&ids, max)
            .instrument(span.clone())
            .await;
        if let Ok(tokens) = &result {
            span.record("granted", tokens.len());
        }
        finish_span(&span, started, &result, None);
        result
    }

    async fn acquire_many_inner(&self, ids: &[WorkId], max: usize) -> Result<Vec<Token>> {
        let (store, holder, ttl) = (&self.inner.store, &self.inner.holder_id, self.inner.ttl);
        let mut tokens: Vec<Token> = Vec::new();
        let mut failure: Option<Error> = None;
        let per_call = store.max_batch().max(1);
        for chunk in ids.chunks(per_call) {
            if tokens.len() >= max {
                break;
            }
            let sent = Instant::now();
            let call = {
                let (store, holder, ids) = (store.clone(), holder.clone(), chunk.to_vec());
                let count = max - tokens.len();
                async move {
                    let outcomes = store.acquire_many(&ids, &holder, ttl, count).await?;
                    Ok((ids, outcomes))
                }
            };
            let granted = |(ids, outcomes): &(Vec<WorkId>, Vec<Result<Grant>>)| -> Vec<Granted> {
                ids.iter()
                    .zip(outcomes)
                    .filter_map(|(id, o)| Some((id.clone(), o.as_ref().ok()?.fencing_token)))
                    .collect()
            };
            let outcomes = match granting(self, call, granted).await {
                Ok((_, o)) => o,
                Err(e) => {
                    m::count(
                        m::ACQUISITIONS_TOTAL,
                        store.kind(),
                        &Err::<(), _>(e.clone()),
                    );
                    self.hand_back(&tokens.iter().map(lease_ref).collect::<Vec<_>>())
                        .await;
                    return Err(e);
                }
            };
            let duration = sent.elapsed();
            m::store_call(store.kind(), "acquire_many", duration);
            let late = self.deadline_from(sent) <= Instant::now();
            for (id, outcome) in chunk.iter().zip(outcomes) {
                m::count(m::ACQUISITIONS_TOTAL, store.kind(), &outcome);
                match outcome {
                    Ok(grant) => {
                        let token = Token {
                            work_id: id.clone(),
                            holder_id: holder.clone(),
                            fencing_token: grant.fencing_token,
                            expires_at: grant.expires_at,
                            ttl,
                            deadline: Some(self.deadline_from(sent)),
                        };
                        if late {
                            // Its deadline passed before the reply came:
                            // of no use, hand it back.
                            self.hand_back(&[lease_ref(&token)]).await;
                            continue;
                        }
                        self.inner.observer.on_acquire(&AcquireEvent {
                            work_id: id,
                            token: Some(&token),
                            error: None,
                            attempts: 1,
                            duration,
                        });
                        tokens.push(token);
                    }
                    Err(Error::Held { .. }) => {}
                    Err(e) => failure = Some(e),
                }
            }
        }
        match failure {
            Some(e) if tokens.is_empty() => Err(e),
            _ => Ok(tokens),
        }
    }

    /// Releases `leases` (best effort, in batches of the store's
    /// [`LeaseStore::max_batch`]): grants nobody will use. Also the
    /// release of a dropped acquisition's grants (`granting`).
    pub(crate) async fn hand_back(&self, leases: &[LeaseRef<'_>]) {
        for chunk in leases.chunks(self.inner.store.max_batch().max(1)) {
            if let Err(e) = self.inner.store.release_many(chunk).await {
                // Taken from other holders until their TTL ends: worth an
                // operator's notice (a process exiting on a signal says
                // nothing else about it).
                tracing::warn!(
                    error = %e,
                    work_ids = ?chunk.iter().map(|l| l.work_id.as_str()).collect::<Vec<_>>(),
                    "could not release grants nobody holds: they stay taken until their TTL ends"
                );
            }
        }
    }

    /// Acquires the first of `work_ids` that is free, trying them in
    /// order, as [`Leases::acquire`] acquires one: failing fast with
    /// `Held`, or, with [`AcquireOptions::wait_for_lease`], waiting until
    /// one of them is free (woken by a notification of any of them, by the
    /// earliest expiry among their holders, or by the poll interval). Per
    /// attempt, one store call over the first 16 work IDs, then one per
    /// [`LeaseStore::max_batch`] of the rest, so "any free one of these"
    /// costs one round trip when one of the first 16 is free.
    ///
    /// # Errors
    /// As [`Leases::acquire`], naming the first work ID; also
    /// [`Error::Invalid`] for an empty list, a work ID named twice or more
    /// than [`crate::limits::MAX_BATCH`] of them (nothing is written).
    pub async fn acquire_any<I, S>(&self, work_ids: I, options: AcquireOptions) -> Result<Token>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let ids = checked_ids(work_ids)?;
        if ids.is_empty() {
            return Err(crate::error::InvalidInput::Config(
                "acquire_any needs at least one work ID".into(),
            )
            .into());
        }
        self.acquire_any_checked(&ids, options).await
    }

    /// [`Leases::acquire_any`] of work IDs already checked (non-empty,
    /// distinct, within the batch limit): a semaphore's permits, checked
    /// once when it is made.
    pub(crate) async fn acquire_any_checked(
        &self,
        ids: &[WorkId],
        options: AcquireOptions,
    ) -> Result<Token> {
        self.traced_acquisition(
            ids[0].as_str(),
            options.waits(),
            self.acquire_first(ids, options),
            |t| t.fencing_token,
        )
        .await
    }

    /// Renews each of `tokens` (Go: `Renew`, for many), one store call per
    /// [`LeaseStore::max_batch`] of them: per token, the extended token or
    /// the error its single renewal would have returned (`Expired`,
    /// `Fenced`), so one stale token fails alone.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a token of another holder, a work ID named
    /// twice or more than [`crate::limits::MAX_BATCH`] tokens (nothing is
    /// sent); [`Error::Store`] when a store call fails as a whole (the
    /// tokens of earlier calls were renewed, the caller does not learn
    /// which: renewing them again is safe).
    pub async fn renew_many(&self, tokens: &[Token]) -> Result<Vec<Result<Token>>> {
        self.check_tokens(tokens)?;
        let attempts = vec![1; tokens.len()];
        let mut out = Vec::with_capacity(tokens.len());
        let per_call = self.inner.store.max_batch().max(1);
        for (chunk, attempts) in tokens.chunks(per_call).zip(attempts.chunks(per_call)) {
            out.extend(self.renew_batch(chunk, attempts).await?);
        }
        Ok(out)
    }

    /// One batch renewal of `tokens` (at most the store's batch size),
    /// reported to the observer per lease as attempt `attempts[i]`.
    pub(crate) async fn renew_batch(
        &self,
        tokens: &[Token],
        attempts: &[u32],
    ) -> Result<Vec<Result<Token>>> {
        let store = self.inner.store.kind();
        let span = tracing::debug_span!(
            "worklease.renew_many",
            holder = %self.inner.holder_id,
            store,
            leases = tokens.len(),
            outcome = Empty,
            duration_ms = Empty,
        );
        let refs: Vec<LeaseRef<'_>> = tokens.iter().map(lease_ref).collect();
        let sent = Instant::now();
        let result = self
            .inner
            .store
            .renew_many(&refs, self.inner.ttl)
            .instrument(span.clone())
            .await
            .and_then(|outcomes| answered(store, outcomes, tokens.len()));
        let duration = sent.elapsed();
        finish_span(&span, sent, &result, None);
        m::store_call(store, "renew_many", duration);
        let outcomes = match result {
            Ok(o) => o,
            Err(e) => {
                for (token, attempt) in tokens.iter().zip(attempts) {
                    self.report_renewal(token, *attempt, duration, &Err(e.clone()));
                }
                return Err(e);
            }
        };
        Ok(tokens
            .iter()
            .zip(attempts)
            .zip(outcomes)
            .map(|((token, attempt), outcome)| {
                let renewed = outcome.map(|expires_at| self.extended(token, sent, expires_at));
                self.report_renewal(token, *attempt, duration, &renewed);
                renewed
            })
            .collect())
    }

    /// Releases each of `tokens` (Go: `Release`, for many), one store call
    /// per [`LeaseStore::max_batch`] of them: per token, `Ok` or the error
    /// its single release would have returned.
    ///
    /// # Errors
    /// As [`Leases::renew_many`].
    pub async fn release_many(&self, tokens: Vec<Token>) -> Result<Vec<Result<()>>> {
        self.check_tokens(&tokens)?;
        let store = self.inner.store.kind();
        let mut out = Vec::with_capacity(tokens.len());
        for chunk in tokens.chunks(self.inner.store.max_batch().max(1)) {
            let refs: Vec<LeaseRef<'_>> = chunk.iter().map(lease_ref).collect();
            let sent = Instant::now();
            let outcomes = self
                .inner
                .store
                .release_many(&refs)
                .await
                .and_then(|outcomes| answered(store, outcomes, chunk.len()))?;
            let duration = sent.elapsed();
            m::store_call(store, "release_many", duration);
            for (token, outcome) in chunk.iter().zip(outcomes) {
                m::count(m::RELEASES_TOTAL, store, &outcome);
                self.inner.observer.on_release(&ReleaseEvent {
                    token,
                    error: outcome.as_ref().err(),
                    duration,
                });
                if let Err(e) = &outcome {
                    self.report_fenced(token, Operation::Release, e);
                }
                out.push(outcome);
            }
        }
        Ok(out)
    }

    fn check_tokens(&self, tokens: &[Token]) -> Result<()> {
        for t in tokens {
            self.check_token(t)?;
        }
        check_batch(tokens.iter().map(|t| &t.work_id))?;
        Ok(())
    }

    /// Tells the observer and the metrics about one lease's renewal.
    fn report_renewal(
        &self,
        token: &Token,
        attempt: u32,
        duration: Duration,
        result: &Result<Token>,
    ) {
        self.inner.observer.on_renew(&RenewEvent {
            token,
            error: result.as_ref().err(),
            attempt,
            duration,
        });
        m::count(m::RENEWALS_TOTAL, self.inner.store.kind(), result);
        match result {
            Ok(_) => self.note_renewed(token),
            Err(e) => self.report_fenced(token, Operation::Renew, e),
        }
    }
}

/// Checks a batch's work IDs ([`check_batch`]).
fn checked_ids<I, S>(work_ids: I) -> Result<Vec<WorkId>>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let ids = work_ids
        .into_iter()
        .map(|s| crate::internal::user_work_id(s.as_ref()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    check_batch(ids.iter())?;
    Ok(ids)
}

/// A batch answer with one outcome per lease, or a store error saying the
/// store broke that rule.
fn answered<T>(
    store: &'static str,
    outcomes: Vec<Result<T>>,
    asked: usize,
) -> Result<Vec<Result<T>>> {
    if outcomes.len() == asked {
        Ok(outcomes)
    } else {
        Err(StoreError::new(
            store,
            format!(
                "the store answered a batch of {asked} leases with {} outcomes",
                outcomes.len()
            ),
        )
        .into())
    }
}
