//! Where the store's commands go and the connections that carry them: one
//! server, or the primary the sentinels name, followed across a failover
//! (a command that fails as a moved primary would is tried once more on
//! the new primary's connections).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionAddr, ErrorKind, ProtocolVersion, RedisError, ServerErrorKind};

use crate::error::Result;
use crate::store::url_parts::redact;

use super::conn::Conn;
use super::reply::store_err;
use super::sentinel::Sentinels;
use super::RedisStore;

/// Where the commands go.
#[derive(Clone)]
pub(super) enum Target {
    /// The configured server.
    Server(Box<redis::Client>),
    /// Whichever server the sentinels name as the primary.
    Sentinel(Arc<Sentinels>),
    /// A Redis Cluster: its client, and the client of each node given
    /// (the release subscription uses the first that answers: a cluster
    /// delivers every `PUBLISH` to every node).
    Cluster(Arc<(redis::cluster::ClusterClient, Vec<redis::Client>)>),
}

impl Target {
    /// The client of the server to use now.
    ///
    /// # Errors
    /// For a Sentinel target, when no sentinel names a primary that
    /// answers as one.
    pub(super) async fn client(&self) -> redis::RedisResult<redis::Client> {
        match self {
            Target::Server(client) => Ok(client.as_ref().clone()),
            Target::Sentinel(sentinels) => sentinels.primary().await,
            Target::Cluster(cluster) => {
                let mut last = None;
                for node in &cluster.1 {
                    match node.get_multiplexed_async_connection().await {
                        Ok(_) => return Ok(node.clone()),
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    redis::RedisError::from((redis::ErrorKind::Client, "no Cluster node given"))
                }))
            }
        }
    }
}

/// `client` speaking `protocol` (pub/sub runs on RESP2).
pub(super) fn with_protocol(
    client: &redis::Client,
    protocol: ProtocolVersion,
) -> redis::RedisResult<redis::Client> {
    let info = client.get_connection_info().clone();
    let settings = info.redis_settings().clone().set_protocol(protocol);
    redis::Client::open(info.set_redis_settings(settings))
}

/// The connections of a store to one server, opened with its first
/// operation (and again after a failover).
pub(super) struct Connections {
    /// Every script runs here (multiplexed: concurrent calls share it).
    pub(super) main: Conn,
    /// Writes followed by `WAIT`, when a replica wait is set (`WAIT`
    /// blocks its connection; on a Cluster, its connection to the slot's
    /// primary).
    pub(super) waiting: Option<Conn>,
    /// The server they connect to.
    addr: ConnectionAddr,
    /// Set when a command on them failed as a lost primary would (Sentinel
    /// only): until the sentinels confirm that this server is still the
    /// primary, no command goes to it, since its connection manager would
    /// reconnect to whatever listens at its address (the old primary
    /// restarted empty, say) without an error.
    suspect: AtomicBool,
}

/// Whether `e` may mean that the primary moved: the connection failed or
/// the server is now a replica.
fn primary_lost(e: &RedisError) -> bool {
    e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_io_error()
        || e.is_timeout()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

impl RedisStore {
    /// Whether the store talks to a Redis Cluster.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    async fn manager(
        &self,
        client: &redis::Client,
        response_timeout: Duration,
    ) -> Result<ConnectionManager> {
        // One reconnection attempt per failed command, not the client's
        // six with exponential back-off (about 6 s before a command fails
        // on a stopped server): the store's callers retry on their own
        // schedule (a renewal within its lease window, an observer every
        // poll interval) and must hear of an outage while it matters; and
        // behind sentinels, a lost primary is looked up again rather than
        // waited for.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.config.connection_timeout))
            .set_response_timeout(Some(response_timeout))
            .set_number_of_retries(1);
        ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(|e| self.cannot_connect(e))
    }

    /// The error of a failed connection: the redacted URL, and with TLS a
    /// hint when the server's certificate is the cause.
    fn cannot_connect(&self, e: RedisError) -> crate::Error {
        let url = self.config.to_url();
        // Shown as written: the parameters were percent-encoded when the
        // URL was put together again (`prefix=jobs%3A`); the password is
        // gone before the decoding.
        let shown = percent_encoding::percent_decode_str(&redact(&url))
            .decode_utf8_lossy()
            .into_owned();
        let mut what = format!("cannot connect to {shown}");
        #[cfg(feature = "redis-tls")]
        if let Some(hint) = super::tls::hint(&e) {
            what = format!("{what} ({hint})");
        }
        if !url.starts_with("rediss") && e.is_connection_dropped() && !e.is_connection_refusal() {
            // A TLS port closes a connection that does not start with a
            // TLS handshake, and the client reports only a reset.
            what = format!(
                "{what} (the server closed the connection at once: if that port takes TLS, \
                 write rediss://)"
            );
        }
        store_err(&what, e)
    }

    /// Opens connections to the server the target names now (to a
    /// Cluster: one cluster connection).
    async fn open_connections(&self) -> Result<Arc<Connections>> {
        let shown = || redact(&self.config.to_url());
        if let Target::Cluster(cluster) = &self.target {
            let open = |response_timeout| async move {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(self.config.connection_timeout)
                    .set_response_timeout(response_timeout);
                cluster
                    .0
                    .get_async_connection_with_config(config)
                    .await
                    .map(Conn::Cluster)
                    .map_err(|e| self.cannot_connect(e))
            };
            let main = open(self.config.response_timeout).await?;
            let waiting = match self.config.wait {
                Some(w) => Some(open(self.config.response_timeout + w.timeout).await?),
                None => None,
            };
            return Ok(Arc::new(Connections {
                main,
                waiting,
                addr: ConnectionAddr::Tcp(String::new(), 0),
                suspect: AtomicBool::new(false),
            }));
        }
        let client = self
            .target
            .client()
            .await
            .map_err(|e| store_err(&format!("cannot find the primary of {}", shown()), e))?;
        let main = self.manager(&client, self.config.response_timeout).await?;
        let waiting = match self.config.wait {
            Some(w) => Some(Conn::One(
                self.manager(&client, self.config.response_timeout + w.timeout)
                    .await?,
            )),
            None => None,
        };
        let main = Conn::One(main);
        if !self.checked.swap(true, Ordering::Relaxed) {
            super::server_checks::warn_on_server_settings(&main).await;
        }
        Ok(Arc::new(Connections {
            main,
            waiting,
            addr: client.get_connection_info().addr().clone(),
            suspect: AtomicBool::new(false),
        }))
    }

    /// The store's connections, opened if they are not open yet.
    ///
    /// # Errors
    /// A store error when the server (or the primary) cannot be reached.
    pub(super) async fn connections(&self) -> Result<Arc<Connections>> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let _opening = self.opening.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let opened = self.open_connections().await?;
        if let Ok(mut current) = self.connections.lock() {
            *current = Some(opened.clone());
        }
        Ok(opened)
    }

    fn current(&self) -> Option<Arc<Connections>> {
        self.connections.lock().ok().and_then(|c| c.clone())
    }

    /// After `stale` failed as a lost primary would: asks the sentinels
    /// where the primary is, and opens connections there if it moved.
    /// `Ok(true)` when the connections now lead elsewhere (also when
    /// another call replaced them meanwhile), `Ok(false)` when the
    /// sentinels confirm `stale`'s server (no longer suspect).
    ///
    /// # Errors
    /// When no primary can be found or reached yet.
    async fn follow(&self, stale: &Arc<Connections>) -> redis::RedisResult<bool> {
        let _opening = self.opening.lock().await;
        match self.current() {
            Some(c) if !Arc::ptr_eq(&c, stale) => return Ok(true),
            _ => {}
        }
        let client = self.target.client().await?;
        if client.get_connection_info().addr() == &stale.addr {
            stale.suspect.store(false, Ordering::Relaxed);
            return Ok(false);
        }
        let opened = self.open_connections().await.map_err(|e| {
            redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                e.to_string(),
            ))
        })?;
        tracing::info!("following the new Redis primary");
        if let Ok(mut current) = self.connections.lock() {
            *current = Some(opened);
        }
        Ok(true)
    }

    /// After `stale` (Cluster connections) met a replica where its slot
    /// map names a primary (a failed primary restarted as the replica of
    /// the one promoted in its place): opens new cluster connections,
    /// which read the slot map afresh. The `redis` crate follows `MOVED`
    /// and `ASK` itself but not `READONLY`, and, having sent `READONLY`
    /// to every node, gets no `MOVED` from a replica for a read either.
    ///
    /// # Errors
    /// When the cluster cannot be reached.
    async fn reopen(&self, stale: &Arc<Connections>) -> Result<()> {
        let _opening = self.opening.lock().await;
        match self.current() {
            Some(c) if !Arc::ptr_eq(&c, stale) => return Ok(()),
            _ => {}
        }
        let opened = self.open_connections().await?;
        tracing::info!("a Redis Cluster node became a replica: reading the slot map again");
        if let Ok(mut current) = self.connections.lock() {
            *current = Some(opened);
        }
        Ok(())
    }

    /// Runs `call` on the connections; when it fails as a lost primary
    /// would (Sentinel), follows the primary and runs it once more there;
    /// when it met a replica in a primary's place (Cluster), reads the
    /// slot map again and runs it once more; when the connection had been
    /// dropped (one server), runs it once
    /// more (the connection manager has reconnected by then). That is
    /// safe for every script run here: each is conditioned on the work ID,
    /// holder and fencing token, so running one twice cannot break S1–S3
    /// (at worst a release that did apply reports `Expired`).
    ///
    /// # Errors
    /// A store error when the connections cannot be opened; the call's own
    /// error is the inner result.
    pub(super) async fn on_primary<'a, T>(
        &'a self,
        call: impl Fn(Arc<Connections>) -> BoxFuture<'a, redis::RedisResult<T>>,
    ) -> Result<redis::RedisResult<T>> {
        let sentinel = matches!(self.target, Target::Sentinel(_));
        let mut connections = self.connections().await?;
        if sentinel && connections.suspect.load(Ordering::Relaxed) {
            if let Err(e) = self.follow(&connections).await {
                return Ok(Err(e));
            }
            connections = self.connections().await?;
        }
        Ok(match call(connections.clone()).await {
            Err(e) if sentinel && primary_lost(&e) => {
                connections.suspect.store(true, Ordering::Relaxed);
                match self.follow(&connections).await {
                    Ok(true) => call(self.connections().await?).await,
                    Ok(false) | Err(_) => Err(e),
                }
            }
            Err(e)
                if self.is_cluster()
                    && e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) =>
            {
                self.reopen(&connections).await?;
                call(self.connections().await?).await
            }
            Err(e) if e.is_connection_dropped() => {
                tracing::debug!(error = %e, "the connection had been dropped: trying once more");
                call(connections).await
            }
            other => other,
        })
    }
}
