//! Election checks: one leader at a time, fast graceful hand-over,
//! increasing generations, the event stream, and a leader cut off from its
//! store.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::Suite;
use crate::election::{Campaign, Elector, EventKind};
use crate::error::Error;
use crate::store::fault::FaultStore;
use crate::store::LeaseStore;
use crate::WorkId;

const POLL: Duration = Duration::from_millis(500);

fn elector(s: &Suite, store: Arc<dyn LeaseStore>, election: &str, owner: &str) -> Elector {
    Elector::builder(store, election, owner)
        .ttl(s.ttl)
        .poll_interval(POLL)
        .build()
        .expect("valid elector")
}

/// Three candidates: exactly one leads at any time; a leader that steps
/// down hands leadership to a standby within one poll interval (not a TTL);
/// generations strictly increase with every change of leader.
pub async fn election_one_leader_and_fast_handover(s: &Suite) {
    let election = s.work_id("election");
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let step_down = Arc::new(Notify::new());
    let mut tasks = Vec::new();
    for owner in ["cand-a", "cand-b", "cand-c"] {
        let e = elector(s, s.store.clone(), &election, owner);
        let (tx, step_down) = (started_tx.clone(), step_down.clone());
        tasks.push(tokio::spawn(async move {
            e.lead(|l| async move {
                tx.send((l.state().owner.clone(), l.generation(), Instant::now())).expect("test alive");
                let lost = l.lost();
                tokio::select! {
                    _ = step_down.notified() => {}
                    _ = lost.cancelled() => panic!("leadership of {} lost while renewing", l.state().owner),
                }
                Instant::now()
            })
            .await
            .expect("lead")
        }));
    }
    let mut leaders = Vec::new();
    let mut last_end: Option<Instant> = None;
    for _ in 0..3 {
        let (owner, generation, at) = started.recv().await.expect("a candidate leads");
        if let Some(end) = last_end {
            assert!(
                at - end <= POLL + POLL / 5 + s.slack(),
                "hand-over took {:?}, more than a poll interval",
                at - end
            );
        }
        // Renewals keep the leader; nobody else leads meanwhile.
        tokio::time::sleep(s.ttl * 2).await;
        assert!(
            started.try_recv().is_err(),
            "S1: a second candidate led while {owner} led"
        );
        let state = elector(s, s.store.clone(), &election, "observer")
            .leader()
            .await
            .expect("leader")
            .expect("a leader");
        assert_eq!(
            (state.owner.as_str(), state.generation),
            (owner.as_str(), generation)
        );
        leaders.push((owner, generation));
        last_end = Some(Instant::now());
        step_down.notify_one();
    }
    for t in tasks {
        t.await.expect("candidate task");
    }
    let generations: Vec<u64> = leaders.iter().map(|l| l.1).collect();
    assert!(
        generations.windows(2).all(|w| w[0] < w[1]),
        "generations must increase: {leaders:?}"
    );
    let owners: std::collections::HashSet<_> = leaders.iter().map(|l| l.0.clone()).collect();
    assert_eq!(owners.len(), 3, "each candidate led once: {leaders:?}");
    let e = elector(s, s.store.clone(), &election, "observer");
    assert!(
        matches!(e.leader().await, Ok(None)),
        "nobody leads after the last stepped down"
    );
}

/// The event stream of a candidate that leads, loses and leads again reads
/// `Acquired, Renewed…, Lost, Acquired`; the second generation is larger.
pub async fn election_event_stream(s: &Suite) {
    let election = s.work_id("events");
    let e = elector(s, s.store.clone(), &election, "cand-events");
    let mut events = e.run();
    let first = events.next().await.expect("event");
    assert_eq!(first.kind, EventKind::Acquired);
    let mut kinds = vec![first.kind];
    loop {
        let ev = events.next().await.expect("event");
        kinds.push(ev.kind);
        if ev.kind == EventKind::Renewed && kinds.len() == 3 {
            // Two renewals seen: an operator takes leadership away.
            s.store
                .revoke(&WorkId::new(election.clone()).expect("valid"))
                .await
                .expect("revoke");
        }
        if ev.kind == EventKind::Lost {
            assert!(
                matches!(ev.error, Some(Error::Fenced { .. })),
                "lost after revocation: {:?}",
                ev.error
            );
            break;
        }
    }
    let again = events.next().await.expect("event");
    assert_eq!(again.kind, EventKind::Acquired);
    assert!(again.state.generation > first.state.generation);
    kinds.push(again.kind);
    assert_eq!(
        kinds,
        [
            EventKind::Acquired,
            EventKind::Renewed,
            EventKind::Renewed,
            EventKind::Lost,
            EventKind::Acquired
        ]
    );
    // Dropping the stream releases leadership promptly.
    drop(events);
    let standby = elector(s, s.store.clone(), &election, "cand-standby");
    let t0 = Instant::now();
    standby.lead(|_| async {}).await.expect("standby leads");
    let (took, bound) = (t0.elapsed(), POLL + POLL / 5 + s.slack());
    assert!(
        took <= bound,
        "a dropped campaign must release within a poll interval: the standby led after {took:?}, over {bound:?} (poll {POLL:?} + a fifth + the store's slack {:?})",
        s.slack()
    );
}

/// A leader whose store becomes unreachable sees its signal fire by its
/// lease deadline, and a standby leads only after that.
pub async fn election_leader_cut_off(s: &Suite) {
    let election = s.work_id("cutoff");
    let faulty = Arc::new(FaultStore::new(s.store.clone()));
    let leader = elector(s, faulty.clone(), &election, "cand-cut");
    let standby = elector(s, s.store.clone(), &election, "cand-standby");
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel();
    let faulty2 = faulty.clone();
    let sent = Instant::now();
    let lead = tokio::spawn(async move {
        leader
            .lead(|l| async move {
                faulty2.set_unreachable(true);
                l.lost().cancelled().await;
                let _ = lost_tx.send((Instant::now(), l.lost_cause()));
            })
            .await
            .expect("lead")
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let standby_got = tokio::spawn(async move {
        standby
            .lead(|l| async move { (Instant::now(), l.generation()) })
            .await
    });
    let (lost_at, cause) = lost_rx.await.expect("the leader's signal fires");
    assert!(
        matches!(cause, Some(Error::WindowExhausted { .. })),
        "cause: {cause:?}"
    );
    assert!(
        lost_at <= sent + s.ttl,
        "signal fired {:?} after the campaign began, later than the TTL",
        lost_at - sent
    );
    let (standby_at, _) = standby_got.await.expect("task").expect("standby leads");
    assert!(
        standby_at >= lost_at,
        "S1: the standby led before the cut-off leader's signal fired"
    );
    lead.await.expect("leader task");
}

/// Dropping a `lead` future (shutdown, cancellation) releases leadership:
/// a standby leads within one poll interval.
pub async fn election_dropped_lead_releases(s: &Suite) {
    let election = s.work_id("dropped");
    let leader = elector(s, s.store.clone(), &election, "cand-dropped");
    let (led_tx, led_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        leader
            .lead(|_| async move {
                let _ = led_tx.send(());
                std::future::pending::<()>().await
            })
            .await
    });
    led_rx.await.expect("leads");
    task.abort();
    let _ = task.await;
    let t0 = Instant::now();
    let standby = elector(s, s.store.clone(), &election, "cand-standby");
    standby.lead(|_| async {}).await.expect("standby leads");
    assert!(
        t0.elapsed() <= POLL + POLL / 5 + s.slack(),
        "a dropped lead released within a poll interval, took {:?}",
        t0.elapsed()
    );
}

/// Bad elector settings are refused, naming the rule that broke.
pub async fn election_bad_config(s: &Suite) {
    let b = || Elector::builder(s.store.clone(), s.work_id("cfg"), "cand");
    let e = b()
        .ttl(Duration::from_secs(3))
        .renew_interval(Duration::from_secs(3))
        .build()
        .expect_err("refused");
    assert!(e.to_string().contains("renewal interval"), "{e}");
    let e = b()
        .poll_interval(Duration::ZERO)
        .build()
        .expect_err("refused");
    assert!(e.to_string().contains("poll interval"), "{e}");
    let e = b()
        .release_timeout(Duration::ZERO)
        .build()
        .expect_err("refused");
    assert!(e.to_string().contains("release timeout"), "{e}");
    assert!(Elector::builder(s.store.clone(), "", "cand")
        .build()
        .is_err());
    assert!(b().ttl(Duration::ZERO).build().is_err());
    // `NAME/step-down` is NAME's step-down requests: not an election.
    let e = Elector::builder(
        s.store.clone(),
        format!("{}/step-down", s.work_id("cfg")),
        "cand",
    )
    .build()
    .expect_err("refused");
    assert!(e.to_string().contains("reserved"), "{e}");
    let e = Elector::builder(s.store.clone(), "e".repeat(1015), "cand")
        .build()
        .expect_err("refused");
    assert!(e.to_string().contains("the limit is 1014 bytes"), "{e}");
}

/// A leader that resigns: its lost signal fires first, with the cause
/// `Resigned`; a waiting candidate leads only after that (no overlap), and
/// within one notification and a few round trips where the store notifies
/// (one poll interval where it does not), not a TTL; a second `resign`
/// does nothing.
pub async fn election_resign_hands_over_without_overlap(s: &Suite) {
    let election = s.work_id("resign");
    let a = elector(s, s.store.clone(), &election, "cand-a");
    let b = elector(s, s.store.clone(), &election, "cand-b");
    let (a_leads_tx, a_leads) = tokio::sync::oneshot::channel();
    let resign = Arc::new(Notify::new());
    let a_resign = resign.clone();
    let a_task = tokio::spawn(async move {
        a.lead(|l| async move {
            a_leads_tx.send(l.generation()).expect("test alive");
            a_resign.notified().await;
            let called = Instant::now();
            let lost = l.lost();
            let (resigned, lost_at) = tokio::join!(l.resign(), async {
                lost.cancelled().await;
                Instant::now()
            });
            resigned.expect("resign releases");
            assert!(
                matches!(l.lost_cause(), Some(Error::Resigned { .. })),
                "the lost signal's cause after resign: {:?}",
                l.lost_cause()
            );
            l.resign().await.expect("a second resign does nothing");
            (called, lost_at)
        })
        .await
        .expect("a leads")
    });
    let a_generation = a_leads.await.expect("a leads");
    let b_task = tokio::spawn(async move {
        b.lead(|l| async move { (Instant::now(), l.generation()) })
            .await
            .expect("b leads")
    });
    // b is waiting: its first attempt found a leading.
    s.pass(POLL / 2).await;
    resign.notify_one();
    let (called, lost_at) = a_task.await.expect("a's task");
    let (b_started, b_generation) = b_task.await.expect("b's task");
    assert!(b_generation > a_generation, "terms increase");
    assert!(
        b_started >= lost_at,
        "S1: b led before a's lost signal fired"
    );
    let notifies = s
        .store
        .watch(&WorkId::new(election.clone()).expect("valid"))
        .is_some();
    let bound = if notifies {
        POLL / 5 + s.slack()
    } else {
        POLL + POLL / 5 + s.slack()
    };
    assert!(
        b_started - called <= bound,
        "hand-over after resign took {:?}, more than {bound:?} (store notifies: {notifies})",
        b_started - called
    );
}

/// The next event of a campaign that is not a renewal.
async fn next_change(events: &mut Campaign) -> crate::election::Event {
    loop {
        let ev = events.next().await.expect("a campaign's stream is endless");
        if ev.kind != EventKind::Renewed {
            return ev;
        }
    }
}

/// A step-down request from a process that does not campaign: the leader's
/// lost signal fires with `Resigned` within one renewal interval (one
/// notification where the store notifies), a waiting candidate leads only
/// after that, a request naming an earlier term leaves the new leader
/// alone, and a `run()` leader reports `Lost` with `Resigned` and waits its
/// back-off before it campaigns again.
pub async fn election_step_down_request_is_honoured(s: &Suite) {
    let election = s.work_id("step-down");
    let a = elector(s, s.store.clone(), &election, "cand-a");
    let (a_leads_tx, a_leads) = tokio::sync::oneshot::channel();
    let a_task = tokio::spawn(async move {
        let (lost_at, cause, stopped_at) = a
            .lead(|l| async move {
                a_leads_tx.send(l.generation()).expect("test alive");
                l.lost().cancelled().await;
                let lost_at = Instant::now();
                // The work takes a while to stop: nobody may lead meanwhile.
                tokio::time::sleep(POLL / 2).await;
                (lost_at, l.lost_cause(), std::time::SystemTime::now())
            })
            .await
            .expect("a leads");
        (lost_at, cause, stopped_at)
    });
    let a_term = a_leads.await.expect("a leads");
    let b = Elector::builder(s.store.clone(), election.as_str(), "cand-b")
        .ttl(s.ttl)
        .poll_interval(POLL)
        .resign_backoff(s.ttl * 2)
        .build()
        .expect("valid elector");
    let mut b_events = b.run();
    s.pass(POLL / 2).await;
    let asked_at = Instant::now();
    let asked = crate::election::request_step_down(s.store.clone(), election.as_str(), "ops")
        .await
        .expect("a leads: the request is made");
    assert_eq!((asked.owner.as_str(), asked.generation), ("cand-a", a_term));
    let (a_lost_at, cause, a_stopped_at) = a_task.await.expect("a's task");
    assert!(
        matches!(cause, Some(Error::Resigned { .. })),
        "a step-down ends leadership with Resigned, got {cause:?}"
    );
    let notifies = s
        .store
        .watch(&WorkId::new(format!("{election}/step-down")).expect("valid"))
        .is_some();
    // The renewal interval is TTL/3.
    let bound = if notifies { POLL / 5 } else { s.ttl / 3 } + s.slack();
    assert!(
        a_lost_at - asked_at <= bound,
        "the leader stepped down {:?} after the request, more than {bound:?}",
        a_lost_at - asked_at
    );
    let acquired = b_events.next().await.expect("b campaigns");
    assert_eq!(acquired.kind, EventKind::Acquired);
    assert!(acquired.state.generation > a_term);
    // b's term started (its record's wall-clock start) after a's work had
    // stopped: a releases only once its function returned.
    let b_since = acquired
        .state
        .since
        .expect("a term's own state has its start");
    assert!(
        b_since >= a_stopped_at,
        "S1: b led while a's work was still stopping after the step-down"
    );

    // A request for a's term, made late, leaves b leading.
    let late = s.holder_on(s.store.clone(), &format!("{a_term}/late-ops"));
    let requests = WorkId::new(format!("{election}/step-down")).expect("valid work ID");
    let token = late
        .acquire_first(std::slice::from_ref(&requests), super::fast())
        .await
        .expect("the request lease is free");
    late.release(token).await.expect("release the request");
    let quiet = tokio::time::timeout(s.ttl / 3 + s.slack(), next_change(&mut b_events)).await;
    assert!(
        quiet.is_err(),
        "a request for an earlier term ended b's term: {quiet:?}"
    );

    // A request for b's term: Lost with Resigned, then no campaign for
    // its back-off (2 TTLs) while nobody else runs.
    crate::election::request_step_down(s.store.clone(), election.as_str(), "ops")
        .await
        .expect("b leads");
    let lost = next_change(&mut b_events).await;
    assert_eq!(lost.kind, EventKind::Lost);
    assert!(
        matches!(lost.error, Some(Error::Resigned { .. })),
        "{:?}",
        lost.error
    );
    let lost_at = Instant::now();
    let again = b_events.next().await.expect("b campaigns again");
    assert_eq!(again.kind, EventKind::Acquired);
    assert!(
        lost_at.elapsed() >= s.ttl * 2,
        "b campaigned again {:?} after stepping down, before its back-off",
        lost_at.elapsed()
    );
}

/// Priorities: a waiting candidate of equal priority never asks the leader
/// to step down (no swing); one of a higher priority does, and leads next;
/// the old leader, back from its back-off, does not ask it back.
pub async fn election_priority_prefers_and_equals_never_swing(s: &Suite) {
    let election = s.work_id("priority");
    let build = |owner: &str, priority: i32| {
        Elector::builder(s.store.clone(), election.as_str(), owner)
            .ttl(s.ttl)
            .poll_interval(POLL)
            .priority(priority)
            .resign_backoff(s.ttl)
            .build()
            .expect("valid elector")
    };
    let mut a_events = build("cand-a", 0).run();
    let first = a_events.next().await.expect("a campaigns");
    assert_eq!(first.kind, EventKind::Acquired);
    let a_term = first.state.generation;
    // Equal priority: b waits, and a keeps its term.
    let b = build("cand-b", 0);
    let b_task = tokio::spawn(async move { b.lead(|_| async {}).await });
    let quiet =
        tokio::time::timeout(POLL * 2 + s.ttl / 3 + s.slack(), next_change(&mut a_events)).await;
    assert!(
        quiet.is_err(),
        "S1/priority: an equal candidate made the leader swing: {quiet:?}"
    );
    b_task.abort();
    let _ = b_task.await;
    // Higher priority: a is asked and steps down; c leads.
    let c = build("cand-c", 5);
    let (c_tx, c_leads) = tokio::sync::oneshot::channel();
    let c_stop = Arc::new(Notify::new());
    let c_stopped = c_stop.clone();
    let c_task = tokio::spawn(async move {
        c.lead(|l| async move {
            c_tx.send(l.state().clone()).expect("test alive");
            let lost = l.lost();
            tokio::select! {
                _ = c_stopped.notified() => None,
                _ = lost.cancelled() => l.lost_cause(),
            }
        })
        .await
        .expect("c leads")
    });
    let lost = next_change(&mut a_events).await;
    assert_eq!(lost.kind, EventKind::Lost);
    assert!(
        matches!(lost.error, Some(Error::Resigned { .. })),
        "{:?}",
        lost.error
    );
    let c_state = c_leads.await.expect("c leads");
    assert!(c_state.generation > a_term);
    assert_eq!(c_state.priority, 5);
    // a campaigns again after its back-off (one TTL) and waits: it has the
    // lower priority, so c keeps its term.
    tokio::time::sleep(s.ttl + POLL * 2 + s.slack()).await;
    let now = build("observer", 0)
        .leader()
        .await
        .expect("leader")
        .expect("c leads");
    assert_eq!(
        (now.owner.as_str(), now.generation),
        ("cand-c", c_state.generation)
    );
    c_stop.notify_one();
    assert!(
        c_task.await.expect("c's task").is_none(),
        "c's term ended early"
    );
    drop(a_events);
}

/// A term's record is written while its work starts (ADR 0016). When that
/// write keeps failing while renewals pass, the term ends as a lost lease
/// does: the work has started, the lost signal fires with the write's
/// error by one renewal back-off past the lease's deadline (the writes are
/// retried until then), the lease is released once the work returned, and
/// a standby leads only after the signal fired.
pub async fn election_term_ends_when_its_record_cannot_be_written(s: &Suite) {
    let election = s.work_id("unrecorded");
    let faulty = Arc::new(FaultStore::new(s.store.clone()));
    faulty.set_fail_checkpoints(true);
    let leader = elector(s, faulty.clone(), &election, "cand-unrecorded");
    let standby = elector(s, s.store.clone(), &election, "cand-standby");
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel();
    let campaigned = Instant::now();
    let lead = tokio::spawn(async move {
        leader
            .lead(|l| async move {
                // The work runs although its record is never written.
                l.lost().cancelled().await;
                let _ = lost_tx.send((Instant::now(), l.lost_cause()));
            })
            .await
            .expect("lead")
    });
    let (lost_at, cause) = lost_rx.await.expect("the leader's signal fires");
    assert!(
        matches!(&cause, Some(Error::Store(e)) if e.to_string().contains("checkpoint refused")),
        "cause: {cause:?}"
    );
    let backoff = crate::lease::renewal::RenewalOptions::new().backoff_initial();
    let bound = s.ttl + backoff + s.slack();
    assert!(
        lost_at - campaigned <= bound,
        "the signal fired {:?} after the campaign began, more than the TTL and one back-off ({bound:?})",
        lost_at - campaigned
    );
    lead.await.expect("leader task");
    let standby_at = standby
        .lead(|_| async { Instant::now() })
        .await
        .expect("standby leads");
    assert!(
        standby_at >= lost_at,
        "S1: the standby led before the unrecorded leader's signal fired"
    );
}
