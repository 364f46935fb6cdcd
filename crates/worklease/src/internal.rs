//! The work IDs worklease keeps for itself beside a user's own: a fair
//! line's queue and waiter leases (ADR 0015) and an election's step-down
//! requests (issue 19). `worklease status` hides them unless asked.

use crate::election::STEP_DOWN_SUFFIX;
use crate::fair::{QUEUE_SUFFIX, WAITER_INFIX};

/// Whether `work_id` names a lease worklease keeps for itself next to a
/// user's lease, semaphore or election: `T/fair-queue`,
/// `T/fair-waiter/<slot>` or `E/step-down`.
///
/// ```
/// assert!(worklease::is_internal_work_id("jobs/7/fair-waiter/3"));
/// assert!(worklease::is_internal_work_id("scheduler/step-down"));
/// assert!(!worklease::is_internal_work_id("jobs/7"));
/// ```
pub fn is_internal_work_id(work_id: &str) -> bool {
    let waiter = work_id
        .rsplit_once(WAITER_INFIX)
        .is_some_and(|(target, slot)| {
            !target.is_empty() && !slot.is_empty() && slot.bytes().all(|b| b.is_ascii_digit())
        });
    waiter || work_id.ends_with(QUEUE_SUFFIX) || work_id.ends_with(STEP_DOWN_SUFFIX)
}
