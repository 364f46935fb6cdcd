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
//!   `NOSCRIPT`); a batch is one script too (see "Batches" below). A lease is live exactly while its `live` key exists, so
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
//!   `wait_replicas=N&wait_timeout_ms=T`, N at most [`MAX_WAIT_REPLICAS`],
//!   T from 1 ms to [`MAX_WAIT_TIMEOUT`]) makes every write (acquire,
//!   renew, checkpoint, release, revoke, and each batch once, after its
//!   script) run `WAIT N T` pipelined behind its script, and fail with a
//!   store error when fewer than N replicas acknowledged it in time. A
//!   refused acquisition is ended as if it had expired, so nobody holds it
//!   and the next holder sees no clean hand-off; a refused renewal,
//!   checkpoint or release did apply on the primary (it is not undone) but
//!   is reported as a (transient) failure, so the holder's deadline stays
//!   that of its last acknowledged extension. See "Replica wait" below.
//!
//! # Batches
//!
//! [`LeaseStore::renew_many`], [`LeaseStore::acquire_many`] and
//! [`LeaseStore::release_many`] are each one `EVALSHA` (one round trip)
//! of a batch script whose `KEYS` are the keys of every lease in the batch
//! (`state` and `live`; for acquisitions `fence` too), at most
//! [`MAX_BATCH`] leases. The batch script runs each lease through the same
//! Lua function as the single script (the prelude `common.lua`), so each
//! lease's outcome is the one its single call would have had, reported in
//! order (`acquire_many`: the work IDs tried, stopping once `max` are
//! granted). `release_many` publishes each released work ID, as
//! `release` does. With a replica wait, `acquire_many` pipelines one
//! `WAIT` after its script; with too few acknowledgements every grant of
//! the batch is ended as expired (one `abandon` script) and fails with a
//! store error, while `Held` work IDs stay `Held`. `renew_many` and
//! `release_many` wait once too, and fail as a whole with too few
//! acknowledgements.
//!
//! A script is atomic on the server: no other command runs while a batch
//! is under way, and the server's clock is read once, so a batch is one
//! instant. It is not a transaction, though: Redis does not roll a script
//! back, so a server error in the middle of one (out of memory, say)
//! leaves the leases before it done and fails the whole call, which
//! reports nothing of any lease; repeating it is safe, as after a lost
//! reply. A batch names keys in many hash slots, which a single server or
//! a Sentinel-managed primary runs as one script; a Cluster refuses such a
//! script (`CROSSSLOT`), so a Cluster store splits each batch by slot (see
//! "Cluster").
//!
//! **The limit, [`MAX_BATCH`] = 100,** keeps a batch at about a
//! millisecond of server time: a Lua script blocks every other client of
//! the server while it runs, and each command a script calls costs 1–2 µs
//! there (Redis's own limits, on keys per script or the 5 s busy-script
//! timeout, are far higher). Measured with Redis 7.0 on loopback, on a
//! 2-core machine loaded by other work (`INFO commandstats`, the `usec`
//! of `EVALSHA`; the ignored test `batch_timing` in `tests/redis/batch.rs`):
//! one `renew_many` of 100 leases (3 commands each) took 0.75–1.3 ms on
//! the server, `release_many` of 100 about the same, `acquire_many` of 100
//! grants (6–7 commands each) 1.4–2.7 ms. Renewing 1,000 leases took 10
//! `renew_many` calls, 12–19 ms wall and 3 µs of this process's CPU per
//! lease, against 37–60 ms and 15 µs per lease one renewal at a time. The
//! lease layer splits larger batches into calls of [`MAX_BATCH`].
//!
//! What Redis cannot promise, plainly:
//!
//! * **Failover can lose the newest writes.** Redis replicates
//!   asynchronously: a primary that fails before a write reached a replica
//!   loses it when the replica is promoted. The new primary may then not
//!   know of a live lease (a second holder gets it: mutual exclusion, S1,
//!   then rests on downstream systems checking fencing tokens), or may
//!   hand out a fencing token again, and may lose an acknowledged
//!   checkpoint. `wait_for_replicas` narrows this to what "Replica wait"
//!   below states; it does not close it.
//! * **Without persistence a restart resets everything**: live leases are
//!   forgotten (a second holder can take one whose holder still believes
//!   in it), fencing counters start again from 1 (S2 broken, so fencing
//!   cannot catch that second holder) and checkpoints are gone. Run with
//!   `appendonly yes` (and `appendfsync always` for tokens that survive a
//!   power loss, since the default `everysec` can lose the last second).
//!   A store logs a warning on its first connection when the server
//!   persists nothing (`appendonly no` and `save ""`, read with
//!   `CONFIG GET`; a user without that command gets a debug line), so the
//!   CLI warns once per run.
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
//! # TLS
//!
//! With the feature `redis-tls`, `rediss://` URLs connect over TLS
//! (rustls; the process's default crypto provider, or ring, installed when
//! none is): the server's certificate must chain to the certificates of
//! the PEM file `cacert=PATH`, or, without it, to the system's roots, and
//! must name the URL's host (always verified: a `#insecure` fragment is
//! refused). `cert=PATH&key=PATH` present a client certificate (Redis's
//! `tls-auth-clients yes`). The files are read when the URL is parsed.
//! The subscriber connection uses the same settings.
//!
//! # ACL users
//!
//! The store needs only its own keys and release channel (both start with
//! the prefix) and the commands of [`ACL_COMMANDS`];
//! [`RedisConfig::acl_rules`] writes the rules for a configuration. For
//! the default prefix `worklease:`:
//!
//! ```text
//! ACL SETUSER worklease on >PASSWORD resetkeys ~worklease:* resetchannels &worklease:* -@all +hello +auth +select +ping +role +evalsha +script|load +scan +wait +subscribe +pttl +hget +hmget +incr +get +set +hset +hdel +pexpire +del +exists +publish +time +strlen +config|get
//! ```
//!
//! (`+config|get` is optional: it lets the store warn about an eviction
//! policy or a server that persists nothing.) Such a user runs the whole
//! conformance suite (`tests/redis_topologies.rs`). A permission the
//! server denies fails the operation with a store error that says the
//! user lacks a permission and quotes the server's `NOPERM` reason; a
//! command denied inside a script is named from the script's line (Redis
//! 7.0 reports only the line). A script stops at the denied command and
//! is not rolled back: a release denied `PUBLISH` has released the lease
//! but woken nobody.
//!
//! # Sentinel
//!
//! `redis+sentinel://[USER:PASSWORD@]S1[:PORT],S2[:PORT],.../PRIMARY[/DB]?prefix=P`
//! (`rediss+sentinel://` with TLS) names the sentinels (port 26379 by
//! default) and the name they know the primary by. The store asks the
//! sentinels in order for the primary's address
//! (`SENTINEL get-master-addr-by-name`) and checks it with `ROLE`; the
//! credentials are the primary's (sentinels are reached without them,
//! with the same TLS settings). When a command fails as a lost primary
//! would (a connection error, `READONLY`), the store asks again and moves
//! its connections, and runs the command once more on the new primary;
//! until the sentinels name a primary, commands fail with a (transient)
//! store error and nothing is sent to the old address, where the old
//! primary, restarted empty, might otherwise take writes. The release
//! subscription looks the primary up again at each resubscription. On
//! loopback, with `down-after-milliseconds 500`, the sentinels named the
//! new primary 1.7–1.9 s after the old one was SIGKILLed
//! (`tests/redis/failover.rs`).
//!
//! # Replica wait
//!
//! What it guarantees: when a write succeeds, it (and every earlier write
//! of the store's waiting connection) is in the memory of at least N
//! replicas. If the primary then fails and one of those replicas is
//! promoted, the acquisition, renewal, checkpoint or release is there:
//! no second holder before the lease's acknowledged expiry (S1), no
//! fencing token handed out again (S2), no acknowledged checkpoint lost.
//! The failover test checks exactly this with one replica and N = 1.
//!
//! What it does not: `WAIT` "does not make Redis a strongly consistent
//! store" (Redis's documentation of `WAIT`): Sentinel promotes the
//! replica with the largest replication offset it last heard of, which
//! with N below the number of replicas need not be one that acknowledged
//! (set N to the number of replicas to be sure, and every write then
//! fails while one replica is down); replicas acknowledge what is in
//! their memory, not on disk, so losing the primary and those replicas
//! together loses the writes; a write that failed for too few
//! acknowledgements may still survive (it applied on the primary).
//!
//! What it costs: each write waits for the slowest of N replicas to
//! acknowledge (a replication round trip), and the waiting writes of one
//! store share one connection, which `WAIT` blocks, so they queue one
//! after another; with a replica down, writes take `wait_timeout_ms` and
//! fail.
//!
//! # Cluster
//!
//! `redis+cluster://[USER:PASSWORD@]H1:PORT,H2:PORT,.../?prefix=P` (the
//! nodes to start from; database 0 only) runs on a Redis Cluster through
//! the `redis` crate's cluster connection, which routes each script by its
//! first key's hash slot and follows `MOVED` and `ASK` (resharding, a
//! primary's failover). Every key of one work ID shares one slot (the hash
//! tag is the escaped work ID), so each single-lease script touches one
//! slot; the fencing counter is per work ID for that reason: a global
//! counter would sit in another slot and make every acquisition a
//! cross-slot write (ADR 0007, 0021). A batch is split by slot: `renew_many`
//! and `release_many` run one script per slot, `acquire_many` one per run
//! of consecutive work IDs in one slot, in order, each with the grants
//! still wanted, so its result is the single-server one. `inspect` of
//! every lease `SCAN`s each primary (`CLUSTER SLOTS`). Releases `PUBLISH`
//! on the cluster, which delivers to every node; the subscription uses the
//! first node given that answers. The whole conformance suite runs on three
//! primaries started by the test (`tests/redis/cluster.rs`).
//!
//! The replica wait works on a Cluster as on one primary: each write's
//! script and its `WAIT` go as one pipeline, on a second cluster
//! connection, to the slot's primary, and the `redis` crate sends the
//! pipeline whole again where a `MOVED` or `ASK` points (or after a
//! `TRYAGAIN`), so `WAIT` counts the replicas of the node that ran the
//! script. A node that answers `READONLY` (a failed primary restarted as
//! a replica, still in the slot map) makes the store open its cluster
//! connections again, which reads the slot map afresh. The cluster, not
//! the store, promotes a replica; which one, when a primary has several
//! and N is smaller, is the cluster's choice (as with Sentinel). TLS:
//! `rediss+cluster://` with `cacert`, `cert` and `key` as for `rediss://`
//! (the nodes' `tls-cluster yes` is the server's business). Tested
//! (`tests/redis/cluster_failover.rs`, `tests/redis/tls.rs`): three
//! primaries with a replica each, a slot holding live leases moved key
//! by key and a primary killed under load, with the wait on; and a TLS
//! cluster with the wait on.
//!
//! Not supported yet on a Cluster: moving the subscription off a failed
//! node (waiters then fall back to polling: a waiter's poll interval is
//! the bound on a missed release). Not supported anywhere: Unix sockets.
//!
//! URL: `redis[s]://[USER:PASSWORD@]HOST[:PORT][/DB][?prefix=P&wait_replicas=N&wait_timeout_ms=T&protocol=resp2|resp3]`
//! (`rediss://` also `&cacert=PATH&cert=PATH&key=PATH`; Sentinel and
//! Cluster above, each also with TLS and the replica wait)
//! ([`RedisConfig::from_url`]). The commands use RESP3 by default (its
//! connection notices a drop at once); `protocol=resp2` opts out, for a
//! server that cannot speak RESP3.

mod acl;
mod acquire;
mod batch;
mod config;
mod conn;
mod connection;
mod keys;
mod ops;
mod primary;
mod reply;
#[cfg(feature = "fuzzing")]
pub(crate) use reply::fuzz_lease_info;
mod scripts;
mod sentinel;
mod server_checks;
mod subscriber;
#[cfg(feature = "redis-tls")]
mod tls;
mod topology;

pub use acl::ACL_COMMANDS;
pub use batch::MAX_BATCH;
pub use config::{
    RedisConfig, WaitForReplicas, DEFAULT_CONNECTION_TIMEOUT, DEFAULT_PREFIX,
    DEFAULT_RESPONSE_TIMEOUT, MAX_WAIT_REPLICAS, MAX_WAIT_TIMEOUT,
};
pub use connection::RedisStore;
pub use keys::{LeaseKeys, MAX_PREFIX_BYTES};

#[cfg(doc)]
use crate::store::LeaseStore;

const KIND: &str = "redis";
