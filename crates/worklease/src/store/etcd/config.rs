//! [`EtcdConfig`]: the members, user, prefix, timeouts and TLS files of a
//! store, and the client options they make.

use std::time::Duration;

use etcd_client::ConnectOptions;

use crate::error::{InvalidInput, Result};
use crate::store::url_parts::redact;

#[cfg(doc)]
use super::EtcdStore;

/// The key prefix when none is given.
pub const DEFAULT_PREFIX: &str = "worklease/";
/// The client port of a host given without one.
pub const DEFAULT_PORT: u16 = 2379;
/// The longest key prefix, in bytes.
pub const MAX_PREFIX_BYTES: usize = 256;
/// How long connecting to a member may take, by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take, by default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and how an [`EtcdStore`] connects. Its `Debug` form shows no
/// password.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `host:port` of each member, as given (IPv6 in brackets).
    pub(super) hosts: Vec<String>,
    pub(super) user: Option<(String, String)>,
    pub(super) prefix: String,
    pub(super) connect_timeout: Duration,
    pub(super) request_timeout: Duration,
    /// The most leases one batch transaction names (etcd's
    /// `--max-txn-ops`).
    pub(super) max_txn_ops: usize,
    /// TLS (`etcds://`), when on.
    #[cfg(feature = "etcd-tls")]
    pub(super) tls: Option<Tls>,
}

/// TLS settings: the certificates to trust (`None`: the system's roots)
/// and an optional client certificate and key.
#[cfg(feature = "etcd-tls")]
pub(super) use crate::store::tls_files::TlsFiles as Tls;

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("url", &redact(&self.to_url()))
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// `prefix` ending in `/` (one is added when missing): `app` and `app/`
/// name the same keys, `app/live/...`, rather than `applive/...`. An
/// empty prefix stays empty (and is refused).
pub(super) fn with_slash(mut prefix: String) -> String {
    if !prefix.is_empty() && !prefix.ends_with('/') {
        prefix.push('/');
    }
    prefix
}

/// Why `prefix` cannot be a key prefix, or `None` when it can.
pub(super) fn check_prefix(prefix: &str) -> Option<String> {
    if prefix.is_empty() {
        return Some("the key prefix is empty: give one, for example worklease/".to_string());
    }
    if prefix.len() > MAX_PREFIX_BYTES {
        return Some(format!(
            "the key prefix is {} bytes: the limit is {MAX_PREFIX_BYTES} bytes",
            prefix.len()
        ));
    }
    if let Some(c) = prefix.chars().find(|c| c.is_control()) {
        return Some(format!(
            "the key prefix {prefix:?} contains the control character {c:?}"
        ));
    }
    None
}

/// `host[:port]` checked and completed with the default port, or why it
/// is not a host name or address with an optional port. The reason never
/// quotes `s`: a malformed member list may hold a password (a raw `/` or
/// `?` in it ends the authority early).
pub(super) fn host_port(s: &str) -> std::result::Result<String, &'static str> {
    const IPV6: &str = "an address in brackets must be an IPv6 address, as in [::1]:2379";
    let (host, port) = match s.strip_prefix('[') {
        Some(inner) => {
            let (addr, rest) = inner.split_once(']').ok_or(IPV6)?;
            addr.parse::<std::net::Ipv6Addr>().map_err(|_| IPV6)?;
            let port = match rest {
                "" => None,
                r => Some(
                    r.strip_prefix(':')
                        .ok_or("only :PORT may follow an IPv6 address in brackets")?,
                ),
            };
            (format!("[{addr}]"), port)
        }
        None => {
            let (host, port) = match s.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            };
            if host.is_empty() {
                return Err("the host is empty");
            }
            if !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
            {
                return Err(
                    "the host has a character other than letters, digits, '-', '.' and '_' \
                     (IPv6 addresses go in brackets)",
                );
            }
            (host.to_string(), port)
        }
    };
    let port: u16 = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or("the port is not a number from 1 to 65535")?,
    };
    Ok(format!("{host}:{port}"))
}

/// Why endpoint `index` (from 1) of `count` is not a member address: the
/// position and the reason, never the text (it may be a password).
pub(super) fn bad_endpoint(index: usize, count: usize, why: &str) -> String {
    format!("etcd endpoint {index} of {count} is not HOST or HOST:PORT: {why}")
}

impl EtcdConfig {
    /// A configuration for the members `hosts` (`host:port`, IPv6
    /// addresses in brackets, the port defaulting to [`DEFAULT_PORT`]),
    /// with the default prefix and timeouts and no authentication.
    ///
    /// # Errors
    /// [`InvalidInput::Config`] for an empty list or an entry that is not
    /// a host with an optional port.
    pub fn new<S: AsRef<str>>(hosts: impl IntoIterator<Item = S>) -> Result<Self> {
        let hosts: Vec<S> = hosts.into_iter().collect();
        let mut checked = Vec::new();
        for (i, h) in hosts.iter().enumerate() {
            checked.push(
                host_port(h.as_ref())
                    .map_err(|why| InvalidInput::Config(bad_endpoint(i + 1, hosts.len(), why)))?,
            );
        }
        if checked.is_empty() {
            return Err(InvalidInput::Config("no etcd endpoint given".to_string()).into());
        }
        Ok(Self {
            hosts: checked,
            user: None,
            prefix: DEFAULT_PREFIX.to_string(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_txn_ops: super::MAX_TXN_OPS,
            #[cfg(feature = "etcd-tls")]
            tls: None,
        })
    }

    /// Sets the key prefix: every key starts with it (a `/` is added when
    /// it does not end with one). Stores with
    /// different prefixes share nothing (one that is an extension of the
    /// other, such as `a/` and `a/live/x`, too: escaped work IDs have no
    /// `/`).
    ///
    /// # Errors
    /// [`InvalidInput::Config`] for an empty prefix, one longer than
    /// [`MAX_PREFIX_BYTES`], or one with control characters.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Result<Self> {
        let prefix = with_slash(prefix.into());
        if let Some(reason) = check_prefix(&prefix) {
            return Err(InvalidInput::Config(reason).into());
        }
        self.prefix = prefix;
        Ok(self)
    }

    /// The key prefix.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// The members, as `host:port`.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Authenticates as `name` with `password` (etcd's `--auth` users).
    pub fn user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((name.into(), password.into()));
        self
    }

    /// How long connecting to a member may take (default
    /// [`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one request may take (default
    /// [`DEFAULT_REQUEST_TIMEOUT`]); a request that takes longer fails
    /// with a store error (background renewal retries it).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The `--max-txn-ops` of the cluster (default
    /// [`MAX_TXN_OPS`](super::MAX_TXN_OPS), etcd's default): a batch call
    /// names up to [`batch_capacity`](super::batch_capacity) of it
    /// ([`crate::LeaseStore::max_batch`]: [`MAX_BATCH`](super::MAX_BATCH)
    /// by default, 870 with 64). URL parameter `max_txn_ops=N`.
    ///
    /// # Errors
    /// [`InvalidInput::Config`] for less than
    /// [`RESERVED_OPS`](super::RESERVED_OPS) + 1: a batch of one lease needs
    /// that many.
    pub fn max_txn_ops(mut self, n: usize) -> Result<Self> {
        if n <= super::RESERVED_OPS {
            return Err(InvalidInput::Config(format!(
                "max_txn_ops must be at least {} (a batch of one lease needs that many)",
                super::RESERVED_OPS + 1
            ))
            .into());
        }
        self.max_txn_ops = n;
        Ok(self)
    }

    /// The `--max-txn-ops` the store assumes.
    pub fn get_max_txn_ops(&self) -> usize {
        self.max_txn_ops
    }

    /// Whether requests go over TLS (`etcds://`).
    pub fn is_tls(&self) -> bool {
        #[cfg(feature = "etcd-tls")]
        let tls = self.tls.is_some();
        #[cfg(not(feature = "etcd-tls"))]
        let tls = false;
        tls
    }

    /// What to suggest when a member closed the connection under a
    /// request ([`closed_by_peer`]): TLS if the URL has none; a client
    /// certificate if the URL has TLS without one (a member run with
    /// `--client-cert-auth` closes the connection after the handshake in
    /// TLS 1.3).
    ///
    /// [`closed_by_peer`]: super::rpc::closed_by_peer
    /// The hint added to a refusal for permissions (etcd's RBAC): who
    /// the user is (never the password) and what its roles must grant.
    pub(super) fn permission_hint(&self) -> String {
        let who = match &self.user {
            Some((name, _)) => format!("the etcd user {name:?}"),
            None => "a client without a user (the URL names none)".to_string(),
        };
        format!(
            " ({who} lacks a permission: it needs a role with readwrite on the key prefix {:?}, \
             as `etcdctl role grant-permission ROLE readwrite --prefix {}`)",
            self.prefix, self.prefix
        )
    }

    pub(super) fn closed_hint(&self) -> &'static str {
        #[cfg(feature = "etcd-tls")]
        if let Some(tls) = &self.tls {
            return match tls.identity {
                None => {
                    " (the member closed the connection: if it requires client certificates, \
                     add &cert=PATH&key=PATH)"
                }
                Some(_) => "",
            };
        }
        " (the member closed the connection: if it serves TLS, write etcds://)"
    }

    pub(super) fn endpoints(&self) -> Vec<String> {
        let scheme = if self.is_tls() { "https" } else { "http" };
        self.hosts
            .iter()
            .map(|h| format!("{scheme}://{h}"))
            .collect()
    }

    pub(super) fn connect_options(&self) -> ConnectOptions {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            .with_timeout(self.request_timeout)
            // A dead member whose connection stays open (a host gone) is
            // found by HTTP/2 pings, sent while a stream (the watch) is
            // open: etcd refuses pings more often than every 5 s, or
            // without a stream, by default.
            .with_keep_alive(Duration::from_secs(10), self.request_timeout)
            .with_keep_alive_while_idle(false)
            // A member cut off from the quorum answers at once instead of
            // waiting for an election.
            .with_require_leader(true)
            .with_auto_token_refresh(true);
        if let Some((name, password)) = &self.user {
            options = options.with_user(name.clone(), password.clone());
        }
        #[cfg(feature = "etcd-tls")]
        if let Some(tls) = &self.tls {
            use etcd_client::{Certificate, Identity, TlsOptions};
            let mut config = TlsOptions::new();
            config = match &tls.ca {
                Some(ca) => config.ca_certificate(Certificate::from_pem(&ca.pem)),
                None => config.with_native_roots(),
            };
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(Identity::from_pem(&cert.pem, &key.pem));
            }
            options = options.with_tls(config);
        }
        options
    }
}
