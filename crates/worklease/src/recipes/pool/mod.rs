//! A work pool: one process covers its share of a fixed set of work IDs,
//! one slot per work ID it holds, and balances itself against the other
//! pools of the same name (Go: `worker.Pool`, which leaves the split to
//! acquisition races; this one balances).
//!
//! Each slot runs the caller's work function under [`Runner::run`], so a
//! slot's lease has the runner's whole lifecycle (renewal, lost signal,
//! final checkpoint, release). How a slot ends:
//!
//! | the slot… | the pool… | observer event |
//! |---|---|---|
//! | was acquired | runs the work function | [`PoolObserver::on_slot_acquired`] |
//! | lost its lease (`Fenced`, `Expired`, `WindowExhausted`) | tries to reacquire at once, if its share allows | [`PoolObserver::on_slot_lost`] |
//! | failed transiently ([`Error::Store`], [`SlotError::Transient`]) | retries after [`PoolOptions::backoff`] | [`PoolObserver::on_slot_backoff`] |
//! | failed permanently ([`SlotError::Permanent`], a panic, bad input) | never takes the work ID again | [`PoolObserver::on_slot_dead`] |
//! | was surplus to the pool's share | fires the work's stop signal; the runner writes its final state and releases (a clean hand-off) | [`PoolObserver::on_slot_released`] |
//! | returned `Ok` unasked | lets the lease go (released by the runner); the work ID is free again at the next round | — |
//!
//! A transient failure's work ID is tried again as soon as its back-off
//! ends (a round is held then), not at the next regular round.
//!
//! ## Finished work IDs
//!
//! With [`PoolOptions::done_prefix`], a work ID `W` is **finished** once
//! the store lists a lease (live or ended) on `<done prefix>W`: its done
//! record. The pool never writes these records (the work function does,
//! for example by acquiring and releasing the record before it returns
//! `Ok`); it reads them in the listing each round already makes, before it
//! acquires anything, so a finished work ID is never acquired again by a
//! pool that has seen its record: its lease keeps the holder and the
//! fencing token that finished it. Once seen, a work ID stays finished for
//! the pool (records are not expected to be deleted). When every work ID is
//! finished, [`Pool::run`] returns `Ok(())`; when every work ID is finished
//! or dead for this pool, at least one dead, [`PoolError::AllSlotsDead`].
//! Without a done prefix no work ID is ever finished.
//!
//! ## Balance
//!
//! Pools find each other through the store: each holds a membership lease
//! on `<name>/members/<holder ID>` (renewed in the background), and the
//! live members are the unexpired leases under `<name>/members/`. Once per
//! round (every renewal interval, TTL/3 by default) a pool lists the
//! store's leases and sorts the live members by holder ID. The shares are
//! over the `W` work IDs that are not finished (finished ones take no slot,
//! so they do not count): with `n` members, `floor = floor(W / n)` and
//! `ceil = ceil(W / n)`; by rank, the first `W mod n` members' quota is
//! `ceil`, the others' `floor`, and the quotas add up to `W`.
//!
//! - A pool holding more than `ceil` stops its surplus slots (cleanly, as
//!   above).
//! - A pool holding `ceil` above its own quota stops one slot only when
//!   another member holds fewer than `floor` and no work ID is free: then
//!   the split is really uneven (some hold `ceil`, one under `floor`).
//!   Otherwise it keeps its work: when a work ID finishes and the remainder
//!   of `W / n` moves to other ranks, no running work is stopped just to
//!   give the same split with other names.
//! - A pool holding fewer than its quota tries work IDs that are free by
//!   the listing, up to its quota, in one batch acquisition
//!   ([`Leases::acquire_many`]: one store call per
//!   [`crate::LeaseStore::max_batch`] work IDs tried).
//!
//! Every lease of the pool (its membership and every slot) is renewed by
//! its [`Leases`] handle's one session, in batches: a pool of thousands of
//! work IDs costs a store call per batch per renewal interval, not one per
//! work ID.
//!
//! In a steady state (no work ID free, no slot stopping) every pool holds
//! `floor` or `ceil`; when work IDs finish, the rest are rebalanced only as
//! far as that needs.
//!
//! A pool acquires nothing in its first round: it writes its membership and
//! takes its share one round later, once the pools started with it have
//! written theirs. So pools started together each start only their own
//! share (3 pools over 12 work IDs start 4 each), instead of the first one
//! taking everything and stopping most of it again a round later. The cost
//! is one round interval before a pool's first work starts.
//!
//! Convergence, with `I` the round interval: after a pool joins (its
//! membership written at `t`), every other pool sees it by `t + I` and
//! stops its surplus; the newcomer picks the released work IDs up at its
//! next round, so all pools hold their quotas by `t + 2I` plus the time the
//! work functions take to stop. After a pool dies, its leases (membership
//! included) expire within the TTL; the others see the smaller membership
//! and take the free work IDs at their next round: all work IDs are covered
//! by death `+ TTL + 2I`. Mutual exclusion never depends on the balance: it
//! is the lease's (S1).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, InvalidInput, Result};
use crate::lease::renewal::Renewal;
use crate::lease::{AcquireOptions, Leases};
use crate::limits::WorkId;
use crate::runner::{check_finish_timeout, RunContext, RunError, Runner};
use crate::token::Token;

mod options;
mod round;

pub use options::{
    BoxError, NoopPoolObserver, PoolError, PoolObserver, PoolOptions, SlotError,
    DEFAULT_SLOT_BACKOFF,
};

/// A process's share of a fixed set of work IDs; see the [module
/// docs](self). Cheap to clone (the options and work ID lists are
/// shared, not copied: each slot's task holds a clone); clones share
/// [`Pool::active_slots`].
#[derive(Clone)]
pub struct Pool {
    leases: Leases,
    options: Arc<PoolOptions>,
    work_ids: Arc<[WorkId]>,
    /// Each work ID's done record (same order), with a done prefix.
    done_ids: Option<Arc<[String]>>,
    member_prefix: String,
    interval: Duration,
    active: Arc<Mutex<BTreeSet<String>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("leases", &self.leases)
            .field("options", &self.options)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

/// The outcome of one slot's task.
enum SlotOutcome {
    /// The work returned `Ok` (released by the runner).
    Done,
    Lost(Error),
    Transient(String),
    Dead(String),
}

enum Slot {
    /// A task tries or holds the lease; `stopping` once asked to hand off.
    Running {
        stop: CancellationToken,
        stopping: bool,
    },
    Backoff(Instant),
    Dead,
}

impl Pool {
    /// A pool on `leases` (whose holder ID names this member).
    ///
    /// # Errors
    /// [`Error::Invalid`] when the options ask for a waiting acquisition,
    /// the work ID list is empty, has duplicates or a bad or reserved work
    /// ID ([`crate::is_internal_work_id`]), a work
    /// ID lies under the membership prefix `<name>/members/` or the done
    /// prefix, the name is not a valid work ID itself (empty, too long,
    /// control characters) or its membership work ID is not valid or reserved, a done
    /// record `<done prefix><work ID>` is not a valid work ID, the done and
    /// membership prefixes overlap, the back-off or finish timeout is under
    /// 1 ms, or the renewal options do not fit the TTL.
    pub fn new(leases: Leases, options: PoolOptions) -> Result<Self> {
        let bad = |msg: String| Err(Error::from(InvalidInput::Config(msg)));
        if options.acquire.waits() {
            return bad(
                "a pool does not wait for leases: remove wait_for_lease from its acquire options (the pool retries free work IDs every round)".into(),
            );
        }
        if options.work_ids.is_empty() {
            return bad(format!("pool {:?} has no work IDs", options.name));
        }
        if options.backoff < Duration::from_millis(1) {
            return bad(format!(
                "pool back-off {:?} must be at least 1ms",
                options.backoff
            ));
        }
        check_finish_timeout(options.finish_timeout)?;
        let interval = options.renewal.check(&leases)?;
        if let Err(e) = WorkId::new(options.name.as_str()) {
            return bad(format!(
                "pool name {:?} is not valid as the prefix of the pool's membership work IDs: {e}",
                options.name
            ));
        }
        let member_prefix = format!("{}/members/", options.name);
        // The membership work ID must itself be valid, and not one
        // worklease keeps for itself (a holder ID `x/fair-queue` would
        // make every membership acquisition fail).
        crate::internal::user_work_id(&format!("{member_prefix}{}", leases.holder_id()))?;
        if let Some(prefix) = &options.done_prefix {
            if prefix.starts_with(&member_prefix) || member_prefix.starts_with(prefix.as_str()) {
                return bad(format!(
                    "done prefix {prefix:?} overlaps the pool's membership prefix {member_prefix:?}"
                ));
            }
        }
        let mut seen = HashSet::new();
        let mut work_ids = Vec::with_capacity(options.work_ids.len());
        for w in &options.work_ids {
            let id = crate::internal::user_work_id(w.as_str())?;
            if w.starts_with(&member_prefix) {
                return bad(format!(
                    "work ID {w:?} lies under the pool's membership prefix {member_prefix:?}"
                ));
            }
            if !seen.insert(w.clone()) {
                return bad(format!("work ID {w:?} is listed twice"));
            }
            work_ids.push(id);
        }
        let done_ids = match &options.done_prefix {
            None => None,
            Some(prefix) => {
                let mut done_ids = Vec::with_capacity(work_ids.len());
                for w in &work_ids {
                    if w.as_str().starts_with(prefix.as_str()) {
                        return bad(format!(
                            "work ID {:?} lies under the done prefix {prefix:?}",
                            w.as_str()
                        ));
                    }
                    let record = format!("{prefix}{w}");
                    if let Err(e) = WorkId::new(record.as_str()) {
                        return bad(format!(
                            "work ID {:?} makes a bad done record ({prefix:?} + the work ID): {e}; shorten the work ID or the prefix",
                            w.as_str()
                        ));
                    }
                    done_ids.push(record);
                }
                Some(done_ids.into())
            }
        };
        Ok(Self {
            leases,
            options: Arc::new(options),
            work_ids: work_ids.into(),
            done_ids,
            member_prefix,
            interval,
            active: Arc::new(Mutex::new(BTreeSet::new())),
        })
    }

    /// The work IDs whose work functions run now (acquired, not yet
    /// ended), sorted.
    pub fn active_slots(&self) -> Vec<String> {
        match self.active.lock() {
            Ok(a) => a.iter().cloned().collect(),
            Err(p) => p.into_inner().iter().cloned().collect(),
        }
    }

    /// The interval of the pool's rounds (the renewal interval).
    pub fn round_interval(&self) -> Duration {
        self.interval
    }

    /// This pool's membership work ID: `<name>/members/<holder ID>`.
    pub fn member_work_id(&self) -> String {
        format!("{}{}", self.member_prefix, self.leases.holder_id())
    }

    fn set_active(&self, work_id: &str, on: bool) {
        let mut a = match self.active.lock() {
            Ok(a) => a,
            Err(p) => p.into_inner(),
        };
        if on {
            a.insert(work_id.to_string());
        } else {
            a.remove(work_id);
        }
    }

    /// Runs the pool until `shutdown` fires (then every slot's work gets
    /// its stop signal, its final state is checkpointed and its lease and
    /// the membership released), every work ID is finished (see
    /// [`PoolOptions::done_prefix`]; `Ok(())`, after the same clean stop),
    /// or every work ID is dead or finished, at least one dead. `work` runs once per
    /// acquired slot, with the runner's [`RunContext`]: it should return
    /// its state when [`RunContext::cancelled`] fires.
    ///
    /// Shutdown waits for every work function to return: a work function
    /// that ignores its signal holds the shutdown up. Run one pool (and
    /// one clone of it) at a time per holder ID: a second would find the
    /// membership and the slots held by the same holder.
    ///
    /// Dropping the future stops the pool too: slots are released on
    /// spawned tasks as by [`Runner::run`] (without a final checkpoint);
    /// the membership lease expires.
    ///
    /// # Errors
    /// [`PoolError::AllSlotsDead`] when every work ID's slot was dropped
    /// (or, with a done prefix, every one not finished was).
    pub async fn run<F, Fut>(
        &self,
        shutdown: CancellationToken,
        work: F,
    ) -> std::result::Result<(), PoolError>
    where
        F: Fn(RunContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Option<Bytes>, SlotError>> + Send + 'static,
    {
        let work = Arc::new(work);
        let runner = Runner::new(self.leases.clone())
            .acquire_options(self.options.acquire.clone())
            .renewal_options(self.options.renewal.clone())
            .finish_timeout(self.options.finish_timeout);
        let mut slots: HashMap<String, Slot> = HashMap::new();
        let mut tasks: JoinSet<(String, SlotOutcome)> = JoinSet::new();
        let mut membership: Option<Renewal> = None;
        // Work IDs whose done record this pool has seen.
        let mut finished: HashSet<String> = HashSet::new();
        // The first round only writes the membership (see the module docs).
        let mut first_round = true;
        let mut next_round = Instant::now();
        let result = loop {
            if let Some(end) = self.ended(&slots, &finished) {
                break end;
            }
            tokio::select! {
                _ = shutdown.cancelled() => break Ok(()),
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                    let (work_id, outcome) = match joined {
                        Ok(r) => r,
                        Err(e) => {
                            // Slot tasks catch the work's panics and are
                            // never aborted while the pool runs.
                            tracing::warn!(error = %e, "a pool slot task failed");
                            continue;
                        }
                    };
                    if let Some(at) = self.slot_ended(&mut slots, &work_id, outcome) {
                        // Lost (at once) or backed off (when the back-off
                        // ends): try again then, if the share allows.
                        next_round = next_round.min(at);
                    }
                }
                _ = tokio::time::sleep_until(next_round) => {
                    next_round = Instant::now() + self.interval;
                    membership = self.keep_membership(membership).await;
                    if first_round {
                        first_round = false;
                    } else {
                        self.round(&mut slots, &mut finished, &mut tasks, &runner, &work)
                            .await;
                    }
                }
            }
        };
        // Stop every slot cleanly and wait for the hand-offs.
        for slot in slots.values_mut() {
            if let Slot::Running { stop, stopping } = slot {
                stop.cancel();
                *stopping = true;
            }
        }
        while let Some(joined) = tasks.join_next().await {
            if let Ok((work_id, outcome)) = joined {
                self.slot_ended(&mut slots, &work_id, outcome);
            }
        }
        if let Some(m) = membership {
            if let Ok(token) = m.stop().await {
                if let Err(e) = self.leases.release(token).await {
                    tracing::debug!(error = %e, "could not release the pool membership");
                }
            }
        }
        result
    }

    /// How the pool ends, once every work ID is finished or dead for it:
    /// `Ok` when all are finished, else [`PoolError::AllSlotsDead`].
    fn ended(
        &self,
        slots: &HashMap<String, Slot>,
        finished: &HashSet<String>,
    ) -> Option<std::result::Result<(), PoolError>> {
        let mut dead = false;
        for w in self.work_ids.iter() {
            if finished.contains(w.as_str()) {
                continue;
            }
            if !matches!(slots.get(w.as_str()), Some(Slot::Dead)) {
                return None;
            }
            dead = true;
        }
        Some(if dead {
            Err(PoolError::AllSlotsDead {
                pool: self.options.name.clone(),
                count: self.work_ids.len(),
            })
        } else {
            Ok(())
        })
    }

    /// Records a slot's end; returns when the next round should be at the
    /// latest: at once after a loss, at the end of a back-off.
    fn slot_ended(
        &self,
        slots: &mut HashMap<String, Slot>,
        work_id: &str,
        outcome: SlotOutcome,
    ) -> Option<Instant> {
        self.set_active(work_id, false);
        let stopping = matches!(
            slots.get(work_id),
            Some(Slot::Running { stopping: true, .. })
        );
        let observer = &self.options.observer;
        match outcome {
            SlotOutcome::Done => {
                if stopping {
                    observer.on_slot_released(work_id);
                }
                slots.remove(work_id);
                None
            }
            SlotOutcome::Lost(e) => {
                observer.on_slot_lost(work_id, &e);
                slots.remove(work_id);
                Some(Instant::now())
            }
            SlotOutcome::Transient(e) => {
                observer.on_slot_backoff(work_id, &e, self.options.backoff);
                let until = Instant::now() + self.options.backoff;
                slots.insert(work_id.to_string(), Slot::Backoff(until));
                Some(until)
            }
            SlotOutcome::Dead(e) => {
                observer.on_slot_dead(work_id, &e);
                slots.insert(work_id.to_string(), Slot::Dead);
                None
            }
        }
    }

    async fn run_slot<F, Fut>(&self, runner: &Runner, token: Token, work: Arc<F>) -> SlotOutcome
    where
        F: Fn(RunContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Option<Bytes>, SlotError>> + Send + 'static,
    {
        let pool = self.clone();
        let id = token.work_id().to_string();
        let run = runner.run_acquired(token, move |ctx| {
            pool.set_active(&id, true);
            pool.options
                .observer
                .on_slot_acquired(&id, ctx.fencing_token());
            work(ctx)
        });
        // A panic of the work is caught here so the slot can be counted
        // dead (the runner has stopped renewing; the lease expires).
        let result =
            match futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(run)).await {
                Ok(r) => r,
                Err(_) => return SlotOutcome::Dead("the work function panicked".into()),
            };
        match result {
            Ok(()) => SlotOutcome::Done,
            Err(RunError::Lease(e)) if e.is_lease_lost() => SlotOutcome::Lost(e),
            Err(RunError::Lease(e)) if e.is_transient() => SlotOutcome::Transient(e.to_string()),
            Err(RunError::Lease(e)) => SlotOutcome::Dead(e.to_string()),
            Err(RunError::Work(SlotError::Transient(e))) => SlotOutcome::Transient(e.to_string()),
            Err(RunError::Work(SlotError::Permanent(e))) => SlotOutcome::Dead(e.to_string()),
        }
    }
}
