//! The one-call leader (Go: `leader.Elect`): wait to lead, run a function
//! while leading, with callbacks on the way, on the machinery of
//! [`Elector::lead`] (campaign, renewal, bounded release, also when the
//! future is dropped).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::election::{Elector, Leadership, State, SystemClock};
use crate::error::Error;
use crate::lease::renewal::RenewalOptions;
use crate::lease::{Leases, DEFAULT_POLL_INTERVAL};
use crate::runner::{RunError, DEFAULT_FINISH_TIMEOUT};

type StateCallback = Arc<dyn Fn(&State) + Send + Sync>;
type LostCallback = Arc<dyn Fn(&State, &Error) + Send + Sync>;

/// Settings and callbacks of [`elect`] (Go: `leader.Config{AcquireOptions,
/// BackoffInterval, OnElected, OnLost, OnRelinquished}`).
#[derive(Clone)]
pub struct LeaderConfig {
    poll_interval: Duration,
    renewal: RenewalOptions,
    release_timeout: Duration,
    backoff: Duration,
    on_elected: Option<StateCallback>,
    on_lost: Option<LostCallback>,
    on_relinquished: Option<StateCallback>,
}

impl Default for LeaderConfig {
    fn default() -> Self {
        Self {
            poll_interval: DEFAULT_POLL_INTERVAL,
            renewal: RenewalOptions::new(),
            release_timeout: DEFAULT_FINISH_TIMEOUT,
            backoff: Duration::from_secs(1),
            on_elected: None,
            on_lost: None,
            on_relinquished: None,
        }
    }
}

impl std::fmt::Debug for LeaderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderConfig")
            .field("poll_interval", &self.poll_interval)
            .field("renewal", &self.renewal)
            .field("release_timeout", &self.release_timeout)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

impl LeaderConfig {
    /// Defaults: poll interval [`DEFAULT_POLL_INTERVAL`] (2 s),
    /// [`RenewalOptions::new`], release timeout 5 s, back-off 1 s, no
    /// callbacks.
    pub fn new() -> Self {
        Self::default()
    }

    /// How often a candidate retries to lead; at least 1 ms. A release
    /// wakes candidates at once where the store notifies.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How the leader renews its lease.
    pub fn renewal_options(mut self, options: RenewalOptions) -> Self {
        self.renewal = options;
        self
    }

    /// How long the release may take when leadership ends; at least 1 ms.
    pub fn release_timeout(mut self, timeout: Duration) -> Self {
        self.release_timeout = timeout;
        self
    }

    /// How long [`elect`] waits before returning after a failure that is
    /// not `Fenced` (Go: `BackoffInterval`), so a caller that loops on
    /// `elect` does not spin against a failing store; default 1 s.
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// Called on becoming leader, before the function runs (Go:
    /// `OnElected`).
    pub fn on_elected(mut self, f: impl Fn(&State) + Send + Sync + 'static) -> Self {
        self.on_elected = Some(Arc::new(f));
        self
    }

    /// Called with the cause when leadership was lost while the function
    /// ran (Go: `OnLost`).
    pub fn on_lost(mut self, f: impl Fn(&State, &Error) + Send + Sync + 'static) -> Self {
        self.on_lost = Some(Arc::new(f));
        self
    }

    /// Called after the function returned with leadership intact and the
    /// lease was released (Go: `OnRelinquished`).
    pub fn on_relinquished(mut self, f: impl Fn(&State) + Send + Sync + 'static) -> Self {
        self.on_relinquished = Some(Arc::new(f));
        self
    }
}

/// Waits to lead `election` with `leases`' holder, runs `f` while leading,
/// releases when it returns (Go: `leader.Elect`). Callbacks: `on_elected`
/// before `f`, then `on_lost` (leadership lost while `f` ran) or
/// `on_relinquished` (`f` returned, lease released). On every failure but
/// `Fenced` it waits the back-off before returning.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use worklease::{leader::{elect, LeaderConfig}, runner::RunError, store::memory::MemoryStore, Config, Leases};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), RunError<std::io::Error>> {
/// let leases = Leases::new(Arc::new(MemoryStore::new()), Config::new("host-a", Duration::from_secs(15)))?;
/// let config = LeaderConfig::new().on_elected(|s| println!("leading, generation {}", s.generation));
/// let generation = elect(&leases, "scheduler", config, |leadership| async move {
///     // Lead until done, or until leadership.lost() fires.
///     Ok::<_, std::io::Error>(leadership.generation())
/// })
/// .await?;
/// assert_eq!(generation, 1);
/// # Ok(()) }
/// ```
///
/// # Errors
/// * [`RunError::Lease`] with [`Error::Invalid`] for bad settings,
///   [`Error::Store`] when campaigning failed, or the loss's cause
///   (`Fenced`, `Expired`, `WindowExhausted`) when leadership was lost
///   while `f` ran (whatever `f` returned);
/// * [`RunError::Work`] with `f`'s error (leadership was released).
pub async fn elect<F, Fut, T, E>(
    leases: &Leases,
    election: &str,
    config: LeaderConfig,
    f: F,
) -> Result<T, RunError<E>>
where
    F: FnOnce(Leadership) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let result = lead(leases, election, &config, f).await;
    let fenced = matches!(&result, Err(RunError::Lease(Error::Fenced { .. })));
    if result.is_err() && !fenced {
        tokio::time::sleep(config.backoff).await;
    }
    result
}

async fn lead<F, Fut, T, E>(
    leases: &Leases,
    election: &str,
    config: &LeaderConfig,
    f: F,
) -> Result<T, RunError<E>>
where
    F: FnOnce(Leadership) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let elector = Elector::from_leases(
        leases.clone(),
        election.to_string(),
        config.renewal.clone(),
        config.poll_interval,
        config.release_timeout,
        Arc::new(SystemClock),
    )?;
    let (out, state, lost) = elector
        .lead(|leadership| async move {
            let state = leadership.state().clone();
            let loss = leadership.loss();
            if let Some(cb) = &config.on_elected {
                cb(&state);
            }
            let out = f(leadership).await;
            (out, state, loss.cause())
        })
        .await?;
    // `lead` has released by now (unless the lease was lost).
    match lost {
        Some(cause) => {
            if let Some(cb) = &config.on_lost {
                cb(&state, &cause);
            }
            Err(cause.into())
        }
        None => {
            if let Some(cb) = &config.on_relinquished {
                cb(&state);
            }
            out.map_err(RunError::Work)
        }
    }
}
