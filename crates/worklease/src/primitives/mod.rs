//! The primitives built on the lease API (`crate::lease`) only: a
//! semaphore's permits are leases of their own, an election's term is a
//! lease whose fencing token is the term. They never reach below the
//! `Leases` handle to a store, except to read what a store reports
//! (`LeaseStore::inspect`).

pub mod election;
pub mod semaphore;
