//! The Redis store on Redis as production runs it, each on servers the
//! test starts itself (the distribution's `redis-server`, built with TLS)
//! on free loopback ports, in temporary directories, killed when the test
//! ends, also when it fails: TLS (`rediss://`, feature `redis-tls`), ACL
//! users, the warning about a server without persistence, Sentinel
//! failover with and without the replica wait, the conformance suite on a
//! three-primary Redis Cluster, TLS on a Cluster, and a Cluster's
//! resharding and failover under load with and without the replica wait.

#![cfg(feature = "redis")]

#[path = "common/net.rs"]
mod common_net;
#[path = "redis/server.rs"]
mod server;

#[cfg(feature = "redis-tls")]
#[path = "common/tls.rs"]
mod common_tls;

#[path = "redis/acl.rs"]
mod acl;
#[path = "redis/cluster.rs"]
mod cluster;
#[path = "redis/cluster_failover.rs"]
mod cluster_failover;
#[path = "redis/failover.rs"]
mod failover;
#[path = "redis/holders.rs"]
mod holders;
#[path = "redis/persistence.rs"]
mod persistence;
#[path = "redis/sentinel.rs"]
mod sentinel;
#[cfg(feature = "redis-tls")]
#[path = "redis/tls.rs"]
mod tls;
