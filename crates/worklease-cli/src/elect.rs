//! `worklease elect`: run a child only while this process leads an
//! election.
//!
//! 1. Check the arguments before touching the store, then campaign (wait to
//!    lead, polling every `--poll`; woken at once only by stores with
//!    notifications); a signal while campaigning ends the wait with 128 + N,
//!    once a grant that came anyway is released (at most
//!    [`settle::SETTLE_LIMIT`]).
//! 2. While leading: run the child with the `WORKLEASE_*` environment (the
//!    generation is `WORKLEASE_FENCING_TOKEN`) under the same supervision
//!    as `run` ([`crate::supervise::supervise`]): signals, job control,
//!    stdin, leftover processes, and a child gone by the lease deadline.
//! 3. Leadership lost: SIGTERM the child's group, SIGKILL after `--grace`
//!    (at the deadline when renewal failed), exit 76.
//! 4. The child exits while leading: release (a standby leads at its next
//!    poll) and exit with the child's status.
//! 5. A step-down request (`worklease leader --step-down`): the child is
//!    stopped as on a loss, the lease released, and this process stays up
//!    as a standby, campaigning again after `--backoff` (one TTL by
//!    default), so that a waiting candidate takes over first.

use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use nix::sys::signal::Signal;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use worklease::election::Elector;
use worklease::limits::{HolderId, WorkId};
use worklease::Error;

use crate::exit::{self, Failure};
use crate::health::{self, Health};
use crate::progress::Progress;
use crate::run::{check_command, check_lease_args, default_holder, say_lost};
use crate::say::say;
use crate::settle;
use crate::supervise::{cannot_run, spawn, supervise, Signals};
use crate::{
    parse_duration, parse_election, parse_holder_id, parse_metrics_addr, parse_poll, parse_ttl,
    MetricsArg, SharedStoreArg, StoreArg,
};

/// Arguments of `worklease elect`.
#[derive(Args, Debug)]
pub struct ElectArgs {
    #[command(flatten)]
    metrics: MetricsArg,

    #[command(flatten)]
    shared: SharedStoreArg,

    #[command(flatten)]
    store: StoreArg,

    /// Leadership TTL: how long a standby waits for a leader that stopped
    /// renewing (renewed every TTL/3), e.g. 500ms, 15s, 1m.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_ttl, allow_hyphen_values = true)]
    ttl: Duration,

    /// How often a candidate retries (a release wakes it at once on every
    /// store but S3).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_poll, allow_hyphen_values = true)]
    poll: Duration,

    /// Candidate (holder) ID [default: <hostname>:<pid>].
    #[arg(long, value_name = "ID", value_parser = parse_holder_id)]
    holder: Option<HolderId>,

    /// How long the child's process group has between SIGTERM and SIGKILL:
    /// SIGTERM comes --grace before the lease deadline while renewal fails,
    /// at once when leadership is taken away [default: TTL/4, at most 10s;
    /// at most TTL/2].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    grace: Option<Duration>,

    /// Serve health endpoints on HOST:PORT: GET /livez (200 while this
    /// process campaigns, leads or stands by), GET /readyz (200 while it
    /// leads, 503 otherwise) and GET /leader (the JSON of `worklease
    /// leader --json`). Bound at start: a busy address exits 69.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_metrics_addr)]
    health_addr: Option<std::net::SocketAddr>,

    /// This candidate's priority (any i32, negative too): while standing
    /// by, it asks a leader of a lower priority to step down (once per
    /// term); equal priorities never do, so leadership does not swing
    /// between them. A preferred candidate that was asked to step down
    /// takes leadership back after --backoff: to move leadership off it
    /// for good, restart it with a lower priority [default: none, 0 as a
    /// leader, and no asking].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    priority: Option<i32>,

    /// After stepping down on a request (`worklease leader --step-down`):
    /// how long this process stands by before it campaigns again, so that
    /// a waiting candidate takes over first [default: the TTL].
    #[arg(long, value_name = "DURATION", value_parser = parse_poll, allow_hyphen_values = true)]
    backoff: Option<Duration>,

    /// A value to publish while leading (the leader's address, say), at
    /// most 4096 bytes: `worklease leader ELECTION` shows it with the
    /// leader, so that followers can forward to it.
    #[arg(long, value_name = "VALUE")]
    publish: Option<String>,

    /// The election (a work ID: 1 to 1014 bytes, no control characters,
    /// not ending in /fair-queue, /fair-waiter/N, /permit/line,
    /// /step-down or /finished, which worklease keeps for itself).
    #[arg(value_name = "ELECTION", value_parser = parse_election)]
    election: WorkId,

    /// The command to run while leading, after `--`, and its arguments.
    #[arg(value_name = "CMD", last = true, required = true, num_args = 1..)]
    command: Vec<OsString>,
}

/// Checks a value to publish. Not a clap value parser: clap's error
/// would echo the whole value (kilobytes of it) back.
fn check_published(value: Option<&str>) -> Result<(), Failure> {
    let max = worklease::limits::MAX_PUBLISHED_VALUE_BYTES;
    match value {
        Some(v) if v.len() > max => Err(Failure::usage(format!(
            "--publish: the value is {} bytes: the limit is {max} bytes",
            v.len()
        ))),
        _ => Ok(()),
    }
}

/// Runs `worklease elect` and returns its exit status.
pub async fn elect(args: ElectArgs) -> Result<u8, Failure> {
    let holder = args
        .holder
        .as_ref()
        .map_or_else(default_holder, |h| h.to_string());
    // Nothing is opened, let alone written, for arguments that cannot work.
    let grace = check_lease_args(&holder, args.ttl, args.grace)?;
    check_command(&args.command)?;
    check_published(args.publish.as_deref())?;
    args.metrics.serve(args.election.as_str())?;
    let (child_url, store) = args.store.open(&args.shared)?;
    // On a terminal: who leads, refreshed while campaigning.
    let progress = Progress::start(store.clone(), &args.election);
    let mut builder = Elector::builder(store, args.election.as_str(), holder)
        .ttl(args.ttl)
        .poll_interval(args.poll);
    if let Some(value) = &args.publish {
        builder = builder.publish(value.clone());
    }
    if let Some(priority) = args.priority {
        builder = builder.priority(priority);
    }
    let elector = builder.build()?;
    let health = match args.health_addr {
        Some(addr) => Some(health::serve(addr, elector.clone(), args.election.clone()).await?),
        None => None,
    };
    // A store that answers nothing at all is a configuration error: say
    // so at once (exit 69) instead of campaigning against it forever.
    elector.leader().await?;
    tracing::info!(election = %args.election, owner = elector.owner(), "campaigning");
    // The signals belong to the campaign until this process leads, then to
    // the child's supervision: `leading` hands them over, for each term.
    let signals = Arc::new(Mutex::new(Signals::install()?));
    let backoff = args.backoff.unwrap_or(args.ttl);
    loop {
        let leading = CancellationToken::new();
        let stepped_down = AtomicBool::new(false);
        let term = Term {
            signals: &signals,
            leading: &leading,
            stepped_down: &stepped_down,
            health: health.as_deref(),
        };
        let mut lead = Box::pin(campaign(
            &args, &elector, term, &child_url, grace, &progress,
        ));
        let outcome = tokio::select! {
            outcome = &mut lead => outcome,
            sig = signal_while_campaigning(&signals, &leading) => match sig {
                Some(sig) => {
                    progress.stop();
                    say!(
                        "{sig} while campaigning for {:?}: gave up",
                        args.election.as_str()
                    );
                    // The campaign's acquisition may be granted anyway:
                    // dropped, it is released in the background; let that
                    // finish before exiting.
                    drop(lead);
                    settle::before_exit(
                        elector.settle(settle::bound(args.ttl)),
                        args.ttl,
                        &mut *signals.lock().await,
                    )
                    .await;
                    return Ok(128 + sig as u8);
                }
                None => lead.await,
            },
        };
        if !stepped_down.load(Ordering::SeqCst) {
            return finish(&args, outcome);
        }
        // Asked to step down: the child was stopped as on a loss and the
        // lease released; stand by, and campaign again after the back-off
        // so that a waiting candidate takes over first.
        say!(
            "stepped down from {:?} on request; campaigning again in {}",
            args.election.as_str(),
            crate::run::fmt_secs(backoff)
        );
        let mut signals = signals.lock().await;
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            Some(sig) = signals.next_terminating() => {
                say!("{sig} while standing by for {:?}", args.election.as_str());
                return Ok(128 + sig as u8);
            }
        }
    }
}

/// What one campaign shares with the process: the signals (the campaign's
/// until it leads), the hand-over of the signals, the step-down flag, the
/// health endpoints' state.
#[derive(Clone, Copy)]
struct Term<'a> {
    signals: &'a Arc<Mutex<Signals>>,
    leading: &'a CancellationToken,
    stepped_down: &'a AtomicBool,
    health: Option<&'a Health>,
}

/// One campaign: wait to lead, run the child while leading. Store failures
/// while campaigning (a restarting server, an etcd leader change) are
/// retried after --poll, as `run --wait` does: a standby that exits on the
/// first one leaves the election without one. Sets `stepped_down` when
/// the term ended on a step-down request.
async fn campaign(
    args: &ElectArgs,
    elector: &Elector,
    term: Term<'_>,
    child_url: &str,
    grace: std::time::Duration,
    progress: &Progress,
) -> worklease::Result<Result<(u8, bool), Failure>> {
    loop {
        let attempt = elector
            .lead(|l| {
                let command = &args.command;
                let Term {
                    signals,
                    leading,
                    stepped_down,
                    health,
                } = term;
                async move {
                    progress.stop();
                    leading.cancel();
                    if let Some(h) = health {
                        h.set_leading(true);
                    }
                    let mut signals = signals.lock().await;
                    let token = l.token();
                    tracing::info!(generation = l.generation(), "leading");
                    let child = spawn(command, &token, child_url)
                        .await
                        .map_err(|e| cannot_run(command, e))?;
                    let describe = || {
                        l.lost_cause().map_or_else(
                            || format!("lost the leadership of {:?}", token.work_id().as_str()),
                            |e| e.to_string(),
                        )
                    };
                    let outcome = supervise(child, &l, describe, grace, &mut signals).await;
                    if let Some(h) = health {
                        h.set_leading(false);
                    }
                    if matches!(l.lost_cause(), Some(Error::Resigned { .. })) {
                        stepped_down.store(true, Ordering::SeqCst);
                    }
                    outcome
                }
            })
            .await;
        match attempt {
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "store failed while campaigning; retrying");
                tokio::time::sleep(args.poll).await;
            }
            other => return other,
        }
    }
}

/// The exit status once leadership ended.
fn finish(
    args: &ElectArgs,
    outcome: worklease::Result<Result<(u8, bool), Failure>>,
) -> Result<u8, Failure> {
    let (code, lost) = outcome??;
    if lost {
        say_lost(&args.election, "leadership", code);
        return Ok(exit::LOST);
    }
    Ok(code)
}

/// The first terminating signal before this process leads; `None` once it
/// leads (the child's supervision takes the signals over).
async fn signal_while_campaigning(
    signals: &Mutex<Signals>,
    leading: &CancellationToken,
) -> Option<Signal> {
    let mut signals = tokio::select! {
        s = signals.lock() => s,
        _ = leading.cancelled() => return None,
    };
    tokio::select! {
        _ = leading.cancelled() => None,
        Some(sig) = signals.next_terminating() => Some(sig),
    }
}
