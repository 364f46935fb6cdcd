//! Leader election on leases: the API of the Go package `hoplock`.
//!
//! One election is one work ID; its leader is the holder of that lease, and
//! the leader's **generation is its fencing token**, so it strictly
//! increases with every change of leader and can fence a stale leader's
//! writes downstream. Expiry is judged as for every lease (the store's clock,
//! or the observation rule for a bare register): unlike `hoplock`, no
//! candidate compares its wall clock with a stored expiry.
//!
//! * [`Elector::lead`] waits to lead, runs a function with a signal that
//!   fires the moment leadership is lost, and releases when the function
//!   returns (bounded by the release timeout), also when the `lead` future
//!   is dropped. [`Leadership::resign`] gives leadership up during the
//!   function (the lost signal fires with [`Error::Resigned`], then the
//!   lease is released for the next candidate).
//! * [`Elector::run`] campaigns for as long as its [`Campaign`] stream is
//!   polled, yielding [`Event`]s (`Acquired`, `Renewed`, `Lost`), and
//!   campaigns again after a loss; dropping the stream releases.
//! * [`Elector::leader`] tells who leads now, without campaigning, and
//!   [`Elector::observe`] / [`observe`] stream every change of leader to a
//!   process that never campaigns, with reads only ([`Observations`]).
//!
//! Each term's leader writes the election's **record** into the checkpoint
//! of the election's lease when its term starts (ADR 0016): the value it
//! publishes ([`ElectorBuilder::publish`], [`Leadership::publish`]: an
//! address followers forward to, at most
//! [`crate::limits::MAX_PUBLISHED_VALUE_BYTES`]), when the term started, and
//! the **transitions** (changes of holder) since the election's first
//! leader, kept by the store across restarts of every process. The record
//! is written while the term's work starts, so a hand-over costs what the
//! lease's hand-off costs, plus one read of the record handed over where
//! this elector did not know it (it led the term before, or saw that
//! term's record while waiting with a priority); a term whose record
//! cannot be written ends as a lost lease does (ADR 0016). The election's
//! checkpoint belongs to the elector: keep a leader's own state under a
//! work ID of its own.
//!
//! What it does not guarantee: that a leader's *actions* stop the instant
//! its lease ends. The lost signal fires at the holder's deadline (send
//! time of its last successful renewal + TTL − safety margin), before any
//! other candidate can lead; work that ignores the signal, or a process
//! frozen past the deadline, can still act late. Pass the generation to
//! downstream systems and have them reject smaller ones.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::{Error, InvalidInput, Result};
use crate::lease::finish::FinishGuard;
use crate::lease::renewal::RenewalOptions;
use crate::lease::{AcquireOptions, Leases};
use crate::limits::WorkId;
use crate::metrics::{finish_span, LeaderGauge};
use crate::token::Token;

mod builder;
mod campaign;
mod leadership;
mod observe;
pub(crate) mod record;
mod step_down;
mod term;

pub use builder::ElectorBuilder;
pub use campaign::Campaign;
pub use leadership::Leadership;
pub use observe::{observe, Observations, DEFAULT_OBSERVE_INTERVAL};
use record::Record;
pub use step_down::{check_name, request_step_down, REQUEST_TTL, STEP_DOWN_SUFFIX};
use term::Term;

/// A source of wall-clock time (hoplock: `Elector.Now`). The elector uses
/// it only to report [`State::is_expired`] and [`State::ttl`]; no decision
/// of the elector depends on it (those use the store's clock and tokio's
/// monotonic clock, which tests pause).
pub trait Clock: Send + Sync + 'static {
    /// The current wall-clock time.
    fn now(&self) -> SystemTime;
}

/// The host's wall clock; the default [`Clock`].
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Who leads an election (hoplock: `State`).
#[derive(Clone)]
pub struct State {
    /// The leader's owner (holder) ID.
    pub owner: String,
    /// The leader's generation: its fencing token.
    pub generation: u64,
    /// When its lease expires, by the wall clock (informational).
    pub expires_at: SystemTime,
    /// The value the leader publishes ([`ElectorBuilder::publish`],
    /// [`Leadership::publish`]); `None` when it publishes none, and until a
    /// new leader has written its record (one round trip after its
    /// acquisition).
    pub value: Option<Bytes>,
    /// When this term started, by the leader's wall clock (informational);
    /// `None` until the leader has written its record.
    pub since: Option<SystemTime>,
    /// Changes of leader (holder ID) since the election's first leader,
    /// which has 0 (Kubernetes' `leaseTransitions`); kept in the store.
    pub transitions: u64,
    /// The leader's priority ([`ElectorBuilder::priority`]; 0 when it set
    /// none, and until it has written its record).
    pub priority: i32,
    /// Time left by the store's clock when read (where the store tells).
    expires_in: Option<Duration>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("owner", &self.owner)
            .field("generation", &self.generation)
            .field("expires_at", &self.expires_at)
            .field("value", &self.value)
            .field("since", &self.since)
            .field("transitions", &self.transitions)
            .field("priority", &self.priority)
            .finish()
    }
}

impl State {
    /// The state of a term this process leads: its token, and the record
    /// it wrote.
    fn of_term(t: &Token, record: &Record, clock: &Arc<dyn Clock>) -> Self {
        Self {
            owner: t.holder_id().to_string(),
            generation: t.fencing_token(),
            expires_at: t.expires_at(),
            value: record.value.clone(),
            since: Some(record.since),
            transitions: record.transitions,
            priority: record.priority,
            expires_in: None,
            clock: clock.clone(),
        }
    }

    /// True once [`State::expires_at`] has passed by the elector's clock.
    pub fn is_expired(&self) -> bool {
        self.clock.now() >= self.expires_at
    }

    /// Time left before [`State::expires_at`] by the elector's clock; zero
    /// once expired.
    pub fn ttl(&self) -> Duration {
        self.expires_at
            .duration_since(self.clock.now())
            .unwrap_or(Duration::ZERO)
    }
}

/// What a campaign reports (hoplock: `Event.Kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// This candidate became leader.
    Acquired,
    /// Its leadership was renewed.
    Renewed,
    /// It lost leadership (the event's error says why).
    Lost,
}

/// One event of a [`Campaign`] (hoplock: `Event`).
#[derive(Debug, Clone)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The leadership it concerns.
    pub state: State,
    /// Why leadership was lost (`Fenced`, `Expired` or `WindowExhausted`),
    /// for [`EventKind::Lost`].
    pub error: Option<Error>,
}

impl Elector {
    /// An elector on an existing [`Leases`] handle (its holder, TTL,
    /// safety margin and observer); checked as [`ElectorBuilder::build`].
    pub(crate) fn from_leases(
        leases: Leases,
        election: String,
        renewal: RenewalOptions,
        poll_interval: Duration,
        release_timeout: Duration,
        clock: Arc<dyn Clock>,
    ) -> Result<Elector> {
        let election = WorkId::new(election)?;
        let step_down = step_down::requests_id(&election)?;
        let renew_interval = renewal.check(&leases)?;
        let rule = |msg: String| Err(Error::from(InvalidInput::Config(msg)));
        if poll_interval < Duration::from_millis(1) {
            return rule(format!(
                "poll interval {poll_interval:?} must be at least 1ms"
            ));
        }
        if release_timeout < Duration::from_millis(1) {
            return rule(format!(
                "release timeout {release_timeout:?} must be at least 1ms"
            ));
        }
        Ok(Elector {
            inner: Arc::new(ElectorInner {
                election,
                leases,
                renewal,
                poll_interval,
                release_timeout,
                clock,
                value: std::sync::Mutex::new(None),
                renew_interval,
                step_down,
                resign_backoff: None,
                priority: None,
                known: std::sync::Mutex::new(None),
            }),
        })
    }
}

struct ElectorInner {
    election: WorkId,
    leases: Leases,
    renewal: RenewalOptions,
    poll_interval: Duration,
    release_timeout: Duration,
    clock: Arc<dyn Clock>,
    /// The value the next term publishes ([`ElectorBuilder::publish`], the
    /// latest [`Leadership::publish`]).
    value: std::sync::Mutex<Option<Bytes>>,
    /// How often the leader renews (and reads step-down requests).
    renew_interval: Duration,
    /// The work ID of this election's step-down requests.
    step_down: WorkId,
    /// How long [`Elector::run`] waits after a step-down before it
    /// campaigns again; `None`: one TTL.
    resign_backoff: Option<Duration>,
    /// [`ElectorBuilder::priority`], when set.
    priority: Option<i32>,
    /// The latest record of this election this elector knows (it wrote it,
    /// or saw it while waiting): the next term it leads takes its
    /// transitions from it without reading when the hand-off names it.
    known: std::sync::Mutex<Option<Record>>,
}

/// One candidate in one election (hoplock: `Elector`). Cheap to clone.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use worklease::{election::Elector, store::memory::MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> worklease::Result<()> {
/// let elector = Elector::builder(Arc::new(MemoryStore::new()), "scheduler", "host-a")
///     .ttl(Duration::from_secs(15))
///     .build()?;
/// let generation = elector
///     .lead(|leadership| async move {
///         // Lead until done, or until leadership.lost() fires.
///         leadership.generation()
///     })
///     .await?;
/// assert_eq!(generation, 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Elector {
    inner: Arc<ElectorInner>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("election", self.election())
            .field("owner", &self.owner())
            .finish_non_exhaustive()
    }
}

impl Elector {
    /// The election's name (its work ID).
    pub fn election(&self) -> &WorkId {
        &self.inner.election
    }

    /// This candidate's owner ID.
    pub fn owner(&self) -> &str {
        self.inner.leases.holder_id().as_str()
    }

    /// Waits, at most `timeout` (tokio's clock), until what this elector
    /// (and its clones) started in the background has ended: the store
    /// call of a campaign dropped mid-acquisition, the release of its
    /// grant, the release of a dropped term's lease. A process awaits it
    /// after dropping its campaigns and before it exits; see
    /// [`Leases::settle`].
    ///
    /// # Errors
    /// [`crate::Unsettled`] when `timeout` passed first: the lease left
    /// ends when its TTL runs out.
    pub async fn settle(&self, timeout: Duration) -> std::result::Result<(), crate::Unsettled> {
        self.inner.leases.settle(timeout).await
    }

    /// Who leads now, without campaigning: the leader, its term, the value
    /// it publishes and the transitions so far. Reads only: the lease, and
    /// its record where it has one.
    ///
    /// `Ok(None)` when nobody leads (never acquired, released, revoked or
    /// expired by the store's judgement).
    ///
    /// ```
    /// # async fn example(elector: worklease::election::Elector) -> worklease::Result<()> {
    /// match elector.leader().await? {
    ///     Some(state) => println!("{} leads (term {})", state.owner, state.generation),
    ///     None => println!("nobody leads"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Store`] when the store fails.
    pub async fn leader(&self) -> Result<Option<State>> {
        match self.leader_traced().await {
            Ok(state) => Ok(Some(state)),
            Err(Error::NoLease { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`Elector::leader`] in its span: [`Error::NoLease`] when nobody
    /// leads (the span's outcome `no_lease`).
    async fn leader_traced(&self) -> Result<State> {
        let span = tracing::debug_span!(
            "worklease.election.leader",
            election = %self.inner.election,
            store = self.inner.leases.store().kind(),
            leader = tracing::field::Empty,
            generation = tracing::field::Empty,
            outcome = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        let started = tokio::time::Instant::now();
        let result = self.leader_inner().instrument(span.clone()).await;
        if let Ok(state) = &result {
            span.record("leader", state.owner.as_str());
        }
        finish_span(&span, started, &result, None);
        if let Ok(state) = &result {
            span.record("generation", state.generation);
        }
        result
    }

    async fn leader_inner(&self) -> Result<State> {
        let store = self.inner.leases.store();
        observe::read_leader(store, &self.inner.election, &self.inner.clock)
            .await?
            .ok_or_else(|| Error::NoLease {
                election: self.inner.election.to_string(),
            })
    }

    /// Asks the current leader of this election to step down
    /// ([`request_step_down`], with this elector's owner as the requester).
    ///
    /// # Errors
    /// As [`request_step_down`].
    pub async fn request_step_down(&self) -> Result<State> {
        request_step_down(
            self.inner.leases.store().clone(),
            self.inner.election.to_string(),
            self.owner().to_string(),
        )
        .await
    }

    /// Watches this election without campaigning ([`observe`]) with this
    /// elector's store, clock and poll interval: who leads now, then every
    /// change. Writes nothing; dropping the stream stops it.
    pub fn observe(&self) -> Observations {
        observe::observations(
            self.inner.leases.store().clone(),
            self.inner.election.clone(),
            self.inner.poll_interval,
            self.inner.clock.clone(),
        )
    }

    async fn campaign(&self) -> Result<Term> {
        let span = tracing::info_span!(
            "worklease.election.campaign",
            election = %self.inner.election,
            holder = self.owner(),
            store = self.inner.leases.store().kind(),
            generation = tracing::field::Empty,
            outcome = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        );
        let started = tokio::time::Instant::now();
        let result = self.campaign_inner().instrument(span.clone()).await;
        if let Ok(term) = &result {
            span.record("generation", term.token.fencing_token);
        }
        finish_span(&span, started, &result, None);
        result
    }

    async fn campaign_inner(&self) -> Result<Term> {
        // A candidate reports 0 until it leads, so that "nobody leads" is a
        // sum of zeros an alert can see, not an absent series.
        metrics::gauge!(crate::metrics::IS_LEADER, "election" => self.inner.election.to_string())
            .set(0.0);
        let opts = AcquireOptions::new()
            .wait_for_lease()
            .poll_interval(self.inner.poll_interval);
        let acquire = self
            .inner
            .leases
            .acquire_handed(self.inner.election.as_str(), opts);
        let (token, handoff) = match self.inner.priority {
            None => acquire.await?,
            Some(mine) => {
                tokio::select! {
                    acquired = acquire => acquired?,
                    never = self.ask_lower_priorities(mine) => match never {},
                }
            }
        };
        self.start_term(token, handoff).await
    }

    /// While this candidate of priority `mine` waits: asks each leader of a
    /// lower priority (as its record says) to step down, once per term.
    async fn ask_lower_priorities(&self, mine: i32) -> std::convert::Infallible {
        let mut leaders = self.observe();
        let mut asked = None;
        while let Some(seen) = leaders.next().await {
            let Ok(Some(leader)) = seen else { continue };
            self.remember_observed(&leader);
            let lower = leader.since.is_some() && leader.priority < mine;
            if lower && asked != Some(leader.generation) && leader.owner != self.owner() {
                // The request names the term seen here: a leader of equal
                // priority that took over meanwhile is not asked.
                let store = self.inner.leases.store().clone();
                let requests = &self.inner.step_down;
                match step_down::ask(store, requests, leader.generation, self.owner()).await {
                    Ok(_) => asked = Some(leader.generation),
                    Err(e) => {
                        tracing::warn!(error = %e, "asking a lower-priority leader to step down failed")
                    }
                }
            }
        }
        std::future::pending().await
    }

    /// Waits until this candidate leads, runs `f` with the [`Leadership`],
    /// releases when `f` returns, and returns `f`'s output (hoplock:
    /// `Lead`). The release is bounded by the release timeout and runs also
    /// when this future is dropped, so a standby takes over at once instead
    /// of after a TTL. `f` keeps running after leadership is lost unless it
    /// watches [`Leadership::lost`].
    ///
    /// # Errors
    /// [`Error::Store`] when the store fails while campaigning (the caller
    /// decides whether to campaign again).
    pub async fn lead<F, Fut, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce(Leadership) -> Fut,
        Fut: Future<Output = T>,
    {
        let term = self.campaign().await?;
        let renewal = Arc::new(term.renewal);
        let lost = renewal.lost_signal().child_token();
        let _is_leader = LeaderGauge::new(self.inner.election.as_str(), lost.clone());
        let guard = FinishGuard::new(
            self.inner.leases.clone(),
            renewal.clone(),
            self.inner.release_timeout,
        );
        let released = Arc::new(AtomicBool::new(false));
        let record = term.record.clone();
        let leadership = Leadership {
            state: State::of_term(&term.token, &term.started, &self.inner.clock),
            lost,
            renewal,
            elector: self.clone(),
            record: term.record,
            record_failed: term.record_failed,
            resigned: Arc::new(AtomicBool::new(false)),
            released: released.clone(),
        };
        let stop_watching = CancellationToken::new();
        let _stop_on_drop = stop_watching.clone().drop_guard();
        leadership.watch_term(stop_watching);
        let out = f(leadership).await;
        if released.load(Ordering::SeqCst) {
            guard.abandon(); // released by `resign`
        } else {
            // Released after the term's record is written, if it still is
            // (waiting at most the release timeout).
            let timeout = self.inner.release_timeout;
            drop(tokio::time::timeout(timeout, record.lock()).await);
            guard.release().await;
        }
        Ok(out)
    }

    /// Campaigns for as long as the returned stream is polled (hoplock:
    /// `Run`): `Acquired` on becoming leader, `Renewed` after each renewal,
    /// `Lost` with the cause when leadership ends, then it campaigns again.
    /// A store failure while campaigning is logged and retried after one
    /// poll interval, so the stream ends only when dropped. Dropping it
    /// releases leadership (bounded by the release timeout).
    pub fn run(&self) -> Campaign {
        Campaign::start(self.clone())
    }
}
