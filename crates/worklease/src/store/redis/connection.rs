//! The store value and its connections: the command connection (opened
//! with the first operation), the acquisition connection of a replica wait,
//! and the subscriber task started with the first waiter.

use std::sync::Arc;

use redis::aio::ConnectionManager;
use redis::ProtocolVersion;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::{Result, StoreError};
use crate::limits::WorkId;

use super::conn::Conn;
use super::keys::{self, LeaseKeys};
use super::primary::{Connections, Target};
use super::reply::store_err;
use super::sentinel::Sentinels;
use super::subscriber::{SubState, Subscription, Wakeups};
use super::topology::Topology;
use super::RedisConfig;

/// The Redis store. See the module docs for its guarantees and what Redis
/// cannot promise. Share one value per process (in an `Arc`): each value
/// keeps a command connection, and a subscriber connection once it has
/// waiters.
pub struct RedisStore {
    pub(super) config: RedisConfig,
    /// Where the commands go.
    pub(super) target: Target,
    /// The open connections, once the first operation opened them.
    pub(super) connections: std::sync::Mutex<Option<Arc<Connections>>>,
    /// Held while connections are opened or replaced.
    pub(super) opening: tokio::sync::Mutex<()>,
    /// Whether the server's settings were checked (once per store).
    pub(super) checked: std::sync::atomic::AtomicBool,
    pub(super) wakeups: Arc<Wakeups>,
    /// The subscriber task's state, once a waiter started it.
    subscription: std::sync::Mutex<Option<watch::Receiver<SubState>>>,
    /// Stops the subscriber task when the store is dropped.
    stop: CancellationToken,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("config", &self.config)
            .finish()
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl RedisStore {
    /// A store for `config`. Connects lazily: the first operation (or
    /// [`RedisStore::ready`]) opens the connections, inside the tokio
    /// runtime that runs it.
    ///
    /// # Errors
    /// A [`StoreError`] when the `redis` crate refuses the configuration.
    pub fn new(config: RedisConfig) -> Result<Self> {
        let mut info: redis::ConnectionInfo = config
            .server_url
            .as_str()
            .parse()
            .map_err(|e| store_err("invalid connection settings", e))?;
        if !config.protocol_given() {
            let settings = info
                .redis_settings()
                .clone()
                .set_protocol(ProtocolVersion::RESP3);
            info = info.set_redis_settings(settings);
        }
        #[cfg(feature = "redis-tls")]
        let client = match &config.tls {
            Some(tls) => super::tls::client(info, tls),
            None => redis::Client::open(info),
        };
        #[cfg(not(feature = "redis-tls"))]
        let client = redis::Client::open(info);
        let client = client.map_err(|e| store_err("invalid connection settings", e))?;
        let target = match &config.topology {
            Topology::Server => Target::Server(Box::new(client.clone())),
            Topology::Cluster { nodes } => {
                let info = client.get_connection_info();
                let settings = info.redis_settings();
                let mut infos = Vec::new();
                for (host, port) in nodes {
                    let (host, port) = (host.clone(), *port);
                    let addr = match info.addr().clone() {
                        redis::ConnectionAddr::TcpTls {
                            insecure,
                            tls_params,
                            ..
                        } => redis::ConnectionAddr::TcpTls {
                            host,
                            port,
                            insecure,
                            tls_params,
                        },
                        _ => redis::ConnectionAddr::Tcp(host, port),
                    };
                    infos.push(info.clone().set_addr(addr));
                }
                let mut builder = redis::cluster::ClusterClient::builder(infos.clone())
                    .connection_timeout(config.connection_timeout)
                    .response_timeout(config.response_timeout)
                    .use_protocol(settings.protocol());
                if let Some(user) = settings.username() {
                    builder = builder.username(user);
                }
                if let Some(password) = settings.password() {
                    builder = builder.password(password);
                }
                #[cfg(feature = "redis-tls")]
                if let Some(tls) = &config.tls {
                    builder = builder.certs(super::tls::certificates(tls));
                }
                let cluster = builder
                    .build()
                    .map_err(|e| store_err("invalid Cluster settings", e))?;
                let nodes = infos
                    .into_iter()
                    .map(redis::Client::open)
                    .collect::<redis::RedisResult<Vec<_>>>()
                    .map_err(|e| store_err("invalid Cluster settings", e))?;
                Target::Cluster(Arc::new((cluster, nodes)))
            }
            Topology::Sentinel { sentinels, master } => Target::Sentinel(Arc::new(Sentinels {
                sentinels: sentinels.clone(),
                master: master.clone(),
                template: client.get_connection_info().clone(),
                timeout: config.connection_timeout,
            })),
        };
        Ok(Self {
            config,
            target,
            connections: std::sync::Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
            checked: std::sync::atomic::AtomicBool::new(false),
            wakeups: Arc::new(Wakeups::default()),
            subscription: std::sync::Mutex::new(None),
            stop: CancellationToken::new(),
        })
    }

    /// A store for a `redis://` URL ([`RedisConfig::from_url`]), connecting
    /// lazily.
    ///
    /// # Errors
    /// As [`RedisConfig::from_url`].
    pub fn open(url: &str) -> Result<Self> {
        Self::new(RedisConfig::from_url(url)?)
    }

    /// A store for a `redis://` URL, connected.
    ///
    /// # Errors
    /// As [`RedisConfig::from_url`] and [`RedisStore::ready`].
    pub async fn connect(url: &str) -> Result<Self> {
        let store = Self::open(url)?;
        store.ready().await?;
        Ok(store)
    }

    /// Opens the command connection now, if it is not open yet (the
    /// subscriber connection opens with the first waiter).
    ///
    /// # Errors
    /// A [`StoreError`] when the server cannot be reached or refuses.
    pub async fn ready(&self) -> Result<()> {
        self.connections().await.map(|_| ())
    }

    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The keys of `work_id` (for operators and tests).
    pub fn lease_keys(&self, work_id: &WorkId) -> LeaseKeys {
        LeaseKeys::new(&self.config.prefix, work_id)
    }

    /// The store's command connection (multiplexed; cloning it is cheap),
    /// for diagnostics and benchmarks beside the store's own calls.
    ///
    /// # Errors
    /// As [`RedisStore::ready`]; a [`StoreError`] for a Cluster store,
    /// which has no single command connection.
    pub async fn connection(&self) -> Result<ConnectionManager> {
        match &self.connections().await?.main {
            Conn::One(c) => Ok(c.clone()),
            Conn::Cluster(_) => Err(StoreError::new(
                super::KIND,
                "a Redis Cluster store has no single command connection",
            )
            .into()),
        }
    }

    /// Starts the subscriber task if it is not running; false where it
    /// cannot run (no tokio runtime here, or a poisoned lock).
    pub(super) fn start_subscriber(&self) -> bool {
        let Ok(mut current) = self.subscription.lock() else {
            return false;
        };
        if current.is_some() {
            return true;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let subscription = Subscription {
            target: self.target.clone(),
            channel: self.channel(),
            connection_timeout: self.config.connection_timeout,
            response_timeout: self.config.response_timeout,
        };
        let (state, watched) = watch::channel(SubState::Starting);
        runtime.spawn(subscription.run(state, self.wakeups.clone(), self.stop.child_token()));
        *current = Some(watched);
        true
    }

    /// Waits (bounded by the connection and response timeouts) while the
    /// first subscription is under way, so that a waiter's attempt after
    /// its `watch` runs only once announcements reach it; a failed first
    /// subscription falls back to polling, and wakes every waiter when it
    /// succeeds later.
    pub(super) async fn first_subscription(&self) {
        let watched = self.subscription.lock().ok().and_then(|s| s.clone());
        if let Some(mut watched) = watched {
            if *watched.borrow() == SubState::Starting {
                let limit = self.config.connection_timeout + self.config.response_timeout;
                let settled = watched.wait_for(|s| *s != SubState::Starting);
                let _ = tokio::time::timeout(limit, settled).await;
            }
        }
    }

    pub(super) fn channel(&self) -> String {
        keys::channel(&self.config.prefix, self.config.db)
    }
}
