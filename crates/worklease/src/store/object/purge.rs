//! The operator's purge of old tombstones ([`purge_released`]).

use std::time::{Duration, SystemTime};

#[cfg(doc)]
use super::ObjectRegister;
use crate::error::Result;
use crate::limits::WorkId;
use crate::store::register::{Register, RegisterError, RegisterStore};
use crate::store::{LeaseEnd, LeaseStore};

/// An operator's purge: deletes the records of leases that were released
/// or revoked (tombstones) at least `older_than` ago, and returns their
/// work IDs. Live leases and expired ones (whose holder vanished) are kept.
///
/// After a purge the work ID is unknown to the store, and its next
/// acquisition gets fencing token 1 again, with no previous holder and no
/// checkpoint: purge only work IDs that are retired, or whose fenced
/// systems no longer hold tokens of them. The age is judged by the wall
/// clock of whoever released (as `status` shows it) against this host's:
/// it is a bookkeeping age, never used for lease safety.
///
/// Each deletion is conditional on the version that was judged (`DELETE`
/// with `If-Match`), so a lease acquired meanwhile is never deleted.
///
/// # Errors
/// [`crate::Error::Store`] when listing, reading or deleting fails, or the
/// register has no conditional delete ([`ObjectRegister::new`]); the work
/// IDs purged before the failure stay purged.
pub async fn purge_released<R: Register>(
    store: &RegisterStore<R>,
    older_than: Duration,
) -> Result<Vec<WorkId>> {
    let now = SystemTime::now();
    let old = |info: &crate::store::LeaseInfo| {
        matches!(info.ended, Some(LeaseEnd::Released | LeaseEnd::Revoked))
            && now
                .duration_since(info.expires_at)
                .is_ok_and(|age| age >= older_than)
    };
    let mut purged = Vec::new();
    for info in store.inspect(&[]).await? {
        if !old(&info) {
            continue;
        }
        let id = info.work_id;
        // Read the handle first, then judge again: a deletion conditional
        // on this handle succeeds only if what was judged is still there
        // (handles never repeat: every write changes the bytes).
        let handle = match store.register().read(&id).await {
            Ok(Some((_, handle))) => handle,
            Ok(None) => continue,
            Err(RegisterError::Store(e)) => return Err(e.into()),
            Err(RegisterError::Invalid(e)) => return Err(e.into()),
            Err(RegisterError::Conflict) => continue,
        };
        let still = store.inspect(std::slice::from_ref(&id)).await?;
        if !still.first().is_some_and(old) {
            continue;
        }
        match store.register().delete(&id, &handle).await {
            Ok(()) => {
                tracing::info!(
                    work_id = id.as_str(),
                    "purged the tombstone of a released lease"
                );
                purged.push(id);
            }
            Err(RegisterError::Conflict) => {}
            Err(RegisterError::Store(e)) => return Err(e.into()),
            Err(RegisterError::Invalid(e)) => return Err(e.into()),
        }
    }
    Ok(purged)
}
