//! Election hand-over (issue 19): a leader gives up, N standby candidates
//! wait; the time from the leader giving up to the next leader's function
//! starting ([`Elector::lead`] calls it once the lease is held and the
//! term's record written). Two ways to give up:
//! * **resign**: the leader's function calls [`Leadership::resign`]; the
//!   figure starts when it does.
//! * **step-down**: another task asks with [`election::request_step_down`];
//!   the leader's lost signal fires, its function returns and `lead`
//!   releases. The figure starts when the lost signal fired (the leader
//!   saw the request); how long the request took to be seen is its own
//!   figure.
//!
//! Every candidate shares one store value, as in the one-process
//! hand-off rows, and after its term sits out until another candidate
//! leads (so the leader never hands over to itself). Beside them an
//! observer ([`election::observe`], poll interval = the plan's) reports
//! each leader; the figure is from a term's start to the observer's first
//! item naming it (0 when it saw the term before its function started).
//!
//! The goals ("hand-over within 2 store round trips + one notification",
//! "observe learns of a change within one notification or one poll") are
//! judged against the unfair push hand-off to one waiter measured just
//! before on the same store value ([`crate::fair_handoff`] explains why
//! that row is the bound).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use hdrhistogram::Histogram;
use tokio::sync::watch;
use tokio::time::Instant;
use worklease::election::{self, Elector, Leadership};
use worklease::{LeaseStore, WorkId};

use crate::handoff::{self, Pace};
use crate::measure::{histogram, record};
use crate::results::{ElectionRow, HandOver, HandoffMode, HandoffRow, Latency};
use crate::stores::Opened;
use crate::{Plan, Result};

/// The election scenario on one store: its round trip, the unfair push
/// hand-off to one waiter (the bound), then resign and step-down
/// hand-overs at each number of standby candidates of the plan.
pub async fn scenario(opened: &Opened, plan: &Plan, rows: &mut Vec<ElectionRow>) -> Result<()> {
    let rtt = handoff::round_trip(opened, plan).await?;
    let bound = handoff::handoff(opened, plan, 1, HandoffMode::Push, rtt)
        .await?
        .ok_or("no unfair push hand-off row")?;
    let row = ElectionRow {
        how: HandOver::Bound,
        handoff: bound,
        observed: None,
        observed_missed: 0,
        seen: None,
    };
    progress(&row);
    rows.push(row);
    for how in [HandOver::Resign, HandOver::StepDown] {
        for &candidates in &plan.election_candidates {
            let row = hand_overs(opened, plan, how, candidates, rtt).await?;
            progress(&row);
            rows.push(row);
        }
    }
    Ok(())
}

/// What the candidates, the requester and the observer share.
struct Shared {
    /// When the last leader gave up (resign called, or its lost signal
    /// fired); taken by the next leader.
    gave_up_at: Mutex<Option<Instant>>,
    /// When the last step-down request started; taken by the leader that
    /// saw it.
    requested_at: Mutex<Option<Instant>>,
    handover: Mutex<Histogram<u64>>,
    seen: Mutex<Histogram<u64>>,
    /// Each term's start.
    started: Mutex<Vec<(u64, Instant)>>,
    /// Terms started so far.
    terms: watch::Sender<u64>,
    pace: Pace,
}

/// Hand-overs among `candidates` + 1 electors, giving up `how`.
async fn hand_overs(
    opened: &Opened,
    plan: &Plan,
    how: HandOver,
    candidates: usize,
    round_trip_us: u64,
) -> Result<ElectionRow> {
    let name = format!("election-{}-{candidates}", how.as_str());
    let store: Arc<dyn LeaseStore> = opened.store.clone();
    let notified = WorkId::new(&name)
        .map(|id| store.watch(&id).is_some())
        .unwrap_or(false);
    let shared = Arc::new(Shared {
        gave_up_at: Mutex::new(None),
        requested_at: Mutex::new(None),
        handover: Mutex::new(histogram()),
        seen: Mutex::new(histogram()),
        started: Mutex::new(Vec::new()),
        terms: watch::channel(0).0,
        // Without notifications a leader sees a step-down request at its
        // next read of it, once per renewal interval (TTL/3): time for a
        // few of those.
        pace: Pace::within(
            plan,
            if how == HandOver::StepDown && !notified {
                plan.handoff_limit.max(plan.ttl * 2)
            } else {
                plan.handoff_limit
            },
        ),
    });
    let observer = tokio::spawn(observer(
        election::observe(store.clone(), name.clone(), plan.handoff_poll)?,
        shared.clone(),
    ));
    let mut tasks = Vec::new();
    if how == HandOver::StepDown {
        // Subscribed before any candidate runs, so it sees the first term.
        let terms = shared.terms.subscribe();
        tasks.push(tokio::spawn(requester(
            store.clone(),
            name.clone(),
            terms,
            shared.clone(),
        )));
    }
    for n in 0..=candidates {
        let elector = Elector::builder(store.clone(), name.clone(), format!("candidate-{n}"))
            .ttl(plan.ttl)
            .poll_interval(plan.handoff_poll)
            .build()?;
        tasks.push(tokio::spawn(candidate(elector, how, shared.clone())));
    }
    // The time limit holds even when no term starts any more: a stall is
    // an error that says who led then.
    let watchdog = tokio::spawn(watchdog(store.clone(), name.clone(), shared.clone()));
    // Bounded: a task stuck in the store is abandoned.
    let limit = shared.pace.deadline + Duration::from_secs(30);
    let all = futures_util::future::join_all(tasks);
    if tokio::time::timeout_at(limit, all).await.is_err() {
        return Err("the election's candidates did not stop within 30 s of the time limit".into());
    }
    watchdog.abort();
    let seen_by_observer = observer.await?;
    let (observed, missed) = observed(&shared, &seen_by_observer)?;
    let hist = |h: &Mutex<Histogram<u64>>| -> Result<Latency> {
        Ok(Latency::of(&*h.lock().map_err(|_| "poisoned")?))
    };
    let what = match how {
        HandOver::Resign => "the leader's function calls Leadership::resign; from that call",
        HandOver::StepDown => {
            "another task calls election::request_step_down; from the leader's lost signal firing (its function then returns and lead releases)"
        }
        HandOver::Bound => "the unfair push hand-off to one waiter, from the release",
    };
    let waiting = if notified {
        format!(
            "standbys woken by the store's notifications (poll every {:?} as the fallback)",
            plan.handoff_poll
        )
    } else {
        format!(
            "the store has no notifications: standbys poll every {:?}",
            plan.handoff_poll
        )
    };
    let (errors, first_error) = shared.pace.failures.get();
    Ok(ElectionRow {
        how,
        handoff: HandoffRow {
            store: opened.store.kind().to_string(),
            waiters: candidates,
            mode: HandoffMode::Push,
            what: format!("{what} to the next leader's function starting; {waiting}"),
            notified,
            across_processes: false,
            round_trip_us,
            errors,
            first_error,
            latency: hist(&shared.handover)?,
        },
        observed: Some(observed),
        observed_missed: missed,
        seen: (how == HandOver::StepDown)
            .then(|| hist(&shared.seen))
            .transpose()?,
    })
}

/// One candidate: leads when it can, gives up `how`, sits out until
/// another candidate leads, campaigns again; until done.
async fn candidate(elector: Elector, how: HandOver, s: Arc<Shared>) {
    loop {
        let led = tokio::select! {
            led = elector.lead(|l| term(l, how, s.clone())) => led,
            () = s.pace.done.cancelled() => return,
        };
        match led {
            Ok(mut terms) => {
                tokio::select! {
                    _ = terms.changed() => {}
                    () = s.pace.done.cancelled() => return,
                }
            }
            Err(e) => {
                s.pace.failures.add(&e);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// One term: records the hand-over that led to it, holds, gives up.
/// Returns a receiver of the term count that has seen this term, so the
/// candidate can wait for the next.
async fn term(l: Leadership, how: HandOver, s: Arc<Shared>) -> watch::Receiver<u64> {
    let now = Instant::now();
    if let Some(at) = s.gave_up_at.lock().ok().and_then(|mut g| g.take()) {
        if let Ok(mut h) = s.handover.lock() {
            record(&mut h, now - at);
        }
        s.pace.sampled(now);
    }
    // Terms after the last hand-over end at once: not the observer's to see.
    if !s.pace.done.is_cancelled() {
        if let Ok(mut started) = s.started.lock() {
            started.push((l.state().generation, now));
        }
    }
    s.terms.send_modify(|t| *t += 1);
    let turns = s.terms.subscribe();
    match how {
        HandOver::Resign => {
            tokio::select! {
                () = tokio::time::sleep(s.pace.hold()) => {}
                () = s.pace.done.cancelled() => return turns,
            }
            if let Ok(mut g) = s.gave_up_at.lock() {
                *g = Some(Instant::now());
            }
            if let Err(e) = l.resign().await {
                s.pace.failures.add(&e);
            }
        }
        HandOver::StepDown | HandOver::Bound => {
            let lost = l.lost();
            tokio::select! {
                () = lost.cancelled() => {}
                () = s.pace.done.cancelled() => return turns,
            }
            let now = Instant::now();
            if let Some(at) = s.requested_at.lock().ok().and_then(|mut r| r.take()) {
                if let Ok(mut h) = s.seen.lock() {
                    record(&mut h, now - at);
                }
            }
            if let Ok(mut g) = s.gave_up_at.lock() {
                *g = Some(now);
            }
        }
    }
    turns
}

/// Asks each new leader to step down after the hold; until done.
async fn requester(
    store: Arc<dyn LeaseStore>,
    name: String,
    mut terms: watch::Receiver<u64>,
    s: Arc<Shared>,
) {
    loop {
        tokio::select! {
            changed = terms.changed() => if changed.is_err() { return },
            () = s.pace.done.cancelled() => return,
        }
        tokio::select! {
            () = tokio::time::sleep(s.pace.hold()) => {}
            () = s.pace.done.cancelled() => return,
        }
        if let Ok(mut r) = s.requested_at.lock() {
            *r = Some(Instant::now());
        }
        if let Err(e) =
            election::request_step_down(store.clone(), name.clone(), "bench-requester").await
        {
            s.pace.failures.add(&e);
        }
    }
}

/// Ends the hand-overs at the time limit; when none happened at all,
/// records an error naming who led then. (Fewer than the target is no
/// error: where the store does not notify, a leader sees a step-down
/// request only at its next read of it, once per renewal interval.)
async fn watchdog(store: Arc<dyn LeaseStore>, name: String, s: Arc<Shared>) {
    tokio::select! {
        () = tokio::time::sleep_until(s.pace.deadline) => {}
        () = s.pace.done.cancelled() => return,
    }
    if s.pace.samples() == 0 {
        let leader = match election::observe(store, name, s.pace.poll) {
            Ok(mut leaders) => format!("{:?}", leaders.next().await),
            Err(e) => e.to_string(),
        };
        s.pace.failures.add(&format!(
            "stalled: no hand-over within the time limit; the leader then: {leader}"
        ));
    }
    s.pace.done.cancel();
}

/// The observer: when it first reported each term; until done.
async fn observer(mut leaders: election::Observations, s: Arc<Shared>) -> HashMap<u64, Instant> {
    let mut seen = HashMap::new();
    loop {
        let item = tokio::select! {
            item = leaders.next() => item,
            () = s.pace.done.cancelled() => return seen,
        };
        match item {
            Some(Ok(Some(leader))) => {
                seen.entry(leader.generation).or_insert_with(Instant::now);
            }
            Some(_) => {}
            None => return seen,
        }
    }
}

/// From each term's start to the observer's first report of it (0 when
/// it reported the term before its function started), and the terms it
/// never reported.
fn observed(s: &Shared, seen: &HashMap<u64, Instant>) -> Result<(Latency, u64)> {
    let mut h = histogram();
    let mut missed = 0;
    for (term, start) in s.started.lock().map_err(|_| "poisoned")?.iter() {
        match seen.get(term) {
            Some(at) => record(&mut h, at.saturating_duration_since(*start)),
            None => missed += 1,
        }
    }
    Ok((Latency::of(&h), missed))
}

/// A progress line for one row.
fn progress(row: &ElectionRow) {
    let h = &row.handoff;
    let observed = row.observed.as_ref().map_or(String::new(), |o| {
        format!(
            ", observer p50 {:.2} ms ({} missed)",
            o.p50_us as f64 / 1000.0,
            row.observed_missed
        )
    });
    eprintln!(
        "  election {} {} standby(s): p50 {:.2} ms p99 {:.2} ms ({} samples, round trip {:.3} ms){observed}{}",
        row.how.as_str(),
        h.waiters,
        h.latency.p50_us as f64 / 1000.0,
        h.latency.p99_us as f64 / 1000.0,
        h.latency.count,
        h.round_trip_us as f64 / 1000.0,
        crate::scenarios::errors_note(h.errors, h.first_error.as_deref())
    );
}
