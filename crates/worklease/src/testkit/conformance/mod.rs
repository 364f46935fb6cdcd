//! The shared conformance suite (feature `testkit`): one `async fn` per
//! property of the store contract (S1–S5, L1 and bad input of the crate docs), each
//! taking a store, as `object_store`'s `integration.rs` does. A new
//! guarantee is one new function here, and every store gets it through
//! [`conformance_tests!`](crate::conformance_tests).
//!
//! The checks measure time with tokio's clock and wait with
//! [`tokio::time::sleep`]: on a paused runtime (`start_paused = true`) they
//! run in no real time; on a real runtime (servers whose clock cannot be
//! paused) they sleep for real, so keep [`Suite::ttl`] short there. Every
//! check uses fresh work IDs under a random prefix, so checks may share a
//! store, also with other test runs.
//!
//! Checks panic with a message naming the property when a store breaks it.
//!
//! # A stable surface for store authors
//!
//! [`Suite`] (its fields and methods), the check functions,
//! [`conformance_tests!`](crate::conformance_tests) and the constants are
//! public API under SemVer: a minor release does not remove or change
//! them. A minor release may add checks (a new guarantee is a new check),
//! and a new check can fail a store that passed before: the changelog
//! lists added checks under "Conformance". `docs/writing-a-store.md` in
//! the repository is the store author's guide; `examples/third-party-store`
//! runs this suite from a crate outside the workspace.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::store::LeaseStore;
use crate::{AcquireOptions, Config, Leases, Token, WorkId};

mod batch;
mod cancel;
mod election;
mod fair;
mod gc;
mod leases;
mod observe;
mod semaphore;
mod stress;

pub use batch::*;
pub use cancel::*;
pub use election::*;
pub use fair::*;
pub use gc::*;
pub use leases::*;
pub use observe::*;
pub use semaphore::*;
pub use stress::concurrent_stress;

/// How many acquisitions [`Suite::calibrate`] times.
pub const CALIBRATION_CYCLES: usize = 5;

/// How many measured round trips [`Suite::slack`] allows: enough for a
/// check's few sequential store calls and a loaded machine's scheduling
/// noise around them.
pub const ROUND_TRIP_FACTOR: u32 = 8;

/// The store under test and the TTL the checks use.
#[derive(Clone)]
pub struct Suite {
    /// The store.
    pub store: Arc<dyn LeaseStore>,
    /// The lease TTL of the checks; default 1500 ms (a store with a coarser
    /// clock must still keep it: TTLs have millisecond precision).
    pub ttl: Duration,
    /// Whether the checks run on a paused tokio clock (set by
    /// [`conformance_tests!`](crate::conformance_tests)); checks that need
    /// sub-millisecond steps move the clock by hand then.
    pub paused: bool,
    /// How much later than its TTL the store may end a lease; default
    /// zero (millisecond precision). A store whose clock counts in coarser
    /// steps declares it: etcd rounds TTLs up to whole seconds (and to its
    /// minimum lease TTL) and ends expired leases on a periodic sweep.
    /// Checks that wait for an expiry wait this much longer, and the
    /// precision check allows it; no check accepts an early end.
    pub expiry_slack: Duration,
    /// The store's round trip as measured by [`Suite::calibrate`]: the
    /// median time of an acquisition on this store, from this process
    /// (zero until measured, and on a paused clock). The timed checks take
    /// their slack from it ([`Suite::slack`]), never from a constant that
    /// passed on one machine: a loaded CI machine or a slow server
    /// (moto answers in milliseconds, consensus stores in tens) gets
    /// proportionally more room, a fast one keeps tight bounds.
    pub round_trip: Duration,
    /// Whether the store deletes ended leases ([`LeaseStore::delete_ended`],
    /// garbage collection); default true. A store that cannot delete
    /// safely (an object store without a conditional delete: Azure Blob,
    /// `object_store`'s in-memory store) sets it false: the gc checks then
    /// check that gc refuses with a store error, deletes nothing and keeps
    /// tokens increasing.
    pub deletes: bool,
    pub(crate) prefix: String,
}

impl std::fmt::Debug for Suite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Suite")
            .field("store", &self.store.kind())
            .field("ttl", &self.ttl)
            .field("paused", &self.paused)
            .finish_non_exhaustive()
    }
}

impl Suite {
    /// A suite over `store` with the default TTL.
    pub fn new(store: Arc<dyn LeaseStore>) -> Self {
        Self {
            store,
            ttl: Duration::from_millis(1500),
            paused: false,
            expiry_slack: Duration::ZERO,
            round_trip: Duration::ZERO,
            deletes: true,
            prefix: format!("conformance-{:08x}", rand::random::<u32>()),
        }
    }

    /// Measures [`Suite::round_trip`]: the median duration of
    /// [`CALIBRATION_CYCLES`] acquisitions (each followed by its release)
    /// of a calibration work ID under the suite's prefix.
    /// [`conformance_tests!`](crate::conformance_tests) calls it before
    /// every check; a store author who builds a [`Suite`] by hand calls it
    /// once, or sets the field.
    ///
    /// # Panics
    /// When the store cannot acquire and release a fresh work ID: no check
    /// could pass then, and the message names the store error.
    pub async fn calibrate(&mut self) {
        let leases = self.holder("calibration");
        let id = self.work_id("calibration");
        let mut times = Vec::with_capacity(CALIBRATION_CYCLES);
        for _ in 0..CALIBRATION_CYCLES {
            let start = tokio::time::Instant::now();
            let token = leases
                .acquire(&id, fast())
                .await
                .unwrap_or_else(|e| panic!("calibration: acquire on the store failed: {e}"));
            times.push(start.elapsed());
            leases
                .release(token)
                .await
                .unwrap_or_else(|e| panic!("calibration: release on the store failed: {e}"));
        }
        times.sort();
        self.round_trip = times[times.len() / 2];
    }

    /// How much later than its ideal moment a timed step of a check may
    /// complete on this store: the store's [`Suite::expiry_slack`] plus
    /// [`ROUND_TRIP_FACTOR`] measured round trips ([`Suite::round_trip`]).
    /// A bound of the form "within one poll interval" becomes "within one
    /// poll interval plus the slack"; the bug such a bound exists for (a
    /// waiter that sleeps a TTL, a lease freed early) is still caught as
    /// long as it costs more than the slack, which the checks' TTLs and
    /// poll intervals ensure for any store that answers in tens of ms.
    pub fn slack(&self) -> Duration {
        self.expiry_slack + self.round_trip * ROUND_TRIP_FACTOR
    }

    /// Lets `d` pass: by moving a paused clock (precisely, below the
    /// timer's millisecond resolution), or by sleeping.
    pub async fn pass(&self, d: Duration) {
        if self.paused {
            tokio::time::advance(d).await;
        } else {
            tokio::time::sleep(d).await;
        }
    }

    /// A fresh work ID for one check.
    pub fn work_id(&self, name: &str) -> String {
        format!("{}/{name}-{:08x}", self.prefix, rand::random::<u32>())
    }

    /// A [`Leases`] handle for `holder` on the store.
    pub fn holder(&self, holder: &str) -> Leases {
        self.holder_on(self.store.clone(), holder)
    }

    pub(crate) fn holder_on(&self, store: Arc<dyn LeaseStore>, holder: &str) -> Leases {
        Leases::new(store, Config::new(holder, self.ttl)).expect("valid test config")
    }

    /// Waits until a lease acquired before now has expired by every clock:
    /// its TTL from now, plus the store's [`Suite::slack`], plus a little.
    pub(crate) async fn outlive(&self) {
        tokio::time::sleep(self.ttl + self.slack() + Duration::from_millis(20)).await;
    }

    pub(crate) async fn info(&self, work_id: &str) -> Option<crate::LeaseInfo> {
        let id = WorkId::new(work_id).expect("valid work ID");
        self.store
            .inspect(&[id])
            .await
            .expect("inspect")
            .into_iter()
            .next()
    }
}

pub(crate) fn fast() -> AcquireOptions {
    AcquireOptions::new()
}

#[track_caller]
pub(crate) fn assert_fenced<T: std::fmt::Debug>(r: crate::Result<T>, what: &str, token: &Token) {
    match r {
        Err(Error::Fenced {
            work_id,
            holder_id,
            fencing_token,
        }) => assert_names(what, token, (&work_id, &holder_id, fencing_token)),
        other => panic!("S3: {what} with a taken-over token must fail with Fenced, got {other:?}"),
    }
}

#[track_caller]
pub(crate) fn assert_expired<T: std::fmt::Debug>(r: crate::Result<T>, what: &str, token: &Token) {
    match r {
        Err(Error::Expired {
            work_id,
            holder_id,
            fencing_token,
        }) => assert_names(what, token, (&work_id, &holder_id, fencing_token)),
        other => panic!(
            "S3: {what} with an expired, untaken token must fail with Expired, got {other:?}"
        ),
    }
}

/// A `Fenced` or `Expired` error names the stale token's work ID, its
/// holder (the caller, so an operator can tell which holder was stale)
/// and its fencing token.
#[track_caller]
fn assert_names(what: &str, token: &Token, named: (&str, &str, u64)) {
    let expected = (
        token.work_id().as_str(),
        token.holder_id().as_str(),
        token.fencing_token(),
    );
    assert_eq!(
        named, expected,
        "the error of {what} must name the stale token's work ID, holder ID and fencing token"
    );
}
