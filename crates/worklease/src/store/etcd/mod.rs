//! The etcd store (feature `etcd`): leases in an etcd v3 cluster (3.4 or
//! later) through the `etcd-client` crate, one etcd transaction per lease
//! operation or batch, expiry judged by etcd's own leases (one per holder
//! session), and, where etcd keeps a lease alive that its holder no longer
//! renews, by the observation rule (docs/adr/0010-etcd-sessions.md,
//! docs/adr/0013-etcd-session-revision.md).
//!
//! * **Key layout.** Under a configurable prefix (default
//!   [`DEFAULT_PREFIX`]), each work ID has four keys,
//!   `<prefix>live|acq|state|ckpt/<escaped work ID>` ([`EtcdKeys`]). The
//!   escaping (percent-encoding of `/`, `%`, control characters and
//!   non-ASCII bytes) makes the work ID one path segment, so every work ID
//!   is distinct (`jobs/a`, `jobs/a/b` and `jobs%2Fa` are independent
//!   leases) and no work ID can name a key outside the prefix.
//!   - `live` is attached to the holder's session lease (below): it
//!     exists while the lease is live by etcd's clock. Its value is the
//!     holder ID.
//!   - `acq` (the acquisition: holder, TTL, previous holder and how its
//!     lease ended) is written by acquisitions only.
//!   - `state` (the token it is about, and: released or revoked; or held,
//!     with the TTL of the renewal that wrote it) is written by release,
//!     revocation, checkpoints, the end of a lease its holder gave up, and
//!     renewals that are not a session's own (below). An acquisition
//!     leaves it: it names the acquisition it is about.
//!   - `ckpt` holds the checkpoint bytes.
//!
//!   Besides, each session lease (below) has a key,
//!   `<prefix>sess/<lease ID in hex>` ([`EtcdStore::session_key`]),
//!   attached to that lease: every batch renewal of the session puts it,
//!   so its mod revision moves while the holder renews, which is what a
//!   contender watches (the observation rule, below).
//!
//!   Only `live` (and the session key) is attached to an etcd lease: when
//!   etcd ends the lease, the acquisition, its state and the checkpoint
//!   stay, and a lease whose `acq` is there without its `live` key expired
//!   (unless `state` says it was released or revoked).
//! * **Sessions: one etcd lease per holder and TTL.** The store keeps one
//!   etcd lease per (holder ID, TTL in whole etcd seconds), granted on the
//!   first acquisition and shared by every `live` key of that holder's
//!   acquisitions with that TTL; it grants a new one only when etcd ended
//!   it (a keep-alive answers TTL 0, or a transaction finds the lease
//!   missing: it is granted again and the call tried once more) or when it
//!   may be ending (less than a second left by this host's clock). So an
//!   acquisition grants nothing: it is one transaction, with a keep-alive
//!   of the session lease beside it (its countdown must start after the
//!   acquisition was sent). A renewal of a batch is one keep-alive per
//!   distinct session lease (one, usually) beside one transaction, which
//!   writes no key per lease (below). The
//!   keep-alives of one session lease are shared as in a group commit (one
//!   in flight; the calls that waited for it take the next, sent after
//!   each of them) and go as messages on one stream kept open. A
//!   release or revocation deletes only its own keys and never revokes the
//!   session lease; an unused one expires with its TTL.
//!
//!   A keep-alive extends every key of the session, and a batch renewal
//!   moves the session key for all of them, also for a lease its holder
//!   gave up (its TTL ran out by the holder's clock, with no renewal sent
//!   since, while other leases of the session still renew). So the store
//!   ends those itself: it records, per lease on one of its session
//!   leases, until when the latest acquisition or renewal it sent (answered
//!   or not) may count, and a task of the store (the *sweep*) deletes the
//!   `live` key of every such lease whose time has passed (it wakes at the
//!   earliest such time it knows), comparing
//!   the revisions of `live` and `state` (so a lease another process
//!   renewed meanwhile stays). A renewal sent after that time answers
//!   `Expired` (or `Fenced` when the lease was taken) and deletes the key
//!   in its own batch. An acquisition whose outcome the store never learned
//!   (its call failed, or was dropped) is ended the same way once its
//!   time is up, if it was applied. A lease given up by a process that is
//!   gone is freed by etcd (the session is no longer kept alive) or by the
//!   observation rule.
//! * **Transactions and batches.** Every operation is one etcd
//!   transaction that compares revisions (and the holder ID, a value) and
//!   writes what it changes together. A batch (`acquire_many`,
//!   `renew_many`, `release_many`; a single call is a batch of one) is one
//!   transaction whose success branch holds one nested transaction per
//!   lease (etcd 3.3 and later), `If <the lease is as expected> Then
//!   <write> Else <get live, acq, state>`: each lease's outcome, and on a
//!   failure what the keys hold, comes back in the one reply, with the
//!   single call's rules (`Held`, `Fenced`, `Expired`), and a failed lease
//!   leaves the others of the batch alone. An acquisition compares that
//!   `live` is absent and that `acq` and `state` are as this store last
//!   saw them free (it released the lease, or a failure branch showed it
//!   free; otherwise it guesses "never acquired"), then writes `live`
//!   (attached to the session lease) and `acq` (with the predecessor); a
//!   wrong guess costs one more round with what the failure branch read.
//!   A **renewal writes no key per lease**: for a lease on one of this
//!   store's session leases, its nested transaction compares only `live`'s
//!   mod revision with the one this store wrote (the acquisition's: the
//!   fencing token; or a move's), with nothing in either branch, and the
//!   batch puts the session key once, atomically with those compares. A
//!   nested transaction that failed is explained by a read of that lease's
//!   keys in a second transaction (one round trip when all renew, two when
//!   one did not). A renewal of any other lease (another process's
//!   acquisition, or one asking for more than its session was granted,
//!   which moves `live` to the holder's session of that TTL) compares the
//!   same and writes `state` (and `live`). A checkpoint compares token,
//!   holder, etcd lease and the revision of `state` it last saw, and
//!   writes `state` and `ckpt`; a release deletes `live` and writes
//!   `state`. Batch limit: etcd's `--max-txn-ops` (128 by default) bounds
//!   each branch, and a nested transaction gets what its parent leaves of
//!   it, so the nested transactions go in the batch's success branch while
//!   they fit, and in groups (a nested transaction of nested transactions)
//!   beyond: a batch names up to [`MAX_BATCH`] (1,000) leases in one
//!   transaction (`max_txn_ops=N` in the URL for a cluster run with
//!   another limit: [`batch_capacity`]), and one whose keys add up to more
//!   than [`MAX_REQUEST_BYTES`] (1 MiB; etcd's limit is 1.5 MiB) goes as
//!   several transactions at once (`layout.rs`). A batch of 1,000 renewals
//!   of 40-byte keys is about 60 KiB. An empty batch makes no call.
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
//!   cluster) starts revisions again from 1. All leases of one batch
//!   transaction share one token value (one revision), each larger than
//!   every earlier token of its work ID.
//! * **Expiry: etcd's leases, TTLs rounded up to whole seconds.** etcd
//!   counts lease TTLs in whole seconds, so a TTL is **rounded up** to the
//!   next whole second (1500 ms becomes 2 s), and etcd raises it further
//!   to its minimum lease TTL (1.5 × its election timeout, rounded up: 2 s
//!   with the default 1 s election timeout). On an etcd with the fix of
//!   etcd bug #15247 (below), etcd does not end a lease before its
//!   holder's deadline: it starts the session lease's countdown when it
//!   grants or renews it, after the holder sent the request that counts,
//!   and a new Raft leader extends every lease. It may end a lease later
//!   than the TTL: by the rounding, and by up to about half a second more,
//!   since the leader checks for expired leases every 500 ms. Contenders
//!   wait that long; holders still count their own TTL. etcd's lease clock
//!   is the leader's monotonic clock: a wall-clock step on a member
//!   changes nothing. `inspect` (and `worklease status`) reports a live
//!   lease's `expires_in` as what etcd has left on the etcd lease `live`
//!   is on (whole seconds, rounded up): the session's time, so for a lease
//!   its holder gave up while renewing others it is an upper bound (the
//!   sweep ends such a lease sooner).
//! * **Liveness under leader changes: the observation rule.** A new Raft
//!   leader restarts every lease's countdown (etcd-io/etcd#9888, #9395,
//!   #17132): with leadership moving more often than the TTL (measured on
//!   3.4: every 3, 4 or 6 s with a 5 s TTL), etcd never ends a dead
//!   holder's lease. So liveness does not rest on etcd's lessor alone. The
//!   *version* of a held lease is (create and mod revision of `live`, mod
//!   revision of `state`, mod revision of the session key of the etcd
//!   lease `live` is on), and every renewal and checkpoint moves it: a
//!   session's batch renewal puts the session key in the transaction whose
//!   compares renew its leases, any other renewal or checkpoint writes
//!   `state` or `live`. A contender notes when it first saw a version (when
//!   the read of the session key, after the read of the lease's keys,
//!   returned: never before the holder sent the renewal that made it);
//!   once it has seen it unchanged for the holder's TTL (that of the
//!   acquisition or of the renewal that wrote `state`, rounded up to whole
//!   etcd seconds, and at least what etcd granted the etcd lease `live` is
//!   on) by its own monotonic clock, the holder's deadline (that send + TTL
//!   − margin) has passed, and it deletes `live` in a transaction comparing
//!   exactly that version, then acquires. A renewal that lands first moves
//!   the version and the deletion changes nothing; one that lands after
//!   finds `live` gone. The session key moves for all leases of a session:
//!   a lease given up while the holder renews others is ended by the
//!   holder's own store (the sweep, above). The slack of this rule is the rounding to whole seconds:
//!   a contender that watched from before the holder stopped acquires
//!   within the TTL rounded up + a poll interval + a few round trips,
//!   whatever the leader does; one that comes later waits a whole TTL from
//!   its first look (or etcd's expiry, whichever is first). `Held`'s
//!   `expires_in` is how long the contender must still see the version
//!   unchanged (an upper bound: etcd's expiry and the watch may free it
//!   sooner).
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
//!   that checks tokens refuses the first holder's late writes. With
//!   sessions, such a revocation ends every key of the session at once.
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
//!   that matters twice. A batch renewal compares `live`'s mod revision
//!   only: a second copy renews again, which changes nothing but the
//!   session key's revision, and a copy applied late cannot outlive the
//!   store's record of it (the sweep counts from the latest renewal sent,
//!   answered or not). A checkpoint transaction compares the
//!   fencing token (`live`'s create revision), the holder, the etcd lease
//!   and the mod revision of `state` the store last saw: a second copy
//!   finds `state` moved and fails (the store reads the keys, sees the
//!   lease is still its own, and tries once more with what it read), and a
//!   copy applied late, after a newer checkpoint, fails too, so S4 holds;
//!   a stale token fails as before (S1–S3). A release compares token and
//!   holder: a second copy finds `live` gone and changes nothing. An
//!   acquisition compares that `live` is absent and `acq` and `state` are
//!   as seen, so at most one copy applies; `acq` holds a number the call
//!   drew, so when a later copy's failure branch shows the current
//!   acquisition with this call's number and holder, the acquisition is
//!   this call's and it returns it. When every try fails, the acquisition
//!   returns a store error; an acquisition that was applied after all
//!   lives on the session lease until the sweep ends it (its `acq` value,
//!   which holds the call's number, compared), once the call's TTL has
//!   passed, or etcd's expiry once the session is no longer kept alive.
//!   A session lease grant applied twice leaves an unused etcd lease that
//!   expires with its TTL. The watch follows the store to the next member when its stream
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
//! * **Compaction.** Every acquisition, checkpoint and release is a
//!   write, and so is every batch renewal (one key per batch); etcd keeps
//!   every old revision until compacted; etcd 3.4 does not
//!   compact by default. Run etcd with `--auto-compaction-retention` (and
//!   defragment members now and then), else the database reaches its space
//!   quota, etcd raises the NOSPACE alarm and refuses every write: every
//!   lease ends at its TTL.
//!
//! Limits: etcd refuses requests above 1.5 MiB by default, which the
//! largest checkpoint (1 MiB, [`crate::limits::MAX_CHECKPOINT_BYTES`])
//! stays under. `inspect` of every lease lists the `acq` keys in pages.
//! A batch names up to [`MAX_BATCH`] leases (fewer with a `max_txn_ops`
//! below 69: [`batch_capacity`]); one whose keys and values add up to more
//! than [`MAX_REQUEST_BYTES`] goes as several transactions, sent at once.
//!
//! What the store does **not** guarantee:
//! * that etcd ends a lease at its TTL: it may end it up to a second and
//!   a half later (rounding, sweep), much later under leader changes (the
//!   observation rule then frees it within the TTL rounded up of the
//!   contender's first look), and a lease given up while its session is
//!   kept alive lasts until the holder's store sweeps it: up to the end
//!   of the latest renewal it sent plus a round trip (plus
//!   500 ms per sweep etcd did not
//!   answer), a TTL more where its last renewals failed with an unknown
//!   outcome;
//! * that the `state` of a lease that etcd ended tells when: an expired
//!   lease's `expires_at` (`inspect`) is the end the sweep wrote, or else
//!   that of its last write of `state` or of its acquisition, earlier than
//!   etcd's end when its holder's batch renewals kept it (they write no key
//!   per lease);
//! * S1 when the store's session keys (`sess/`) are deleted by hand while
//!   their holder renews: a contender that saw one absent may count a
//!   renewal that wrote it again and was then deleted as none;
//! * S1 on an etcd without the fix of bug #15247 when a leader is paused
//!   (fencing tokens still order the holders), nor fencing tokens after a
//!   snapshot restore without `--bump-revision`;
//! * that etcd's lessor is the only clock: the observation rule counts
//!   on the holder's and the contender's monotonic clocks running at
//!   about the same rate (the holder's safety margin covers the drift);
//! * distinct tokens within one batch acquisition: the leases of one
//!   transaction share one revision (each still larger than every earlier
//!   token of its work ID);
//! * that an acquisition whose reply was lost and whose call gave up is
//!   freed at once: it stays until its TTL has passed and the sweep ends
//!   it (or etcd does); a copy of it that a hung member applies later
//!   than that stays until etcd ends the session lease or a contender's
//!   observation frees it, once the session stops.
//!
//! URL: `etcd://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...][/][?prefix=P]`
//! ([`EtcdConfig::from_url`]); the port defaults to 2379. A user name
//! turns on etcd's authentication (the password is sent to get a token,
//! never shown: see [`crate::store::url::redact`]). The user needs a role
//! with readwrite on the prefix and nothing else (docs/operators.md, "Least
//! privilege"); a refusal names the user and the prefix. Not guaranteed: an
//! etcd without the fix of its RBAC bypass for writes nested in
//! transactions lets a read-only user take leases.
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
// with fail-over (`rpc`); the session leases (`leases`) and their
// keep-alives (`keepalive`); what the store remembers of its acquisitions
// (`records`) and the sweep that ends those their holder gave up
// (`sweep`); the operations (`ops`: the `LeaseStore` implementation, with
// read checkpoint and revoke; `acquire`: acquisition of one or a batch;
// `batch`: renewal of one or a batch; `release`: release of one or a
// batch; `renew`: checkpoint; `inspect`); the observation rule
// (`observe`); and the watch for push hand-off (`watch`).
mod acquire;
mod batch;
mod config;
mod inspect;
#[cfg(feature = "fuzzing")]
pub(crate) use inspect::fuzz_values;
mod keepalive;
mod keys;
mod layout;
mod leases;
mod members;
mod observe;
mod ops;
mod records;
mod release;
mod renew;
mod rpc;
mod snapshot;
mod sweep;
mod url;
mod watch;

pub use config::{
    EtcdConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT, DEFAULT_PREFIX, DEFAULT_REQUEST_TIMEOUT,
    MAX_PREFIX_BYTES,
};
pub use keys::EtcdKeys;
pub use layout::{batch_capacity, MAX_BATCH, MAX_REQUEST_BYTES, RESERVED_OPS};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::Client;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
#[cfg(doc)]
use crate::error::{InvalidInput, StoreError};
use crate::limits::WorkId;
use crate::store::notify::Watchers;

use keepalive::Keepers;
use keys::LIVE;
use leases::Sessions;
use members::Members;
use observe::Observations;
use records::Records;
use rpc::Budget;
use snapshot::Free;
use watch::Wakeups;

const KIND: &str = "etcd";

/// etcd's default `--max-txn-ops`: the most operations (or compares) one
/// branch of a transaction may hold. A batch is one transaction of one
/// nested transaction per lease, flat or in groups (etcd gives a nested
/// transaction what its parent leaves of the limit): see
/// [`batch_capacity`]. A cluster run with another `--max-txn-ops` takes
/// `max_txn_ops=N` in the store URL ([`EtcdConfig::max_txn_ops`]).
pub const MAX_TXN_OPS: usize = 128;

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
/// its own clients (a connection to each member it used), its session
/// leases, a sweep task once it holds leases, and a watch once it has
/// waiters.
pub struct EtcdStore {
    core: Arc<Core>,
}

/// What an [`EtcdStore`] is made of, shared with its background tasks
/// (the sweep holds it weakly; the store's drop stops both tasks).
struct Core {
    /// Itself, for the tasks it starts.
    me: Weak<Core>,
    config: EtcdConfig,
    members: Arc<Members>,
    /// The newest revision any reply showed (a lower bound of the
    /// cluster's current revision).
    seen: AtomicI64,
    /// What this store knows of its acquisitions, by (work ID, token),
    /// and of the acquisitions whose outcome it does not know.
    records: Mutex<Records>,
    /// The session leases this store granted.
    sessions: Mutex<Sessions>,
    /// The last keep-alive of each session lease.
    keepers: Mutex<Keepers>,
    /// Work IDs this store saw free, for its next acquisitions.
    free: Mutex<HashMap<WorkId, Free>>,
    /// When this store first saw each version of leases held by others.
    observed: Mutex<Observations>,
    wakeups: Arc<Wakeups>,
    /// Whether the watch task runs.
    watching: Mutex<bool>,
    /// Whether the sweep task runs.
    sweeping: AtomicBool,
    /// When the sweep task wakes next, and how to wake it sooner.
    sweep_wake: sweep::Wake,
    /// Stops the watch and sweep tasks when the store is dropped.
    stop: CancellationToken,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("config", &self.core.config)
            .finish()
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        self.core.stop.cancel();
    }
}

impl EtcdStore {
    /// A store for `config`. Connects lazily: the first operation (or
    /// [`EtcdStore::ready`]) opens the client, inside the tokio runtime
    /// that runs it.
    pub fn new(config: EtcdConfig) -> Self {
        let core = Arc::new_cyclic(|me| Core {
            me: me.clone(),
            members: Arc::new(Members::new(&config)),
            config,
            seen: AtomicI64::new(0),
            records: Mutex::new(Records::default()),
            sessions: Mutex::new(Sessions::default()),
            keepers: Mutex::new(HashMap::new()),
            free: Mutex::new(HashMap::new()),
            observed: Mutex::new(HashMap::new()),
            wakeups: Arc::new(Wakeups {
                watchers: Watchers::default(),
                all: tokio::sync::watch::channel(0).0,
            }),
            watching: Mutex::new(false),
            sweeping: AtomicBool::new(false),
            sweep_wake: sweep::Wake::default(),
            stop: CancellationToken::new(),
        });
        Self { core }
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
        let key = format!("{}{LIVE}", self.core.config.prefix);
        let resp = self
            .core
            .rpc(
                "read from the cluster",
                Budget::plain(&self.core.config),
                |mut c| {
                    let key = key.clone();
                    async move { c.get(key, None).await }
                },
            )
            .await?;
        self.core.saw(resp.header());
        Ok(())
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.core.config
    }

    /// The keys of `work_id` (for operators and tests).
    pub fn keys(&self, work_id: &WorkId) -> EtcdKeys {
        self.core.keys(work_id)
    }

    /// The session key of the etcd lease `lease` (for operators and
    /// tests): its mod revision moves at every batch renewal of that
    /// session (see the module docs).
    pub fn session_key(&self, lease: i64) -> String {
        keys::session_key(&self.core.config.prefix, lease)
    }

    /// A client of the member the store sends its requests to now
    /// (cloning it is cheap), for diagnostics and benchmarks beside the
    /// store's own calls.
    ///
    /// # Errors
    /// As [`EtcdStore::ready`].
    pub async fn client(&self) -> Result<Client> {
        self.core
            .rpc(
                "connect",
                Budget::plain(&self.core.config),
                |c| async move { Ok(c) },
            )
            .await
    }
}

impl Core {
    /// The keys of `work_id`.
    fn keys(&self, work_id: &WorkId) -> EtcdKeys {
        EtcdKeys::new(&self.config.prefix, work_id)
    }
}
