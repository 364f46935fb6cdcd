//! The session of a [`Leases`] handle: one renewal scheduler for every
//! lease the handle renews in the background, so that a process holding
//! thousands of leases renews them in batches ([`LeaseStore::renew_many`]),
//! not with one task and one store round trip each.
//!
//! Each lease keeps what a renewal of its own had: its renewal interval and
//! backoff ([`RenewalOptions`]), its own deadline (the send time of its
//! last successful acquire or renew, plus the TTL, minus the safety
//! margin), its own lost signal and cause, and its [`Renewal`] handle. The
//! scheduler wakes when the earliest lease falls due and sends the due
//! leases in batches of at most the store's [`LeaseStore::max_batch`], up
//! to [`MAX_BATCHES_IN_FLIGHT`] at once; a batch that the due leases do not
//! fill takes the leases due soonest, up to half their interval early. The
//! leases of one batch are due together from then on (the next renewal of
//! each is one interval after the batch's send), so leases acquired at
//! scattered moments gather into full batches within a few intervals, and
//! a tick costs about `ceil(leases due / max_batch)` store calls. A
//! fenced, expired or revoked lease in a batch fails alone; a store error
//! (of one lease or of the whole batch) is retried with that lease's
//! backoff while its deadline allows. A lease whose deadline passes while
//! its renewal is in flight or waiting for a retry is lost at its deadline,
//! whatever the batch's reply does later: a slow or lost reply never
//! extends a lease past its own deadline (S1).
//!
//! Store notifications ([`LeaseStore::watch`]) for a held work ID make its
//! lease due at once (at most once per [`EARLY_CHECK_GAP`] after its last
//! renewal), so a revocation is seen within the notification latency.
//!
//! [`LeaseStore::renew_many`]: crate::LeaseStore::renew_many
//! [`LeaseStore::max_batch`]: crate::LeaseStore::max_batch
//! [`LeaseStore::watch`]: crate::LeaseStore::watch
//! [`Renewal`]: crate::Renewal
//! [`RenewalOptions`]: crate::RenewalOptions

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::future::{AbortHandle, Abortable, BoxFuture};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use rand::Rng;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::lease::renewal::{RenewalOptions, Shared};
use crate::lease::{Inner, Leases};
use crate::token::Token;

/// How many batch renewals of one session are in flight at once.
pub(crate) const MAX_BATCHES_IN_FLIGHT: usize = 4;

/// The shortest time between a renewal and an early one woken by a store
/// notification: a store that notifies often (spurious wake-ups are
/// allowed) costs at most one renewal per this gap.
pub(crate) const EARLY_CHECK_GAP: Duration = Duration::from_millis(100);

/// What a [`crate::Renewal`] handle tells its session.
pub(crate) enum Command {
    Start(Box<Start>),
    Stop(u64),
}

/// A lease to renew from now on.
pub(crate) struct Start {
    pub(crate) id: u64,
    pub(crate) token: Token,
    pub(crate) options: RenewalOptions,
    pub(crate) interval: Duration,
    pub(crate) tx: watch::Sender<Shared>,
    pub(crate) lost: CancellationToken,
    /// The store's notifications for the work ID, subscribed before the
    /// handle was returned (a change right after is seen).
    pub(crate) watched: Option<BoxFuture<'static, ()>>,
}

/// The handle's side of its session: where renewals are registered.
#[derive(Default)]
pub(crate) struct SessionHandle {
    commands: Mutex<Option<mpsc::UnboundedSender<Command>>>,
    next_id: std::sync::atomic::AtomicU64,
}

impl SessionHandle {
    /// Registers a renewal with the session, starting the scheduler on the
    /// current runtime when none runs (the first renewal, or after the
    /// runtime of the previous one ended). Returns the sender the renewal
    /// handle keeps to stop it.
    pub(crate) fn start(
        &self,
        inner: &Arc<Inner>,
        make: impl FnOnce(u64) -> Start,
    ) -> mpsc::UnboundedSender<Command> {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut start = Box::new(make(id));
        let mut commands = self.commands.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let sender = match commands.as_ref() {
                Some(s) if !s.is_closed() => s.clone(),
                _ => {
                    let (tx, rx) = mpsc::unbounded_channel();
                    tokio::spawn(run(Arc::downgrade(inner), rx));
                    *commands = Some(tx.clone());
                    tx
                }
            };
            match sender.send(Command::Start(start)) {
                Ok(()) => return sender,
                // The scheduler's runtime ended between the check and the
                // send: start a new one.
                Err(mpsc::error::SendError(Command::Start(back))) => {
                    start = back;
                    *commands = None;
                }
                Err(_) => unreachable!("only a Start was sent"),
            }
        }
    }
}

/// One lease under the scheduler. Its token lives in `tx` only (the
/// handle reads it there): one copy per lease.
struct Entry {
    options: RenewalOptions,
    interval: Duration,
    /// When the next renewal (or retry) is due.
    next_due: Instant,
    /// The deadline in force (`token.deadline`, or for a parsed token
    /// without one, the deadline its first renewal's send time gives).
    deadline: Option<Instant>,
    /// The send time of the last successful acquire or renew.
    last_sent: Option<Instant>,
    attempt: u32,
    backoff: Duration,
    last_error: Option<String>,
    in_flight: bool,
    /// A notification arrived while the renewal was in flight: renew again.
    notified_in_flight: bool,
    tx: watch::Sender<Shared>,
    lost: CancellationToken,
    watch_abort: Option<AbortHandle>,
}

impl Entry {
    /// The latest token.
    fn token(&self) -> Token {
        self.tx.borrow().token.clone()
    }
}

/// The outcome of one batch: the leases it named (by entry ID), and per
/// lease the renewed token (its deadline counted from the batch's send
/// time) or the error.
type BatchDone = (Vec<u64>, Result<Vec<Result<Token>>>);

struct Scheduler {
    leases: Weak<Inner>,
    /// The longest renewal interval of any entry so far: no entry is
    /// renewed more than half of it early, which bounds the scan of the
    /// due set.
    max_interval: Duration,
    entries: HashMap<u64, Entry>,
    /// (next_due, id) of every entry not in flight.
    due: BTreeSet<(Instant, u64)>,
    /// (deadline, id) of every entry that has one.
    deadlines: BTreeSet<(Instant, u64)>,
    batches: FuturesUnordered<BoxFuture<'static, BatchDone>>,
    watches: FuturesUnordered<BoxFuture<'static, Option<u64>>>,
    /// Counts the entries in `worklease_leases_held` (one gauge for all).
    held: HeldGauge,
}

async fn run(leases: Weak<Inner>, mut commands: mpsc::UnboundedReceiver<Command>) {
    let kind = leases
        .upgrade()
        .map_or("unknown", |inner| inner.store.kind());
    let mut s = Scheduler {
        leases,
        max_interval: Duration::ZERO,
        entries: HashMap::new(),
        due: BTreeSet::new(),
        deadlines: BTreeSet::new(),
        batches: FuturesUnordered::new(),
        watches: FuturesUnordered::new(),
        held: HeldGauge {
            store: kind,
            count: 0,
        },
    };
    // One timer for the loop, moved when the next wake-up moves (a new
    // timer per turn of the loop costs a registration each).
    let sleep = tokio::time::sleep_until(far_future());
    tokio::pin!(sleep);
    let mut armed = None;
    loop {
        let now = Instant::now();
        s.expire(now);
        s.send_due(now);
        let wake = s.next_wake();
        if wake != armed {
            sleep.as_mut().reset(wake.unwrap_or_else(far_future));
            armed = wake;
        }
        tokio::select! {
            biased;
            cmd = commands.recv() => match cmd {
                Some(Command::Start(start)) => s.add(*start),
                Some(Command::Stop(id)) => s.remove(id, None),
                // Every handle and renewal is gone: nothing to renew.
                None => return,
            },
            Some((ids, result)) = s.batches.next(), if !s.batches.is_empty() => {
                s.apply(ids, result);
            }
            Some(fired) = s.watches.next(), if !s.watches.is_empty() => {
                if let Some(id) = fired {
                    s.notified(id);
                }
            }
            () = &mut sleep, if armed.is_some() => {
                // Fired: the next turn sets it again if anything waits.
                armed = None;
            }
        }
    }
}

/// A wake-up time for a timer that waits for nothing (a year from now).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

impl Scheduler {
    fn add(&mut self, start: Start) {
        let Some(inner) = self.leases.upgrade() else {
            return;
        };
        let leases = Leases { inner };
        let window = leases.belief_window();
        let now = Instant::now();
        let deadline = start.token.deadline;
        let last_sent = deadline.map(|d| d - window);
        // A parsed token (no deadline) is renewed at once.
        let next_due = last_sent.map_or(now, |sent| sent + start.interval);
        let entry = Entry {
            backoff: start.options.backoff_initial(),
            options: start.options,
            interval: start.interval,
            next_due,
            deadline,
            last_sent,
            attempt: 0,
            last_error: None,
            in_flight: false,
            notified_in_flight: false,
            tx: start.tx,
            lost: start.lost,
            watch_abort: None,
        };
        self.held.add(1);
        self.max_interval = self.max_interval.max(start.interval);
        self.due.insert((next_due, start.id));
        if let Some(d) = deadline {
            self.deadlines.insert((d, start.id));
        }
        self.entries.insert(start.id, entry);
        if let Some(w) = start.watched {
            self.subscribe(start.id, w);
        }
    }

    fn subscribe(&mut self, id: u64, watched: BoxFuture<'static, ()>) {
        let (abort, registration) = AbortHandle::new_pair();
        if let Some(e) = self.entries.get_mut(&id) {
            if let Some(old) = e.watch_abort.replace(abort) {
                old.abort();
            }
        }
        self.watches.push(
            Abortable::new(watched, registration)
                .map(move |r| r.ok().map(|()| id))
                .boxed(),
        );
    }

    /// Removes entry `id`: with `lost` as its cause (fires its signal), or
    /// stopped by its handle.
    fn remove(&mut self, id: u64, lost: Option<Error>) {
        let Some(e) = self.entries.remove(&id) else {
            return;
        };
        self.held.add(-1);
        self.due.remove(&(e.next_due, id));
        if let Some(d) = e.deadline {
            self.deadlines.remove(&(d, id));
        }
        if let Some(a) = &e.watch_abort {
            a.abort();
        }
        match lost {
            Some(cause) => {
                let token = e.token();
                tracing::warn!(work_id = %token.work_id, fencing_token = token.fencing_token, error = %cause, "lease lost");
                metrics::counter!(crate::metrics::LEASES_LOST_TOTAL, "cause" => crate::metrics::error_kind(&cause))
                    .increment(1);
                e.tx.send_modify(|s| s.lost = Some(cause));
                e.lost.cancel();
            }
            None => e.tx.send_modify(|s| s.stopped = true),
        }
    }

    /// Fires the lost signal of every lease whose deadline has passed
    /// without a successful renewal.
    fn expire(&mut self, now: Instant) {
        while let Some(&(deadline, id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            let last_error = self.entries.get(&id).and_then(|e| e.last_error.clone());
            let work = self.entries.get(&id).map(Entry::token);
            let Some(token) = work else {
                self.deadlines.pop_first();
                continue;
            };
            self.remove(
                id,
                Some(Error::WindowExhausted {
                    work_id: token.work_id.to_string(),
                    fencing_token: token.fencing_token,
                    last_error: Some(last_error.unwrap_or_else(|| {
                        "no renewal succeeded before the lease deadline (the store did not answer in time, or this process was paused)".to_string()
                    })),
                }),
            );
        }
    }

    /// Sends the leases that are due in batches, each filled up with the
    /// leases due soonest (up to half their interval early), while fewer
    /// than [`MAX_BATCHES_IN_FLIGHT`] are in flight.
    fn send_due(&mut self, now: Instant) {
        let Some(inner) = self.leases.upgrade() else {
            return;
        };
        let leases = Leases { inner };
        let max = leases.store().max_batch().max(1);
        let window = leases.belief_window();
        let widest = now + self.max_interval / 2;
        // A batch goes out only when at least one lease is due; it fills
        // up with those due soonest, up to half their interval early.
        while self.batches.len() < MAX_BATCHES_IN_FLIGHT
            && self.due.first().is_some_and(|&(t, _)| t <= now)
        {
            let mut ids = Vec::new();
            let mut taken = Vec::new();
            for &(due, id) in self.due.iter() {
                // Ordered by due time: past the widest window, nothing
                // later can be due.
                if ids.len() == max || due > widest {
                    break;
                }
                let Some(e) = self.entries.get(&id) else {
                    taken.push((due, id));
                    continue;
                };
                if due > now + e.interval / 2 {
                    continue;
                }
                taken.push((due, id));
                ids.push(id);
            }
            for key in taken {
                self.due.remove(&key);
            }
            if ids.is_empty() {
                return;
            }
            let mut tokens = Vec::with_capacity(ids.len());
            let mut attempts = Vec::with_capacity(ids.len());
            let mut give_up = now + window;
            for id in &ids {
                let Some(e) = self.entries.get_mut(id) else {
                    continue;
                };
                e.in_flight = true;
                e.attempt += 1;
                // A parsed token has no deadline of its own: this attempt
                // gives it one, so that a reply that never comes still
                // ends it.
                if e.deadline.is_none() {
                    let d = now + window;
                    e.deadline = Some(d);
                    self.deadlines.insert((d, *id));
                }
                give_up = give_up.min(e.deadline.unwrap_or(give_up));
                tokens.push(e.token());
                attempts.push(e.attempt);
            }
            let leases = leases.clone();
            self.batches.push(
                async move {
                    // No reply by the first deadline of the batch: give up
                    // the call (its leases retry or are lost), so a store
                    // that hangs cannot hold a batch slot for ever.
                    let result =
                        tokio::time::timeout_at(give_up, leases.renew_batch(&tokens, &attempts))
                            .await
                            .unwrap_or_else(|_| {
                                Err(crate::error::StoreError::new(
                                    leases.store().kind(),
                                    "no answer to the batch renewal before the first of its lease deadlines",
                                )
                                .into())
                            });
                    (ids, result)
                }
                .boxed(),
            );
        }
    }

    /// When the loop must look again: the first deadline, and the first
    /// renewal due unless every batch slot is taken (then a batch's reply
    /// wakes the loop: waking for a lease already due would spin).
    fn next_wake(&self) -> Option<Instant> {
        let due = (self.batches.len() < MAX_BATCHES_IN_FLIGHT)
            .then(|| self.due.first().map(|&(t, _)| t))
            .flatten();
        let deadline = self.deadlines.first().map(|&(t, _)| t);
        match (due, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn apply(&mut self, ids: Vec<u64>, result: Result<Vec<Result<Token>>>) {
        let now = Instant::now();
        let window = self
            .leases
            .upgrade()
            .map(|inner| Leases { inner }.belief_window())
            .unwrap_or_default();
        let (outcomes, batch_error): (Vec<Option<Result<Token>>>, Option<String>) = match result {
            Ok(v) => (v.into_iter().map(Some).collect(), None),
            Err(e) => {
                tracing::warn!(leases = ids.len(), error = %e, "batch renewal failed");
                (ids.iter().map(|_| None).collect(), Some(e.to_string()))
            }
        };
        for (id, outcome) in ids.into_iter().zip(outcomes) {
            let Some(e) = self.entries.get_mut(&id) else {
                continue; // stopped or lost while in flight
            };
            e.in_flight = false;
            let outcome = match outcome {
                Some(o) => o,
                None => Err(Error::Store(crate::error::StoreError::new(
                    "session",
                    batch_error.clone().unwrap_or_default(),
                ))),
            };
            match outcome {
                // A reply that came after the lease's deadline cannot save
                // it: the holder stopped counting it as its own then.
                Ok(_) if e.deadline.is_some_and(|d| d <= now) => {}
                Ok(renewed) => {
                    if let Some(d) = e.deadline {
                        self.deadlines.remove(&(d, id));
                    }
                    e.deadline = renewed.deadline;
                    if let Some(d) = e.deadline {
                        self.deadlines.insert((d, id));
                    }
                    // The deadline counts from the batch's send time.
                    let sent = renewed.deadline.map_or(now, |d| d - window);
                    e.last_sent = Some(sent);
                    e.attempt = 0;
                    e.backoff = e.options.backoff_initial();
                    e.last_error = None;
                    e.next_due = if std::mem::take(&mut e.notified_in_flight) {
                        now.max(sent + EARLY_CHECK_GAP)
                    } else {
                        sent + e.interval
                    };
                    self.due.insert((e.next_due, id));
                    e.tx.send_modify(|s| s.token = renewed);
                }
                Err(err) if !err.is_transient() => self.remove(id, Some(err)),
                Err(err) => {
                    // A parsed token, never renewed yet, has no window for
                    // retries.
                    let deadline = match (e.deadline, e.last_sent) {
                        (Some(d), Some(_)) => d,
                        _ => now,
                    };
                    let left = deadline.saturating_duration_since(now);
                    if left < Duration::from_millis(1) {
                        let token = e.token();
                        self.remove(
                            id,
                            Some(Error::WindowExhausted {
                                work_id: token.work_id.to_string(),
                                fencing_token: token.fencing_token,
                                last_error: Some(err.to_string()),
                            }),
                        );
                        continue;
                    }
                    // Bound the wait by the window first, so that the
                    // jitter's arithmetic stays in range whatever the
                    // configured backoff.
                    let jitter = e.options.jitter();
                    let factor = 1.0 + rand::thread_rng().gen_range(-jitter..=jitter);
                    let nap = e.backoff.min(left / 2).mul_f64(factor).min(left / 2);
                    if batch_error.is_none() {
                        tracing::warn!(work_id = %e.token().work_id, attempt = e.attempt, error = %err, retry_in = ?nap, "lease renewal failed");
                    }
                    e.last_error = Some(err.to_string());
                    e.backoff = e.backoff.saturating_mul(2).min(e.options.backoff_max());
                    e.next_due = now + nap;
                    self.due.insert((e.next_due, id));
                }
            }
        }
    }

    /// The store notified a change of entry `id`'s work ID: renew it soon.
    fn notified(&mut self, id: u64) {
        let Some(inner) = self.leases.upgrade() else {
            return;
        };
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        let work_id = e.token().work_id;
        tracing::debug!(work_id = %work_id, "store notification for a held lease: renewing now");
        // Watch again first: a change after this renewal is seen too.
        let watched = inner.store.watch(&work_id);
        if e.in_flight {
            e.notified_in_flight = true;
        } else {
            let now = Instant::now();
            let soon = e
                .last_sent
                .map_or(now, |sent| now.max(sent + EARLY_CHECK_GAP));
            if soon < e.next_due {
                self.due.remove(&(e.next_due, id));
                e.next_due = soon;
                self.due.insert((soon, id));
            }
        }
        if let Some(w) = watched {
            self.subscribe(id, w);
        }
    }
}

/// Counts the leases under renewal in `worklease_leases_held`: each entry
/// from its start until it is removed (stop, loss) or the scheduler ends
/// with the runtime.
struct HeldGauge {
    store: &'static str,
    count: i64,
}

impl HeldGauge {
    fn add(&mut self, n: i64) {
        self.count += n;
        metrics::gauge!(crate::metrics::LEASES_HELD, "store" => self.store).increment(n as f64);
    }
}

impl Drop for HeldGauge {
    fn drop(&mut self) {
        metrics::gauge!(crate::metrics::LEASES_HELD, "store" => self.store)
            .decrement(self.count as f64);
    }
}
