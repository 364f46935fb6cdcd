//! The Redis store (feature `redis`): leases on a Redis server (6.0 or
//! later), one atomic Lua script per operation, judged by the server's
//! clock.
//!
//! * **Key layout.** Under a configurable prefix (default
//!   [`DEFAULT_PREFIX`]), each work ID has four keys,
//!   `<prefix>{<escaped work ID>}:state|live|ckpt|fence` ([`LeaseKeys`]).
//!   The escaping (percent-encoding of `{`, `}`, `%`, control characters
//!   and non-ASCII bytes) keeps every work ID distinct (`jobs/a`,
//!   `jobs/a/b` and `jobs/ab` are independent leases, so are `{a}` and
//!   `%7Ba%7D`), and the hash tag `{…}` puts one work ID's keys in one Redis
//!   Cluster slot, so each script touches one slot. The state hash
//!   (holder, fencing token, TTL, phase, previous holder and how it ended),
//!   the checkpoint and the fencing counter never expire; only `live`
//!   carries a TTL.
//! * **Atomicity and clock.** Each operation is one Lua script
//!   ([`redis::Script`]: called by SHA with `EVALSHA`, loaded again on
//!   `NOSCRIPT`). A lease is live exactly while its `live` key exists, so
//!   expiry is judged by the server's own clock, to the millisecond: TTLs
//!   are set with `PX`/`PEXPIRE`, rounded up to whole milliseconds, and
//!   Redis keeps a key until its clock has passed the expiry, so the store
//!   never ends a lease before its holder's deadline.
//! * **Fencing.** Tokens come from a per-work-ID counter (`INCR`) that
//!   never expires; an acquisition also takes the maximum with the state's
//!   last token, so a counter deleted or set back by hand cannot hand out
//!   an old token, and neither can an expired, released or deleted `live`
//!   key. Tokens are per work ID (the counter shares the work ID's slot);
//!   the SQLite and memory stores' tokens also increase across work IDs.
//! * **Notifications.** A release or a revocation `PUBLISH`es the work ID
//!   on one channel per prefix and database. A store that has waiters
//!   keeps one subscriber connection (opened with its first waiter, and
//!   subscribed before that waiter's next attempt) that wakes this
//!   process's waiters of the work ID at once; after a dropped connection
//!   it resubscribes and wakes every waiter, since announcements made
//!   meanwhile are lost. Waiters poll as well, so a lost announcement costs
//!   at most a poll interval. Every subscribed store receives every
//!   announcement under its prefix (one delivery per store per release);
//!   a store that never waits receives none. An acquisition (also a
//!   takeover of an expired lease) announces nothing: it makes no lease
//!   free, and waking waiters would only earn them a `Held`.
//! * **Replication.** [`RedisConfig::wait_for_replicas`] (URL:
//!   `wait_replicas=N&wait_timeout_ms=T`) makes every successful
//!   acquisition run `WAIT N T` on the same connection, and fail with a
//!   store error when fewer than N replicas acknowledged it in time; the
//!   acquisition is then ended as if it had expired, so nobody holds it
//!   and the next holder sees no clean hand-off. Such acquisitions use a
//!   connection of their own, since `WAIT` blocks its connection.
//!
//! What Redis cannot promise, plainly:
//!
//! * **Failover can lose the newest writes.** Redis replicates
//!   asynchronously: a primary that fails before a write reached a replica
//!   loses it when the replica is promoted. The new primary may then not
//!   know of a live lease (a second holder gets it: mutual exclusion, S1,
//!   then rests on downstream systems checking fencing tokens), or may
//!   hand out a fencing token again, and may lose an acknowledged
//!   checkpoint. `wait_for_replicas` narrows this (a lease is only granted
//!   once N replicas have it) but does not close it: `WAIT` does not make
//!   Redis strongly consistent, and renewals and checkpoints are not
//!   waited for.
//! * **Without persistence a restart resets everything**: live leases are
//!   forgotten (a second holder can take one whose holder still believes
//!   in it), fencing counters start again from 1 (S2 broken, so fencing
//!   cannot catch that second holder) and checkpoints are gone. Run with
//!   `appendonly yes` (and `appendfsync always` for tokens that survive a
//!   power loss, since the default `everysec` can lose the last second).
//! * **Redis's clock is its host's wall clock.** Key expiry compares an
//!   absolute Unix time with the server's `gettimeofday`: a forward step of
//!   that clock (not a slew) ends leases early, while their holders, which
//!   count on their own monotonic clocks, still believe in them; S1 then
//!   rests on fencing tokens. Let NTP slew the server's clock, never step
//!   it. Redis offers scripts no monotonic clock to do better with.
//! * **Eviction.** Under `maxmemory` with an `allkeys-*` policy Redis may
//!   evict fencing counters and checkpoints. Use `noeviction` or a
//!   `volatile-*` policy (only `live` keys have a TTL); the store logs a
//!   warning when it can see an `allkeys-*` policy.
//!
//! Not supported yet: Redis Cluster and Sentinel clients (the key layout is
//! ready for Cluster; `inspect` would have to scan every primary), TLS
//! (`rediss://`: the `redis` crate's rustls support needs a crypto
//! provider chosen and installed by the application), Unix sockets.
//!
//! URL: `redis://[USER:PASSWORD@]HOST[:PORT][/DB][?prefix=P&wait_replicas=N&wait_timeout_ms=T&protocol=resp2|resp3]`
//! ([`RedisConfig::from_url`]). The commands use RESP3 by default (its
//! connection notices a drop at once); `protocol=resp2` opts out, for a
//! server that cannot speak RESP3.

mod keys;
mod subscriber;

use std::collections::BTreeSet;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{
    ErrorKind, ProtocolVersion, RedisError, Script, ScriptInvocation, ServerErrorKind, Value,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, InvalidInput, Result, StoreError};
use crate::limits::{ceil_millis, HolderId, WorkId};
use crate::store::record::{self, Phase};
use crate::store::url_parts::{redact, url_error};
use crate::store::{
    Checkpoint, Grant, Handoff, LeaseEnd, LeaseInfo, LeaseRef, LeaseStore, PreviousHolder,
};

pub use keys::{LeaseKeys, MAX_PREFIX_BYTES};
use subscriber::{SubState, Subscription, Wakeups};

const KIND: &str = "redis";

/// The key prefix when none is given.
pub const DEFAULT_PREFIX: &str = "worklease:";
/// How long connecting to the server may take, by default.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server may take to answer one command, by default.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How many keys one `SCAN` step asks for when listing every lease.
const SCAN_COUNT: usize = 1000;

/// The query parameters of the URL that the store reads itself.
const OUR_PARAMS: &[&str] = &["prefix", "wait_replicas", "wait_timeout_ms"];
/// The query parameters passed on to the `redis` crate.
const CLIENT_PARAMS: &[&str] = &["protocol"];

macro_rules! script {
    ($file:literal) => {
        Script::new(concat!(
            include_str!("redis/common.lua"),
            include_str!(concat!("redis/", $file))
        ))
    };
}

/// The store's scripts, each with the shared prelude.
struct Scripts {
    acquire: Script,
    renew: Script,
    checkpoint: Script,
    read: Script,
    release: Script,
    abandon: Script,
    revoke: Script,
    inspect: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    acquire: script!("acquire.lua"),
    renew: script!("renew.lua"),
    checkpoint: script!("checkpoint.lua"),
    read: script!("read.lua"),
    release: script!("release.lua"),
    abandon: script!("abandon.lua"),
    revoke: script!("revoke.lua"),
    inspect: script!("inspect.lua"),
});

/// The `WAIT` an acquisition runs before it counts as granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitForReplicas {
    /// How many replicas must acknowledge the acquisition.
    pub replicas: u32,
    /// How long to wait for them.
    pub timeout: Duration,
}

/// Where and how a [`RedisStore`] connects. Its `Debug` form shows the URL
/// without its password.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// The URL for the `redis` crate: the given one without our parameters.
    server_url: String,
    db: i64,
    prefix: String,
    wait: Option<WaitForReplicas>,
    connection_timeout: Duration,
    response_timeout: Duration,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact(&self.to_url()))
            .field("prefix", &self.prefix)
            .field("wait", &self.wait)
            .field("connection_timeout", &self.connection_timeout)
            .field("response_timeout", &self.response_timeout)
            .finish()
    }
}

/// A replica wait, or why it cannot be one.
fn checked_wait(replicas: u32, timeout: Duration) -> std::result::Result<WaitForReplicas, String> {
    if replicas == 0 {
        return Err("the replica wait needs at least 1 replica".to_string());
    }
    if timeout < Duration::from_millis(1) {
        return Err(format!(
            "the replica wait timeout is {timeout:?}: it must be at least 1ms \
             (WAIT with timeout 0 would block forever)"
        ));
    }
    Ok(WaitForReplicas { replicas, timeout })
}

impl RedisConfig {
    /// Parses `redis://[USER:PASSWORD@]HOST[:PORT][/DB][?PARAMS]`. The
    /// parameters: `prefix` (the key prefix, percent-decoded; default
    /// [`DEFAULT_PREFIX`]), `wait_replicas` and `wait_timeout_ms` (both or
    /// neither: see [`RedisConfig::wait_for_replicas`]), and `protocol`
    /// (`resp2` or `resp3`, the default).
    ///
    /// # Errors
    /// [`InvalidInput::StoreUrl`], with the URL redacted, for a URL that
    /// does not parse, another scheme (`rediss://` included: no TLS in this
    /// version), an unknown parameter, a bad database number, prefix or
    /// wait setting.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = url.trim();
        let mut parsed = redis::parse_redis_url(url).ok_or_else(|| {
            url_error(
                url,
                "not a valid Redis URL: write redis://HOST:PORT/DB?prefix=PREFIX",
            )
        })?;
        match parsed.scheme() {
            "redis" => {}
            "rediss" => {
                return Err(url_error(
                    url,
                    "TLS (rediss://) is not supported by this version of worklease's Redis store: \
                     use redis:// on a trusted network or through a TLS tunnel",
                ))
            }
            other => {
                return Err(url_error(
                    url,
                    format!("the Redis store takes redis:// URLs, not {other}://"),
                ))
            }
        }
        let mut prefix = DEFAULT_PREFIX.to_string();
        let mut replicas: Option<u32> = None;
        let mut wait_ms: Option<u64> = None;
        let mut kept = Vec::new();
        // A parameter given twice is refused: "last one wins" would let a
        // copy-paste slip put two fleets under two prefixes.
        let mut seen = std::collections::HashSet::new();
        for (key, value) in parsed.query_pairs() {
            if !seen.insert(key.clone().into_owned()) {
                return Err(url_error(
                    url,
                    format!("the parameter {key:?} appears twice"),
                ));
            }
            match key.as_ref() {
                "prefix" => prefix = value.into_owned(),
                "wait_replicas" => {
                    replicas = Some(value.parse().map_err(|_| {
                        url_error(
                            url,
                            format!("wait_replicas={value:?} is not a whole number"),
                        )
                    })?)
                }
                "wait_timeout_ms" => {
                    wait_ms = Some(value.parse().map_err(|_| {
                        url_error(
                            url,
                            format!(
                                "wait_timeout_ms={value:?} is not a whole number of milliseconds"
                            ),
                        )
                    })?)
                }
                k if CLIENT_PARAMS.contains(&k) => {
                    kept.push((key.into_owned(), value.into_owned()))
                }
                other => {
                    return Err(url_error(
                        url,
                        format!(
                            "unknown parameter {other:?}: the accepted ones are {}",
                            OUR_PARAMS
                                .iter()
                                .chain(CLIENT_PARAMS)
                                .copied()
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ))
                }
            }
        }
        parsed.set_query(None);
        if !kept.is_empty() {
            parsed.query_pairs_mut().extend_pairs(kept);
        }
        let server_url = parsed.to_string();
        let client = redis::Client::open(server_url.as_str())
            .map_err(|e| url_error(url, format!("the Redis client refuses it: {e}")))?;
        let db = client.get_connection_info().redis_settings().db();
        if let Some(reason) = keys::check_prefix(&prefix) {
            return Err(url_error(url, reason));
        }
        let wait = match (replicas, wait_ms) {
            (None, None) => None,
            (Some(n), Some(ms)) => {
                Some(checked_wait(n, Duration::from_millis(ms)).map_err(|r| url_error(url, r))?)
            }
            _ => {
                return Err(url_error(
                    url,
                    "wait_replicas and wait_timeout_ms go together: give both or neither",
                ))
            }
        };
        Ok(Self {
            server_url,
            db,
            prefix,
            wait,
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
        })
    }

    /// Sets the key prefix: every key and the release channel start with
    /// it. Stores with different prefixes share nothing.
    ///
    /// # Errors
    /// [`InvalidInput::Config`] for a prefix longer than
    /// [`MAX_PREFIX_BYTES`] or with `{`, `}` or control characters.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Result<Self> {
        let prefix = prefix.into();
        if let Some(reason) = keys::check_prefix(&prefix) {
            return Err(InvalidInput::Config(reason).into());
        }
        self.prefix = prefix;
        Ok(self)
    }

    /// The key prefix.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// The database number.
    pub fn db(&self) -> i64 {
        self.db
    }

    /// Makes every successful acquisition wait with `WAIT replicas timeout`
    /// until that many replicas have it, and fail with a store error when
    /// fewer acknowledged it in time (see the module docs for what this
    /// does and does not promise). `WAIT` is pipelined behind the acquire
    /// script on a connection of its own, so that it covers that script's
    /// writes even across a reconnection; an attempt that finds the lease
    /// `Held` waits too, for the connection's earlier writes (at once when
    /// the replicas keep up).
    ///
    /// # Errors
    /// [`InvalidInput::Config`] for zero replicas or a timeout under 1 ms
    /// (`WAIT` with timeout 0 would block forever).
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Result<Self> {
        self.wait = Some(checked_wait(replicas, timeout).map_err(InvalidInput::Config)?);
        Ok(self)
    }

    /// Whether the URL chose the protocol (`protocol=`).
    fn protocol_given(&self) -> bool {
        redis::parse_redis_url(&self.server_url)
            .is_some_and(|u| u.query_pairs().any(|(k, _)| k == "protocol"))
    }

    /// The replica wait of acquisitions, if any.
    pub fn get_wait_for_replicas(&self) -> Option<WaitForReplicas> {
        self.wait
    }

    /// How long connecting may take (default
    /// [`DEFAULT_CONNECTION_TIMEOUT`]).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// How long the server may take to answer one command (default
    /// [`DEFAULT_RESPONSE_TIMEOUT`]; an acquisition with a replica wait
    /// gets the wait's timeout on top).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// The URL of this configuration, password included (show it only
    /// through [`redact`]): the server URL with the prefix and replica wait
    /// as parameters. The timeouts are not part of it.
    pub fn to_url(&self) -> String {
        let mut ours: Vec<(&str, String)> = Vec::new();
        if self.prefix != DEFAULT_PREFIX {
            ours.push(("prefix", self.prefix.clone()));
        }
        if let Some(w) = self.wait {
            ours.push(("wait_replicas", w.replicas.to_string()));
            ours.push(("wait_timeout_ms", ceil_millis(w.timeout).to_string()));
        }
        match redis::parse_redis_url(&self.server_url) {
            Some(mut u) if !ours.is_empty() => {
                u.query_pairs_mut().extend_pairs(ours);
                u.to_string()
            }
            _ => self.server_url.clone(),
        }
    }
}

/// The connections of a store, opened with its first operation.
struct Connections {
    /// Every script runs here (multiplexed: concurrent calls share it).
    main: ConnectionManager,
    /// Acquisitions followed by `WAIT`, when a replica wait is set.
    acquire: Option<ConnectionManager>,
}

/// The Redis store. See the module docs for its guarantees and what Redis
/// cannot promise. Share one value per process (in an `Arc`): each value
/// keeps a command connection, and a subscriber connection once it has
/// waiters.
pub struct RedisStore {
    config: RedisConfig,
    client: redis::Client,
    connections: tokio::sync::OnceCell<Connections>,
    wakeups: Arc<Wakeups>,
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

fn store_err(what: &str, e: RedisError) -> Error {
    StoreError::with_source(KIND, what.to_string(), e).into()
}

fn bad_reply(what: &str) -> Error {
    StoreError::new(KIND, format!("unexpected reply from the server: {what}")).into()
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
        let client =
            redis::Client::open(info).map_err(|e| store_err("invalid connection settings", e))?;
        Ok(Self {
            config,
            client,
            connections: tokio::sync::OnceCell::new(),
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
    /// As [`RedisStore::ready`].
    pub async fn connection(&self) -> Result<ConnectionManager> {
        Ok(self.connections().await?.main.clone())
    }

    async fn manager(&self, response_timeout: Duration) -> Result<ConnectionManager> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.config.connection_timeout))
            .set_response_timeout(Some(response_timeout));
        ConnectionManager::new_with_config(self.client.clone(), config)
            .await
            .map_err(|e| {
                store_err(
                    &format!("cannot connect to {}", redact(&self.config.server_url)),
                    e,
                )
            })
    }

    async fn connections(&self) -> Result<&Connections> {
        self.connections
            .get_or_try_init(|| async {
                let main = self.manager(self.config.response_timeout).await?;
                let acquire = match self.config.wait {
                    Some(w) => Some(
                        self.manager(self.config.response_timeout + w.timeout)
                            .await?,
                    ),
                    None => None,
                };
                warn_on_eviction_policy(&main).await;
                Ok(Connections { main, acquire })
            })
            .await
    }

    /// Starts the subscriber task if it is not running; false where it
    /// cannot run (no tokio runtime here, or a poisoned lock).
    fn start_subscriber(&self) -> bool {
        let Ok(mut current) = self.subscription.lock() else {
            return false;
        };
        if current.is_some() {
            return true;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        // Pub/sub on RESP2: a connection of its own in subscriber mode.
        let info = self.client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP2);
        let Ok(client) = redis::Client::open(info.set_redis_settings(settings)) else {
            return false;
        };
        let subscription = Subscription {
            client,
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
    async fn first_subscription(&self) {
        let watched = self.subscription.lock().ok().and_then(|s| s.clone());
        if let Some(mut watched) = watched {
            if *watched.borrow() == SubState::Starting {
                let limit = self.config.connection_timeout + self.config.response_timeout;
                let settled = watched.wait_for(|s| *s != SubState::Starting);
                let _ = tokio::time::timeout(limit, settled).await;
            }
        }
    }

    /// Runs a script on the command connection and returns its reply's
    /// elements.
    ///
    /// A request that meets a connection the server (or the network) had
    /// already dropped — `is_connection_dropped`: broken pipe, reset,
    /// unexpected EOF — is tried once more: the connection manager has
    /// reconnected by then. That is safe for every script run here: each
    /// is conditioned on the work ID, holder and fencing token, so running
    /// one twice cannot break S1–S3 (at worst a release that did apply
    /// reports `Expired`). Without it, the first call after a dropped
    /// connection failed although the server was fine (issue 9's
    /// `network_faults` test, "after a cut the next operation reconnects").
    async fn run(&self, invocation: &ScriptInvocation<'_>, what: &str) -> Result<Vec<Value>> {
        let mut conn = self.connections().await?.main.clone();
        let reply: Value = match invocation.invoke_async(&mut conn).await {
            Err(e) if e.is_connection_dropped() => {
                tracing::debug!(error = %e, "the connection had been dropped: trying once more");
                invocation.invoke_async(&mut conn).await
            }
            other => other,
        }
        .map_err(|e| store_err(what, e))?;
        array(reply)
    }

    /// Runs the acquire script then `WAIT` in one pipeline on the
    /// acquisition connection; returns the script's reply and the number of
    /// replicas that acknowledged.
    async fn run_and_wait(
        &self,
        conn: &ConnectionManager,
        invocation: &ScriptInvocation<'_>,
        wait: WaitForReplicas,
    ) -> Result<(Vec<Value>, i64)> {
        let mut conn = conn.clone();
        let pipeline = || {
            let mut p = redis::pipe();
            p.invoke_script(invocation)
                .cmd("WAIT")
                .arg(wait.replicas)
                .arg(ceil_millis(wait.timeout));
            p
        };
        let mut result: redis::RedisResult<(Value, i64)> = pipeline().query_async(&mut conn).await;
        if matches!(&result, Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)) {
            invocation
                .load_async(&mut conn)
                .await
                .map_err(|e| store_err("cannot load the acquire script", e))?;
            result = pipeline().query_async(&mut conn).await;
        }
        let (reply, acked) = result.map_err(|e| store_err("acquire", e))?;
        Ok((array(reply)?, acked))
    }

    /// Runs a script that names `lease` and ends in `ok`, `fenced` or
    /// `expired`; returns the reply's elements after the status.
    async fn run_on_lease(
        &self,
        lease: LeaseRef<'_>,
        invocation: &ScriptInvocation<'_>,
        what: &str,
    ) -> Result<Vec<Value>> {
        let mut reply = self.run(invocation, what).await?;
        let status = text(reply.first(), "status")?;
        match status.as_str() {
            "ok" => Ok(reply.split_off(1)),
            "fenced" => Err(record::fenced(lease)),
            "expired" => Err(Error::Expired {
                work_id: lease.work_id.to_string(),
                fencing_token: lease.fencing_token,
            }),
            other => Err(bad_reply(&format!("status {other:?}"))),
        }
    }

    fn channel(&self) -> String {
        keys::channel(&self.config.prefix, self.config.db)
    }

    async fn inspect_one(&self, work_id: WorkId) -> Result<Option<LeaseInfo>> {
        let keys = self.lease_keys(&work_id);
        let mut inv = SCRIPTS.inspect.prepare_invoke();
        inv.key(&keys.state).key(&keys.live).key(&keys.checkpoint);
        let reply = self.run(&inv, "inspect").await?;
        match text(reply.first(), "status")?.as_str() {
            "none" => Ok(None),
            "ok" => Ok(Some(lease_info(work_id, reply.get(1))?)),
            other => Err(bad_reply(&format!("status {other:?}"))),
        }
    }

    /// Every work ID with a state hash under the prefix.
    async fn scan_work_ids(&self) -> Result<BTreeSet<WorkId>> {
        let mut conn = self.connections().await?.main.clone();
        let pattern = keys::state_pattern(&self.config.prefix);
        let mut ids = BTreeSet::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .query_async(&mut conn)
                .await
                .map_err(|e| store_err("cannot list the leases (SCAN)", e))?;
            ids.extend(
                keys.iter()
                    .filter_map(|k| keys::work_id_of_state_key(&self.config.prefix, k)),
            );
            if next == 0 {
                return Ok(ids);
            }
            cursor = next;
        }
    }
}

/// Warns when the server may evict keys that must never go.
async fn warn_on_eviction_policy(conn: &ConnectionManager) {
    let mut conn = conn.clone();
    let policy: redis::RedisResult<std::collections::HashMap<String, String>> =
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(&mut conn)
            .await;
    match policy {
        Ok(p) => {
            if let Some(policy) = p
                .get("maxmemory-policy")
                .filter(|p| p.starts_with("allkeys"))
            {
                tracing::warn!(
                    policy = %policy,
                    "Redis may evict fencing counters and checkpoints under memory pressure \
                     (maxmemory-policy {policy}): use noeviction or a volatile-* policy"
                );
            }
        }
        Err(e) => tracing::debug!(error = %e, "cannot read the Redis eviction policy"),
    }
}

fn array(v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(bad_reply(&format!("{other:?}"))),
    }
}

/// The bytes of a string reply; `None` for a nil (RESP2) or a Lua `false`
/// (a RESP3 boolean).
fn opt_bytes<'a>(v: Option<&'a Value>, what: &str) -> Result<Option<&'a [u8]>> {
    match v {
        None | Some(Value::Nil) | Some(Value::Boolean(false)) => Ok(None),
        Some(Value::BulkString(b)) => Ok(Some(b)),
        Some(Value::SimpleString(s)) => Ok(Some(s.as_bytes())),
        Some(Value::VerbatimString { text, .. }) => Ok(Some(text.as_bytes())),
        Some(other) => Err(bad_reply(&format!("{what}: {other:?}"))),
    }
}

fn opt_text(v: Option<&Value>, what: &str) -> Result<Option<String>> {
    opt_bytes(v, what)?
        .map(|b| {
            String::from_utf8(b.to_vec()).map_err(|_| bad_reply(&format!("{what} is not UTF-8")))
        })
        .transpose()
}

fn text(v: Option<&Value>, what: &str) -> Result<String> {
    opt_text(v, what)?.ok_or_else(|| bad_reply(&format!("{what} is missing")))
}

fn opt_int(v: Option<&Value>, what: &str) -> Result<Option<i64>> {
    match v {
        Some(Value::Int(i)) => Ok(Some(*i)),
        other => opt_text(other, what)?
            .map(|s| {
                s.parse()
                    .map_err(|_| bad_reply(&format!("{what} {s:?} is not a number")))
            })
            .transpose(),
    }
}

fn int(v: Option<&Value>, what: &str) -> Result<i64> {
    opt_int(v, what)?.ok_or_else(|| bad_reply(&format!("{what} is missing")))
}

fn opt_token(v: Option<&Value>, what: &str) -> Result<Option<u64>> {
    opt_text(v, what)?
        .map(|s| {
            s.parse()
                .map_err(|_| bad_reply(&format!("{what} {s:?} is not a fencing token")))
        })
        .transpose()
}

fn token(v: Option<&Value>, what: &str) -> Result<u64> {
    opt_token(v, what)?.ok_or_else(|| bad_reply(&format!("{what} is missing")))
}

/// The previous holder from (holder, token, end) replies.
fn previous(items: &[Value]) -> Result<Option<PreviousHolder>> {
    let holder = opt_text(items.first(), "previous holder")?;
    let token = opt_token(items.get(1), "previous token")?;
    let end = opt_text(items.get(2), "previous end")?;
    Ok(match (holder, token, end) {
        (Some(holder_id), Some(fencing_token), Some(end)) => Some(PreviousHolder {
            holder_id,
            fencing_token,
            ended: LeaseEnd::from_str(&end)
                .ok_or_else(|| bad_reply(&format!("previous end {end:?}")))?,
        }),
        _ => None,
    })
}

/// A duration in milliseconds from a signed difference: `base` moved by
/// `delta_ms`.
fn shifted(base: SystemTime, delta_ms: i64) -> SystemTime {
    let d = Duration::from_millis(delta_ms.unsigned_abs());
    if delta_ms >= 0 {
        base + d
    } else {
        base.checked_sub(d).unwrap_or(SystemTime::UNIX_EPOCH)
    }
}

/// A [`LeaseInfo`] from the `info` reply of the scripts: holder, token,
/// ttl, phase, exp, prev_holder, prev_token, prev_end, pttl, checkpoint
/// length, server now.
fn lease_info(work_id: WorkId, v: Option<&Value>) -> Result<LeaseInfo> {
    let items = match v {
        Some(Value::Array(items)) => items,
        other => return Err(bad_reply(&format!("lease info {other:?}"))),
    };
    let holder_id = text(items.first(), "holder")?;
    let fencing_token = token(items.get(1), "token")?;
    let phase_text = text(items.get(3), "phase")?;
    let phase =
        Phase::parse(&phase_text).ok_or_else(|| bad_reply(&format!("phase {phase_text:?}")))?;
    let exp = opt_int(items.get(4), "expiry")?;
    let previous = previous(items.get(5..8).unwrap_or(&[]))?;
    let pttl = int(items.get(8), "PTTL")?;
    let checkpoint_bytes = int(items.get(9), "checkpoint length")?;
    let server_now = int(items.get(10), "server time")?;
    let live = phase == Phase::Held && pttl != -2;
    let expires_in = (live && pttl >= 0).then(|| Duration::from_millis(pttl.unsigned_abs()));
    let now = SystemTime::now();
    let expires_at = match (expires_in, exp) {
        (Some(left), _) => now + left,
        (None, Some(exp)) => shifted(now, exp.saturating_sub(server_now)),
        (None, None) => now,
    };
    let ended = (!live).then_some(match phase {
        Phase::Held => LeaseEnd::Expired,
        Phase::Released => LeaseEnd::Released,
        Phase::Revoked => LeaseEnd::Revoked,
    });
    Ok(LeaseInfo {
        work_id,
        holder_id,
        fencing_token,
        expires_at,
        expires_in,
        expired: !live,
        released: phase == Phase::Released,
        ended,
        checkpoint_bytes: usize::try_from(checkpoint_bytes).unwrap_or(0),
        handoff: Handoff { previous },
    })
}

#[async_trait]
impl LeaseStore for RedisStore {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn acquire(
        &self,
        work_id: &WorkId,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> Result<Grant> {
        let keys = self.lease_keys(work_id);
        let mut inv = SCRIPTS.acquire.prepare_invoke();
        inv.key(&keys.state)
            .key(&keys.live)
            .key(&keys.fence)
            .arg(holder_id.as_str())
            .arg(ceil_millis(ttl));
        let connections = self.connections().await?;
        self.first_subscription().await;
        let (reply, acked) = match (&connections.acquire, self.config.wait) {
            (Some(conn), Some(wait)) => {
                let (reply, acked) = self.run_and_wait(conn, &inv, wait).await?;
                (reply, Some((acked, wait)))
            }
            _ => (self.run(&inv, "acquire").await?, None),
        };
        match text(reply.first(), "status")?.as_str() {
            "held" => {
                let pttl = int(reply.get(2), "PTTL")?;
                return Err(Error::Held {
                    work_id: work_id.to_string(),
                    holder_id: opt_text(reply.get(1), "holder")?
                        .unwrap_or_else(|| "(unknown)".to_string()),
                    expires_in: u64::try_from(pttl).ok().map(Duration::from_millis),
                });
            }
            "ok" => {}
            other => return Err(bad_reply(&format!("status {other:?}"))),
        }
        let fencing_token = token(reply.get(1), "token")?;
        let handoff = Handoff {
            previous: previous(reply.get(2..5).unwrap_or(&[]))?,
        };
        if let Some((acked, wait)) = acked {
            if acked < i64::from(wait.replicas) {
                let mut inv = SCRIPTS.abandon.prepare_invoke();
                inv.key(&keys.state)
                    .key(&keys.live)
                    .arg(holder_id.as_str())
                    .arg(fencing_token)
                    .arg(self.channel())
                    .arg(work_id.as_str());
                if let Err(e) = self.run(&inv, "abandon an unreplicated acquisition").await {
                    tracing::warn!(work_id = %work_id, error = %e, "cannot end an acquisition too few replicas acknowledged: it expires with its TTL");
                }
                return Err(StoreError::new(
                    KIND,
                    format!(
                        "only {acked} of the {} replicas asked for acknowledged the acquisition of {work_id:?} within {:?}: not granted",
                        wait.replicas, wait.timeout
                    ),
                )
                .into());
            }
        }
        Ok(Grant {
            fencing_token,
            expires_at: SystemTime::now() + ttl,
            handoff,
        })
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        let keys = self.lease_keys(lease.work_id);
        let mut inv = SCRIPTS.renew.prepare_invoke();
        inv.key(&keys.state)
            .key(&keys.live)
            .arg(lease.holder_id.as_str())
            .arg(lease.fencing_token)
            .arg(ceil_millis(ttl));
        self.run_on_lease(lease, &inv, "renew").await?;
        Ok(SystemTime::now() + ttl)
    }

    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime> {
        let keys = self.lease_keys(lease.work_id);
        let mut inv = SCRIPTS.checkpoint.prepare_invoke();
        inv.key(&keys.state)
            .key(&keys.live)
            .key(&keys.checkpoint)
            .arg(lease.holder_id.as_str())
            .arg(lease.fencing_token)
            .arg(ceil_millis(ttl))
            .arg(data.as_ref());
        self.run_on_lease(lease, &inv, "checkpoint").await?;
        Ok(SystemTime::now() + ttl)
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        let keys = self.lease_keys(lease.work_id);
        let mut inv = SCRIPTS.read.prepare_invoke();
        inv.key(&keys.state)
            .key(&keys.live)
            .key(&keys.checkpoint)
            .arg(lease.holder_id.as_str())
            .arg(lease.fencing_token);
        let reply = self.run_on_lease(lease, &inv, "read checkpoint").await?;
        Ok(Checkpoint {
            data: opt_bytes(reply.first(), "checkpoint")?.map(Bytes::copy_from_slice),
            handoff: Handoff {
                previous: previous(reply.get(1..4).unwrap_or(&[]))?,
            },
        })
    }

    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        let keys = self.lease_keys(lease.work_id);
        let mut inv = SCRIPTS.release.prepare_invoke();
        inv.key(&keys.state)
            .key(&keys.live)
            .arg(lease.holder_id.as_str())
            .arg(lease.fencing_token)
            .arg(self.channel())
            .arg(lease.work_id.as_str());
        self.run_on_lease(lease, &inv, "release").await?;
        Ok(())
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        super::inspect_each(work_ids, self.scan_work_ids(), |id| self.inspect_one(id)).await
    }

    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        let keys = self.lease_keys(work_id);
        let mut inv = SCRIPTS.revoke.prepare_invoke();
        inv.key(&keys.state)
            .key(&keys.live)
            .key(&keys.checkpoint)
            .arg(self.channel())
            .arg(work_id.as_str());
        let reply = self.run(&inv, "revoke").await?;
        match text(reply.first(), "status")?.as_str() {
            "none" => Ok(None),
            "ok" => Ok(Some(lease_info(work_id.clone(), reply.get(1))?)),
            other => Err(bad_reply(&format!("status {other:?}"))),
        }
    }

    /// Registers the waiter, then starts the subscription if this is the
    /// store's first waiter. The subscription is confirmed before the
    /// store's next acquisition attempt runs (see `first_subscription`),
    /// which is what a waiter does after `watch`: a release after that
    /// attempt is announced to it, one before it is seen by the attempt.
    fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        let one = self.wakeups.watchers.watch(work_id)?;
        if !self.start_subscriber() {
            return None;
        }
        let mut all = self.wakeups.resubscribed.subscribe();
        Some(Box::pin(async move {
            tokio::select! {
                () = one => {}
                // An error means the store is gone: nothing more will change.
                _ = all.changed() => {}
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(url: &str) -> String {
        match RedisConfig::from_url(url) {
            Err(Error::Invalid(InvalidInput::StoreUrl { url, reason })) => {
                format!("{url} | {reason}")
            }
            other => panic!("expected a StoreUrl error for {url:?}, got {other:?}"),
        }
    }

    #[test]
    fn urls_parse_with_prefix_db_and_wait() {
        let c = RedisConfig::from_url("redis://127.0.0.1:6379/3").unwrap();
        assert_eq!(
            (c.get_prefix(), c.db(), c.get_wait_for_replicas()),
            (DEFAULT_PREFIX, 3, None)
        );
        assert_eq!(c.to_url(), "redis://127.0.0.1:6379/3");
        let c = RedisConfig::from_url(
            "redis://h/0?prefix=jobs%3Aprod%2F&wait_replicas=2&wait_timeout_ms=150&protocol=resp2",
        )
        .unwrap();
        assert_eq!(c.get_prefix(), "jobs:prod/");
        assert_eq!(
            c.get_wait_for_replicas(),
            Some(WaitForReplicas {
                replicas: 2,
                timeout: Duration::from_millis(150)
            })
        );
        assert!(!c.server_url.contains("prefix"), "{}", c.server_url);
        assert!(c.server_url.contains("protocol=resp2"), "{}", c.server_url);
        // The URL round-trips.
        assert_eq!(RedisConfig::from_url(&c.to_url()).unwrap(), c);
    }

    #[test]
    fn bad_urls_are_refused_clearly_and_redacted() {
        let r = reason("redis://app:s3cret@h/0?prefix=a:&prefix=b:");
        assert!(
            r.contains("\"prefix\" appears twice") && !r.contains("s3cret"),
            "{r}"
        );
        let r = reason("redis://app:s3cret@h/0?prefx=a");
        assert!(
            r.contains("unknown parameter \"prefx\"") && r.contains("prefix"),
            "{r}"
        );
        assert!(!r.contains("s3cret") && r.contains("app:***@h"), "{r}");
        assert!(
            reason("redis://h/notadb").contains("database"),
            "{}",
            reason("redis://h/notadb")
        );
        assert!(reason("rediss://h/0").contains("TLS"));
        assert!(reason("redis://h/0?prefix=a%7Bb").contains("braces"));
        assert!(reason("redis://h/0?wait_replicas=1").contains("go together"));
        assert!(
            reason("redis://h/0?wait_replicas=0&wait_timeout_ms=5").contains("at least 1 replica")
        );
        assert!(reason("redis://h/0?wait_replicas=1&wait_timeout_ms=0").contains("at least 1ms"));
        assert!(reason("redis://h/0?wait_replicas=x&wait_timeout_ms=1").contains("whole number"));
        let c = RedisConfig::from_url("redis://:pw@h/0").unwrap();
        assert!(!format!("{c:?}").contains("pw@"), "{c:?}");
        let store = RedisStore::new(c).unwrap();
        assert!(!format!("{store:?}").contains("pw@"), "{store:?}");
    }
}
