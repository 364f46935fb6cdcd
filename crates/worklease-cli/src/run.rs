//! `worklease run`: acquire the lease, run the child under it, supervise.
//!
//! 1. Acquire the lease (exit 75 when it is held and `--wait` was not
//!    given; with `--wait`, a signal ends the wait with 128 + N).
//! 2. Start background renewal and spawn the child in its own process
//!    group with the `WORKLEASE_*` environment.
//! 3. Forward SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the
//!    child's process group.
//! 4. If the lease is lost: SIGTERM the group, SIGKILL it after `--grace`,
//!    exit 76 once the child has ended (what is left of its group then gets
//!    SIGKILL too).
//! 5. Otherwise, when the child exits: stop renewing, release the lease
//!    (a clean hand-off) and exit with the child's status.

use std::ffi::OsString;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::mpsc;
use tokio::time::Instant;
use worklease::{AcquireOptions, Config, Error, Leases, RenewalOptions, Token};

use crate::exit::{self, Failure};
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

/// Runs `worklease run` and returns its exit status.
pub async fn run(args: RunArgs) -> Result<u8, Failure> {
    let (child_url, store) = args.store.open()?;
    if store.kind() == "memory" {
        tracing::warn!(
            "the memory: store lives in this process only: the lease excludes no other process, \
             and the child's `worklease checkpoint` cannot reach it"
        );
    }
    let holder = args
        .holder
        .as_ref()
        .map_or_else(default_holder, |h| h.to_string());
    let leases = Leases::new(store, Config::new(holder, args.ttl))?;
    // Catch signals from now on: a signal while waiting ends the wait, one
    // before the child starts is forwarded to it as soon as it does.
    let mut signals = Signals::install()?;

    let token = match acquire(&leases, &args, &mut signals).await? {
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
    let lost = renewal.lost_signal();
    let describe = || {
        renewal.lost_cause().map_or_else(
            || format!("lost the lease on {:?}", token.work_id().as_str()),
            |e| e.to_string(),
        )
    };
    let (code, lost_seen) = supervise(child, &lost, describe, args.grace, &mut signals).await?;
    if lost_seen {
        return Ok(exit::LOST);
    }
    let token = match renewal.stop().await {
        Ok(token) => token,
        Err(cause) => {
            eprintln!("worklease: the lease was lost before the child ended: {cause}");
            return Ok(exit::LOST);
        }
    };
    match leases.release(token.clone()).await {
        Ok(()) => Ok(code),
        Err(e) if e.is_lease_lost() => {
            eprintln!("worklease: the lease was lost before the child ended: {e}");
            Ok(exit::LOST)
        }
        Err(e) => {
            tracing::warn!(
                error = %e,
                "cannot release the lease: it ends when its TTL runs out, and the next holder sees an unclean hand-off"
            );
            Ok(code)
        }
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

/// Supervises a running child until it exits: forwards signals to its
/// process group and, when `lost` fires, SIGTERMs the group and SIGKILLs it
/// after `grace`. Returns the exit status to report (the child's) and
/// whether the lease was lost meanwhile; after a loss, what is left of the
/// group gets SIGKILL too.
pub async fn supervise(
    mut child: tokio::process::Child,
    lost: &tokio_util::sync::CancellationToken,
    describe_loss: impl Fn() -> String,
    grace: Duration,
    signals: &mut Signals,
) -> Result<(u8, bool), Failure> {
    // The child leads its own process group: its ID is the group's.
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let mut lost_seen = false;
    let mut kill_at: Option<Instant> = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            Some(sig) = signals.recv() => {
                tracing::debug!(signal = %sig, "forwarding a signal to the child's process group");
                signal_group(group, sig);
            }
            _ = lost.cancelled(), if !lost_seen => {
                lost_seen = true;
                eprintln!(
                    "worklease: {}; stopping the child: SIGTERM now, SIGKILL in {}",
                    describe_loss(),
                    humantime::format_duration(grace),
                );
                signal_group(group, Signal::SIGTERM);
                kill_at = Some(Instant::now() + grace);
            }
            _ = sleep_until(kill_at), if kill_at.is_some() => {
                tracing::warn!("the child did not stop within --grace: SIGKILL");
                signal_group(group, Signal::SIGKILL);
                kill_at = None;
            }
        }
    };
    let status = match status {
        Ok(status) => status,
        Err(e) => {
            // Cannot happen with a child we spawned; stop everything.
            signal_group(group, Signal::SIGKILL);
            return Err(Failure::new(
                exit::SOFTWARE,
                format!("cannot wait for the child: {e}"),
            ));
        }
    };
    let code = exit::of_status(status);
    tracing::debug!(code, "the child exited");
    if lost_seen {
        // Whatever the child left running in its group must not outlive the
        // lease either.
        signal_group(group, Signal::SIGKILL);
    }
    Ok((code, lost_seen))
}

/// Acquires the lease: at once, or with `--wait` until it is free or a
/// signal arrives.
async fn acquire(
    leases: &Leases,
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
    let expiry = match expires_in {
        Some(d) => format!("its lease expires in {} unless renewed", fmt_secs(d)),
        None => "its lease expiry is unknown".to_string(),
    };
    if !args.wait {
        return Err(Failure::new(
            exit::HELD,
            format!("{work_id:?} is held by {holder_id:?} ({expiry}); not waiting: pass --wait to wait for it"),
        ));
    }
    tracing::info!(
        "{work_id:?} is held by {holder_id:?} ({expiry}); waiting for it (polling every {})",
        humantime::format_duration(args.poll)
    );
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
                if matches!(sig, Signal::SIGUSR1 | Signal::SIGUSR2) {
                    continue; // no child yet to forward them to
                }
                return Ok(Acquired::Interrupted(sig));
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(args.poll) => {}
            Some(sig) = signals.recv() => {
                if !matches!(sig, Signal::SIGUSR1 | Signal::SIGUSR2) {
                    return Ok(Acquired::Interrupted(sig));
                }
            }
        }
    }
}

/// Starts the child in its own process group with the `WORKLEASE_*`
/// environment; on Linux it is killed if this process dies.
pub fn spawn(
    command: &[OsString],
    token: &Token,
    store_url: &str,
) -> std::io::Result<tokio::process::Child> {
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
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let parent = nix::unistd::getpid();
        // SAFETY: the closure runs in the forked child before exec and only
        // makes async-signal-safe system calls (prctl, getppid, kill).
        unsafe {
            cmd.pre_exec(move || die_with_parent(parent));
        }
    }
    tracing::debug!(command = ?command, "starting the child");
    cmd.spawn()
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

/// `4.2s` under a minute, else a humantime duration in whole seconds.
pub fn fmt_secs(d: Duration) -> String {
    if d < Duration::from_secs(60) {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
    }
}

/// The forwarded signals, delivered through a channel.
pub struct Signals {
    rx: mpsc::UnboundedReceiver<Signal>,
}

impl Signals {
    /// Installs handlers for [`FORWARDED`]: from now on these signals no
    /// longer end this process, they are delivered by [`Signals::recv`].
    pub fn install() -> Result<Self, Failure> {
        use tokio::signal::unix::{signal, SignalKind};
        let (tx, rx) = mpsc::unbounded_channel();
        for sig in FORWARDED {
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
        Ok(Self { rx })
    }

    pub async fn recv(&mut self) -> Option<Signal> {
        self.rx.recv().await
    }
}
