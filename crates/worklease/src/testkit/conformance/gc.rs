//! Garbage collection and the operator's read (issue 37): S2 survives the
//! deletion of a record ([`LeaseStore::delete_ended`] through
//! [`crate::gc::collect`]), a live lease is never deleted, racing
//! acquisitions keep S1 and S2, the prefix and the dry run are honoured,
//! and [`LeaseStore::inspect_checkpoint`] reads any lease without a token
//! and writes nothing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};

use super::stress::History;
use super::{fast, Suite};
use crate::error::Error;
use crate::gc::{collect, GcOptions, GcReport};
#[cfg(doc)]
use crate::store::LeaseStore;
use crate::store::{ExpiryClock, LeaseEnd};
use crate::WorkId;

/// A collection of every ended lease under `prefix`, at any age.
fn all_under(prefix: &str) -> GcOptions {
    GcOptions {
        older_than: Duration::ZERO,
        prefix: Some(prefix.to_string()),
        dry_run: false,
    }
}

async fn gc(s: &Suite, options: &GcOptions) -> GcReport {
    collect(&*s.store, options)
        .await
        .unwrap_or_else(|e| panic!("gc on the store failed: {e}"))
}

fn collected(report: &GcReport, id: &str) -> bool {
    report.collected.iter().any(|l| l.work_id.as_str() == id)
}

/// S2 after deletion: a work ID whose released, revoked or expired lease
/// gc deleted is unknown to the store (no checkpoint either), and its next
/// acquisition gets a token larger than every earlier one. A store that
/// judges expiry by observation keeps an expired (never released) lease;
/// the token still increases.
pub async fn gc_keeps_fencing_tokens_increasing(s: &Suite) {
    if !s.deletes {
        return gc_is_refused(s).await;
    }
    let a = s.holder("gc-fence-a");
    for end in [LeaseEnd::Released, LeaseEnd::Revoked, LeaseEnd::Expired] {
        let id = s.work_id(&format!("gc-fence-{}", end.as_str()));
        let wid = WorkId::new(id.clone()).expect("valid");
        let t = a.acquire(&id, fast()).await.expect("acquire");
        let t = a
            .checkpoint(&t, &b"before gc"[..])
            .await
            .expect("checkpoint");
        let before = t.fencing_token();
        match end {
            LeaseEnd::Released => a.release(t).await.expect("release"),
            LeaseEnd::Revoked => {
                s.store
                    .revoke(&wid)
                    .await
                    .expect("revoke")
                    .expect("the lease exists");
            }
            LeaseEnd::Expired => s.outlive().await,
        }
        let report = gc(s, &all_under(&id)).await;
        let must_delete = end != LeaseEnd::Expired || s.store.expiry_clock() == ExpiryClock::Store;
        if must_delete {
            assert!(
                collected(&report, &id),
                "gc must delete the {} lease of {id}: {report:?}",
                end.as_str()
            );
            assert!(
                s.info(&id).await.is_none(),
                "a {} lease that gc deleted must be gone from inspect",
                end.as_str()
            );
            assert!(
                s.store
                    .inspect_checkpoint(&wid)
                    .await
                    .expect("inspect_checkpoint")
                    .is_none(),
                "gc deletes the checkpoint with the lease"
            );
        }
        let t = a.acquire(&id, fast()).await.expect("acquire after gc");
        assert!(
            t.fencing_token() > before,
            "S2: after gc deleted the {} lease of {id} (token {before}), the next acquisition got \
             token {}",
            end.as_str(),
            t.fencing_token()
        );
        if must_delete {
            let c = a.read_checkpoint(&t).await.expect("read checkpoint");
            assert_eq!(
                c.data, None,
                "a deleted work ID starts without a checkpoint"
            );
            assert!(
                c.handoff.previous.is_none(),
                "a deleted work ID starts without a previous holder"
            );
        }
        a.release(t).await.expect("release");
    }
}

/// On a store that cannot delete safely, or whose user may not
/// ([`Suite::deletes`] false): gc of an ended lease fails with a store
/// error (or a set-up error naming the privilege), the lease stays, and the next
/// acquisition's token is larger.
async fn gc_is_refused(s: &Suite) {
    let a = s.holder("gc-refused");
    let id = s.work_id("gc-refused");
    let t = a.acquire(&id, fast()).await.expect("acquire");
    let before = t.fencing_token();
    a.release(t).await.expect("release");
    match collect(&*s.store, &all_under(&id)).await {
        Err(Error::Store(_) | Error::StoreSetup(_)) => {}
        other => panic!("a store that cannot delete must refuse gc with a store error: {other:?}"),
    }
    assert!(s.info(&id).await.is_some(), "a refused gc deletes nothing");
    let t = a.acquire(&id, fast()).await.expect("acquire");
    assert!(t.fencing_token() > before, "S2 after a refused gc");
    a.release(t).await.expect("release");
}

/// gc never deletes a live lease: held, at any age and prefix, it stays,
/// renewable, with its checkpoint; `delete_ended` of it answers `false`.
pub async fn gc_never_deletes_a_live_lease(s: &Suite) {
    let a = s.holder("gc-live");
    let id = s.work_id("gc-live");
    let wid = WorkId::new(id.clone()).expect("valid");
    let t = a.acquire(&id, fast()).await.expect("acquire");
    let t = a.checkpoint(&t, &b"live"[..]).await.expect("checkpoint");
    let report = gc(s, &all_under(&id)).await;
    assert!(
        !collected(&report, &id),
        "gc must never delete a live lease: {report:?}"
    );
    // On a store that refuses deletions, `delete_ended` may fail too: it
    // must then leave the lease as it was (checked below).
    let deleted = s.store.delete_ended(&wid, t.fencing_token()).await;
    assert!(
        !matches!(deleted, Ok(true)) && (deleted.is_ok() || !s.deletes),
        "delete_ended of a live lease must answer false and delete nothing: {deleted:?}"
    );
    let t = a
        .renew(&t)
        .await
        .expect("a live lease stays renewable after gc");
    let c = a.read_checkpoint(&t).await.expect("read checkpoint");
    assert_eq!(
        c.data.as_deref(),
        Some(&b"live"[..]),
        "and keeps its checkpoint"
    );
    // An older token than the current one deletes nothing either.
    a.release(t.clone()).await.expect("release");
    let t2 = a.acquire(&id, fast()).await.expect("acquire again");
    a.release(t2.clone()).await.expect("release");
    let deleted = s.store.delete_ended(&wid, t.fencing_token()).await;
    assert!(
        !matches!(deleted, Ok(true)) && (deleted.is_ok() || !s.deletes),
        "delete_ended with a token that is no longer the last acquisition's deletes nothing: \
         {deleted:?}"
    );
    assert!(
        s.info(&id).await.is_some(),
        "the newer acquisition's record stays"
    );
}

/// gc racing acquisitions of the same work IDs: holders acquire, renew and
/// release a few work IDs while a collector deletes every ended one over
/// and over; no two holders ever believe in a lease at once (S1), tokens
/// of each work ID strictly increase (S2), and a held lease is never
/// deleted under its holder (its renewal succeeds).
pub async fn gc_races_acquisitions(s: &Suite) {
    if !s.deletes {
        return gc_is_refused(s).await;
    }
    const TASKS: usize = 4;
    const ROUNDS: usize = 6;
    let base = s.work_id("gc-race");
    let ids: Vec<String> = (0..3).map(|i| format!("{base}/{i}")).collect();
    let history = Arc::new(Mutex::new(History::default()));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let collector = {
        let (suite, done, base) = (s.clone(), done.clone(), base.clone());
        tokio::spawn(async move {
            let mut deleted = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                deleted += gc(&suite, &all_under(&base)).await.collected.len();
                // Pacing, not synchronisation: lets a paused clock advance.
                tokio::time::sleep(suite.ttl / 50).await;
            }
            deleted
        })
    };
    let mut handles = Vec::new();
    for n in 0..TASKS {
        let (leases, ids, history, ttl) = (
            s.holder(&format!("gc-race-{n}")),
            ids.clone(),
            history.clone(),
            s.ttl,
        );
        handles.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(n as u64);
            for _ in 0..ROUNDS {
                let id = &ids[rng.gen_range(0..ids.len())];
                let t = match leases.acquire(id, fast()).await {
                    Ok(t) => t,
                    Err(Error::Held { .. } | Error::Expired { .. }) => {
                        tokio::time::sleep(ttl.mul_f64(rng.gen_range(0.0..0.1))).await;
                        continue;
                    }
                    Err(e) => panic!("acquire: {e}"),
                };
                history
                    .lock()
                    .expect("history")
                    .granted(leases.holder_id().as_str(), &t);
                tokio::time::sleep(ttl.mul_f64(rng.gen_range(0.0..0.1))).await;
                let t = leases
                    .renew(&t)
                    .await
                    .unwrap_or_else(|e| panic!("a held lease was lost while gc ran: {e}"));
                history
                    .lock()
                    .expect("history")
                    .renewed(leases.holder_id().as_str(), &t);
                history.lock().expect("history").released(&t);
                leases.release(t).await.expect("release");
            }
        }));
    }
    for h in handles {
        h.await.expect("holder task");
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    collector.await.expect("collector task");
    // Whatever gc left, one more acquisition of each continues upwards.
    let a = s.holder("gc-race-last");
    for id in &ids {
        let _ = gc(s, &all_under(id)).await;
        let t = a.acquire(id, fast()).await.expect("acquire after the race");
        {
            let mut h = history.lock().expect("history");
            h.granted(a.holder_id().as_str(), &t);
            h.released(&t);
        }
        a.release(t).await.expect("release");
    }
}

/// gc deletes only under its prefix, and a dry run deletes nothing while
/// listing what a real run deletes.
pub async fn gc_prefix_and_dry_run(s: &Suite) {
    let a = s.holder("gc-prefix");
    let base = s.work_id("gc-prefix");
    let (inside, outside) = (format!("{base}/in/1"), format!("{base}/out/1"));
    for id in [&inside, &outside] {
        let t = a.acquire(id, fast()).await.expect("acquire");
        a.release(t).await.expect("release");
    }
    let dry = gc(
        s,
        &GcOptions {
            dry_run: true,
            ..all_under(&base)
        },
    )
    .await;
    assert!(
        collected(&dry, &inside) && collected(&dry, &outside),
        "a dry run lists every ended lease under its prefix: {dry:?}"
    );
    for id in [&inside, &outside] {
        assert!(
            s.info(id).await.is_some(),
            "a dry run deletes nothing ({id})"
        );
    }
    if !s.deletes {
        return gc_is_refused(s).await;
    }
    let real = gc(s, &all_under(&format!("{base}/in/"))).await;
    assert!(
        collected(&real, &inside),
        "gc deletes under its prefix: {real:?}"
    );
    assert!(
        !collected(&real, &outside),
        "gc deletes nothing outside its prefix: {real:?}"
    );
    assert!(s.info(&inside).await.is_none(), "{inside} was deleted");
    assert!(
        s.info(&outside).await.is_some(),
        "{outside} outside the prefix stays"
    );
    let young = gc(
        s,
        &GcOptions {
            older_than: Duration::from_secs(365 * 86_400),
            ..all_under(&base)
        },
    )
    .await;
    assert!(
        young.collected.is_empty(),
        "a lease that ended moments ago is younger than a year: {young:?}"
    );
}

/// `inspect_checkpoint` reads any work ID's lease and checkpoint without a
/// token: `None` when unknown; live, released and revoked leases with
/// their holder, token and bytes; and it writes nothing (the holder's
/// lease is neither extended nor changed).
pub async fn inspect_checkpoint_reads_any_lease(s: &Suite) {
    let a = s.holder("inspect-ckpt");
    let id = s.work_id("inspect-ckpt");
    let wid = WorkId::new(id.clone()).expect("valid");
    let read = || async {
        s.store
            .inspect_checkpoint(&wid)
            .await
            .expect("inspect_checkpoint")
    };
    assert!(read().await.is_none(), "an unknown work ID reads as None");
    let t = a.acquire(&id, fast()).await.expect("acquire");
    let live = read().await.expect("a live lease reads");
    assert_eq!(live.data, None, "no checkpoint written yet");
    assert_eq!(live.lease.fencing_token, t.fencing_token());
    assert!(!live.lease.expired, "the lease is live");
    let t = a.checkpoint(&t, &b"step 7"[..]).await.expect("checkpoint");
    let before = s.info(&id).await.expect("inspect");
    let live = read().await.expect("a live lease reads");
    assert_eq!(live.data.as_deref(), Some(&b"step 7"[..]));
    assert_eq!(live.lease.holder_id, "inspect-ckpt");
    assert_eq!(live.lease.checkpoint_bytes, b"step 7".len());
    let after = s.info(&id).await.expect("inspect");
    assert_eq!(
        (
            &after.holder_id,
            after.fencing_token,
            after.expired,
            after.checkpoint_bytes
        ),
        (
            &before.holder_id,
            before.fencing_token,
            before.expired,
            before.checkpoint_bytes
        ),
        "inspect_checkpoint must not change the lease"
    );
    a.release(t.clone()).await.expect("release");
    let released = read().await.expect("a released lease reads");
    assert_eq!(released.data.as_deref(), Some(&b"step 7"[..]));
    assert!(released.lease.released && released.lease.expired);
    assert_eq!(released.lease.fencing_token, t.fencing_token());
    let t = a.acquire(&id, fast()).await.expect("acquire again");
    s.store
        .revoke(&wid)
        .await
        .expect("revoke")
        .expect("the lease exists");
    let revoked = read().await.expect("a revoked lease reads");
    assert_eq!(revoked.lease.ended, Some(LeaseEnd::Revoked));
    assert_eq!(revoked.lease.fencing_token, t.fencing_token());
    assert_eq!(
        revoked.data,
        Some(Bytes::from_static(b"step 7")),
        "S4: the checkpoint survives acquisition and revocation"
    );
}
