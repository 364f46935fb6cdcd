//! A Redis Cluster started by the test (`redis-server --cluster-enabled
//! yes` per node, then `redis-cli --cluster create`): three primaries,
//! with or without a replica each, over TLS or not; and the whole
//! conformance suite on three primaries through a `redis+cluster://`
//! store. (A module of `tests/redis_topologies.rs`.)

use std::sync::Arc;
use std::time::Duration;

use worklease::conformance::Suite;
use worklease::store::fault::FaultStore;
use worklease::store::redis::RedisStore;

use super::server::{OwnServer, READY};

/// TLS for every node, its cluster bus and replication
/// (`tls-cluster yes`, `tls-replication yes`).
pub(crate) struct ClusterTls {
    /// `redis-server` arguments naming its certificate, key and CA.
    pub(crate) server: Vec<String>,
    /// `redis-cli` arguments that trust the CA (`--tls --cacert PATH`).
    pub(crate) cli: Vec<String>,
}

/// What to start.
#[derive(Default)]
pub(crate) struct Shape<'a> {
    /// Replicas of each of the three primaries.
    pub(crate) replicas: usize,
    /// `cluster-node-timeout`: how long a node may be unreachable before
    /// the others count it failed (a replica takes over about then).
    pub(crate) node_timeout: Option<Duration>,
    pub(crate) tls: Option<&'a ClusterTls>,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) id: String,
    pub(crate) port: u16,
    pub(crate) primary: bool,
    pub(crate) failed: bool,
    /// A replica's primary.
    pub(crate) primary_id: Option<String>,
    /// The slot ranges it serves (primaries), inclusive.
    pub(crate) slots: Vec<(u16, u16)>,
}

impl Node {
    pub(crate) fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
    }
}

/// The nodes and their directories, killed when dropped.
pub(crate) struct Cluster {
    pub(crate) nodes: Vec<OwnServer>,
    dirs: Vec<tempfile::TempDir>,
    cli_tls: Vec<String>,
    args: Vec<String>,
}

impl Cluster {
    /// Three primaries sharing the 16384 slots, no replicas, no TLS.
    pub(crate) async fn start() -> Self {
        Self::start_with(&Shape::default()).await
    }

    /// Three primaries and `shape.replicas` replicas of each, returned
    /// once every node reports `cluster_state:ok` and every primary has
    /// its replicas online.
    pub(crate) async fn start_with(shape: &Shape<'_>) -> Self {
        let count = 3 * (1 + shape.replicas);
        let dirs: Vec<tempfile::TempDir> = (0..count)
            .map(|_| tempfile::tempdir().expect("tempdir"))
            .collect();
        let timeout = shape.node_timeout.unwrap_or(Duration::from_secs(2));
        let mut args: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            &timeout.as_millis().to_string(),
        ]
        .map(str::to_string)
        .to_vec();
        let mut cli_tls = Vec::new();
        if let Some(tls) = shape.tls {
            args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"].map(str::to_string));
            args.extend(tls.server.iter().cloned());
            cli_tls = tls.cli.clone();
        }
        let mut cluster = Self {
            nodes: Vec::new(),
            dirs,
            cli_tls,
            args,
        };
        let tls = shape.tls.is_some();
        for i in 0..count {
            let node = cluster.spawn(i, None, tls, READY);
            cluster.nodes.push(node);
        }
        let mut create = vec!["--cluster".to_string(), "create".to_string()];
        create.extend(
            cluster
                .nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port)),
        );
        create.extend(
            [
                "--cluster-replicas",
                &shape.replicas.to_string(),
                "--cluster-yes",
            ]
            .map(str::to_string),
        );
        let out = cluster.cli(None, &create).await;
        assert!(out.contains("[OK] All 16384 slots covered"), "{out}");
        for node in &cluster.nodes {
            let port = node.port;
            cluster
                .until(port, &["CLUSTER", "INFO"], |s| {
                    s.contains("cluster_state:ok")
                })
                .await;
        }
        // Each primary's replicas online. The primaries are read again at
        // each round: on a loaded machine the cluster may fail a slow
        // primary over while it starts (`cluster-node-timeout` is short),
        // and a node that became a replica never gets replicas of its own.
        let online = format!("connected_slaves:{}", shape.replicas);
        let mut waiting = Vec::new();
        for _ in 0..600 {
            waiting.clear();
            for node in cluster.topology().await.iter().filter(|n| n.primary) {
                let reply = cluster
                    .cli(
                        Some(node.port),
                        &["INFO".to_string(), "replication".to_string()],
                    )
                    .await;
                let ready = reply.contains("role:master")
                    && reply.contains(&online)
                    && reply.matches("state=online").count() == shape.replicas;
                if !ready {
                    waiting.push((node.port, reply));
                }
            }
            if waiting.is_empty() {
                return cluster;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("primaries without their replicas online: {waiting:?}");
    }

    /// Starts node `i` (in its directory, on `port` or a free one),
    /// returning once it logged `ready`.
    fn spawn(&self, i: usize, port: Option<u16>, tls: bool, ready: &str) -> OwnServer {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let dir = self.dirs[i].path();
        if tls {
            let port = port.unwrap_or_else(super::server::free_port).to_string();
            let head = ["--port", "0", "--tls-port", &port];
            OwnServer::spawn(port.parse().expect("port"), &head, dir, &args, ready)
        } else {
            OwnServer::start(dir, port, &args, ready)
        }
    }

    /// Starts the killed node `i` again on its port, with its cluster
    /// configuration and no data: the cluster makes it a replica of the
    /// primary that took over its slots. Returns once it synced.
    pub(crate) async fn restart(&mut self, i: usize) {
        let port = self.nodes[i].port;
        let tls = !self.cli_tls.is_empty();
        let node = self.spawn(i, Some(port), tls, super::sentinel::SYNCED);
        self.nodes[i] = node;
    }

    /// `redis-cli ARGS` (to the node at `port` when given), its stdout.
    pub(crate) async fn cli(&self, port: Option<u16>, args: &[String]) -> String {
        let mut command = std::process::Command::new("redis-cli");
        command.args(&self.cli_tls);
        if let Some(port) = port {
            command.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
        }
        command.args(args);
        let out = tokio::task::spawn_blocking(move || command.output())
            .await
            .expect("join")
            .expect("redis-cli is installed (apt-get install redis-tools or redis-server)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "redis-cli {args:?}: {text}");
        text
    }

    /// Polls `command` on the node at `port` until its reply satisfies
    /// `done` (no notification exists for cluster state).
    pub(crate) async fn until(&self, port: u16, command: &[&str], done: impl Fn(&str) -> bool) {
        let command: Vec<String> = command.iter().map(|s| s.to_string()).collect();
        let mut reply = String::new();
        for _ in 0..600 {
            reply = self.cli(Some(port), &command).await;
            if done(&reply) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{command:?} on {port}: {reply}");
    }

    /// `CLUSTER NODES`, as seen by the first node that answers.
    pub(crate) async fn topology(&self) -> Vec<Node> {
        let ask = ["CLUSTER".to_string(), "NODES".to_string()];
        for node in &self.nodes {
            let port = node.port.to_string();
            let mut command = std::process::Command::new("redis-cli");
            command
                .args(&self.cli_tls)
                .args(["-h", "127.0.0.1", "-p", &port])
                .args(&ask);
            let Ok(Ok(out)) = tokio::task::spawn_blocking(move || command.output()).await else {
                continue;
            };
            let text = String::from_utf8_lossy(&out.stdout);
            if out.status.success() && text.contains("myself") {
                return text.lines().filter_map(parse_node).collect();
            }
        }
        panic!("no node answers CLUSTER NODES");
    }

    /// The URL of the cluster with `prefix` (`scheme` `redis+cluster` or
    /// `rediss+cluster`).
    pub(crate) fn url_with(&self, scheme: &str, prefix: &str) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("{scheme}://{}/?prefix={prefix}", hosts.join(","))
    }

    /// The `redis+cluster://` URL of the cluster with `prefix`.
    pub(crate) fn url(&self, prefix: &str) -> String {
        self.url_with("redis+cluster", prefix)
    }
}

/// A `CLUSTER NODES` line: `ID HOST:PORT@BUS FLAGS PRIMARY PING PONG EPOCH
/// LINK SLOTS...`.
fn parse_node(line: &str) -> Option<Node> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let port = fields.get(1)?.split('@').next()?.rsplit_once(':')?.1;
    let flags = fields.get(2)?;
    let slots = fields
        .iter()
        .skip(8)
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => s.parse().ok().map(|a| (a, a)),
        })
        .collect();
    Some(Node {
        id: fields.first()?.to_string(),
        port: port.parse().ok()?,
        primary: flags.contains("master"),
        failed: flags.split(',').any(|f| f == "fail"),
        primary_id: Some(fields.get(3)?.to_string()).filter(|id| id.as_str() != "-"),
        slots,
    })
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
