//! Garbage collection of ended leases (`worklease gc`): deletes the records
//! of leases that ended long enough ago, on any store, without ever
//! lowering a fencing token (S2 survives deletion) and without ever
//! deleting a live lease (`docs/adr/0023-gc-and-the-token-floor.md`).
//!
//! ```no_run
//! # async fn demo(store: &dyn worklease::LeaseStore) -> worklease::Result<()> {
//! use std::time::Duration;
//! use worklease::gc::{collect, GcOptions};
//!
//! // What a nightly cron job runs: every lease that ended 30 days ago or more.
//! let report = collect(store, &GcOptions::older_than(Duration::from_secs(30 * 86_400))).await?;
//! for lease in &report.collected {
//!     println!("deleted {}", lease.work_id);
//! }
//! # Ok(())
//! # }
//! ```

use std::time::{Duration, SystemTime};

use crate::error::Result;
use crate::store::{ExpiryClock, LeaseEnd, LeaseInfo, LeaseStore};

/// What [`collect`] deletes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcOptions {
    /// The least age of a lease's end for it to be deleted: the time from
    /// the lease's [`LeaseInfo::expires_at`] (its release, revocation or
    /// expiry, by the wall clock of the store or of its writer) to this
    /// host's wall clock. A bookkeeping age only: whether a lease is live
    /// is decided by the store ([`LeaseStore::delete_ended`]), never by it.
    /// Zero deletes every ended lease.
    pub older_than: Duration,
    /// Only work IDs that start with these bytes (a plain prefix, no
    /// pattern); `None` for every work ID.
    pub prefix: Option<String>,
    /// Deletes nothing: the report lists what would be deleted.
    pub dry_run: bool,
}

impl GcOptions {
    /// Every work ID whose lease ended `older_than` ago or more, deleted
    /// for real.
    pub fn older_than(older_than: Duration) -> Self {
        Self {
            older_than,
            prefix: None,
            dry_run: false,
        }
    }
}

/// What [`collect`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// The leases deleted (with [`GcOptions::dry_run`]: that would be
    /// deleted), as they were listed, in work-ID order.
    pub collected: Vec<LeaseInfo>,
    /// Ended leases old enough that the store kept because they changed
    /// since they were listed (acquired again, or a newer acquisition).
    pub changed: usize,
    /// Leases under the prefix that were kept: live, ended too recently,
    /// or expired on a store that judges expiry by observation (one look
    /// cannot prove that its holder stopped renewing).
    pub kept: usize,
}

/// Deletes the records of the leases under `options.prefix` that ended
/// at least `options.older_than` ago: released, revoked and expired leases
/// with their checkpoints and hand-off facts, including a pool's
/// membership and done records and worklease's own internal records (fair
/// lines, step-down requests) once they ended. Never a live lease: each
/// deletion is the store's own atomic [`LeaseStore::delete_ended`],
/// conditional on the listed acquisition and decided by the store's
/// clock, so a lease acquired meanwhile is kept. A store whose expiry is
/// judged by observation ([`ExpiryClock::Observation`]: S3, Azure,
/// DynamoDB) deletes only released and revoked leases.
///
/// After a deletion the work ID is unknown to the store (no checkpoint,
/// no previous holder), and its next acquisition gets a fencing token
/// larger than every earlier one (S2). A pool's done record that is
/// deleted makes its work ID unfinished again: choose `older_than` above
/// the time a pool runs.
///
/// # Errors
/// [`crate::Error::Store`] when listing or a deletion fails; the leases
/// deleted before the failure stay deleted, and running again is safe.
pub async fn collect<S: LeaseStore + ?Sized>(store: &S, options: &GcOptions) -> Result<GcReport> {
    let now = SystemTime::now();
    let observation = store.expiry_clock() == ExpiryClock::Observation;
    let mut report = GcReport::default();
    let mut listed = store.inspect(&[]).await?;
    listed.sort_by(|a, b| a.work_id.cmp(&b.work_id));
    for info in listed {
        if let Some(prefix) = &options.prefix {
            if !info.work_id.as_str().starts_with(prefix.as_str()) {
                continue;
            }
        }
        let provably_ended = match info.ended {
            None => false,
            Some(LeaseEnd::Expired) => info.expired && !observation,
            Some(LeaseEnd::Released | LeaseEnd::Revoked) => info.expired,
        };
        let old = now
            .duration_since(info.expires_at)
            .is_ok_and(|age| age >= options.older_than)
            // A release or expiry stamped in the future (another host's
            // clock ahead of ours) counts as age zero.
            || options.older_than.is_zero();
        if !provably_ended || !old {
            report.kept += 1;
            continue;
        }
        if options.dry_run {
            report.collected.push(info);
            continue;
        }
        if store
            .delete_ended(&info.work_id, info.fencing_token)
            .await?
        {
            tracing::info!(
                work_id = info.work_id.as_str(),
                fencing_token = info.fencing_token,
                "gc: deleted an ended lease"
            );
            report.collected.push(info);
        } else {
            report.changed += 1;
        }
    }
    Ok(report)
}
