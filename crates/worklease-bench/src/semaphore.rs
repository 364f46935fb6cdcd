//! Semaphore: permit acquire → release with a free permit
//! (`Semaphore::acquire(AcquireOptions::new())`, then `release`), at N =
//! 1, 16 and 256 permits, beside ours' lease cycle over reused work IDs
//! on the same store in the same [`compare`] (the baseline of issue 18's
//! goal: a permit cycle ≥ 0.9 × a lease cycle).
//!
//! **Each client has a semaphore of its own** (`sem-C-N-K`: C clients, N
//! permits, client K), so a permit is always free, at N = 1 too, and no
//! acquisition races another for a permit: the figure is the cost of
//! "any free one of these N" (`Leases::acquire_any`, one store call per
//! `max_batch` permits tried) against the cost of one given work ID. (One
//! shared semaphore with N ≥ clients would measure races for the same
//! permits instead, and could not run N = 1 at more than one client.)
//! Every permit is acquired and released once before the figures, as the
//! reused work IDs of the lease cycle are, so both go over rows that
//! exist.
//!
//! At N = [`Plan::semaphore_fair_permits`] the same cycle with fair
//! acquisition (`AcquireOptions::new().fair()`, on semaphores of their
//! own) is measured in the same comparison: reported, not a goal (ADR
//! 0015: its fast path is about four store calls).

use async_trait::async_trait;
use worklease::semaphore::Semaphore;
use worklease::{AcquireOptions, Config, Leases, WorkId};

use crate::measure::{compare, Client, Contestant};
use crate::ops::{self, WorkSet};
use crate::results::{PermitRow, Variant};
use crate::stores::Opened;
use crate::{Plan, Result};

/// acquire → release of a permit of the client's own semaphore.
struct PermitCycle {
    semaphore: Semaphore,
    options: AcquireOptions,
}

#[async_trait]
impl Client for PermitCycle {
    async fn op(&mut self) -> Result<()> {
        let token = self.semaphore.acquire(self.options.clone()).await?;
        self.semaphore.leases().release(token).await?;
        Ok(())
    }
}

/// `clients` permit cyclers, each over a semaphore of its own of
/// `permits` permits named `{prefix}-{clients}-{permits}-{k}`, every
/// permit acquired and released once.
async fn permit_clients(
    opened: &Opened,
    plan: &Plan,
    clients: usize,
    permits: usize,
    fair: bool,
) -> Result<Vec<Box<dyn Client>>> {
    let prefix = if fair { "semfair" } else { "sem" };
    let options = if fair {
        AcquireOptions::new().fair()
    } else {
        AcquireOptions::new()
    };
    let mut v: Vec<Box<dyn Client>> = Vec::with_capacity(clients);
    for k in 0..clients {
        let leases = Leases::new(
            opened.store.clone(),
            Config::new(format!("{prefix}-{k}"), plan.ttl),
        )?;
        let semaphore =
            Semaphore::new(leases, format!("{prefix}-{clients}-{permits}-{k}"), permits)?;
        seed(&semaphore).await?;
        v.push(Box::new(PermitCycle {
            semaphore,
            options: options.clone(),
        }));
    }
    Ok(v)
}

/// Acquires and releases every permit of `semaphore` once (in batches),
/// so that each has its row before the figures.
async fn seed(semaphore: &Semaphore) -> Result<()> {
    let leases = semaphore.leases();
    let ids = semaphore.permit_ids().iter().map(WorkId::as_str);
    let tokens = leases.acquire_many(ids, semaphore.permits()).await?;
    if tokens.len() != semaphore.permits() {
        return Err(format!(
            "only {} of the {} permits of {} were granted",
            tokens.len(),
            semaphore.permits(),
            semaphore.name()
        )
        .into());
    }
    for outcome in leases.release_many(tokens).await? {
        outcome?;
    }
    Ok(())
}

/// The semaphore scenario on one store: for each number of clients and
/// each N, the permit cycle (and at the fair N its fair variant) beside
/// the lease cycle over reused work IDs, measured alternately.
pub async fn scenario(opened: &Opened, plan: &Plan, rows: &mut Vec<PermitRow>) -> Result<()> {
    let ids = ops::reused_ids(opened, plan, plan.cycle_reused_ids).await?;
    let kind = opened.store.kind();
    for &clients in &plan.semaphore_clients {
        for &permits in &plan.semaphore_permits {
            let mut contestants = vec![Contestant::new(
                Variant::Ours,
                format!("Semaphore::acquire (fail fast) + release of a permit of the client's own semaphore of {permits}"),
                permit_clients(opened, plan, clients, permits, false).await?,
            )];
            let fair = permits == plan.semaphore_fair_permits;
            if fair {
                contestants.push(Contestant::new(
                    Variant::Ours,
                    format!("Semaphore::acquire(AcquireOptions::new().fair()) + release of a permit of the client's own semaphore of {permits}"),
                    permit_clients(opened, plan, clients, permits, true).await?,
                ));
            }
            contestants.push(Contestant::new(
                Variant::Baseline,
                format!(
                    "Leases::acquire + release of one of {} reused work IDs (at least {} per client, in turn)",
                    ids.len(),
                    ids.len() / clients.max(1)
                ),
                ops::cycle_clients(opened, plan, clients, WorkSet::Reused(&ids))?,
            ));
            compare(&mut contestants, plan.timing).await?;
            let figure: Vec<PermitRow> = contestants
                .iter()
                .enumerate()
                .map(|(i, c)| PermitRow {
                    permits,
                    fair: fair && i == 1,
                    op: c.tally.row(kind, clients, None, c.variant, &c.what),
                })
                .collect();
            progress(&figure);
            rows.extend(figure);
        }
    }
    Ok(())
}

/// A progress line for the rows of one figure.
fn progress(rows: &[PermitRow]) {
    let Some(first) = rows.first() else {
        return;
    };
    let parts: Vec<String> = rows
        .iter()
        .map(|r| {
            let who = match (r.op.variant, r.fair) {
                (Variant::Baseline, _) => "lease cycle",
                (_, true) => "fair permit",
                _ => "permit",
            };
            format!(
                "{who} {:.0}/s p99 {:.2} ms{}",
                r.op.ops_per_sec,
                r.op.latency.p99_us as f64 / 1000.0,
                crate::scenarios::errors_note(r.op.errors, r.op.first_error.as_deref())
            )
        })
        .collect();
    eprintln!(
        "  semaphore N = {} {} client(s): {}",
        first.permits,
        first.op.clients,
        parts.join(" | ")
    );
}
