//! Hand-off: one holder releases, N waiters compete; the time from the
//! start of the release to the next holder's acquire returning. Ours with
//! push (the store's notifications), ours polling only (notifications
//! hidden by [`PollOnly`]), and the peer lock's own way of waiting.
//!
//! Every participant loops: wait for the lease → hold it for a moment
//! (so that the losers of the last race are back to waiting) → release →
//! sit out until someone else took it (a releaser never hands the lease
//! back to itself) → wait again. So there are always N waiters and one
//! holder. All participants share one store value, as the workers of one
//! process would (for SQLite the release then wakes them in-process;
//! [`crate::handoff_processes`] measures waiters in other processes).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use hdrhistogram::Histogram;
use rand::Rng;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use worklease::{AcquireOptions, Config, LeaseStore, Leases, Token, WorkId};

use crate::measure::{histogram, record, slice, Client, Failures, Tally};
use crate::results::{HandoffMode, HandoffRow, Latency};
use crate::stores::{Opened, PeerClient, PollOnly, Register};
use crate::{Plan, Result};

/// One participant: takes the lock (waiting) and gives it back.
#[async_trait]
pub(crate) trait Contender: Send + 'static {
    async fn take(&mut self) -> Result<()>;
    async fn give(&mut self) -> Result<()>;
}

struct Ours {
    leases: Leases,
    work: String,
    options: AcquireOptions,
    token: Option<Token>,
}

#[async_trait]
impl Contender for Ours {
    async fn take(&mut self) -> Result<()> {
        self.token = Some(
            self.leases
                .acquire(&self.work, self.options.clone())
                .await?,
        );
        Ok(())
    }

    async fn give(&mut self) -> Result<()> {
        let token = self.token.take().ok_or("not held")?;
        Ok(self.leases.release(token).await?)
    }
}

struct Theirs {
    client: Box<dyn PeerClient>,
    key: String,
}

#[async_trait]
impl Contender for Theirs {
    async fn take(&mut self) -> Result<()> {
        self.client.lock(&self.key).await
    }

    async fn give(&mut self) -> Result<()> {
        self.client.unlock(&self.key).await
    }
}

/// One compare-and-set, to time the store's round trip.
struct OneCas(Box<dyn Register>);

#[async_trait]
impl Client for OneCas {
    async fn op(&mut self) -> Result<()> {
        self.0.cas(&bytes::Bytes::new()).await
    }
}

/// The store's round trip: the median of one client's baseline
/// compare-and-sets.
pub async fn round_trip(opened: &Opened, plan: &Plan) -> Result<u64> {
    let mut tally = Tally::default();
    let client: Box<dyn Client> = Box::new(OneCas(opened.baseline.register().await?));
    slice(
        vec![client],
        plan.timing.warm_up,
        plan.timing.slice,
        &mut tally,
    )
    .await;
    Ok(tally
        .row("", 1, None, crate::results::Variant::Baseline, "")
        .latency
        .p50_us)
}

/// Hand-offs among `waiters` + 1 participants in `mode`.
pub async fn handoff(
    opened: &Opened,
    plan: &Plan,
    waiters: usize,
    mode: HandoffMode,
    round_trip_us: u64,
) -> Result<Option<HandoffRow>> {
    let work = format!("handoff-{}-{waiters}", mode.as_str());
    let mut contenders: Vec<Box<dyn Contender>> = Vec::new();
    // Whether the store has notifications at all (the watch is dropped at
    // once).
    let has_watch = WorkId::new(&work)
        .map(|id| opened.store.watch(&id).is_some())
        .unwrap_or(false);
    let notified = match mode {
        HandoffMode::Push => has_watch,
        HandoffMode::Poll => false,
        HandoffMode::Peer => true,
    };
    let what = match mode {
        HandoffMode::Push | HandoffMode::Poll => {
            let store: Arc<dyn LeaseStore> = match mode {
                HandoffMode::Poll => Arc::new(PollOnly(opened.store.clone())),
                _ => opened.store.clone(),
            };
            let options = AcquireOptions::new()
                .wait_for_lease()
                .poll_interval(plan.handoff_poll);
            contenders = ours(&store, plan, waiters, &work, &options)?;
            match mode {
                HandoffMode::Push if !has_watch => format!(
                    "acquire with wait_for_lease; the store has no notifications, so waiters poll every {:?} (+ up to 10% jitter)",
                    plan.handoff_poll
                ),
                HandoffMode::Push => format!(
                    "acquire with wait_for_lease, woken by the store's notification (poll every {:?} as the fallback)",
                    plan.handoff_poll
                ),
                _ => format!(
                    "acquire with wait_for_lease, notifications hidden: polls every {:?} (+ up to 10% jitter)",
                    plan.handoff_poll
                ),
            }
        }
        HandoffMode::Peer => {
            let Some(peer) = &opened.peer else {
                return Ok(None);
            };
            for _ in 0..=waiters {
                contenders.push(Box::new(Theirs {
                    client: peer.client(true).await?,
                    key: work.clone(),
                }));
            }
            format!("the peer's own wait: {}", peer.describe())
        }
    };
    let outcome = run(contenders, plan).await?;
    Ok(Some(outcome.row(
        opened,
        waiters,
        mode,
        what,
        notified,
        round_trip_us,
    )))
}

/// `waiters` + 1 participants of ours sharing `store`, each with a holder
/// handle of its own, taking turns on `work` with `options`.
pub(crate) fn ours(
    store: &Arc<dyn LeaseStore>,
    plan: &Plan,
    waiters: usize,
    work: &str,
    options: &AcquireOptions,
) -> Result<Vec<Box<dyn Contender>>> {
    let mut contenders: Vec<Box<dyn Contender>> = Vec::with_capacity(waiters + 1);
    for n in 0..=waiters {
        contenders.push(Box::new(Ours {
            leases: Leases::new(store.clone(), Config::new(format!("handoff-{n}"), plan.ttl))?,
            work: work.to_string(),
            options: options.clone(),
            token: None,
        }));
    }
    Ok(contenders)
}

/// What the hand-offs of one configuration added up to.
pub(crate) struct Outcome {
    /// From the start of each release to the next holder's acquire
    /// returning, µs.
    pub hist: Histogram<u64>,
    /// Failed takes and gives.
    pub errors: u64,
    /// The first failure, if any.
    pub first_error: Option<String>,
}

impl Outcome {
    /// The row of these hand-offs among `waiters` + 1 participants in this
    /// process, on `opened`'s store.
    pub fn row(
        self,
        opened: &Opened,
        waiters: usize,
        mode: HandoffMode,
        what: String,
        notified: bool,
        round_trip_us: u64,
    ) -> HandoffRow {
        HandoffRow {
            store: opened.store.kind().to_string(),
            waiters,
            mode,
            what,
            notified,
            across_processes: false,
            round_trip_us,
            errors: self.errors,
            first_error: self.first_error,
            latency: Latency::of(&self.hist),
        }
    }
}

/// What the participants share.
struct Shared {
    /// When the last release started; taken by the next holder.
    released_at: Mutex<Option<Instant>>,
    hist: Mutex<Histogram<u64>>,
    /// Acquisitions so far.
    turns: watch::Sender<u64>,
    pace: Pace,
}

/// The pace of a hand-off loop, shared by its participants: how many
/// hand-offs it takes and until when, how long a holder holds, and the
/// participants' failures.
pub(crate) struct Pace {
    samples: AtomicUsize,
    pub failures: Failures,
    /// Cancelled at the target or the deadline.
    pub done: CancellationToken,
    target: usize,
    pub deadline: Instant,
    hold: Duration,
    pub poll: Duration,
}

impl Pace {
    /// The plan's hand-offs per configuration, within its time limit.
    pub fn new(plan: &Plan) -> Self {
        Self::within(plan, plan.handoff_limit)
    }

    /// The plan's hand-offs per configuration, within `limit`.
    pub fn within(plan: &Plan, limit: Duration) -> Self {
        Pace {
            samples: AtomicUsize::new(0),
            failures: Failures::default(),
            done: CancellationToken::new(),
            target: plan.handoffs,
            deadline: Instant::now() + limit,
            hold: plan.handoff_hold,
            poll: plan.handoff_poll,
        }
    }

    /// Counts a hand-off that ended at `now`; ends the loop at the target
    /// or past the deadline.
    pub fn sampled(&self, now: Instant) {
        let n = self.samples.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.target || now >= self.deadline {
            self.done.cancel();
        }
    }

    /// Hand-offs so far.
    pub fn samples(&self) -> usize {
        self.samples.load(Ordering::Relaxed)
    }

    /// How long a new holder holds: the fixed time plus a random part of
    /// a poll interval, so that releases fall at random points of the
    /// pollers' schedules (a fixed hold would keep them in step with the
    /// hand-offs).
    pub fn hold(&self) -> Duration {
        self.hold + self.poll.mul_f64(rand::thread_rng().gen_range(0.0..1.0))
    }
}

/// Runs the hand-off loop among `contenders` (the first holds first) until
/// the plan's number of hand-offs or its time limit.
pub(crate) async fn run(mut contenders: Vec<Box<dyn Contender>>, plan: &Plan) -> Result<Outcome> {
    // The first participant holds the lease before the others start.
    contenders[0].take().await?;
    let shared = Arc::new(Shared {
        released_at: Mutex::new(None),
        hist: Mutex::new(histogram()),
        turns: watch::channel(0).0,
        pace: Pace::new(plan),
    });
    let tasks: Vec<_> = contenders
        .into_iter()
        .enumerate()
        .map(|(i, c)| tokio::spawn(participant(c, i == 0, shared.clone())))
        .collect();
    // Bounded: a participant stuck in the store is abandoned.
    let limit = plan.handoff_limit + Duration::from_secs(30);
    let all = futures_util::future::join_all(tasks);
    if tokio::time::timeout(limit, all).await.is_err() {
        return Err(format!("the hand-off participants did not stop within {limit:?}").into());
    }
    let hist = shared.hist.lock().map_err(|_| "poisoned")?.clone();
    let (errors, first_error) = shared.pace.failures.get();
    Ok(Outcome {
        hist,
        errors,
        first_error,
    })
}

async fn participant(mut c: Box<dyn Contender>, mut holding: bool, s: Arc<Shared>) {
    loop {
        if !holding {
            let taken = tokio::select! {
                r = c.take() => r,
                () = s.pace.done.cancelled() => return,
            };
            if let Err(e) = taken {
                s.pace.failures.add(&e);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            let now = Instant::now();
            let released = s.released_at.lock().ok().and_then(|mut r| r.take());
            if let Some(at) = released {
                if let Ok(mut h) = s.hist.lock() {
                    record(&mut h, now - at);
                }
                s.pace.sampled(now);
            }
            s.turns.send_modify(|t| *t += 1);
        }
        holding = false;
        let hold = s.pace.hold();
        tokio::select! {
            () = tokio::time::sleep(hold) => {}
            () = s.pace.done.cancelled() => {
                if let Err(e) = c.give().await {
                    s.pace.failures.add(&e);
                }
                return;
            }
        }
        let mut turns = s.turns.subscribe();
        if let Ok(mut r) = s.released_at.lock() {
            *r = Some(Instant::now());
        }
        if let Err(e) = c.give().await {
            s.pace.failures.add(&e);
        }
        // Sit out until another participant took the lease.
        tokio::select! {
            _ = turns.changed() => {}
            () = s.pace.done.cancelled() => return,
        }
    }
}
