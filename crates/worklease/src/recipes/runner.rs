//! The worker runner: a lease's whole lifecycle around one work function
//! (Go: `worker.Runner`).
//!
//! [`Runner::run`] acquires the work ID, starts background renewal, reads
//! the checkpoint, runs the work function with a [`RunContext`], writes the
//! function's final state as the last checkpoint and releases. The final
//! checkpoint and release run on a spawned task under their own timeout
//! ([`Runner::finish_timeout`]), so they complete even when the `run`
//! future is dropped once the work has returned.
//!
//! How each path ends:
//!
//! | the work function… | the runner… | `run` returns |
//! |---|---|---|
//! | returns `Ok(Some(state))` | checkpoints `state`, releases | `Ok(())` |
//! | returns `Ok(None)` | releases (the last checkpoint stays) | `Ok(())` |
//! | returns `Err(e)` | releases (the last checkpoint stays) | [`RunError::Work`] |
//! | runs while the lease is lost | stops renewing, does **not** release | [`RunError::Lease`] with the cause (`Fenced`, `Expired`, `WindowExhausted`), whatever the work returned |
//! | panics | stops renewing, does **not** release (the lease expires after its TTL, so the successor sees `clean_handoff = false`) | the panic resumes in the caller |
//! | is dropped with `run` | releases on a spawned task (the last checkpoint stays) | — |
//!
//! Unlike the Go original, the checkpoint is read after renewal has
//! started, so a slow read cannot let the lease expire.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, InvalidInput, Result};
use crate::lease::finish::FinishGuard;
use crate::lease::renewal::{Renewal, RenewalOptions};
use crate::lease::{AcquireOptions, CheckpointData, Leases};
use crate::store::Checkpoint;
use crate::token::Token;

/// The default of [`Runner::finish_timeout`]: 5 s.
pub const DEFAULT_FINISH_TIMEOUT: Duration = Duration::from_secs(5);

/// Why [`Runner::run`] (or [`crate::leader::elect`]) failed: the lease or
/// the work.
#[derive(Debug, thiserror::Error)]
pub enum RunError<E> {
    /// The lease failed: it could not be acquired or its checkpoint read,
    /// it was lost while the work ran (`Fenced`, `Expired`,
    /// `WindowExhausted`), or the final checkpoint or release failed.
    #[error(transparent)]
    Lease(#[from] Error),
    /// The work function returned this error; the lease was released.
    #[error("the work failed: {0}")]
    Work(#[source] E),
}

impl<E> RunError<E> {
    /// The lease error, if the lease failed.
    pub fn lease_error(&self) -> Option<&Error> {
        match self {
            RunError::Lease(e) => Some(e),
            RunError::Work(_) => None,
        }
    }

    /// True when the lease was lost (see [`Error::is_lease_lost`]).
    pub fn is_lease_lost(&self) -> bool {
        self.lease_error().is_some_and(Error::is_lease_lost)
    }
}

/// What the work function of [`Runner::run`] gets: the lost signal, the
/// latest token and the prior checkpoint (Go: the `ctx`, `token`, `prior`
/// and `cleanHandoff` arguments of `WorkFn`).
pub struct RunContext {
    signal: CancellationToken,
    renewal: Arc<Renewal>,
    prior: Checkpoint,
    leases: Leases,
}

impl std::fmt::Debug for RunContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunContext")
            .field("token", &self.renewal.token())
            .field("prior", &self.prior)
            .finish_non_exhaustive()
    }
}

impl RunContext {
    /// A signal that fires when the lease is lost (or when the runner's
    /// [`Runner::cancel_on`] token fires): stop the work and return. When
    /// the lease was lost, whatever the work returns is discarded.
    pub fn cancelled(&self) -> CancellationToken {
        self.signal.clone()
    }

    /// Why the lease was lost, once it was.
    pub fn lost_cause(&self) -> Option<Error> {
        self.renewal.lost_cause()
    }

    /// The latest token (renewals extend its expiry and deadline).
    pub fn token(&self) -> Token {
        self.renewal.token()
    }

    /// The fencing token: pass it to downstream writes.
    pub fn fencing_token(&self) -> u64 {
        self.renewal.token().fencing_token()
    }

    /// The latest token if the lease is still ours by our own clock; call
    /// it right before an external side effect (see
    /// [`Renewal::ensure_live`]).
    ///
    /// # Errors
    /// The loss's cause, or `WindowExhausted` past the deadline.
    pub fn ensure_live(&self) -> Result<Token> {
        self.renewal.ensure_live()
    }

    /// The checkpoint as the previous holder left it, with the hand-off
    /// facts ([`Checkpoint::clean_handoff`] is false after a crash).
    pub fn prior(&self) -> &Checkpoint {
        &self.prior
    }

    /// The lease handle, for intermediate checkpoints with
    /// [`RunContext::token`] (or [`RunContext::checkpoint`]).
    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    /// Writes an intermediate checkpoint with the latest token (and extends
    /// the lease).
    ///
    /// # Errors
    /// As [`Leases::checkpoint`].
    pub async fn checkpoint(&self, data: impl CheckpointData) -> Result<()> {
        self.leases.checkpoint(&self.token(), data).await.map(drop)
    }
}

/// Runs work functions under leases (Go: `worker.Runner{Lease, WorkFn,
/// AcquireOptions, RenewalOptions}`); see the [module docs](self) for how
/// each path ends. Cheap to clone.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use worklease::{runner::{RunError, Runner}, store::memory::MemoryStore, Config, Leases};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), RunError<std::io::Error>> {
/// let leases = Leases::new(Arc::new(MemoryStore::new()), Config::new("worker-1", Duration::from_secs(15)))?;
/// let runner = Runner::new(leases);
/// runner
///     .run("shard-7", |ctx| async move {
///         let page: u64 = match &ctx.prior().data {
///             Some(b) => String::from_utf8_lossy(b).parse().unwrap_or(0),
///             None => 0,
///         };
///         // ... work from `page` on, stopping when ctx.cancelled() fires ...
///         Ok::<_, std::io::Error>(Some((page + 1).to_string().into()))
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Runner {
    leases: Leases,
    acquire: AcquireOptions,
    renewal: RenewalOptions,
    finish_timeout: Duration,
    cancel: Option<CancellationToken>,
}

impl Runner {
    /// A runner on `leases`, with defaults: fail fast when the lease is
    /// held ([`AcquireOptions::new`]), [`RenewalOptions::new`], finish
    /// timeout [`DEFAULT_FINISH_TIMEOUT`].
    pub fn new(leases: Leases) -> Self {
        Self {
            leases,
            acquire: AcquireOptions::new(),
            renewal: RenewalOptions::new(),
            finish_timeout: DEFAULT_FINISH_TIMEOUT,
            cancel: None,
        }
    }

    /// How to acquire (for example [`AcquireOptions::wait_for_lease`]).
    pub fn acquire_options(mut self, options: AcquireOptions) -> Self {
        self.acquire = options;
        self
    }

    /// How to renew in the background.
    pub fn renewal_options(mut self, options: RenewalOptions) -> Self {
        self.renewal = options;
        self
    }

    /// How long the final checkpoint and release may take together; at
    /// least 1 ms; default [`DEFAULT_FINISH_TIMEOUT`].
    pub fn finish_timeout(mut self, timeout: Duration) -> Self {
        self.finish_timeout = timeout;
        self
    }

    /// Fires the work's [`RunContext::cancelled`] signal when `cancel`
    /// fires (a shutdown): the work returns its state, which is then
    /// checkpointed before the release (Go: the caller's `ctx`).
    pub fn cancel_on(mut self, cancel: CancellationToken) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// Runs `f` under the lease on `work_id` (Go: `Runner.Run`): acquire,
    /// renew in the background, read the checkpoint, run `f`, checkpoint
    /// its `Some(state)`, release.
    ///
    /// # Errors
    /// * [`RunError::Lease`] with [`Error::Invalid`] for bad options
    ///   (nothing is written), the acquisition's error (`Held`, ...), the
    ///   checkpoint read's error (the lease is then released), the loss's
    ///   cause when the lease was lost while `f` ran (not released), or the
    ///   final checkpoint's or release's error (`Store` when the finish
    ///   timeout ran out);
    /// * [`RunError::Work`] with `f`'s error (the lease was released).
    ///
    /// # Panics
    /// A panic of `f` resumes here, after renewal was stopped; the lease
    /// is not released.
    pub async fn run<F, Fut, E>(&self, work_id: &str, f: F) -> Result<(), RunError<E>>
    where
        F: FnOnce(RunContext) -> Fut,
        Fut: Future<Output = Result<Option<Bytes>, E>>,
    {
        self.check()?;
        let token = self.leases.acquire(work_id, self.acquire.clone()).await?;
        self.run_acquired(token, f).await
    }

    /// Checks the options before anything is written.
    fn check(&self) -> Result<()> {
        self.renewal.check(&self.leases)?;
        check_finish_timeout(self.finish_timeout)
    }

    /// Runs `f` under a lease already acquired (by [`Leases::acquire_many`],
    /// say, as a [`crate::pool::Pool`] takes its share): the steps of
    /// [`Runner::run`] after the acquisition.
    ///
    /// # Errors
    /// As [`Runner::run`], without the acquisition's; [`Error::Invalid`]
    /// for a token of another holder.
    ///
    /// # Panics
    /// As [`Runner::run`].
    pub async fn run_acquired<F, Fut, E>(&self, token: Token, f: F) -> Result<(), RunError<E>>
    where
        F: FnOnce(RunContext) -> Fut,
        Fut: Future<Output = Result<Option<Bytes>, E>>,
    {
        self.check()?;
        let renewal = Arc::new(
            self.leases
                .start_renewal(token.clone(), self.renewal.clone())?,
        );
        let guard = FinishGuard::new(self.leases.clone(), renewal.clone(), self.finish_timeout);
        let prior = match self.leases.read_checkpoint(&token).await {
            Ok(prior) => prior,
            Err(e) if e.is_lease_lost() => {
                guard.abandon();
                return Err(e.into());
            }
            Err(e) => {
                guard.release().await;
                return Err(e.into());
            }
        };
        let signal = CancellationToken::new();
        // Ends with `run` (its drop guard fires the signal).
        let _link = link(signal.clone(), renewal.lost_signal(), self.cancel.clone());
        let ctx = RunContext {
            signal,
            renewal: renewal.clone(),
            prior,
            leases: self.leases.clone(),
        };
        let outcome = match AssertUnwindSafe(f(ctx)).catch_unwind().await {
            Ok(outcome) => outcome,
            Err(panic) => {
                guard.abandon();
                std::panic::resume_unwind(panic);
            }
        };
        if let Some(cause) = renewal.lost_cause() {
            guard.abandon();
            return Err(cause.into());
        }
        match outcome {
            Ok(state) => Ok(guard.finish(state).await?),
            Err(e) => {
                guard.release().await;
                Err(RunError::Work(e))
            }
        }
    }
}

/// Fires `signal` when `lost` or `cancel` fires; the returned guard fires
/// it (ending the link task) when dropped.
fn link(
    signal: CancellationToken,
    lost: CancellationToken,
    cancel: Option<CancellationToken>,
) -> tokio_util::sync::DropGuard {
    let fire = signal.clone();
    tokio::spawn(async move {
        let cancel = async {
            match cancel {
                Some(c) => c.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = lost.cancelled() => {}
            _ = cancel => {}
            _ = fire.cancelled() => {}
        }
        fire.cancel();
    });
    signal.drop_guard()
}

/// Refuses a finish timeout under 1 ms (a runner's, or each slot's of a
/// pool): the final checkpoint and release need some time.
pub(crate) fn check_finish_timeout(timeout: Duration) -> Result<()> {
    if timeout < Duration::from_millis(1) {
        return Err(InvalidInput::Config(format!(
            "finish timeout {timeout:?} must be at least 1ms"
        ))
        .into());
    }
    Ok(())
}
