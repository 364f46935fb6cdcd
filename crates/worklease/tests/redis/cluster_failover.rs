//! Redis Cluster under load: three primaries with a replica each, the
//! holders of `holders.rs` renewing and checkpointing through
//! `redis+cluster://` stores while the test (b) moves the slot of one
//! work ID's live lease to another primary, key by key (`CLUSTER SETSLOT
//! ... MIGRATING/IMPORTING`, `MIGRATE`: the stores meet `ASK`, `TRYAGAIN`
//! and `MOVED`), then (a) cuts the other work ID's primary off from its
//! replica for a moment and SIGKILLs it (`cluster-node-timeout` 1000 ms:
//! the replica is promoted by the cluster). With the replica wait, no two
//! holders believe in one lease at once, fencing tokens never go back and
//! every acknowledged checkpoint survives; without it, what was lost is
//! printed, not asserted. Figures:
//! `cargo test -p worklease --features redis,redis-tls,testkit --test
//! redis_topologies -- cluster_failover --nocapture`.
//! (A module of `tests/redis_topologies.rs`.)

use std::time::Duration;

use tokio::time::Instant;

use super::cluster::{Cluster, Node, Shape};
use super::failover::LAG;
use super::holders::{work_id, Figures, Load, HOLDERS, WORK_IDS};

/// The key prefix of the stores.
const PREFIX: &str = "failover:";

/// The figures of one run.
struct Losses {
    figures: Figures,
    /// How long moving the slot took, under load.
    moved: Duration,
    /// The keys that moved with it.
    keys: usize,
    /// From the kill until the cluster named the replica primary.
    following: Duration,
    /// From the kill until the killed node, restarted, synced as a replica.
    restarted: Duration,
}

impl std::fmt::Display for Losses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the slot moved ({} keys) in {:?}; the cluster promoted the replica {:?} after the kill, \
             the killed node was a replica again after {:?}; {}",
            self.keys, self.moved, self.following, self.restarted, self.figures
        )
    }
}

fn args(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

/// The primary that serves `slot`.
fn owner(nodes: &[Node], slot: u16) -> Node {
    nodes
        .iter()
        .find(|n| n.primary && !n.failed && n.serves(slot))
        .cloned()
        .unwrap_or_else(|| panic!("no primary serves slot {slot}: {nodes:?}"))
}

/// Moves `slot` from `from` to `to` as `redis-cli --cluster reshard`
/// does, but one key per `MIGRATE`, so that a work ID's keys are split
/// between the two nodes for a while. Returns how many keys moved.
async fn move_slot(cluster: &Cluster, slot: u16, from: &Node, to: &Node) -> usize {
    let s = slot.to_string();
    let host = "127.0.0.1";
    let importing = args(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &from.id]);
    cluster.cli(Some(to.port), &importing).await;
    let migrating = args(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &to.id]);
    cluster.cli(Some(from.port), &migrating).await;
    let list = args(&["CLUSTER", "GETKEYSINSLOT", &s, "1"]);
    let port = to.port.to_string();
    let mut moved = 0;
    loop {
        let keys = cluster.cli(Some(from.port), &list).await;
        let Some(key) = keys.lines().find(|k| !k.is_empty()) else {
            break;
        };
        let migrate = args(&["MIGRATE", host, &port, "", "0", "5000", "KEYS", key]);
        cluster.cli(Some(from.port), &migrate).await;
        moved += 1;
    }
    let node = args(&["CLUSTER", "SETSLOT", &s, "NODE", &to.id]);
    cluster.cli(Some(to.port), &node).await;
    cluster.cli(Some(from.port), &node).await;
    moved
}

/// Runs the holders on a fresh cluster, moves a live lease's slot, cuts
/// the other lease's primary off from its replica for [`LAG`] and kills
/// it, then restarts it (empty) and counts what was lost once every
/// holder was granted a lease again.
async fn run(wait: bool) -> Losses {
    let shape = Shape {
        replicas: 1,
        node_timeout: Some(Duration::from_millis(1000)),
        tls: None,
    };
    let mut cluster = Cluster::start_with(&shape).await;
    let mut url = cluster.url("failover%3A");
    if wait {
        url.push_str("&wait_replicas=1&wait_timeout_ms=500");
    }
    let mut slots = Vec::new();
    for w in 0..WORK_IDS {
        let key = format!("{PREFIX}{{{}}}:state", work_id(w).as_str());
        let keyslot = args(&["CLUSTER", "KEYSLOT", &key]);
        let reply = cluster.cli(Some(cluster.nodes[0].port), &keyslot).await;
        slots.push(reply.trim().parse::<u16>().expect("a slot"));
    }
    let load = Load::start(&url, Duration::from_secs(3)).await;
    load.checkpoints(HOLDERS as u64 * 2).await;

    // (b) The slot of work ID 1 moves to another primary, under load.
    let nodes = cluster.topology().await;
    let from = owner(&nodes, slots[1]);
    let to = nodes
        .iter()
        .find(|n| n.primary && n.id != from.id)
        .cloned()
        .expect("another primary");
    let started = Instant::now();
    let keys = move_slot(&cluster, slots[1], &from, &to).await;
    let moved = started.elapsed();
    load.checkpoints(load.checkpoints_so_far() + HOLDERS as u64)
        .await;

    // (a) The primary of work ID 0 loses its replica's link (the replica
    // cannot come back: it now sends a password its primary does not
    // know), then crashes.
    let nodes = cluster.topology().await;
    let victim = owner(&nodes, slots[0]);
    let replica = nodes
        .iter()
        .find(|n| n.primary_id.as_deref() == Some(victim.id.as_str()))
        .cloned()
        .expect("the victim's replica");
    let bogus = format!("{:032x}", rand::random::<u128>());
    let cut = args(&["CONFIG", "SET", "masterauth", &bogus]);
    cluster.cli(Some(replica.port), &cut).await;
    let kill_link = args(&["CLIENT", "KILL", "TYPE", "master"]);
    cluster.cli(Some(replica.port), &kill_link).await;
    tokio::time::sleep(LAG).await;
    let i = cluster
        .nodes
        .iter()
        .position(|n| n.port == victim.port)
        .expect("the victim's process");
    cluster.nodes[i].kill();
    let kill = Instant::now();
    load.killed();
    let promoted = |s: &str| s.contains("role:master");
    cluster
        .until(replica.port, &["INFO", "replication"], promoted)
        .await;
    let following = kill.elapsed();
    cluster.restart(i).await;
    let restarted = kill.elapsed();
    let figures = load.finish(Duration::from_secs(120)).await;
    Losses {
        figures,
        moved,
        keys,
        following,
        restarted,
    }
}

/// With `wait_replicas`, a resharding and a failover under load lose
/// nothing acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_failover_with_the_replica_wait_loses_nothing_acknowledged() {
    let on = run(true).await;
    eprintln!("cluster resharding and failover, replica wait on: {on}");
    assert!(on.keys > 0, "the moved slot held a lease: {on}");
    on.figures
        .assert_nothing_lost("a resharding and a failover", &on);
}

/// Without it, what was lost is measured and printed, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_failover_without_the_replica_wait_is_measured() {
    let off = run(false).await;
    eprintln!("cluster resharding and failover, replica wait off: {off}");
    assert!(off.figures.grants_after_kill >= HOLDERS as u64, "{off}");
}
