//! Restarts, crashes and outages of a throwaway server, and pooled
//! connections recycled and killed under a live lease.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use worklease::store::mysql::mysql_async::prelude::Queryable;
use worklease::store::mysql::{MysqlOptions, MysqlStore, TableName};
use worklease::{AcquireOptions, Error, LeaseEnd, LeaseStore, RenewalOptions, WorkId};

use super::server::Server;
use super::{drop_table, fresh_table, leases, open, open_shared, server_url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_keeps_increasing_after_restart_crash_and_deleted_row() {
    let server = Server::start().await;
    let table = fresh_table("restart");
    let store = Arc::new(open(&server.url(), &table).await);
    let ttl = Duration::from_secs(60);
    let a = leases(store.clone(), "restart-a", ttl);
    let b = leases(store.clone(), "restart-b", ttl);
    let mut seen = Vec::new();

    let t = a
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    let t = a
        .checkpoint(&t, &b"progress"[..])
        .await
        .expect("checkpoint");
    seen.push(t.fencing_token());
    a.release(t).await.expect("release");
    // The lease table emptied by hand before the restart: only the
    // fencing table's counter remembers the tokens.
    store
        .pool()
        .get_conn()
        .await
        .expect("connection")
        .query_drop(format!("DELETE FROM `{table}`"))
        .await
        .expect("delete");

    // A clean restart.
    server.stop(false).await;
    server.start_again().await;
    let t = b
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire after a restart");
    seen.push(t.fencing_token());
    let t = b
        .checkpoint(&t, &b"progress"[..])
        .await
        .expect("checkpoint");
    // A crash (SIGKILL: recovery from the redo log) with the lease held.
    server.stop(true).await;
    server.start_again().await;
    assert!(
        matches!(
            a.acquire("job", AcquireOptions::new()).await,
            Err(Error::Held { .. })
        ),
        "a crash does not end an acknowledged lease"
    );
    b.release(t).await.expect("release after a crash");
    // A new store value, as a new process would open.
    let fresh = Arc::new(open(&server.url(), &table).await);
    let c = leases(fresh.clone(), "restart-c", ttl);
    let t = c
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    seen.push(t.fencing_token());
    let r = c.read_checkpoint(&t).await.expect("read");
    assert_eq!(
        r.data.as_deref(),
        Some(&b"progress"[..]),
        "S4 across a crash"
    );
    assert!(r.clean_handoff());
    // Emptied again, then a crash: the counter survives recovery too.
    c.release(t).await.expect("release");
    fresh
        .pool()
        .get_conn()
        .await
        .expect("connection")
        .query_drop(format!("TRUNCATE TABLE `{table}`"))
        .await
        .expect("truncate");
    server.stop(true).await;
    server.start_again().await;
    let t = c
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    seen.push(t.fencing_token());
    c.release(t).await.expect("release");

    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "S2: tokens must keep increasing across restart, crash and deletion: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_outages_shorter_than_the_lease_are_ridden_out_longer_ones_lose_it() {
    let server = Server::start().await;
    let table = fresh_table("outage");
    let store = Arc::new(open(&server.url(), &table).await);
    // Long enough for a stop, a wait and a start of mariadbd inside a
    // third of it.
    let ttl = Duration::from_secs(9);
    let a = leases(store.clone(), "outage-a", ttl);
    let b = leases(store.clone(), "outage-b", ttl);
    let t = a
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    let fencing = t.fencing_token();
    let mut renewal = a.start_renewal(t, RenewalOptions::new()).expect("renewal");

    // Right after a renewal, stop the server for a third of the time the
    // lease has left.
    let t = renewal.changed().await.expect("a first renewal");
    let left = t.remaining().expect("a deadline");
    let stopped = Instant::now();
    server.stop(false).await;
    tokio::time::sleep((left / 3).saturating_sub(stopped.elapsed())).await;
    server.start_again().await;
    let outage = stopped.elapsed();
    assert!(
        outage < left,
        "the outage ({outage:?}) outlasted the lease ({left:?})"
    );
    let t = tokio::time::timeout(left, renewal.changed())
        .await
        .expect("a renewal within the lease's remaining time")
        .expect("the lease survives an outage shorter than its remaining time");
    assert_eq!(t.fencing_token(), fencing, "no new acquisition");
    assert!(renewal.lost_cause().is_none());
    match b.acquire("job", AcquireOptions::new()).await {
        Err(Error::Held { holder_id, .. }) => assert_eq!(holder_id, "outage-a"),
        other => panic!("S1: the lease must still be held, got {other:?}"),
    }

    // Now a longer outage: the lost signal fires by the holder's deadline,
    // before the server could let anybody else in.
    let t = renewal.changed().await.expect("a renewal");
    let deadline = t.deadline().expect("a deadline");
    server.stop(false).await;
    let cause = renewal.lost().await;
    let lost_at = Instant::now();
    assert!(
        matches!(cause, Error::WindowExhausted { .. }),
        "cause must be WindowExhausted, got {cause:?}"
    );
    assert!(
        lost_at <= deadline + a.safety_margin(),
        "the lost signal fired {:?} after the holder's deadline",
        lost_at - deadline
    );
    server.start_again().await;
    let t = b
        .acquire(
            "job",
            AcquireOptions::new()
                .wait_for_lease()
                .poll_interval(ttl / 10)
                .wait_timeout(ttl * 2),
        )
        .await
        .expect("the expired lease passes on");
    let c = b.read_checkpoint(&t).await.expect("read");
    let prev = c.handoff.previous.expect("a previous holder");
    assert_eq!(
        (prev.holder_id.as_str(), prev.ended),
        ("outage-a", LeaseEnd::Expired)
    );
    assert!(t.fencing_token() > fencing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycled_and_killed_connections_change_nothing() {
    let table = fresh_table("recycle");
    let recycle = Duration::from_secs(1);
    let opts = worklease::store::mysql::mysql_async::Opts::from_url(&server_url())
        .expect("a mysql_async URL");
    let store = Arc::new(
        MysqlStore::new(
            opts,
            MysqlOptions::new()
                .table(TableName::new(&table).expect("valid"))
                .max_connection_lifetime(recycle),
        )
        .expect("store"),
    );
    store.initialize().await.expect("the server answers");
    let other = Arc::new(open_shared(&table).await);
    let ttl = Duration::from_secs(3);
    let a = leases(store.clone(), "recycle-a", ttl);
    let b = leases(other.clone(), "recycle-b", ttl);
    let t = a
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    let fencing = t.fencing_token();
    let renewal = a.start_renewal(t, RenewalOptions::new()).expect("renewal");

    // The holder's connections, by their ids on the server.
    let mut killer = other.pool().get_conn().await.expect("connection");
    let mut mine = store.pool().get_conn().await.expect("connection");
    let my_user: Option<String> = mine
        .query_first("SELECT CURRENT_USER()")
        .await
        .expect("user");
    drop(mine);
    assert!(my_user.is_some());
    // For a few TTLs: every second the pool's connections are refreshed
    // (maximum lifetime) and, besides, every idle connection of the
    // holder's pool is killed by the server.
    let mut tick = tokio::time::interval(recycle);
    let mut killed = 0usize;
    let until = Instant::now() + ttl * 3;
    while Instant::now() < until {
        tick.tick().await;
        let mut probe = store.pool().get_conn().await.expect("connection");
        let id: Option<u64> = probe
            .query_first("SELECT CONNECTION_ID()")
            .await
            .expect("id");
        drop(probe);
        if let Some(id) = id {
            if killer
                .query_drop(format!("KILL CONNECTION {id}"))
                .await
                .is_ok()
            {
                killed += 1;
            }
        }
        match b.acquire("job", AcquireOptions::new()).await {
            Err(Error::Held { holder_id, .. }) => assert_eq!(holder_id, "recycle-a"),
            other => panic!("S1: the lease must stay held, got {other:?}"),
        }
        let info = other
            .inspect(&[WorkId::new("job").expect("valid")])
            .await
            .expect("inspect");
        assert_eq!(info.len(), 1);
        assert_eq!(
            (info[0].fencing_token, info[0].expired),
            (fencing, false),
            "no new acquisition"
        );
        assert!(
            renewal.lost_cause().is_none(),
            "lost: {:?}",
            renewal.lost_cause()
        );
    }
    assert!(killed > 0, "the test killed no connection");
    let t = renewal.stop().await.expect("the lease was never lost");
    assert_eq!(t.fencing_token(), fencing);
    a.release(t).await.expect("release");
    let t = b
        .acquire("job", AcquireOptions::new())
        .await
        .expect("acquire");
    let c = b.read_checkpoint(&t).await.expect("read");
    let prev = c.handoff.previous.expect("previous");
    assert_eq!(
        (prev.holder_id.as_str(), prev.fencing_token, prev.ended),
        ("recycle-a", fencing, LeaseEnd::Released)
    );
    b.release(t).await.expect("release");
    drop(killer);
    drop_table(&other).await;
}
