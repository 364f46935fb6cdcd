//! A Redis Cluster of three primaries started by the test
//! (`redis-server --cluster-enabled yes` three times, then
//! `redis-cli --cluster create`), and the whole conformance suite on it
//! through a `redis+cluster://` store. (A module of
//! `tests/redis_topologies.rs`.)

use std::sync::Arc;
use std::time::Duration;

use worklease::conformance::Suite;
use worklease::store::fault::FaultStore;
use worklease::store::redis::RedisStore;

use super::server::{raw, OwnServer, READY};

/// The nodes and their directories, killed when dropped.
pub(crate) struct Cluster {
    pub(crate) nodes: Vec<OwnServer>,
    _dirs: Vec<tempfile::TempDir>,
}

impl Cluster {
    /// Three primaries sharing the 16384 slots, returned once every node
    /// reports `cluster_state:ok`.
    pub(crate) async fn start() -> Self {
        let dirs: Vec<tempfile::TempDir> = (0..3)
            .map(|_| tempfile::tempdir().expect("tempdir"))
            .collect();
        let args = ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"];
        let nodes: Vec<OwnServer> = dirs
            .iter()
            .map(|d| OwnServer::start(d.path(), None, &args, READY))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let create = tokio::task::spawn_blocking(move || {
            std::process::Command::new("redis-cli")
                .args(["--cluster", "create"])
                .args(&addrs)
                .args(["--cluster-replicas", "0", "--cluster-yes"])
                .output()
        })
        .await
        .expect("join")
        .expect("redis-cli is installed (apt-get install redis-tools or redis-server)");
        assert!(
            create.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&create.stdout)
        );
        for node in &nodes {
            let mut conn = raw(&node.url()).await;
            let mut state = String::new();
            for _ in 0..600 {
                state = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_default();
                if state.contains("cluster_state:ok") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(state.contains("cluster_state:ok"), "{state}");
        }
        Self { nodes, _dirs: dirs }
    }

    /// The `redis+cluster://` URL of the cluster with `prefix`.
    pub(crate) fn url(&self, prefix: &str) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}/?prefix={prefix}", hosts.join(","))
    }
}

worklease::conformance_tests!(three_primaries, paused = false, async {
    let cluster = Cluster::start().await;
    let store = RedisStore::connect(&cluster.url("cluster%3A"))
        .await
        .expect("a Cluster store");
    Suite::new(Arc::new(
        FaultStore::over(Arc::new(store)).with_guard(Arc::new(cluster)),
    ))
});
