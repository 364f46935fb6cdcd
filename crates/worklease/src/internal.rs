//! The work IDs worklease keeps for itself beside a user's own: a fair
//! line's queue and waiter leases (ADR 0015), a semaphore's line target
//! an election's step-down requests (issue 19) and a work ID's run-once
//! record (issue 37). `worklease status` hides them unless asked, and the
//! entry points that take a user's work ID (acquisitions, batches,
//! elections, pools) refuse them, so that a user's lease never collides
//! with one of them.

use crate::error::InvalidInput;
use crate::limits::WorkId;

// The reserved endings are defined here, below every layer that uses
// them, and re-exported where users look for them (`fair`, `semaphore`,
// `election`): the layer that reserves a name and this check share one
// definition.

/// The suffix of a target's queue lease.
pub const QUEUE_SUFFIX: &str = "/fair-queue";

/// What follows a target in its waiters' lease work IDs
/// (`T/fair-waiter/<slot>`).
pub const WAITER_INFIX: &str = "/fair-waiter/";

/// What follows a semaphore's name in the target of its fair line
/// (`NAME/permit/line`: the line is `NAME/permit/line/fair-queue` and
/// `NAME/permit/line/fair-waiter/K`). A work ID ending so is worklease's
/// own ([`crate::is_internal_work_id`]): no user's lease has the
/// semaphore's line.
pub const LINE_SUFFIX: &str = "/permit/line";

/// What follows the election's name in the work ID of its requests.
pub const STEP_DOWN_SUFFIX: &str = "/step-down";

/// What follows a work ID in the work ID of its run-once record
/// ([`crate::once`]).
pub const FINISHED_SUFFIX: &str = "/finished";

/// Whether `work_id` names a lease worklease keeps for itself next to a
/// user's lease, semaphore or election: `T/fair-queue`,
/// `T/fair-waiter/<slot>`, `S/permit/line`, `E/step-down` or
/// `W/finished`.
///
/// ```
/// assert!(worklease::is_internal_work_id("jobs/7/fair-waiter/3"));
/// assert!(worklease::is_internal_work_id("scheduler/step-down"));
/// assert!(!worklease::is_internal_work_id("jobs/7"));
/// ```
pub fn is_internal_work_id(work_id: &str) -> bool {
    reserved_for(work_id).is_some()
}

/// What `work_id` is kept for, and the work ID or election it belongs to.
fn reserved_for(work_id: &str) -> Option<(&'static str, &str)> {
    if let Some((target, slot)) = work_id.rsplit_once(WAITER_INFIX) {
        if !target.is_empty() && !slot.is_empty() && slot.bytes().all(|b| b.is_ascii_digit()) {
            return Some(("a waiter in the fair line of", target));
        }
    }
    if let Some(target) = work_id.strip_suffix(QUEUE_SUFFIX) {
        return Some(("the fair line of", target));
    }
    if let Some(semaphore) = work_id.strip_suffix(LINE_SUFFIX) {
        return Some(("the fair line of the semaphore", semaphore));
    }
    if let Some(election) = work_id.strip_suffix(STEP_DOWN_SUFFIX) {
        return Some(("the step-down requests of the election", election));
    }
    if let Some(target) = work_id.strip_suffix(FINISHED_SUFFIX) {
        if !target.is_empty() {
            return Some(("the run-once record of", target));
        }
    }
    None
}

/// A work ID given by a user for a lease, election, semaphore or pool:
/// valid ([`WorkId::new`]) and not one of worklease's own
/// ([`is_internal_work_id`]). What [`crate::Leases::acquire`] and the
/// other entry points check; a program can check its input with it before
/// it opens a store.
///
/// ```
/// assert!(worklease::user_work_id("jobs/7").is_ok());
/// assert!(worklease::user_work_id("jobs/fair-queue").is_err());
/// ```
///
/// # Errors
/// [`InvalidInput`] naming the limit a work ID breaks (empty, over
/// [`crate::limits::MAX_WORK_ID_BYTES`], a control character), and
/// [`InvalidInput::ReservedWorkId`] for a reserved one.
pub fn user_work_id(work_id: &str) -> Result<WorkId, InvalidInput> {
    let id = WorkId::new(work_id)?;
    match reserved_for(work_id) {
        Some((purpose, owner)) => Err(InvalidInput::ReservedWorkId {
            work_id: work_id.to_owned(),
            purpose,
            owner: owner.to_owned(),
        }),
        None => Ok(id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_work_ids_are_refused_and_name_their_owner() {
        for (id, owner) in [
            ("jobs/fair-queue", "jobs"),
            ("jobs/fair-waiter/3", "jobs"),
            ("sched/step-down", "sched"),
            ("pool/permit/line", "pool"),
            ("nightly/finished", "nightly"),
        ] {
            let e = user_work_id(id).unwrap_err();
            assert!(
                matches!(&e, InvalidInput::ReservedWorkId { owner: o, .. } if o == owner),
                "{id}: {e:?}"
            );
            assert!(e.to_string().contains(id), "{e}");
        }
        for id in [
            "jobs",
            "jobs/fair-waiter/x",
            "fair-queue",
            "jobs/step-down-2",
        ] {
            assert!(user_work_id(id).is_ok(), "{id}");
        }
        assert!(matches!(
            user_work_id(""),
            Err(InvalidInput::EmptyWorkId { .. })
        ));
    }
}
