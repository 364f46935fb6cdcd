//! # worklease
//!
//! Distributed work leases and leader election over real stores: at most
//! one holder per work ID, fencing tokens that only go up, checkpoints
//! handed from one holder to the next.
//!
//! ## Where the API comes from
//!
//! It ports two Go packages: `worklease` (leases with checkpoints; notes
//! like "(Go: `Renew`)" name the original of an item) and `hoplock` (leader
//! election over a compare-and-swap register; "(hoplock: `State`)"). Where
//! this crate differs, its docs say so, and `docs/adr/` says why.
//!
//! ## The contract every store keeps
//!
//! * **S1 mutual exclusion**: at no moment do two holders both believe, by
//!   their own clocks, that they hold a live lease on one work ID.
//! * **S2 fencing**: fencing tokens of a work ID strictly increase with
//!   every acquisition and are never reused (release, expiry, restart).
//! * **S3 stale writers lose**: renew, checkpoint and release with a token
//!   that is no longer current change nothing and fail with
//!   [`Error::Fenced`] (taken over or revoked) or [`Error::Expired`].
//! * **S4 checkpoints survive**: an acknowledged checkpoint is what the next
//!   holder reads, unless a later acknowledged one replaced it.
//! * **S5 hand-off flag**: `clean_handoff` is true exactly when the previous
//!   holder released.
//! * **L1 liveness**: a released lease can be acquired at once; an expired
//!   one within its TTL plus one poll interval.
//!
//! ## Clocks
//!
//! Expiry is judged by one clock per store, the store's own (for SQLite the
//! host's monotonic clock with the boot ID), never by comparing two hosts'
//! wall clocks. A holder counts its lease lost at the monotonic instant its
//! last successful acquire or renew request was sent, plus the TTL, minus a
//! safety margin ([`Config::safety_margin`]). A store without a clock (a
//! bare register) uses the observation rule of
//! [`store::register::RegisterStore`].
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
#![warn(missing_debug_implementations)]
#![warn(missing_docs)]
// On docs.rs (`--cfg docsrs`, nightly rustdoc): each item gated by a
// feature says which one enables it.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The layers, lowest first (docs/architecture.md; `tests/layers.rs`
// fails when a file names a module of a layer above its own):
// the foundation (these root files: errors, limits, tokens, the IDs
// worklease keeps for itself, observation and metrics), `store/` (the
// contract and the stores), `lease/` (the `Leases` handle and its
// machinery), `primitives/` (semaphores, elections), `recipes/` (runner,
// leader, pool, typed checkpoints), `testkit/` (conformance, simulation,
// fuzzing). The public paths are the modules re-exported below.
pub mod error;
mod internal;
pub mod limits;
pub mod metrics;
pub mod observe;
mod token;

pub mod store;

mod lease;
pub use lease::fair;

mod primitives;
pub use primitives::{election, semaphore};

mod recipes;
#[cfg(feature = "serde")]
pub use recipes::typed;
pub use recipes::{gc, leader, once, pool, runner};

#[cfg(any(feature = "testkit", feature = "fuzzing"))]
mod testkit;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use testkit::fuzz;
#[cfg(feature = "testkit")]
pub use testkit::{conformance, sim};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

/// The crate's own README's example (what crates.io shows), as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct CrateReadmeDoctests;

pub use error::{Error, InvalidInput, Result, StoreError};
pub use internal::{is_internal_work_id, user_work_id};
pub use lease::background::Unsettled;
pub use lease::renewal::{Renewal, RenewalOptions};
pub use lease::{AcquireOptions, CheckpointData, Config, Leases, DEFAULT_POLL_INTERVAL};
pub use limits::{HolderId, WorkId};
pub use observe::{LeaseObserver, NoopObserver, TracingObserver};
#[doc(no_inline)]
pub use semaphore::Semaphore;
pub use store::{
    Checkpoint, Handoff, LeaseEnd, LeaseInfo, LeaseStore, PreviousHolder, StoredCheckpoint,
};
pub use token::Token;
