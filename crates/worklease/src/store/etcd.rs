//! The etcd store (feature `etcd`): leases in an etcd v3 cluster (3.4 or
//! later) through the `etcd-client` crate, one etcd transaction per lease
//! operation, expiry judged by etcd's own leases.
//!
//! * **Key layout.** Under a configurable prefix (default
//!   [`DEFAULT_PREFIX`]), each work ID has four keys,
//!   `<prefix>live|acq|state|ckpt/<escaped work ID>` ([`EtcdKeys`]). The
//!   escaping (percent-encoding of `/`, `%`, control characters and
//!   non-ASCII bytes) makes the work ID one path segment, so every work ID
//!   is distinct (`jobs/a`, `jobs/a/b` and `jobs%2Fa` are independent
//!   leases) and no work ID can name a key outside the prefix.
//!   - `live` is attached to an etcd lease: it exists exactly while the
//!     lease is live by etcd's clock. Its value is the holder ID.
//!   - `acq` (the acquisition: holder, TTL, previous holder and how its
//!     lease ended) is written by acquisitions only.
//!   - `state` (renewals, release, revocation of the current acquisition)
//!     is written by every other operation and deleted by an acquisition.
//!   - `ckpt` holds the checkpoint bytes.
//!
//!   Only `live` is attached to an etcd lease: when etcd ends the lease,
//!   the acquisition, its state and the checkpoint stay, and a lease whose
//!   `acq` is there without its `live` key expired (unless `state` says it
//!   was released or revoked).
//! * **Transactions.** Every operation is one etcd transaction that
//!   compares revisions (and the holder ID, a value) and writes what the
//!   operation changes together: an acquisition compares that `live` is
//!   absent and that `acq` and `state` are as it read them, then writes
//!   `live` (with its etcd lease), `acq` and deletes `state`; a renewal or
//!   checkpoint compares `live`'s create revision (the fencing token), its
//!   holder and its etcd lease, and writes `state` (and `ckpt`); a release
//!   or revocation deletes `live` and writes `state`. A compare that fails
//!   writes nothing; the store reads the keys again and answers `Held`,
//!   `Fenced` or `Expired` from what it finds.
//! * **Fencing: etcd's revisions.** The fencing token of an acquisition is
//!   the revision of its transaction (the create revision of `live`, the
//!   mod revision of `acq`). etcd's revision is one counter for the whole
//!   cluster that every write increases, kept on disk and replicated with
//!   the data, so tokens strictly increase per work ID (and across work
//!   IDs) through release, expiry (etcd deleting `live`), the deletion of
//!   any key by hand (deleting keys is a write: it increases the revision)
//!   and restarts of members or of the whole cluster; compaction does not
//!   lower it. A counter key updated in the same transaction would do as
//!   well per work ID, but it goes back to 1 if someone deletes it by hand
//!   (or every key under the prefix), and it is a write hot spot; the
//!   revision needs no key at all. Only wiping the cluster's data (a new
//!   cluster) starts revisions again from 1.
//! * **Expiry: etcd's leases, TTLs rounded up to whole seconds.** An
//!   acquisition grants an etcd lease with the TTL and attaches `live` to
//!   it; renewals and checkpoints keep it alive (`LeaseKeepAlive`, then the
//!   transaction that checks the lease is still this holder's). etcd
//!   counts lease TTLs in whole seconds, so a TTL is **rounded up** to the
//!   next whole second (1500 ms becomes 2 s), and etcd raises it further
//!   to its minimum lease TTL (1.5 × its election timeout, rounded up: 2 s
//!   with the default 1 s election timeout). On an etcd with the fix of
//!   etcd bug #15247 (below), etcd does not end a lease before its
//!   holder's deadline: it starts a lease's countdown when it grants or
//!   renews it, after the holder sent its request, and a new Raft leader
//!   extends every lease by an election timeout. It may end a lease later
//!   than the TTL: by the rounding, and by up to about half a
//!   second more, since the leader checks for expired leases every 500 ms.
//!   Contenders wait that long; holders still count their own TTL. etcd's
//!   lease clock is the leader's monotonic clock: a wall-clock step on a
//!   member changes nothing.
//!
//!   **etcd bug #15247: a paused old leader revokes leases.** A Raft
//!   leader that is paused (SIGSTOP, a VM freeze, a long GC or I/O stall)
//!   and resumes still believes it leads for a moment and revokes the
//!   leases whose TTL ran out by its clock, although the new leader
//!   renewed them: a lease ends seconds after a successful renewal, and a
//!   contender acquires it while the first holder still counts time left,
//!   so two holders overlap. Reproduced here on Debian's etcd 3.4.23 by
//!   stopping the leader with SIGSTOP for 20 s. It is fixed by etcd PR
//!   #16822, backported to 3.4 in PR #17465 (February 2024) and to 3.5:
//!   production needs 3.4 releases after February 2024 (PR #17465) or
//!   3.5/3.6 releases with PR #16822. When it opens its client the store
//!   asks one member for its version and logs a warning for 3.4 below
//!   3.4.30 and 3.5 below 3.5.13, the first patch releases believed to
//!   carry the fix (check etcd's CHANGELOG). Fencing tokens still protect
//!   downstream writes: the second holder's token is higher, so a resource
//!   that checks tokens refuses the first holder's late writes.
//!   A renewal that asks for a longer TTL than the lease was granted with
//!   (another handle of the same holder with a longer TTL) moves `live` to
//!   a new etcd lease in its transaction. A store keeps the etcd leases of
//!   the acquisitions it released (up to 64, while they have more than a
//!   second left) and gives one to its next acquisition with the same TTL,
//!   renewed first: a keep-alive, which the leader handles alone, instead
//!   of a grant now and a revocation later, which both go through Raft.
//! * **Push hand-off.** A store with waiters keeps one etcd watch on the
//!   `live` keys under its prefix (deletions only) and wakes this process's
//!   waiters of a work ID when its `live` key is deleted: on release,
//!   revocation, and expiry (etcd deletes the key when it ends the lease),
//!   so a waiter gets an expired lease as soon as etcd ends it. The watch
//!   starts at the revision after the newest one the store has seen, and
//!   after a broken stream (a member gone) it resumes from the revision
//!   after the last event it got, on any endpoint: no deletion is lost
//!   (unless compacted away meanwhile: then every waiter is woken). Waiters
//!   poll as well, as the fallback.
//! * **Endpoints and fail-over.** The URL lists any number of members;
//!   the store keeps one client (connection) per member and sends its
//!   requests to one member at a time. A request fails over to the next
//!   member when it got no connection, met a member without a leader
//!   (requests ask for one, `require_leader`, so a member cut off from the
//!   quorum answers at once), got no reply in time (a member that hangs:
//!   stopped with SIGSTOP, behind a network black hole, or waiting for an
//!   election), or lost its connection; the store then keeps sending to
//!   that next member. Up to twice per member. For an operation on a lease
//!   (acquire, renew, checkpoint, release, read checkpoint) one try on one
//!   member may take TTL/5 (at least 250 ms, at most
//!   [`EtcdConfig::request_timeout`]; the whole request timeout with a
//!   single member), and the operation gives up when the TTL has passed:
//!   with a 15 s TTL, a hung member costs a renewal 3 s, once, and the
//!   renewal then succeeds on the next member, well inside the window
//!   before `worklease run` sends SIGTERM. Other operations (status,
//!   revoke) give each try the request timeout.
//!
//!   Sending a request again whose outcome is unknown (the first copy may
//!   have been applied, even late, when the hung member resumes) is safe
//!   for each of them. Reads and etcd-lease keep-alives change nothing
//!   that matters twice. A renewal or checkpoint transaction compares the
//!   fencing token (`live`'s create revision), the holder, the etcd lease
//!   and the mod revision of `state` the store last saw: a second copy
//!   finds `state` moved and fails (the store reads the keys, sees the
//!   lease is still its own, and tries once more with what it read), and a
//!   copy applied late, after a newer checkpoint, fails too, so S4 holds;
//!   a stale token fails as before (S1–S3). A release compares token and
//!   holder: a second copy finds `live` gone and changes nothing. An
//!   acquisition compares that `live` is absent and `acq` and `state` are
//!   as read, so at most one copy applies; when the next read finds `live`
//!   attached to the etcd lease this call granted (or renewed from its
//!   spares: no other key uses it), naming this holder, as the current
//!   acquisition, the acquisition is this call's and it returns it. When
//!   every try fails, the acquisition returns a store error and revokes
//!   that etcd lease (as before): an acquisition that was applied after
//!   all ends at once, or at its TTL if the revocation fails too. A grant
//!   applied twice leaves an unused etcd lease that expires with its TTL.
//!   The watch follows the store to the next member when its stream
//!   breaks.
//!
//! Operating etcd for leases:
//! * **Snapshot restore turns fencing tokens back.** `etcdctl snapshot
//!   restore` (or `etcdutl`) starts the cluster at the revision of the
//!   snapshot, so acquisitions after a restore get tokens that holders
//!   before it already used. Restore with `etcdutl snapshot restore
//!   --bump-revision N --mark-compacted` (etcd 3.5 and later; N larger than
//!   the number of writes since the snapshot), or wipe the store's keys and
//!   treat the cluster as new, with every resource that checks tokens
//!   reset too.
//! * **Compaction.** Every acquisition, renewal and checkpoint is a write,
//!   and etcd keeps every old revision until compacted; etcd 3.4 does not
//!   compact by default. Run etcd with `--auto-compaction-retention` (and
//!   defragment members now and then), else the database reaches its space
//!   quota, etcd raises the NOSPACE alarm and refuses every write: every
//!   lease ends at its TTL.
//!
//! Limits: etcd refuses requests above 1.5 MiB by default, which the
//! largest checkpoint (1 MiB, [`crate::limits::MAX_CHECKPOINT_BYTES`])
//! stays under. `inspect` of every lease lists the `acq` keys in pages.
//!
//! URL: `etcd://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...][/][?prefix=P]`
//! ([`EtcdConfig::from_url`]); the port defaults to 2379. A user name
//! turns on etcd's authentication (the password is sent to get a token,
//! never shown: see [`crate::store::url::redact`]).
//!
//! TLS (cargo feature `etcd-tls`, rustls through `etcd-client`'s `tls`):
//! `etcds://HOST:PORT,...?prefix=P&cacert=PATH[&cert=PATH&key=PATH]`
//! talks TLS to every member and verifies its certificate and name (the
//! host as written: an IP address must be in the certificate's names)
//! against the PEM file `cacert`, or, without it, the system's roots
//! (`SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured). `cert` and `key`
//! (PEM, both or neither) are a client certificate for members run with
//! `--client-cert-auth`. The files are read when the URL is parsed: an
//! unreadable file or one without PEM in it is an
//! [`InvalidInput::StoreUrl`] naming the file, never quoting it. A plain
//! `etcd://` URL against a TLS member fails with a store error that says
//! to write `etcds://` (the member closes plain connections); an untrusted
//! member certificate with rustls's `invalid peer certificate`.
//!
//! ```no_run
//! # async fn demo() -> worklease::Result<()> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use worklease::store::etcd::EtcdStore;
//! use worklease::{AcquireOptions, Config, Leases};
//!
//! let store = EtcdStore::open("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379?prefix=jobs/")?;
//! // 10 s is kept as it is; 1500 ms would last 2 s in etcd (the holder
//! // still counts 1500 ms).
//! let leases = Leases::new(Arc::new(store), Config::new("worker-1", Duration::from_secs(10)))?;
//! let token = leases.acquire("nightly-report", AcquireOptions::new()).await?;
//! let token = leases.checkpoint(&token, &b"page 7"[..]).await?;
//! leases.release(token).await?;
//! # Ok(()) }
//! ```

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KeyValue, PutOptions,
    ResponseHeader, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions,
};
use futures_util::future::BoxFuture;
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, InvalidInput, Result, StoreError};
use crate::limits::{HolderId, WorkId};
use crate::store::notify::Watchers;
use crate::store::record::{self, Phase};
use crate::store::url_parts::{redact, url_error};
use crate::store::{
    Checkpoint, Grant, Handoff, LeaseEnd, LeaseInfo, LeaseRef, LeaseStore, PreviousHolder,
};

const KIND: &str = "etcd";

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

/// The share of a lease's TTL one request to one member may take before
/// the store sends it to the next member: TTL/5 (see `Budget::lease`).
const ATTEMPT_SHARE: u32 = 5;
/// The shortest time one request to one member is given, whatever the TTL:
/// a healthy member on a busy host may take a few hundred milliseconds.
const MIN_ATTEMPT: Duration = Duration::from_millis(250);
/// How many `acq` keys one page of `inspect` lists.
const PAGE: i64 = 1000;
/// How many etcd lease IDs of its own acquisitions a store remembers (a
/// renewal of one it forgot reads the ID first: one request more).
const LEASE_CACHE: usize = 4096;
/// How many etcd leases of released acquisitions a store keeps for the
/// next ones.
const SPARES: usize = 64;
/// A spare etcd lease is used only while it has this much left by this
/// host's clock (etcd may be ending it after that).
const SPARE_MARGIN: Duration = Duration::from_secs(1);
/// How often a transaction is tried again when another writer got between
/// its read and its write.
const RACE_RETRIES: usize = 8;
/// The first wait before watching again after a broken watch; it doubles
/// up to [`REWATCH_MAX`].
const REWATCH_MIN: Duration = Duration::from_millis(50);
/// The longest wait between watch attempts.
const REWATCH_MAX: Duration = Duration::from_secs(2);

/// The kinds of keys, each followed by the escaped work ID.
const LIVE: &str = "live/";
const ACQ: &str = "acq/";
const STATE: &str = "state/";
const CKPT: &str = "ckpt/";

/// What the escaping of a work ID encodes besides non-ASCII bytes, which
/// percent-encoding always encodes: `/` keeps the ID one path segment.
const ESCAPED: &AsciiSet = &CONTROLS.add(b'/').add(b'%');

/// The escaped form of a work ID, as it stands in keys.
fn escape(work_id: &str) -> String {
    utf8_percent_encode(work_id, ESCAPED).to_string()
}

/// The etcd keys of one work ID (see the module docs for what each holds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdKeys {
    /// Exists, attached to an etcd lease, exactly while the lease is live;
    /// its create revision is the fencing token, its value the holder ID.
    pub live: String,
    /// The acquisition: holder, TTL, previous holder and how it ended.
    pub acquisition: String,
    /// Renewals, release or revocation of the current acquisition.
    pub state: String,
    /// The checkpoint bytes.
    pub checkpoint: String,
}

impl EtcdKeys {
    /// The keys of `work_id` under `prefix`.
    fn new(prefix: &str, work_id: &WorkId) -> Self {
        let id = escape(work_id.as_str());
        Self {
            live: format!("{prefix}{LIVE}{id}"),
            acquisition: format!("{prefix}{ACQ}{id}"),
            state: format!("{prefix}{STATE}{id}"),
            checkpoint: format!("{prefix}{CKPT}{id}"),
        }
    }
}

/// The work ID of the key `key` of kind `kind` (`LIVE`, `ACQ`, ...) under
/// `prefix`, or `None` for a key that is not one of ours (another
/// program's, or a non-canonical escaping).
fn work_id_of(prefix: &str, kind: &str, key: &[u8]) -> Option<WorkId> {
    let key = std::str::from_utf8(key).ok()?;
    let escaped = key.strip_prefix(prefix)?.strip_prefix(kind)?;
    let id = percent_decode_str(escaped).decode_utf8().ok()?;
    if escape(&id) != escaped {
        return None;
    }
    WorkId::new(id.into_owned()).ok()
}

/// The end of the key range of every key starting with `prefix` (etcd's
/// "prefix + 1"; `[0]`, the end of the key space, for a prefix of 0xff
/// bytes).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// `prefix` ending in `/` (one is added when missing): `app` and `app/`
/// name the same keys, `app/live/...`, rather than `applive/...`. An
/// empty prefix stays empty (and is refused).
fn with_slash(mut prefix: String) -> String {
    if !prefix.is_empty() && !prefix.ends_with('/') {
        prefix.push('/');
    }
    prefix
}

/// Why `prefix` cannot be a key prefix, or `None` when it can.
fn check_prefix(prefix: &str) -> Option<String> {
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

/// A TTL as etcd takes it: whole seconds, rounded up, at least 1.
fn ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn wall(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------
// Configuration.

/// Where and how an [`EtcdStore`] connects. Its `Debug` form shows no
/// password.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `host:port` of each member, as given (IPv6 in brackets).
    hosts: Vec<String>,
    user: Option<(String, String)>,
    prefix: String,
    connect_timeout: Duration,
    request_timeout: Duration,
    /// TLS (`etcds://`), when on.
    #[cfg(feature = "etcd-tls")]
    tls: Option<Tls>,
}

/// A PEM file named in an `etcds://` URL, and its contents as read when
/// the URL was parsed.
#[cfg(feature = "etcd-tls")]
#[derive(Clone, PartialEq, Eq)]
struct PemFile {
    path: std::path::PathBuf,
    pem: Vec<u8>,
}

#[cfg(feature = "etcd-tls")]
impl PemFile {
    /// Reads `path` (named `what` in errors: `cacert`, `cert` or `key`)
    /// and checks that it holds PEM certificates, or a PEM private key
    /// when `what` is `key`. The reason names the file, never its
    /// contents.
    fn read(what: &str, path: std::path::PathBuf) -> std::result::Result<Self, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};

        let shown = path.display().to_string();
        let pem = std::fs::read(&path).map_err(|e| format!("cannot read {what} {shown}: {e}"))?;
        let valid = if what == "key" {
            PrivateKeyDer::from_pem_slice(&pem).is_ok()
        } else {
            let mut certs = CertificateDer::pem_slice_iter(&pem).peekable();
            certs.peek().is_some() && certs.all(|c| c.is_ok())
        };
        if !valid {
            let holds = if what == "key" {
                "a PEM private key"
            } else {
                "PEM certificates"
            };
            return Err(format!("{what} {shown} does not hold {holds}"));
        }
        Ok(Self { path, pem })
    }
}

/// TLS settings: the certificates to trust (`None`: the system's roots)
/// and an optional client certificate and key.
#[cfg(feature = "etcd-tls")]
#[derive(Clone, PartialEq, Eq, Default)]
struct Tls {
    ca: Option<PemFile>,
    identity: Option<(PemFile, PemFile)>,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("url", &redact(&self.to_url()))
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// What `to_url` percent-encodes in the user info and the prefix, besides
/// non-ASCII bytes: whatever would end or split them.
const URL_ESCAPED: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'%')
    .add(b'@')
    .add(b':')
    .add(b'/')
    .add(b'?')
    .add(b'#')
    .add(b'&')
    .add(b'=')
    .add(b'+')
    .add(b',')
    .add(b'[')
    .add(b']');

fn decode(url: &str, what: &str, s: &str) -> Result<String> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| url_error(url, format!("the {what} is not UTF-8 once percent-decoded")))
}

/// `host[:port]` checked and completed with the default port, or why it
/// is not a host name or address with an optional port. The reason never
/// quotes `s`: a malformed member list may hold a password (a raw `/` or
/// `?` in it ends the authority early).
fn host_port(s: &str) -> std::result::Result<String, &'static str> {
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
fn bad_endpoint(index: usize, count: usize, why: &str) -> String {
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
            #[cfg(feature = "etcd-tls")]
            tls: None,
        })
    }

    /// Parses `etcd://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...][/][?prefix=P]`:
    /// one or more members (the port defaults to [`DEFAULT_PORT`]), an
    /// optional user for etcd's authentication (user and password
    /// percent-encoded), and `prefix`, the key prefix (percent-decoded;
    /// default [`DEFAULT_PREFIX`]).
    ///
    /// `etcds://` (feature `etcd-tls`) is the same over TLS, with the
    /// parameters `cacert=PATH` (PEM certificates to trust; default: the
    /// system's roots) and `cert=PATH&key=PATH` (a PEM client certificate
    /// and its key), percent-decoded. The files are read here.
    ///
    /// # Errors
    /// [`InvalidInput::StoreUrl`], with the URL redacted, for another
    /// scheme (`etcds://` too in a build without `etcd-tls`), a bad member
    /// list, a path, a fragment, an unknown or repeated parameter, a bad
    /// prefix, `cacert`, `cert` or `key` in an `etcd://` URL, `cert`
    /// without `key` or the reverse, or a PEM file that cannot be read or
    /// holds no PEM certificate (no PEM private key for `key`): the reason
    /// names the file, never its contents.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(url_error(
                url,
                "not an etcd URL: write etcd://HOST:PORT,HOST:PORT?prefix=PREFIX",
            ));
        };
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "etcd" => false,
            "etcds" if cfg!(feature = "etcd-tls") => true,
            "etcds" => {
                return Err(url_error(
                    url,
                    "TLS (etcds://) needs the cargo feature `etcd-tls` of worklease",
                ))
            }
            other => {
                return Err(url_error(
                    url,
                    format!("the etcd store takes etcd:// or etcds:// URLs, not {other}://"),
                ))
            }
        };
        if rest.contains('#') {
            return Err(url_error(url, "an etcd URL takes no #fragment"));
        }
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        // A raw '/' or '?' in a password ends the authority before its '@':
        // the user info would then be read as members or parameters, and
        // quoted in a reason. An '@' after the authority is refused without
        // naming any of the text around it.
        if tail.contains('@') {
            return Err(url_error(
                url,
                "the URL has an '@' after its member list: percent-encode '/', '?', '#' and '@' \
                 in a user name or password (%2F, %3F, %23, %40), and '@' in the prefix",
            ));
        }
        let (user, hosts) = match authority.rsplit_once('@') {
            Some((info, hosts)) => {
                let (name, password) = info.split_once(':').unwrap_or((info, ""));
                let name = decode(url, "user name", name)?;
                if name.is_empty() {
                    return Err(url_error(url, "the user name before '@' is empty"));
                }
                (Some((name, decode(url, "password", password)?)), hosts)
            }
            None => (None, authority),
        };
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        if !path.is_empty() && path != "/" {
            return Err(url_error(
                url,
                "an etcd URL takes no path: choose the key prefix with ?prefix=PREFIX",
            ));
        }
        let members: Vec<&str> = hosts.split(',').collect();
        let mut hosts_checked = Vec::new();
        for (i, h) in members.iter().enumerate() {
            hosts_checked.push(host_port(h).map_err(|why| {
                url_error(
                    url,
                    format!(
                        "{} (members are separated by commas)",
                        bad_endpoint(i + 1, members.len(), why)
                    ),
                )
            })?);
        }
        let mut prefix: Option<String> = None;
        // `cacert`, `cert` and `key`, percent-decoded.
        let mut files: [Option<String>; 3] = [None, None, None];
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            // Given twice, "last one wins" would let a copy-paste slip put
            // two fleets under two prefixes.
            let twice = || url_error(url, format!("the parameter {key:?} appears twice"));
            let slot = match key {
                "prefix" => &mut prefix,
                "cacert" => &mut files[0],
                "cert" => &mut files[1],
                "key" => &mut files[2],
                other => {
                    return Err(url_error(
                        url,
                        format!(
                            "unknown parameter {other:?}: the accepted ones are prefix, and \
                             cacert, cert and key with etcds://"
                        ),
                    ))
                }
            };
            if slot.is_some() {
                return Err(twice());
            }
            *slot = Some(decode(url, key, value)?);
        }
        if !tls && files.iter().any(Option::is_some) {
            return Err(url_error(
                url,
                "cacert, cert and key are TLS settings: write etcds:// to use TLS",
            ));
        }
        let prefix = with_slash(prefix.unwrap_or_else(|| DEFAULT_PREFIX.to_string()));
        if let Some(reason) = check_prefix(&prefix) {
            return Err(url_error(url, reason));
        }
        #[cfg(feature = "etcd-tls")]
        let tls = match tls {
            false => None,
            true => {
                let [ca, cert, key] = files;
                let read = |what: &str, path: String| {
                    PemFile::read(what, path.into()).map_err(|why| url_error(url, why))
                };
                let identity = match (cert, key) {
                    (Some(cert), Some(key)) => Some((read("cert", cert)?, read("key", key)?)),
                    (None, None) => None,
                    _ => {
                        return Err(url_error(
                            url,
                            "a client certificate needs both cert=PATH and key=PATH",
                        ))
                    }
                };
                let ca = ca.map(|ca| read("cacert", ca)).transpose()?;
                Some(Tls { ca, identity })
            }
        };
        Ok(Self {
            hosts: hosts_checked,
            user,
            prefix,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            #[cfg(feature = "etcd-tls")]
            tls,
        })
    }

    /// The URL of this configuration, password included (show it only
    /// through [`redact`]): [`EtcdConfig::from_url`] reads it back to the
    /// same configuration, but for the timeouts, which are not part of it.
    pub fn to_url(&self) -> String {
        let enc = |s: &str| utf8_percent_encode(s, URL_ESCAPED).to_string();
        let user = match &self.user {
            Some((name, password)) => format!("{}:{}@", enc(name), enc(password)),
            None => String::new(),
        };
        let mut params = Vec::new();
        if self.prefix != DEFAULT_PREFIX {
            params.push(format!("prefix={}", enc(&self.prefix)));
        }
        #[cfg(feature = "etcd-tls")]
        let scheme = match &self.tls {
            None => "etcd",
            Some(tls) => {
                let mut file = |name: &str, f: &PemFile| {
                    let path = f.path.to_string_lossy();
                    params.push(format!("{name}={}", enc(&path)));
                };
                if let Some(ca) = &tls.ca {
                    file("cacert", ca);
                }
                if let Some((cert, key)) = &tls.identity {
                    file("cert", cert);
                    file("key", key);
                }
                "etcds"
            }
        };
        #[cfg(not(feature = "etcd-tls"))]
        let scheme = "etcd";
        let mut url = format!("{scheme}://{user}{}", self.hosts.join(","));
        if !params.is_empty() {
            url.push_str("/?");
            url.push_str(&params.join("&"));
        }
        url
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
    fn closed_hint(&self) -> &'static str {
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

    fn endpoints(&self) -> Vec<String> {
        let scheme = if self.is_tls() { "https" } else { "http" };
        self.hosts
            .iter()
            .map(|h| format!("{scheme}://{h}"))
            .collect()
    }

    fn connect_options(&self) -> ConnectOptions {
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

// ---------------------------------------------------------------------
// Stored values.

/// How an acquisition's predecessor ended, as `acq` keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredPrevious {
    holder: String,
    token: u64,
    end: String,
}

/// The value of `acq`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Acquisition {
    holder: String,
    ttl_ms: u64,
    /// The TTL etcd granted the lease, in seconds.
    granted_s: i64,
    /// The expiry estimate by the acquirer's wall clock, in Unix ms.
    exp_ms: u64,
    prev: Option<StoredPrevious>,
}

/// The value of `state`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct State {
    /// The acquisition it is about.
    token: u64,
    /// `held`, `released` or `revoked`.
    phase: String,
    /// Held: the expiry estimate after the last renewal; else the moment
    /// of the end. Writer's wall clock, Unix ms.
    at_ms: u64,
    /// Held: the TTL etcd granted the lease now attached to `live`.
    #[serde(default)]
    granted_s: i64,
}

fn bad_value(what: &str) -> Error {
    StoreError::new(KIND, format!("unexpected value in etcd: {what}")).into()
}

fn to_json<T: Serialize>(v: &T) -> Vec<u8> {
    // Plain structs of strings and numbers always serialize.
    serde_json::to_vec(v).unwrap_or_default()
}

fn store_err(what: impl Into<String>, e: etcd_client::Error) -> Error {
    StoreError::with_source(KIND, what, e).into()
}

/// Whether etcd `version` (`3.4.23`, as a member reports it) predates the
/// first patch release of its line believed to carry the fix of etcd bug
/// #15247 (PR #16822, backported to 3.4 in PR #17465): 3.4.30 and 3.5.13.
/// An older member that leads the cluster, paused and resumed, may revoke
/// leases its successor renewed. Unknown or newer versions are `false`.
fn lacks_lease_revoke_fix(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Some(3)), Some(Some(minor)), Some(Some(patch))) => {
            minor < 4 || (minor == 4 && patch < 30) || (minor == 5 && patch < 13)
        }
        _ => false,
    }
}

/// Asks one member for its version, in the background, and logs a warning
/// when it lacks the fix of etcd bug #15247 ([`lacks_lease_revoke_fix`]).
/// Only a diagnostic: a failure to ask is logged at debug level.
fn warn_if_lease_revoke_bug(mut client: Client, timeout: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        match tokio::time::timeout(timeout, client.status()).await {
            Ok(Ok(status)) if lacks_lease_revoke_fix(status.version()) => {
                tracing::warn!(
                    etcd_version = status.version(),
                    "this etcd predates the fix of etcd bug #15247 (PR #16822; in 3.4 PR #17465, \
                     believed first released in 3.4.30 and 3.5.13): a Raft leader that was paused \
                     may revoke leases after it resumes, ending a lease just renewed; upgrade etcd \
                     for production (fencing tokens still protect downstream writes)"
                );
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "cannot read the etcd version"),
            Err(_) => tracing::debug!("cannot read the etcd version: no reply in time"),
        }
    });
}

/// Whether a failed request certainly never reached a member able to serve
/// it: no connection could be made (a member down), or the member has no
/// leader and refused it before proposing anything. Such a request changed
/// nothing. Reported as "cannot reach the cluster" when every try failed so.
fn never_reached(e: &etcd_client::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(status) => {
            if status.code() == tonic::Code::Unavailable && status.message().contains("no leader") {
                return true;
            }
            Some(status)
        }
        etcd_client::Error::TransportError(t) => Some(t),
        _ => None,
    };
    while let Some(err) = source {
        if err.is::<tonic::ConnectError>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// Whether the member closed or reset the connection under a request
/// (hyper then cancels the request): what a member that serves TLS does to
/// a client that speaks plain HTTP/2, and one run with
/// `--client-cert-auth`, at times, to a client without a certificate (at
/// other times it sends an alert, which rustls reports as "received fatal
/// alert: BadCertificate"). Only used to add a hint to the error.
fn closed_by_peer(e: &etcd_client::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(status) => {
            if status.code() == tonic::Code::Cancelled {
                return true;
            }
            Some(status)
        }
        etcd_client::Error::TransportError(t) => Some(t),
        etcd_client::Error::IoError(io) => Some(io),
        _ => None,
    };
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::{
                BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof,
            };
            if matches!(
                io.kind(),
                BrokenPipe | ConnectionAborted | ConnectionReset | UnexpectedEof
            ) {
                return true;
            }
        }
        source = err.source();
    }
    false
}

/// Whether a failed request is worth sending to another member: it never
/// reached one able to serve it, or the member did not answer in time
/// (hung: stopped, behind a black hole, or waiting for a new leader), or
/// the connection broke, or the member said it is unavailable (no leader,
/// leader changed, its own timeout). The outcome of all but the first is
/// unknown: the request may have been applied, once, by the time the
/// store sends it again. Every operation of the store is safe to send
/// again (see "Endpoints and fail-over" in the module docs). Any other
/// error (a refusal: permission, bad request, lease not found) is an
/// answer, the same from every member.
fn fails_over(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => never_reached(e),
    }
}

/// How long one operation's requests may take: each attempt on one
/// member, and all of them together.
#[derive(Debug, Clone, Copy)]
struct Budget {
    /// How long one request to one member may take before the store gives
    /// up on that member and sends it to the next one.
    attempt: Duration,
    /// When the operation stops trying members (`None`: only the number of
    /// attempts bounds it).
    until: Option<Instant>,
}

impl Budget {
    /// An operation not tied to a lease (reads for `status`, revocation,
    /// [`EtcdStore::ready`]): the configured request timeout per attempt.
    fn plain(config: &EtcdConfig) -> Self {
        Self {
            attempt: config.request_timeout,
            until: None,
        }
    }

    /// An operation on a lease of `ttl` (acquire, renew, checkpoint,
    /// release, read checkpoint): it is of no use after the TTL, and one
    /// member that hangs may cost it at most a fifth of the TTL (never
    /// more than the configured request timeout, never less than
    /// [`MIN_ATTEMPT`]) before it goes to the next member. With a single
    /// member there is nowhere else to go: the attempt may take the whole
    /// request timeout.
    fn lease(config: &EtcdConfig, ttl: Duration) -> Self {
        let attempt = if config.hosts.len() > 1 {
            config
                .request_timeout
                .min((ttl / ATTEMPT_SHARE).max(MIN_ATTEMPT))
        } else {
            config.request_timeout
        };
        Self {
            attempt,
            until: Some(Instant::now() + ttl),
        }
    }

    /// The timeout of an attempt started now; `None` once past `until`.
    fn next_attempt(&self) -> Option<Duration> {
        match self.until {
            None => Some(self.attempt),
            Some(until) => {
                let left = until.saturating_duration_since(Instant::now());
                (!left.is_zero()).then(|| self.attempt.min(left))
            }
        }
    }
}

/// One client per member, each connected on first use, and the member
/// requests go to first. A request goes to that member; when it fails
/// over ([`fails_over`]) the store moves on to the next member and sends
/// it there, so one member that hangs costs one attempt timeout, once,
/// not one per request (`etcd-client`'s balanced channel would keep
/// routing a share of the requests to it).
struct Members {
    /// `http://host:port` of each member.
    endpoints: Vec<String>,
    options: ConnectOptions,
    clients: Vec<tokio::sync::OnceCell<Client>>,
    /// The index of the member requests go to first.
    preferred: AtomicUsize,
    /// Whether a member was asked for its version (see
    /// [`warn_if_lease_revoke_bug`]).
    version_checked: std::sync::atomic::AtomicBool,
    request_timeout: Duration,
}

impl Members {
    fn new(config: &EtcdConfig) -> Self {
        let endpoints = config.endpoints();
        Self {
            clients: endpoints
                .iter()
                .map(|_| tokio::sync::OnceCell::new())
                .collect(),
            endpoints,
            options: config.connect_options(),
            preferred: AtomicUsize::new(0),
            version_checked: std::sync::atomic::AtomicBool::new(false),
            request_timeout: config.request_timeout,
        }
    }

    /// The member requests go to now.
    fn preferred(&self) -> usize {
        self.preferred.load(Ordering::Relaxed) % self.endpoints.len()
    }

    /// Member `i` failed a request: requests go to the next one, unless
    /// another request already moved them on from `i`.
    fn failed(&self, i: usize) {
        let next = (i + 1) % self.endpoints.len();
        let _ = self
            .preferred
            .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The client of member `i`, connecting it first if needed (without
    /// authentication this sends nothing; with it, it asks for a token).
    async fn client(&self, i: usize) -> std::result::Result<Client, etcd_client::Error> {
        let client = self.clients[i]
            .get_or_try_init(|| {
                Client::connect([self.endpoints[i].as_str()], Some(self.options.clone()))
            })
            .await?
            .clone();
        if !self.version_checked.swap(true, Ordering::Relaxed) {
            warn_if_lease_revoke_bug(client.clone(), self.request_timeout);
        }
        Ok(client)
    }

    /// A connected client, the preferred member's if it is connected, for
    /// background work that must not wait (revocations of unused etcd
    /// leases).
    fn connected(&self) -> Option<Client> {
        let first = self.preferred();
        (0..self.endpoints.len())
            .map(|k| (first + k) % self.endpoints.len())
            .find_map(|i| self.clients[i].get().cloned())
    }
}

fn token_of(revision: i64) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

/// The keys of one work ID as one read saw them.
#[derive(Debug, Default)]
struct Snapshot {
    live: Option<KeyValue>,
    /// The acquisition and its mod revision (its fencing token).
    acq: Option<(Acquisition, u64)>,
    /// The state and its mod revision.
    state: Option<(State, i64)>,
    /// The checkpoint, when asked for.
    checkpoint: Option<Bytes>,
}

impl Snapshot {
    /// Builds a snapshot from the responses of gets of `live`, `acq`,
    /// `state` and (optionally) `ckpt`, in that order.
    fn from_responses(responses: Vec<TxnOpResponse>) -> Result<Self> {
        let mut kvs = responses.into_iter().map(|r| match r {
            TxnOpResponse::Get(mut g) => Ok(g.take_kvs().into_iter().next()),
            other => Err(bad_value(&format!("a read answered {other:?}"))),
        });
        let mut next = || kvs.next().transpose().map(Option::flatten);
        let live = next()?;
        let acq = match next()? {
            Some(kv) => Some((
                serde_json::from_slice::<Acquisition>(kv.value())
                    .map_err(|e| bad_value(&format!("acquisition record: {e}")))?,
                token_of(kv.mod_revision()),
            )),
            None => None,
        };
        let state = match next()? {
            Some(kv) => Some((
                serde_json::from_slice::<State>(kv.value())
                    .map_err(|e| bad_value(&format!("lease state: {e}")))?,
                kv.mod_revision(),
            )),
            None => None,
        };
        let checkpoint = next()?.map(|kv| Bytes::from(kv.into_key_value().1));
        Ok(Self {
            live,
            acq,
            state,
            checkpoint,
        })
    }

    /// The token of the last acquisition.
    fn token(&self) -> Option<u64> {
        self.acq.as_ref().map(|(_, t)| *t)
    }

    /// The `live` key, when it belongs to the last acquisition.
    fn live_of_current(&self) -> Option<&KeyValue> {
        let token = self.token()?;
        self.live
            .as_ref()
            .filter(|l| token_of(l.create_revision()) == token)
    }

    /// The state of the acquisition `token`, if `state` is about it.
    fn state_of(&self, token: u64) -> Option<&State> {
        self.state
            .as_ref()
            .map(|(s, _)| s)
            .filter(|s| s.token == token)
    }

    /// The phase of the last acquisition (held while `live` is there).
    fn phase(&self) -> Option<Phase> {
        let token = self.token()?;
        Some(
            self.state_of(token)
                .and_then(|s| Phase::parse(&s.phase))
                .filter(|p| *p != Phase::Held)
                .unwrap_or(Phase::Held),
        )
    }

    /// How the last acquisition ended, were it over now.
    fn end(&self) -> LeaseEnd {
        match self.phase() {
            Some(Phase::Released) => LeaseEnd::Released,
            Some(Phase::Revoked) => LeaseEnd::Revoked,
            _ => LeaseEnd::Expired,
        }
    }

    /// The TTL etcd granted the lease now attached to `live`, in seconds.
    fn granted(&self) -> i64 {
        let Some((acq, token)) = &self.acq else {
            return 0;
        };
        self.state_of(*token)
            .filter(|s| s.phase == Phase::Held.as_str() && s.granted_s > 0)
            .map_or(acq.granted_s, |s| s.granted_s)
    }

    /// The previous holder, as the last acquisition recorded it.
    fn previous(&self) -> Option<PreviousHolder> {
        let p = self.acq.as_ref()?.0.prev.as_ref()?;
        Some(PreviousHolder {
            holder_id: p.holder.clone(),
            fencing_token: p.token,
            ended: LeaseEnd::from_str(&p.end)?,
        })
    }

    /// `Ok` with the `live` key when `lease` is the current, live
    /// acquisition; else why not (S3 in the crate docs).
    fn check(&self, lease: LeaseRef<'_>) -> Result<&KeyValue> {
        if let Some(live) = &self.live {
            if token_of(live.create_revision()) == lease.fencing_token
                && live.value() == lease.holder_id.as_str().as_bytes()
            {
                return Ok(live);
            }
        }
        Err(self.refusal(lease))
    }

    /// Why `lease` is not the current, live acquisition.
    fn refusal(&self, lease: LeaseRef<'_>) -> Error {
        match &self.acq {
            Some((acq, token))
                if *token == lease.fencing_token && acq.holder == lease.holder_id.as_str() =>
            {
                if self.phase() == Some(Phase::Revoked) {
                    record::fenced(lease)
                } else {
                    Error::Expired {
                        work_id: lease.work_id.to_string(),
                        fencing_token: lease.fencing_token,
                    }
                }
            }
            _ => record::fenced(lease),
        }
    }
}

/// Gets of the keys a [`Snapshot`] reads.
fn snapshot_ops(keys: &EtcdKeys, with_checkpoint: bool) -> Vec<TxnOp> {
    let mut ops = vec![
        TxnOp::get(keys.live.as_str(), None),
        TxnOp::get(keys.acquisition.as_str(), None),
        TxnOp::get(keys.state.as_str(), None),
    ];
    if with_checkpoint {
        ops.push(TxnOp::get(keys.checkpoint.as_str(), None));
    }
    ops
}

// ---------------------------------------------------------------------
// The store.

/// An etcd lease a store uses for one of its acquisitions.
#[derive(Debug, Clone, Copy)]
struct Granted {
    id: i64,
    /// The TTL etcd granted, in seconds.
    ttl_s: i64,
    /// The TTL asked for, in seconds (0 when unknown: a lease learnt from
    /// a read, which is never reused).
    asked_s: i64,
    /// When the request that last started its countdown (grant or
    /// keep-alive) was sent, by this host's monotonic clock.
    renewed: Instant,
    /// The mod revision of the work ID's `state` key as the acquisition
    /// using it last saw it (0: absent, as an acquisition leaves it).
    /// Renewals and checkpoints compare it: one that a hung member applies
    /// late, after a newer one, changes nothing.
    state_rev: i64,
}

impl Granted {
    /// Whether it lasts, by this host's clock, at least `margin` more.
    fn fresh(&self, margin: Duration) -> bool {
        let ttl = Duration::from_secs(u64::try_from(self.ttl_s).unwrap_or(0));
        self.renewed + ttl > Instant::now() + margin
    }
}

/// What the watch task and the store share.
struct Wakeups {
    watchers: Watchers,
    /// Bumped when deletions may have been missed: wakes every waiter.
    all: watch::Sender<u64>,
}

/// The etcd store. See the module docs for its keys, transactions and
/// guarantees. Share one value per process (in an `Arc`): each value keeps
/// its own clients (a connection to each member it used), and a watch once
/// it has waiters.
pub struct EtcdStore {
    config: EtcdConfig,
    members: Arc<Members>,
    /// The newest revision any reply showed (a lower bound of the
    /// cluster's current revision).
    seen: AtomicI64,
    /// The etcd leases of this store's acquisitions, by (work ID, token).
    leases: Mutex<HashMap<(WorkId, u64), Granted>>,
    /// etcd leases of released acquisitions, for the next acquisitions
    /// with the same TTL: a keep-alive (handled by the leader alone)
    /// instead of a grant now and a revocation later (both replicated).
    spares: Mutex<Vec<Granted>>,
    wakeups: Arc<Wakeups>,
    /// Whether the watch task runs.
    watching: Mutex<bool>,
    /// Stops the watch task when the store is dropped.
    stop: CancellationToken,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("config", &self.config)
            .finish()
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl EtcdStore {
    /// A store for `config`. Connects lazily: the first operation (or
    /// [`EtcdStore::ready`]) opens the client, inside the tokio runtime
    /// that runs it.
    pub fn new(config: EtcdConfig) -> Self {
        Self {
            members: Arc::new(Members::new(&config)),
            config,
            seen: AtomicI64::new(0),
            leases: Mutex::new(HashMap::new()),
            spares: Mutex::new(Vec::new()),
            wakeups: Arc::new(Wakeups {
                watchers: Watchers::default(),
                all: watch::channel(0).0,
            }),
            watching: Mutex::new(false),
            stop: CancellationToken::new(),
        }
    }

    /// A store for an `etcd://` URL ([`EtcdConfig::from_url`]), connecting
    /// lazily.
    ///
    /// # Errors
    /// As [`EtcdConfig::from_url`].
    pub fn open(url: &str) -> Result<Self> {
        Ok(Self::new(EtcdConfig::from_url(url)?))
    }

    /// A store for an `etcd://` URL, connected.
    ///
    /// # Errors
    /// As [`EtcdConfig::from_url`] and [`EtcdStore::ready`].
    pub async fn connect(url: &str) -> Result<Self> {
        let store = Self::open(url)?;
        store.ready().await?;
        Ok(store)
    }

    /// Opens the client and checks that the cluster answers (one read).
    ///
    /// # Errors
    /// A [`StoreError`] when no member answers, or authentication fails.
    pub async fn ready(&self) -> Result<()> {
        let key = format!("{}{LIVE}", self.config.prefix);
        let resp = self
            .rpc(
                "read from the cluster",
                Budget::plain(&self.config),
                |mut c| {
                    let key = key.clone();
                    async move { c.get(key, None).await }
                },
            )
            .await?;
        self.saw(resp.header());
        Ok(())
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// The keys of `work_id` (for operators and tests).
    pub fn keys(&self, work_id: &WorkId) -> EtcdKeys {
        EtcdKeys::new(&self.config.prefix, work_id)
    }

    /// A client of the member the store sends its requests to now
    /// (cloning it is cheap), for diagnostics and benchmarks beside the
    /// store's own calls.
    ///
    /// # Errors
    /// As [`EtcdStore::ready`].
    pub async fn client(&self) -> Result<Client> {
        self.rpc(
            "connect",
            Budget::plain(&self.config),
            |c| async move { Ok(c) },
        )
        .await
    }

    fn unreachable(&self, e: etcd_client::Error) -> Error {
        store_err(
            format!(
                "cannot reach the etcd cluster at {}",
                redact(&self.config.to_url())
            ),
            e,
        )
    }

    /// Runs one request on the preferred member, and on the next ones
    /// while it fails over ([`fails_over`]: no connection, no leader, no
    /// reply within the attempt timeout of `budget`, a broken connection),
    /// up to twice per member and until `budget` runs out. Sending a
    /// request again whose outcome is unknown is safe for every request the
    /// store sends: see "Endpoints and fail-over" in the module docs.
    async fn rpc<T, F, Fut>(&self, what: &str, budget: Budget, request: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let members = &self.members;
        let attempts = 2 * members.endpoints.len() + 1;
        let mut reached = false;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let i = members.preferred();
            let error = match budget.next_attempt() {
                None => tonic::Status::deadline_exceeded(format!(
                    "no member answered before the lease's TTL ran out ({} attempts)",
                    attempt - 1
                ))
                .into(),
                Some(limit) => {
                    let sent = async {
                        let client = members.client(i).await?;
                        request(client).await
                    };
                    match tokio::time::timeout(limit, sent).await {
                        Ok(Ok(v)) => return Ok(v),
                        Ok(Err(e)) => e,
                        Err(_) => tonic::Status::deadline_exceeded(format!(
                            "no reply from {} within {limit:?}",
                            members.endpoints[i]
                        ))
                        .into(),
                    }
                }
            };
            reached |= !never_reached(&error);
            let out_of_time = budget.next_attempt().is_none();
            if !fails_over(&error) || attempt >= attempts || out_of_time {
                return Err(if reached {
                    let hint = if closed_by_peer(&error) {
                        self.config.closed_hint()
                    } else {
                        ""
                    };
                    store_err(format!("{what}{hint}"), error)
                } else {
                    self.unreachable(error)
                });
            }
            tracing::debug!(
                member = %members.endpoints[i],
                error = %error,
                attempt,
                "etcd request failed: sending it to the next member"
            );
            members.failed(i);
        }
    }

    /// Notes the revision of a reply.
    fn saw(&self, header: Option<&ResponseHeader>) {
        if let Some(h) = header {
            self.seen.fetch_max(h.revision(), Ordering::Relaxed);
        }
    }

    async fn txn(&self, txn: Txn, what: &str, budget: Budget) -> Result<TxnResponse> {
        let resp = self
            .rpc(what, budget, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        self.saw(resp.header());
        Ok(resp)
    }

    /// Reads the keys of one work ID in one (linearizable) transaction.
    async fn snapshot(
        &self,
        keys: &EtcdKeys,
        with_checkpoint: bool,
        budget: Budget,
    ) -> Result<Snapshot> {
        let resp = self
            .txn(
                Txn::new().and_then(snapshot_ops(keys, with_checkpoint)),
                "read a lease",
                budget,
            )
            .await?;
        Snapshot::from_responses(resp.op_responses())
    }

    /// The snapshot a transaction's failure branch read.
    fn failure_snapshot(resp: &TxnResponse) -> Result<Snapshot> {
        Snapshot::from_responses(resp.op_responses())
    }

    async fn grant(&self, ttl: Duration, budget: Budget) -> Result<Granted> {
        let sent = Instant::now();
        let resp = self
            .rpc("grant an etcd lease", budget, |mut c| async move {
                c.lease_grant(ttl_secs(ttl), None).await
            })
            .await?;
        self.saw(resp.header());
        Ok(Granted {
            id: resp.id(),
            ttl_s: resp.ttl(),
            asked_s: ttl_secs(ttl),
            renewed: sent,
            state_rev: 0,
        })
    }

    /// An etcd lease for a new acquisition with `ttl`: a spare one with
    /// the same TTL, renewed now (its countdown starts again after the
    /// caller sent its request, as a new one's would), or a new one.
    async fn lease_for(&self, ttl: Duration, budget: Budget) -> Result<Granted> {
        let asked = ttl_secs(ttl);
        loop {
            let spare = self.spares.lock().ok().and_then(|mut spares| {
                // Stale ones are of no use: etcd may be ending them.
                spares.retain(|g| g.fresh(SPARE_MARGIN));
                let i = spares.iter().position(|g| g.asked_s == asked)?;
                Some(spares.swap_remove(i))
            });
            let Some(spare) = spare else {
                return self.grant(ttl, budget).await;
            };
            let sent = Instant::now();
            if self.keep_alive(spare.id, budget).await? {
                return Ok(Granted {
                    renewed: sent,
                    state_rev: 0,
                    ..spare
                });
            }
        }
    }

    /// Keeps the etcd lease of a released acquisition for the next one, or
    /// revokes it (one not granted by this store for an acquisition, one
    /// about to end, or one too many).
    fn spare(&self, granted: Option<Granted>, id: i64) {
        if let Some(g) = granted.filter(|g| g.id == id && g.asked_s > 0) {
            if let Ok(mut spares) = self.spares.lock() {
                if spares.len() < SPARES && g.fresh(SPARE_MARGIN) {
                    spares.push(g);
                    return;
                }
            }
        }
        self.discard(id);
    }

    /// Revokes an etcd lease that no key of the store uses any more, in
    /// the background (best effort: unrevoked, it expires with its TTL).
    fn discard(&self, id: i64) {
        let Some(mut client) = self.members.connected() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = client.lease_revoke(id).await {
                    tracing::debug!(lease = id, error = %e, "cannot revoke an unused etcd lease: it expires with its TTL");
                }
            });
        }
    }

    /// Renews etcd lease `id` once; false when etcd no longer has it.
    async fn keep_alive(&self, id: i64, budget: Budget) -> Result<bool> {
        // A stream: `rpc`'s attempt timeout bounds the whole of it (the
        // reply may wait for a new leader), not only its opening.
        self.rpc("renew the etcd lease", budget, |mut c| async move {
            match c.lease_keep_alive(id).await {
                Ok(_) => Ok(true),
                // etcd answers a renewal of an unknown lease with a TTL of
                // 0, which the client turns into this error.
                Err(etcd_client::Error::LeaseKeepAliveError(m)) if m.contains("not found") => {
                    Ok(false)
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// The time left on etcd lease `id`, rounded up to whole seconds
    /// (etcd reports whole seconds, rounded down); `None` when it is gone
    /// or cannot be read.
    async fn time_left(&self, id: i64, budget: Budget) -> Option<Duration> {
        let resp = self
            .rpc("read an etcd lease", budget, |mut c| async move {
                c.lease_time_to_live(id, None).await
            })
            .await
            .ok()?;
        let ttl = u64::try_from(resp.ttl()).ok()?;
        Some(Duration::from_secs(ttl + 1))
    }

    fn remember(&self, work_id: &WorkId, token: u64, granted: Granted) {
        if let Ok(mut leases) = self.leases.lock() {
            if leases.len() >= LEASE_CACHE {
                // Forgetting costs a read at the next renewal, nothing more.
                leases.clear();
            }
            leases.insert((work_id.clone(), token), granted);
        }
    }

    fn forget(&self, work_id: &WorkId, token: u64) {
        if let Ok(mut leases) = self.leases.lock() {
            leases.remove(&(work_id.clone(), token));
        }
    }

    /// The budget of an operation on `lease` without a TTL of its own
    /// (release, read checkpoint): that of the TTL its etcd lease was
    /// granted, when this store knows it.
    fn budget_of(&self, lease: LeaseRef<'_>) -> Budget {
        match self.remembered(lease.work_id, lease.fencing_token) {
            Some(g) if g.ttl_s > 0 => Budget::lease(
                &self.config,
                Duration::from_secs(u64::try_from(g.ttl_s).unwrap_or(0)),
            ),
            _ => Budget::plain(&self.config),
        }
    }

    fn remembered(&self, work_id: &WorkId, token: u64) -> Option<Granted> {
        self.leases
            .lock()
            .ok()?
            .get(&(work_id.clone(), token))
            .copied()
    }

    /// Extends `lease` to `ttl` from now (and stores `checkpoint`, if
    /// any), in one transaction after the etcd lease's renewal. The
    /// transaction compares the token, the holder, the etcd lease and the
    /// revision of `state` this store last saw: sent twice (a member that
    /// hung, then the next one), it applies at most once per revision of
    /// `state`, and a copy applied late cannot undo a newer checkpoint.
    async fn extend(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        checkpoint: Option<Bytes>,
    ) -> Result<SystemTime> {
        let keys = self.keys(lease.work_id);
        let want = ttl_secs(ttl);
        let budget = Budget::lease(&self.config, ttl);
        let mut known = self.remembered(lease.work_id, lease.fencing_token);
        for _ in 0..RACE_RETRIES {
            let current = match known {
                Some(g) => g,
                None => {
                    // Another process's acquisition, one this store forgot,
                    // or one whose `state` moved: learn its etcd lease and
                    // the revision of its state first.
                    let snap = self.snapshot(&keys, false, budget).await?;
                    let live = snap.check(lease)?;
                    Granted {
                        id: live.lease(),
                        ttl_s: snap.granted(),
                        asked_s: 0,
                        renewed: Instant::now(),
                        state_rev: snap.state.as_ref().map_or(0, |(_, r)| *r),
                    }
                }
            };
            // The etcd lease must last the TTL from now: renew it when it
            // was granted at least as long, else move to a new one.
            let sent = Instant::now();
            let attached = if current.ttl_s >= want {
                if !self.keep_alive(current.id, budget).await? {
                    // etcd answers so only once it deleted the lease's
                    // keys; ours may have moved to another lease meanwhile
                    // (another handle of the holder).
                    self.forget(lease.work_id, lease.fencing_token);
                    let snap = self.snapshot(&keys, false, budget).await?;
                    if snap.check(lease)?.lease() == current.id {
                        return Err(Error::Expired {
                            work_id: lease.work_id.to_string(),
                            fencing_token: lease.fencing_token,
                        });
                    }
                    known = None;
                    continue;
                }
                Granted {
                    renewed: sent,
                    ..current
                }
            } else {
                self.grant(ttl, budget).await?
            };
            let moved = attached.id != current.id;
            let state = State {
                token: lease.fencing_token,
                phase: Phase::Held.as_str().to_string(),
                at_ms: now_ms().saturating_add(millis(ttl)),
                granted_s: attached.ttl_s,
            };
            let mut ops = vec![TxnOp::put(keys.state.as_str(), to_json(&state), None)];
            if moved {
                ops.push(TxnOp::put(
                    keys.live.as_str(),
                    lease.holder_id.as_str(),
                    Some(PutOptions::new().with_lease(attached.id)),
                ));
            }
            if let Some(data) = &checkpoint {
                ops.push(TxnOp::put(keys.checkpoint.as_str(), data.to_vec(), None));
            }
            let txn = Txn::new()
                .when([
                    Compare::create_revision(
                        keys.live.as_str(),
                        CompareOp::Equal,
                        i64::try_from(lease.fencing_token).unwrap_or(-1),
                    ),
                    Compare::value(
                        keys.live.as_str(),
                        CompareOp::Equal,
                        lease.holder_id.as_str(),
                    ),
                    Compare::lease(keys.live.as_str(), CompareOp::Equal, current.id),
                    Compare::mod_revision(keys.state.as_str(), CompareOp::Equal, current.state_rev),
                ])
                .and_then(ops)
                .or_else(snapshot_ops(&keys, false));
            let what = if checkpoint.is_some() {
                "checkpoint"
            } else {
                "renew"
            };
            let resp = match self.txn(txn, what, budget).await {
                Ok(r) => r,
                Err(e) => {
                    if moved {
                        self.discard(attached.id);
                    }
                    return Err(e);
                }
            };
            if resp.succeeded() {
                if moved {
                    self.discard(current.id);
                }
                let state_rev = resp.header().map_or(0, ResponseHeader::revision);
                self.remember(
                    lease.work_id,
                    lease.fencing_token,
                    Granted {
                        state_rev,
                        ..attached
                    },
                );
                return Ok(SystemTime::now() + ttl);
            }
            if moved {
                self.discard(attached.id);
            }
            let snap = Self::failure_snapshot(&resp)?;
            if let Err(e) = snap.check(lease) {
                self.forget(lease.work_id, lease.fencing_token);
                return Err(e);
            }
            // Still ours, but on another etcd lease or with a newer state
            // (another handle of the holder, or this renewal's own earlier
            // copy, applied by a member that did not answer in time): learn
            // them, again.
            known = None;
        }
        Err(StoreError::new(
            KIND,
            format!(
                "the etcd lease of {} kept changing under {RACE_RETRIES} renewals",
                lease.work_id
            ),
        )
        .into())
    }

    /// Everything `status` shows of one work ID, or `None` when it was
    /// never acquired.
    async fn inspect_one(&self, work_id: WorkId) -> Result<Option<LeaseInfo>> {
        let keys = self.keys(&work_id);
        let budget = Budget::plain(&self.config);
        let snap = self.snapshot(&keys, true, budget).await?;
        let left = match snap.live_of_current() {
            Some(live) => self.time_left(live.lease(), budget).await,
            None => None,
        };
        Ok(lease_info(work_id, &snap, left))
    }

    /// Every work ID with an acquisition under the prefix, listed in pages.
    async fn list_work_ids(&self) -> Result<BTreeSet<WorkId>> {
        let base = format!("{}{ACQ}", self.config.prefix);
        let end = prefix_end(base.as_bytes());
        let mut from = base.clone().into_bytes();
        let mut ids = BTreeSet::new();
        loop {
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_keys_only()
                .with_limit(PAGE);
            let resp = self
                .rpc("list the leases", Budget::plain(&self.config), |mut c| {
                    let (from, options) = (from.clone(), options.clone());
                    async move { c.get(from, Some(options)).await }
                })
                .await?;
            self.saw(resp.header());
            let kvs = resp.kvs();
            ids.extend(
                kvs.iter()
                    .filter_map(|kv| work_id_of(&self.config.prefix, ACQ, kv.key())),
            );
            match kvs.last() {
                Some(last) if resp.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(ids),
            }
        }
    }

    /// Starts the watch task if it is not running; false where it cannot
    /// run (no client yet, no tokio runtime here, a poisoned lock).
    fn start_watching(&self, from: i64) -> bool {
        let Ok(mut watching) = self.watching.lock() else {
            return false;
        };
        if *watching {
            return true;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let task = WatchTask {
            members: self.members.clone(),
            prefix: self.config.prefix.clone(),
            wakeups: self.wakeups.clone(),
        };
        runtime.spawn(task.run(from, self.stop.child_token()));
        *watching = true;
        true
    }
}

/// Whether `live`, the lease key a snapshot read, is the acquisition an
/// earlier copy of this store's acquire transaction made with the etcd
/// lease `granted`: attached to that etcd lease (granted, or renewed from
/// the spares, for this call alone: no other key uses it), naming
/// `holder`, and the current acquisition (its create revision is the
/// revision of `acq`).
fn applied_ours(snap: &Snapshot, live: &KeyValue, granted: &Granted, holder: &HolderId) -> bool {
    live.lease() == granted.id
        && live.value() == holder.as_str().as_bytes()
        && snap.live_of_current().is_some()
}

/// A [`LeaseInfo`] from a snapshot (with its checkpoint) and the time
/// left on the live lease, if any.
fn lease_info(work_id: WorkId, snap: &Snapshot, left: Option<Duration>) -> Option<LeaseInfo> {
    let (acq, token) = snap.acq.as_ref()?;
    let live = snap.live_of_current().is_some();
    let phase = snap.phase().unwrap_or(Phase::Held);
    let now = SystemTime::now();
    let expires_in = if live {
        Some(left.unwrap_or_default())
    } else {
        None
    };
    let expires_at = match (expires_in, snap.state_of(*token)) {
        (Some(left), _) => now + left,
        (None, Some(state)) => wall(state.at_ms),
        (None, None) => wall(acq.exp_ms),
    };
    Some(LeaseInfo {
        work_id,
        holder_id: acq.holder.clone(),
        fencing_token: *token,
        expires_at,
        expires_in,
        expired: !live,
        released: !live && phase == Phase::Released,
        ended: (!live).then(|| snap.end()),
        checkpoint_bytes: snap.checkpoint.as_ref().map_or(0, Bytes::len),
        handoff: Handoff {
            previous: snap.previous(),
        },
    })
}

#[async_trait]
impl LeaseStore for EtcdStore {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn acquire(
        &self,
        work_id: &WorkId,
        holder_id: &HolderId,
        ttl: Duration,
    ) -> Result<Grant> {
        let keys = self.keys(work_id);
        let budget = Budget::lease(&self.config, ttl);
        // Granted once, on the first attempt that finds the lease free; its
        // countdown started after the caller sent its request, so it stays
        // valid for later attempts.
        let mut granted: Option<Granted> = None;
        let result = async {
            for _ in 0..RACE_RETRIES {
                let snap = self.snapshot(&keys, false, budget).await?;
                if let Some(live) = &snap.live {
                    if let Some(g) = granted.filter(|g| applied_ours(&snap, live, g, holder_id)) {
                        // A copy of our transaction that a member did not
                        // answer in time was applied: the acquisition is
                        // ours.
                        let token = token_of(live.create_revision());
                        let state_rev = snap.state.as_ref().map_or(0, |(_, r)| *r);
                        self.remember(work_id, token, Granted { state_rev, ..g });
                        return Ok(Grant {
                            fencing_token: token,
                            expires_at: SystemTime::now() + ttl,
                            handoff: Handoff {
                                previous: snap.previous(),
                            },
                        });
                    }
                    // Live for everyone, the same holder ID included (ADR 0002).
                    return Err(Error::Held {
                        work_id: work_id.to_string(),
                        holder_id: String::from_utf8_lossy(live.value()).into_owned(),
                        expires_in: self.time_left(live.lease(), budget).await,
                    });
                }
                let lease = match granted {
                    Some(g) => g,
                    None => *granted.insert(self.lease_for(ttl, budget).await?),
                };
                let prev = snap.acq.as_ref().map(|(acq, token)| StoredPrevious {
                    holder: acq.holder.clone(),
                    token: *token,
                    end: snap.end().as_str().to_string(),
                });
                let acquisition = Acquisition {
                    holder: holder_id.to_string(),
                    ttl_ms: millis(ttl),
                    granted_s: lease.ttl_s,
                    exp_ms: now_ms().saturating_add(millis(ttl)),
                    prev,
                };
                let acq_rev = snap.acq.as_ref().map_or(0, |(_, t)| *t);
                let state_rev = snap.state.as_ref().map_or(0, |(_, r)| *r);
                let txn = Txn::new()
                    .when([
                        Compare::create_revision(keys.live.as_str(), CompareOp::Equal, 0),
                        Compare::mod_revision(
                            keys.acquisition.as_str(),
                            CompareOp::Equal,
                            i64::try_from(acq_rev).unwrap_or(-1),
                        ),
                        Compare::mod_revision(keys.state.as_str(), CompareOp::Equal, state_rev),
                    ])
                    .and_then([
                        TxnOp::put(
                            keys.live.as_str(),
                            holder_id.as_str(),
                            Some(PutOptions::new().with_lease(lease.id)),
                        ),
                        TxnOp::put(keys.acquisition.as_str(), to_json(&acquisition), None),
                        TxnOp::delete(keys.state.as_str(), None),
                    ]);
                let resp = self.txn(txn, "acquire", budget).await?;
                if !resp.succeeded() {
                    continue; // another writer came between: read again
                }
                let token = resp
                    .header()
                    .map(|h| token_of(h.revision()))
                    .filter(|t| *t > 0)
                    .ok_or_else(|| bad_value("a transaction reply without a revision"))?;
                self.remember(work_id, token, Granted { state_rev: 0, ..lease });
                let previous = acquisition.prev.and_then(|p| {
                    Some(PreviousHolder {
                        holder_id: p.holder,
                        fencing_token: p.token,
                        ended: LeaseEnd::from_str(&p.end)?,
                    })
                });
                return Ok(Grant {
                    fencing_token: token,
                    expires_at: SystemTime::now() + ttl,
                    handoff: Handoff { previous },
                });
            }
            Err(StoreError::new(
                KIND,
                format!("the lease of {work_id} kept changing under {RACE_RETRIES} acquisition attempts"),
            )
            .into())
        }
        .await;
        if result.is_err() {
            if let Some(g) = granted {
                self.discard(g.id);
            }
        }
        result
    }

    async fn renew(&self, lease: LeaseRef<'_>, ttl: Duration) -> Result<SystemTime> {
        self.extend(lease, ttl, None).await
    }

    async fn checkpoint(
        &self,
        lease: LeaseRef<'_>,
        ttl: Duration,
        data: Bytes,
    ) -> Result<SystemTime> {
        self.extend(lease, ttl, Some(data)).await
    }

    async fn read_checkpoint(&self, lease: LeaseRef<'_>) -> Result<Checkpoint> {
        let snap = self
            .snapshot(&self.keys(lease.work_id), true, self.budget_of(lease))
            .await?;
        snap.check(lease)?;
        Ok(Checkpoint {
            data: snap.checkpoint.clone(),
            handoff: Handoff {
                previous: snap.previous(),
            },
        })
    }

    async fn release(&self, lease: LeaseRef<'_>) -> Result<()> {
        let keys = self.keys(lease.work_id);
        let state = State {
            token: lease.fencing_token,
            phase: Phase::Released.as_str().to_string(),
            at_ms: now_ms(),
            granted_s: 0,
        };
        let txn = Txn::new()
            .when([
                Compare::create_revision(
                    keys.live.as_str(),
                    CompareOp::Equal,
                    i64::try_from(lease.fencing_token).unwrap_or(-1),
                ),
                Compare::value(
                    keys.live.as_str(),
                    CompareOp::Equal,
                    lease.holder_id.as_str(),
                ),
            ])
            .and_then([
                TxnOp::delete(
                    keys.live.as_str(),
                    Some(DeleteOptions::new().with_prev_key()),
                ),
                TxnOp::put(keys.state.as_str(), to_json(&state), None),
            ])
            .or_else(snapshot_ops(&keys, false));
        let resp = self.txn(txn, "release", self.budget_of(lease)).await?;
        if !resp.succeeded() {
            return Err(Self::failure_snapshot(&resp)?.refusal(lease));
        }
        let granted = self.remembered(lease.work_id, lease.fencing_token);
        self.forget(lease.work_id, lease.fencing_token);
        if let Some(TxnOpResponse::Delete(d)) = resp.op_responses().first() {
            if let Some(prev) = d.prev_kvs().first() {
                self.spare(granted, prev.lease());
            }
        }
        Ok(())
    }

    async fn inspect(&self, work_ids: &[WorkId]) -> Result<Vec<LeaseInfo>> {
        super::inspect_each(work_ids, self.list_work_ids(), |id| self.inspect_one(id)).await
    }

    async fn revoke(&self, work_id: &WorkId) -> Result<Option<LeaseInfo>> {
        let keys = self.keys(work_id);
        let budget = Budget::plain(&self.config);
        for _ in 0..RACE_RETRIES {
            let snap = self.snapshot(&keys, true, budget).await?;
            let Some(token) = snap.token() else {
                return Ok(None);
            };
            let Some(live) = snap.live_of_current() else {
                // Not live: nothing to end.
                return Ok(lease_info(work_id.clone(), &snap, None));
            };
            let before = lease_info(
                work_id.clone(),
                &snap,
                self.time_left(live.lease(), budget).await,
            );
            let state = State {
                token,
                phase: Phase::Revoked.as_str().to_string(),
                at_ms: now_ms(),
                granted_s: 0,
            };
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    keys.live.as_str(),
                    CompareOp::Equal,
                    live.mod_revision(),
                )])
                .and_then([
                    TxnOp::delete(keys.live.as_str(), None),
                    TxnOp::put(keys.state.as_str(), to_json(&state), None),
                ]);
            if self.txn(txn, "revoke", budget).await?.succeeded() {
                self.forget(work_id, token);
                self.discard(live.lease());
                return Ok(before);
            }
        }
        Err(StoreError::new(
            KIND,
            format!(
                "the lease of {work_id} kept changing under {RACE_RETRIES} revocation attempts"
            ),
        )
        .into())
    }

    /// Registers the waiter, then starts the store's watch if this is its
    /// first waiter, from the revision after the newest one the store has
    /// seen: every deletion of a `live` key after this call has a larger
    /// revision, so it reaches the waiter even if the watch is set up only
    /// later. Before the store has seen any revision, the future is ready
    /// at once (one spurious wake-up: the waiter's next attempt reads).
    fn watch(&self, work_id: &WorkId) -> Option<BoxFuture<'static, ()>> {
        let one = self.wakeups.watchers.watch(work_id)?;
        let seen = self.seen.load(Ordering::Relaxed);
        if seen == 0 {
            return Some(Box::pin(std::future::ready(())));
        }
        if !self.start_watching(seen + 1) {
            return None;
        }
        let mut all = self.wakeups.all.subscribe();
        Some(Box::pin(async move {
            tokio::select! {
                () = one => {}
                // An error means the store is gone: nothing more will change.
                _ = all.changed() => {}
            }
        }))
    }
}

// ---------------------------------------------------------------------
// The watch.

/// The store's one watch on its `live` keys.
struct WatchTask {
    members: Arc<Members>,
    prefix: String,
    wakeups: Arc<Wakeups>,
}

impl WatchTask {
    /// Watches deletions of `live` keys from revision `from` on, until
    /// `stop`, watching again after every broken stream from the revision
    /// after the last event seen, on the next member after a member that
    /// failed it.
    async fn run(self, mut from: i64, stop: CancellationToken) {
        let base = format!("{}{LIVE}", self.prefix);
        let mut backoff = REWATCH_MIN;
        loop {
            let options = WatchOptions::new()
                .with_prefix()
                .with_start_revision(from)
                .with_filters([WatchFilterType::NoPut])
                .with_progress_notify();
            let member = self.members.preferred();
            let watched = tokio::select! {
                () = stop.cancelled() => return,
                w = async {
                    let mut client = self.members.client(member).await?;
                    client.watch(base.as_str(), Some(options)).await
                } => w,
            };
            match watched {
                Ok(mut stream) => loop {
                    let message = tokio::select! {
                        () = stop.cancelled() => return,
                        m = stream.message() => m,
                    };
                    match message {
                        Ok(Some(resp)) => {
                            backoff = REWATCH_MIN;
                            if resp.compact_revision() > 0 {
                                // The revisions we missed are gone: wake
                                // everyone, go on from the oldest one kept.
                                tracing::debug!(
                                    from,
                                    compacted = resp.compact_revision(),
                                    "etcd watch fell behind a compaction: waking every waiter"
                                );
                                from = from.max(resp.compact_revision());
                                self.wakeups.all.send_modify(|n| *n += 1);
                                break;
                            }
                            for event in resp.events() {
                                if let Some(kv) = event.kv() {
                                    if let Some(id) = work_id_of(&self.prefix, LIVE, kv.key()) {
                                        self.wakeups.watchers.notify(&id);
                                    }
                                    from = from.max(kv.mod_revision() + 1);
                                }
                            }
                            if resp.events().is_empty() && !resp.created() {
                                // A progress notice: every later event has
                                // a larger revision than its header's.
                                if let Some(h) = resp.header() {
                                    from = from.max(h.revision() + 1);
                                }
                            }
                            if resp.canceled() {
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(error = %e, "etcd watch broke: watching again");
                            self.members.failed(member);
                            break;
                        }
                    }
                },
                Err(e) => {
                    tracing::debug!(error = %e, "cannot watch etcd: trying again");
                    self.members.failed(member);
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(REWATCH_MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> WorkId {
        WorkId::new(s).expect("valid")
    }

    fn reason(url: &str) -> String {
        match EtcdConfig::from_url(url) {
            Err(Error::Invalid(InvalidInput::StoreUrl { url, reason })) => {
                format!("{url} | {reason}")
            }
            other => panic!("expected a StoreUrl error for {url:?}, got {other:?}"),
        }
    }

    #[test]
    fn keys_are_injective_and_stay_under_the_prefix() {
        let ids = [
            "jobs/a",
            "jobs/a/b",
            "jobs/ab",
            "jobs%2Fa",
            "jobs/%",
            "jobs/%25",
            "../../etc",
            "a/../../b",
            "x y:ü🚀",
            "live/x",
        ];
        let mut seen = std::collections::HashSet::new();
        for s in ids {
            let k = EtcdKeys::new("p/", &id(s));
            for (key, kind) in [
                (&k.live, LIVE),
                (&k.acquisition, ACQ),
                (&k.state, STATE),
                (&k.checkpoint, CKPT),
            ] {
                assert!(key.starts_with(&format!("p/{kind}")), "{key}");
                let rest = &key[format!("p/{kind}").len()..];
                assert!(!rest.contains('/'), "{key}: the ID is one segment");
                assert!(seen.insert(key.clone()), "{key} collides");
            }
            assert_eq!(work_id_of("p/", ACQ, k.acquisition.as_bytes()), Some(id(s)));
            assert_eq!(work_id_of("p/", LIVE, k.live.as_bytes()), Some(id(s)));
            assert_eq!(work_id_of("p/", ACQ, k.live.as_bytes()), None);
            assert_eq!(work_id_of("q/", ACQ, k.acquisition.as_bytes()), None);
        }
        // Keys of another program, or of a store whose prefix extends ours.
        for key in ["p/acq/%41", "p/acq/a/b", "p/acq/", "p/acq/%zz"] {
            assert_eq!(work_id_of("p/", ACQ, key.as_bytes()), None, "{key}");
        }
    }

    #[test]
    fn prefix_ranges_end_right_after_the_prefix() {
        assert_eq!(prefix_end(b"p/acq/"), b"p/acq0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1000)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_secs(Duration::from_millis(1500)), 2);
        assert_eq!(ttl_secs(Duration::new(2, 1)), 3);
        assert_eq!(ttl_secs(crate::limits::MAX_TTL), 7 * 24 * 3600);
    }

    #[test]
    fn urls_parse_with_members_user_and_prefix() {
        let c = EtcdConfig::from_url("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(c.hosts(), ["127.0.0.1:2379"]);
        assert_eq!(c.get_prefix(), DEFAULT_PREFIX);
        assert_eq!(c.to_url(), "etcd://127.0.0.1:2379");
        let c = EtcdConfig::from_url(
            "ETCD://app:p%40ss%2Fw@h1,h2:32379,[::1]:2380/?prefix=jobs%2Fprod%2F",
        )
        .unwrap();
        assert_eq!(c.hosts(), ["h1:2379", "h2:32379", "[::1]:2380"]);
        assert_eq!(c.user, Some(("app".to_string(), "p@ss/w".to_string())));
        assert_eq!(c.get_prefix(), "jobs/prod/");
        assert_eq!(
            c.endpoints(),
            ["http://h1:2379", "http://h2:32379", "http://[::1]:2380"]
        );
        // The URL round-trips, and never shows the password through Debug.
        assert_eq!(EtcdConfig::from_url(&c.to_url()).unwrap(), c);
        assert!(!format!("{c:?}").contains("p%40ss"), "{c:?}");
        let store = EtcdStore::new(c);
        assert!(!format!("{store:?}").contains("p%40ss"), "{store:?}");
        let c = EtcdConfig::new(["a", "b:1"]).unwrap().prefix("x/").unwrap();
        assert_eq!(c.to_url(), "etcd://a:2379,b:1/?prefix=x%2F");
        // A prefix without its trailing `/` gets one: `app` names the keys
        // `app/live/...`, not `applive/...`.
        let c = EtcdConfig::from_url("etcd://h?prefix=app").unwrap();
        assert_eq!(c.get_prefix(), "app/");
        assert_eq!(
            EtcdConfig::new(["h"])
                .unwrap()
                .prefix("app")
                .unwrap()
                .get_prefix(),
            "app/"
        );
    }

    #[test]
    fn bad_urls_are_refused_clearly_and_redacted() {
        let r = reason("etcd://app:s3cret@h?prefix=a/&prefix=b/");
        assert!(
            r.contains("\"prefix\" appears twice") && !r.contains("s3cret"),
            "{r}"
        );
        let r = reason("etcd://app:s3cret@h?prefx=a");
        assert!(r.contains("unknown parameter \"prefx\""), "{r}");
        assert!(!r.contains("s3cret") && r.contains("app:***@h"), "{r}");
        assert!(reason("etcd://h?cacert=%2Fca.pem").contains("write etcds://"));
        if !cfg!(feature = "etcd-tls") {
            assert!(reason("etcds://h").contains("cargo feature `etcd-tls`"));
        }
        assert!(reason("etcd://h/leases").contains("no path"));
        assert!(reason("etcd://").contains("not HOST"));
        assert!(reason("etcd://h1,,h2").contains("not HOST"));
        assert!(reason("etcd://h:0").contains("not HOST"));
        assert!(reason("etcd://h:99999").contains("not HOST"));
        assert!(reason("etcd://h x").contains("not HOST"));
        assert!(reason("etcd://[zz]:1").contains("not HOST"));
        assert!(reason("etcd://h?prefix=").contains("empty"));
        assert!(reason("etcd://h?prefix=a%0Ab").contains("control"));
        assert!(reason(&format!("etcd://h?prefix={}", "x".repeat(300))).contains("256"));
        assert!(reason("etcd://h#x").contains("fragment"));
        assert!(reason("etcd://:pw@h").contains("user name"));
        assert!(reason("redis://h").contains("etcd://"));
        assert!(EtcdConfig::new(Vec::<String>::new()).is_err());
    }

    #[cfg(feature = "etcd-tls")]
    #[test]
    fn tls_urls_read_their_pem_files_and_name_them_in_errors() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["h".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let enc = |p: &str| utf8_percent_encode(p, URL_ESCAPED).to_string();
        let ca = write("ca.pem", &cert.pem());
        let key_file = write("key.pem", &key.serialize_pem());
        let bad = write("bad.pem", "S3cretContents");

        // System roots without cacert.
        let c = EtcdConfig::from_url("etcds://h1,h2:1?prefix=p").unwrap();
        assert!(c.is_tls());
        assert_eq!(c.endpoints(), ["https://h1:2379", "https://h2:1"]);
        assert_eq!(c.to_url(), "etcds://h1:2379,h2:1/?prefix=p%2F");
        let url = format!(
            "etcds://app:pw@h?cacert={}&cert={}&key={}",
            enc(&ca),
            enc(&ca),
            enc(&key_file)
        );
        let c = EtcdConfig::from_url(&url).unwrap();
        assert_eq!(EtcdConfig::from_url(&c.to_url()).unwrap(), c);
        assert!(!EtcdConfig::from_url("etcd://h").unwrap().is_tls());

        let missing = dir.path().join("missing.pem").display().to_string();
        for (query, names, says) in [
            (
                format!("cacert={}", enc(&bad)),
                &bad,
                "does not hold PEM certificates",
            ),
            (
                format!("cacert={}", enc(&missing)),
                &missing,
                "cannot read cacert",
            ),
            (
                format!("cert={}&key={}", enc(&ca), enc(&bad)),
                &bad,
                "does not hold a PEM private key",
            ),
            (
                format!("cert={}&key={}", enc(&key_file), enc(&key_file)),
                &key_file,
                "does not hold PEM certificates",
            ),
        ] {
            let r = reason(&format!("etcds://h?{query}"));
            assert!(r.contains(names.as_str()) && r.contains(says), "{r}");
            assert!(
                !r.contains("S3cretContents") && !r.contains("PRIVATE"),
                "{r}"
            );
        }
        let r = reason(&format!("etcds://h?cert={}", enc(&ca)));
        assert!(r.contains("both cert=PATH and key=PATH"), "{r}");
        let r = reason("etcds://h?cacert=a&cacert=b");
        assert!(r.contains("\"cacert\" appears twice"), "{r}");
    }

    #[test]
    fn versions_without_the_lease_revoke_fix_are_recognised() {
        for v in ["3.4.23", "3.4.29", "3.5.0", "3.5.12", "3.3.27"] {
            assert!(lacks_lease_revoke_fix(v), "{v}");
        }
        for v in [
            "3.4.30", "3.4.35", "3.5.13", "3.5.17", "3.6.0", "4.0.0", "", "x.y.z", "3.5",
        ] {
            assert!(!lacks_lease_revoke_fix(v), "{v}");
        }
    }

    #[test]
    fn no_reason_quotes_user_info_or_a_bad_member() {
        // A raw '?' or '/' in the password ends the authority before '@'.
        for url in [
            "etcd://app:S3cretPart?rest@127.0.0.1:32479",
            "etcd://app:S3cretPart/rest@127.0.0.1:32479",
            "etcd://app:1234?S3cretPart@h",
            "etcd://h1,app:S3cretPart?x@h2",
        ] {
            let r = reason(url);
            assert!(
                !r.contains("S3cretPart") && !r.contains("rest") && r.contains("percent-encode"),
                "{url}: {r}"
            );
        }
        // A member that does not parse is named by its position and why.
        for (url, why) in [
            (
                "etcd://h1,S3cretPart x",
                "2 of 2 is not HOST or HOST:PORT: the host has a character",
            ),
            (
                "etcd://h:S3cretPart",
                "1 of 1 is not HOST or HOST:PORT: the port is not a number",
            ),
            (
                "etcd://h,[S3cretPart]:1,h",
                "2 of 3 is not HOST or HOST:PORT: an address in brackets",
            ),
            (
                "etcd://[::1]S3cretPart",
                "1 of 1 is not HOST or HOST:PORT: only :PORT",
            ),
            (
                "etcd://h1,,h2",
                "2 of 3 is not HOST or HOST:PORT: the host is empty",
            ),
        ] {
            // The reason only: the redacted URL shows host names.
            let r = reason(url);
            let (_, why_given) = r.split_once(" | ").unwrap();
            assert!(
                why_given.contains(why) && !why_given.contains("S3cretPart"),
                "{url}: {r}"
            );
        }
        // A user name with an encoded colon is user info too: masked.
        let r = reason("etcd://app%3AS3cretPart@h?prefx=a");
        assert!(
            !r.contains("S3cretPart") && r.contains("etcd://***@h"),
            "{r}"
        );
        let err = EtcdConfig::new(["h", "app:S3cretPart"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("endpoint 2 of 2") && !err.contains("S3cretPart"),
            "{err}"
        );
    }
}
