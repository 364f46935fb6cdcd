//! The [`conformance_tests!`](crate::conformance_tests) macro: every
//! check of [`crate::conformance`] as a test of a store's test file. Kept
//! beside the suite's module, not in it, so that the macro is documented
//! once, at the crate root where `#[macro_export]` puts it.

/// Instantiates every conformance check as its own `#[tokio::test]` for a
/// store. `$make` is an async block or expression giving a
/// [`Suite`](crate::conformance::Suite);
/// `$paused` chooses a paused tokio clock (stores whose clock follows
/// tokio's) or real time (servers).
///
/// ```no_run
/// // In a store's tests (here: tests/conformance.rs of this crate).
/// worklease::conformance_tests!(memory, paused = true, async {
///     worklease::conformance::Suite::new(std::sync::Arc::new(
///         worklease::store::memory::MemoryStore::new(),
///     ))
/// });
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($name:ident, paused = $paused:tt, $make:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::conformance_tests!(@one $paused, $make, bad_input);
            $crate::conformance_tests!(@one $paused, $make, mutual_exclusion);
            $crate::conformance_tests!(@one $paused, $make, fencing_tokens_increase);
            $crate::conformance_tests!(@one $paused, $make, stale_writers_lose);
            $crate::conformance_tests!(@one $paused, $make, checkpoints_survive);
            $crate::conformance_tests!(@one $paused, $make, handoff_flag);
            $crate::conformance_tests!(@one $paused, $make, gc_keeps_fencing_tokens_increasing);
            $crate::conformance_tests!(@one $paused, $make, gc_never_deletes_a_live_lease);
            $crate::conformance_tests!(@one $paused, $make, gc_races_acquisitions);
            $crate::conformance_tests!(@one $paused, $make, gc_prefix_and_dry_run);
            $crate::conformance_tests!(@one $paused, $make, inspect_checkpoint_reads_any_lease);
            $crate::conformance_tests!(@one $paused, $make, liveness);
            $crate::conformance_tests!(@one $paused, $make, waiting_can_be_cancelled);
            $crate::conformance_tests!(@one $paused, $make, dropped_acquisitions_leave_no_lease);
            $crate::conformance_tests!(@one $paused, $make, settled_drops_leave_no_lease_at_once);
            $crate::conformance_tests!(@one $paused, $make, ttl_precision);
            $crate::conformance_tests!(@one $paused, $make, renewal_survives_transient_failure);
            $crate::conformance_tests!(@one $paused, $make, renewal_lost_when_unreachable);
            $crate::conformance_tests!(@one $paused, $make, renewal_lost_when_fenced);
            $crate::conformance_tests!(@one $paused, $make, renewal_sees_a_revocation_at_once);
            $crate::conformance_tests!(@one $paused, $make, deadline_holds_at_sub_millisecond_phase);
            $crate::conformance_tests!(@one $paused, $make, batch_bad_input);
            $crate::conformance_tests!(@one $paused, $make, batch_acquisition);
            $crate::conformance_tests!(@one $paused, $make, batch_mixed_outcomes);
            $crate::conformance_tests!(@one $paused, $make, batch_reply_lost);
            $crate::conformance_tests!(@one $paused, $make, session_many_leases_one_revoked);
            $crate::conformance_tests!(@one $paused, $make, batch_acquisition_races_single);
            $crate::conformance_tests!(@one $paused, $make, semaphore_never_more_than_n);
            $crate::conformance_tests!(@one $paused, $make, semaphore_fencing_per_permit);
            $crate::conformance_tests!(@one $paused, $make, semaphore_dead_holder_frees_its_permit);
            $crate::conformance_tests!(@one $paused, $make, fair_order_with_newcomers);
            $crate::conformance_tests!(@one $paused, $make, fair_dead_waiter_does_not_stall);
            $crate::conformance_tests!(@one $paused, $make, fair_semaphore_line_is_its_own);
            $crate::conformance_tests!(@one $paused, $make, election_one_leader_and_fast_handover);
            $crate::conformance_tests!(@one $paused, $make, election_event_stream);
            $crate::conformance_tests!(@one $paused, $make, election_leader_cut_off);
            $crate::conformance_tests!(@one $paused, $make, election_dropped_lead_releases);
            $crate::conformance_tests!(@one $paused, $make, election_bad_config);
            $crate::conformance_tests!(@one $paused, $make, election_observe_follows_every_change);
            $crate::conformance_tests!(@one $paused, $make, election_resign_hands_over_without_overlap);
            $crate::conformance_tests!(@one $paused, $make, election_step_down_request_is_honoured);
            $crate::conformance_tests!(@one $paused, $make, election_priority_prefers_and_equals_never_swing);
            $crate::conformance_tests!(@one $paused, $make, election_term_ends_when_its_record_cannot_be_written);

            #[tokio::test(start_paused = $paused)]
            async fn concurrent_stress() {
                let mut suite = $make.await;
                suite.paused = $paused;
                suite.calibrate().await;
                $crate::conformance::concurrent_stress(&suite, 8, 40).await;
            }
        }
    };
    (@one $paused:tt, $make:expr, $check:ident) => {
        #[tokio::test(start_paused = $paused)]
        async fn $check() {
            let mut suite = $make.await;
            suite.paused = $paused;
            suite.calibrate().await;
            $crate::conformance::$check(&suite).await;
        }
    };
}
