//! Acquire, renew, checkpoint, read, release: the lease API of the Go
//! `worklease` package, over any [`LeaseStore`]. The holder's own
//! deadline (when it stops believing a lease is its own) is
//! [`Leases::deadline_from`]'s rule, applied to every grant and renewal.

pub(crate) mod acquire;
pub(crate) mod background;
pub(crate) mod batch;
mod data;
pub mod fair;
pub(crate) mod finish;
pub(crate) mod granting;
mod options;
pub(crate) mod renewal;
pub(crate) mod session;

pub use data::CheckpointData;
pub use options::{AcquireOptions, Config, DEFAULT_POLL_INTERVAL};

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tracing::field::Empty;
use tracing::Instrument;

use crate::error::{Error, InvalidInput, Result};
use crate::lease::renewal::{Renewal, RenewalOptions};
use crate::lease::session::SessionHandle;
use crate::limits::{check_checkpoint, check_ttl, HolderId};
use crate::metrics::{self as m, finish_span};
use crate::observe::{
    CheckpointEvent, FencedEvent, LeaseObserver, Operation, ReadCheckpointEvent, ReleaseEvent,
    RenewEvent,
};
use crate::store::{Checkpoint, Handoff, LeaseStore};
use crate::token::{lease_ref, Token};

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) holder_id: HolderId,
    pub(crate) ttl: Duration,
    pub(crate) margin: Duration,
    pub(crate) observer: Arc<dyn LeaseObserver>,
    /// The one renewal scheduler of this handle and its clones.
    pub(crate) session: SessionHandle,
    /// Everything this handle and its clones run in the background
    /// ([`Leases::settle`] waits for it).
    pub(crate) background: crate::lease::background::Pending,
    /// Of those, the places in fair lines being let go of (a fair
    /// acquisition waits for them first: otherwise it would find its own
    /// old place still in the line, ahead of it).
    pub(crate) letting_go: crate::lease::background::Pending,
}

/// A holder's handle on a store: acquires, renews, checkpoints and releases
/// leases (Go: `worklease.New`). Cheap to clone; clones share the holder.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use worklease::{store::memory::MemoryStore, AcquireOptions, Config, Leases};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> worklease::Result<()> {
/// let leases = Leases::new(Arc::new(MemoryStore::new()), Config::new("worker-1", Duration::from_secs(15)))?;
/// let token = leases.acquire("nightly-report", AcquireOptions::new()).await?;
/// let prior = leases.read_checkpoint(&token).await?;
/// assert!(prior.data.is_none());
/// let token = leases.checkpoint(&token, &b"page 7"[..]).await?;
/// leases.release(token).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Leases {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("store", &self.inner.store.kind())
            .field("holder_id", &self.inner.holder_id)
            .field("ttl", &self.inner.ttl)
            .finish()
    }
}

impl Leases {
    /// A handle for `config`'s holder on `store`.
    ///
    /// # Errors
    /// [`Error::Invalid`] for an empty, oversized or control-character holder
    /// ID, a TTL under 1 ms or over [`crate::limits::MAX_TTL`], or a safety
    /// margin not shorter than the TTL.
    pub fn new(store: Arc<dyn LeaseStore>, config: Config) -> Result<Self> {
        let holder_id = HolderId::new(config.holder_id)?;
        let ttl = check_ttl(config.ttl)?;
        let margin = config.safety_margin.unwrap_or(ttl / 10);
        if margin >= ttl {
            return Err(InvalidInput::Config(format!(
                "safety margin {margin:?} must be shorter than the TTL {ttl:?}"
            ))
            .into());
        }
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                holder_id,
                ttl,
                margin,
                observer: config.observer,
                session: SessionHandle::default(),
                background: crate::lease::background::Pending::default(),
                letting_go: crate::lease::background::Pending::default(),
            }),
        })
    }

    /// This handle's holder ID.
    pub fn holder_id(&self) -> &HolderId {
        &self.inner.holder_id
    }

    /// The TTL of every acquisition and renewal.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The safety margin (see [`Config::safety_margin`]).
    pub fn safety_margin(&self) -> Duration {
        self.inner.margin
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.inner.store
    }

    /// Acquires the lease on `work_id` (Go: `Acquire`).
    ///
    /// # Errors
    /// * [`Error::Held`] when another acquisition is live and waiting was
    ///   not asked for;
    /// * [`Error::Expired`] when the store granted the lease but its reply
    ///   came after the holder's deadline (the grant is handed back; a
    ///   waiting acquisition waits on instead);
    /// * [`Error::Cancelled`] / [`Error::WaitTimedOut`] when a wait is
    ///   cancelled or runs out (never `Held`);
    /// * [`Error::Invalid`] for a bad work ID (one worklease keeps for
    ///   itself included: [`crate::is_internal_work_id`]) or poll interval
    ///   (nothing is written);
    /// * [`Error::Store`] when the store fails (also while waiting: the
    ///   caller decides whether to try again).
    pub async fn acquire(&self, work_id: &str, options: AcquireOptions) -> Result<Token> {
        self.acquire_handed(work_id, options)
            .await
            .map(|(token, _)| token)
    }

    /// [`Leases::acquire`] with the hand-off the store reported with the
    /// grant (`None` where the store did not tell it).
    pub(crate) async fn acquire_handed(
        &self,
        work_id: &str,
        options: AcquireOptions,
    ) -> Result<(Token, Option<Handoff>)> {
        let wait = options.wait;
        let acquisition = async {
            let work_id = crate::internal::user_work_id(work_id)?;
            if options.fair {
                let id = work_id.clone();
                let try_target: crate::fair::TryTarget<'_> = Box::new(move |o| {
                    let id = id.clone();
                    Box::pin(async move {
                        let ids = std::slice::from_ref(&id);
                        let (token, handoff) = self.acquire_granted(ids, o).await?;
                        Ok((token, Some(handoff)))
                    })
                });
                return self
                    .acquire_fair(work_id.as_str(), options, try_target)
                    .await;
            }
            self.acquire_granted(std::slice::from_ref(&work_id), options)
                .await
                .map(|(token, handoff)| (token, Some(handoff)))
        };
        self.traced_acquisition(work_id, wait, acquisition, |(t, _)| t.fencing_token)
            .await
    }

    /// Runs `acquisition` of `work_id` (for several, the first) in the
    /// span `worklease.acquire`, then records its outcome there (with the
    /// token `fencing_token` reads from a grant) and in the acquisition
    /// metrics.
    pub(crate) async fn traced_acquisition<T>(
        &self,
        work_id: &str,
        wait: bool,
        acquisition: impl std::future::Future<Output = Result<T>>,
        fencing_token: impl FnOnce(&T) -> u64,
    ) -> Result<T> {
        let store = self.inner.store.kind();
        let span = tracing::info_span!(
            "worklease.acquire",
            work_id,
            holder = %self.inner.holder_id,
            store,
            wait,
            fencing_token = Empty,
            outcome = Empty,
            duration_ms = Empty,
        );
        let started = Instant::now();
        let result = acquisition.instrument(span.clone()).await;
        finish_span(
            &span,
            started,
            &result,
            result.as_ref().ok().map(fencing_token),
        );
        m::count(m::ACQUISITIONS_TOTAL, store, &result);
        result
    }
    /// How long after it sent an acquire or renew request a holder keeps
    /// believing the lease it got is its own: the TTL less the safety
    /// margin (the crate docs' "Clocks").
    pub(crate) fn belief_window(&self) -> Duration {
        self.inner.ttl - self.inner.margin
    }

    /// The holder's own deadline for a lease whose acquire or renew request
    /// was sent at `sent` (tokio's monotonic clock): `sent` + TTL − safety
    /// margin. Every grant and renewal sets its token's deadline here; the
    /// session fires the lost signal when it passes.
    pub(crate) fn deadline_from(&self, sent: Instant) -> Instant {
        sent + self.belief_window()
    }

    pub(crate) fn check_token(&self, token: &Token) -> Result<()> {
        if token.holder_id != self.inner.holder_id {
            return Err(InvalidInput::ForeignToken {
                token_holder: token.holder_id.to_string(),
                holder: self.inner.holder_id.to_string(),
            }
            .into());
        }
        Ok(())
    }

    pub(crate) fn report_fenced(&self, token: &Token, operation: Operation, error: &Error) {
        if matches!(error, Error::Fenced { .. }) {
            metrics::counter!(m::FENCED_TOTAL, "operation" => operation_label(operation))
                .increment(1);
            self.inner.observer.on_fenced(&FencedEvent {
                token,
                operation,
                error,
            });
        }
    }

    /// One renewal attempt, reported to the observer as attempt `attempt`.
    pub(crate) async fn renew_attempt(&self, token: &Token, attempt: u32) -> Result<Token> {
        let store = self.inner.store.kind();
        let span = self.op_span(SpanOp::Renew, token);
        span.record("attempt", attempt);
        let started = Instant::now();
        let result = self
            .renew_inner(token, attempt)
            .instrument(span.clone())
            .await;
        finish_span(&span, started, &result, None);
        m::count(m::RENEWALS_TOTAL, store, &result);
        if result.is_ok() {
            self.note_renewed(token);
        }
        result
    }

    /// Records how close the renewal of `token` (the token before it) came
    /// to losing the lease: the lifetime left on its deadline when the
    /// renewal came back.
    pub(crate) fn note_renewed(&self, token: &Token) {
        if let Some(left) = token.remaining() {
            metrics::gauge!(m::LEASE_REMAINING_SECONDS, "work_id" => token.work_id.label())
                .set(left.as_secs_f64());
            metrics::gauge!(m::LEASE_TTL_SECONDS, "work_id" => token.work_id.label())
                .set(self.inner.ttl.as_secs_f64());
        }
    }

    /// The span of an operation on `token`, with the fields every
    /// operation span has (`outcome` and `duration_ms` recorded at its end).
    fn op_span(&self, op: SpanOp, token: &Token) -> tracing::Span {
        // `tracing::span!` needs a constant level and name: one arm each.
        macro_rules! op_span {
            ($level:ident, $name:literal) => {
                tracing::span!(
                    tracing::Level::$level,
                    $name,
                    work_id = %token.work_id,
                    holder = %token.holder_id,
                    fencing_token = token.fencing_token,
                    store = self.inner.store.kind(),
                    attempt = Empty,
                    size = Empty,
                    outcome = Empty,
                    duration_ms = Empty,
                )
            };
        }
        match op {
            SpanOp::Renew => op_span!(DEBUG, "worklease.renew"),
            SpanOp::Checkpoint => op_span!(DEBUG, "worklease.checkpoint"),
            SpanOp::ReadCheckpoint => op_span!(DEBUG, "worklease.read_checkpoint"),
            SpanOp::Release => op_span!(INFO, "worklease.release"),
        }
    }

    /// The end of a store call on `token` sent at `sent` (renew,
    /// checkpoint, release): records its duration, tells the observer
    /// through `notify(error, duration)`, and reports a fencing.
    fn after_call<T>(
        &self,
        token: &Token,
        operation: Operation,
        sent: Instant,
        result: &Result<T>,
        notify: impl FnOnce(Option<&Error>, Duration),
    ) {
        let duration = sent.elapsed();
        m::store_call(
            self.inner.store.kind(),
            operation_label(operation),
            duration,
        );
        let error = result.as_ref().err();
        notify(error, duration);
        if let Some(e) = error {
            self.report_fenced(token, operation, e);
        }
    }

    async fn renew_inner(&self, token: &Token, attempt: u32) -> Result<Token> {
        self.check_token(token)?;
        let sent = Instant::now();
        let result = self
            .inner
            .store
            .renew(lease_ref(token), self.inner.ttl)
            .await;
        self.after_call(token, Operation::Renew, sent, &result, |error, duration| {
            self.inner.observer.on_renew(&RenewEvent {
                token,
                error,
                attempt,
                duration,
            });
        });
        Ok(self.extended(token, sent, result?))
    }

    pub(crate) fn extended(
        &self,
        token: &Token,
        sent: Instant,
        expires_at: std::time::SystemTime,
    ) -> Token {
        Token {
            expires_at,
            ttl: self.inner.ttl,
            deadline: Some(self.deadline_from(sent)),
            ..token.clone()
        }
    }

    /// Extends the lease by the TTL from now (Go: `Renew`) and returns the
    /// extended token.
    ///
    /// # Errors
    /// [`Error::Expired`] when the lease expired or was released and nobody
    /// took it; [`Error::Fenced`] when another acquisition replaced it, an
    /// operator revoked it, or it never existed; [`Error::Invalid`] for a
    /// token of another holder; [`Error::Store`] when the store fails.
    pub async fn renew(&self, token: &Token) -> Result<Token> {
        self.renew_attempt(token, 1).await
    }

    /// Stores `data` as the work ID's checkpoint AND extends the lease, in
    /// one atomic step (Go: `Checkpoint`; "I am alive, and here is where I
    /// am"). Returns the extended token. `data` may be borrowed
    /// ([`CheckpointData`]: `line.as_bytes()`, `&buf`) or owned.
    ///
    /// # Errors
    /// As [`Leases::renew`]; also [`Error::Invalid`] for a checkpoint over
    /// [`crate::limits::MAX_CHECKPOINT_BYTES`], or over the store's own
    /// lower limit ([`crate::store::LeaseStore::max_checkpoint_bytes`]: a
    /// DynamoDB item holds less), naming the limit (nothing is written).
    pub async fn checkpoint(&self, token: &Token, data: impl CheckpointData) -> Result<Token> {
        let data = data.into_checkpoint();
        let store = self.inner.store.kind();
        let span = self.op_span(SpanOp::Checkpoint, token);
        span.record("size", data.len());
        let started = Instant::now();
        let result = self
            .checkpoint_inner(token, data)
            .instrument(span.clone())
            .await;
        finish_span(&span, started, &result, None);
        m::count(m::CHECKPOINTS_TOTAL, store, &result);
        result
    }

    async fn checkpoint_inner(&self, token: &Token, data: Bytes) -> Result<Token> {
        self.check_token(token)?;
        check_checkpoint(data.len(), self.inner.store.max_checkpoint_bytes())?;
        let size = data.len();
        let sent = Instant::now();
        let result = self
            .inner
            .store
            .checkpoint(lease_ref(token), self.inner.ttl, data)
            .await;
        self.after_call(
            token,
            Operation::Checkpoint,
            sent,
            &result,
            |error, duration| {
                self.inner.observer.on_checkpoint(&CheckpointEvent {
                    token,
                    size,
                    error,
                    duration,
                });
            },
        );
        Ok(self.extended(token, sent, result?))
    }

    /// The last acknowledged checkpoint of the work ID and the hand-off facts
    /// of this token's acquisition (Go: `ReadCheckpoint`). No data (not an
    /// error) on the first acquisition of a work ID.
    ///
    /// # Errors
    /// [`Error::Fenced`] / [`Error::Expired`] for a token that is not the
    /// current live lease; [`Error::Store`] when the store fails.
    pub async fn read_checkpoint(&self, token: &Token) -> Result<Checkpoint> {
        let span = self.op_span(SpanOp::ReadCheckpoint, token);
        let started = Instant::now();
        let result = self
            .read_checkpoint_inner(token)
            .instrument(span.clone())
            .await;
        if let Ok(c) = &result {
            span.record("size", c.data.as_ref().map_or(0, Bytes::len));
        }
        finish_span(&span, started, &result, None);
        result
    }

    async fn read_checkpoint_inner(&self, token: &Token) -> Result<Checkpoint> {
        self.check_token(token)?;
        let sent = Instant::now();
        let result = self.inner.store.read_checkpoint(lease_ref(token)).await;
        let duration = sent.elapsed();
        m::store_call(self.inner.store.kind(), "read_checkpoint", duration);
        let (size, clean_handoff) = match &result {
            Ok(c) => (c.data.as_ref().map_or(0, Bytes::len), c.clean_handoff()),
            Err(_) => (0, false),
        };
        self.inner
            .observer
            .on_read_checkpoint(&ReadCheckpointEvent {
                token,
                size,
                clean_handoff,
                error: result.as_ref().err(),
                duration,
            });
        result
    }

    /// Ends the lease at once and marks the hand-off clean (Go: `Release`):
    /// a waiting successor gets it on its next attempt, not after a TTL. The
    /// checkpoint is kept.
    ///
    /// # Errors
    /// As [`Leases::renew`]; a failed release changes nothing.
    pub async fn release(&self, token: Token) -> Result<()> {
        let store = self.inner.store.kind();
        let span = self.op_span(SpanOp::Release, &token);
        let started = Instant::now();
        let result = self.release_inner(token).instrument(span.clone()).await;
        finish_span(&span, started, &result, None);
        m::count(m::RELEASES_TOTAL, store, &result);
        result
    }

    async fn release_inner(&self, token: Token) -> Result<()> {
        self.check_token(&token)?;
        let sent = Instant::now();
        let result = self.inner.store.release(lease_ref(&token)).await;
        self.after_call(
            &token,
            Operation::Release,
            sent,
            &result,
            |error, duration| {
                self.inner.observer.on_release(&ReleaseEvent {
                    token: &token,
                    error,
                    duration,
                });
            },
        );
        if result.is_ok() {
            tracing::debug!(work_id = %token.work_id, fencing_token = token.fencing_token, "lease released");
        }
        result
    }

    /// Starts renewing `token` in the background (Go: `StartRenewal`). See
    /// [`Renewal`] for the lost signal and [`Renewal::stop`].
    ///
    /// # Errors
    /// [`Error::Invalid`] when the options break a rule (see
    /// [`RenewalOptions::check`]) or the token belongs to another holder.
    pub fn start_renewal(&self, token: Token, options: RenewalOptions) -> Result<Renewal> {
        self.check_token(&token)?;
        Renewal::start(self.clone(), token, options)
    }
}

/// The operations with a span on a token (see `Leases::op_span`).
#[derive(Clone, Copy)]
enum SpanOp {
    Renew,
    Checkpoint,
    ReadCheckpoint,
    Release,
}

/// The name of `operation` in metrics (`operation` label, store call).
fn operation_label(operation: Operation) -> &'static str {
    match operation {
        Operation::Renew => "renew",
        Operation::Checkpoint => "checkpoint",
        Operation::Release => "release",
    }
}
