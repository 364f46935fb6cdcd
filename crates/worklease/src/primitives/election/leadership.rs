//! The leadership a term's leader holds ([`Elector::lead`]'s function
//! gets it): its state, the lost signal and its cause, `resign`, and
//! `publish`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::record::{check_value, Record};
use super::term::{Loss, RecordFailure};
use super::{step_down, Elector, State};
use crate::error::{Error, Result};
use crate::lease::finish::finish_within;
use crate::lease::renewal::Renewal;
use crate::token::Token;

/// The leadership handed to [`Elector::lead`]'s function.
pub struct Leadership {
    pub(super) state: State,
    /// Fires with the renewal's lost signal, or on [`Leadership::resign`].
    pub(super) lost: CancellationToken,
    pub(super) renewal: Arc<Renewal>,
    pub(super) elector: Elector,
    /// The term's record; locked while a write of it is under way.
    pub(super) record: Arc<tokio::sync::Mutex<Record>>,
    /// Fires when the first write of the term's record failed.
    pub(super) record_failed: RecordFailure,
    /// Set when this term was given up (resign, or a step-down request):
    /// the lost signal's cause is then `Resigned`.
    pub(super) resigned: Arc<AtomicBool>,
    /// Set by [`Leadership::resign`]: the lease is released already.
    pub(super) released: Arc<AtomicBool>,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("state", &self.state)
            .field("lost", &self.lost.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl Leadership {
    /// The leadership as it was acquired.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The generation (fencing token): pass it to downstream writes.
    pub fn generation(&self) -> u64 {
        self.state.generation
    }

    /// A signal that fires the moment leadership is lost (renewal fenced,
    /// expired or window exhausted, or the first write of the term's
    /// record failed) or given up ([`Leadership::resign`], a step-down
    /// request). Stop leading when it does.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Why leadership was lost, once it was: the renewal's cause
    /// (`Fenced`, `Expired`, `WindowExhausted`) where the lease was lost;
    /// the write's error where the first write of the term's record failed
    /// (it runs while the term's work starts: ADR 0016); else
    /// [`Error::Resigned`] after [`Leadership::resign`] or a step-down
    /// request ([`request_step_down`](super::request_step_down)).
    pub fn lost_cause(&self) -> Option<Error> {
        self.loss().cause().or_else(|| {
            self.resigned
                .load(Ordering::SeqCst)
                .then(|| Error::Resigned {
                    election: self.elector.inner.election.to_string(),
                })
        })
    }

    /// Gives leadership up now (etcd `Resign`, Vault `step-down`): the lost
    /// signal fires first (cause [`Error::Resigned`]), so the work stops,
    /// then renewal stops and the lease is released (bounded by the release
    /// timeout), so that a waiting candidate leads within one notification
    /// and one round trip where the store notifies, one poll interval
    /// otherwise. [`Elector::lead`] then returns when the function does,
    /// without releasing again; campaign again by calling it again. A
    /// second call does nothing.
    ///
    /// # Errors
    /// The release's error ([`Error::Store`] when the store failed or the
    /// release timeout ran out: the lease then ends at its TTL, as it does
    /// after a crash); the cause when leadership was lost before.
    pub async fn resign(&self) -> Result<()> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.resigned.store(true, Ordering::SeqCst);
        self.lost.cancel();
        // Released after the term's record is written, if it still is
        // (waiting at most the release timeout).
        let timeout = self.elector.inner.release_timeout;
        let _record = tokio::time::timeout(timeout, self.record.lock()).await;
        let leases = self.elector.inner.leases.clone();
        finish_within(leases, self.renewal.clone(), None, timeout).await
    }

    /// Ends this term when a step-down request for it arrives
    /// ([`request_step_down`](super::request_step_down)) or the first write of its record failed:
    /// the lost signal fires (cause `Resigned`, or the write's error) while
    /// the lease stays renewed; [`Elector::lead`] releases once the
    /// function has returned, so that nobody else leads while the work is
    /// still stopping. A task that ends with `stop`.
    pub(super) fn watch_term(&self, stop: CancellationToken) {
        let requests = self.elector.inner.step_down.clone();
        let (elector, resigned, lost, record_failed) = (
            self.elector.clone(),
            self.resigned.clone(),
            self.lost.clone(),
            self.record_failed.clone(),
        );
        let term = self.state.generation;
        tokio::spawn(async move {
            let store = elector.inner.leases.store().clone();
            let interval = elector.inner.renew_interval;
            tokio::select! {
                asked = step_down::requested(store, requests, term, interval, stop) => if asked {
                    tracing::info!(
                        election = %elector.inner.election,
                        term,
                        "step-down requested: stopping the work; the lease is released once it stopped"
                    );
                    resigned.store(true, Ordering::SeqCst);
                    lost.cancel();
                },
                () = record_failed.failed() => lost.cancel(),
            }
        });
    }

    /// The latest lease token (renewals extend it).
    pub fn token(&self) -> Token {
        self.renewal.token()
    }

    /// Publishes `value` with this leadership (etcd `Proclaim`): observers
    /// see it from the next read on (within one poll interval of theirs),
    /// and this elector's later terms publish it too. One fenced
    /// checkpoint write of the election's record, which also renews the
    /// lease.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a value over
    /// [`crate::limits::MAX_PUBLISHED_VALUE_BYTES`] (nothing written);
    /// [`Error::Fenced`] / [`Error::Expired`] once leadership is lost;
    /// [`Error::Store`] when the store fails (the value may or may not have
    /// been written).
    pub async fn publish(&self, value: impl Into<Bytes>) -> Result<()> {
        let value = value.into();
        check_value(&value)?;
        let mut record = self.record.lock().await;
        let next = Record {
            value: Some(value.clone()),
            ..record.clone()
        };
        let leases = &self.elector.inner.leases;
        leases
            .checkpoint(&self.renewal.token(), next.encode())
            .await?;
        self.elector.remember(&next);
        *record = next;
        *self
            .elector
            .inner
            .value
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(value);
        Ok(())
    }

    /// The value this leadership publishes now.
    pub async fn value(&self) -> Option<Bytes> {
        self.record.lock().await.value.clone()
    }

    /// How this leadership's lease can be lost (not given up), for
    /// [`crate::leader::elect`].
    pub(crate) fn loss(&self) -> Loss {
        Loss {
            renewal: self.renewal.clone(),
            record_failed: self.record_failed.clone(),
        }
    }
}
