//! Sentinel failover under load: the holders of `holders.rs` take turns
//! on 2 work IDs, renewing and checkpointing, through `redis+sentinel://`
//! stores, while the test cuts the replica off for a moment and then
//! SIGKILLs the primary. With the replica wait on every write,
//! no two holders believe in one lease at once, fencing tokens never go
//! back and every acknowledged checkpoint survives; without it, whatever
//! was lost is counted and printed (asynchronous replication may lose
//! acknowledged writes; the test does not fail on it). (A module of
//! `tests/redis_topologies.rs`.)

use std::time::Duration;

use tokio::time::Instant;

use super::holders::{Figures, Load, HOLDERS};
use super::sentinel::Deployment;

/// How long the replica lags (its link cut) before the primary crashes:
/// shorter than the replica wait's timeout (500 ms), so that a waiting
/// write is refused rather than acknowledged by a late replica.
pub(crate) const LAG: Duration = Duration::from_millis(300);

/// The figures of one run.
struct Losses {
    figures: Figures,
    following: Duration,
    /// From the kill until the killed node, restarted, synced as a replica.
    restarted: Duration,
}

impl std::fmt::Display for Losses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the sentinels named the new primary {:?} after the kill, the killed node was a \
             replica again after {:?}; {}",
            self.following, self.restarted, self.figures
        )
    }
}

/// Runs the holders on a fresh deployment, cuts the replica off for
/// `lag`, then SIGKILLs the primary, and returns what was lost once the
/// holders have been granted leases again on the new primary (its replica
/// back).
async fn run(wait: bool, lag: Duration) -> Losses {
    let down_after = Duration::from_millis(500);
    let mut deployment = Deployment::start(down_after).await;
    let mut url = format!("{}?prefix=failover%3A", deployment.url());
    if wait {
        url.push_str("&wait_replicas=1&wait_timeout_ms=500");
    }
    let load = Load::start(&url, Duration::from_secs(3)).await;
    // Under way: a few acknowledged checkpoints on each work ID.
    load.checkpoints(HOLDERS as u64 * 2).await;
    let old = deployment.primary.port;
    // The replica falls behind first: its link is cut and it cannot come
    // back (the primary now wants a password, which the connections
    // already open, the stores' and the sentinels', do not need), so the
    // writes of the last `lag` reach the primary only. Then the crash.
    deployment.cut_replication().await;
    tokio::time::sleep(lag).await;
    deployment.primary.kill();
    let kill = Instant::now();
    load.killed();
    while deployment.primary_port().await == old {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let following = kill.elapsed();
    // The killed node comes back empty and becomes the new primary's
    // replica, so that a replica wait can be met again.
    deployment.restart_old_primary().await;
    let restarted = kill.elapsed();
    let figures = load.finish(Duration::from_secs(120)).await;
    Losses {
        figures,
        following,
        restarted,
    }
}

/// With `wait_replicas`, a failover loses nothing acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_with_the_replica_wait_loses_nothing_acknowledged() {
    let on = run(true, LAG).await;
    eprintln!("failover, replica wait on: {on}");
    on.figures.assert_nothing_lost("a failover", &on);
}

/// Without it, what a failover lost is measured and printed, not
/// asserted: asynchronous replication may lose acknowledged writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_without_the_replica_wait_is_measured() {
    let off = run(false, LAG).await;
    eprintln!("failover, replica wait off: {off}");
    assert!(off.figures.grants_after_kill >= HOLDERS as u64, "{off}");
}
