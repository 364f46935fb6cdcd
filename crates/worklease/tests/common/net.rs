//! Loopback ports for the servers the tests start themselves (a PostgreSQL
//! cluster, MariaDB, Redis nodes and sentinels, etcd members).

/// A free loopback port (nothing listens on it when this returns; another
/// process may take it before the caller binds it, which the servers'
/// start-up reports).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}
