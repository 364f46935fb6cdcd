//! The session revision (ADR 0013) on one member: a renewal tick writes
//! one key per session, not per lease; while the session renews, no
//! contender takes a lease over, and a lease its holder gave up is ended
//! by the holder's store (the sweep) within its time + a round trip; renewals from another process keep a lease its acquirer
//! gave up; a revoked, expired or taken lease in a batch fails alone; an
//! acquisition whose reply was lost is ended once its time is up.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use tokio::time::Instant;
use worklease::store::etcd::{EtcdConfig, EtcdStore};
use worklease::store::proxy::FaultProxy;
use worklease::{AcquireOptions, Error, LeaseStore, RenewalOptions, WorkId};

use super::{leases, raw, server_url, test_store, test_store_on, twin, unique_prefix};

/// What a bound on the sweep (which wakes at a lease's time) allows for
/// its timer and a busy machine; etcd's own expiry allows 500 ms for its
/// sweep too.
const SWEEP_SLACK: Duration = Duration::from_millis(500);

/// The etcd lease `live/<id>` is attached to.
async fn lease_of(client: &mut Client, key: &str) -> i64 {
    let live = client.get(key, None).await.expect("get");
    live.kvs().first().expect("the lease key exists").lease()
}

/// The mod revision of `key` (0: absent).
async fn mod_revision(client: &mut Client, key: &str) -> i64 {
    let kv = client.get(key, None).await.expect("get");
    kv.kvs().first().map_or(0, |kv| kv.mod_revision())
}

/// How often `key` was written since it was created (0: absent).
async fn version(client: &mut Client, key: &str) -> i64 {
    let kv = client.get(key, None).await.expect("get");
    kv.kvs().first().map_or(0, |kv| kv.version())
}

/// The largest of a few measured acquire → release round trips of `store`.
async fn round_trip(store: Arc<dyn LeaseStore>) -> Duration {
    let l = leases(store, "round-trip", Duration::from_secs(2));
    let mut rt = Duration::ZERO;
    for _ in 0..3 {
        let t0 = Instant::now();
        let t = l
            .acquire("jobs/round-trip", AcquireOptions::new())
            .await
            .expect("acquire");
        rt = rt.max(t0.elapsed());
        l.release(t).await.expect("release");
    }
    rt
}

/// One batch renewal of many leases is one transaction that writes one
/// key, the session key (once); every `live` key keeps its revision.
#[tokio::test]
async fn a_renewal_batch_writes_only_the_session_key() {
    let store = test_store().await;
    let config = store.inner().config().clone();
    let mut client = raw(&config).await;
    let a = leases(store.clone(), "rev-only", Duration::from_secs(5));
    let ids: Vec<String> = (0..50).map(|i| format!("jobs/r{i}")).collect();
    let tokens = a.acquire_many(&ids, ids.len()).await.expect("acquire_many");
    let live = |id: &str| store.inner().keys(&WorkId::new(id).expect("id")).live;
    let session = lease_of(&mut client, &live(&ids[0])).await;
    let session_key = store.inner().session_key(session);
    let before = version(&mut client, &session_key).await;
    let mut live_before = Vec::new();
    for id in &ids {
        live_before.push(mod_revision(&mut client, &live(id)).await);
    }
    let renewed = a.renew_many(&tokens).await.expect("renew_many");
    assert!(renewed.iter().all(Result::is_ok), "{renewed:?}");
    assert_eq!(
        version(&mut client, &session_key).await,
        before + 1,
        "one renewal transaction"
    );
    let after = mod_revision(&mut client, &session_key).await;
    let written: Vec<String> = client
        .get(
            config.get_prefix(),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("list")
        .kvs()
        .iter()
        .filter(|kv| kv.mod_revision() == after)
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect();
    assert_eq!(
        written,
        vec![session_key],
        "a renewal tick writes the session key only"
    );
    for (id, rev) in ids.iter().zip(live_before) {
        assert_eq!(mod_revision(&mut client, &live(id)).await, rev, "{id}");
    }
    let out = a
        .release_many(renewed.into_iter().map(|r| r.expect("renewed")).collect())
        .await
        .expect("release_many");
    assert!(out.iter().all(Result::is_ok), "{out:?}");
}

/// While its holder renews (batches move the session key, no key of the
/// lease is written), a contender polling in another process never takes
/// the lease over, however long it looks (S1 with renewals that are
/// compares only).
#[tokio::test]
async fn no_takeover_while_the_session_renews() {
    let store = test_store().await;
    let mut client = raw(store.inner().config()).await;
    let ttl = Duration::from_secs(2);
    let a = leases(store.clone(), "renews-a", ttl);
    let b = leases(twin(&store), "renews-b", ttl);
    let t = a
        .acquire("jobs/renews", AcquireOptions::new())
        .await
        .expect("acquire");
    let keys = store.inner().keys(t.work_id());
    let session_key = store
        .inner()
        .session_key(lease_of(&mut client, &keys.live).await);
    let live_rev = mod_revision(&mut client, &keys.live).await;
    let state_rev = mod_revision(&mut client, &keys.state).await;
    let renewal = a.start_renewal(t, RenewalOptions::new()).expect("renewal");
    let wait = AcquireOptions::new()
        .wait_for_lease()
        .poll_interval(Duration::from_millis(100))
        .wait_timeout(ttl * 3);
    let got = b.acquire("jobs/renews", wait).await;
    assert!(
        matches!(got, Err(Error::WaitTimedOut { .. })),
        "S1: the contender got a lease its holder renews: {got:?}"
    );
    assert!(!renewal.lost_signal().is_cancelled(), "the holder kept it");
    assert_eq!(mod_revision(&mut client, &keys.live).await, live_rev);
    assert_eq!(
        mod_revision(&mut client, &keys.state).await,
        state_rev,
        "renewals wrote no key of the lease"
    );
    assert!(
        mod_revision(&mut client, &session_key).await > live_rev,
        "renewals moved the session key"
    );
    let t = renewal.stop().await.expect("stop");
    a.release(t).await.expect("release");
}

/// A holder renews one lease and gives another of the same session up
/// (acquired, never renewed): its store ends the given-up one after its
/// holder's deadline, within its TTL + a few round trips of its
/// acquisition, though etcd keeps the session alive and the session key
/// moves; the renewed one stays held.
#[tokio::test]
async fn a_given_up_lease_is_swept_while_its_session_renews() {
    let store = test_store().await;
    let mut client = raw(store.inner().config()).await;
    let ttl = Duration::from_secs(2);
    let poll = Duration::from_millis(200);
    let rt = round_trip(store.clone()).await;
    let a = leases(store.clone(), "sweep-a", ttl);
    let b = leases(twin(&store), "sweep-b", ttl);
    let kept = a
        .acquire("jobs/sweep-kept", AcquireOptions::new())
        .await
        .expect("acquire");
    let kept_key = store.inner().keys(kept.work_id()).live;
    let renewal = a
        .start_renewal(kept, RenewalOptions::new())
        .expect("renewal");
    let sent = Instant::now();
    let dropped = a
        .acquire("jobs/sweep-dropped", AcquireOptions::new())
        .await
        .expect("acquire");
    let dropped_key = store.inner().keys(dropped.work_id()).live;
    let session = lease_of(&mut client, &dropped_key).await;
    assert_eq!(
        lease_of(&mut client, &kept_key).await,
        session,
        "one session lease"
    );
    let session_before = mod_revision(&mut client, &store.inner().session_key(session)).await;
    let got = b
        .acquire(
            "jobs/sweep-dropped",
            AcquireOptions::new().wait_for_lease().poll_interval(poll),
        )
        .await
        .expect("the contender gets the given-up lease");
    let at = Instant::now();
    assert!(
        at > dropped.deadline().expect("a deadline"),
        "S1: ended before its holder's deadline"
    );
    assert!(got.fencing_token() > dropped.fencing_token(), "S2");
    let bound = ttl + SWEEP_SLACK + 2 * poll + 6 * rt;
    assert!(
        at - sent <= bound,
        "L1: a given-up lease was freed {:?} after its acquisition (bound {bound:?})",
        at - sent
    );
    assert!(
        mod_revision(&mut client, &store.inner().session_key(session)).await > session_before,
        "the session kept renewing meanwhile"
    );
    let left = client
        .lease_time_to_live(session, None)
        .await
        .expect("TimeToLive")
        .ttl();
    assert!(left > 0, "etcd kept the session lease alive");
    assert!(
        !renewal.lost_signal().is_cancelled(),
        "the other lease is kept"
    );
    assert!(matches!(a.renew(&dropped).await, Err(Error::Fenced { .. })));
    let t = renewal.stop().await.expect("stop");
    a.release(t).await.expect("release");
    b.release(got).await.expect("release");
}

/// A lease renewed from another process (a store that did not acquire
/// it) stays held although its acquiring store stopped renewing it while
/// renewing others of the session: those renewals write `state`, which
/// the sweep compares. Once they stop, the lease is freed.
#[tokio::test]
async fn renewals_from_another_process_keep_a_lease_its_acquirer_gave_up() {
    let store = test_store().await;
    let ttl = Duration::from_secs(2);
    let a = leases(store.clone(), "elsewhere-a", ttl);
    let a_elsewhere = leases(twin(&store), "elsewhere-a", ttl);
    let b = leases(twin(&store), "elsewhere-b", ttl);
    let other = a
        .acquire("jobs/elsewhere-other", AcquireOptions::new())
        .await
        .expect("acquire");
    let renewal = a
        .start_renewal(other, RenewalOptions::new())
        .expect("renewal");
    let mut t = a
        .acquire("jobs/elsewhere", AcquireOptions::new())
        .await
        .expect("acquire");
    let until = Instant::now() + ttl * 3;
    let mut last = Instant::now();
    while Instant::now() < until {
        tokio::time::sleep(ttl / 3).await;
        let sent = Instant::now();
        t = a_elsewhere.renew(&t).await.expect("renewed elsewhere");
        last = sent;
        assert!(
            matches!(
                b.acquire("jobs/elsewhere", AcquireOptions::new()).await,
                Err(Error::Held { .. })
            ),
            "S1: a lease renewed from another process was freed"
        );
    }
    let got = b
        .acquire(
            "jobs/elsewhere",
            AcquireOptions::new()
                .wait_for_lease()
                .poll_interval(Duration::from_millis(200)),
        )
        .await
        .expect("freed once the renewals stop");
    let at = Instant::now();
    assert!(at > t.deadline().expect("a deadline"), "S1");
    // The acquiring store sees the last renewal when its sweep reads the
    // keys again: up to a TTL after it, then a TTL more.
    let bound = last + 2 * ttl + SWEEP_SLACK * 2 + Duration::from_secs(1);
    assert!(
        at <= bound,
        "L1: freed {:?} after the last renewal",
        at - last
    );
    b.release(got).await.expect("release");
    let other = renewal.stop().await.expect("stop");
    a.release(other).await.expect("release");
}

/// One batch with a revoked lease, one expired (its key deleted by hand)
/// and one taken over: each fails alone with the single call's error, the
/// others renew, in one transaction.
#[tokio::test]
async fn a_renewal_batch_with_a_revoked_lease_fails_alone() {
    let store = test_store().await;
    let mut client = raw(store.inner().config()).await;
    let ttl = Duration::from_secs(5);
    let a = leases(store.clone(), "alone-a", ttl);
    let b = leases(twin(&store), "alone-b", ttl);
    let ids: Vec<String> = (0..6).map(|i| format!("jobs/alone{i}")).collect();
    let tokens = a.acquire_many(&ids, ids.len()).await.expect("acquire_many");
    store
        .revoke(&WorkId::new(ids[1].clone()).expect("id"))
        .await
        .expect("revoke");
    let key = |i: usize| {
        store
            .inner()
            .keys(&WorkId::new(ids[i].clone()).expect("id"))
    };
    client
        .delete(key(2).live.as_str(), None)
        .await
        .expect("delete");
    client
        .delete(key(3).live.as_str(), None)
        .await
        .expect("delete");
    let taker = b
        .acquire(&ids[3], AcquireOptions::new())
        .await
        .expect("the freed lease is taken");
    let session_key = store
        .inner()
        .session_key(lease_of(&mut client, &key(0).live).await);
    let before = version(&mut client, &session_key).await;
    let out = a.renew_many(&tokens).await.expect("the batch as a whole");
    assert_eq!(
        version(&mut client, &session_key).await,
        before + 1,
        "one renewal transaction (the failed ones read after it)"
    );
    assert!(
        out[0].is_ok() && out[4].is_ok() && out[5].is_ok(),
        "{out:?}"
    );
    assert!(
        matches!(out[1], Err(Error::Fenced { .. })),
        "revoked: {:?}",
        out[1]
    );
    assert!(
        matches!(out[2], Err(Error::Expired { .. })),
        "expired: {:?}",
        out[2]
    );
    assert!(
        matches!(out[3], Err(Error::Fenced { .. })),
        "taken: {:?}",
        out[3]
    );
    for i in [0, 4, 5] {
        assert!(
            matches!(
                b.acquire(&ids[i], AcquireOptions::new()).await,
                Err(Error::Held { .. })
            ),
            "S1: {} renewed in the batch is held",
            ids[i]
        );
    }
    let kept: Vec<_> = [0, 4, 5]
        .into_iter()
        .map(|i| out[i].as_ref().expect("renewed").clone())
        .collect();
    let released = a.release_many(kept).await.expect("release_many");
    assert!(released.iter().all(Result::is_ok), "{released:?}");
    b.release(taker).await.expect("release");
}

/// An acquisition whose reply was lost (applied, but every try's reply
/// dropped by a proxy) while the holder's session renews another lease:
/// the store ends it once the call's TTL has passed (the sweep compares
/// the `acq` value the call wrote), and a contender gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_whose_reply_was_lost_is_ended() {
    let base = EtcdConfig::from_url(&server_url()).expect("valid URL");
    let upstream: std::net::SocketAddr =
        base.hosts()[0].parse().expect("the test server is IP:PORT");
    let proxy = FaultProxy::start(upstream).await.expect("proxy");
    let config = EtcdConfig::new([proxy.local_addr().to_string()])
        .expect("host")
        .prefix(unique_prefix())
        .expect("prefix")
        .request_timeout(Duration::from_millis(300));
    let store = test_store_on(config.clone()).await;
    let direct = Arc::new(EtcdStore::new(
        base.prefix(config.get_prefix()).expect("prefix"),
    ));
    let ttl = Duration::from_secs(3);
    let a = leases(store.clone(), "lost-a", ttl);
    let b = leases(direct.clone(), "lost-b", ttl);
    let other = a
        .acquire("jobs/lost-other", AcquireOptions::new())
        .await
        .expect("acquire");
    let renewal = a
        .start_renewal(other, RenewalOptions::new())
        .expect("renewal");
    proxy.drop_replies();
    let sent = Instant::now();
    let lost = a.acquire("jobs/lost", AcquireOptions::new()).await;
    assert!(
        matches!(&lost, Err(e) if e.is_transient()),
        "every reply lost: a store error, got {lost:?}"
    );
    proxy.restore().await;
    assert!(
        matches!(
            b.acquire("jobs/lost", AcquireOptions::new()).await,
            Err(Error::Held { .. })
        ),
        "the acquisition was applied"
    );
    let got = b
        .acquire(
            "jobs/lost",
            AcquireOptions::new()
                .wait_for_lease()
                .poll_interval(Duration::from_millis(200)),
        )
        .await
        .expect("ended once its time is up");
    let waited = sent.elapsed();
    assert!(waited >= ttl, "ended before the call's TTL: {waited:?}");
    assert!(
        waited <= ttl + SWEEP_SLACK + Duration::from_secs(2),
        "L1: ended {waited:?} after it was sent"
    );
    assert!(
        !renewal.lost_signal().is_cancelled(),
        "the session kept renewing"
    );
    b.release(got).await.expect("release");
    let other = renewal.stop().await.expect("stop");
    a.release(other).await.expect("release");
}
