//! Background renewal (Go: `StartRenewal`, `WithRenewalInterval`,
//! `WithRenewalBackoff`).
//!
//! A task renews the lease every interval (default TTL/3, which leaves room
//! for two retries inside the TTL). A failed renewal is retried with
//! exponential backoff and jitter while the lease can still be saved, that
//! is until the holder's deadline: the send time of the last successful
//! acquire or renew, plus the TTL, minus the safety margin. Each attempt is
//! bounded by that deadline, so a renew request that hangs cannot keep a
//! lost lease alive. When the lease is lost the lost signal fires with the
//! cause: `Fenced` or `Expired` at once (never retried), `WindowExhausted`
//! when the deadline passed without a successful renewal.
//!
//! Between renewals the task also listens to the store's notifications for
//! its work ID ([`LeaseStore::watch`](crate::LeaseStore::watch): release
//! and revocation): on one it renews at once (at most once per 100 ms
//! after the last renewal), so a lease taken away by an operator
//! (`revoke`, `worklease release --force`) fires the lost signal within
//! the store's notification latency instead of at the next interval. On
//! stores without notifications (register stores such as S3) the holder
//! learns of it at its next renewal, as before.

use std::time::Duration;

use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, InvalidInput, Result};
use crate::lease::Leases;
use crate::token::Token;

/// Options of background renewal.
#[derive(Debug, Clone)]
pub struct RenewalOptions {
    interval: Option<Duration>,
    backoff_initial: Duration,
    backoff_max: Duration,
    jitter: f64,
}

impl Default for RenewalOptions {
    fn default() -> Self {
        Self {
            interval: None,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            jitter: 0.2,
        }
    }
}

impl RenewalOptions {
    /// Defaults: interval TTL/3; backoff 100 ms initial, 5 s max, jitter 0.2.
    pub fn new() -> Self {
        Self::default()
    }

    /// Time from one successful renewal's send to the next renewal. Must be
    /// at least 1 ms and shorter than TTL − safety margin.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = Some(interval);
        self
    }

    /// Retry a failed renewal after `initial`, doubling up to `max`, each
    /// wait varied by ± `jitter` (a fraction from 0 to 1). Never past the
    /// lease window.
    pub fn backoff(mut self, initial: Duration, max: Duration, jitter: f64) -> Self {
        self.backoff_initial = initial;
        self.backoff_max = max;
        self.jitter = jitter;
        self
    }

    /// Checks these options against `leases`' TTL and safety margin, and
    /// returns the renewal interval in force. Call it before acquiring when
    /// a lease that cannot be renewed is of no use: nothing is written.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the rule: the interval (default TTL/3) at
    /// least 1 ms and shorter than TTL − safety margin; backoff initial at
    /// least 1 ms and not above max; jitter between 0 and 1.
    pub fn check(&self, leases: &Leases) -> Result<Duration> {
        let window = leases.ttl() - leases.safety_margin();
        let interval = self.interval.unwrap_or(leases.ttl() / 3);
        let rule = |msg: String| Err(Error::from(InvalidInput::Config(msg)));
        if self.interval.is_none() && interval < Duration::from_millis(1) {
            return rule(format!(
                "TTL {:?} is too short to renew in the background: renewals every TTL/3 must be at least 1ms apart, so the TTL must be at least 3ms",
                leases.ttl()
            ));
        }
        if interval < Duration::from_millis(1) || interval >= window {
            return rule(format!(
                "renewal interval {interval:?} must be at least 1ms and shorter than TTL - safety margin ({window:?})"
            ));
        }
        if self.backoff_initial < Duration::from_millis(1)
            || self.backoff_max < self.backoff_initial
        {
            return rule(format!(
                "renewal backoff initial {:?} must be at least 1ms and not above max {:?}",
                self.backoff_initial, self.backoff_max
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return rule(format!(
                "renewal jitter {} must be between 0 and 1",
                self.jitter
            ));
        }
        Ok(interval)
    }
}

#[derive(Clone)]
struct Shared {
    token: Token,
    lost: Option<Error>,
}

/// A running background renewal (Go: the `renewCtx` and `stop` pair).
///
/// Dropping it stops the renewal (without releasing the lease).
pub struct Renewal {
    state: watch::Receiver<Shared>,
    lost: CancellationToken,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Renewal {
    pub(crate) fn start(leases: Leases, token: Token, options: RenewalOptions) -> Result<Self> {
        let interval = options.check(&leases)?;
        let (tx, rx) = watch::channel(Shared {
            token: token.clone(),
            lost: None,
        });
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        // Watch before returning: a revocation right after `start` returns
        // must be seen, even before the task first runs.
        let watched = leases.store().watch(&token.work_id);
        let task = tokio::spawn(run(
            leases,
            token,
            options,
            interval,
            watched,
            tx,
            lost.clone(),
            stop.clone(),
        ));
        Ok(Self {
            state: rx,
            lost,
            stop,
            task: Some(task),
        })
    }

    /// The latest token (renewals extend its expiry and deadline).
    pub fn token(&self) -> Token {
        self.state.borrow().token.clone()
    }

    /// A signal that fires when the lease is lost; pass it to the work so it
    /// stops. Stopping the renewal does not fire it.
    pub fn lost_signal(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Why the lease was lost, once it was: `Fenced`, `Expired` or
    /// `WindowExhausted`.
    pub fn lost_cause(&self) -> Option<Error> {
        self.state.borrow().lost.clone()
    }

    /// The latest token if the lease is still this holder's by its own
    /// clock: neither lost nor past its deadline. Call it right before an
    /// external side effect: after a pause (GC, SIGSTOP) the work may run
    /// before the renewal task had a chance to fire the lost signal.
    ///
    /// # Errors
    /// The loss's cause, or `WindowExhausted` when the deadline has passed.
    pub fn ensure_live(&self) -> Result<Token> {
        if let Some(e) = self.lost_cause() {
            return Err(e);
        }
        let t = self.token();
        if t.remaining() == Some(Duration::ZERO) {
            return Err(Error::WindowExhausted {
                work_id: t.work_id.to_string(),
                fencing_token: t.fencing_token,
                last_error: Some("the lease deadline passed before a renewal succeeded".into()),
            });
        }
        Ok(t)
    }

    /// Waits until the lease is lost and returns the cause.
    pub async fn lost(&self) -> Error {
        self.lost.cancelled().await;
        self.lost_cause().unwrap_or_else(|| Error::WindowExhausted {
            work_id: self.token().work_id.to_string(),
            fencing_token: self.token().fencing_token,
            last_error: None,
        })
    }

    /// Stops renewing without waiting for the task (it ends at its next
    /// step); the handle still reports the latest token.
    pub(crate) fn halt(&self) {
        self.stop.cancel();
    }

    /// Waits for the next change: `Ok` with the renewed token after each
    /// successful renewal, `Err` with the cause once the lease is lost (and
    /// at every call after that).
    pub async fn changed(&mut self) -> Result<Token> {
        if let Some(e) = self.lost_cause() {
            return Err(e);
        }
        // The sender lives in the task: it is gone only when the task ended
        // without reporting a loss (it panicked). Count the lease lost then.
        if self.state.changed().await.is_err() {
            let t = self.token();
            return Err(self.lost_cause().unwrap_or(Error::WindowExhausted {
                work_id: t.work_id.to_string(),
                fencing_token: t.fencing_token,
                last_error: Some("the renewal task ended unexpectedly".into()),
            }));
        }
        let state = self.state.borrow_and_update().clone();
        match state.lost {
            Some(e) => Err(e),
            None => Ok(state.token),
        }
    }

    /// Stops renewing and returns the latest token, to release or to hand on.
    ///
    /// # Errors
    /// The cause of the loss when the lease was lost before the stop.
    pub async fn stop(mut self) -> Result<Token> {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            // A join error means the task panicked before it could report a
            // loss: count the lease lost, never hand back a token that
            // nobody renewed.
            if let Err(e) = task.await {
                let t = self.token();
                self.lost.cancel();
                return Err(Error::WindowExhausted {
                    work_id: t.work_id.to_string(),
                    fencing_token: t.fencing_token,
                    last_error: Some(format!("the renewal task failed: {e}")),
                });
            }
        }
        let state = self.state.borrow().clone();
        match state.lost {
            Some(e) => Err(e),
            None => Ok(state.token),
        }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The shortest time between a renewal and an early one woken by a store
/// notification: a store that notifies often (spurious wake-ups are
/// allowed) costs at most one renewal per this gap.
const EARLY_CHECK_GAP: Duration = Duration::from_millis(100);

/// Completes when `watched` does; never when there is none.
async fn notified(watched: &mut Option<futures_util::future::BoxFuture<'static, ()>>) {
    match watched.as_mut() {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

#[allow(clippy::too_many_arguments)]
async fn run(
    leases: Leases,
    mut token: Token,
    options: RenewalOptions,
    interval: Duration,
    mut watched: Option<futures_util::future::BoxFuture<'static, ()>>,
    tx: watch::Sender<Shared>,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    let _held = HeldGauge::new(leases.store().kind());
    // The send time of the last successful acquire or renew; a parsed token
    // (no deadline) is renewed at once and has no window for retries.
    let mut last_sent = token
        .deadline
        .map(|d| d - (leases.ttl() - leases.safety_margin()));
    loop {
        if let Some(sent) = last_sent {
            let early = tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(sent + interval) => false,
                _ = notified(&mut watched) => true,
            };
            if early {
                tracing::debug!(work_id = %token.work_id, "store notification for a held lease: renewing now");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep_until((sent + EARLY_CHECK_GAP).min(sent + interval)) => {}
                }
            }
        }
        // Watch again before renewing: a change after this renewal is seen.
        watched = leases.store().watch(&token.work_id);
        let mut attempt = 0;
        let mut backoff = options.backoff_initial;
        let outcome = loop {
            attempt += 1;
            let now = Instant::now();
            let deadline = token
                .deadline
                .unwrap_or(now + (leases.ttl() - leases.safety_margin()));
            let sent = Instant::now();
            let result = tokio::select! {
                _ = stop.cancelled() => return,
                r = tokio::time::timeout_at(deadline, leases.renew_attempt(&token, attempt)) => r,
            };
            let error = match result {
                Ok(Ok(renewed)) => {
                    last_sent = Some(sent);
                    break Ok(renewed);
                }
                Ok(Err(e)) if !e.is_transient() => break Err(e),
                Ok(Err(e)) => e.to_string(),
                Err(_elapsed) => "no renewal succeeded before the lease deadline (the store did not answer in time, or this process was paused)".to_string(),
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if token.deadline.is_none() || left < Duration::from_millis(1) {
                break Err(Error::WindowExhausted {
                    work_id: token.work_id.to_string(),
                    fencing_token: token.fencing_token,
                    last_error: Some(error),
                });
            }
            // Bound the wait by the window first, so that the jitter's
            // arithmetic stays in range whatever the configured backoff.
            let jitter = 1.0 + rand::thread_rng().gen_range(-options.jitter..=options.jitter);
            let nap = backoff.min(left / 2).mul_f64(jitter).min(left / 2);
            tracing::warn!(work_id = %token.work_id, attempt, error = %error, retry_in = ?nap, "lease renewal failed");
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(nap) => {}
            }
            backoff = backoff.saturating_mul(2).min(options.backoff_max);
        };
        match outcome {
            Ok(renewed) => {
                token = renewed;
                tx.send_modify(|s| s.token = token.clone());
            }
            Err(e) => {
                tracing::warn!(work_id = %token.work_id, fencing_token = token.fencing_token, error = %e, "lease lost");
                metrics::counter!(crate::metrics::LEASES_LOST_TOTAL, "cause" => crate::metrics::error_kind(&e))
                    .increment(1);
                tx.send_modify(|s| s.lost = Some(e));
                lost.cancel();
                return;
            }
        }
    }
}

/// Counts a running renewal task in `worklease_leases_held`, on every way
/// out of the task (stop, loss, drop of the runtime).
struct HeldGauge(&'static str);

impl HeldGauge {
    fn new(store: &'static str) -> Self {
        metrics::gauge!(crate::metrics::LEASES_HELD, "store" => store).increment(1.0);
        Self(store)
    }
}

impl Drop for HeldGauge {
    fn drop(&mut self) {
        metrics::gauge!(crate::metrics::LEASES_HELD, "store" => self.0).decrement(1.0);
    }
}
