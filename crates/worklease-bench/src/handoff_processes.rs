//! Hand-off with the waiters in other processes: the same loop as
//! [`crate::handoff`] (wait for the lease → hold it a moment → release →
//! sit out until someone else took it → wait again), but every
//! participant is a process of its own (this program's hidden
//! `handoff-participant` subcommand, [`participant`]) with its own store
//! value, so a release reaches the waiters only across processes: on
//! SQLite through the database file, not the releasing value's own
//! waiters.
//!
//! The participants stamp their events with `CLOCK_MONOTONIC`, which every
//! process of the host shares, and print them (`ready T`, `acquired T`,
//! `released T`, T in ns; `released` carries the moment the release
//! started). This process reads them, tells a participant that sat out
//! when someone else acquired after its release (`turn` on its stdin), and
//! pairs each acquisition with the latest release before it: the figure is
//! the time from the start of the release to the next holder's acquire
//! returning, as in the one-process rows. Hand-offs whose release started
//! before every participant was ready are left out (fewer waiters then).

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;
use worklease::{AcquireOptions, Config, LeaseStore, Leases};

use crate::measure::{histogram, record};
use crate::results::{HandoffMode, HandoffRow, Latency};
use crate::stores::{Opened, PollOnly};
use crate::{Plan, Result};

/// What a participant needs besides the store.
pub struct Participant {
    /// The work ID all participants take turns on.
    pub work_id: String,
    /// The lease TTL.
    pub ttl: Duration,
    /// The poll interval while waiting.
    pub poll: Duration,
    /// The fixed part of a holding (a random part of `poll` is added).
    pub hold: Duration,
    /// Woken by the store's notifications (else they are hidden: polling).
    pub push: bool,
}

/// `CLOCK_MONOTONIC` in ns: one clock for every process of the host.
fn mono_ns() -> Result<u64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)?;
    Ok(t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

/// One participant (the `handoff-participant` subcommand): takes turns on
/// the lease until its stdin says anything but `turn` or closes.
pub async fn participant(url: &str, p: &Participant) -> Result<()> {
    let store = worklease::store::url::open(url)?;
    let store: Arc<dyn LeaseStore> = if p.push {
        store
    } else {
        Arc::new(PollOnly(store))
    };
    let leases = Leases::new(
        store,
        Config::new(format!("handoff-{}", std::process::id()), p.ttl),
    )?;
    let options = AcquireOptions::new().wait_for_lease().poll_interval(p.poll);
    let mut turns = BufReader::new(tokio::io::stdin()).lines();
    println!("ready {}", mono_ns()?);
    loop {
        let token = leases.acquire(&p.work_id, options.clone()).await?;
        println!("acquired {}", mono_ns()?);
        // As in one process: a random part of a poll interval, so that
        // releases fall at random points of the pollers' schedules.
        let hold = p.hold + p.poll.mul_f64(rand::thread_rng().gen_range(0.0..1.0));
        tokio::time::sleep(hold).await;
        let started = mono_ns()?;
        leases.release(token).await?;
        println!("released {started}");
        match turns.next_line().await? {
            Some(line) if line == "turn" => {}
            _ => return Ok(()),
        }
    }
}

/// A participant's process, killed when dropped.
struct Process {
    _child: Child,
    stdin: ChildStdin,
}

/// What the participants said, in the order it was read.
enum Said {
    Ready(u64),
    Acquired(u64),
    Released(u64),
    /// Its output ended (it exited or failed).
    Gone,
}

/// Hand-offs among `waiters` + 1 participant processes in `mode` (push or
/// poll).
pub async fn handoff(
    opened: &Opened,
    plan: &Plan,
    waiters: usize,
    mode: HandoffMode,
    round_trip_us: u64,
) -> Result<HandoffRow> {
    let push = mode == HandoffMode::Push;
    let work = format!("handoff-processes-{}-{waiters}", mode.as_str());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut processes = Vec::with_capacity(waiters + 1);
    for i in 0..=waiters {
        let mut child = Command::new(std::env::current_exe()?)
            .arg("handoff-participant")
            .args(["--store", &opened.url, "--work-id", &work])
            .args(["--ttl-ms", &plan.ttl.as_millis().to_string()])
            .args(["--poll-ms", &plan.handoff_poll.as_millis().to_string()])
            .args(["--hold-ms", &plan.handoff_hold.as_millis().to_string()])
            .args(["--push", &push.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let said = line.split_once(' ').and_then(|(what, t)| {
                    let t = t.parse().ok()?;
                    match what {
                        "ready" => Some(Said::Ready(t)),
                        "acquired" => Some(Said::Acquired(t)),
                        "released" => Some(Said::Released(t)),
                        _ => None,
                    }
                });
                if let Some(said) = said {
                    if tx.send((i, said)).is_err() {
                        return;
                    }
                }
            }
            let _ = tx.send((i, Said::Gone));
        });
        processes.push(Process {
            _child: child,
            stdin,
        });
    }
    drop(tx);
    let deadline = Instant::now() + plan.handoff_limit + Duration::from_secs(30);
    let mut ready = (0, 0u64); // participants ready, the last one's stamp
    let mut acquisitions: Vec<u64> = Vec::new();
    let mut releases: Vec<u64> = Vec::new();
    // Participants that released and wait for someone else to acquire.
    let mut sitting_out: Vec<(usize, u64)> = Vec::new();
    let (mut errors, mut first_error) = (0u64, None);
    let mut counted = 0;
    let measuring_until = Instant::now() + plan.handoff_limit;
    while counted < plan.handoffs && Instant::now() < measuring_until {
        let Ok(Some((i, said))) = tokio::time::timeout_at(deadline, rx.recv()).await else {
            return Err(format!(
                "the hand-off participants said nothing more (by {:?} after the start)",
                plan.handoff_limit + Duration::from_secs(30)
            )
            .into());
        };
        match said {
            Said::Ready(t) => ready = (ready.0 + 1, ready.1.max(t)),
            Said::Acquired(t) => {
                acquisitions.push(t);
                if ready.0 == processes.len() && releases.iter().any(|&r| r > ready.1 && r < t) {
                    counted += 1;
                }
                let (now, later): (Vec<_>, Vec<_>) = sitting_out.iter().partition(|(_, r)| *r < t);
                sitting_out = later;
                for (j, _) in now {
                    turn(&mut processes[j], &mut errors, &mut first_error).await;
                }
            }
            Said::Released(t) => {
                releases.push(t);
                if acquisitions.iter().any(|&a| a > t) {
                    turn(&mut processes[i], &mut errors, &mut first_error).await;
                } else {
                    sitting_out.push((i, t));
                }
            }
            Said::Gone => {
                errors += 1;
                first_error.get_or_insert_with(|| {
                    format!("participant {i} exited early (its error is on this program's stderr)")
                });
                if errors as usize > waiters {
                    return Err("every hand-off participant exited".into());
                }
            }
        }
    }
    // Dropping the processes kills them (they may be waiting or holding).
    drop(processes);
    let mut hist = histogram();
    releases.sort_unstable();
    acquisitions.sort_unstable();
    let handoffs = acquisitions.iter().filter_map(|&a| {
        // The release this acquisition followed: the latest before it.
        let before = releases.partition_point(|&r| r < a);
        let r = *releases.get(before.checked_sub(1)?)?;
        (ready.0 == waiters + 1 && r > ready.1).then(|| Duration::from_nanos(a - r))
    });
    for d in handoffs.take(plan.handoffs) {
        record(&mut hist, d);
    }
    let poll = plan.handoff_poll;
    let what = if push {
        format!("{} processes, one participant each (this program's `handoff-participant`), acquire with wait_for_lease, woken by other processes' releases through the store (poll every {poll:?} as the fallback)", waiters + 1)
    } else {
        format!("{} processes, one participant each (this program's `handoff-participant`), acquire with wait_for_lease, notifications hidden: polls every {poll:?} (+ up to 10% jitter)", waiters + 1)
    };
    Ok(HandoffRow {
        store: opened.store.kind().to_string(),
        waiters,
        mode,
        what,
        notified: push,
        across_processes: true,
        round_trip_us,
        errors,
        first_error,
        latency: Latency::of(&hist),
    })
}

/// Tells a participant that sat out to wait again.
async fn turn(p: &mut Process, errors: &mut u64, first_error: &mut Option<String>) {
    if let Err(e) = p.stdin.write_all(b"turn\n").await {
        *errors += 1;
        first_error.get_or_insert_with(|| format!("cannot tell a participant its turn: {e}"));
    }
}
