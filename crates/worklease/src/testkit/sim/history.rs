//! The history of a run: every store call as its holder's link saw it
//! (invocation, the store's own answer, what reached the caller, when),
//! and every interval in which a holder believed it held a lease.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::Error;
use crate::store::{Checkpoint, Handoff};
use crate::token::Token;

/// A point of the run: a global sequence number (every event of the run is
/// numbered in the order it happened, which orders events at one simulated
/// instant) and the simulated time since the start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp {
    /// Position in the run's total order of events.
    pub seq: u64,
    /// Simulated time since the run started.
    pub at: Duration,
}

/// A store operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpKind {
    /// `LeaseStore::acquire`.
    Acquire,
    /// `LeaseStore::renew`.
    Renew,
    /// `LeaseStore::checkpoint`.
    Checkpoint,
    /// `LeaseStore::read_checkpoint`.
    ReadCheckpoint,
    /// `LeaseStore::release`.
    Release,
}

impl OpKind {
    /// A short name for traces and figures.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Acquire => "acquire",
            OpKind::Renew => "renew",
            OpKind::Checkpoint => "checkpoint",
            OpKind::ReadCheckpoint => "read",
            OpKind::Release => "release",
        }
    }
}

/// The class of a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Success.
    Ok,
    /// `Error::Held`.
    Held,
    /// `Error::Expired`.
    Expired,
    /// `Error::Fenced`.
    Fenced,
    /// `Error::Store`: the store failed; the call may or may not have taken
    /// effect.
    Store,
    /// Any other error (none is expected from a store).
    Other,
}

impl Outcome {
    /// The class of `r`.
    pub fn of<T>(r: &crate::Result<T>) -> Self {
        match r {
            Ok(_) => Outcome::Ok,
            Err(Error::Held { .. }) => Outcome::Held,
            Err(Error::Expired { .. }) => Outcome::Expired,
            Err(Error::Fenced { .. }) => Outcome::Fenced,
            Err(Error::Store(_)) => Outcome::Store,
            Err(_) => Outcome::Other,
        }
    }
}

/// What reached the caller of a store call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// Still in flight (only seen in a run that did not finish).
    Pending,
    /// The store's answer (possibly a store error injected before it).
    Reply(Outcome),
    /// The store applied the call but the reply was lost: the caller saw a
    /// store error at its reply timeout.
    LostReply,
    /// The store was unreachable: the call never reached it.
    Refused,
    /// The caller stopped waiting (dropped the future): the request may
    /// still reach the store later.
    Abandoned,
}

/// What the store itself did with a call that reached it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// When the store call started.
    pub start: Stamp,
    /// When it returned (`None` while it runs).
    pub end: Option<Stamp>,
    /// The store's answer.
    pub outcome: Option<Outcome>,
    /// For a granted acquisition: the fencing token and the hand-off.
    pub grant: Option<(u64, Handoff)>,
    /// For a successful read: the checkpoint and hand-off read.
    pub read: Option<Checkpoint>,
}

/// How the checker can count on a call's effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// It never reached the store, or the store refused it with a lease
    /// outcome (`Held`, `Expired`, `Fenced`): nothing changed (contract).
    None,
    /// The store applied it.
    Applied,
    /// Unknown: a store error from the store itself (a register write whose
    /// reply was lost, contention), or a call still running.
    Ambiguous,
}

/// One store call through a holder's link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpRecord {
    /// Index in the history.
    pub id: usize,
    /// The calling holder (its index; its ID is `h<index>`).
    pub holder: usize,
    /// The operation.
    pub kind: OpKind,
    /// The work ID.
    pub work_id: String,
    /// The fencing token named (all but acquire).
    pub token: Option<u64>,
    /// The checkpoint written (checkpoint only).
    pub data: Option<Bytes>,
    /// When the holder's library sent it.
    pub invoked: Stamp,
    /// What the store did, if the call reached it.
    pub applied: Option<Applied>,
    /// What reached the caller.
    pub delivery: Delivery,
    /// When it reached the caller (or the caller gave up).
    pub completed: Option<Stamp>,
    /// The faults injected into this call.
    pub faults: Vec<FaultKind>,
}

impl OpRecord {
    /// How the checker may count on this call's effect.
    pub fn effect(&self) -> Effect {
        match &self.applied {
            None => Effect::None,
            Some(Applied { end: None, .. }) => Effect::Ambiguous,
            Some(a) => match a.outcome {
                Some(Outcome::Ok) => Effect::Applied,
                Some(Outcome::Held | Outcome::Expired | Outcome::Fenced) => Effect::None,
                _ => Effect::Ambiguous,
            },
        }
    }

    /// The store call's start and end, for a call that reached the store
    /// and returned.
    pub fn span(&self) -> Option<(Stamp, Stamp)> {
        let a = self.applied.as_ref()?;
        Some((a.start, a.end?))
    }
}

impl fmt::Display for OpRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{:<5} t={:>6}ms h{} {} {}",
            self.id,
            self.invoked.at.as_millis(),
            self.holder,
            self.kind.name(),
            self.work_id
        )?;
        if let Some(t) = self.token {
            write!(f, " token={t}")?;
        }
        if let Some(d) = &self.data {
            write!(f, " data={:?}", String::from_utf8_lossy(d))?;
        }
        match &self.applied {
            None => write!(f, " | not applied")?,
            Some(a) => {
                write!(f, " | store [{}ms", a.start.at.as_millis())?;
                match a.end {
                    Some(e) => write!(f, "..{}ms]", e.at.as_millis())?,
                    None => write!(f, "..running]")?,
                }
                if let Some(o) = a.outcome {
                    write!(f, " {o:?}")?;
                }
                if let Some((t, h)) = &a.grant {
                    write!(f, " granted={t} prev={}", fmt_handoff(h))?;
                }
                if let Some(c) = &a.read {
                    write!(
                        f,
                        " read={:?} prev={}",
                        c.data
                            .as_ref()
                            .map(|d| String::from_utf8_lossy(d).into_owned()),
                        fmt_handoff(&c.handoff)
                    )?;
                }
            }
        }
        write!(f, " | caller {:?}", self.delivery)?;
        if let Some(c) = self.completed {
            write!(f, " at {}ms", c.at.as_millis())?;
        }
        if !self.faults.is_empty() {
            write!(f, " | faults {:?}", self.faults)?;
        }
        Ok(())
    }
}

fn fmt_handoff(h: &Handoff) -> String {
    match &h.previous {
        None => "none".into(),
        Some(p) => format!("{}/{}/{}", p.holder_id, p.fencing_token, p.ended.as_str()),
    }
}

/// An interval of simulated time in which a holder believed it held a
/// lease: from the moment it learned a token (an acquisition's or renewal's
/// reply) to the real-time instant at which its own (possibly drifting)
/// clock reaches the token's deadline, cut short by a release's send or a
/// loss the holder noticed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Belief {
    /// The holder.
    pub holder: usize,
    /// The work ID.
    pub work_id: String,
    /// The fencing token believed in.
    pub token: u64,
    /// Start of the belief.
    pub from: Duration,
    /// End of the belief (exclusive).
    pub until: Duration,
}

/// A kind of injected fault, for the figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// A request delayed before the store applied it.
    DelayBefore,
    /// A reply delayed after the store applied the request.
    DelayAfter,
    /// A request failed before reaching the store.
    ErrorBefore,
    /// A reply lost after the store applied the request.
    LostReply,
    /// A request refused because the store was unreachable.
    Unreachable,
    /// An outage interval of the store (counted once per interval).
    Outage,
    /// A holder frozen (a process pause).
    Freeze,
    /// A freeze longer than the TTL (the holder must find its lease lost).
    FreezePastTtl,
    /// A holder whose clock drifts (counted once per holder with a
    /// non-zero drift).
    Drift,
    /// A wall-clock step behind a reply's expiry.
    WallStep,
    /// A register read delayed (register adapter only).
    RegisterReadDelay,
    /// A register write delayed before it took effect.
    RegisterWriteDelay,
    /// A register write failed before taking effect.
    RegisterWriteError,
    /// A register write took effect but its reply was lost.
    RegisterLostReply,
}

/// What the holders saw, for the figures (not checked).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppCounts {
    /// Sessions (successful acquisitions seen by a holder).
    pub sessions: u64,
    /// Of which renewed in the background.
    pub renewal_sessions: u64,
    /// Batch sessions: several work IDs acquired at once and renewed
    /// together by the handle's session.
    pub batch_sessions: u64,
    /// Leases those batch sessions held.
    pub batch_leases: u64,
    /// Sessions ended by a release the holder sent.
    pub releases: u64,
    /// Sessions abandoned (a crash: the lease must expire).
    pub abandoned: u64,
    /// Sessions that ended because the holder noticed the lease lost.
    pub lost: u64,
    /// Acquisitions refused with `Held`.
    pub held: u64,
    /// Grants that arrived after their deadline and were handed back.
    pub late_grants: u64,
    /// Clean hand-offs read.
    pub clean_reads: u64,
}

/// The recorder shared by every task of a run. Lock order: never hold two
/// of its locks at once.
pub(crate) struct World {
    pub t0: Instant,
    seq: AtomicU64,
    ops: Mutex<Vec<OpRecord>>,
    beliefs: Mutex<Vec<Belief>>,
    faults: Mutex<BTreeMap<FaultKind, u64>>,
    app: Mutex<AppCounts>,
    notes: Mutex<Vec<String>>,
    frozen: Mutex<Vec<Option<Instant>>>,
    inflight: watch::Sender<usize>,
    /// Outage intervals of the store.
    pub outages: Vec<(Instant, Instant)>,
    /// Each holder's clock drift.
    pub drift: Vec<f64>,
    /// TTL − safety margin: a deadline's distance from its send.
    pub window: Duration,
    /// Apply store calls with the world stopped (stores whose calls run on
    /// blocking threads: see `link::stop_the_world`).
    pub stop_the_world: bool,
}

/// Everything a finished run recorded.
#[derive(Debug, Default)]
pub struct Finished {
    /// Every store call.
    pub ops: Vec<OpRecord>,
    /// Every belief interval.
    pub beliefs: Vec<Belief>,
    /// Faults injected, per kind.
    pub faults: BTreeMap<FaultKind, u64>,
    /// What the holders saw.
    pub app: AppCounts,
    /// Unexpected events (errors no store should return, task failures).
    pub notes: Vec<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Test support: a poisoned lock means a panic already failed the run.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl World {
    pub fn new(
        holders: usize,
        drift: Vec<f64>,
        outages: Vec<(Instant, Instant)>,
        window: Duration,
        stop_the_world: bool,
    ) -> Self {
        Self {
            t0: Instant::now(),
            seq: AtomicU64::new(0),
            ops: Mutex::new(Vec::new()),
            beliefs: Mutex::new(Vec::new()),
            faults: Mutex::new(BTreeMap::new()),
            app: Mutex::new(AppCounts::default()),
            notes: Mutex::new(Vec::new()),
            frozen: Mutex::new(vec![None; holders]),
            inflight: watch::channel(0).0,
            outages,
            drift,
            window,
            stop_the_world,
        }
    }

    /// Now, as a stamp.
    pub fn stamp(&self) -> Stamp {
        Stamp {
            seq: self.seq.fetch_add(1, Ordering::SeqCst),
            at: Instant::now() - self.t0,
        }
    }

    pub fn since_start(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.t0)
    }

    pub fn fault(&self, kind: FaultKind) {
        *lock(&self.faults).entry(kind).or_default() += 1;
    }

    pub fn app(&self, f: impl FnOnce(&mut AppCounts)) {
        f(&mut lock(&self.app));
    }

    pub fn note(&self, what: String) {
        lock(&self.notes).push(what);
    }

    pub fn invoke(
        &self,
        holder: usize,
        kind: OpKind,
        work_id: &str,
        token: Option<u64>,
        data: Option<Bytes>,
    ) -> usize {
        let invoked = self.stamp();
        let mut ops = lock(&self.ops);
        let id = ops.len();
        ops.push(OpRecord {
            id,
            holder,
            kind,
            work_id: work_id.to_string(),
            token,
            data,
            invoked,
            applied: None,
            delivery: Delivery::Pending,
            completed: None,
            faults: Vec::new(),
        });
        id
    }

    pub fn op(&self, id: usize, f: impl FnOnce(&mut OpRecord)) {
        if let Some(op) = lock(&self.ops).get_mut(id) {
            f(op);
        }
    }

    pub fn op_fault(&self, id: usize, kind: FaultKind) {
        self.fault(kind);
        self.op(id, |op| op.faults.push(kind));
    }

    /// Whether the store is in an outage now.
    pub fn unreachable_now(&self) -> bool {
        let now = Instant::now();
        self.outages.iter().any(|(a, b)| *a <= now && now < *b)
    }

    /// Freezes `holder` until `until`: its link sends and delivers nothing
    /// before then.
    pub fn freeze(&self, holder: usize, until: Instant) {
        if let Some(f) = lock(&self.frozen).get_mut(holder) {
            *f = Some(until);
        }
    }

    /// Waits while `holder` is frozen.
    pub async fn thawed(&self, holder: usize) {
        let until = lock(&self.frozen).get(holder).copied().flatten();
        if let Some(t) = until {
            if t > Instant::now() {
                tokio::time::sleep_until(t).await;
            }
        }
    }

    /// Counts a request in flight in the network until the guard drops.
    pub fn in_flight(self: &Arc<Self>) -> InFlight {
        self.inflight.send_modify(|n| *n += 1);
        InFlight(self.clone())
    }

    /// Waits until no request is in flight.
    pub async fn quiesce(&self) {
        let mut rx = self.inflight.subscribe();
        // The sender lives in `self`: `wait_for` cannot fail.
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// `holder` learned `token` now: it believes it holds the lease until
    /// its own clock reaches the token's deadline.
    pub fn believe(&self, holder: usize, token: &Token) {
        let Some(deadline) = token.deadline() else {
            return;
        };
        let now = Instant::now();
        let sent = deadline - self.window;
        let rho = self.drift.get(holder).copied().unwrap_or(0.0);
        // A clock running at (1 + rho) x real time reads `window` later
        // after window / (1 + rho) of real time.
        let until = sent + self.window.div_f64(1.0 + rho);
        if until <= now {
            return;
        }
        lock(&self.beliefs).push(Belief {
            holder,
            work_id: token.work_id().to_string(),
            token: token.fencing_token(),
            from: self.since_start(now),
            until: self.since_start(until),
        });
    }

    /// `holder` stops believing in `token` now (it sends a release, or it
    /// noticed the lease lost).
    pub fn disbelieve(&self, holder: usize, work_id: &str, token: u64) {
        let now = self.since_start(Instant::now());
        for b in lock(&self.beliefs).iter_mut() {
            if b.holder == holder && b.token == token && b.work_id == work_id && b.until > now {
                b.until = now.max(b.from);
            }
        }
    }

    pub fn finish(&self) -> Finished {
        Finished {
            ops: std::mem::take(&mut *lock(&self.ops)),
            beliefs: std::mem::take(&mut *lock(&self.beliefs)),
            faults: std::mem::take(&mut *lock(&self.faults)),
            app: std::mem::take(&mut *lock(&self.app)),
            notes: std::mem::take(&mut *lock(&self.notes)),
        }
    }
}

/// A request in flight (see [`World::in_flight`]).
pub(crate) struct InFlight(Arc<World>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.send_modify(|n| *n = n.saturating_sub(1));
    }
}
