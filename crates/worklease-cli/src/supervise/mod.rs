//! The supervision of a child under a lease, shared by `worklease run`,
//! `elect` and `pool`: the child is started in its own process group
//! ([`spawn`]), and [`supervise`] keeps that group in step with the lease.
//!
//! 1. Forward SIGINT, SIGTERM, SIGHUP, SIGQUIT (each followed by SIGCONT),
//!    SIGUSR1 and SIGUSR2 to the child's process group ([`Signals`]). Job
//!    control: SIGTSTP, SIGTTIN and SIGTTOU stop the child's group, then
//!    this process; SIGCONT continues the group if the lease is still live,
//!    else SIGKILLs it (exit 76).
//! 2. The child must be gone by the holder's deadline: while renewal fails,
//!    the group gets SIGTERM once less than `--grace` is left before the
//!    deadline, and SIGKILL at the deadline. If the lease is taken away
//!    (fenced, expired, revoked): SIGTERM at once, SIGKILL after `--grace`;
//!    exit 76.
//! 3. When the child exits: what is left of its process group gets SIGTERM,
//!    then SIGKILL after `--grace`; supervision ends once the group is gone
//!    (and only then is the lease released).
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

use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use worklease::election::Leadership;
use worklease::{Error, Renewal, Token};

use crate::exit::{self, Failure};
use crate::run::fmt_secs;
use crate::say::say;

mod child;
mod exec;
mod signals;

pub use child::{cannot_run, spawn, spawn_in_group, Child};
#[cfg(target_os = "linux")]
pub use exec::{exec_child, EXEC_CHILD};
pub use signals::{job_control_mask, terminating, Signals, MAX_CHILDREN};

/// How often the process group of a child that exited is checked for
/// members (nothing signals that a process group became empty).
const GROUP_POLL: Duration = Duration::from_millis(20);

/// How long to wait for a SIGKILLed process group to disappear before
/// giving up on it (a process in uninterruptible sleep dies late).
const AFTER_SIGKILL: Duration = Duration::from_secs(2);

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
                            say!(
                                "continued after the lease's deadline passed ({}): SIGKILL to the child's process group",
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
                    say!(
                        "{}; the child's process group got SIGKILL at the lease deadline",
                        describe_loss(),
                    );
                } else if lease.latest().remaining() == Some(Duration::ZERO) {
                    say!(
                        "{}; the lease deadline has passed: SIGKILL to the child's process group",
                        describe_loss(),
                    );
                    signal_group(group, Signal::SIGKILL);
                    killed_at = Some(Instant::now());
                } else {
                    say!(
                        "{}; stopping the child: SIGTERM now, SIGKILL in {}",
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
        say!(
            "{}; the lease deadline passed without a successful renewal",
            describe_loss()
        );
        lost_seen = true;
    }
    if !lost_seen && term_for.is_some() {
        // The child was stopped because renewal kept failing and its lease
        // was about to run out: the lease is as good as lost (and the store
        // likely unreachable, so no release is attempted: it expires).
        say!(
            "the child was stopped because renewal kept failing and the lease was about to expire"
        );
        lost_seen = true;
    }
    let code = status.map_or(exit::SOFTWARE, exit::of_status);
    Ok((code, lost_seen))
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
