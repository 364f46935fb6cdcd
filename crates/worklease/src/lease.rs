//! Acquire, renew, checkpoint, read, release: the lease API of the Go
//! `worklease` package, over any [`LeaseStore`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::field::Empty;
use tracing::Instrument;

use crate::error::{Error, InvalidInput, Result};
use crate::limits::{check_checkpoint, check_ttl, HolderId, WorkId};
use crate::metrics::{self as m, finish_span};
use crate::observe::{
    AcquireEvent, CheckpointEvent, FencedEvent, LeaseObserver, NoopObserver, Operation,
    ReadCheckpointEvent, ReleaseEvent, RenewEvent,
};
use crate::renewal::{Renewal, RenewalOptions};
use crate::session::SessionHandle;
use crate::store::{Checkpoint, Grant, LeaseRef, LeaseStore};
use crate::token::Token;

/// The default poll interval of a waiting acquisition (as in the Go
/// original).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Settings of a [`Leases`] handle (Go: `Config`).
#[derive(Clone)]
pub struct Config {
    holder_id: String,
    ttl: Duration,
    safety_margin: Option<Duration>,
    observer: Arc<dyn LeaseObserver>,
}

impl Config {
    /// A holder ID (unique per process: two processes with one holder ID are
    /// one holder to the store) and a lease TTL. Checked by [`Leases::new`].
    pub fn new(holder_id: impl Into<String>, ttl: Duration) -> Self {
        Self {
            holder_id: holder_id.into(),
            ttl,
            safety_margin: None,
            observer: Arc::new(NoopObserver),
        }
    }

    /// The observer of every operation; default [`NoopObserver`].
    pub fn observer(mut self, observer: Arc<dyn LeaseObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// How long before the end of its TTL a holder stops counting the lease
    /// as its own (the crate docs' "Clocks": send time + TTL − margin). It covers
    /// clock-rate differences between holder and store and the time a
    /// holder needs to stop its work. Default: TTL/10. Must be shorter than
    /// the TTL.
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = Some(margin);
        self
    }
}

/// Options of one acquisition (Go: `WithWaitForLease`, `WithPollInterval`).
#[derive(Clone, Debug)]
pub struct AcquireOptions {
    wait: bool,
    poll_interval: Duration,
    wait_timeout: Option<Duration>,
    cancel: Option<CancellationToken>,
}

impl Default for AcquireOptions {
    fn default() -> Self {
        Self {
            wait: false,
            poll_interval: DEFAULT_POLL_INTERVAL,
            wait_timeout: None,
            cancel: None,
        }
    }
}

impl AcquireOptions {
    /// Fail fast with `Held` when the lease is taken.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wait until the lease is free instead of failing with `Held`. The wait
    /// ends early when the store notifies a release, when the holder's lease
    /// is due to expire by the store's clock, and otherwise every poll
    /// interval. Cancel it by dropping the future, through
    /// [`AcquireOptions::cancel_on`], or with [`AcquireOptions::wait_timeout`].
    pub fn wait_for_lease(mut self) -> Self {
        self.wait = true;
        self
    }

    /// Whether waiting was asked for (Go: `HasWaitForLease`).
    pub fn waits(&self) -> bool {
        self.wait
    }

    /// How often a waiting acquisition retries; default 2 s; must be at
    /// least 1 ms.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The poll interval in force.
    pub fn get_poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// Give up waiting after `timeout` with [`Error::WaitTimedOut`].
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = Some(timeout);
        self
    }

    /// Give up waiting with [`Error::Cancelled`] when `cancel` fires.
    pub fn cancel_on(mut self, cancel: CancellationToken) -> Self {
        self.cancel = Some(cancel);
        self
    }
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) holder_id: HolderId,
    pub(crate) ttl: Duration,
    pub(crate) margin: Duration,
    pub(crate) observer: Arc<dyn LeaseObserver>,
    /// The one renewal scheduler of this handle and its clones.
    pub(crate) session: SessionHandle,
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
    /// * [`Error::Invalid`] for a bad work ID or poll interval (nothing is
    ///   written);
    /// * [`Error::Store`] when the store fails (also while waiting: the
    ///   caller decides whether to try again).
    pub async fn acquire(&self, work_id: &str, options: AcquireOptions) -> Result<Token> {
        let store = self.inner.store.kind();
        let span = tracing::info_span!(
            "worklease.acquire",
            work_id,
            holder = %self.inner.holder_id,
            store,
            wait = options.wait,
            fencing_token = Empty,
            outcome = Empty,
            duration_ms = Empty,
        );
        let started = Instant::now();
        let result = async {
            let work_id = WorkId::new(work_id)?;
            self.acquire_first(std::slice::from_ref(&work_id), options)
                .await
        }
        .instrument(span.clone())
        .await;
        finish_span(
            &span,
            started,
            &result,
            result.as_ref().ok().map(|t| t.fencing_token),
        );
        m::count(m::ACQUISITIONS_TOTAL, store, &result);
        result
    }

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
            let result = self.try_first(work_ids).await;
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
                        let e = Error::Expired {
                            work_id: work_ids[i].to_string(),
                            fencing_token: grant.fencing_token,
                        };
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
                    return Ok(token);
                }
                Ok(Err(held)) if options.wait => held.expires_in,
                Ok(Err(held)) => {
                    return Err(self.acquire_failed(first, attempts, duration, held.error))
                }
                Err(e) => return Err(self.acquire_failed(first, attempts, duration, e)),
            };
            // Sleep until the next poll, or just past the holder's expiry if
            // that comes first; a jitter of up to 10% spreads many waiters.
            let mut nap = options.poll_interval;
            if let Some(left) = expires_in {
                nap = nap.min(left + Duration::from_millis(1));
            }
            nap = nap.saturating_add(nap.mul_f64(rand::thread_rng().gen_range(0.0..0.1)));
            let give_up = |e: Error| Err(self.acquire_failed(first, attempts, duration, e));
            let woken = async {
                if watches.is_empty() {
                    std::future::pending::<()>().await
                } else {
                    futures_util::future::select_all(watches).await;
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(nap) => {}
                _ = woken => {}
                _ = async { match &options.cancel { Some(c) => c.cancelled().await, None => std::future::pending().await } } => {
                    return give_up(Error::Cancelled { work_id: first.to_string() });
                }
                _ = async { match wait_until { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {
                    return give_up(Error::WaitTimedOut {
                        work_id: first.to_string(),
                        waited: options.wait_timeout.unwrap_or_default(),
                    });
                }
            }
        }
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
        for (c, chunk) in work_ids.chunks(max).enumerate() {
            for (i, outcome) in store
                .acquire_many(chunk, holder, ttl, 1)
                .await?
                .into_iter()
                .enumerate()
            {
                match outcome {
                    Ok(g) => return Ok(Ok((c * max + i, g))),
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

    pub(crate) fn deadline_from(&self, sent: Instant) -> Instant {
        sent + (self.inner.ttl - self.inner.margin)
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
            let work_id = token.work_id.to_string();
            metrics::gauge!(m::LEASE_REMAINING_SECONDS, "work_id" => work_id.clone())
                .set(left.as_secs_f64());
            metrics::gauge!(m::LEASE_TTL_SECONDS, "work_id" => work_id)
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
    /// am"). Returns the extended token.
    ///
    /// # Errors
    /// As [`Leases::renew`]; also [`Error::Invalid`] for a checkpoint over
    /// [`crate::limits::MAX_CHECKPOINT_BYTES`] (nothing is written).
    pub async fn checkpoint(&self, token: &Token, data: impl Into<Bytes>) -> Result<Token> {
        let data = data.into();
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
        check_checkpoint(data.len())?;
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

pub(crate) fn lease_ref(token: &Token) -> LeaseRef<'_> {
    LeaseRef {
        work_id: &token.work_id,
        holder_id: &token.holder_id,
        fencing_token: token.fencing_token,
    }
}
