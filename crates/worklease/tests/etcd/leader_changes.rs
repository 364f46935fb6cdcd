//! L1 under Raft leader changes: etcd restarts every lease's countdown
//! when a new leader takes over (etcd-io/etcd#9888, #9395, #17132), so
//! with leadership moving more often than the TTL etcd never ends a dead
//! holder's lease; the contender's observation rule must free it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use worklease::store::etcd::{EtcdConfig, EtcdStore};
use worklease::{AcquireOptions, LeaseStore};

use super::{leases, Cluster, EXPIRY_SLACK};

/// Moves Raft leadership from the leader to the next member; false when
/// the move did not go through (an election under way).
async fn move_leader(cluster: &Cluster) -> bool {
    let leader = cluster.leader().await;
    let next = (leader + 1) % cluster.members.len();
    let Some(mut target) = cluster.member_client(next).await else {
        return false;
    };
    let Ok(status) = target.status().await else {
        return false;
    };
    let Some(id) = status.header().map(|h| h.member_id()) else {
        return false;
    };
    let Some(mut client) = cluster.member_client(leader).await else {
        return false;
    };
    client.move_leader(id).await.is_ok()
}

/// A holder (TTL 5 s) acquires and dies; leadership moves every 3 s; a
/// contender polling every 200 ms must get the lease within TTL + poll +
/// slack (the expiry slack plus a few measured round trips) of the
/// holder's acquisition, after the holder's deadline (S1), with a larger
/// token (S2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holder_loses_its_lease_while_leadership_moves() {
    let cluster = Cluster::start(3).await;
    let config = EtcdConfig::new(cluster.hosts())
        .expect("hosts")
        .prefix(super::unique_prefix())
        .expect("prefix")
        .request_timeout(Duration::from_secs(2));
    let ttl = Duration::from_secs(5);
    let poll = Duration::from_millis(200);
    let holder_store = std::sync::Arc::new(EtcdStore::new(config.clone()));
    holder_store.ready().await.expect("the cluster answers");
    let contender_store = std::sync::Arc::new(EtcdStore::new(config));
    contender_store.ready().await.expect("the cluster answers");
    // Round trips as measured here, for the bound.
    let mut rt = Duration::ZERO;
    for _ in 0..5 {
        let t = Instant::now();
        contender_store.inspect(&[]).await.expect("inspect");
        rt = rt.max(t.elapsed());
    }
    let holder = leases(holder_store.clone(), "dead-holder", ttl);
    let contender = leases(contender_store.clone(), "successor", ttl);
    let sent = Instant::now();
    let dead = holder
        .acquire("jobs/leader-moves", AcquireOptions::new())
        .await
        .expect("acquire");
    let mut client = cluster
        .member_client(cluster.leader().await)
        .await
        .expect("a client of the leader");
    let key = holder_store.keys(dead.work_id()).live;
    let session = client.get(key, None).await.expect("get").kvs()[0].lease();
    // The holder dies: no renewal ever again.
    drop(holder);
    drop(holder_store);
    let moves = AtomicU32::new(0);
    let mover = async {
        while sent.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_secs(3)).await;
            if move_leader(&cluster).await {
                moves.fetch_add(1, Ordering::Relaxed);
            }
        }
    };
    let wait = contender.acquire(
        "jobs/leader-moves",
        AcquireOptions::new().wait_for_lease().poll_interval(poll),
    );
    let got = tokio::select! {
        got = wait => Some(got),
        () = mover => None,
    };
    let at = Instant::now();
    let moves = moves.load(Ordering::Relaxed);
    let token = match got {
        Some(Ok(t)) => t,
        other => panic!("the successor gets the lease ({moves} leader moves): {other:?}"),
    };
    assert!(moves >= 1, "leadership moved while the lease ran out");
    let kept = client
        .lease_time_to_live(session, None)
        .await
        .map(|r| r.ttl())
        .unwrap_or(-1);
    assert!(
        kept > 0,
        "etcd kept the dead holder's lease ({kept} s left): the observation rule freed it"
    );
    let deadline = dead.deadline().expect("a deadline");
    assert!(
        at > deadline,
        "S1: acquired before the dead holder's deadline"
    );
    assert!(token.fencing_token() > dead.fencing_token(), "S2");
    let bound = ttl + 2 * poll + EXPIRY_SLACK + 6 * rt;
    println!(
        "leader moved every 3 s ({moves} moves): the successor acquired {:?} after the holder (bound {bound:?}, round trip {rt:?}), the holder's etcd lease still had {kept} s",
        at - sent
    );
    assert!(
        at - sent <= bound,
        "L1: acquired {:?} after the dead holder's acquisition (bound {bound:?})",
        at - sent
    );
    contender.release(token).await.expect("release");
}
