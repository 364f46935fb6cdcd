//! Background renewal (Go: `StartRenewal`, `WithRenewalInterval`,
//! `WithRenewalBackoff`).
//!
//! The lease is renewed every interval (default TTL/3, which leaves room
//! for two retries inside the TTL). A failed renewal is retried with
//! exponential backoff and jitter while the lease can still be saved, that
//! is until the holder's deadline: the send time of the last successful
//! acquire or renew, plus the TTL, minus the safety margin. Each attempt is
//! bounded by that deadline, so a renew request that hangs cannot keep a
//! lost lease alive. When the lease is lost the lost signal fires with the
//! cause: `Fenced` or `Expired` at once (never retried), `WindowExhausted`
//! when the deadline passed without a successful renewal.
//!
//! Between renewals the session also listens to the store's notifications
//! for the work ID ([`LeaseStore::watch`](crate::LeaseStore::watch):
//! release and revocation): on one it renews at once (at most once per
//! 100 ms after the last renewal), so a lease taken away by an operator
//! (`revoke`, `worklease release --force`) fires the lost signal within
//! the store's notification latency instead of at the next interval. On
//! stores without notifications (register stores such as S3) the holder
//! learns of it at its next renewal.
//!
//! Every lease of one [`Leases`] handle is renewed by the handle's one
//! session: renewals that fall due together go to the store in batches
//! ([`LeaseStore::renew_many`](crate::LeaseStore::renew_many)), one round
//! trip per batch, while each lease keeps its own interval, backoff,
//! deadline and lost signal (`session.rs` says how).

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::error::{Error, InvalidInput, Result};
use crate::lease::session::{Command, Start};
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

impl RenewalOptions {
    pub(crate) fn backoff_initial(&self) -> Duration {
        self.backoff_initial
    }

    pub(crate) fn backoff_max(&self) -> Duration {
        self.backoff_max
    }

    pub(crate) fn jitter(&self) -> f64 {
        self.jitter
    }
}

/// What a renewal's session tells its handle.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) token: Token,
    pub(crate) lost: Option<Error>,
    /// The session removed the lease on the handle's request.
    pub(crate) stopped: bool,
}

/// A running background renewal (Go: the `renewCtx` and `stop` pair): one
/// lease of its handle's session (see the module docs).
///
/// Dropping it stops the renewal (without releasing the lease).
pub struct Renewal {
    id: u64,
    state: watch::Receiver<Shared>,
    lost: CancellationToken,
    commands: mpsc::UnboundedSender<Command>,
    /// Keeps the handle, and so the session, alive as long as the renewal.
    _leases: Leases,
}

impl std::fmt::Debug for Renewal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewal")
            .field("token", &self.token())
            .field("lost", &self.lost.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl Renewal {
    pub(crate) fn start(leases: Leases, token: Token, options: RenewalOptions) -> Result<Self> {
        let interval = options.check(&leases)?;
        let (tx, rx) = watch::channel(Shared {
            token: token.clone(),
            lost: None,
            stopped: false,
        });
        let lost = CancellationToken::new();
        // Watch before returning: a revocation right after `start` returns
        // must be seen, even before the session first runs.
        let watched = leases.store().watch(&token.work_id);
        let mut id = 0;
        let commands = leases.inner.session.start(&leases.inner, |n| {
            id = n;
            Start {
                id: n,
                token,
                options,
                interval,
                tx,
                lost: lost.clone(),
                watched,
            }
        });
        Ok(Self {
            id,
            state: rx,
            lost,
            commands,
            _leases: leases,
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
    /// before the session had a chance to fire the lost signal.
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

    /// Stops renewing without waiting for the session (it lets go of the
    /// lease at its next step); the handle still reports the latest token.
    pub(crate) fn halt(&self) {
        let _ = self.commands.send(Command::Stop(self.id));
    }

    /// The loss to report when the session ended without a word about this
    /// lease (its runtime shut down, or it panicked): never hand back a
    /// token that nobody renews.
    fn session_gone(&self) -> Error {
        let t = self.token();
        self.lost.cancel();
        Error::WindowExhausted {
            work_id: t.work_id.to_string(),
            fencing_token: t.fencing_token,
            last_error: Some("the renewal session ended unexpectedly".into()),
        }
    }

    /// Waits for the next change: `Ok` with the renewed token after each
    /// successful renewal, `Err` with the cause once the lease is lost (and
    /// at every call after that).
    pub async fn changed(&mut self) -> Result<Token> {
        if let Some(e) = self.lost_cause() {
            return Err(e);
        }
        if self.state.changed().await.is_err() {
            return Err(self.lost_cause().unwrap_or_else(|| self.session_gone()));
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
        let _ = self.commands.send(Command::Stop(self.id));
        // The session answers by marking the lease stopped (or lost, when
        // that came first); a closed channel means it is gone.
        loop {
            {
                let state = self.state.borrow_and_update();
                if let Some(e) = &state.lost {
                    return Err(e.clone());
                }
                if state.stopped {
                    return Ok(state.token.clone());
                }
            }
            if self.state.changed().await.is_err() {
                let state = self.state.borrow().clone();
                return match (state.lost, state.stopped) {
                    (Some(e), _) => Err(e),
                    (None, true) => Ok(state.token),
                    (None, false) => Err(self.session_gone()),
                };
            }
        }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Stop(self.id));
    }
}
