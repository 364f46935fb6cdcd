//! Restarts, crashes and outages of a throwaway server, and pooled
//! connections recycled and killed under a live lease (the outage and
//! recycling checks shared with PostgreSQL, in `common/sql_store.rs`).

use std::sync::Arc;
use std::time::Duration;

use worklease::store::mysql::MysqlStore;

use super::common_lease::acquire_checkpointed;
use super::common_sql_store::{self, assert_held, fresh_table, leases, SqlStore, Tokens};
use super::exec;
use super::server::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_keeps_increasing_after_restart_crash_and_deleted_row() {
    let server = Server::start().await;
    let table = fresh_table("restart");
    let store = Arc::new(MysqlStore::open(&server.url(), &table).await);
    let ttl = Duration::from_secs(60);
    let a = leases(store.clone(), "restart-a", ttl);
    let b = leases(store.clone(), "restart-b", ttl);
    let mut seen = Tokens::default();

    let t = seen.note(acquire_checkpointed(&a, "job", b"progress").await);
    a.release(t).await.expect("release");
    // The lease table emptied by hand before the restart: only the
    // fencing table's counter remembers the tokens.
    exec(&store, &format!("DELETE FROM `{table}`")).await;

    // A clean restart.
    server.stop(false).await;
    server.start_again().await;
    let t = seen.acquire(&b).await;
    let t = b
        .checkpoint(&t, &b"progress"[..])
        .await
        .expect("checkpoint");
    // A crash (SIGKILL: recovery from the redo log) with the lease held.
    server.stop(true).await;
    server.start_again().await;
    assert_held(&a, "a crash does not end an acknowledged lease").await;
    b.release(t).await.expect("release after a crash");
    // A new store value, as a new process would open.
    let fresh = Arc::new(MysqlStore::open(&server.url(), &table).await);
    let c = leases(fresh.clone(), "restart-c", ttl);
    let t = seen.acquire(&c).await;
    let r = c.read_checkpoint(&t).await.expect("read");
    assert_eq!(
        r.data.as_deref(),
        Some(&b"progress"[..]),
        "S4 across a crash"
    );
    assert!(r.clean_handoff());
    // Emptied again, then a crash: the counter survives recovery too.
    c.release(t).await.expect("release");
    exec(&fresh, &format!("TRUNCATE TABLE `{table}`")).await;
    server.stop(true).await;
    server.start_again().await;
    seen.acquire_and_release(&c).await;

    seen.assert_increasing("restart, crash and deletion");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_outages_shorter_than_the_lease_are_ridden_out_longer_ones_lose_it() {
    let server = Server::start().await;
    // Long enough for a stop, a wait and a start of mariadbd inside a
    // third of it.
    common_sql_store::server_outages_shorter_than_the_lease_are_ridden_out::<MysqlStore>(
        &server,
        Duration::from_secs(9),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycled_and_killed_connections_change_nothing() {
    common_sql_store::recycled_and_killed_connections_change_nothing::<MysqlStore>().await;
}
