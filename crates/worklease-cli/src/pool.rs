//! `worklease pool`: run a command per work ID this process holds, out of
//! a fixed set that the pools of one name share fairly between them.
//!
//! Built on [`worklease::pool::Pool`]: each pool process holds a membership
//! lease on `<NAME>/members/<HOLDER>`, and every round (TTL/3) takes its
//! share of the work IDs not done yet (with `W` of them and `n` live pools,
//! `ceil(W/n)` or `floor(W/n)` each), gives back its surplus and takes free
//! work IDs up to its share. Its first round only writes the membership:
//! it starts commands one round after it starts, so that pools started
//! together each start only their share. The done records
//! (`<NAME>/done/<WORK_ID>`, the pool's `done_prefix`) are read in every
//! round's listing before anything is acquired: a done work ID is never
//! acquired again, and leaves the shares.
//!
//! For each work ID it holds (a slot), it runs the command in its own
//! process group under the same supervision as `worklease run`
//! ([`crate::supervise::supervise_with`]), with the `WORKLEASE_*`
//! environment of that work ID's lease and stdin `/dev/null`.
//!
//! How a slot's child ends, and what follows:
//!
//! | the child… | the pool… |
//! |---|---|
//! | exits 0 on its own, the lease still held | records the work ID as done (`<NAME>/done/<WORK_ID>`, a released lease whose checkpoint names the holder and fencing token that finished it) and releases the slot; no pool of that name starts the command for that work ID again |
//! | exits non-zero, or is ended by a signal the pool did not send | releases the slot; it is started again when `--backoff` has passed (by this pool, or at once by another one with room in its share) |
//! | runs when the lease is lost (taken over, revoked, expired, renewals failing) | SIGTERM to its group at once, SIGKILL after `--grace` (at the lease deadline at the latest); the pool takes the work ID again if its share allows |
//! | runs when the slot is surplus to the pool's share | SIGTERM, SIGKILL after `--grace`; once the group is gone, the slot is released (a clean hand-off) |
//! | runs when the pool gets SIGINT, SIGTERM, SIGHUP or SIGQUIT | that signal (then SIGCONT) to every child's group, SIGKILL after `--grace`; then every slot and the membership are released, and the pool exits 128 + N |
//!
//! A child the pool asked to stop (hand-off, shutdown, loss) never counts as
//! done, whatever its exit status. A pool exits 0 once every work ID is
//! done (it sees the records other pools wrote in its next round's
//! listing). SIGUSR1 and SIGUSR2 are forwarded to every child's group;
//! Ctrl-Z stops every child's group, then the pool; SIGCONT continues the children whose lease
//! is still live and SIGKILLs the others. If the pool dies, its children
//! get SIGKILL (Linux) and its leases expire within the TTL: the other pools
//! take its work IDs over within TTL + 2 rounds.
//!
//! "Exactly once", precisely: at most one child at a time runs for a work
//! ID (the lease; the child is gone by its lease's deadline), and a work ID
//! is recorded done once. A child that is killed (its pool died, its lease
//! was lost) leaves its work where its last checkpoint says: the next child
//! resumes from there and may redo what the killed one did after that
//! checkpoint, so the command's work must be idempotent given its
//! checkpoint, and downstream writes should carry `WORKLEASE_FENCING_TOKEN`
//! (`worklease checkpoint set` with a stale token writes nothing and exits
//! 76). A pool that dies between its child's exit 0 and the done record
//! leaves the work ID to a successor, whose child should find its
//! checkpoint complete and exit 0 at once.
//!
//! Work IDs and their checkpoints are global, not scoped by `--pool-name`
//! (only the membership and done records are): a work ID reused by a later
//! run resumes from the checkpoint the earlier run left, typically a
//! complete one, so the new run "finishes" at once without doing anything.
//! A run's work IDs should carry the run (`reindex-2024-06/shard-0`). The
//! one reuse the pool can tell for sure is refused before anything is
//! written: a work ID that a pool of another name recorded done (its
//! `<OTHER>/done/<WORK_ID>` exists, and `<OTHER>/members/...` leases show
//! `<OTHER>` is a pool name). Other reuse (a checkpoint left by `run`, or
//! by an unfinished run of another name) looks exactly like the resume
//! after a crash that checkpoints exist for, so it cannot be refused.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use worklease::pool::{Pool, PoolError, PoolObserver, PoolOptions, SlotError};
use worklease::runner::RunContext;
use worklease::store::memory::MemoryStore;
use worklease::{AcquireOptions, Config, Error, Leases, Token, WorkId};

use crate::exit::{self, Failure};
use crate::run::{check_command, check_lease_args, default_holder, fmt_secs, warn_if_memory};
use crate::say::say;
use crate::settle;
use crate::supervise::{
    cannot_run, spawn_in_group, supervise_with, terminating, HeldLease, Signals, Stop, MAX_CHILDREN,
};
use crate::PoolArgs;

/// Runs `worklease pool` and returns its exit status.
pub async fn pool(args: PoolArgs) -> Result<u8, Failure> {
    let holder = args
        .holder
        .as_ref()
        .map_or_else(default_holder, |h| h.to_string());
    // Nothing is opened, let alone written, for arguments that cannot work.
    let grace = check_lease_args(&holder, args.ttl, args.grace)?;
    check_command(&args.command)?;
    let work_ids = work_ids(&args)?;
    let outcomes = Arc::new(Outcomes::default());
    let done_prefix = format!("{}/done/", args.pool_name);
    let options = PoolOptions::new(args.pool_name.as_str(), work_ids.iter().cloned())
        .backoff(args.backoff)
        .done_prefix(done_prefix.as_str())
        .observer(outcomes.clone());
    // The pool name, the work IDs and their done records are checked here.
    let probe = Leases::new(
        Arc::new(MemoryStore::new()),
        Config::new(holder.as_str(), args.ttl),
    )?;
    Pool::new(probe, options.clone())?;

    args.metrics.serve(&args.pool_name)?;
    let (child_url, store) = args.store.open(&args.shared)?;
    warn_if_memory(&store);
    let leases = Leases::new(store, Config::new(holder, args.ttl))?;
    let pool = Pool::new(leases.clone(), options)?;
    refuse_other_runs(&leases, &args.pool_name, &work_ids).await?;
    // From now on these signals no longer end this process: they stop the
    // pool (the first terminating one) or reach the children.
    let mut signals = Signals::install()?;
    let slots = Arc::new(Slots {
        leases,
        done_prefix,
        command: args.command,
        child_url,
        grace,
        fanout: Fanout::default(),
        shutdown: CancellationToken::new(),
        stopped_by: AtomicI32::new(0),
        fatal: Mutex::new(None),
        starting: tokio::sync::Semaphore::new(STARTING),
    });
    tracing::info!(
        pool = %args.pool_name,
        member = %pool.member_work_id(),
        work_ids = work_ids.len(),
        round = %fmt_secs(pool.round_interval()),
        "pool started"
    );
    let work = {
        let slots = slots.clone();
        move |ctx: RunContext| {
            let span = tracing::info_span!("slot", work_id = %ctx.token().work_id());
            slots.clone().run(ctx).instrument(span)
        }
    };
    let mut run = Box::pin(pool.run(slots.shutdown.clone(), work));
    let mut interrupted = None;
    // Once stopping: how long the children's grace and the releases may
    // take before the pool exits anyway (a store whose every write blocks,
    // such as a Redis replica wait without replicas, would otherwise keep
    // it for minutes).
    let mut deadline: Option<tokio::time::Instant> = None;
    let stop_bound = grace + settle::bound(args.ttl);
    let result = loop {
        let past_deadline = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = &mut run => break Some(result),
            () = past_deadline => break None,
            Some(sig) = signals.recv() => {
                if terminating(sig) && !slots.shutdown.is_cancelled() {
                    interrupted = Some(sig);
                    slots.stopped_by.store(sig as i32, Ordering::SeqCst);
                    tracing::info!(
                        "{sig}: stopping every child ({sig}, SIGKILL after {}), then releasing every slot",
                        fmt_secs(grace)
                    );
                    slots.shutdown.cancel();
                    deadline = Some(tokio::time::Instant::now() + stop_bound);
                } else {
                    // SIGCONT, SIGUSR1, SIGUSR2, and terminating signals
                    // after the first: to every child's group.
                    slots.fanout.send(sig);
                    if terminating(sig) {
                        // A second one also ends the wait (Ctrl-C again).
                        say!(
                            "{sig}, a second signal: pool {:?} exits without waiting \
                             for its children and releases; a lease it still holds ends when its \
                             TTL runs out",
                            args.pool_name
                        );
                        return Ok(128 + interrupted.unwrap_or(sig) as u8);
                    }
                }
            }
        }
    };
    let Some(result) = result else {
        say!(
            "pool {:?} did not stop within {} (the children's grace and its releases): \
             exiting; a lease it still holds ends when its TTL runs out",
            args.pool_name,
            fmt_secs(stop_bound)
        );
        return Ok(128 + interrupted.map_or(0, |s| s as u8));
    };
    drop(run);
    // Acquisitions of slots given up when the pool stopped may be granted
    // anyway: they are released in the background; let that finish.
    settle::before_exit(
        slots.leases.settle(settle::bound(args.ttl)),
        args.ttl,
        &mut signals,
    )
    .await;
    if let Some(failure) = lock(&slots.fatal).take() {
        return Err(failure);
    }
    if let Some(sig) = interrupted {
        say!(
            "{sig}: pool {:?} stopped its children and released its work IDs",
            args.pool_name
        );
        return Ok(128 + sig as u8);
    }
    match result {
        Err(PoolError::AllSlotsDead { count, .. }) => {
            let dead = lock(&outcomes.dead).clone();
            let list: Vec<String> = dead.iter().map(|(w, e)| format!("{w:?}: {e}")).collect();
            Err(Failure::new(
                exit::SOFTWARE,
                format!(
                    "{} of {count} work IDs failed for good, the others are done: {}",
                    dead.len(),
                    list.join("; ")
                ),
            ))
        }
        Err(PoolError::Lease(e)) => Err(e.into()),
        // Not stopped by a signal nor a fatal failure (both handled above):
        // every work ID is done.
        Ok(()) => {
            tracing::info!("all {} work IDs are done", work_ids.len());
            Ok(0)
        }
    }
}

/// The work IDs of `--work-ids` (comma-separated, repeatable) and
/// `--work-ids-file` (one per line, surrounding whitespace trimmed, blank
/// lines and lines starting with `#` skipped), in that order: at least 1,
/// at most [`MAX_CHILDREN`]. Each is checked later by [`Pool::new`] (1 to
/// 1024 bytes, no control characters, not reserved, no duplicates).
fn work_ids(args: &PoolArgs) -> Result<Vec<String>, Failure> {
    let mut ids: Vec<String> = args
        .work_ids
        .iter()
        .flat_map(|list| list.split(','))
        .map(str::to_string)
        .collect();
    if let Some(path) = &args.work_ids_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Failure::usage(format!(
                "cannot read --work-ids-file {}: {e}",
                path.display()
            ))
        })?;
        ids.extend(worklease_cli::values::work_id_lines(&text).map(str::to_string));
    }
    if ids.is_empty() {
        return Err(Failure::usage(format!(
            "no work IDs: give --work-ids ID,ID,... or --work-ids-file FILE (1 to {MAX_CHILDREN} work IDs)"
        )));
    }
    if ids.len() > MAX_CHILDREN {
        return Err(Failure::usage(format!(
            "{} work IDs: a pool takes at most {MAX_CHILDREN} (it runs one child per work ID it holds)",
            ids.len()
        )));
    }
    Ok(ids)
}

/// Refuses (exit 64, before anything is written) work IDs that a pool of
/// another name recorded done: the store lists `<OTHER>/done/<WORK_ID>`
/// for one of them, and some `<OTHER>/members/...` lease shows that
/// `<OTHER>` is a pool name. Work IDs and checkpoints are not scoped by the
/// pool name, so this run would resume from that run's finished
/// checkpoint (see the module docs).
async fn refuse_other_runs(
    leases: &Leases,
    name: &str,
    work_ids: &[String],
) -> Result<(), Failure> {
    const DONE: &str = "/done/";
    let infos = leases.store().inspect(&[]).await?;
    let wanted: HashSet<&str> = work_ids.iter().map(String::as_str).collect();
    let mut pools: HashSet<&str> = HashSet::new();
    let mut records: Vec<(&str, &str)> = Vec::new();
    for id in infos.iter().map(|i| i.work_id.as_str()) {
        for (at, _) in id.match_indices("/members/") {
            pools.insert(&id[..at]);
        }
        for (at, _) in id.match_indices(DONE) {
            let (other, work_id) = (&id[..at], &id[at + DONE.len()..]);
            if other != name && wanted.contains(work_id) {
                records.push((other, work_id));
            }
        }
    }
    records.retain(|(other, _)| pools.contains(other));
    records.sort_unstable();
    let Some((other, first)) = records.first() else {
        return Ok(());
    };
    let more = match records.len() {
        1 => String::new(),
        n => format!(" (and {} more of the {} work IDs)", n - 1, work_ids.len()),
    };
    let record = format!("{other}{DONE}{first}");
    Err(Failure::usage(format!(
        "work ID {first:?} was already done by the pool {other:?} (its record {record:?} exists){more}: \
         work IDs and their checkpoints are shared whatever the --pool-name, so this run would resume from \
         that run's finished checkpoint and do nothing; give this run its own work IDs, e.g. \"{name}/{first}\""
    )))
}

/// What every slot of this pool shares.
struct Slots {
    leases: Leases,
    /// `<NAME>/done/`.
    done_prefix: String,
    command: Vec<std::ffi::OsString>,
    /// The store URL for the children (never printed).
    child_url: String,
    grace: std::time::Duration,
    fanout: Fanout,
    /// Fires to stop the pool (a signal, or a command that cannot run).
    shutdown: CancellationToken,
    /// The signal that stopped the pool (0 while none): the children get it
    /// first, instead of SIGTERM.
    stopped_by: AtomicI32,
    /// Why the pool stopped, when the command cannot be run at all.
    fatal: Mutex<Option<Failure>>,
    /// Slots between their acquisition and their child's start (a store
    /// read and a spawn each): at most [`STARTING`] at once.
    starting: tokio::sync::Semaphore,
}

/// How many slots start their child at once. This process runs on one
/// thread, which also renews every lease (the session): with thousands of
/// slots ready to start together, each in its turn, a renewal waited behind
/// all of them, and leases were lost while their children started. With
/// few at once it waits behind a few; the children start as fast (one
/// thread starts them either way).
const STARTING: usize = 16;

impl Slots {
    /// One slot: the runner holds the lease on `ctx`'s work ID; run the
    /// command under it (see the module docs for what its end means).
    async fn run(self: Arc<Self>, ctx: RunContext) -> Result<Option<Bytes>, SlotError> {
        let work_id = ctx.token().work_id().as_str().to_string();
        // Never closed: a permit comes.
        let starting = self.starting.acquire().await.ok();
        // The pool skips work IDs whose record its round's listing showed;
        // this catches one written since that listing.
        match self.is_done(&work_id).await {
            Ok(true) => {
                tracing::info!("found its done record: not run again");
                return Ok(None);
            }
            Ok(false) => {}
            Err(e) => return Err(transient(e.to_string())),
        }
        // Subscribe before the spawn, so that no signal is missed.
        let mut signals = self.fanout.subscribe();
        if ctx.cancelled().is_cancelled() {
            // Asked to stop before the command started (or lost: the
            // runner reports that).
            return Ok(None);
        }
        // Never a child for a lease past its deadline.
        let token = ctx.ensure_live().map_err(|e| transient(e.to_string()))?;
        let child = match spawn_in_group(&self.command, &token, &self.child_url, true).await {
            Ok(child) => child,
            // Out of processes, memory or file descriptors: try again later.
            Err(e) if e.raw_os_error().is_some_and(short_of_resources) => {
                return Err(transient(format!("cannot start the command: {e}")));
            }
            Err(e) => {
                // Not found, not executable: the same for every work ID, so
                // the pool stops (126/127, as `run`).
                let failure = cannot_run(&self.command, e);
                let message = failure.message.clone();
                lock(&self.fatal).get_or_insert(failure);
                self.shutdown.cancel();
                return Err(SlotError::Permanent(message.into()));
            }
        };
        drop(starting);
        tracing::debug!(fencing_token = token.fencing_token(), "the command started");
        let describe = || {
            ctx.lost_cause().map_or_else(
                || format!("lost the lease on {work_id:?}"),
                |e| e.to_string(),
            )
        };
        let stop_signal = || self.stop_signal();
        let stop = Stop {
            signal: &stop_signal,
        };
        let (code, lost) =
            supervise_with(child, &ctx, describe, self.grace, &mut signals, Some(&stop))
                .await
                .map_err(|f| transient(f.message))?;
        if lost {
            // With a loss cause the runner reports the loss whatever this
            // returns; without one the lease ran out while renewals failed.
            return Err(transient(format!(
                "the command was stopped because its lease was lost (its own status: {code})"
            )));
        }
        if ctx.cancelled().is_cancelled() {
            // Stopped by the pool (a hand-off, the shutdown): never done,
            // whatever its status.
            return Ok(None);
        }
        if code != 0 {
            return Err(transient(format!("the command exited with status {code}")));
        }
        let token = ctx.ensure_live().map_err(|e| {
            transient(format!(
                "the command exited 0 but the lease was no longer live, so it is not recorded as done: {e}"
            ))
        })?;
        match self.mark_done(&token).await {
            Ok(()) => {
                tracing::info!(
                    "done: the command exited 0; no pool of this name runs it again"
                );
                // The pool sees the record in its next round's listing.
                Ok(None)
            }
            Err(e) => Err(transient(format!(
                "the command exited 0, but its done record could not be written (it runs again): {e}"
            ))),
        }
    }

    /// The first signal for a child the pool stops: the one that stopped the
    /// pool, else SIGTERM.
    fn stop_signal(&self) -> Signal {
        Signal::try_from(self.stopped_by.load(Ordering::SeqCst)).unwrap_or(Signal::SIGTERM)
    }

    fn done_id(&self, work_id: &str) -> String {
        format!("{}{work_id}", self.done_prefix)
    }

    /// Whether the work ID's done record exists.
    async fn is_done(&self, work_id: &str) -> Result<bool, Error> {
        let id = WorkId::new(self.done_id(work_id))?;
        Ok(!self.leases.store().inspect(&[id]).await?.is_empty())
    }

    /// Writes the done record of `token`'s work ID: acquires
    /// `<NAME>/done/<WORK_ID>`, checkpoints who finished it, releases. The
    /// record exists from the acquisition on.
    async fn mark_done(&self, token: &Token) -> Result<(), Error> {
        let work_id = token.work_id().as_str();
        let record = match self
            .leases
            .acquire(&self.done_id(work_id), AcquireOptions::new())
            .await
        {
            Ok(record) => record,
            // Being written by another pool this very moment: done either way.
            Err(Error::Held { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let note = format!(
            "{work_id:?} done: the command exited 0 under fencing token {} of holder {:?}",
            token.fencing_token(),
            token.holder_id().as_str()
        );
        let record = self.leases.checkpoint(&record, note).await?;
        self.leases.release(record).await
    }
}

/// Whether a spawn failed with `errno` for want of processes, memory or
/// file descriptors, which may come back.
fn short_of_resources(errno: i32) -> bool {
    use nix::errno::Errno;
    [Errno::EAGAIN, Errno::ENOMEM, Errno::EMFILE, Errno::ENFILE]
        .iter()
        .any(|e| *e as i32 == errno)
}

fn transient(message: impl Into<String>) -> SlotError {
    SlotError::Transient(message.into().into())
}

impl HeldLease for RunContext {
    fn latest(&self) -> Token {
        self.token()
    }
    fn cause(&self) -> Option<Error> {
        self.lost_cause()
    }
    /// The runner's signal: the lease was lost, or (with no loss cause) the
    /// pool asks the child to stop.
    fn lost(&self) -> CancellationToken {
        self.cancelled()
    }
    fn live(&self) -> bool {
        self.ensure_live().is_ok()
    }
}

/// What became of the work IDs: the pool's observer.
#[derive(Default)]
struct Outcomes {
    /// Work IDs this pool dropped after a permanent failure, with the
    /// error.
    dead: Mutex<BTreeMap<String, String>>,
}

impl PoolObserver for Outcomes {
    fn on_slot_acquired(&self, work_id: &str, fencing_token: u64) {
        tracing::info!(work_id, fencing_token, "slot acquired");
    }
    fn on_slot_lost(&self, work_id: &str, error: &Error) {
        tracing::warn!(
            work_id,
            "{error}: the command was stopped; the pool takes the work ID again if its share allows"
        );
    }
    fn on_slot_backoff(&self, work_id: &str, error: &str, retry_in: std::time::Duration) {
        tracing::warn!(
            work_id,
            "{error}: the work ID was released; this pool tries it again in {}",
            fmt_secs(retry_in)
        );
    }
    fn on_slot_dead(&self, work_id: &str, error: &str) {
        tracing::error!(
            work_id,
            "{error}: this pool does not take the work ID again"
        );
        lock(&self.dead).insert(work_id.to_string(), error.to_string());
    }
    fn on_slot_released(&self, work_id: &str) {
        tracing::info!(
            work_id,
            "handed off to another pool: its command was stopped, the lease released"
        );
    }
}

/// Copies of the signals this process receives, one channel per running
/// child's supervision.
#[derive(Default)]
struct Fanout(Mutex<Vec<mpsc::UnboundedSender<Signal>>>);

impl Fanout {
    fn subscribe(&self) -> Signals {
        let (tx, signals) = Signals::channel();
        let mut senders = lock(&self.0);
        senders.retain(|s| !s.is_closed());
        senders.push(tx);
        signals
    }

    fn send(&self, sig: Signal) {
        lock(&self.0).retain(|s| s.send(sig).is_ok());
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
