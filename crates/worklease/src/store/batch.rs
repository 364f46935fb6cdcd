//! The batch operations of the store contract, done one lease at a time:
//! the default bodies of [`LeaseStore::renew_many`],
//! [`LeaseStore::acquire_many`] and [`LeaseStore::release_many`], for a
//! store that has no batch operation of its own (a third-party store, a
//! register such as S3). Up to [`EACH_CONCURRENCY`] single calls run at
//! once, so a batch costs about `len / EACH_CONCURRENCY` round trips; a
//! store that can do better (one transaction, one statement, one script)
//! overrides the trait methods.
//!
//! Each lease's outcome is what its single call returned; the outer
//! `Result` is always `Ok` here (a store failure is one lease's outcome).

use std::time::{Duration, SystemTime};

use futures_util::{stream, StreamExt};

use crate::error::Result;
use crate::limits::{HolderId, WorkId};
use crate::store::{Grant, LeaseRef, LeaseStore};

/// How many single calls a default batch runs at once.
pub const EACH_CONCURRENCY: usize = 16;

/// The default number of leases one batch call of a store names
/// ([`LeaseStore::max_batch`]).
pub const DEFAULT_MAX_BATCH: usize = 256;

/// Renews each of `leases` with [`LeaseStore::renew`], up to
/// [`EACH_CONCURRENCY`] at once; the outcomes in the order of `leases`.
pub async fn renew_each<S: LeaseStore + ?Sized>(
    store: &S,
    leases: &[LeaseRef<'_>],
    ttl: Duration,
) -> Result<Vec<Result<SystemTime>>> {
    // The calls' futures are made first (not yet running): a closure
    // inside the stream would not be general enough over the lifetimes.
    let calls: Vec<_> = leases.iter().map(|l| store.renew(*l, ttl)).collect();
    Ok(stream::iter(calls)
        .buffered(EACH_CONCURRENCY)
        .collect()
        .await)
}

/// Releases each of `leases` with [`LeaseStore::release`], up to
/// [`EACH_CONCURRENCY`] at once; the outcomes in the order of `leases`.
pub async fn release_each<S: LeaseStore + ?Sized>(
    store: &S,
    leases: &[LeaseRef<'_>],
) -> Result<Vec<Result<()>>> {
    let calls: Vec<_> = leases.iter().map(|l| store.release(*l)).collect();
    Ok(stream::iter(calls)
        .buffered(EACH_CONCURRENCY)
        .collect()
        .await)
}

/// Acquires up to `max` of `work_ids` with [`LeaseStore::acquire`], trying
/// them in order: at most `max − granted` (and [`EACH_CONCURRENCY`]) at
/// once, so never more than `max` grants. The outcomes of the work IDs
/// tried, in order: a prefix of `work_ids`.
pub async fn acquire_each<S: LeaseStore + ?Sized>(
    store: &S,
    work_ids: &[WorkId],
    holder_id: &HolderId,
    ttl: Duration,
    max: usize,
) -> Result<Vec<Result<Grant>>> {
    let mut out = Vec::new();
    let mut granted = 0;
    let mut rest = work_ids;
    while granted < max && !rest.is_empty() {
        let n = (max - granted).min(EACH_CONCURRENCY).min(rest.len());
        let (now, later) = rest.split_at(n);
        rest = later;
        let calls: Vec<_> = now
            .iter()
            .map(|id| store.acquire(id, holder_id, ttl))
            .collect();
        let results: Vec<Result<Grant>> = futures_util::future::join_all(calls).await;
        granted += results.iter().filter(|r| r.is_ok()).count();
        out.extend(results);
    }
    Ok(out)
}

/// Renewal verdicts as [`LeaseStore::renew_many`] answers them: each
/// renewed lease's new wall-clock expiry (`ttl` from now, read once the
/// store has answered), each refused one's error. Used by the SQL stores.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn renewed(verdicts: Vec<Result<()>>, ttl: Duration) -> Vec<Result<SystemTime>> {
    let expires_at = SystemTime::now() + ttl;
    verdicts
        .into_iter()
        .map(|r| r.map(|()| expires_at))
        .collect()
}

/// The work IDs of `leases` whose release succeeded (`outcomes` in the
/// order of `leases`): those whose waiters a store wakes after a batch
/// release.
pub(crate) fn released<'a>(
    leases: &'a [LeaseRef<'_>],
    outcomes: &'a [Result<()>],
) -> impl Iterator<Item = &'a WorkId> {
    leases
        .iter()
        .zip(outcomes)
        .filter(|(_, r)| r.is_ok())
        .map(|(l, _)| l.work_id)
}

/// Acquires `work_ids` one after another, in order, until `max` are
/// granted, within one step of a store (under its lock, in one
/// transaction): the outcomes of the work IDs tried, a prefix of
/// `work_ids`. `acquire` answers one work ID's outcome, or an error that
/// fails the whole batch.
pub(crate) fn acquire_in_turn(
    work_ids: &[WorkId],
    max: usize,
    mut acquire: impl FnMut(&WorkId) -> Result<Result<Grant>>,
) -> Result<Vec<Result<Grant>>> {
    let mut out = Vec::new();
    let mut granted = 0;
    for id in work_ids {
        if granted == max {
            break;
        }
        let r = acquire(id)?;
        granted += usize::from(r.is_ok());
        out.push(r);
    }
    Ok(out)
}
