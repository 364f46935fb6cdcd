//! The conformance checks themselves: a timed check takes its slack from
//! the store's measured round trip (`Suite::calibrate`), so it passes on a
//! correct but slow store, and it still fails on the deliberately broken
//! store it exists for. The stores here are the memory store behind the
//! test decorator (`FaultStore`), on a paused clock, so the latency is
//! exact and the run takes no real time.

use std::sync::Arc;
use std::time::Duration;

use worklease::conformance::{self, Suite};
use worklease::store::fault::FaultStore;
use worklease::store::memory::MemoryStore;

/// A memory store whose requests and replies each take `one_way`.
fn slow_store(one_way: Duration) -> Arc<FaultStore> {
    let store = Arc::new(FaultStore::new(Arc::new(MemoryStore::new())));
    store.set_delay(one_way);
    store.set_reply_delay(one_way);
    store
}

async fn calibrated(store: Arc<FaultStore>) -> Suite {
    let mut suite = Suite::new(store);
    suite.paused = true;
    suite.calibrate().await;
    suite
}

/// Runs `check` on its own task and tells whether it panicked (a check
/// reports a broken property by panicking).
async fn fails<F>(check: F) -> bool
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    match tokio::spawn(check).await {
        Ok(()) => false,
        Err(e) => e.is_panic(),
    }
}

#[tokio::test(start_paused = true)]
async fn calibration_measures_the_round_trip() {
    let suite = calibrated(slow_store(Duration::from_millis(15))).await;
    assert_eq!(suite.round_trip, Duration::from_millis(30));
    assert_eq!(
        suite.slack(),
        Duration::from_millis(30) * conformance::ROUND_TRIP_FACTOR
    );
    let fast = calibrated(Arc::new(FaultStore::new(Arc::new(MemoryStore::new())))).await;
    assert_eq!(fast.round_trip, Duration::ZERO);
}

/// A correct store whose acquisition takes 30 ms, longer than the check's
/// bare 20.3 ms TTL (as moto's GET + conditional PUT can on a loaded
/// machine): the check passes, because its TTL grows with the measured
/// round trip.
#[tokio::test(start_paused = true)]
async fn the_phase_check_passes_on_a_slow_correct_store() {
    let suite = calibrated(slow_store(Duration::from_millis(15))).await;
    assert!(
        !fails(async move { conformance::deadline_holds_at_sub_millisecond_phase(&suite).await })
            .await,
        "the check failed a correct store"
    );
}

/// The bug the phase check exists for: a store that truncates the TTL to
/// whole milliseconds ends a 20.3 ms lease 0.3 ms before its holder's
/// deadline. On a store that answers at once the check catches it.
#[tokio::test(start_paused = true)]
async fn the_phase_check_catches_a_truncated_ttl() {
    let store = Arc::new(FaultStore::new(Arc::new(MemoryStore::new())));
    store.distort_ttl(|ttl| Duration::from_millis(ttl.as_millis() as u64));
    let suite = calibrated(store).await;
    assert!(
        fails(async move { conformance::deadline_holds_at_sub_millisecond_phase(&suite).await })
            .await,
        "the check passed a store that truncates TTLs to milliseconds"
    );
}

/// The slack does not hide a store that frees leases early by more than a
/// round trip: at 30 ms per acquisition, a store that keeps half the TTL
/// is caught.
#[tokio::test(start_paused = true)]
async fn the_phase_check_catches_an_early_end_on_a_slow_store() {
    let store = slow_store(Duration::from_millis(15));
    store.distort_ttl(|ttl| ttl / 2);
    let suite = calibrated(store).await;
    assert!(
        fails(async move { conformance::deadline_holds_at_sub_millisecond_phase(&suite).await })
            .await,
        "the check passed a slow store that keeps half the TTL"
    );
}

/// The precision check on the same stores: it passes the slow correct one
/// and catches one that ends a 1500 ms lease at 1200 ms.
#[tokio::test(start_paused = true)]
async fn the_precision_check_passes_slow_stores_and_catches_early_ends() {
    let suite = calibrated(slow_store(Duration::from_millis(15))).await;
    assert!(
        !fails(async move { conformance::ttl_precision(&suite).await }).await,
        "the check failed a correct slow store"
    );
    let store = slow_store(Duration::from_millis(15));
    store.distort_ttl(|ttl| ttl * 4 / 5);
    let suite = calibrated(store).await;
    assert!(
        fails(async move { conformance::ttl_precision(&suite).await }).await,
        "the check passed a store that ends leases at 80% of their TTL"
    );
}
