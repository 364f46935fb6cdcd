//! The start of a term (ADR 0016): the acquisition, the record it was
//! handed (known from this elector's last look at the election, else read:
//! one round trip), and this term's record, written while the term's work
//! starts, so that a hand-over costs what the lease's hand-off costs.

use std::sync::{Arc, OnceLock};

use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio_util::sync::CancellationToken;

use super::record::Record;
use super::{Elector, State};
use crate::error::{Error, Result};
use crate::lease::granting::Unclaimed;
use crate::lease::renewal::Renewal;
use crate::store::Handoff;
use crate::token::Token;

/// A term that has started: its lease, renewed, and its record.
pub(super) struct Term {
    /// The acquisition's token.
    pub(super) token: Token,
    /// The lease's background renewal.
    pub(super) renewal: Renewal,
    /// The term's record as it started (its state for the leader).
    pub(super) started: Record,
    /// The term's record; locked while the first write of it (and each
    /// [`super::Leadership::publish`]) is under way, so that a release
    /// waits for it and a publish follows it.
    pub(super) record: Arc<Mutex<Record>>,
    /// The error of the record's first write, when it failed.
    pub(super) record_failed: RecordFailure,
}

/// Why the first write of a term's record failed, once it did: the term
/// then ends as a lost lease does.
#[derive(Clone, Default)]
pub(crate) struct RecordFailure {
    error: Arc<OnceLock<Error>>,
    signal: CancellationToken,
}

impl RecordFailure {
    /// The write's error, once it failed.
    pub(crate) fn error(&self) -> Option<Error> {
        self.error.get().cloned()
    }

    /// Completes when the write failed; never when it succeeded.
    pub(super) async fn failed(&self) {
        self.signal.cancelled().await;
    }

    fn fail(&self, error: Error) {
        if self.error.set(error).is_ok() {
            self.signal.cancel();
        }
    }
}

impl Elector {
    /// Starts the term that the acquisition `token` (with the hand-off
    /// `handoff` the store reported) begins: the record handed over, known
    /// or read; this term's record; the renewal; and the record's write on
    /// a task of its own, so the term's work starts without waiting for
    /// it. When the write fails, the term's [`RecordFailure`] fires and
    /// the term ends as a lost lease does: no term outlives a failed write
    /// of its record by more than the time its work takes to stop.
    ///
    /// # Errors
    /// The read's error, when the record handed over was not known and
    /// could not be read; the lease is then released (bounded by the
    /// release timeout) and no term starts.
    pub(super) async fn start_term(&self, token: Token, handoff: Option<Handoff>) -> Result<Term> {
        let leases = &self.inner.leases;
        // Released at once if this future is dropped before the term's
        // renewal holds the lease (a campaign stopped meanwhile).
        let grant = (token.work_id().clone(), token.fencing_token());
        let unclaimed = Unclaimed::new(leases.clone(), vec![grant]);
        let known = handoff
            .as_ref()
            .and_then(|h| h.previous.as_ref())
            .and_then(|previous| self.known_record(previous.fencing_token));
        let (handed, handoff) = match (known, handoff) {
            (Some(record), Some(handoff)) => (Some(record), handoff),
            _ => match leases.read_checkpoint(&token).await {
                Ok(read) => (read.data.as_deref().and_then(Record::decode), read.handoff),
                Err(e) => {
                    unclaimed.claim();
                    let timeout = self.inner.release_timeout;
                    let _ = tokio::time::timeout(timeout, leases.release(token)).await;
                    return Err(e);
                }
            },
        };
        let value = self
            .inner
            .value
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let record = Record::first_of_term(
            token.fencing_token(),
            token.holder_id().as_str(),
            handed.as_ref(),
            &handoff,
            value,
            self.inner.priority.unwrap_or(0),
        );
        let renewal = leases.start_renewal(token.clone(), self.inner.renewal.clone())?;
        unclaimed.claim();
        let shared = Arc::new(Mutex::new(record.clone()));
        let writing = shared.clone().lock_owned().await;
        let record_failed = RecordFailure::default();
        tokio::spawn(self.clone().write_record(
            token.clone(),
            writing,
            renewal.lost_signal(),
            record_failed.clone(),
        ));
        Ok(Term {
            token,
            renewal,
            started: record,
            record: shared,
            record_failed,
        })
    }

    /// The first write of a term's record, as a renewal retries: a store
    /// failure is tried again after the renewal's back-off (doubling to
    /// its maximum) until one back-off past the acquisition's deadline; a
    /// lost lease ends it (the renewal reports and counts the loss; a
    /// `Fenced` or `Expired` answer to the write waits for the renewal's
    /// verdict until then). Fires `failure` when the write cannot be made.
    async fn write_record(
        self,
        token: Token,
        record: OwnedMutexGuard<Record>,
        lease_lost: CancellationToken,
        failure: RecordFailure,
    ) {
        let leases = &self.inner.leases;
        let data = record.encode();
        let mut backoff = self.inner.renewal.backoff_initial();
        // Past the acquisition's deadline the renewal reports a lease it
        // could not renew (its cause, not the write's, is the loss); one
        // back-off later a write that still fails ends the term itself.
        let give_up_at = token.deadline().map(|d| d + backoff);
        let error = loop {
            let written = tokio::select! {
                written = leases.checkpoint(&token, data.clone()) => written,
                () = lease_lost.cancelled() => return,
            };
            let e = match written {
                Ok(_) => {
                    self.remember(&record);
                    metrics::gauge!(
                        crate::metrics::ELECTION_TRANSITIONS,
                        "election" => self.inner.election.to_string()
                    )
                    .set(record.transitions as f64);
                    return;
                }
                // The lease is gone: the renewal reports it (and counts it)
                // at its next step; end the term here only if it does not.
                Err(e) if e.is_lease_lost() => match give_up_at {
                    Some(at) => tokio::select! {
                        () = lease_lost.cancelled() => return,
                        () = tokio::time::sleep_until(at) => break e,
                    },
                    None => break e,
                },
                Err(e) => e,
            };
            if give_up_at.is_some_and(|at| tokio::time::Instant::now() >= at) {
                break e;
            }
            tracing::debug!(error = %e, "writing the term's record failed; trying again");
            let retry_at = tokio::time::Instant::now() + backoff;
            let retry_at = give_up_at.map_or(retry_at, |at| retry_at.min(at));
            tokio::select! {
                () = tokio::time::sleep_until(retry_at) => {}
                () = lease_lost.cancelled() => return,
            }
            backoff = (backoff * 2).min(self.inner.renewal.backoff_max());
        };
        tracing::warn!(
            election = %self.inner.election,
            term = token.fencing_token(),
            error = %error,
            "the term's record could not be written: the term ends"
        );
        failure.fail(error);
    }

    /// The record of `term` when this elector knows it: it wrote it, or saw
    /// it while waiting. A record rewritten since (a published value) has
    /// the same transitions, all the next term takes from it.
    fn known_record(&self, term: u64) -> Option<Record> {
        let known = self.inner.known.lock().unwrap_or_else(|p| p.into_inner());
        known.as_ref().filter(|r| r.term == term).cloned()
    }

    /// Keeps `record`, written or read, as the latest this elector knows.
    pub(super) fn remember(&self, record: &Record) {
        let mut known = self.inner.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.as_ref().is_none_or(|k| k.term <= record.term) {
            *known = Some(record.clone());
        }
    }

    /// Keeps the record an observation of this election showed (a term's
    /// state reported with its record).
    pub(super) fn remember_observed(&self, state: &State) {
        if let Some(since) = state.since {
            self.remember(&Record {
                term: state.generation,
                transitions: state.transitions,
                since,
                priority: state.priority,
                holder: state.owner.clone(),
                value: state.value.clone(),
            });
        }
    }
}

/// How a leadership's lease was lost (not given up), read after its
/// function returned: the renewal's cause, else the record's failed write.
pub(crate) struct Loss {
    pub(super) renewal: Arc<Renewal>,
    pub(super) record_failed: RecordFailure,
}

impl Loss {
    /// The cause, once the lease was lost.
    pub(crate) fn cause(&self) -> Option<Error> {
        self.renewal
            .lost_cause()
            .or_else(|| self.record_failed.error())
    }
}
