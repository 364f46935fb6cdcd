//! Cancellation leaves nothing behind: an acquisition whose future is
//! dropped at any point, its store call in flight or not, leaves no lease
//! held by nobody once one round trip has passed after the store's answer
//! (issue 23).

use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};

use super::{fast, Suite};
use crate::error::Error;
use crate::store::fault::FaultStore;
use crate::{AcquireOptions, Config, Leases, Semaphore, WorkId};

/// How many acquisitions of each kind [`dropped_acquisitions_leave_no_lease`]
/// drops.
pub const DROPS_PER_KIND: usize = 8;

/// The kinds of acquisition the check drops, each at random points.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// A fail-fast acquisition of a free lease.
    FailFast,
    /// A waiting acquisition of a lease another holder releases meanwhile.
    Waiting,
    /// The first free one of two work IDs (`acquire_any`).
    Any,
    /// Up to two of two work IDs (`acquire_many`).
    Many,
    /// A permit of a semaphore of two.
    Permit,
    /// A fair acquisition (the queue lease, the line, the target).
    Fair,
    /// A fair waiting acquisition of a lease another holder releases
    /// meanwhile: it joins the line (its queue lease taken and released,
    /// its waiter lease held), waits, and is served.
    FairWaiting,
}

const KINDS: [Kind; 7] = [
    Kind::FailFast,
    Kind::Waiting,
    Kind::Any,
    Kind::Many,
    Kind::Permit,
    Kind::Fair,
    Kind::FairWaiting,
];

/// An acquisition whose future is dropped at a random point, also while
/// its store call is in flight and after the store granted the lease (the
/// replies are held back for two round trips, so that many drops land
/// there), leaves no lease behind: one round trip after the store's answer
/// (the check allows [`Suite::slack`]), every work ID it touched, and the
/// queue and line of a fair acquisition, are free for another holder. The
/// TTL is at least four times that wait, so a grant left to expire instead
/// is caught. Covers fail-fast and waiting acquisitions, `acquire_any`,
/// `acquire_many`, a semaphore's permit and a fair acquisition.
pub async fn dropped_acquisitions_leave_no_lease(s: &Suite) {
    let drops = Drops::new(s, "dropped");
    let d = drops.drop_each_kind(s).await;
    // One round trip after the last answer, with the store's slack.
    tokio::time::sleep(drops.settle).await;
    let (settle, ttl) = (drops.settle, drops.ttl);
    d.assert_lines_empty(
        s,
        &format!("{settle:?} after their last answer (TTL {ttl:?})"),
    )
    .await;
    let checker = s.holder("dropped-checker");
    for id in &d.touched {
        // `acquire_first`: the fair line's own work IDs are not a user's to
        // acquire through `acquire`.
        let work_id = WorkId::new(id.as_str()).expect("valid work ID");
        match checker
            .acquire_first(std::slice::from_ref(&work_id), fast())
            .await
        {
            Ok(t) => checker.release(t).await.expect("release"),
            Err(Error::Held { holder_id, .. }) => panic!(
                "a dropped acquisition left {id:?} held by {holder_id:?} {settle:?} after its last answer, until its TTL ({ttl:?}); {} of {} acquisitions were dropped",
                d.dropped,
                d.dropped + d.completed
            ),
            Err(e) => panic!("acquire {id:?}: {e}"),
        }
    }
}

/// After the acquisitions of [`dropped_acquisitions_leave_no_lease`] were
/// dropped, [`Leases::settle`] returns once their grants are released:
/// right after it, with no wait at all, the store shows every work ID they
/// touched released or never granted to the holder, and no waiter in the
/// line of a fair target. This is what a process awaits before it exits
/// (the CLI on a signal, issue 23). `settle` is bounded by the TTL here
/// and must not need it all.
pub async fn settled_drops_leave_no_lease_at_once(s: &Suite) {
    let drops = Drops::new(s, "settled");
    let d = drops.drop_each_kind(s).await;
    let started = tokio::time::Instant::now();
    drops
        .leases
        .settle(drops.ttl)
        .await
        .unwrap_or_else(|e| panic!("settle after dropped acquisitions: {e}"));
    let took = started.elapsed();
    let holder = drops.leases.holder_id().as_str();
    d.assert_lines_empty(s, &format!("as settle returned (after {took:?})"))
        .await;
    let ids: Vec<WorkId> = d
        .touched
        .iter()
        .map(|id| WorkId::new(id.as_str()).expect("valid work ID"))
        .collect();
    let left: Vec<_> = s
        .store
        .inspect(&ids)
        .await
        .expect("inspect")
        .into_iter()
        .filter(|i| i.holder_id == holder && !i.released)
        .map(|i| (i.work_id.to_string(), i.fencing_token))
        .collect();
    assert!(
        left.is_empty(),
        "settle returned (after {took:?}, TTL {:?}) while dropped acquisitions still held {left:?}; {} of {} acquisitions were dropped",
        drops.ttl,
        d.dropped,
        d.dropped + d.completed
    );
}

/// A holder whose store holds its replies back, to drop acquisitions of
/// every kind at random points, many after their grant.
struct Drops {
    leases: Leases,
    /// One store call: the round trip and the held-back reply.
    call: Duration,
    /// One round trip after the last answer, with the store's slack.
    settle: Duration,
    ttl: Duration,
}

/// What [`Drops::drop_each_kind`] did.
struct Dropped {
    /// Every work ID an acquisition touched (fair targets' queue leases
    /// and semaphores' permits included).
    touched: Vec<String>,
    fair_targets: Vec<String>,
    dropped: usize,
    completed: usize,
}

impl Dropped {
    /// No waiter is left in the line of a fair target; `when` says when
    /// the check looked.
    async fn assert_lines_empty(&self, s: &Suite, when: &str) {
        for target in &self.fair_targets {
            let waiters = crate::fair::waiters(s.store.as_ref(), target)
                .await
                .expect("waiters");
            assert!(
                waiters.is_empty(),
                "dropped fair acquisitions left waiters in the line of {target:?} {when}: {waiters:?}"
            );
        }
    }
}

impl Drops {
    fn new(s: &Suite, holder: &str) -> Self {
        let delay = (s.round_trip * 2).max(Duration::from_millis(4));
        let faulty = Arc::new(FaultStore::new(s.store.clone()));
        faulty.set_reply_delay(delay);
        let call = s.round_trip + delay;
        let settle = delay + s.slack() + Duration::from_millis(2);
        let ttl = s.ttl.max(settle * 4);
        let leases = Leases::new(faulty, Config::new(holder, ttl)).expect("valid test config");
        Self {
            leases,
            call,
            settle,
            ttl,
        }
    }

    /// Drops [`DROPS_PER_KIND`] acquisitions of each kind at random
    /// points; releases those that completed.
    async fn drop_each_kind(&self, s: &Suite) -> Dropped {
        let (leases, call) = (&self.leases, self.call);
        let other = s.holder(&format!("{}-other", leases.holder_id()));
        let mut rng = rand::rngs::StdRng::from_entropy();
        let mut touched: Vec<String> = Vec::new();
        let mut fair_targets: Vec<String> = Vec::new();
        let (mut dropped, mut completed) = (0, 0);
        for kind in KINDS {
            for _ in 0..DROPS_PER_KIND {
                let a = s.work_id("dropped");
                let b = s.work_id("dropped");
                // A fair acquisition makes about four store calls; the others
                // one (two for a waiting one).
                let calls = match kind {
                    Kind::Fair => 5,
                    Kind::FairWaiting => 8,
                    _ => 2,
                };
                let cut = rng.gen_range(Duration::ZERO..=call * calls);
                let finished = match kind {
                    Kind::FailFast => drop_at(cut, leases.acquire(&a, fast()))
                        .await
                        .map(|t| vec![t]),
                    Kind::Waiting => {
                        let let_go = rng.gen_range(Duration::ZERO..=call);
                        let wait = AcquireOptions::new().wait_for_lease();
                        released_meanwhile(s, &other, leases, &a, wait, let_go, let_go + cut).await
                    }
                    Kind::Any => drop_at(cut, leases.acquire_any([&a, &b], fast()))
                        .await
                        .map(|t| vec![t]),
                    Kind::Many => drop_at(cut, leases.acquire_many([&a, &b], 2)).await,
                    Kind::Permit => {
                        let semaphore =
                            Semaphore::new(leases.clone(), a.clone(), 2).expect("semaphore");
                        touched.extend(semaphore.permit_ids().iter().map(|p| p.to_string()));
                        drop_at(cut, semaphore.acquire(fast()))
                            .await
                            .map(|t| vec![t])
                    }
                    Kind::Fair => {
                        fair_targets.push(a.clone());
                        drop_at(cut, leases.acquire(&a, fast().fair()))
                            .await
                            .map(|t| vec![t])
                    }
                    Kind::FairWaiting => {
                        fair_targets.push(a.clone());
                        let let_go = rng.gen_range(call..=call * 4);
                        let wait = fast().fair().wait_for_lease();
                        released_meanwhile(s, &other, leases, &a, wait, let_go, cut * 2).await
                    }
                };
                match finished {
                    Some(tokens) => {
                        completed += 1;
                        for t in tokens {
                            leases
                                .release(t)
                                .await
                                .expect("release a completed acquisition");
                        }
                    }
                    None => dropped += 1,
                }
                touched.push(a);
                touched.push(b);
            }
        }
        assert!(
            dropped > 0,
            "no acquisition was dropped ({completed} completed)"
        );
        for target in &fair_targets {
            touched.push(format!("{target}{}", crate::fair::QUEUE_SUFFIX));
        }
        Dropped {
            touched,
            fair_targets,
            dropped,
            completed,
        }
    }
}

/// Runs `acquisition` until it ends or `cut` has passed, then drops it:
/// `Some` with its tokens when it ended with a grant, `None` when it was
/// dropped or failed (nothing to release then).
/// A waiting acquisition of `work_id` with `wait` (polling every round
/// trip) while `other` holds it, dropped at `cut`; `other` releases it
/// after `let_go`.
async fn released_meanwhile(
    s: &Suite,
    other: &Leases,
    leases: &Leases,
    work_id: &str,
    wait: AcquireOptions,
    let_go: Duration,
    cut: Duration,
) -> Option<Vec<crate::Token>> {
    let held = other.acquire(work_id, fast()).await.expect("acquire");
    let wait = wait.poll_interval(Duration::from_millis(1).max(s.round_trip));
    let release = async {
        tokio::time::sleep(let_go).await;
        other.release(held).await.expect("release");
    };
    let (_, r) = tokio::join!(release, drop_at(cut, leases.acquire(work_id, wait)));
    r.map(|t| vec![t])
}

async fn drop_at<T>(
    cut: Duration,
    acquisition: impl std::future::Future<Output = crate::Result<T>>,
) -> Option<T> {
    match tokio::time::timeout(cut, acquisition).await {
        Ok(Ok(t)) => Some(t),
        Ok(Err(Error::Held { .. } | Error::WaitersAhead { .. })) | Err(_) => None,
        Ok(Err(e)) => panic!("an acquisition failed: {e}"),
    }
}
