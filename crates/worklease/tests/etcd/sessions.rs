//! Sessions and batches on one member: the keys of one holder and TTL
//! share one etcd lease, a release deletes only its own keys, each batch
//! is one transaction (one revision), `max_txn_ops` in the URL, and the
//! observation rule that frees a lease etcd keeps alive although its
//! holder stopped renewing.

use std::time::Duration;

use etcd_client::Client;
use tokio::time::Instant;
use worklease::store::etcd::{batch_capacity, EtcdConfig, EtcdStore, MAX_BATCH, MAX_TXN_OPS};
use worklease::{AcquireOptions, Error, LeaseStore, WorkId};

use super::{leases, raw, test_store, EXPIRY_SLACK};

/// The etcd lease `live/<id>` is attached to.
async fn lease_of(client: &mut Client, key: &str) -> i64 {
    let live = client.get(key, None).await.expect("get");
    live.kvs().first().expect("the lease key exists").lease()
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

/// Each batch is one transaction, told by revisions (other tests write
/// to the same server meanwhile, so not by the cluster's revision): the
/// tokens of one batch acquisition are one revision, a batch renewal puts
/// the session key once, and the `state` keys of one batch release share
/// one revision.
#[tokio::test]
async fn a_batch_is_one_transaction() {
    let store = test_store().await;
    assert_eq!(
        store.max_batch(),
        MAX_BATCH,
        "with etcd's default --max-txn-ops"
    );
    let mut client = raw(store.inner().config()).await;
    let a = leases(store.clone(), "batch-a", Duration::from_secs(5));
    let ids: Vec<String> = (0..store.max_batch())
        .map(|i| format!("jobs/b{i}"))
        .collect();
    let one_revision = |tokens: &[worklease::Token]| {
        tokens
            .iter()
            .all(|t| t.fencing_token() == tokens[0].fencing_token())
    };
    let tokens = a.acquire_many(&ids, ids.len()).await.expect("acquire_many");
    assert_eq!(tokens.len(), ids.len());
    assert!(
        one_revision(&tokens),
        "{} acquisitions in one transaction",
        ids.len()
    );
    let keys = |id: &str| store.inner().keys(&WorkId::new(id).expect("id"));
    let session = store
        .inner()
        .session_key(lease_of(&mut client, &keys(&ids[0]).live).await);
    let version = |resp: etcd_client::GetResponse| resp.kvs().first().map_or(0, |kv| kv.version());
    let before = version(client.get(session.as_str(), None).await.expect("get"));
    let renewed: Vec<_> = a
        .renew_many(&tokens)
        .await
        .expect("renew_many")
        .into_iter()
        .map(|r| r.expect("renewed"))
        .collect();
    assert_eq!(
        version(client.get(session.as_str(), None).await.expect("get")),
        before + 1,
        "one renewal transaction"
    );
    let out = a.release_many(renewed).await.expect("release_many");
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    let mut released = Vec::new();
    for id in &ids {
        let kv = client.get(keys(id).state, None).await.expect("get");
        released.push(kv.kvs().first().expect("state").mod_revision());
    }
    assert!(
        released.iter().all(|r| *r == released[0]),
        "one release transaction"
    );
    // Released here: the next acquisition of each is one transaction too.
    let again = a.acquire_many(&ids, ids.len()).await.expect("acquire_many");
    assert!(one_revision(&again));
    a.release_many(again).await.expect("release_many");
}

#[test]
fn max_txn_ops_comes_from_the_url() {
    let c = EtcdConfig::from_url("etcd://127.0.0.1:2379?max_txn_ops=64").expect("valid");
    assert_eq!(c.get_max_txn_ops(), 64);
    assert_eq!(EtcdStore::new(c.clone()).max_batch(), 29 * 30);
    assert_eq!(EtcdConfig::from_url(&c.to_url()).expect("round trip"), c);
    assert_eq!(
        EtcdConfig::from_url("etcd://127.0.0.1:2379")
            .expect("valid")
            .get_max_txn_ops(),
        MAX_TXN_OPS
    );
    for bad in ["0", "4", "5", "x", ""] {
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

/// The batch layout is what etcd allows: it gives a nested transaction
/// what its parent leaves of `--max-txn-ops` (128 by default), so `k`
/// groups of `g` nested transactions of three operations per branch, and
/// two more operations beside the groups, pass while `k + 2 + g + 3 <=
/// 128` (61 groups of 62: [`batch_capacity`] is built on it), and fail
/// beyond.
#[tokio::test]
async fn the_batch_layout_is_what_etcd_allows() {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    let store = test_store().await;
    let mut client = raw(store.inner().config()).await;
    let prefix = store.inner().config().get_prefix().to_string();
    let batch = |groups: usize, per: usize| {
        let mut ops: Vec<TxnOp> = (0..groups)
            .map(|g| {
                let nested: Vec<TxnOp> = (0..per)
                    .map(|i| {
                        // Short keys (compared and read, never
                        // written): the request stays under etcd's 1.5 MiB.
                        let k = format!("p{g}.{i}");
                        let three = |_| Compare::create_revision(k.as_str(), CompareOp::Equal, 0);
                        let gets = |_| TxnOp::get(k.as_str(), None);
                        TxnOp::txn(
                            Txn::new()
                                .when((0..3).map(three).collect::<Vec<_>>())
                                .and_then((0..3).map(gets).collect::<Vec<_>>())
                                .or_else((0..3).map(gets).collect::<Vec<_>>()),
                        )
                    })
                    .collect();
                TxnOp::txn(Txn::new().and_then(nested))
            })
            .collect();
        ops.extend((0..2).map(|s| TxnOp::put(format!("{prefix}probe-sess/{s}"), "", None)));
        Txn::new().and_then(ops)
    };
    assert!(batch_capacity(MAX_TXN_OPS) >= MAX_BATCH);
    client
        .txn(batch(61, 62))
        .await
        .expect("61 groups of 62 pass");
    for (groups, per) in [(62, 62), (61, 63)] {
        let e = client.txn(batch(groups, per)).await.unwrap_err();
        assert!(e.to_string().contains("too many operations"), "{e}");
    }
}
