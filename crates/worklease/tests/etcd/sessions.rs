//! Sessions and batches on one member: the keys of one holder and TTL
//! share one etcd lease, a release deletes only its own keys, each batch
//! is one transaction (one revision), `max_txn_ops` in the URL, and the
//! observation rule that frees a lease etcd keeps alive although its
//! holder stopped renewing.

use std::time::Duration;

use etcd_client::Client;
use tokio::time::Instant;
use worklease::store::etcd::{EtcdConfig, EtcdStore, MAX_TXN_OPS};
use worklease::{AcquireOptions, Error, LeaseStore, WorkId};

use super::{leases, raw, test_store, EXPIRY_SLACK};

/// The etcd lease `live/<id>` is attached to.
async fn lease_of(client: &mut Client, key: &str) -> i64 {
    let live = client.get(key, None).await.expect("get");
    live.kvs().first().expect("the lease key exists").lease()
}

/// The cluster's current revision.
async fn revision(client: &mut Client) -> i64 {
    client
        .get("worklease-test/revision", None)
        .await
        .expect("get")
        .header()
        .expect("a header")
        .revision()
}

#[tokio::test]
async fn a_session_shares_one_etcd_lease_and_a_release_deletes_only_its_keys() {
    let store = test_store().await;
    let mut client = raw(store.inner().config()).await;
    let ttl = Duration::from_secs(4);
    let a = leases(store.clone(), "session-a", ttl);
    let b = leases(store.clone(), "session-b", ttl);
    let ids = ["jobs/s0", "jobs/s1", "jobs/s2"];
    let tokens = a.acquire_many(ids, 3).await.expect("acquire_many");
    let single = a
        .acquire("jobs/s3", AcquireOptions::new())
        .await
        .expect("acquire");
    let mut attached = Vec::new();
    for w in ids.iter().chain(["jobs/s3"].iter()) {
        attached.push(
            lease_of(
                &mut client,
                &store.inner().keys(&WorkId::new(*w).expect("id")).live,
            )
            .await,
        );
    }
    assert!(
        attached.iter().all(|l| *l == attached[0]),
        "one etcd lease for the holder's keys of one TTL: {attached:?}"
    );
    let other = b
        .acquire("jobs/s4", AcquireOptions::new())
        .await
        .expect("acquire");
    let theirs = lease_of(
        &mut client,
        &store
            .inner()
            .keys(&WorkId::new("jobs/s4").expect("id"))
            .live,
    )
    .await;
    assert_ne!(theirs, attached[0], "another holder has its own session");
    let mut tokens = tokens.into_iter();
    let first = tokens.next().expect("a token");
    a.release(first).await.expect("release");
    let left = client
        .lease_time_to_live(attached[0], None)
        .await
        .expect("TimeToLive")
        .ttl();
    assert!(left > 0, "a release leaves the session lease alone");
    for t in tokens.chain([single]) {
        let t = a.renew(&t).await.expect("the others renew");
        a.release(t).await.expect("release");
    }
    b.release(other).await.expect("release");
}

#[tokio::test]
async fn a_batch_is_one_transaction() {
    let store = test_store().await;
    assert_eq!(
        store.max_batch(),
        MAX_TXN_OPS - 4,
        "etcd's default --max-txn-ops"
    );
    let mut client = raw(store.inner().config()).await;
    let a = leases(store.clone(), "batch-a", Duration::from_secs(5));
    let ids: Vec<String> = (0..store.max_batch())
        .map(|i| format!("jobs/b{i}"))
        .collect();
    let before = revision(&mut client).await;
    let tokens = a.acquire_many(&ids, ids.len()).await.expect("acquire_many");
    assert_eq!(tokens.len(), ids.len());
    assert_eq!(
        revision(&mut client).await,
        before + 1,
        "{} acquisitions in one transaction",
        ids.len()
    );
    let before = revision(&mut client).await;
    let renewed: Vec<_> = a
        .renew_many(&tokens)
        .await
        .expect("renew_many")
        .into_iter()
        .map(|r| r.expect("renewed"))
        .collect();
    assert_eq!(
        revision(&mut client).await,
        before + 1,
        "one renewal transaction"
    );
    let before = revision(&mut client).await;
    let out = a.release_many(renewed).await.expect("release_many");
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    assert_eq!(
        revision(&mut client).await,
        before + 1,
        "one release transaction"
    );
    // Released here: the next acquisition of each is one transaction too.
    let before = revision(&mut client).await;
    let again = a.acquire_many(&ids, ids.len()).await.expect("acquire_many");
    assert_eq!(revision(&mut client).await, before + 1);
    a.release_many(again).await.expect("release_many");
}

#[test]
fn max_txn_ops_comes_from_the_url() {
    let c = EtcdConfig::from_url("etcd://127.0.0.1:2379?max_txn_ops=64").expect("valid");
    assert_eq!(c.get_max_txn_ops(), 64);
    assert_eq!(EtcdStore::new(c.clone()).max_batch(), 60);
    assert_eq!(EtcdConfig::from_url(&c.to_url()).expect("round trip"), c);
    assert_eq!(
        EtcdConfig::from_url("etcd://127.0.0.1:2379")
            .expect("valid")
            .get_max_txn_ops(),
        MAX_TXN_OPS
    );
    for bad in ["0", "4", "x", ""] {
        let e =
            EtcdConfig::from_url(&format!("etcd://127.0.0.1:2379?max_txn_ops={bad}")).unwrap_err();
        assert!(e.to_string().contains("max_txn_ops"), "{e}");
    }
}

/// A holder that stopped renewing, whose etcd lease something else keeps
/// alive (here a client renewing it, as a new Raft leader restarting
/// every TTL would): a contender that sees the lease unchanged for its
/// TTL takes it over, within TTL + poll + slack of the holder's last
/// renewal, after the holder's own deadline (S1), with a larger token
/// (S2); the holder's next renewal is `Fenced`.
#[tokio::test]
async fn a_contender_takes_over_a_lease_etcd_keeps_alive() {
    let store = super::test_store().await;
    let mut client = raw(store.inner().config()).await;
    let ttl = Duration::from_secs(2);
    let poll = Duration::from_millis(200);
    let a = leases(store.clone(), "kept-a", ttl);
    let b = leases(super::twin(&store), "kept-b", ttl);
    let sent = Instant::now();
    let ta = a
        .acquire("jobs/kept", AcquireOptions::new())
        .await
        .expect("acquire");
    let rt = sent.elapsed();
    let lease = lease_of(
        &mut client,
        &store
            .inner()
            .keys(&WorkId::new("jobs/kept").expect("id"))
            .live,
    )
    .await;
    let keeper = tokio::spawn(async move {
        loop {
            if client.lease_keep_alive(lease).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let tb = b
        .acquire(
            "jobs/kept",
            AcquireOptions::new().wait_for_lease().poll_interval(poll),
        )
        .await
        .expect("the contender takes it over");
    let at = Instant::now();
    keeper.abort();
    let deadline = ta.deadline().expect("a deadline");
    assert!(at > deadline, "S1: taken over before the holder's deadline");
    assert!(tb.fencing_token() > ta.fencing_token(), "S2");
    let bound = ttl + 2 * poll + EXPIRY_SLACK + 4 * rt;
    assert!(
        at - sent <= bound,
        "L1: taken over {:?} after the last renewal (bound {bound:?})",
        at - sent
    );
    assert!(matches!(a.renew(&ta).await, Err(Error::Fenced { .. })));
    b.release(tb).await.expect("release");
}

/// The batch limit is what etcd allows: it gives a nested transaction
/// what its parent leaves of `--max-txn-ops` (128 by default), so a batch
/// of `max_batch` nested transactions of four operations each passes, and
/// one more fails.
#[tokio::test]
async fn the_batch_limit_is_what_etcd_allows() {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let store = test_store().await;
    let mut client = raw(store.inner().config()).await;
    let batch = |n: usize| {
        let ops: Vec<TxnOp> = (0..n)
            .map(|i| {
                let k = format!("{}probe/{i}", store.inner().config().get_prefix());
                let four = |_| Compare::create_revision(k.as_str(), CompareOp::Equal, 0);
                let gets = |_| TxnOp::get(k.as_str(), None);
                TxnOp::txn(
                    Txn::new()
                        .when((0..4).map(four).collect::<Vec<_>>())
                        .and_then((0..4).map(gets).collect::<Vec<_>>())
                        .or_else((0..4).map(gets).collect::<Vec<_>>()),
                )
            })
            .collect();
        Txn::new().and_then(ops)
    };
    let n = store.max_batch();
    assert_eq!(n, MAX_TXN_OPS - 4);
    client.txn(batch(n)).await.expect("a full batch passes");
    let e = client.txn(batch(n + 1)).await.unwrap_err();
    assert!(e.to_string().contains("too many operations"), "{e}");
}
