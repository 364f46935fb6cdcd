//! `worklease run`: acquire the lease, run the child under it, supervise.
//!
//! 1. Check the arguments (TTL, `--grace`, a non-empty program name) before
//!    touching the store, then acquire the lease (exit 75 when it is held
//!    and `--wait` was not given; with `--wait`, a signal ends the wait with
//!    128 + N, once a grant that came anyway is released, at most
//!    [`settle::SETTLE_LIMIT`]).
//! 2. Start background renewal and spawn the child in its own process
//!    group with the `WORKLEASE_*` environment (stdin `/dev/null` when ours
//!    is a terminal).
//! 3. Supervise the child ([`crate::supervise`]): signals forwarded to its
//!    process group, job control, and the group gone by the holder's
//!    deadline; a lease taken away (fenced, expired, revoked) is exit 76.
//! 4. When the child exits and what is left of its process group has
//!    ended: stop renewing, release the lease (a clean hand-off) and exit
//!    with the child's status. A group that ended inside the lease (before
//!    the holder's deadline, before any loss) is a good run: when renewal
//!    or the release fails after that (the store briefly down), a warning
//!    says so, the lease expires by its TTL (the next holder sees no clean
//!    hand-off), and the status is still the child's.
//!
//! The checks of the arguments, the default holder ID and [`fmt_secs`]
//! serve `elect` and `pool` too.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use worklease::store::memory::MemoryStore;
use worklease::store::ExpiryClock;
use worklease::{
    AcquireOptions, Config, Error, LeaseStore, Leases, RenewalOptions, Semaphore, Token,
};

use crate::exit::{self, Failure};
use crate::progress::Progress;
use crate::run_once;
use crate::say::{self, say};
use crate::settle;
use crate::supervise::{cannot_run, spawn, supervise, terminating, Signals};
use crate::RunArgs;
pub use worklease_cli::values::fmt_secs;

/// The longest default `--grace`.
const MAX_DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// Runs `worklease run` and returns its exit status.
pub async fn run(args: RunArgs) -> Result<u8, Failure> {
    let holder = args
        .holder
        .as_ref()
        .map_or_else(default_holder, |h| h.to_string());
    // Nothing is opened, let alone written, for arguments that cannot work.
    let grace = check_lease_args(&holder, args.ttl, args.grace)?;
    check_command(&args.command)?;
    if args.once {
        worklease::once::check(&args.work_id, &holder)?;
    }
    args.metrics.serve(args.work_id.as_str())?;
    let (child_url, store) = args.store.open(&args.shared)?;
    warn_if_memory(&store);
    let leases = Leases::new(store.clone(), Config::new(holder, args.ttl))?;
    let semaphore = match args.permits {
        Some(n) => Some(Semaphore::new(leases.clone(), args.work_id.as_str(), n)?),
        None => None,
    };
    // Catch signals from now on: a terminating one during the acquisition
    // (its first attempt included) ends it and `run` (128 + N, after the
    // attempt's grant, if any, is released); another one before the child
    // starts is forwarded to it as soon as it does.
    let mut signals = Signals::install()?;

    let acquired = match &semaphore {
        Some(semaphore) => acquire_permit(semaphore, &args, &mut signals).await,
        None => acquire(&leases, &store, &args, &mut signals).await,
    };
    let acquired = match acquired {
        Err(failure) if failure.code == exit::HELD => return when_held(args.if_held, failure),
        other => other?,
    };
    let token = match acquired {
        Acquired::Token(token) => token,
        Acquired::Interrupted(sig) => {
            let what = if semaphore.is_some() {
                "a permit of"
            } else {
                "the lease on"
            };
            say!(
                "{sig} while waiting for {what} {:?}: gave up",
                args.work_id.as_str()
            );
            // A grant of the attempt given up (a fair waiter's place too)
            // is being released in the background: let it finish.
            settle::before_exit(
                leases.settle(settle::bound(args.ttl)),
                args.ttl,
                &mut signals,
            )
            .await;
            return Ok(128 + sig as u8);
        }
    };
    tracing::debug!(
        work_id = %token.work_id(),
        holder_id = %token.holder_id(),
        fencing_token = token.fencing_token(),
        "lease acquired"
    );

    if args.once && run_once::finished_already(&leases, &token).await? {
        return Ok(0);
    }

    let renewal = match leases.start_renewal(token.clone(), RenewalOptions::new()) {
        Ok(renewal) => renewal,
        Err(e) => {
            release_after_failure(&leases, token).await;
            return Err(e.into());
        }
    };

    let child = match spawn(&args.command, &token, &child_url).await {
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
        let what = if semaphore.is_some() {
            "permit"
        } else {
            "lease"
        };
        say_lost(token.work_id(), what, code);
        return Ok(exit::LOST);
    }
    if args.once && code == 0 {
        // Recorded while the lease is still renewed, before its release.
        run_once::record(&store, &token).await;
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

/// What `run` does when the lease is held and `--wait` was not given
/// (`--if-held`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfHeld {
    /// Exit 0 and say nothing (as `flock -n -E 0`).
    Ok,
    /// Exit 75 with a line saying who holds it (the line left out under `-q`).
    Fail,
}

/// The exit of a `run` that found the lease held (`failure`, exit 75):
/// 0 in silence with `--if-held=ok`; 75 with its line, or without it
/// under `-q`.
fn when_held(if_held: IfHeld, failure: Failure) -> Result<u8, Failure> {
    match if_held {
        IfHeld::Ok => {
            tracing::info!("{}; exiting 0 (--if-held=ok)", failure.message);
            Ok(0)
        }
        IfHeld::Fail if say::is_quiet() => Err(Failure::new(exit::HELD, "")),
        IfHeld::Fail => Err(failure),
    }
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
    say!(
        "exit 76: the {what} on {:?} was lost while the child ran (the child's own status: {code})",
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
            fmt_secs(grace),
            fmt_secs(half),
        ))),
        Some(grace) => Ok(grace),
    }
}

enum Acquired {
    Token(Token),
    Interrupted(Signal),
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
    let first = if args.fair && args.wait {
        // A fail-fast try first would queue twice: wait in line at once.
        tracing::info!(
            "waiting in line for {work_id:?} (fair, polling every {})",
            fmt_secs(args.poll)
        );
        Err(Error::Held {
            work_id: work_id.to_string(),
            holder_id: String::new(),
            expires_in: None,
        })
    } else {
        let attempt = leases.acquire(work_id, fair(args, AcquireOptions::new()));
        match interruptible(signals, attempt).await {
            Ok(first) => first,
            Err(sig) => return Ok(Acquired::Interrupted(sig)),
        }
    };
    let (holder_id, expires_in) = match first {
        Ok(token) => return Ok(Acquired::Token(token)),
        Err(e @ Error::WaitersAhead { .. }) => {
            return Err(Failure::new(
                exit::HELD,
                format!("{e}; not waiting: pass --wait to join the line"),
            ))
        }
        Err(Error::Held {
            holder_id,
            expires_in,
            ..
        }) => (holder_id, expires_in),
        Err(e) if args.wait && e.is_transient() => {
            first_try_failed(&e, "the lease");
            (String::new(), None)
        }
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
    if !holder_id.is_empty() {
        tracing::info!(
            "{work_id:?} is held by {holder_id:?} ({expiry}); waiting for it (polling every {})",
            fmt_secs(args.poll)
        );
    }
    // On a terminal: who holds the lease, refreshed; erased when the wait ends.
    let _progress = Progress::start(store.clone(), &args.work_id);
    let options = fair(
        args,
        AcquireOptions::new()
            .wait_for_lease()
            .poll_interval(args.poll),
    );
    wait_for_grant(signals, options, args.poll, "the lease", |o| {
        leases.acquire(work_id, o)
    })
    .await
}

/// The first, fail-fast attempt, ended by a terminating signal: `Err`
/// with the signal, the attempt dropped (a grant it gets anyway is
/// released in the background, which `run` settles before it exits). A
/// store call can take long (a Redis replica wait of many seconds, a
/// store that does not answer until its timeout).
async fn interruptible<T>(
    signals: &mut Signals,
    attempt: impl std::future::Future<Output = T>,
) -> Result<T, Signal> {
    tokio::pin!(attempt);
    loop {
        tokio::select! {
            r = &mut attempt => return Ok(r),
            Some(sig) = signals.recv() => {
                if terminating(sig) {
                    return Err(sig);
                }
                // No child yet to forward it to.
            }
        }
    }
}

/// Waits for a grant, `attempt` after `attempt` (each a waiting
/// acquisition with `options`), retrying store failures every `poll`,
/// until one succeeds or a terminating signal comes. On that signal the
/// attempt in flight is dropped, as the first attempt is
/// ([`interruptible`]): the library lets go of what it held (a fair
/// waiter's place, a grant that comes anyway) in the background, which
/// `run` settles before it exits, one bounded wait for all of it.
async fn wait_for_grant<F, Fut>(
    signals: &mut Signals,
    options: AcquireOptions,
    poll: Duration,
    what: &str,
    attempt: F,
) -> Result<Acquired, Failure>
where
    F: Fn(AcquireOptions) -> Fut,
    Fut: std::future::Future<Output = Result<Token, Error>>,
{
    loop {
        let result = match interruptible(signals, attempt(options.clone())).await {
            Ok(result) => result,
            Err(sig) => return Ok(Acquired::Interrupted(sig)),
        };
        match result {
            Ok(token) => return Ok(Acquired::Token(token)),
            // A store failure while waiting (busy, unreachable): keep waiting.
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "store failed while waiting for {what}; retrying");
            }
            Err(e) => return Err(e.into()),
        }
        tokio::select! {
            _ = tokio::time::sleep(poll) => {}
            Some(sig) = signals.recv() => {
                if terminating(sig) {
                    return Ok(Acquired::Interrupted(sig));
                }
            }
        }
    }
}

/// Says that the first, fail-fast try for `what` failed in the store (a
/// transient failure its own retries did not outlast): with `--wait`, the
/// wait goes on through it, as through a store failure while waiting.
fn first_try_failed(e: &Error, what: &str) {
    tracing::warn!(error = %e, "store failed on the first try for {what}; waiting");
}

/// "the 1 permit", "all 3 permits".
fn permits_phrase(n: usize) -> String {
    if n == 1 {
        "the 1 permit".to_string()
    } else {
        format!("all {n} permits")
    }
}

/// `options`, fair when `--fair` asks for it.
fn fair(args: &RunArgs, options: AcquireOptions) -> AcquireOptions {
    if args.fair {
        options.fair()
    } else {
        options
    }
}

/// Takes a permit of `semaphore` (`run --permits`): at once, or with
/// `--wait` until one is free or a signal arrives.
async fn acquire_permit(
    semaphore: &Semaphore,
    args: &RunArgs,
    signals: &mut Signals,
) -> Result<Acquired, Failure> {
    let name = semaphore.name();
    let n = semaphore.permits();
    let first = if args.fair && args.wait {
        // A fail-fast try first would queue twice: wait in line at once.
        Err(Error::PermitsHeld {
            semaphore: name.to_string(),
            permits: n,
            expires_in: None,
        })
    } else {
        let attempt = semaphore.acquire(fair(args, AcquireOptions::new()));
        match interruptible(signals, attempt).await {
            Ok(first) => first,
            Err(sig) => return Ok(Acquired::Interrupted(sig)),
        }
    };
    match first {
        Ok(token) => return Ok(Acquired::Token(token)),
        Err(e @ Error::WaitersAhead { .. }) => {
            if !args.wait {
                return Err(Failure::new(
                    exit::HELD,
                    format!("{e}; not waiting: pass --wait to join the line"),
                ));
            }
        }
        Err(Error::PermitsHeld { expires_in, .. }) => {
            let expiry = match expires_in {
                Some(d) => format!("; the first ends in {} unless renewed", fmt_secs(d)),
                None => String::new(),
            };
            if !args.wait {
                return Err(Failure::new(
                    exit::HELD,
                    format!(
                        "{} of semaphore {name:?} {} held{expiry}; not waiting: pass --wait to wait for one",
                        permits_phrase(n),
                        if n == 1 { "is" } else { "are" }
                    ),
                ));
            }
            tracing::info!(
                "{} of semaphore {name:?} {} held{expiry}; waiting for one (polling every {})",
                permits_phrase(n),
                if n == 1 { "is" } else { "are" },
                fmt_secs(args.poll)
            );
        }
        Err(e) if args.wait && e.is_transient() => first_try_failed(&e, "a permit"),
        Err(e) => return Err(e.into()),
    }
    let options = fair(
        args,
        AcquireOptions::new()
            .wait_for_lease()
            .poll_interval(args.poll),
    );
    // On a terminal: how many permits are held, refreshed.
    let _progress = Progress::start_permits(
        semaphore.leases().store().clone(),
        name,
        semaphore.permit_ids(),
    );
    wait_for_grant(signals, options, args.poll, "a permit", |o| {
        semaphore.acquire(o)
    })
    .await
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

/// Releases a lease we could not use (the child never started); a failure
/// only leaves the lease to expire.
pub async fn release_after_failure(leases: &Leases, token: Token) {
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
    fn a_ttl_too_short_to_renew_is_a_usage_error() {
        for ms in [1, 2] {
            let e = check_lease_args("h", Duration::from_millis(ms), None).unwrap_err();
            assert_eq!(e.code, exit::USAGE);
            assert!(e.message.contains("at least 3ms"), "{}", e.message);
        }
    }
}
