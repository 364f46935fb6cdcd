//! Failover: a holder process (this program again, `hold` subcommand)
//! acquires a lease and renews it in the background; a waiter in this
//! process waits for the same lease; the holder is SIGKILLed at a random
//! point of its renewal cycle; the time from the kill to the waiter's
//! acquire returning is set against the TTL + the poll interval + 50 ms.
//!
//! The memory store is private to a process: there the holder is a task
//! of this process, aborted (its renewal dropped) instead.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::Rng;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::time::Instant;
use worklease::{AcquireOptions, Config, Leases, RenewalOptions};

use crate::results::FailoverRow;
use crate::stores::{Bench, Opened};
use crate::{Plan, Result};

/// The line the holder prints once it holds the lease.
const HELD: &str = "held";

/// The holder: acquires `work_id` on the store at `url` (waiting), renews
/// it in the background, prints `held TOKEN` and stays until killed, or
/// for `max` at most (so that a holder whose parent died goes away).
pub async fn hold(url: &str, work_id: &str, ttl: Duration, max: Duration) -> Result<()> {
    let store = worklease::store::url::open(url)?;
    let leases = Leases::new(
        store,
        Config::new(format!("failover-holder-{}", std::process::id()), ttl),
    )?;
    let token = leases
        .acquire(
            work_id,
            AcquireOptions::new()
                .wait_for_lease()
                .poll_interval(Duration::from_millis(50)),
        )
        .await?;
    let renewal = leases.start_renewal(token.clone(), RenewalOptions::new())?;
    println!("{HELD} {}", token.fencing_token());
    tokio::select! {
        () = tokio::time::sleep(max) => Ok(()),
        e = renewal.lost() => Err(e.into()),
    }
}

/// How a trial's holder dies.
enum Holder {
    Process(tokio::process::Child),
    Task(tokio::task::JoinHandle<()>),
}

/// Failover trials on one store.
pub async fn failover(bench: &dyn Bench, opened: &Opened, plan: &Plan) -> Result<FailoverRow> {
    let (ttl, poll) = (plan.failover_ttl, plan.failover_poll);
    let across = bench.shared_across_processes();
    let mut row = FailoverRow {
        store: bench.name().to_string(),
        how: if across {
            "the holder process (this program's `hold` subcommand) is SIGKILLed".to_string()
        } else {
            "the holder task is aborted (a memory store is private to its process)".to_string()
        },
        ttl_ms: ttl.as_millis() as u64,
        poll_ms: poll.as_millis() as u64,
        bound_ms: (ttl + poll + Duration::from_millis(50)).as_millis() as u64,
        trials_ms: Vec::new(),
        errors: 0,
        first_error: None,
    };
    for trial in 0..plan.failover_trials {
        match one_trial(opened, across, ttl, poll, trial).await {
            Ok(ms) => row.trials_ms.push(ms),
            Err(e) => {
                row.errors += 1;
                row.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    Ok(row)
}

async fn one_trial(
    opened: &Opened,
    across: bool,
    ttl: Duration,
    poll: Duration,
    trial: usize,
) -> Result<f64> {
    let work = format!("failover-{trial}");
    let holder = if across {
        let mut child = Command::new(std::env::current_exe()?)
            .arg("hold")
            .arg("--store")
            .arg(&opened.url)
            .arg("--work-id")
            .arg(&work)
            .arg("--ttl-ms")
            .arg(ttl.as_millis().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .map_err(|_| "the holder did not report within 30 s")??
            .ok_or("the holder exited before it held the lease")?;
        if !line.starts_with(HELD) {
            return Err(format!("the holder said {line:?}").into());
        }
        Holder::Process(child)
    } else {
        let leases = Leases::new(opened.store.clone(), Config::new("failover-holder", ttl))?;
        let token = leases.acquire(&work, AcquireOptions::new()).await?;
        let renewal = leases.start_renewal(token, RenewalOptions::new())?;
        Holder::Task(tokio::spawn(async move {
            // Holds the renewal until aborted.
            let _renewal = renewal;
            std::future::pending::<()>().await;
        }))
    };

    let waiter = Leases::new(
        opened.store.clone(),
        Config::new(format!("failover-waiter-{trial}"), ttl),
    )?;
    let options = AcquireOptions::new()
        .wait_for_lease()
        .poll_interval(poll)
        .wait_timeout(ttl * 4 + poll * 2);
    let wait = {
        let (waiter, work) = (waiter.clone(), work.clone());
        tokio::spawn(async move {
            let r = waiter.acquire(&work, options).await;
            (r, Instant::now())
        })
    };
    // Kill at a random point of the holder's renewal cycle (every TTL/3),
    // once the waiter is surely waiting.
    let phase = rand::thread_rng().gen_range(0.0..1.0);
    tokio::time::sleep(Duration::from_millis(100) + (ttl / 3).mul_f64(phase)).await;
    let killed = Instant::now();
    match holder {
        Holder::Process(mut child) => {
            let pid = child.id().ok_or("the holder already exited")?;
            kill(Pid::from_raw(pid as i32), Signal::SIGKILL)?;
            child.wait().await?;
        }
        Holder::Task(task) => {
            task.abort();
            let _ = task.await;
        }
    }
    let (got, at) = wait.await?;
    let token = got?;
    waiter.release(token).await?;
    if at < killed {
        return Err("the waiter held the lease before the holder was killed".into());
    }
    Ok((at - killed).as_secs_f64() * 1000.0)
}
