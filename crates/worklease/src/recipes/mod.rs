//! The recipes of the Go original's higher packages (`worker`, `leader`,
//! `pool`, `checkpoint`), built on the lease API and the primitives: a
//! runner that does one piece of work under a lease, the one-call leader,
//! a pool that covers a fixed set of work IDs, typed checkpoints.

pub mod gc;
pub mod leader;
pub mod once;
pub mod pool;
pub mod runner;
#[cfg(feature = "serde")]
pub mod typed;
