//! A Sentinel-managed deployment started by the test (one primary, one
//! replica, three sentinels, on loopback): processes and their failover.
//! (A module of `tests/redis_topologies.rs`.)

use std::time::Duration;

use super::server::{free_port, raw, OwnServer, READY};

/// The name the sentinels know the primary by.
pub(crate) const MASTER: &str = "wl";

/// What a replica logs once it holds the primary's data.
pub(crate) const SYNCED: &str = "MASTER <-> REPLICA sync: Finished with success";

/// The processes, killed when dropped; each keeps its directory.
pub(crate) struct Deployment {
    pub(crate) primary: OwnServer,
    _replica: OwnServer,
    pub(crate) sentinels: Vec<OwnServer>,
    dirs: Vec<tempfile::TempDir>,
}

fn dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

impl Deployment {
    /// Starts the primary, its replica and three sentinels (quorum 2,
    /// primary down after `down_after`), and returns once every sentinel
    /// knows the replica and the other two sentinels.
    pub(crate) async fn start(down_after: Duration) -> Self {
        let dirs: Vec<tempfile::TempDir> = (0..5).map(|_| dir()).collect();
        let primary = OwnServer::start(dirs[0].path(), None, &[], READY);
        let port = primary.port.to_string();
        let replica = OwnServer::start(
            dirs[1].path(),
            None,
            &["--replicaof", "127.0.0.1", &port],
            SYNCED,
        );
        let sentinels = (2..5)
            .map(|i| {
                let conf = dirs[i].path().join("sentinel.conf");
                let text = format!(
                    "sentinel monitor {MASTER} 127.0.0.1 {port} 2\n\
                     sentinel down-after-milliseconds {MASTER} {}\n\
                     sentinel failover-timeout {MASTER} {}\n",
                    down_after.as_millis(),
                    (down_after * 4).as_millis()
                );
                std::fs::write(&conf, text).expect("sentinel.conf");
                let sentinel_port = free_port();
                let head = [
                    conf.to_str().expect("UTF-8 path"),
                    "--sentinel",
                    "--port",
                    &sentinel_port.to_string(),
                ];
                OwnServer::spawn(sentinel_port, &head, dirs[i].path(), &[], "+monitor master")
            })
            .collect();
        let deployment = Self {
            primary,
            _replica: replica,
            sentinels,
            dirs,
        };
        for s in &deployment.sentinels {
            let url = format!("redis://127.0.0.1:{}", s.port);
            let mut conn = raw(&url).await;
            // The sentinels discover the replica and each other through the
            // primary (INFO and hello messages, every second or two).
            let mut known = (0, 0);
            for _ in 0..600 {
                known = (
                    sentinel_cmd(&mut conn, "REPLICAS").await.len(),
                    sentinel_cmd(&mut conn, "SENTINELS").await.len(),
                );
                if known == (1, 2) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(
                known,
                (1, 2),
                "a sentinel knows (replicas, other sentinels)"
            );
        }
        deployment
    }

    /// The `redis+sentinel://` URL of the deployment.
    pub(crate) fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// The primary's port as the first sentinel names it.
    pub(crate) async fn primary_port(&self) -> u16 {
        let url = format!("redis://127.0.0.1:{}", self.sentinels[0].port);
        let mut conn = raw(&url).await;
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER)
            .query_async(&mut conn)
            .await
            .expect("SENTINEL get-master-addr-by-name");
        port
    }

    /// Cuts the replica's link to the primary and keeps it from coming
    /// back: the primary now requires a password (connections already
    /// open stay authenticated) and drops its replica connection.
    pub(crate) async fn cut_replication(&self) {
        let mut conn = raw(&self.primary.url()).await;
        let password = format!("{:032x}", rand::random::<u128>());
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg(password)
            .exec_async(&mut conn)
            .await
            .expect("CONFIG SET requirepass");
        redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("replica")
            .exec_async(&mut conn)
            .await
            .expect("CLIENT KILL TYPE replica");
    }

    /// Starts the killed primary again, empty, on its port: the sentinels
    /// make it a replica of the new primary. Returns once it synced.
    pub(crate) async fn restart_old_primary(&mut self) {
        let port = self.primary.port;
        let dir = self.dirs[0].path().to_path_buf();
        self.primary =
            tokio::task::spawn_blocking(move || OwnServer::start(&dir, Some(port), &[], SYNCED))
                .await
                .expect("restart");
    }
}

async fn sentinel_cmd(
    conn: &mut redis::aio::MultiplexedConnection,
    what: &str,
) -> Vec<redis::Value> {
    redis::cmd("SENTINEL")
        .arg(what)
        .arg(MASTER)
        .query_async(conn)
        .await
        .unwrap_or_default()
}
