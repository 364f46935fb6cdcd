//! Batch checks: the batch operations of the store contract
//! ([`crate::LeaseStore::renew_many`], `acquire_many`, `release_many`)
//! and the session that renews many leases of one handle together.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::stress::History;
use super::{fast, Suite};
use crate::error::{Error, InvalidInput};
use crate::limits::MAX_BATCH;
use crate::store::fault::FaultStore;
use crate::store::LeaseEnd;
use crate::{RenewalOptions, Token, WorkId};

/// Keeps `tokens` renewed (one at a time, every third of the TTL) until
/// `until`; returns them renewed.
async fn keep_renewing(
    s: &Suite,
    leases: &crate::Leases,
    tokens: Vec<Token>,
    until: Instant,
) -> Vec<Token> {
    let mut tokens = tokens;
    while Instant::now() < until {
        tokio::time::sleep((s.ttl / 3).min(until - Instant::now())).await;
        let mut renewed = Vec::new();
        for t in &tokens {
            renewed.push(leases.renew(t).await.expect("renew a live lease"));
        }
        tokens = renewed;
    }
    tokens
}

/// Bad input in batches: a work ID named twice and a batch over
/// [`MAX_BATCH`] are refused with an error naming the rule, nothing is
/// written; an empty batch (or `max` 0) makes no store call at all.
pub async fn batch_bad_input(s: &Suite) {
    let faulty = Arc::new(FaultStore::new(s.store.clone()));
    let a = s.holder_on(faulty.clone(), "batch-bad-a");
    let id = s.work_id("batch-dup");
    let other = s.work_id("batch-other");
    let before = s.store.inspect(&[]).await.expect("inspect").len();
    let calls = faulty.calls();
    let e = a
        .acquire_many([id.as_str(), other.as_str(), id.as_str()], 3)
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Invalid(InvalidInput::DuplicateWorkId { .. })),
        "a work ID named twice: {e:?}"
    );
    assert!(
        e.to_string().contains(&id),
        "the error names the work ID: {e}"
    );
    let many: Vec<String> = (0..=MAX_BATCH)
        .map(|i| format!("{}/m{i}", s.prefix))
        .collect();
    let e = a.acquire_many(&many, 1).await.unwrap_err();
    assert!(
        e.to_string().contains(&MAX_BATCH.to_string()),
        "a batch over the limit names it: {e}"
    );
    let e = a
        .acquire_any([id.as_str(), id.as_str()], fast())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e:?}");
    assert_eq!(faulty.calls(), calls, "refused batches made no store call");
    assert_eq!(
        s.store.inspect(&[]).await.expect("inspect").len(),
        before,
        "refused batches wrote nothing"
    );

    let calls = faulty.calls();
    assert!(a
        .acquire_many(Vec::<String>::new(), 5)
        .await
        .expect("empty")
        .is_empty());
    assert!(a
        .acquire_many([id.as_str()], 0)
        .await
        .expect("max 0")
        .is_empty());
    assert!(a.renew_many(&[]).await.expect("empty").is_empty());
    assert!(a.release_many(Vec::new()).await.expect("empty").is_empty());
    assert_eq!(faulty.calls(), calls, "an empty batch makes no store call");

    let t = a.acquire(&id, fast()).await.expect("acquire");
    let e = a.renew_many(&[t.clone(), t.clone()]).await.unwrap_err();
    assert!(
        matches!(e, Error::Invalid(InvalidInput::DuplicateWorkId { .. })),
        "{e:?}"
    );
    a.release(t).await.expect("release");
}

/// `acquire_many` grants the free work IDs of a list, in order, at most
/// `max`, and leaves the held ones alone; `acquire_any` grants the first
/// free one, fails fast with `Held` when all are held, and a waiting one
/// gets the first that is released.
pub async fn batch_acquisition(s: &Suite) {
    let (a, b) = (s.holder("batch-acq-a"), s.holder("batch-acq-b"));
    let ids: Vec<String> = (0..6)
        .map(|i| s.work_id(&format!("batch-acq-{i}")))
        .collect();
    // Every lease held in this check is renewed in the background: on a
    // slow store the check outlasts a TTL.
    let renew = |leases: &crate::Leases, t: Token| {
        leases
            .start_renewal(t, RenewalOptions::new())
            .expect("renewal")
    };
    let held = renew(&b, b.acquire(&ids[1], fast()).await.expect("acquire"));
    let held2 = renew(&b, b.acquire(&ids[4], fast()).await.expect("acquire"));
    let got = a.acquire_many(&ids, 3).await.expect("acquire_many");
    let names: Vec<&str> = got.iter().map(|t| t.work_id().as_str()).collect();
    assert_eq!(
        names,
        [ids[0].as_str(), ids[2].as_str(), ids[3].as_str()],
        "the first three free work IDs, in order"
    );
    for t in &got {
        assert!(t.remaining().is_some_and(|r| r > Duration::ZERO));
    }
    let mut mine: Vec<_> = got.into_iter().map(|t| renew(&a, t)).collect();
    let info = s.info(&ids[5]).await;
    assert!(
        info.is_none_or(|i| i.expired),
        "S1: acquire_many took more than it was asked for"
    );
    let rest = a.acquire_many(&ids, 10).await.expect("acquire_many");
    assert_eq!(
        rest.iter()
            .map(|t| t.work_id().as_str())
            .collect::<Vec<_>>(),
        [ids[5].as_str()],
        "only the one left free"
    );
    mine.extend(rest.into_iter().map(|t| renew(&a, t)));
    // Every one held now: acquire_any fails fast, then waits for a release.
    match a.acquire_any(&ids, fast()).await {
        Err(Error::Held { .. }) => {}
        other => panic!("S1: acquire_any over held leases must be Held, got {other:?}"),
    }
    let waiter = {
        let (a, ids) = (a.clone(), ids.clone());
        tokio::spawn(async move {
            a.acquire_any(
                &ids,
                fast()
                    .wait_for_lease()
                    .poll_interval(Duration::from_millis(200)),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held2 = held2.stop().await.expect("held");
    let fence = held2.fencing_token();
    b.release(held2).await.expect("release");
    let t = waiter
        .await
        .expect("waiter")
        .expect("the waiter gets the released one");
    assert_eq!(t.work_id().as_str(), ids[4], "the released one");
    assert!(t.fencing_token() > fence, "S2");
    let mut all = vec![t];
    for r in mine {
        all.push(r.stop().await.expect("held"));
    }
    let released = a.release_many(all).await.expect("release_many");
    assert!(released.iter().all(|r| r.is_ok()), "{released:?}");
    b.release(held.stop().await.expect("held"))
        .await
        .expect("release");
    let again = b.acquire_many(&ids, 6).await.expect("acquire_many");
    assert_eq!(again.len(), 6, "every released lease is free at once (L1)");
    let prev = b.read_checkpoint(&again[0]).await.expect("read");
    assert!(
        prev.clean_handoff(),
        "S5: release_many marks the hand-off clean"
    );
    b.release_many(again).await.expect("release_many");
}

/// One batch with mixed outcomes: a live lease renews; one taken over is
/// `Fenced`; one expired and untaken is `Expired`; one revoked is
/// `Fenced`. Each fails alone, and the batch changes nothing for the
/// failed ones.
pub async fn batch_mixed_outcomes(s: &Suite) {
    let (a, b) = (s.holder("batch-mixed-a"), s.holder("batch-mixed-b"));
    let ids: Vec<String> = (0..4)
        .map(|i| s.work_id(&format!("batch-mixed-{i}")))
        .collect();
    let tokens = a.acquire_many(&ids, 4).await.expect("acquire_many");
    assert_eq!(tokens.len(), 4);
    // 1 and 2 are left to expire while 0 and 3 are kept alive.
    let kept = keep_renewing(
        s,
        &a,
        vec![tokens[0].clone(), tokens[3].clone()],
        Instant::now() + s.ttl + s.slack() + Duration::from_millis(20),
    )
    .await;
    let taker = b
        .acquire(&ids[1], fast())
        .await
        .expect("the expired lease is taken");
    let revoked = WorkId::new(ids[3].clone()).expect("valid");
    s.store.revoke(&revoked).await.expect("revoke");
    let batch = [
        kept[0].clone(),
        tokens[1].clone(),
        tokens[2].clone(),
        kept[1].clone(),
    ];
    let out = a.renew_many(&batch).await.expect("the batch as a whole");
    assert_eq!(out.len(), 4, "one outcome per lease");
    let renewed = out[0].as_ref().expect("the live lease renews");
    assert!(renewed.remaining().is_some_and(|r| r > Duration::ZERO));
    assert!(
        matches!(out[1], Err(Error::Fenced { .. })),
        "taken over: {:?}",
        out[1]
    );
    assert!(
        matches!(out[2], Err(Error::Expired { .. })),
        "expired: {:?}",
        out[2]
    );
    assert!(
        matches!(out[3], Err(Error::Fenced { .. })),
        "revoked: {:?}",
        out[3]
    );
    let info = s.info(&ids[1]).await.expect("inspect");
    assert_eq!(
        (info.holder_id.as_str(), info.fencing_token, info.expired),
        ("batch-mixed-b", taker.fencing_token(), false),
        "S3: the stale renewal left the new holder's lease alone"
    );
    let info = s.info(&ids[3]).await.expect("inspect");
    assert_eq!(
        info.ended,
        Some(LeaseEnd::Revoked),
        "a revoked lease stays revoked"
    );
    assert!(
        s.info(&ids[2]).await.expect("inspect").expired,
        "an expired lease stays expired"
    );
    assert!(
        matches!(b.acquire(&ids[0], fast()).await, Err(Error::Held { .. })),
        "S1: the renewed lease is held"
    );
    let released = a
        .release_many(vec![renewed.clone(), tokens[2].clone()])
        .await
        .expect("release_many");
    assert!(
        released[0].is_ok() && matches!(released[1], Err(Error::Expired { .. })),
        "{released:?}"
    );
    b.release(taker).await.expect("release");
}

/// A batch whose reply is lost (the store applied it) or comes too late:
/// the caller learns nothing, its leases are not extended past their own
/// deadlines, and a session whose every reply is lost gives each lease up
/// by its own deadline (its last retries may give up a moment before it),
/// never later.
pub async fn batch_reply_lost(s: &Suite) {
    let faulty = Arc::new(FaultStore::new(s.store.clone()));
    let a = s.holder_on(faulty.clone(), "batch-lost-a");
    let b = s.holder("batch-lost-b");
    let ids: Vec<String> = (0..3)
        .map(|i| s.work_id(&format!("batch-lost-{i}")))
        .collect();
    let tokens = a.acquire_many(&ids, 3).await.expect("acquire_many");
    faulty.set_lose_replies(true);
    let e = a.renew_many(&tokens).await.unwrap_err();
    assert!(e.is_transient(), "a lost reply is a store error: {e:?}");
    for t in &tokens {
        assert!(
            matches!(
                b.acquire(t.work_id().as_str(), fast()).await,
                Err(Error::Held { .. })
            ),
            "S1: the lease whose renewal reply was lost is still held"
        );
    }
    let renewals: Vec<_> = tokens
        .iter()
        .map(|t| {
            a.start_renewal(t.clone(), RenewalOptions::new())
                .expect("renewal")
        })
        .collect();
    for (r, t) in renewals.iter().zip(&tokens) {
        let deadline = t.deadline().expect("an acquired token has a deadline");
        let cause = r.lost().await;
        let at = Instant::now();
        assert!(
            matches!(cause, Error::WindowExhausted { .. }),
            "every reply lost: WindowExhausted, got {cause:?}"
        );
        assert!(
            at <= deadline + s.slack() + Duration::from_millis(50),
            "S1: a lease whose replies are lost must be given up at its deadline, not {:?} later",
            at - deadline
        );
    }
    faulty.set_lose_replies(false);
}

/// Many leases of one handle under background renewal: they go to the
/// store in batches (far fewer calls than leases), all stay held over
/// several TTLs, and revoking one loses only that one.
pub async fn session_many_leases_one_revoked(s: &Suite) {
    // Forty leases, or as many as the store renews comfortably within a
    // sixth of the TTL one after another (a server that answers one request
    // at a time, as moto does, renews no faster in batches).
    let per_renewal = s.round_trip.max(Duration::from_micros(1));
    let n = (s.ttl.as_secs_f64() / 6.0 / per_renewal.as_secs_f64()) as usize;
    let n = n.clamp(8, 40);
    let faulty = Arc::new(FaultStore::new(s.store.clone()));
    let a = s.holder_on(faulty.clone(), "session-a");
    let b = s.holder("session-b");
    let ids: Vec<String> = (0..n).map(|i| s.work_id(&format!("session-{i}"))).collect();
    let tokens = a.acquire_many(&ids, n).await.expect("acquire_many");
    assert_eq!(tokens.len(), n);
    let renewals: Vec<_> = tokens
        .into_iter()
        .map(|t| a.start_renewal(t, RenewalOptions::new()).expect("renewal"))
        .collect();
    let calls = faulty.calls();
    let started = Instant::now();
    s.store
        .revoke(&WorkId::new(ids[7].clone()).expect("valid"))
        .await
        .expect("revoke");
    let cause = tokio::time::timeout(s.ttl + s.slack(), renewals[7].lost())
        .await
        .expect("the revoked lease is lost within a TTL");
    assert!(matches!(cause, Error::Fenced { .. }), "{cause:?}");
    tokio::time::sleep(s.ttl * 3).await;
    for (i, r) in renewals.iter().enumerate() {
        if i != 7 {
            assert!(
                r.lost_cause().is_none(),
                "lease {i} was lost: {:?}",
                r.lost_cause()
            );
            assert!(
                matches!(b.acquire(&ids[i], fast()).await, Err(Error::Held { .. })),
                "S1: lease {i} is held"
            );
        }
    }
    let elapsed = started.elapsed();
    let per_round = n.div_ceil(s.store.max_batch().max(1)) as u64;
    let rounds = (elapsed.as_secs_f64() / (s.ttl.as_secs_f64() / 3.0)).ceil() as u64 + 2;
    let made = faulty.calls() - calls;
    assert!(
        made <= 2 * rounds * per_round,
        "{made} store calls renewed {n} leases over {elapsed:?}: not batched (bound {})",
        2 * rounds * per_round
    );
    let mut tokens = Vec::new();
    for r in renewals {
        if let Ok(t) = r.stop().await {
            tokens.push(t);
        }
    }
    assert_eq!(tokens.len(), n - 1);
    let out = a.release_many(tokens).await.expect("release_many");
    assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
}

/// S1 and S2 with batch acquisitions racing single ones: holders grab
/// "up to two of these" or one work ID at a time over a few work IDs,
/// renew in batches, release in batches or abandon; the history checker
/// fails on any overlap of believed leases or a token that does not
/// increase.
pub async fn batch_acquisition_races_single(s: &Suite) {
    let ids: Vec<String> = (0..4).map(|i| s.work_id(&format!("race-{i}"))).collect();
    let history = Arc::new(Mutex::new(History::default()));
    let mut tasks = Vec::new();
    for n in 0..8u64 {
        let (leases, ids, history, ttl) = (
            s.holder(&format!("race-{n}")),
            ids.clone(),
            history.clone(),
            s.ttl,
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(n);
            let mut grants = 0;
            for _ in 0..30 {
                let got = if n % 2 == 0 {
                    leases.acquire_many(&ids, 2).await.expect("acquire_many")
                } else {
                    let id = &ids[rng.gen_range(0..ids.len())];
                    match leases.acquire(id, fast()).await {
                        Ok(t) => vec![t],
                        // Expired: the grant came after its deadline (a
                        // slowed store) and was handed back.
                        Err(Error::Held { .. } | Error::Expired { .. }) => Vec::new(),
                        Err(e) => panic!("acquire: {e}"),
                    }
                };
                for t in &got {
                    history
                        .lock()
                        .expect("history")
                        .granted(leases.holder_id().as_str(), t);
                }
                grants += got.len();
                if got.is_empty() {
                    tokio::time::sleep(ttl.mul_f64(rng.gen_range(0.05..0.3))).await;
                    continue;
                }
                tokio::time::sleep(ttl.mul_f64(rng.gen_range(0.0..0.4))).await;
                let renewed = leases.renew_many(&got).await.expect("renew_many");
                let mut live = Vec::new();
                for (old, r) in got.iter().zip(renewed) {
                    match r {
                        Ok(t) => {
                            history
                                .lock()
                                .expect("history")
                                .renewed(leases.holder_id().as_str(), &t);
                            live.push(t);
                        }
                        Err(e) if e.is_lease_lost() => {
                            history.lock().expect("history").lost(old, &e)
                        }
                        Err(e) => panic!("renew_many: {e}"),
                    }
                }
                if rng.gen_bool(0.8) {
                    for t in &live {
                        history.lock().expect("history").lost(
                            t,
                            &Error::Expired {
                                work_id: t.work_id().to_string(),
                                holder_id: t.holder_id().to_string(),
                                fencing_token: 0,
                            },
                        );
                    }
                    for r in leases.release_many(live).await.expect("release_many") {
                        match r {
                            Ok(()) | Err(Error::Expired { .. } | Error::Fenced { .. }) => {}
                            Err(e) => panic!("release: {e}"),
                        }
                    }
                }
                // else: abandoned, as by a crash.
            }
            grants
        }));
    }
    let mut grants = 0;
    for t in tasks {
        grants += t.await.expect("race task panicked (see its message above)");
    }
    assert!(
        grants >= 20,
        "the race made too little progress: {grants} grants"
    );
}
