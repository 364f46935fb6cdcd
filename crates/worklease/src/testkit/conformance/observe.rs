//! Election observation checks: an observer that never campaigns follows
//! every change of leader, of published value and of transitions, in order,
//! within one poll interval, and writes nothing.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Suite;
use crate::election::{self, Elector, Observations, State};
use crate::store::fault::FaultStore;

const POLL: Duration = Duration::from_millis(500);

/// What the test tells a leading candidate.
enum Order {
    Publish(&'static str),
    StepDown,
}

/// A candidate that leads until told to step down, publishing what it is
/// told; it reports the state of each term it starts.
fn candidate(
    s: &Suite,
    election: &str,
    owner: &str,
    value: &'static str,
    started: mpsc::UnboundedSender<(State, Instant)>,
) -> (mpsc::UnboundedSender<Order>, JoinHandle<()>) {
    let e = Elector::builder(s.store.clone(), election, owner)
        .ttl(s.ttl)
        .poll_interval(POLL)
        .publish(value)
        .build()
        .expect("valid elector");
    let (orders, mut rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        e.lead(|l| async move {
            started
                .send((l.state().clone(), Instant::now()))
                .expect("test alive");
            while let Some(order) = rx.recv().await {
                match order {
                    Order::Publish(v) => l.publish(v).await.expect("the leader publishes"),
                    Order::StepDown => return,
                }
            }
        })
        .await
        .expect("lead");
    });
    (orders, task)
}

/// The next observation that differs from a pending one (a new leader
/// whose record is not written yet shows no value): waits for one with
/// `owner`, `value` and the term's start time, failing on any leader or
/// term but the expected ones.
async fn until_seen(
    s: &Suite,
    seen: &mut Observations,
    owner: &str,
    value: &str,
    since: Instant,
) -> State {
    let bound = POLL + POLL / 5 + s.slack();
    loop {
        let next = tokio::time::timeout(bound * 4, seen.next())
            .await
            .unwrap_or_else(|_| panic!("no observation of {owner} leading within {:?}", bound * 4))
            .expect("endless stream")
            .expect("the store answers");
        let Some(state) = next else { continue };
        assert_eq!(
            state.owner, owner,
            "an observer saw a leader that never led then"
        );
        if state.value.as_deref() == Some(value.as_bytes()) && state.since.is_some() {
            assert!(
                since.elapsed() <= bound,
                "the observer saw {owner} publish {value:?} after {:?}, more than a poll interval",
                since.elapsed()
            );
            return state;
        }
        assert!(
            state.value.is_none() || state.since.is_some(),
            "a value without its term's record: {state:?}"
        );
        // A new term is reported with its record, written one round trip
        // after the acquisition: the observer reads again rather than
        // report a leader without its value (unless the record took a poll
        // interval, which a store this fast does not take).
        if s.slack() * 4 < POLL {
            assert!(
                state.since.is_some(),
                "a new term reported before its record: {state:?}"
            );
        }
    }
}

/// An observer that never campaigns sees nobody, then each leader with its
/// published value, a value published during a term, and the transitions
/// (0 for the first leader, one more for each change of holder), in order,
/// each within one poll interval (plus the store's slack) of the change,
/// a new term with its record,
/// with increasing terms; `leader()` reads the same; and it writes
/// nothing to the store.
pub async fn election_observe_follows_every_change(s: &Suite) {
    let election = s.work_id("observe");
    let reads = Arc::new(FaultStore::new(s.store.clone()));
    let mut seen = election::observe(reads.clone(), election.as_str(), POLL).expect("valid");
    let first = seen
        .next()
        .await
        .expect("endless stream")
        .expect("the store answers");
    assert!(first.is_none(), "nobody leads a new election: {first:?}");

    let (started_tx, mut started) = mpsc::unbounded_channel();
    let (a, a_task) = candidate(s, &election, "cand-a", "a:1", started_tx.clone());
    let (a_state, at) = started.recv().await.expect("a leads");
    assert_eq!(a_state.transitions, 0, "the first leader has 0 transitions");
    let a1 = until_seen(s, &mut seen, "cand-a", "a:1", at).await;
    assert_eq!((a1.generation, a1.transitions), (a_state.generation, 0));

    a.send(Order::Publish("a:2")).expect("a leads");
    let a2 = until_seen(s, &mut seen, "cand-a", "a:2", Instant::now()).await;
    assert_eq!(a2.generation, a1.generation, "publishing keeps the term");

    let (b, b_task) = candidate(s, &election, "cand-b", "b:1", started_tx.clone());
    a.send(Order::StepDown).expect("a leads");
    a_task.await.expect("a's task");
    let (b_state, bt) = started.recv().await.expect("b leads after a");
    let b1 = until_seen(s, &mut seen, "cand-b", "b:1", bt).await;
    assert!(
        b1.generation > a1.generation,
        "terms increase: {a1:?} then {b1:?}"
    );
    assert_eq!(
        (b1.generation, b1.transitions, b_state.transitions),
        (b_state.generation, 1, 1)
    );

    let (a, a_task) = candidate(s, &election, "cand-a", "a:3", started_tx);
    b.send(Order::StepDown).expect("b leads");
    b_task.await.expect("b's task");
    let (_, at) = started.recv().await.expect("a leads again");
    let a3 = until_seen(s, &mut seen, "cand-a", "a:3", at).await;
    assert!(a3.generation > b1.generation);
    assert_eq!(a3.transitions, 2, "each change of holder counts once");

    let read = Elector::builder(reads.clone(), election.as_str(), "observer")
        .build()
        .expect("valid elector")
        .leader()
        .await
        .expect("leader")
        .expect("a leads");
    assert_eq!(
        (
            read.owner.as_str(),
            read.generation,
            read.transitions,
            read.value
        ),
        ("cand-a", a3.generation, 2, Some(Bytes::from_static(b"a:3")))
    );
    a.send(Order::StepDown).expect("a leads");
    a_task.await.expect("a's task");
    drop(seen);
    assert_eq!(reads.writes(), 0, "observing wrote to the store");
}
