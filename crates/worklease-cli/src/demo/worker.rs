//! The workers: each runs one `worklease run ... -- worklease demo-shard`
//! after the other, reads its child's lines, and sends the one SIGKILL.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::protocol::{holder, work_id, ChildEvent};
use super::POLL;
use crate::exit;

/// How many times a worker goes over the shards it could not see complete
/// (a run that failed, for example because the store was busy).
const PASSES: usize = 3;

/// A duration as `worklease run` parses it back exactly.
fn millis(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// Whether the demo still has a `worklease run` to kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kill {
    /// `--no-kill`, or one worker only.
    Off,
    /// Waiting for a child to checkpoint a third of its shard.
    Armed,
    /// Sent; the killing worker learns whether it landed mid-shard.
    InFlight,
    /// A worker died in the middle of a shard.
    Done,
}

/// What every worker task shares.
pub(super) struct Plan {
    pub(super) exe: PathBuf,
    pub(super) store_url: String,
    pub(super) manifest: PathBuf,
    pub(super) ttl: Duration,
    pub(super) pace: Duration,
    /// The number of files of each shard.
    pub(super) shard_files: Vec<usize>,
    pub(super) workers: usize,
    pub(super) kill: Mutex<Kill>,
    /// Workers still going over the shards.
    pub(super) running: AtomicUsize,
    /// Cancelled when the demo is interrupted: the workers stop their
    /// `worklease run` and start no other.
    pub(super) stop: CancellationToken,
}

impl Plan {
    /// True when the worker whose child just checkpointed `next` of `files`
    /// files is to be killed now: once, a third of the way into a shard,
    /// while another worker is still there to take the shard over.
    fn claim_kill(&self, next: usize, files: usize) -> bool {
        let Ok(mut kill) = self.kill.lock() else {
            return false;
        };
        let due = next >= (files / 3).max(1) && next < files;
        if *kill == Kill::Armed && due && self.running.load(Ordering::SeqCst) >= 2 {
            *kill = Kill::InFlight;
            return true;
        }
        false
    }

    /// The kill landed in the middle of a shard (done), or it did not and
    /// the next chance is taken.
    fn kill_landed(&self, mid_shard: bool) {
        if let Ok(mut kill) = self.kill.lock() {
            *kill = if mid_shard { Kill::Done } else { Kill::Armed };
        }
    }
}

/// What the worker tasks tell the demo.
pub(super) enum Event {
    Child {
        worker: usize,
        shard: usize,
        event: ChildEvent,
    },
    KillSent {
        worker: usize,
        shard: usize,
        pid: u32,
        next: usize,
        files: usize,
    },
    Killed {
        worker: usize,
        shard: usize,
        mid_shard: bool,
    },
    KillMissed {
        worker: usize,
        shard: usize,
    },
    RunFailed {
        worker: usize,
        shard: usize,
        status: String,
        stderr: String,
    },
    Finished {
        worker: usize,
        unconfirmed: usize,
    },
}

/// How one `worklease run` of a worker ended.
enum Outcome {
    /// The child saw the shard complete, or completed it.
    Complete,
    /// It failed; the worker tries the shard again on its next pass.
    Incomplete,
    /// The demo killed it: the worker is gone.
    Killed,
    /// The demo was interrupted: the worker stops.
    Stopped,
}

/// A worker: goes over the shards, starting at its own, running one
/// `worklease run` per shard, until it has seen every shard complete (at
/// most [`PASSES`] times over) or it is killed.
pub(super) async fn worker(plan: Arc<Plan>, worker: usize, events: mpsc::UnboundedSender<Event>) {
    let n = plan.shard_files.len();
    let first = worker * n / plan.workers;
    let mut todo: Vec<usize> = (0..n).map(|i| (first + i) % n).collect();
    for _ in 0..PASSES {
        let mut left = Vec::new();
        for &shard in &todo {
            if plan.stop.is_cancelled() {
                plan.running.fetch_sub(1, Ordering::SeqCst);
                return;
            }
            match run_shard(&plan, worker, shard, &events).await {
                Outcome::Complete => {}
                Outcome::Incomplete => left.push(shard),
                Outcome::Killed | Outcome::Stopped => {
                    plan.running.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
            }
        }
        todo = left;
        if todo.is_empty() {
            break;
        }
    }
    plan.running.fetch_sub(1, Ordering::SeqCst);
    let _ = events.send(Event::Finished {
        worker,
        unconfirmed: todo.len(),
    });
}

/// One `worklease run --wait ... demo/shard-K -- worklease demo-shard ...`.
async fn run_shard(
    plan: &Plan,
    worker: usize,
    shard: usize,
    events: &mpsc::UnboundedSender<Event>,
) -> Outcome {
    let mut cmd = tokio::process::Command::new(&plan.exe);
    cmd.arg("run")
        .arg("--store")
        .arg(&plan.store_url)
        .args(["--wait", "--ttl", &millis(plan.ttl), "--poll", POLL])
        .args(["--holder", &holder(worker), &work_id(shard)])
        .arg("--")
        .arg(&plan.exe)
        .args(["demo-shard", "--shard", &shard.to_string()])
        .args(["--pace", &millis(plan.pace), "--manifest"])
        .arg(&plan.manifest)
        .env_remove("WORKLEASE_TOKEN")
        .env_remove("WORKLEASE_STORE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let failed = |status: String, stderr: String| {
        let _ = events.send(Event::RunFailed {
            worker,
            shard,
            status,
            stderr,
        });
        Outcome::Incomplete
    };
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => return failed(format!("cannot start: {e}"), String::new()),
    };
    let pid = child.id().unwrap_or(0);
    let stderr = child.stderr.take().map(|mut pipe| {
        tokio::spawn(async move {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text).await;
            text
        })
    });

    // The child's lines, until both `worklease run` and the child are gone.
    let mut complete = false;
    let mut killed = false;
    if let Some(stdout) = child.stdout.take() {
        let mut lines = BufReader::new(stdout).lines();
        loop {
            let line = tokio::select! {
                line = lines.next_line() => line,
                _ = plan.stop.cancelled() => {
                    stop_run(&mut child).await;
                    return Outcome::Stopped;
                }
            };
            let Ok(Some(line)) = line else {
                break;
            };
            let Ok(event) = serde_json::from_str::<ChildEvent>(&line) else {
                continue;
            };
            let kill_now = match &event {
                ChildEvent::Start { complete: true, .. } | ChildEvent::Complete { .. } => {
                    complete = true;
                    None
                }
                ChildEvent::Checkpoint { next, files, .. }
                    if !killed && plan.claim_kill(*next, *files) =>
                {
                    Some((*next, *files))
                }
                _ => None,
            };
            let _ = events.send(Event::Child {
                worker,
                shard,
                event,
            });
            if let Some((next, files)) = kill_now {
                // SIGKILL: `worklease run` cannot release the lease, and its
                // child gets SIGKILL from the kernel as it dies.
                let _ = child.start_kill();
                killed = true;
                let _ = events.send(Event::KillSent {
                    worker,
                    shard,
                    pid,
                    next,
                    files,
                });
            }
        }
    }
    let status = child.wait().await;
    let stderr = match stderr {
        Some(task) => task.await.unwrap_or_default(),
        None => String::new(),
    };

    if killed {
        if matches!(&status, Ok(s) if s.signal() == Some(Signal::SIGKILL as i32)) {
            plan.kill_landed(!complete);
            let _ = events.send(Event::Killed {
                worker,
                shard,
                mid_shard: !complete,
            });
            return Outcome::Killed;
        }
        // `worklease run` had ended already: the next chance is taken.
        plan.kill_landed(false);
        let _ = events.send(Event::KillMissed { worker, shard });
    }
    match status {
        Ok(s) if s.success() && complete => Outcome::Complete,
        Ok(s) => failed(format!("exit status {}", exit::of_status(s)), stderr),
        Err(e) => failed(format!("cannot wait for it: {e}"), stderr),
    }
}

/// Stops an interrupted worker's `worklease run`: SIGTERM, which it
/// forwards to its child before releasing the lease; SIGKILL if it has not
/// ended within a few seconds. Returns once it has ended.
async fn stop_run(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGTERM);
    }
    if tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .is_err()
    {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}
