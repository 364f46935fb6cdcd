//! The scenarios of one store, in the order asked for, each on a
//! namespace of its own; and their progress lines.

use clap::ValueEnum;
use worklease::store::ExpiryClock;

use crate::ops::WorkSet;
use crate::results::{HandoffMode, HandoffRow, OpRow, Run, Skipped, StoreInfo};
use crate::stores::Bench;
use crate::{
    election, failover, fair_handoff, handoff, handoff_processes, ops, pool, scale, semaphore,
    BoxError, Plan, Result,
};

/// The scenarios (`--scenarios`, by these names in kebab case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// acquire → release, fresh and reused work IDs.
    Cycle,
    /// renew of held leases.
    Renew,
    /// checkpoint of held leases.
    Checkpoint,
    /// release → the next holder among N waiters.
    Handoff,
    /// a SIGKILLed holder's lease taken by a waiter.
    Failover,
    /// one process holding and renewing many leases.
    Scale,
    /// permit acquire → release beside the lease cycle ([`semaphore`]).
    Semaphore,
    /// release → the next fair waiter ([`fair_handoff`]).
    FairHandoff,
    /// an election's leader resigns or is asked to step down → the next
    /// leader, and an observer's view ([`election`]).
    Election,
    /// three `worklease pool` processes covering N work IDs on SQLite,
    /// beside spawning the children directly ([`pool`]).
    Pool,
}

impl Scenario {
    /// Its name on the command line (and in a run's skipped list).
    pub fn name(self) -> String {
        self.to_possible_value()
            .map_or_else(|| format!("{self:?}"), |v| v.get_name().to_string())
    }
}

/// A progress line for the rows of one figure.
pub fn progress(scenario: &str, rows: &[OpRow]) {
    let Some(first) = rows.first() else {
        return;
    };
    let size = first.bytes.map(|b| format!(" {b} B")).unwrap_or_default();
    let parts: Vec<String> = rows
        .iter()
        .map(|r| {
            let errors = if r.errors > 0 {
                format!(
                    " ({} errors: {})",
                    r.errors,
                    r.first_error.as_deref().unwrap_or("")
                )
            } else {
                String::new()
            };
            format!(
                "{} {:.0}/s p99 {:.2} ms{errors}",
                r.variant.as_str(),
                r.ops_per_sec,
                r.latency.p99_us as f64 / 1000.0
            )
        })
        .collect();
    eprintln!(
        "  {scenario}{size} {} client(s): {}",
        first.clients,
        parts.join(" | ")
    );
}

/// A progress line for one hand-off row.
pub fn handoff_progress(row: &HandoffRow) {
    eprintln!(
        "  handoff {} waiter(s) {}{}: p50 {:.2} ms p99 {:.2} ms ({} samples, round trip {:.3} ms){}",
        row.waiters,
        row.mode.as_str(),
        if row.across_processes {
            " (other processes)"
        } else {
            ""
        },
        row.latency.p50_us as f64 / 1000.0,
        row.latency.p99_us as f64 / 1000.0,
        row.latency.count,
        row.round_trip_us as f64 / 1000.0,
        errors_note(row.errors, row.first_error.as_deref())
    );
}

/// `, N errors: FIRST` for a progress line, or nothing without errors.
pub fn errors_note(errors: u64, first: Option<&str>) -> String {
    if errors > 0 {
        format!(", {errors} errors: {}", first.unwrap_or(""))
    } else {
        String::new()
    }
}

/// Runs the scenarios on one store, each on a namespace of its own. A
/// scenario that fails is recorded as skipped, with its error, and the
/// next one runs.
pub async fn run_store(
    bench: &dyn Bench,
    plan: &Plan,
    scenarios: &[Scenario],
    run: &mut Run,
) -> Result<()> {
    let name = bench.name();
    {
        let probe = bench.open("probe").await?;
        run.stores.push(StoreInfo {
            name: name.to_string(),
            url: bench.shown_url(),
            server: bench.server().await,
            baseline: probe.baseline.describe(),
            peer: probe.peer.as_ref().map(|p| p.describe()),
            register: probe.store.expiry_clock() == ExpiryClock::Observation,
        });
    }
    let register = run.stores.last().is_some_and(|s| s.register);
    let failed = |run: &mut Run, scenario: Scenario, e: BoxError| {
        eprintln!("  {} failed: {e}", scenario.name());
        run.skipped.push(Skipped {
            store: name.to_string(),
            scenario: Some(scenario.name()),
            reason: format!("failed: {e}"),
        });
    };
    for &scenario in scenarios {
        let result: Result<()> = async {
            match scenario {
                Scenario::Cycle => {
                    let opened = bench.open("cycle").await?;
                    for &c in &plan.cycle_clients {
                        let rows = ops::cycle(&opened, plan, c, WorkSet::Fresh).await?;
                        progress("cycle", &rows);
                        run.cycle.extend(rows);
                    }
                    let opened = bench.open("cycle_reused").await?;
                    let ids = ops::reused_ids(&opened, plan, plan.cycle_reused_ids).await?;
                    for &c in &plan.cycle_clients {
                        let rows = ops::cycle(&opened, plan, c, WorkSet::Reused(&ids)).await?;
                        progress("cycle (reused IDs)", &rows);
                        run.cycle_reused.extend(rows);
                    }
                }
                Scenario::Renew => {
                    let opened = bench.open("renew").await?;
                    for &c in &plan.op_clients {
                        let rows = ops::renew(&opened, plan, c).await?;
                        progress("renew", &rows);
                        run.renew.extend(rows);
                    }
                }
                Scenario::Checkpoint => {
                    let opened = bench.open("ckpt").await?;
                    for &bytes in &plan.checkpoint_sizes {
                        for &c in &plan.op_clients {
                            let rows = ops::checkpoint(&opened, plan, c, bytes).await?;
                            progress("checkpoint", &rows);
                            run.checkpoint.extend(rows);
                        }
                    }
                }
                Scenario::Handoff => {
                    let opened = bench.open("handoff").await?;
                    let rtt = handoff::round_trip(&opened, plan).await?;
                    for &n in &plan.handoff_waiters {
                        for mode in [HandoffMode::Push, HandoffMode::Poll, HandoffMode::Peer] {
                            if let Some(row) = handoff::handoff(&opened, plan, n, mode, rtt).await?
                            {
                                handoff_progress(&row);
                                run.handoff.push(row);
                            }
                        }
                    }
                    if bench.handoff_across_processes() {
                        for &n in &plan.handoff_waiters {
                            for mode in [HandoffMode::Push, HandoffMode::Poll] {
                                let row =
                                    handoff_processes::handoff(&opened, plan, n, mode, rtt).await?;
                                handoff_progress(&row);
                                run.handoff.push(row);
                            }
                        }
                    }
                }
                Scenario::Failover => {
                    let opened = bench.open("failover").await?;
                    let row = failover::failover(bench, &opened, plan).await?;
                    eprintln!(
                        "  failover TTL {} ms + poll {} ms: {:?} ms{}",
                        row.ttl_ms,
                        row.poll_ms,
                        row.trials_ms.iter().map(|t| t.round()).collect::<Vec<_>>(),
                        errors_note(row.errors, row.first_error.as_deref())
                    );
                    run.failover.push(row);
                }
                Scenario::Scale => scale::scenario(bench, plan, register, &mut run.scale).await?,
                Scenario::Semaphore => {
                    let opened = bench.open("semaphore").await?;
                    semaphore::scenario(&opened, plan, &mut run.semaphore).await?;
                }
                Scenario::FairHandoff => {
                    let opened = bench.open("fair_handoff").await?;
                    fair_handoff::scenario(&opened, plan, &mut run.fair_handoff).await?;
                }
                Scenario::Election => {
                    let opened = bench.open("election").await?;
                    election::scenario(&opened, plan, &mut run.election).await?;
                }
                Scenario::Pool => {
                    if let Some(why) = pool::scenario(bench, plan, &mut run.pool).await? {
                        eprintln!("  pool skipped: {why}");
                        run.skipped.push(Skipped {
                            store: name.to_string(),
                            scenario: Some(scenario.name()),
                            reason: why,
                        });
                    }
                }
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            failed(run, scenario, e);
        }
    }
    Ok(())
}
