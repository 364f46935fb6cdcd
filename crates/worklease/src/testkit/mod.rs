//! The test kit: what a store's tests use to prove the contract. The
//! conformance suite every store passes and the deterministic fault
//! simulation (feature `testkit`), and the fuzz targets' entry points
//! (feature `fuzzing`, hidden). The test decorators that wrap a store
//! (`store::fault`, `store::proxy`) live beside the stores they wrap.

#[cfg(feature = "testkit")]
pub mod conformance;
#[cfg(feature = "testkit")]
mod conformance_tests;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
#[cfg(feature = "testkit")]
pub mod sim;
