//! The configuration of the Redis store: its `redis://` URL (parsed,
//! written back and redacted), the key prefix, the timeouts and the replica
//! wait of writes.

use std::time::Duration;

use crate::error::{InvalidInput, Result};
use crate::limits::ceil_millis;
use crate::store::url_parts::{redact, url_error};
use crate::store::url_query::QueryParams;

use super::keys;
use super::topology::{self, Topology};
#[cfg(doc)]
use super::{RedisStore, MAX_PREFIX_BYTES};
#[cfg(feature = "redis-tls")]
use crate::store::tls_files::TlsFiles;

/// The key prefix when none is given.
pub const DEFAULT_PREFIX: &str = "worklease:";
/// How long connecting to the server may take, by default.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server may take to answer one command, by default.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The most replicas a replica wait may ask for: far above any real
/// deployment's, a bound that catches a typo.
pub const MAX_WAIT_REPLICAS: u32 = 1_000;
/// The longest replica wait: a write that waits longer for its replicas is
/// one whose lease is better given up (a renewal that waits that long has
/// let most leases expire), and `WAIT` blocks its connection meanwhile.
pub const MAX_WAIT_TIMEOUT: Duration = Duration::from_secs(60);

/// The query parameters of the URL: the store's own, then `protocol`
/// (passed on to the `redis` crate), then the TLS files (`rediss://`
/// only).
const PARAMS: &[&str] = &[
    "prefix",
    "wait_replicas",
    "wait_timeout_ms",
    "protocol",
    "cacert",
    "cert",
    "key",
];

/// The `WAIT` every write runs before it counts as done.
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
    pub(super) server_url: String,
    /// One server, or the sentinels of a primary (then `server_url` holds
    /// the first sentinel's address, a placeholder).
    pub(super) topology: Topology,
    pub(super) db: i64,
    pub(super) prefix: String,
    pub(super) wait: Option<WaitForReplicas>,
    /// The TLS files of a `rediss://` URL (`None` for `redis://`).
    #[cfg(feature = "redis-tls")]
    pub(super) tls: Option<Box<TlsFiles>>,
    pub(super) connection_timeout: Duration,
    pub(super) response_timeout: Duration,
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
fn checked_wait(replicas: u64, timeout: Duration) -> std::result::Result<WaitForReplicas, String> {
    if replicas == 0 {
        return Err("the replica wait needs at least 1 replica".to_string());
    }
    let replicas = match u32::try_from(replicas) {
        Ok(n) if n <= MAX_WAIT_REPLICAS => n,
        _ => {
            return Err(format!(
                "the replica wait asks for {replicas} replicas: at most {MAX_WAIT_REPLICAS}"
            ))
        }
    };
    if timeout < Duration::from_millis(1) {
        return Err(format!(
            "the replica wait timeout is {timeout:?}: it must be at least 1ms \
             (WAIT with timeout 0 would block forever)"
        ));
    }
    if timeout > MAX_WAIT_TIMEOUT {
        return Err(format!(
            "the replica wait timeout is {timeout:?}: at most {MAX_WAIT_TIMEOUT:?}"
        ));
    }
    Ok(WaitForReplicas { replicas, timeout })
}

/// The whole number `value` of URL parameter `name`, from `min` to `max`,
/// or why it is not one (naming the range, `unit` after it).
fn whole_number(
    name: &str,
    value: &str,
    min: u64,
    max: u64,
    unit: &str,
) -> std::result::Result<u64, String> {
    match value.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{name}={value:?}: a whole number from {min} to {max}{unit} is needed"
        )),
    }
}

impl RedisConfig {
    /// Parses `redis://[USER:PASSWORD@]HOST[:PORT][/DB][?PARAMS]`, or
    /// `redis+sentinel://[USER:PASSWORD@]HOST[:PORT],HOST[:PORT].../PRIMARY[/DB][?PARAMS]`
    /// (the sentinels, port 26379 by default, and the name they know the
    /// primary by; the credentials are the primary's; `rediss://` and
    /// `rediss+sentinel://` with TLS), or
    /// `redis+cluster://[USER:PASSWORD@]HOST:PORT,HOST:PORT.../[?PARAMS]`
    /// (Cluster nodes to start from; `rediss+cluster://` with TLS). The
    /// parameters: `prefix` (the key prefix, percent-decoded; default
    /// [`DEFAULT_PREFIX`]), `wait_replicas` and `wait_timeout_ms` (both or
    /// neither: see [`RedisConfig::wait_for_replicas`]), and `protocol`
    /// (`resp2` or `resp3`, the default).
    ///
    /// # Errors
    /// [`InvalidInput::StoreUrl`], with the URL redacted, for a URL that
    /// does not parse, another scheme (`rediss://` in a build without
    /// `redis-tls`), an unknown parameter, a bad database number, prefix or
    /// wait setting.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = url.trim();
        let (topology, one_server) = match topology::split(url) {
            Some(split) => split.map_err(|why| url_error(url, why))?,
            None => (Topology::Server, url.to_string()),
        };
        let mut parsed = redis::parse_redis_url(&one_server).ok_or_else(|| {
            url_error(
                url,
                "not a valid Redis URL: write redis://HOST:PORT/DB?prefix=PREFIX",
            )
        })?;
        let tls =
            match parsed.scheme() {
                "redis" => false,
                "rediss" if cfg!(feature = "redis-tls") => true,
                "rediss" => return Err(url_error(
                    url,
                    "TLS (rediss://) needs the cargo feature `redis-tls`, which this build lacks",
                )),
                other => {
                    return Err(url_error(
                        url,
                        format!("the Redis store takes redis:// or rediss:// URLs, not {other}://"),
                    ))
                }
            };
        if parsed.fragment().is_some() {
            return Err(url_error(
                url,
                "a URL fragment (such as #insecure) is not accepted: \
                 certificates and host names are always verified",
            ));
        }
        let mut params =
            QueryParams::parse(parsed.query_pairs(), PARAMS).map_err(|r| url_error(url, r))?;
        let prefix = params
            .take("prefix")
            .map_or_else(|| DEFAULT_PREFIX.to_string(), |p| p.into_owned());
        let replicas = params
            .take("wait_replicas")
            .map(|n| whole_number("wait_replicas", &n, 1, MAX_WAIT_REPLICAS.into(), ""))
            .transpose()
            .map_err(|r| url_error(url, r))?;
        let max_ms = u64::try_from(MAX_WAIT_TIMEOUT.as_millis()).unwrap_or(u64::MAX);
        let unit = " (milliseconds; WAIT with 0 would block forever)";
        let wait_ms = params
            .take("wait_timeout_ms")
            .map(|n| whole_number("wait_timeout_ms", &n, 1, max_ms, unit))
            .transpose()
            .map_err(|r| url_error(url, r))?;
        let kept: Vec<(&str, String)> = params
            .take("protocol")
            .map(|p| ("protocol", p.into_owned()))
            .into_iter()
            .collect();
        // `cacert`, `cert` and `key`, percent-decoded.
        let files = ["cacert", "cert", "key"].map(|name| params.take(name).map(|p| p.into_owned()));
        if !tls && files.iter().any(Option::is_some) {
            return Err(url_error(
                url,
                "cacert, cert and key are TLS settings: write rediss:// to use TLS",
            ));
        }
        #[cfg(feature = "redis-tls")]
        let tls = match tls {
            false => None,
            true => {
                let [ca, cert, key] = files;
                let files = TlsFiles::read(ca, cert, key).map_err(|why| url_error(url, why))?;
                Some(Box::new(files))
            }
        };
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
            topology,
            db,
            prefix,
            wait,
            #[cfg(feature = "redis-tls")]
            tls,
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

    /// Makes every write (acquisition, renewal, checkpoint, release,
    /// revocation, each batch) wait with `WAIT replicas timeout` until
    /// that many replicas have it, and fail with a store error when fewer
    /// acknowledged it in time (see "Replica wait" in the module docs for
    /// what this does and does not promise, and what it costs). `WAIT` is
    /// pipelined behind the script on a connection of its own, so that it
    /// covers that script's writes even across a reconnection; a call that
    /// wrote nothing (an attempt that finds the lease `Held`) waits too,
    /// for the connection's earlier writes (at once when the replicas keep
    /// up).
    ///
    /// # Errors
    /// [`InvalidInput::Config`] for zero replicas or more than
    /// [`MAX_WAIT_REPLICAS`], a timeout under 1 ms (`WAIT` with timeout 0
    /// would block forever) or over [`MAX_WAIT_TIMEOUT`].
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Result<Self> {
        self.wait = Some(checked_wait(replicas.into(), timeout).map_err(InvalidInput::Config)?);
        Ok(self)
    }

    /// Whether the URL chose the protocol (`protocol=`).
    pub(super) fn protocol_given(&self) -> bool {
        redis::parse_redis_url(&self.server_url)
            .is_some_and(|u| u.query_pairs().any(|(k, _)| k == "protocol"))
    }

    /// The replica wait of writes, if any.
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
        #[cfg(feature = "redis-tls")]
        if let Some(tls) = &self.tls {
            ours.extend(tls.params());
        }
        let url = match redis::parse_redis_url(&self.server_url) {
            Some(mut u) if !ours.is_empty() => {
                u.query_pairs_mut().extend_pairs(ours);
                u.to_string()
            }
            _ => self.server_url.clone(),
        };
        topology::join(&self.topology, &url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::store::redis::RedisStore;

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
        if !cfg!(feature = "redis-tls") {
            assert!(reason("rediss://h/0").contains("redis-tls"));
        }
        assert!(reason("redis://h/0?cacert=%2Fca.pem").contains("write rediss://"));
        assert!(reason("redis://h/0#insecure").contains("always verified"));
        assert!(reason("redis://h/0?prefix=a%7Bb").contains("braces"));
        assert!(reason("redis://h/0?wait_replicas=1").contains("go together"));
        for (query, says) in [
            ("wait_replicas=0&wait_timeout_ms=5", "from 1 to 1000"),
            ("wait_replicas=x&wait_timeout_ms=1", "from 1 to 1000"),
            ("wait_replicas=-1&wait_timeout_ms=1", "from 1 to 1000"),
            (
                "wait_replicas=99999999999&wait_timeout_ms=1",
                "from 1 to 1000",
            ),
            (
                "wait_replicas=99999999999999999999999&wait_timeout_ms=1",
                "from 1 to 1000",
            ),
            (
                "wait_replicas=1&wait_timeout_ms=-1",
                "from 1 to 60000 (milliseconds",
            ),
            (
                "wait_replicas=1&wait_timeout_ms=0",
                "from 1 to 60000 (milliseconds",
            ),
            (
                "wait_replicas=1&wait_timeout_ms=60001",
                "from 1 to 60000 (milliseconds",
            ),
            (
                "wait_replicas=1&wait_timeout_ms=99999999999999999999999",
                "from 1 to 60000",
            ),
        ] {
            let r = reason(&format!("redis://h/0?{query}"));
            assert!(r.contains(says), "{query}: {r}");
        }
        let bad = RedisConfig::from_url("redis://h/0").unwrap();
        for (replicas, timeout, says) in [
            (0, Duration::from_millis(5), "at least 1 replica"),
            (1001, Duration::from_millis(5), "at most 1000"),
            (1, Duration::from_micros(500), "at least 1ms"),
            (1, Duration::from_secs(61), "at most 60s"),
        ] {
            let e = bad
                .clone()
                .wait_for_replicas(replicas, timeout)
                .unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
        }
        let c = RedisConfig::from_url(
            "redis+cluster://h1:7000,h2:7001/?wait_replicas=1&wait_timeout_ms=5",
        )
        .unwrap();
        assert_eq!(RedisConfig::from_url(&c.to_url()).unwrap(), c);
        assert_eq!(c.get_wait_for_replicas().map(|w| w.replicas), Some(1));
        let r = reason("redis+sentinel://app:s3cret@s1,s2/?prefix=p");
        assert!(r.contains("primary's name") && !r.contains("s3cret"), "{r}");
        let c = RedisConfig::from_url("redis+sentinel://app:s3cret@s1,s2/main/2?prefix=p").unwrap();
        assert_eq!((c.db(), c.get_prefix()), (2, "p"));
        assert_eq!(RedisConfig::from_url(&c.to_url()).unwrap(), c);
        assert!(!format!("{c:?}").contains("s3cret"), "{c:?}");
        let c = RedisConfig::from_url("redis://:pw@h/0").unwrap();
        assert!(!format!("{c:?}").contains("pw@"), "{c:?}");
        let store = RedisStore::new(c).unwrap();
        assert!(!format!("{store:?}").contains("pw@"), "{store:?}");
    }
}
