//! Lease checks: S1–S5, L1, bad input, renewal under faults, stress.
//!
//! Over 600 lines: one check per property of the lease contract (S1 to S5,
//! L1, bad input, renewal under faults), each a page, in the order the
//! contract lists them.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::{assert_expired, assert_fenced, fast, Suite};
use crate::error::{Error, InvalidInput};
use crate::limits::{MAX_CHECKPOINT_BYTES, MAX_WORK_ID_BYTES};
use crate::store::fault::FaultStore;
use crate::store::LeaseEnd;
use crate::{Config, Leases, RenewalOptions, Token, WorkId};

/// Bad input: zero TTL, empty holder, empty / oversized / control-character
/// / reserved work IDs and oversized checkpoints get an error naming the
/// limit, and nothing is written.
pub async fn bad_input(s: &Suite) {
    let e = Leases::new(s.store.clone(), Config::new("h", Duration::ZERO)).unwrap_err();
    assert!(
        matches!(e, Error::Invalid(InvalidInput::ZeroTtl { .. })),
        "{e}"
    );
    assert!(
        e.to_string().contains("1ms"),
        "zero TTL error must name the limit: {e}"
    );
    let e = Leases::new(s.store.clone(), Config::new("", s.ttl)).unwrap_err();
    assert!(
        matches!(e, Error::Invalid(InvalidInput::EmptyHolderId { .. })),
        "{e}"
    );

    let a = s.holder("bad-input-a");
    let before = s.store.inspect(&[]).await.expect("inspect").len();
    let e = a.acquire("", fast()).await.unwrap_err();
    assert!(
        matches!(e, Error::Invalid(InvalidInput::EmptyWorkId { .. })),
        "{e}"
    );
    let long = format!("{}/{}", s.prefix, "x".repeat(MAX_WORK_ID_BYTES));
    let e = a.acquire(&long, fast()).await.unwrap_err();
    assert!(
        e.to_string().contains(&MAX_WORK_ID_BYTES.to_string()),
        "must name the limit: {e}"
    );
    let e = a
        .acquire(&format!("{}/a\0b", s.prefix), fast())
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Invalid(InvalidInput::ControlCharacter { .. })),
        "{e}"
    );
    // The work IDs of worklease's own leases beside a user's (a fair
    // line's queue and waiters, an election's step-down requests) are not
    // a user's to take, one by one or in a batch.
    for reserved in ["fair-queue", "fair-waiter/0", "step-down"] {
        let id = format!("{}/reserved/{reserved}", s.prefix);
        let e = a.acquire(&id, fast()).await.unwrap_err();
        assert!(
            matches!(e, Error::Invalid(InvalidInput::ReservedWorkId { .. })),
            "{id}: {e}"
        );
        let e = a.acquire_many([id.as_str()], 1).await.unwrap_err();
        assert!(
            matches!(e, Error::Invalid(InvalidInput::ReservedWorkId { .. })),
            "{id} in a batch: {e}"
        );
    }
    assert_eq!(
        s.store.inspect(&[]).await.expect("inspect").len(),
        before,
        "rejected acquisitions must write nothing"
    );

    let id = s.work_id("bad-input");
    let t = a.acquire(&id, fast()).await.expect("acquire");
    let t = a.checkpoint(&t, &b"kept"[..]).await.expect("checkpoint");
    // The store's own limit where it is lower (a DynamoDB item).
    let max = s.store.max_checkpoint_bytes().min(MAX_CHECKPOINT_BYTES);
    let huge = Bytes::from(vec![7u8; max + 1]);
    let e = a.checkpoint(&t, huge).await.unwrap_err();
    assert!(
        matches!(e, Error::Invalid(InvalidInput::CheckpointTooLarge { .. })),
        "{e}"
    );
    assert!(
        e.to_string().contains(&max.to_string()),
        "must name the limit: {e}"
    );
    let c = a.read_checkpoint(&t).await.expect("read");
    assert_eq!(
        c.data.as_deref(),
        Some(&b"kept"[..]),
        "a rejected checkpoint must write nothing"
    );
    let ok = Bytes::from(vec![1u8; max]);
    let t = a
        .checkpoint(&t, ok.clone())
        .await
        .expect("a checkpoint at the limit is accepted");
    assert_eq!(a.read_checkpoint(&t).await.expect("read").data, Some(ok));
    a.release(t).await.expect("release");
}

/// S1: while one holder's lease is live, nobody else (nor the same holder
/// ID again) acquires it; after release, the next holder does.
pub async fn mutual_exclusion(s: &Suite) {
    let (a, b) = (s.holder("mutex-a"), s.holder("mutex-b"));
    let id = s.work_id("mutex");
    let t = a.acquire(&id, fast()).await.expect("first acquire");
    match b.acquire(&id, fast()).await {
        Err(Error::Held { holder_id, .. }) => {
            assert_eq!(holder_id, "mutex-a", "Held must name the holder")
        }
        other => panic!("S1: a live lease must be Held for another holder, got {other:?}"),
    }
    assert!(
        matches!(a.acquire(&id, fast()).await, Err(Error::Held { .. })),
        "S1: a live lease is Held for its own holder ID too"
    );
    let info = s.info(&id).await.expect("inspect shows the lease");
    assert!(
        !info.expired && !info.released && info.holder_id == "mutex-a",
        "{info:?}"
    );
    a.release(t).await.expect("release");
    let t = b
        .acquire(&id, fast())
        .await
        .expect("S1/L1: acquire after release");
    b.release(t).await.expect("release");
}

/// S2: fencing tokens of one work ID strictly increase across release,
/// expiry, revocation and re-acquisition by the same holder ID.
pub async fn fencing_tokens_increase(s: &Suite) {
    let (a, b) = (s.holder("fence-a"), s.holder("fence-b"));
    let id = s.work_id("fence");
    let wid = WorkId::new(id.clone()).expect("valid");
    let mut seen = Vec::new();
    let t = a.acquire(&id, fast()).await.expect("acquire");
    seen.push(t.fencing_token());
    a.release(t).await.expect("release");
    let t = a
        .acquire(&id, fast())
        .await
        .expect("re-acquire by the same holder");
    seen.push(t.fencing_token());
    s.outlive().await; // expires
    let t = b.acquire(&id, fast()).await.expect("acquire after expiry");
    seen.push(t.fencing_token());
    s.store
        .revoke(&wid)
        .await
        .expect("revoke")
        .expect("the lease exists");
    let t = a.acquire(&id, fast()).await.expect("acquire after revoke");
    seen.push(t.fencing_token());
    a.release(t).await.expect("release");
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "S2: fencing tokens must strictly increase, saw {seen:?}"
    );
}

/// S3: a holder paused past its TTL loses to a contender with a larger
/// token; its renew, checkpoint, read and release then fail with `Fenced`
/// and change nothing. A token that expired untaken gets `Expired`.
pub async fn stale_writers_lose(s: &Suite) {
    let (a, b) = (s.holder("stale-a"), s.holder("stale-b"));
    let id = s.work_id("stale");
    let ta = a.acquire(&id, fast()).await.expect("acquire");
    let ta = a.checkpoint(&ta, &b"a1"[..]).await.expect("checkpoint");
    s.outlive().await; // A is paused past its TTL
    assert_eq!(
        ta.remaining(),
        Some(Duration::ZERO),
        "A's own deadline has passed"
    );
    let tb = b
        .acquire(&id, fast())
        .await
        .expect("contender takes the expired lease");
    assert!(
        tb.fencing_token() > ta.fencing_token(),
        "S2: the contender's token is larger"
    );
    let tb = b.checkpoint(&tb, &b"b1"[..]).await.expect("checkpoint");
    assert_fenced(a.renew(&ta).await, "renew", &ta);
    assert_fenced(a.checkpoint(&ta, &b"a2"[..]).await, "checkpoint", &ta);
    assert_fenced(a.read_checkpoint(&ta).await, "read_checkpoint", &ta);
    assert_fenced(a.release(ta.clone()).await, "release", &ta);
    let c = b
        .read_checkpoint(&tb)
        .await
        .expect("the new holder is untouched");
    assert_eq!(
        c.data.as_deref(),
        Some(&b"b1"[..]),
        "S3: a stale checkpoint changed nothing"
    );
    let tb = b
        .renew(&tb)
        .await
        .expect("S3: a stale release left the new holder's lease live");
    let info = s.info(&id).await.expect("inspect");
    assert_eq!(
        (info.holder_id.as_str(), info.fencing_token, info.expired),
        ("stale-b", tb.fencing_token(), false)
    );
    b.release(tb).await.expect("release");

    // Expired, not taken: Expired, and still nothing changes.
    let id2 = s.work_id("expired");
    let t = a.acquire(&id2, fast()).await.expect("acquire");
    s.outlive().await;
    assert_expired(a.renew(&t).await, "renew", &t);
    assert_expired(a.checkpoint(&t, &b"late"[..]).await, "checkpoint", &t);
    assert_expired(a.release(t.clone()).await, "release", &t);
    let t2 = b.acquire(&id2, fast()).await.expect("acquire after expiry");
    let c = b.read_checkpoint(&t2).await.expect("read");
    assert_eq!(
        c.data, None,
        "S3: an expired token's checkpoint was not written"
    );
    assert!(
        !c.clean_handoff(),
        "S5: an expired lease is no clean hand-off"
    );
    // A token that was never issued is fenced.
    let forged: Token = format!(
        "wl1;work={};holder=stale-a;fencing_token={};expires_at_ms=0;ttl_ms=1000",
        id2.replace('/', "%2F"),
        t2.fencing_token() + 1000
    )
    .parse()
    .expect("valid text form");
    assert_fenced(
        a.renew(&forged).await,
        "renew of a never-issued token",
        &forged,
    );
    b.release(t2).await.expect("release");
}

/// S4: an acknowledged checkpoint is what the next holder reads, across
/// expiry (a crash), release, revocation and acquisition.
pub async fn checkpoints_survive(s: &Suite) {
    let (a, b, c) = (s.holder("ckpt-a"), s.holder("ckpt-b"), s.holder("ckpt-c"));
    let id = s.work_id("ckpt");
    let t = a.acquire(&id, fast()).await.expect("acquire");
    let first = a.read_checkpoint(&t).await.expect("read");
    assert_eq!(
        first.data, None,
        "the first acquisition reads no checkpoint, and no error"
    );
    assert!(!first.clean_handoff() && first.handoff.previous.is_none());
    let binary = Bytes::from_static(&[0, 255, 1, 254, b'\n', 0]);
    a.checkpoint(&t, binary.clone()).await.expect("checkpoint");
    s.outlive().await; // A crashes
    let t = b.acquire(&id, fast()).await.expect("acquire");
    let got = b.read_checkpoint(&t).await.expect("read");
    assert_eq!(
        got.data,
        Some(binary),
        "S4: the acknowledged checkpoint survives an expiry"
    );
    let prev = got.handoff.previous.clone().expect("a previous holder");
    assert_eq!(
        (prev.holder_id.as_str(), prev.ended),
        ("ckpt-a", LeaseEnd::Expired)
    );
    let t = b.checkpoint(&t, &b"b-done"[..]).await.expect("checkpoint");
    b.release(t).await.expect("release");
    let t = c.acquire(&id, fast()).await.expect("acquire");
    let got = c.read_checkpoint(&t).await.expect("read");
    assert_eq!(
        got.data.as_deref(),
        Some(&b"b-done"[..]),
        "S4: survives a release"
    );
    let wid = WorkId::new(id.clone()).expect("valid");
    s.store.revoke(&wid).await.expect("revoke");
    let t = a.acquire(&id, fast()).await.expect("acquire");
    let got = a.read_checkpoint(&t).await.expect("read");
    assert_eq!(
        got.data.as_deref(),
        Some(&b"b-done"[..]),
        "S4: survives a revocation"
    );
    let info = s.info(&id).await.expect("inspect");
    assert_eq!((info.checkpoint_bytes, info.ended), (6, None));
    a.release(t).await.expect("release");
}

/// S5: `clean_handoff` is true exactly when the previous holder released,
/// and the successor learns who held the lease and how it ended.
pub async fn handoff_flag(s: &Suite) {
    let (a, b) = (s.holder("handoff-a"), s.holder("handoff-b"));
    let id = s.work_id("handoff");
    let ta = a.acquire(&id, fast()).await.expect("acquire");
    let fence_a = ta.fencing_token();
    a.release(ta).await.expect("release");
    let tb = b.acquire(&id, fast()).await.expect("acquire");
    let c = b.read_checkpoint(&tb).await.expect("read");
    assert!(
        c.clean_handoff(),
        "S5: after a release the hand-off is clean"
    );
    let prev = c.handoff.previous.expect("previous holder");
    assert_eq!(
        (prev.holder_id.as_str(), prev.fencing_token, prev.ended),
        ("handoff-a", fence_a, LeaseEnd::Released)
    );
    let wid = WorkId::new(id.clone()).expect("valid");
    s.store.revoke(&wid).await.expect("revoke");
    let info = s.info(&id).await.expect("inspect");
    assert_eq!(
        (info.expired, info.ended),
        (true, Some(LeaseEnd::Revoked)),
        "status shows a revocation"
    );
    let ta = a.acquire(&id, fast()).await.expect("acquire");
    let c = a.read_checkpoint(&ta).await.expect("read");
    assert!(
        !c.clean_handoff(),
        "S5: a revoked lease is no clean hand-off"
    );
    assert_eq!(
        c.handoff.previous.expect("previous").ended,
        LeaseEnd::Revoked
    );
    assert_fenced(b.renew(&tb).await, "renew after revocation", &tb);
    assert!(s
        .info(&id)
        .await
        .expect("inspect")
        .handoff
        .previous
        .is_some());
    a.release(ta).await.expect("release");
}

/// L1: a released lease can be acquired at once, and a waiter gets it
/// within one poll interval (at once where the store notifies); an expired
/// one within its TTL plus one poll interval. Both bounds allow the
/// store's [`Suite::slack`].
pub async fn liveness(s: &Suite) {
    let (a, b) = (s.holder("live-a"), s.holder("live-b"));
    let poll = Duration::from_millis(500);
    let id = s.work_id("live");
    let t = a.acquire(&id, fast()).await.expect("acquire");
    let waiter = {
        let (b, id) = (b.clone(), id.clone());
        tokio::spawn(async move {
            let t = b
                .acquire(&id, fast().wait_for_lease().poll_interval(poll))
                .await;
            (t, Instant::now())
        })
    };
    tokio::time::sleep(poll * 2).await; // the waiter is polling by now
    let released = Instant::now();
    a.release(t).await.expect("release");
    let (t, got) = waiter.await.expect("waiter task");
    let t = t.expect("the waiter gets the released lease");
    let bound = poll + poll / 5 + s.slack();
    assert!(
        got - released <= bound,
        "L1: a released lease reached its waiter after {:?} (> {bound:?})",
        got - released
    );
    let t2 = b
        .acquire(&s.work_id("live-2"), fast())
        .await
        .expect("acquire");
    b.release(t2.clone()).await.expect("release");
    a.acquire(t2.work_id().as_str(), fast())
        .await
        .expect("L1: a released lease can be acquired at once");

    // Expired: the holder vanishes; a waiter gets the lease within TTL + poll.
    let t_started = Instant::now();
    b.release(t).await.expect("release");
    let id = s.work_id("live-expiry");
    let _abandoned = a.acquire(&id, fast()).await.expect("acquire");
    b.acquire(&id, fast().wait_for_lease().poll_interval(poll))
        .await
        .expect("the waiter gets the expired lease");
    let waited = t_started.elapsed();
    let bound = s.ttl + poll + poll / 5 + s.slack();
    assert!(
        waited <= bound,
        "L1: an expired lease reached its waiter after {waited:?} (> {bound:?})"
    );
}

/// A wait that is cancelled or times out returns a cancellation error, not
/// `Held`.
pub async fn waiting_can_be_cancelled(s: &Suite) {
    let (a, b) = (s.holder("cancel-a"), s.holder("cancel-b"));
    let id = s.work_id("cancel");
    let t = a.acquire(&id, fast()).await.expect("acquire");
    let opts = fast()
        .wait_for_lease()
        .poll_interval(Duration::from_millis(100));
    let e = b
        .acquire(&id, opts.clone().wait_timeout(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::WaitTimedOut { .. }),
        "a timed-out wait is WaitTimedOut, got {e:?}"
    );
    let cancel = tokio_util::sync::CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        trigger.cancel();
    });
    let e = b.acquire(&id, opts.cancel_on(cancel)).await.unwrap_err();
    assert!(
        matches!(e, Error::Cancelled { .. }),
        "a cancelled wait is Cancelled, got {e:?}"
    );
    a.release(t).await.expect("release");
}

/// TTLs keep millisecond precision: a 1500 ms lease is held at 1400 ms and
/// free at 1600 ms (no rounding to seconds), or 1600 ms plus the
/// [`Suite::expiry_slack`] the store declares (it is never free early).
/// On a slow store the "still held" look is sent earlier, by the
/// store's [`Suite::slack`], so that it reaches the store before the TTL
/// ends whatever the round trip; the "free" look needs no slack beyond the
/// declared one, as it is sent after the TTL by the holder's own clock.
pub async fn ttl_precision(s: &Suite) {
    let ttl = Duration::from_millis(1500);
    let a = Leases::new(s.store.clone(), Config::new("ttl-a", ttl)).expect("config");
    let b = Leases::new(s.store.clone(), Config::new("ttl-b", ttl)).expect("config");
    let id = s.work_id("ttl");
    let start = Instant::now();
    let t = a.acquire(&id, fast()).await.expect("acquire");
    assert_eq!(t.ttl(), ttl);
    let held_look = Duration::from_millis(1400).min(ttl.saturating_sub(s.slack()));
    // The contender watches from the start (a register store counts a TTL
    // from its first sight of the lease).
    assert!(matches!(
        b.acquire(&id, fast()).await,
        Err(Error::Held { .. })
    ));
    tokio::time::sleep_until(start + held_look).await;
    assert!(
        matches!(b.acquire(&id, fast()).await, Err(Error::Held { .. })),
        "a 1500 ms lease must still be held at {held_look:?}"
    );
    tokio::time::sleep_until(start + Duration::from_millis(1600) + s.expiry_slack).await;
    let t = b.acquire(&id, fast()).await.unwrap_or_else(|e| {
        panic!(
            "a 1500 ms lease must be free at 1600 ms + the store's slack {:?}: {e}",
            s.expiry_slack
        )
    });
    b.release(t).await.expect("release");
}

/// S1 at the finest grain: with no safety margin, a contender never gets
/// the lease while its holder's own deadline (send time + TTL) is still
/// ahead, whatever the sub-millisecond phase of the store's clock (a store
/// that truncates its clock or the TTL to milliseconds fails this on a
/// store that answers in less than the error, as the paused memory store
/// does). The TTL is 20.3 ms plus the store's [`Suite::slack`]: a slow
/// store must still get its grant back before the holder's deadline. When
/// it does not (a grant that came back too late is `Expired`, which is the
/// right answer), the attempt tells nothing and is made again with a fresh
/// work ID, up to [`PHASE_ATTEMPTS`] times per phase.
pub async fn deadline_holds_at_sub_millisecond_phase(s: &Suite) {
    for phase_us in [100, 500, 900] {
        let ttl = Duration::from_micros(20_300) + s.slack();
        let config = |h: &str| Config::new(h, ttl).safety_margin(Duration::ZERO);
        let a = Leases::new(s.store.clone(), config("phase-a")).expect("config");
        let b = Leases::new(s.store.clone(), config("phase-b")).expect("config");
        let mut attempts = 0;
        let (id, ta) = loop {
            attempts += 1;
            let id = s.work_id("phase");
            s.pass(Duration::from_micros(phase_us)).await;
            match a.acquire(&id, fast()).await {
                Ok(ta) => break (id, ta),
                Err(Error::Expired { .. }) if attempts < PHASE_ATTEMPTS => continue,
                Err(e) => panic!(
                    "acquire (attempt {attempts}, TTL {ttl:?}, measured round trip {:?}): {e}",
                    s.round_trip
                ),
            }
        };
        loop {
            match b.acquire(&id, fast()).await {
                Ok(tb) => {
                    assert_eq!(
                        ta.remaining(),
                        Some(Duration::ZERO),
                        "S1: the contender got the lease while its holder's deadline was ahead (phase {phase_us}us)"
                    );
                    b.release(tb).await.expect("release");
                    break;
                }
                Err(Error::Held { .. }) => s.pass(Duration::from_micros(100)).await,
                Err(e) => panic!("acquire: {e}"),
            }
        }
    }
}

/// How many times [`deadline_holds_at_sub_millisecond_phase`] tries an
/// acquisition whose grant came back after its own deadline.
pub const PHASE_ATTEMPTS: u32 = 5;

/// Background renewal rides out a store that fails for less than the
/// remaining lease time: the lease is not lost, and stays exclusive.
pub async fn renewal_survives_transient_failure(s: &Suite) {
    let faulty = Arc::new(FaultStore::new(s.store.clone()));
    let a = s.holder_on(faulty.clone(), "transient-a");
    let b = s.holder("transient-b");
    let id = s.work_id("transient");
    let t = a.acquire(&id, fast()).await.expect("acquire");
    let renewal = a.start_renewal(t, RenewalOptions::new()).expect("renewal");
    // Fail from just after the first renewal for 60% of the TTL, less the
    // store's slack: less than the time the lease has left then
    // (TTL - margin), with room for the retry's round trip.
    tokio::time::sleep(s.ttl / 3 + Duration::from_millis(10)).await;
    faulty.set_unreachable(true);
    tokio::time::sleep((s.ttl * 6 / 10).saturating_sub(s.slack())).await;
    faulty.set_unreachable(false);
    tokio::time::sleep(s.ttl * 2).await;
    assert!(
        renewal.lost_cause().is_none(),
        "a transient failure lost the lease: {:?}",
        renewal.lost_cause()
    );
    assert!(
        matches!(b.acquire(&id, fast()).await, Err(Error::Held { .. })),
        "S1: the lease is still held"
    );
    let t = renewal.stop().await.expect("not lost");
    a.release(t).await.expect("release");
}

/// A store that stays unreachable fires the lost signal with
/// `WindowExhausted` no later than the send time of the last successful
/// renewal plus the TTL.
pub async fn renewal_lost_when_unreachable(s: &Suite) {
    let faulty = Arc::new(FaultStore::new(s.store.clone()));
    let a = s.holder_on(faulty.clone(), "unreachable-a");
    let id = s.work_id("unreachable");
    let sent = Instant::now();
    let t = a.acquire(&id, fast()).await.expect("acquire");
    faulty.set_unreachable(true);
    let renewal = a.start_renewal(t, RenewalOptions::new()).expect("renewal");
    let cause = renewal.lost().await;
    let at = Instant::now();
    assert!(
        matches!(cause, Error::WindowExhausted { .. }),
        "cause must be WindowExhausted, got {cause:?}"
    );
    assert!(
        at <= sent + s.ttl,
        "lost signal at {:?} after the acquire was sent, later than the TTL {:?}",
        at - sent,
        s.ttl
    );
    assert!(renewal.lost_signal().is_cancelled());
    assert!(
        renewal.stop().await.is_err(),
        "stop after a loss returns the cause"
    );
}

/// A renewal that finds its lease revoked fires the lost signal with
/// `Fenced`, and is not retried.
pub async fn renewal_lost_when_fenced(s: &Suite) {
    let faulty = Arc::new(FaultStore::new(s.store.clone()));
    let a = s.holder_on(faulty.clone(), "fenced-a");
    let id = s.work_id("fenced");
    let t = a.acquire(&id, fast()).await.expect("acquire");
    let renewal = a.start_renewal(t, RenewalOptions::new()).expect("renewal");
    s.store
        .revoke(&WorkId::new(id).expect("valid"))
        .await
        .expect("revoke");
    let cause = tokio::time::timeout(s.ttl, renewal.lost())
        .await
        .expect("lost within a TTL");
    assert!(
        matches!(cause, Error::Fenced { .. }),
        "cause must be Fenced, got {cause:?}"
    );
    let calls = faulty.calls();
    tokio::time::sleep(s.ttl).await;
    assert_eq!(faulty.calls(), calls, "Fenced is never retried");
}

/// On a store with notifications ([`crate::LeaseStore::watch`]), a renewing
/// holder learns of a revocation from the notification, long before its
/// next renewal is due: its lost signal fires with `Fenced` within a
/// second although the renewal interval is 20 s. (Stores without
/// notifications learn of it at the next renewal:
/// [`renewal_lost_when_fenced`].)
pub async fn renewal_sees_a_revocation_at_once(s: &Suite) {
    let id = s.work_id("revoked-now");
    let work_id = WorkId::new(id.clone()).expect("valid");
    if s.store.watch(&work_id).is_none() {
        return;
    }
    let a = Leases::new(
        s.store.clone(),
        Config::new("revoked-now-a", Duration::from_secs(60)),
    )
    .expect("config");
    let t = a.acquire(&id, fast()).await.expect("acquire");
    let renewal = a.start_renewal(t, RenewalOptions::new()).expect("renewal");
    s.store.revoke(&work_id).await.expect("revoke");
    let cause = tokio::time::timeout(Duration::from_secs(1) + s.slack(), renewal.lost())
        .await
        .expect("a revoked lease is lost within a second, not at the next renewal (20 s)");
    assert!(
        matches!(cause, Error::Fenced { .. }),
        "cause must be Fenced, got {cause:?}"
    );
}
