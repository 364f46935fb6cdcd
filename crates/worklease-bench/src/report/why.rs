//! What stands in the way of each goal not met: the figures beside the
//! facts of each store's design.

use std::fmt::Write as _;

use super::verdict::{
    find, Verdict, ACROSS_PROCESSES, GOAL_CYCLE, GOAL_ETCD, GOAL_FAILOVER, GOAL_HANDOFF, GOAL_P99,
    GOAL_PEER,
};
use crate::results::{Run, Variant};

/// What one of ours' operations costs on each store, beside its baseline
/// (facts of the stores' designs, to read the ratios by).
pub fn store_note(store: &str) -> Option<&'static str> {
    Some(match store {
        "memory" => "ours: each call takes the store's mutex, checks the lease rules, builds the grant (token, hand-off facts) and goes through the lease layer (tracing span, metrics, observer); the baseline is one `HashMap` entry update under a mutex, so the ratio measures that fixed overhead. The store keeps the record of every work ID it has seen (fencing tokens must not go back), so the cycle's millions of fresh work IDs grow its table, and each resize of the table holds the store's lock: the cycle's maximum latencies.",
        "sqlite" => "ours: each call is one `BEGIN IMMEDIATE` transaction (read the row, decide, write, commit; an acquisition also bumps the fencing sequence) on the store's one connection; the baseline is one autocommit `UPDATE`. Both are bound by one fsync per commit, and both run one at a time on one connection, so adding clients adds little throughput.",
        "postgres" => "ours: each call is one prepared statement on the store's pool (an acquisition: a CTE that locks the current row, `INSERT ... ON CONFLICT DO UPDATE` drawing from the fencing sequence; a release: an `UPDATE` with the verdict and, when a waiter marked the row, `pg_notify`); the baseline is one single-row `UPDATE`. Every statement commits: at one client both follow the WAL flush.",
        "mysql" => "ours: each call is one `CALL` of the table's stored procedure on the store's pool, which runs one READ COMMITTED transaction (lock the row, read the clock, decide, write; an acquisition also inserts and deletes a row of the fencing table to draw its token) and commits; the baseline is one single-row autocommit `UPDATE`. Both wait for the redo log flush at each commit.",
        "redis" => "ours: each call is one `EVALSHA` of a Lua script touching the lease's keys (state hash, `live` key with its PX TTL, fencing counter; a checkpoint also its data key); the baseline is one `EVALSHA` of a 3-command script. All clients share the store's one multiplexed connection, as the baseline does.",
        "etcd" => "ours: an acquisition is one transaction (a nested transaction writing `live` on the holder's session lease and `acq`), with a keep-alive of the session lease beside it (shared by concurrent calls, a message on an open stream); a release one transaction (deleting `live`, writing `state`); the work ID's first acquisition by a store that has not seen it free costs a second transaction. The baseline is one transaction writing one key.",
        "s3" => "ours goes through the register adapter: each operation reads the object, then writes it conditionally (two requests); the baseline is one conditional PUT.",
        "dynamodb" => "ours goes through the register adapter: a renewal or checkpoint is a strongly consistent `GetItem`, then a conditional `PutItem` of the whole item (two requests); an acquisition also reads the work ID's fencing floor and raises it with a conditional `UpdateItem` before the `PutItem` (four requests), a release two. The baseline is one conditional `PutItem`.",
        _ => return None,
    })
}

/// Why a store's hand-off takes what it takes (facts of its design).
fn handoff_note(store: &str) -> &'static str {
    match store {
        "memory" => "a round trip here is one `HashMap` update under a mutex (about a microsecond); a hand-off wakes the waiting task through a watch channel and the runtime has to schedule it, which alone costs tens of microseconds: task wake-ups, not store work.",
        "sqlite" => "the waiters share the releaser's store value, so the release wakes them in-process at once; the hand-off is then the release's commit, the woken waiters' acquisition attempts (one of which commits) and their hops to and from SQLite's blocking thread.",
        s if s.strip_suffix(ACROSS_PROCESSES) == Some("sqlite") => "a release reaches another process through the database file: the release's commit (with its fsync), then its touch of the file, the inotify event to each waiting process's watcher thread, a check on that process's connection (`PRAGMA data_version`, then one read of the watched rows), the wake-up, and the acquisition attempts of all woken processes, which queue for SQLite's one write lock (one commits; the others find it held). Each of those hops costs about as much as a round trip on a shared 2-core host.",
        "postgres" => "the release's `pg_notify` reaches the store's listening connection when the release commits; the listener then wakes the waiters after a random jitter of up to 5 ms (`PostgresOptions::wake_jitter`, there so that many waiters do not stampede the row), and the winner's acquisition commits. The jitter alone averages 2.5 ms; with it at zero the hand-off would be the release's commit, the notification and one acquisition.",
        "mysql" => "MySQL has no notifications: waiters poll (every 2 s by default), so a released lease passes to a waiter at its next poll.",
        "redis" => "a round trip on loopback is tens of microseconds; the release's `PUBLISH` goes out on the store's subscriber connection, whose task wakes the waiting task, which then runs its acquisition script: each of those hops costs about as much as a round trip, so two round trips cannot be met by any pub/sub path.",
        "etcd" => "the waiters learn of the release from the store's watch on `live` keys (an event after the release's transaction is committed through Raft); the winner's acquisition is then one transaction (two when its store has not seen the lease free: the failure branch tells it what to compare), with a keep-alive of its session lease beside it.",
        "s3" => "S3 has no notifications: waiters poll, and the register adapter's acquisition is a read and a conditional write.",
        "dynamodb" => "DynamoDB has no notifications (Streams would need a reader per process): waiters poll, and the register adapter's acquisition reads the item and the fencing floor, raises the floor, then writes the item.",
        _ => "",
    }
}

/// Why ours is slower than the peer lock (facts of the two designs).
fn peer_note(store: &str) -> &'static str {
    match store {
        "postgres" => "advisory locks live in the server's shared memory: taking and freeing one writes nothing, so lock → unlock is two round trips and no commit. Ours writes the lease row and commits at each step (the fencing token, the checkpoint and the hand-off facts must survive a crash), so each step waits for the WAL flush. The peer cannot fence, keep a checkpoint, or outlive its session's connection.",
        "mysql" => "`GET_LOCK` lives in the server's memory, bound to its connection: taking and freeing one writes nothing, so lock → unlock is two round trips and no commit. Ours writes the lease row and commits at each step (the fencing token, the checkpoint and the hand-off facts must survive a crash), so each step waits for the redo log flush. The peer keeps nothing durable, cannot fence, stacks per session, and dies with its connection.",
        "redis" => "Redlock's lock is one `SET NX PX` and its unlock one compare-and-delete of the same key; ours' scripts also keep the fencing counter, the state hash (holder, previous holder and how its lease ended) and the checkpoint key, so each does more work inside Redis.",
        "etcd" => "etcd's `Lock` is one RPC (one Raft write for the lock key) and `Unlock` one delete; ours' acquisition is one transaction writing two keys (and a keep-alive of the session lease beside it), its release one transaction writing two.",
        "s3" => "the hand-rolled lock is one `PUT If-None-Match: *` and one `DELETE`; ours reads the object before each conditional write (four requests per cycle against two). The hand-rolled lock has no TTL: a crashed holder keeps it forever.",
        "dynamodb" => "the Lock Client's pattern is a `GetItem` and a `PutItem` to lock and one `DeleteItem` to unlock (three requests); ours' acquisition also reads and raises the fencing floor (four requests), and its release reads the item before writing a tombstone (two), six in all. Its heartbeat is one `UpdateItem`, ours' renewal a read and a write. The peer's record version number is random, so it cannot fence, and a contender must wait a full lease duration even for a lock abandoned long ago.",
        _ => "",
    }
}

/// Explains, from the figures and the stores' designs, what stands in the
/// way of each goal not met.
pub fn stands_in_the_way(w: &mut String, run: &Run, verdicts: &[Verdict]) {
    let unmet: Vec<&Verdict> = verdicts.iter().filter(|v| v.met == Some(false)).collect();
    if unmet.is_empty() {
        return;
    }
    let _ = writeln!(w, "\n### What stands in the way\n");
    // (store, why, goals): goals with the same reason on one line.
    let mut grouped: Vec<(String, String, Vec<String>)> = Vec::new();
    for v in unmet {
        let why = reason(run, v);
        let goal = format!("{} ({})", v.goal, v.measured);
        match grouped
            .iter_mut()
            .find(|(store, w, _)| *store == v.store && *w == why)
        {
            Some((_, _, goals)) => goals.push(goal),
            None => grouped.push((v.store.clone(), why, vec![goal])),
        }
    }
    for (store, why, goals) in grouped {
        let mut chars = why.chars();
        let why = match chars.next() {
            Some(c) => c.to_uppercase().chain(chars).collect::<String>(),
            None => why,
        };
        let _ = writeln!(w, "- **{store}**: {}. {why}", goals.join("; "));
    }
}

/// Why goal `v` was not met, from the figures and the store's design.
fn reason(run: &Run, v: &Verdict) -> String {
    let why = super::scale::why(run, v)
        .or_else(|| super::pool::why(run, v))
        .or_else(|| super::semaphore::why(run, v))
        .or_else(|| super::fair::why(run, v))
        .or_else(|| super::election::why(run, v));
    if let Some(why) = why {
        return why;
    }
    match v.goal {
        GOAL_FAILOVER => match v.store.as_str() {
            "etcd" => "etcd counts lease TTLs in whole seconds, raises them to its minimum lease TTL (2 s with the default election timeout) and ends expired leases in a sweep every 500 ms, so a lease can outlive its TTL by up to half a second (the etcd store's docs); the waiter is woken by the watch when etcd deletes the key.".to_string(),
            _ => "the waiter cannot take the lease before it has expired by the store's clock; a failover past the bound means the waiter slept past the expiry (see the trials).".to_string(),
        },
        GOAL_HANDOFF => handoff_note(&v.store).to_string(),
        GOAL_PEER => peer_note(&v.store).to_string(),
        GOAL_ETCD => store_note(&v.store).unwrap_or_default().to_string(),
        GOAL_CYCLE | GOAL_P99 => {
            let note = store_note(&v.store).unwrap_or_default().to_string();
            let cpu = |variant| {
                find(&run.cycle, &v.store, 16, None, variant).and_then(|r| r.cpu_us_per_op)
            };
            match (cpu(Variant::Ours), cpu(Variant::Baseline)) {
                (Some(o), Some(b)) => format!(
                    "{note} On {} shared cores the client's own work counts too: this process spent {o:.1} µs of CPU per cycle against {b:.1} µs for the baseline's.",
                    run.machine.cores
                ),
                _ => note,
            }
        }
        _ => String::new(),
    }
}
