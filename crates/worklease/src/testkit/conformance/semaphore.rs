//! Semaphore checks ([`crate::Semaphore`]): never more than N live
//! permits, fencing per permit, a dead holder's permit freed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::stress::History;
use super::{fast, Suite};
use crate::error::Error;
use crate::{Semaphore, Token};

fn semaphore(s: &Suite, holder: &str, name: &str, permits: usize) -> Semaphore {
    Semaphore::new(s.holder(holder), name, permits).expect("a valid semaphore")
}

/// S1 of a semaphore under stress: 9 holders (half failing fast, half
/// waiting) take, renew, release or abandon the 3 permits of one
/// semaphore, while a history checker fails on any moment with more than
/// 3 holders believing in a live permit, any overlap on one permit, and
/// any permit token that does not increase.
pub async fn semaphore_never_more_than_n(s: &Suite) {
    const N: usize = 3;
    let name = s.work_id("sem");
    let history = Arc::new(Mutex::new(History::default()));
    let most = Arc::new(Mutex::new(0usize));
    let mut tasks = Vec::new();
    for n in 0..(3 * N) as u64 {
        let (sem, history, most, ttl) = (
            semaphore(s, &format!("sem-{n}"), &name, N),
            history.clone(),
            most.clone(),
            s.ttl,
        );
        let prefix = format!("{name}/permit/");
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(n);
            let mut grants = 0;
            for _ in 0..12 {
                let options = if n % 2 == 0 {
                    fast()
                } else {
                    fast()
                        .wait_for_lease()
                        .poll_interval(ttl / 4)
                        .wait_timeout(ttl * 2)
                };
                let t = match sem.acquire(options).await {
                    Ok(t) => t,
                    // `Expired`: the grant's reply came after its deadline
                    // (a store slowed down by a loaded machine), so it was
                    // handed back: no permit, as when all are held.
                    Err(
                        Error::PermitsHeld { .. }
                        | Error::WaitTimedOut { .. }
                        | Error::Expired { .. },
                    ) => {
                        tokio::time::sleep(ttl.mul_f64(rng.gen_range(0.05..0.3))).await;
                        continue;
                    }
                    Err(e) => panic!("semaphore acquire: {e}"),
                };
                let holder = sem.leases().holder_id().as_str();
                {
                    let mut h = history.lock().expect("history");
                    h.granted(holder, &t);
                    let live = h.live_under(&prefix);
                    assert!(
                        live <= N,
                        "semaphore S1 violated on {prefix}: {live} holders believe in a live permit, N = {N}"
                    );
                    let mut m = most.lock().expect("most");
                    *m = (*m).max(live);
                }
                grants += 1;
                tokio::time::sleep(ttl.mul_f64(rng.gen_range(0.0..0.4))).await;
                let t = match sem.leases().renew(&t).await {
                    Ok(r) => {
                        history.lock().expect("history").renewed(holder, &r);
                        r
                    }
                    Err(e) if e.is_lease_lost() => {
                        history.lock().expect("history").lost(&t, &e);
                        continue;
                    }
                    Err(e) => panic!("renew a permit: {e}"),
                };
                if rng.gen_bool(0.8) {
                    history.lock().expect("history").released(&t);
                    match sem.leases().release(t).await {
                        Ok(()) | Err(Error::Expired { .. } | Error::Fenced { .. }) => {}
                        Err(e) => panic!("release a permit: {e}"),
                    }
                }
                // else: abandoned, as by a crash; it expires.
            }
            grants
        }));
    }
    let mut grants = 0;
    for t in tasks {
        grants += t
            .await
            .expect("semaphore task panicked (see its message above)");
    }
    assert!(
        grants >= 15,
        "the semaphore stress made too little progress: {grants} grants"
    );
    let most = *most.lock().expect("most");
    assert_eq!(
        most, N,
        "the stress never filled the semaphore (at most {most} of {N} permits held at once): it checked nothing"
    );
}

/// S2 per permit: every permit of a semaphore taken, released and taken
/// again gets a larger token each time; a stale permit token is fenced;
/// and a permit's work ID names the semaphore.
pub async fn semaphore_fencing_per_permit(s: &Suite) {
    const N: usize = 4;
    let name = s.work_id("sem-fence");
    let (a, b) = (
        semaphore(s, "sem-fence-a", &name, N),
        semaphore(s, "sem-fence-b", &name, N),
    );
    let mut first: Vec<Token> = Vec::new();
    for _ in 0..N {
        first.push(a.acquire(fast()).await.expect("a free permit"));
    }
    let mut permits: Vec<_> = first.iter().map(|t| a.permit_of(t)).collect();
    permits.sort();
    assert_eq!(
        permits,
        (0..N).map(Some).collect::<Vec<_>>(),
        "N acquisitions take the N distinct permits"
    );
    assert!(
        matches!(
            b.acquire(fast()).await,
            Err(Error::PermitsHeld { permits: N, .. })
        ),
        "a full semaphore refuses with PermitsHeld"
    );
    for t in &first {
        a.leases().release(t.clone()).await.expect("release");
    }
    for _ in 0..N {
        let t = b.acquire(fast()).await.expect("a released permit");
        let old = first
            .iter()
            .find(|o| o.work_id() == t.work_id())
            .expect("the same permits");
        assert!(
            t.fencing_token() > old.fencing_token(),
            "S2 violated on permit {}: token {} after {}",
            t.work_id(),
            t.fencing_token(),
            old.fencing_token()
        );
        match a.leases().renew(old).await {
            Err(Error::Fenced { .. }) => {}
            other => {
                panic!("S3: renewing a permit taken over must fail with Fenced, got {other:?}")
            }
        }
    }
}

/// L1 of a semaphore: a dead holder's permit reaches a waiter within the
/// TTL plus one poll interval.
pub async fn semaphore_dead_holder_frees_its_permit(s: &Suite) {
    let name = s.work_id("sem-dead");
    let (a, b) = (
        semaphore(s, "sem-dead-a", &name, 2),
        semaphore(s, "sem-dead-b", &name, 2),
    );
    let poll = Duration::from_millis(500);
    let started = Instant::now();
    let _abandoned = (
        a.acquire(fast()).await.expect("a permit"),
        a.acquire(fast()).await.expect("the other permit"),
    );
    let t = b
        .acquire(fast().wait_for_lease().poll_interval(poll))
        .await
        .expect("the waiter gets a dead holder's permit");
    let waited = started.elapsed();
    let bound = s.ttl + poll + poll / 5 + s.slack();
    assert!(
        waited <= bound,
        "L1: a dead holder's permit reached its waiter after {waited:?} (> {bound:?})"
    );
    assert!(b.permit_of(&t).is_some(), "the token is one of the permits");
}
