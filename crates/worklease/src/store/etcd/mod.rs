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

// The code by concern: the configuration (`config`) and its URL (`url`);
// the key layout (`keys`) and what one read of a work ID's keys says
// (`snapshot`); one client per member (`members`) and sending a request
// with fail-over (`rpc`); the etcd leases of acquisitions (`leases`); the
// operations (`ops`: the `LeaseStore` implementation, with acquire, read
// checkpoint, release and revoke; `renew`: renewal and checkpoint;
// `inspect`); and the watch for push hand-off (`watch`).
mod acquire;
mod batch;
mod config;
mod inspect;
mod keys;
mod leases;
mod members;
mod observe;
mod ops;
mod renew;
mod rpc;
mod snapshot;
mod url;
mod watch;

pub use config::{
    EtcdConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT, DEFAULT_PREFIX, DEFAULT_REQUEST_TIMEOUT,
    MAX_PREFIX_BYTES,
};
pub use keys::EtcdKeys;

use std::collections::HashMap;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::Client;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
#[cfg(doc)]
use crate::error::{InvalidInput, StoreError};
use crate::limits::WorkId;
use crate::store::notify::Watchers;

use keys::LIVE;
use leases::{Granted, Sessions};
use members::Members;
use observe::Observations;
use rpc::Budget;
use snapshot::Free;
use watch::Wakeups;

const KIND: &str = "etcd";

/// etcd's default `--max-txn-ops`: the most operations (or compares) one
/// branch of a transaction may hold. A batch is one transaction whose
/// success branch holds one nested transaction per lease, and etcd gives
/// a nested transaction what its parent leaves of the limit: a batch of
/// `n` leases whose nested transactions hold up to [`NESTED_OPS`]
/// operations per branch needs `n + NESTED_OPS <= max_txn_ops`. So
/// [`LeaseStore::max_batch`](crate::LeaseStore::max_batch) is
/// `max_txn_ops - NESTED_OPS`, 124 by default; a cluster run with another
/// `--max-txn-ops` takes `max_txn_ops=N` in the store URL
/// ([`EtcdConfig::max_txn_ops`]).
pub const MAX_TXN_OPS: usize = 128;

/// The most operations (compares, or requests of one branch) of the
/// nested transaction a batch holds per lease.
pub const NESTED_OPS: usize = 4;

/// How often a transaction is tried again when another writer got between
/// its read and its write.
const RACE_RETRIES: usize = 8;

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
    /// What this store knows of its acquisitions, by (work ID, token).
    leases: Mutex<HashMap<(WorkId, u64), Granted>>,
    /// The session leases, by holder and TTL in etcd seconds.
    sessions: Mutex<Sessions>,
    /// Work IDs this store saw free, for its next acquisitions.
    free: Mutex<HashMap<WorkId, Free>>,
    /// When this store first saw each version of leases held by others.
    observed: Mutex<Observations>,
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
            sessions: Mutex::new(HashMap::new()),
            free: Mutex::new(HashMap::new()),
            observed: Mutex::new(HashMap::new()),
            wakeups: Arc::new(Wakeups {
                watchers: Watchers::default(),
                all: tokio::sync::watch::channel(0).0,
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

    /// The most leases one batch call names.
    fn max_batch_len(&self) -> usize {
        self.config.max_txn_ops.saturating_sub(NESTED_OPS).max(1)
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
}
