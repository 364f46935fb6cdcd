//! Fair waiting checks ([`crate::AcquireOptions::fair`]): arrival order
//! with newcomers, a fail-fast fair acquisition behind a queue, and a dead
//! queued waiter that must not stall the others.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{fast, Suite};
use crate::error::Error;
use crate::store::fault::FaultStore;
use crate::{AcquireOptions, Config, Leases, RenewalOptions, Semaphore};

/// How long [`joined`] waits for a waiter to join before failing: a hang
/// detector for a step of a few round trips, not a timing bound.
const JOIN_CAP: Duration = Duration::from_secs(60);

/// The fencing token of the last acquisition of `target`'s queue lease,
/// and whether it is still held: an arriving waiter takes it (a larger
/// token) and releases it once it has joined the line. One `inspect` of
/// one work ID, cheap on every store (listing the waiters lists the whole
/// store).
async fn queue_state(s: &Suite, target: &str) -> (u64, bool) {
    s.info(&format!("{target}{}", crate::fair::QUEUE_SUFFIX))
        .await
        .map_or((0, false), |i| (i.fencing_token, !i.expired))
}

/// Starts `start` and waits until its waiter has joined the line of
/// `target`: the queue lease was taken after the call and let go again.
async fn joined(s: &Suite, target: &str, start: impl FnOnce()) {
    let (before, _) = queue_state(s, target).await;
    start();
    let end = Instant::now() + JOIN_CAP;
    loop {
        let (token, held) = queue_state(s, target).await;
        if token > before && !held {
            return;
        }
        assert!(
            Instant::now() < end,
            "a fair waiter of {target} did not join within {JOIN_CAP:?}"
        );
        tokio::time::sleep(s.round_trip.max(Duration::from_millis(5))).await;
    }
}

fn fair_wait(s: &Suite) -> AcquireOptions {
    fast()
        .fair()
        .wait_for_lease()
        .poll_interval((s.ttl / 4).max(Duration::from_millis(50)))
}

/// Fair order: 20 waiters queue one after another behind a holder, then 5
/// newcomers arrive; released in turn, the lease goes to the 20 in the
/// order they arrived, then to the newcomers. A fail-fast fair acquisition
/// refuses while waiters are queued.
pub async fn fair_order_with_newcomers(s: &Suite) {
    const WAITERS: usize = 20;
    const NEWCOMERS: usize = 5;
    let target = s.work_id("fair");
    // No bound here depends on the TTL: a long one spares a slow store
    // (moto) the renewals of 25 waiters every third of a short TTL, under
    // which a waiter may lose its place in line (as it should when it
    // cannot renew), which is not what this check is about.
    let long = |name: &str| {
        Leases::new(s.store.clone(), Config::new(name, s.ttl * 4)).expect("valid test config")
    };
    let holder = long("fair-holder");
    let first = holder.acquire(&target, fast()).await.expect("acquire");
    // Kept while the queue fills up (which takes longer than a TTL on a
    // slow store).
    let first = holder
        .start_renewal(first, RenewalOptions::new())
        .expect("renewal");
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut start = |i: usize| {
        let (leases, target, served, options) = (
            long(&format!("fair-{i}")),
            target.clone(),
            served.clone(),
            fair_wait(s),
        );
        tasks.push(tokio::spawn(async move {
            let t = leases
                .acquire(&target, options)
                .await
                .unwrap_or_else(|e| panic!("fair waiter {i}: {e}"));
            served.lock().expect("served").push(i);
            leases.release(t).await.expect("release");
        }));
    };
    for i in 0..WAITERS {
        joined(s, &target, || start(i)).await;
    }
    match long("fair-impatient").acquire(&target, fast().fair()).await {
        Err(Error::WaitersAhead { waiters, .. }) => assert_eq!(waiters, WAITERS),
        other => panic!(
            "a fail-fast fair acquisition behind a queue must be WaitersAhead, got {other:?}"
        ),
    }
    assert_eq!(
        holder
            .fair_waiters(&target)
            .await
            .expect("fair_waiters")
            .len(),
        WAITERS,
        "fair_waiters lists the queue"
    );
    for i in WAITERS..WAITERS + NEWCOMERS {
        joined(s, &target, || start(i)).await;
    }
    let first = first.stop().await.expect("the holder kept its lease");
    holder.release(first).await.expect("release");
    for t in tasks {
        t.await
            .expect("a fair waiter panicked (see its message above)");
    }
    let served = served.lock().expect("served").clone();
    assert_eq!(
        &served[..WAITERS],
        &(0..WAITERS).collect::<Vec<_>>()[..],
        "fair waiters must be served in arrival order (newcomers {WAITERS}..): got {served:?}"
    );
    assert!(
        served[WAITERS..].iter().all(|i| *i >= WAITERS),
        "newcomers come after every earlier waiter: {served:?}"
    );
    // Served waiters let go of their place in the background: gone within
    // a few round trips, long before their TTL.
    let end = Instant::now() + s.slack() + Duration::from_millis(100);
    loop {
        let left = holder.fair_waiters(&target).await.expect("fair_waiters");
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < end,
            "served waiters must leave the line: {} still in it",
            left.len()
        );
        tokio::time::sleep(s.round_trip.max(Duration::from_millis(5))).await;
    }
}

/// A queued waiter that dies (its process cut off from the store) leaves
/// the queue within its TTL: the waiter behind it gets the semaphore's
/// permit within the TTL plus a poll interval of the release, not never.
pub async fn fair_dead_waiter_does_not_stall(s: &Suite) {
    let name = s.work_id("fair-dead");
    let holder = Semaphore::new(s.holder("fair-dead-holder"), &name, 1).expect("semaphore");
    let permit = holder.acquire(fast()).await.expect("the one permit");
    let permit = holder
        .leases()
        .start_renewal(permit, RenewalOptions::new())
        .expect("renewal");
    let cut = Arc::new(FaultStore::new(s.store.clone()));
    let doomed =
        Semaphore::new(s.holder_on(cut.clone(), "fair-dead-doomed"), &name, 1).expect("semaphore");
    let behind = Semaphore::new(s.holder("fair-dead-behind"), &name, 1).expect("semaphore");
    let line = crate::semaphore::line_target(&name);
    let mut doomed_task = None;
    joined(s, &line, || {
        let options = fair_wait(s);
        doomed_task = Some(tokio::spawn(async move { doomed.acquire(options).await }));
    })
    .await;
    let mut behind_task = None;
    joined(s, &line, || {
        let options = fair_wait(s);
        behind_task = Some(tokio::spawn(async move {
            (behind.acquire(options).await, Instant::now())
        }));
    })
    .await;
    let (doomed_task, behind_task) = (doomed_task.expect("started"), behind_task.expect("started"));
    cut.set_unreachable(true);
    let permit = permit.stop().await.expect("the holder kept its permit");
    let released = Instant::now();
    holder.leases().release(permit).await.expect("release");
    let (got, at) = behind_task.await.expect("the waiter behind");
    got.expect("the waiter behind the dead one gets the permit");
    let bound = s.ttl + fair_wait(s).get_poll_interval() * 2 + s.slack();
    assert!(
        at - released <= bound,
        "a dead queued waiter stalled the queue: served {:?} after the release (> {bound:?})",
        at - released
    );
    doomed_task.abort();
}

/// A semaphore's fair line is its own: while a fair waiter of semaphore
/// `NAME` is in line, fail-fast fair acquisitions of free leases named
/// `NAME` and `NAME/permit` succeed (a shared line would refuse them with
/// [`Error::WaitersAhead`]), and the semaphore's line target is refused as
/// a user's work ID. (A break test found `NAME/permit`'s line shared with
/// the semaphore's.)
pub async fn fair_semaphore_line_is_its_own(s: &Suite) {
    let name = s.work_id("fair-own");
    let holder = Semaphore::new(s.holder("fair-own-holder"), &name, 1).expect("semaphore");
    let permit = holder.acquire(fast()).await.expect("the one permit");
    let permit = holder
        .leases()
        .start_renewal(permit, RenewalOptions::new())
        .expect("renewal");
    let waiter = Semaphore::new(s.holder("fair-own-waiter"), &name, 1).expect("semaphore");
    let line = crate::semaphore::line_target(&name);
    let mut waiting = None;
    joined(s, &line, || {
        let options = fair_wait(s);
        waiting = Some(tokio::spawn(async move { waiter.acquire(options).await }));
    })
    .await;
    let neighbour = s.holder("fair-own-neighbour");
    for plain in [
        name.clone(),
        format!(
            "{name}{}",
            crate::semaphore::PERMIT_INFIX.trim_end_matches('/')
        ),
    ] {
        match neighbour.acquire(&plain, fast().fair()).await {
            Ok(t) => neighbour.release(t).await.expect("release"),
            Err(e) => panic!(
                "a fair acquisition of the free lease {plain:?} must not wait in semaphore {name:?}'s line: {e}"
            ),
        }
    }
    match neighbour.acquire(&line, fast().fair()).await {
        Err(Error::Invalid(_)) => {}
        other => panic!("the semaphore's line target {line:?} is worklease's own: got {other:?}"),
    }
    let impatient = Semaphore::new(s.holder("fair-own-impatient"), &name, 1).expect("semaphore");
    match impatient.acquire(fast().fair()).await {
        Err(Error::WaitersAhead { target, waiters }) => {
            assert_eq!(
                (target.as_str(), waiters),
                (name.as_str(), 1),
                "named by the semaphore"
            )
        }
        other => panic!("a fail-fast fair permit behind a queued waiter: got {other:?}"),
    }
    let waiting = waiting.expect("started");
    waiting.abort();
    let permit = permit.stop().await.expect("the holder kept its permit");
    holder.leases().release(permit).await.expect("release");
}
