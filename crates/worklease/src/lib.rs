//! # worklease
//!
//! Distributed work leases and leader election over real stores: at most
//! one holder per work ID, fencing tokens that only go up, checkpoints
//! handed from one holder to the next.
//!
//! The API follows the Go packages `worklease` (leases with checkpoints) and
//! `hoplock` (leader election over a compare-and-swap register); see
//! `SPEC.md` in the project's shared folder for the contract (S1–S5, L1)
//! every store keeps, and `docs/adr/` for the decisions behind it.
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use worklease::{store::memory::MemoryStore, AcquireOptions, Config, Leases, RenewalOptions};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> worklease::Result<()> {
//! let store = Arc::new(MemoryStore::new());
//! let leases = Leases::new(store, Config::new("worker-1", Duration::from_secs(15)))?;
//!
//! let token = leases.acquire("shard-7", AcquireOptions::new().wait_for_lease()).await?;
//! let prior = leases.read_checkpoint(&token).await?; // where the last holder stopped
//! let renewal = leases.start_renewal(token, RenewalOptions::new())?;
//! let lost = renewal.lost_signal(); // fires if the lease is lost: stop the work then
//! # let _ = (prior, lost);
//! // ... work, passing renewal.token().fencing_token() to downstream writes ...
//! let token = renewal.stop().await?;
//! let token = leases.checkpoint(&token, &b"done"[..]).await?;
//! leases.release(token).await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

#[cfg(feature = "testkit")]
pub mod conformance;
pub mod election;
pub mod error;
mod lease;
pub mod limits;
pub mod observe;
mod renewal;
pub mod store;
mod token;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub use error::{Error, InvalidInput, Result, StoreError};
pub use lease::{AcquireOptions, Config, Leases, DEFAULT_POLL_INTERVAL};
pub use limits::{HolderId, WorkId};
pub use observe::{LeaseObserver, NoopObserver};
pub use renewal::{Renewal, RenewalOptions};
pub use store::{Checkpoint, Handoff, LeaseEnd, LeaseInfo, LeaseStore, PreviousHolder};
pub use token::Token;
