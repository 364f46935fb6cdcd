//! `worklease run`: acquire the lease, run the child under it, supervise.
//!
//! 1. Check the arguments (TTL, `--grace`, a non-empty program name) before
//!    touching the store, then acquire the lease (exit 75 when it is held
//!    and `--wait` was not given; with `--wait`, a signal ends the wait with
//!    128 + N).
//! 2. Start background renewal and spawn the child in its own process
//!    group with the `WORKLEASE_*` environment (stdin `/dev/null` when ours
//!    is a terminal).
//! 3. Forward SIGINT, SIGTERM, SIGHUP, SIGQUIT (each followed by SIGCONT),
//!    SIGUSR1 and SIGUSR2 to the child's process group. Job control:
//!    SIGTSTP, SIGTTIN and SIGTTOU stop the child's group, then this
//!    process; SIGCONT continues the group if the lease is still live, else
//!    SIGKILLs it (exit 76).
//! 4. The child must be gone by the holder's deadline: while renewal fails,
//!    the group gets SIGTERM once less than `--grace` is left before the
//!    deadline, and SIGKILL at the deadline. If the lease is taken away
//!    (fenced, expired, revoked): SIGTERM at once, SIGKILL after `--grace`;
//!    exit 76.
//! 5. When the child exits: what is left of its process group gets SIGTERM,
//!    then SIGKILL after `--grace`; then stop renewing, release the lease
//!    (a clean hand-off) and exit with the child's status. A group that
//!    ended inside the lease (before the holder's deadline, before any
//!    loss) is a good run: when renewal or the release fails after that
//!    (the store briefly down), a warning says so, the lease expires by its
//!    TTL (the next holder sees no clean hand-off), and the status is still
//!    the child's.
//!
//! Two limits no supervisor can lift; downstream writes must check the
//! fencing token (`WORKLEASE_FENCING_TOKEN`), which is what it is for:
//! - While this process alone is frozen (SIGSTOP of this process, a paused
//!   VM), its child runs on past the lease deadline: a frozen process
//!   cannot act. Job control (Ctrl-Z, SIGTSTP) stops the children too and
//!   is safe.
//! - When this process gets SIGKILL, its direct child dies with it
//!   (`PR_SET_PDEATHSIG`, Linux), but processes the child started in the
//!   background (in its process group, or with `setsid`) survive.
//!
//! The same supervision ([`supervise_with`]) runs each child of `worklease
//! pool`, which adds a stop request (a hand-off or the pool's shutdown):
//! every child leads its own process group, and the job-control handler
//! stops all of them.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::Stdio;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use worklease::election::Leadership;
use worklease::store::memory::MemoryStore;
use worklease::store::ExpiryClock;
use worklease::{
    AcquireOptions, Config, Error, LeaseStore, Leases, Renewal, RenewalOptions, Token,
};

use crate::exit::{self, Failure};
use crate::progress::Progress;
use crate::RunArgs;

/// The signals forwarded to the child's process group.
const FORWARDED: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// The job-control signals that stop the child's group, then this process.
const JOB_STOP: [Signal; 3] = [Signal::SIGTSTP, Signal::SIGTTIN, Signal::SIGTTOU];

/// The longest default `--grace`.
const MAX_DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// How often the process group of a child that exited is checked for
/// members (nothing signals that a process group became empty).
const GROUP_POLL: Duration = Duration::from_millis(20);

/// How long to wait for a SIGKILLed process group to disappear before
/// giving up on it (a process in uninterruptible sleep dies late).
const AFTER_SIGKILL: Duration = Duration::from_secs(2);

/// Runs `worklease run` and returns its exit status.
pub async fn run(args: RunArgs) -> Result<u8, Failure> {
    let holder = args
        .holder
        .as_ref()
        .map_or_else(default_holder, |h| h.to_string());
    // Nothing is opened, let alone written, for arguments that cannot work.
    let grace = check_lease_args(&holder, args.ttl, args.grace)?;
    check_command(&args.command)?;
    let (child_url, store) = args.store.open()?;
    args.metrics.serve()?;
    warn_if_memory(&store);
    let leases = Leases::new(store.clone(), Config::new(holder, args.ttl))?;
    // Catch signals from now on: a signal while waiting ends the wait, one
    // before the child starts is forwarded to it as soon as it does.
    let mut signals = Signals::install()?;

    let token = match acquire(&leases, &store, &args, &mut signals).await? {
        Acquired::Token(token) => token,
        Acquired::Interrupted(sig) => {
            eprintln!(
                "worklease: {sig} while waiting for the lease on {:?}: gave up",
                args.work_id.as_str()
            );
            return Ok(128 + sig as u8);
        }
    };
    tracing::debug!(
        work_id = %token.work_id(),
        holder_id = %token.holder_id(),
        fencing_token = token.fencing_token(),
        "lease acquired"
    );

    let renewal = match leases.start_renewal(token.clone(), RenewalOptions::new()) {
        Ok(renewal) => renewal,
        Err(e) => {
            release_after_failure(&leases, token).await;
            return Err(e.into());
        }
    };

    let child = match spawn(&args.command, &token, &child_url) {
        Ok(child) => child,
        Err(e) => {
            if let Ok(token) = renewal.stop().await {
                release_after_failure(&leases, token).await;
            }
            return Err(cannot_run(&args.command, e));
        }
    };
    let describe = || {
        renewal.lost_cause().map_or_else(
            || format!("lost the lease on {:?}", token.work_id().as_str()),
            |e| e.to_string(),
        )
    };
    let (code, lost_seen) = supervise(child, &renewal, describe, grace, &mut signals).await?;
    if lost_seen {
        say_lost(&args.work_id, "lease", code);
        return Ok(exit::LOST);
    }
    // The child and what it left in its process group ended inside the
    // lease (before the holder's deadline, before any loss): the run is
    // good, whatever becomes of the lease now. A renewal or the release
    // failing from here on (the store briefly down) only leaves the lease
    // to expire by its TTL.
    let released = match renewal.stop().await {
        Ok(token) => leases.release(token).await,
        Err(cause) => Err(cause),
    };
    if let Err(e) = released {
        tracing::warn!(
            error = %e,
            "the child ended inside its lease (the exit status is its own), but the lease could not be \
             released: it ends when its TTL runs out, and the next holder sees it expired, not handed off cleanly"
        );
    }
    Ok(code)
}

/// Refuses an empty program name (`-- ""`) before the store is touched:
/// exit 64, as for no command at all.
///
/// # Errors
/// A usage failure when `command` is empty or its first word is.
pub fn check_command(command: &[OsString]) -> Result<(), Failure> {
    match command.first() {
        Some(program) if !program.is_empty() => Ok(()),
        _ => Err(Failure::usage(
            "no command: the program name after `--` is empty; give the command to run after `--`",
        )),
    }
}

/// Warns that a `memory:` store excludes no other process, and that a
/// child's `worklease checkpoint` cannot reach it.
pub fn warn_if_memory(store: &Arc<dyn LeaseStore>) {
    if store.kind() == "memory" {
        tracing::warn!(
            "the memory: store lives in this process only: the lease excludes no other process, \
             and the child's `worklease checkpoint` cannot reach it"
        );
    }
}

/// The last line of a `run` or `elect` that lost its lease while the child
/// ran: it exits 76, whatever the child's own status `code` was.
pub fn say_lost(work_id: &worklease::WorkId, what: &str, code: u8) {
    eprintln!(
        "worklease: exit 76: the {what} on {:?} was lost while the child ran (the child's own status: {code})",
        work_id.as_str()
    );
}

/// Checks the lease arguments of `run` and `elect` before the store is
/// opened: the TTL must allow background renewal (the rule of
/// [`RenewalOptions::check`]), and `--grace` may not exceed TTL/2. Returns
/// the grace in force: the one given, else TTL/4, at most 10s.
pub fn check_lease_args(
    holder: &str,
    ttl: Duration,
    grace: Option<Duration>,
) -> Result<Duration, Failure> {
    let probe = Leases::new(Arc::new(MemoryStore::new()), Config::new(holder, ttl))?;
    RenewalOptions::new().check(&probe)?;
    let half = ttl / 2;
    match grace {
        None => Ok((ttl / 4).min(MAX_DEFAULT_GRACE)),
        Some(grace) if grace > half => Err(Failure::usage(format!(
            "--grace {} is longer than half the TTL ({}): the child must be gone by the lease \
             deadline, and is sent SIGTERM --grace before it, so --grace may be at most TTL/2 \
             (default TTL/4, at most 10s); give a shorter --grace or a longer --ttl",
            humantime::format_duration(grace),
            humantime::format_duration(half),
        ))),
        Some(grace) => Ok(grace),
    }
}

enum Acquired {
    Token(Token),
    Interrupted(Signal),
}

/// The failure for a command that cannot be started.
pub fn cannot_run(command: &[OsString], e: std::io::Error) -> Failure {
    let code = match e.kind() {
        std::io::ErrorKind::NotFound => exit::COMMAND_NOT_FOUND,
        _ => exit::CANNOT_EXECUTE,
    };
    Failure::new(code, format!("cannot run {:?}: {e}", command[0]))
}

/// What supervision needs of the lease a child runs under: a `run`'s
/// [`Renewal`] or an `elect`'s [`Leadership`].
pub trait HeldLease {
    /// The latest token (each renewal moves its deadline).
    fn latest(&self) -> Token;
    /// Why the lease was lost, once it was.
    fn cause(&self) -> Option<Error>;
    /// Fires when the lease is lost. For a child supervised with a
    /// [`Stop`], it also fires to ask the child to stop while the lease is
    /// still held: a firing while [`HeldLease::cause`] is `None` is that
    /// request.
    fn lost(&self) -> CancellationToken;
    /// Neither lost nor past its deadline by this process's clock.
    fn live(&self) -> bool {
        self.cause().is_none() && self.latest().remaining() != Some(Duration::ZERO)
    }
}

impl HeldLease for Renewal {
    fn latest(&self) -> Token {
        self.token()
    }
    fn cause(&self) -> Option<Error> {
        self.lost_cause()
    }
    fn lost(&self) -> CancellationToken {
        self.lost_signal()
    }
    fn live(&self) -> bool {
        self.ensure_live().is_ok()
    }
}

impl HeldLease for Leadership {
    fn latest(&self) -> Token {
        self.token()
    }
    fn cause(&self) -> Option<Error> {
        self.lost_cause()
    }
    fn lost(&self) -> CancellationToken {
        Leadership::lost(self)
    }
}

/// How many children may be supervised at once (a `pool` runs one per
/// work ID it holds, and takes at most this many work IDs).
pub const MAX_CHILDREN: usize = 1024;

/// The process groups of the supervised children (0: a free entry), for the
/// job-control handler, which stops them before stopping this process. It
/// reads them inside a signal handler: atomics, no lock.
static CHILD_GROUPS: [AtomicI32; MAX_CHILDREN] = [const { AtomicI32::new(0) }; MAX_CHILDREN];

/// A child's entry in [`CHILD_GROUPS`], freed when dropped (when its
/// supervision ends, however it ends).
struct GroupEntry(Option<usize>);

impl GroupEntry {
    fn register(group: i32) -> Self {
        let entry = CHILD_GROUPS.iter().position(|g| {
            g.compare_exchange(0, group, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        });
        if entry.is_none() {
            tracing::warn!(
                "more than {MAX_CHILDREN} children at once: Ctrl-Z does not stop this one's process group"
            );
        }
        Self(entry)
    }
}

impl Drop for GroupEntry {
    fn drop(&mut self) {
        if let Some(g) = self.0.and_then(|i| CHILD_GROUPS.get(i)) {
            g.store(0, Ordering::SeqCst);
        }
    }
}

/// A child started by [`spawn`] or [`spawn_in_group`], leading its own
/// process group, which the job-control handler knows of until the child's
/// supervision ends.
pub struct Child {
    process: tokio::process::Child,
    _entry: Option<GroupEntry>,
}

/// How a supervised child is asked to stop while its lease is still held
/// (a `pool` slot handed off for balance, or the pool shutting down): the
/// request is a firing of [`HeldLease::lost`] while the lease has no loss
/// cause. The child's process group gets the first signal, then SIGCONT,
/// and SIGKILL after --grace (at the lease deadline at the latest, as
/// always). A child stopped so was not lost: supervision does not report a
/// loss for it.
pub struct Stop<'a> {
    /// The first signal (for example SIGTERM), read when the request comes.
    pub signal: &'a (dyn Fn() -> Signal + Send + Sync),
}

/// Supervises a running child until it and what it left running in its
/// process group have ended: forwards signals to the group, handles job
/// control, stops the group in time when renewal fails or the lease is
/// lost (see the module docs). Returns the exit status to report (the
/// child's) and whether the lease was lost meanwhile.
pub async fn supervise(
    child: Child,
    lease: &impl HeldLease,
    describe_loss: impl Fn() -> String,
    grace: Duration,
    signals: &mut Signals,
) -> Result<(u8, bool), Failure> {
    supervise_with(child, lease, describe_loss, grace, signals, None).await
}

/// [`supervise`], and with `stop`, a firing of [`HeldLease::lost`] while
/// the lease has no loss cause asks the child to stop (see [`Stop`]): a
/// `pool` slot's supervision.
pub async fn supervise_with(
    child: Child,
    lease: &impl HeldLease,
    describe_loss: impl Fn() -> String,
    grace: Duration,
    signals: &mut Signals,
    stop: Option<&Stop<'_>>,
) -> Result<(u8, bool), Failure> {
    let Child {
        process: mut child,
        _entry,
    } = child;
    // The child leads its own process group: its ID is the group's.
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let lost = lease.lost();
    let mut lost_seen = false;
    // The child was asked to stop (see `Stop`).
    let mut stopping = false;
    // The deadline for which the group got SIGTERM because renewal failed.
    let mut term_for: Option<Instant> = None;
    // When the group gets SIGKILL (after a loss, or for leftovers).
    let mut kill_at: Option<Instant> = None;
    // When the group got SIGKILL.
    let mut killed_at: Option<Instant> = None;
    let mut status: Option<std::process::ExitStatus> = None;
    loop {
        let deadline = lease.latest().deadline();
        if let (Some(termed), Some(deadline)) = (term_for, deadline) {
            if deadline > termed {
                term_for = None;
                if killed_at.is_none() && !lost_seen {
                    tracing::warn!(
                        "the lease was renewed after all; the child's process group already got SIGTERM"
                    );
                }
            }
        }
        // While renewal fails: SIGTERM once less than `grace` is left before
        // the deadline, SIGKILL at the deadline.
        let guard_at = match (deadline, killed_at) {
            (Some(d), None) if term_for == Some(d) => Some(d),
            (Some(d), None) => Some(d.checked_sub(grace).unwrap_or_else(Instant::now)),
            _ => None,
        };
        let polling = status.is_some();
        tokio::select! {
            result = child.wait(), if status.is_none() => {
                let exited = match result {
                    Ok(exited) => exited,
                    Err(e) => {
                        // Cannot happen with a child we spawned; stop everything.
                        signal_group(group, Signal::SIGKILL);
                        return Err(Failure::new(
                            exit::SOFTWARE,
                            format!("cannot wait for the child: {e}"),
                        ));
                    }
                };
                tracing::debug!(code = exit::of_status(exited), "the child exited");
                status = Some(exited);
                if !group_alive(group) {
                    break;
                }
                if killed_at.is_some() {
                    signal_group(group, Signal::SIGKILL);
                } else {
                    let now = Instant::now();
                    let at = kill_at.map_or(now + grace, |k| k.min(now + grace));
                    kill_at = Some(at);
                    tracing::warn!(
                        "the child exited, but processes it started still run in its process group: \
                         SIGTERM now, SIGKILL in {}{}",
                        fmt_secs(at.saturating_duration_since(now)),
                        if lost_seen { "" } else { "; the lease is released after them" }
                    );
                    terminate(group);
                }
            }
            _ = tokio::time::sleep(GROUP_POLL), if polling => {
                if !group_alive(group) {
                    break;
                }
                if killed_at.is_some_and(|at| at.elapsed() >= AFTER_SIGKILL) {
                    tracing::warn!(
                        "processes of the child's process group are still there {} after SIGKILL; giving up on them",
                        fmt_secs(AFTER_SIGKILL)
                    );
                    break;
                }
            }
            Some(sig) = signals.recv() => {
                if sig == Signal::SIGCONT {
                    if lease.live() {
                        tracing::debug!("continued: continuing the child's process group");
                        signal_group(group, Signal::SIGCONT);
                    } else {
                        if !lost_seen {
                            eprintln!(
                                "worklease: continued after the lease's deadline passed ({}): SIGKILL to the child's process group",
                                describe_loss()
                            );
                            lost_seen = true;
                        }
                        if killed_at.is_none() {
                            signal_group(group, Signal::SIGKILL);
                            killed_at = Some(Instant::now());
                        }
                    }
                } else {
                    tracing::debug!(signal = %sig, "forwarding a signal to the child's process group");
                    signal_group(group, sig);
                    if terminating(sig) {
                        // A stopped child acts on it only once continued.
                        signal_group(group, Signal::SIGCONT);
                    }
                }
            }
            _ = lost.cancelled(), if !lost_seen && !stopping => {
                if let (Some(stop), None) = (stop, lease.cause()) {
                    stopping = true;
                    let at = Instant::now() + grace;
                    kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
                    if status.is_none() && killed_at.is_none() {
                        let sig = (stop.signal)();
                        tracing::info!(
                            "stopping the child: {sig} to its process group now, SIGKILL in {}",
                            fmt_secs(grace)
                        );
                        signal_group(group, sig);
                        signal_group(group, Signal::SIGCONT);
                    }
                    continue;
                }
                lost_seen = true;
                if killed_at.is_some() {
                    eprintln!(
                        "worklease: {}; the child's process group got SIGKILL at the lease deadline",
                        describe_loss(),
                    );
                } else if lease.latest().remaining() == Some(Duration::ZERO) {
                    eprintln!(
                        "worklease: {}; the lease deadline has passed: SIGKILL to the child's process group",
                        describe_loss(),
                    );
                    signal_group(group, Signal::SIGKILL);
                    killed_at = Some(Instant::now());
                } else {
                    eprintln!(
                        "worklease: {}; stopping the child: SIGTERM now, SIGKILL in {}",
                        describe_loss(),
                        fmt_secs(grace),
                    );
                    terminate(group);
                    let at = Instant::now() + grace;
                    kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
                }
            }
            _ = sleep_until(guard_at), if guard_at.is_some() => {
                let Some(deadline) = lease.latest().deadline() else {
                    continue;
                };
                let now = Instant::now();
                if now >= deadline {
                    tracing::warn!(
                        "the lease deadline passed without a successful renewal: SIGKILL to the child's process group"
                    );
                    signal_group(group, Signal::SIGKILL);
                    killed_at = Some(now);
                } else if term_for != Some(deadline)
                    && deadline.saturating_duration_since(now) <= grace
                {
                    tracing::warn!(
                        "lease renewal is failing and {} are left before the lease deadline: \
                         SIGTERM to the child's process group now, SIGKILL at the deadline \
                         unless a renewal succeeds first",
                        fmt_secs(deadline.saturating_duration_since(now)),
                    );
                    terminate(group);
                    term_for = Some(deadline);
                }
                // Else renewed meanwhile: the next round re-arms.
            }
            _ = sleep_until(kill_at), if kill_at.is_some() && killed_at.is_none() => {
                tracing::warn!("the child's process group did not end within --grace: SIGKILL");
                signal_group(group, Signal::SIGKILL);
                killed_at = Some(Instant::now());
            }
        }
    }
    if !lost_seen && !lease.live() {
        // The deadline passed (the group got SIGKILL at it) before the
        // renewal task reported the loss.
        eprintln!(
            "worklease: {}; the lease deadline passed without a successful renewal",
            describe_loss()
        );
        lost_seen = true;
    }
    if !lost_seen && term_for.is_some() {
        // The child was stopped because renewal kept failing and its lease
        // was about to run out: the lease is as good as lost (and the store
        // likely unreachable, so no release is attempted: it expires).
        eprintln!(
            "worklease: the child was stopped because renewal kept failing and the lease was about to expire"
        );
        lost_seen = true;
    }
    let code = status.map_or(exit::SOFTWARE, exit::of_status);
    Ok((code, lost_seen))
}

/// Whether `sig` ends a process by default (and ends a wait for the lease,
/// or a `pool`).
pub fn terminating(sig: Signal) -> bool {
    matches!(
        sig,
        Signal::SIGINT | Signal::SIGTERM | Signal::SIGHUP | Signal::SIGQUIT
    )
}

/// SIGTERM, then SIGCONT (so that a stopped process acts on it), to the
/// child's process group.
fn terminate(group: Option<Pid>) {
    signal_group(group, Signal::SIGTERM);
    signal_group(group, Signal::SIGCONT);
}

/// Whether the process group still has a member that runs: `killpg(group,
/// 0)` succeeds, and (on Linux) a member is not a zombie waiting for its
/// new parent to reap it.
fn group_alive(group: Option<Pid>) -> bool {
    let Some(group) = group else {
        return false;
    };
    match killpg(group, None) {
        Err(nix::errno::Errno::ESRCH) => false,
        _ => !only_zombies(group),
    }
}

/// True when every process of `group` is a zombie; false when one is not,
/// or when `/proc` cannot tell.
#[cfg(target_os = "linux")]
fn only_zombies(group: Pid) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    let mut members = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...; comm may hold spaces and ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("");
        let pgrp = fields.nth(1).and_then(|p| p.parse::<i32>().ok());
        if pgrp == Some(group.as_raw()) {
            members += 1;
            if !matches!(state, "Z" | "X") {
                return false;
            }
        }
    }
    members > 0
}

#[cfg(not(target_os = "linux"))]
fn only_zombies(_group: Pid) -> bool {
    false
}

/// Acquires the lease: at once, or with `--wait` until it is free or a
/// signal arrives.
async fn acquire(
    leases: &Leases,
    store: &Arc<dyn LeaseStore>,
    args: &RunArgs,
    signals: &mut Signals,
) -> Result<Acquired, Failure> {
    let work_id = args.work_id.as_str();
    let (holder_id, expires_in) = match leases.acquire(work_id, AcquireOptions::new()).await {
        Ok(token) => return Ok(Acquired::Token(token)),
        Err(Error::Held {
            holder_id,
            expires_in,
            ..
        }) => (holder_id, expires_in),
        Err(e) => return Err(e.into()),
    };
    let by_observation = store.expiry_clock() == ExpiryClock::Observation;
    if !args.wait {
        let message = if by_observation {
            format!(
                "{work_id:?} is held by {holder_id:?}; not waiting: pass --wait to wait for it. {}",
                observation_note(store.kind())
            )
        } else {
            let expiry = match expires_in {
                Some(d) => format!("its lease expires in {} unless renewed", fmt_secs(d)),
                None => "its lease expiry is unknown".to_string(),
            };
            format!("{work_id:?} is held by {holder_id:?} ({expiry}); not waiting: pass --wait to wait for it")
        };
        return Err(Failure::new(exit::HELD, message));
    }
    let expiry = match expires_in {
        _ if by_observation => format!(
            "the {} store judges expiry by observation: taken over once seen unchanged for the holder's TTL",
            store.kind()
        ),
        Some(d) => format!("its lease expires in {} unless renewed", fmt_secs(d)),
        None => "its lease expiry is unknown".to_string(),
    };
    tracing::info!(
        "{work_id:?} is held by {holder_id:?} ({expiry}); waiting for it (polling every {})",
        fmt_secs(args.poll)
    );
    // On a terminal: who holds the lease, refreshed; erased when the wait ends.
    let _progress = Progress::start(store.clone(), &args.work_id);
    let options = AcquireOptions::new()
        .wait_for_lease()
        .poll_interval(args.poll);
    loop {
        tokio::select! {
            result = leases.acquire(work_id, options.clone()) => match result {
                Ok(token) => return Ok(Acquired::Token(token)),
                // A store failure while waiting (busy, unreachable): keep waiting.
                Err(e) if e.is_transient() => {
                    tracing::warn!(error = %e, "store failed while waiting for the lease; retrying");
                }
                Err(e) => return Err(e.into()),
            },
            Some(sig) = signals.recv() => {
                if terminating(sig) {
                    return Ok(Acquired::Interrupted(sig));
                }
                continue; // no child yet to forward it to
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(args.poll) => {}
            Some(sig) = signals.recv() => {
                if terminating(sig) {
                    return Ok(Acquired::Interrupted(sig));
                }
            }
        }
    }
}

/// What `run` without `--wait` says about a lease held in a store of kind
/// `kind` that judges expiry by observation (S3): one look cannot tell
/// whether the holder still renews, so there is no time left to give.
fn observation_note(kind: &str) -> String {
    format!(
        "The {kind} store judges expiry by observation: one look cannot tell whether the holder \
         is still renewing, so no time left is known. With --wait, worklease takes the lease over \
         once it has seen it unchanged for the holder's full TTL: one TTL after its last renewal, or \
         after the wait starts if that is later (plus up to --poll)"
    )
}

/// Starts the child in its own process group with the `WORKLEASE_*`
/// environment; on Linux it is killed if this process dies. When stdin is a
/// terminal, the child gets `/dev/null` instead: in a background process
/// group, reading the terminal would stop it (SIGTTIN) while it holds the
/// lease.
pub fn spawn(command: &[OsString], token: &Token, store_url: &str) -> std::io::Result<Child> {
    let terminal = std::io::stdin().is_terminal();
    if terminal {
        tracing::info!(
            "stdin is a terminal: the child gets /dev/null as its stdin (in its own process group, \
             reading the terminal would stop it while it holds the lease); pipe or redirect input \
             to give it some"
        );
    }
    spawn_in_group(command, token, store_url, terminal)
}

/// Starts `command` in its own process group with the `WORKLEASE_*`
/// environment of `token` and `store_url`, registered for job control; on
/// Linux it is killed if this process dies. With `null_stdin` its stdin is
/// `/dev/null`, else this process's.
///
/// # Errors
/// The spawn's: `NotFound` when the program does not exist,
/// `InvalidInput` for an empty `command`.
pub fn spawn_in_group(
    command: &[OsString],
    token: &Token,
    store_url: &str,
    null_stdin: bool,
) -> std::io::Result<Child> {
    let (program, rest) = command
        .split_first()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no command given"))?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(rest)
        .env("WORKLEASE_WORK_ID", token.work_id().as_str())
        .env("WORKLEASE_HOLDER_ID", token.holder_id().as_str())
        .env("WORKLEASE_FENCING_TOKEN", token.fencing_token().to_string())
        .env("WORKLEASE_TOKEN", token.to_string())
        .env("WORKLEASE_STORE", store_url)
        .process_group(0);
    if null_stdin {
        cmd.stdin(Stdio::null());
    }
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and only
    // makes async-signal-safe system calls (sigprocmask, prctl, getppid,
    // kill).
    unsafe {
        cmd.pre_exec(move || {
            job_control_mask(nix::sys::signal::SigmaskHow::SIG_UNBLOCK)?;
            die_with_parent(parent)
        });
    }
    tracing::debug!(command = ?command, "starting the child");
    // A job-control signal between the fork and the moment the child's
    // process group is recorded would stop this process but not the child:
    // hold such signals back meanwhile (only this thread takes them).
    job_control_mask(nix::sys::signal::SigmaskHow::SIG_BLOCK)?;
    let spawned = cmd.spawn().map(|process| {
        let entry = process
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(GroupEntry::register);
        Child {
            process,
            _entry: entry,
        }
    });
    // Cannot fail with a valid set; a child must never be dropped here.
    let _ = job_control_mask(nix::sys::signal::SigmaskHow::SIG_UNBLOCK);
    spawned
}

/// Blocks or unblocks SIGTSTP, SIGTTIN and SIGTTOU in the calling thread.
/// The runtime's other threads block them for good (`on_thread_start` in
/// `main`), so that the job-control handler runs on the main thread, and
/// not while it spawns a child.
pub fn job_control_mask(how: nix::sys::signal::SigmaskHow) -> std::io::Result<()> {
    let mut set = nix::sys::signal::SigSet::empty();
    for sig in JOB_STOP {
        set.add(sig);
    }
    nix::sys::signal::pthread_sigmask(how, Some(&set), None)?;
    Ok(())
}

/// In the forked child: ask for SIGKILL when the parent dies, and die at
/// once if it already has (the request covers only a living parent).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn die_with_parent(parent: Pid) -> std::io::Result<()> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    if nix::unistd::getppid() != parent {
        nix::sys::signal::raise(Signal::SIGKILL)?;
    }
    Ok(())
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn die_with_parent(_parent: Pid) -> std::io::Result<()> {
    Ok(())
}

/// Sends `sig` to the child's process group; a group that is already gone
/// is not an error.
fn signal_group(group: Option<Pid>, sig: Signal) {
    if let Some(group) = group {
        if let Err(e) = killpg(group, sig) {
            if e != nix::errno::Errno::ESRCH {
                tracing::warn!(signal = %sig, error = %e, "cannot signal the child's process group");
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Releases a lease we could not use (the child never started); a failure
/// only leaves the lease to expire.
async fn release_after_failure(leases: &Leases, token: Token) {
    if let Err(e) = leases.release(token).await {
        tracing::warn!(error = %e, "cannot release the lease: it ends when its TTL runs out");
    }
}

/// `<hostname>:<pid>`.
pub fn default_holder() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    format!("{host}:{}", std::process::id())
}

/// A duration for people, as every message of the CLI writes it: `750ms`
/// under 0.1s, `4.2s` under a minute, else whole seconds in units (`2m 5s`,
/// `1h 3m`).
pub fn fmt_secs(d: Duration) -> String {
    if d < Duration::from_millis(100) {
        return match d.as_millis() {
            0 => format!("{}µs", d.as_micros()),
            ms => format!("{ms}ms"),
        };
    }
    let tenths = (d.as_millis() + 50) / 100;
    if tenths < 600 {
        format!("{}.{}s", tenths / 10, tenths % 10)
    } else {
        let secs = u64::try_from((d.as_millis() + 500) / 1000).unwrap_or(u64::MAX);
        humantime::format_duration(Duration::from_secs(secs)).to_string()
    }
}

/// The job-control handler (SIGTSTP, SIGTTIN, SIGTTOU): stops the
/// children's process groups, then this process, as the default action
/// would have stopped this process alone. It runs synchronously, inside whatever
/// system call raised it (a write to the terminal raises SIGTTOU), and
/// makes only async-signal-safe calls (kill).
extern "C" fn on_job_stop(_signal: nix::libc::c_int) {
    let saved = nix::errno::Errno::last_raw();
    // SAFETY: kill(2) is async-signal-safe; the arguments are plain values.
    unsafe {
        for group in &CHILD_GROUPS {
            let group = group.load(Ordering::SeqCst);
            if group > 0 {
                nix::libc::kill(-group, nix::libc::SIGSTOP);
            }
        }
        nix::libc::kill(nix::libc::getpid(), nix::libc::SIGSTOP);
    }
    nix::errno::Errno::set_raw(saved);
}

/// Installs [`on_job_stop`] for SIGTSTP, SIGTTIN and SIGTTOU, except where
/// the signal is ignored (as a shell without job control leaves it).
fn install_job_control() -> Result<(), Failure> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet};
    let action = SigAction::new(
        SigHandler::Handler(on_job_stop),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in JOB_STOP {
        // SAFETY: the handler only makes async-signal-safe calls.
        let old = unsafe { sigaction(sig, &action) }.map_err(|e| {
            Failure::new(
                exit::SOFTWARE,
                format!("cannot install a handler for {sig}: {e}"),
            )
        })?;
        if old.handler() == SigHandler::SigIgn {
            // SAFETY: restoring the disposition this process started with.
            let _ = unsafe { sigaction(sig, &old) };
        }
    }
    Ok(())
}

/// The forwarded signals and SIGCONT, delivered through a channel.
pub struct Signals {
    rx: mpsc::UnboundedReceiver<Signal>,
}

impl Signals {
    /// Installs handlers for [`FORWARDED`] and SIGCONT: from now on these
    /// signals no longer end this process, they are delivered by
    /// [`Signals::recv`]. Also installs the job-control handler.
    pub fn install() -> Result<Self, Failure> {
        use tokio::signal::unix::{signal, SignalKind};
        let (tx, rx) = mpsc::unbounded_channel();
        for sig in FORWARDED.into_iter().chain([Signal::SIGCONT]) {
            let mut stream = signal(SignalKind::from_raw(sig as i32)).map_err(|e| {
                Failure::new(
                    exit::SOFTWARE,
                    format!("cannot install a handler for {sig}: {e}"),
                )
            })?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    if tx.send(sig).is_err() {
                        break;
                    }
                }
            });
        }
        install_job_control()?;
        Ok(Self { rx })
    }

    /// A channel of signals for one of several supervised children (a
    /// `pool` slot): the sender hands it what this process received.
    pub fn channel() -> (mpsc::UnboundedSender<Signal>, Self) {
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, Self { rx })
    }

    /// The next signal received.
    pub async fn recv(&mut self) -> Option<Signal> {
        self.rx.recv().await
    }

    /// The next signal that ends a wait (SIGINT, SIGTERM, SIGHUP,
    /// SIGQUIT), skipping the others: there is no child to forward them to
    /// yet.
    pub async fn next_terminating(&mut self) -> Option<Signal> {
        loop {
            let sig = self.rx.recv().await?;
            if terminating(sig) {
                return Some(sig);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_defaults_to_a_quarter_of_the_ttl_at_most_10s() {
        let s = Duration::from_secs;
        assert_eq!(check_lease_args("h", s(15), None).unwrap(), s(15) / 4);
        assert_eq!(check_lease_args("h", s(120), None).unwrap(), s(10));
        assert_eq!(
            check_lease_args("h", Duration::from_millis(3), None).unwrap(),
            Duration::from_micros(750)
        );
        assert_eq!(check_lease_args("h", s(10), Some(s(5))).unwrap(), s(5));
        let e = check_lease_args("h", s(10), Some(Duration::from_millis(5001))).unwrap_err();
        assert_eq!(e.code, exit::USAGE);
        assert!(e.message.contains("TTL/2"), "{}", e.message);
        // No overflow with an absurd --grace.
        let e = check_lease_args("h", s(15), Some(Duration::MAX)).unwrap_err();
        assert_eq!(e.code, exit::USAGE);
    }

    #[test]
    fn durations_read_as_people_write_them() {
        let ms = Duration::from_millis;
        assert_eq!(fmt_secs(Duration::from_micros(750)), "750µs");
        assert_eq!(fmt_secs(ms(50)), "50ms");
        assert_eq!(fmt_secs(ms(4200)), "4.2s");
        assert_eq!(fmt_secs(ms(3750)), "3.8s");
        assert_eq!(fmt_secs(ms(59_960)), "1m");
        assert_eq!(fmt_secs(ms(125_400)), "2m 5s");
        assert_eq!(fmt_secs(Duration::from_secs(3780)), "1h 3m");
    }

    #[test]
    fn a_ttl_too_short_to_renew_is_a_usage_error() {
        for ms in [1, 2] {
            let e = check_lease_args("h", Duration::from_millis(ms), None).unwrap_err();
            assert_eq!(e.code, exit::USAGE);
            assert!(e.message.contains("at least 3ms"), "{}", e.message);
        }
    }
}
