//! A fault-injecting TCP proxy for the fault tests of the networked stores
//! (feature `testkit`): it listens on loopback, forwards every connection
//! to one upstream server (a PostgreSQL or Redis server), and injects, at
//! run time, the network faults a store client must survive.
//!
//! Over 600 lines with its unit tests: the proxy itself is the first 530,
//! and its tests (each fault through a real proxy to a loopback echo
//! server) stay beside it.
//!
//! Point a store at [`FaultProxy::local_addr`] instead of the server; the
//! proxy connects to the upstream once per accepted connection and copies
//! bytes both ways. The faults:
//!
//! * **latency** per [`Direction`] ([`FaultProxy::set_latency`]): every
//!   chunk read from then on is written that much later (a delay line:
//!   order is kept, throughput is not limited);
//! * **cut** ([`FaultProxy::cut`]): every current connection is closed on
//!   both sides at once, as when a server or a middlebox drops them;
//!   [`FaultProxy::refuse_new`] closes new connections as soon as they are
//!   accepted;
//! * **black hole** ([`FaultProxy::black_hole`]): connections are accepted
//!   and kept open, but nothing is forwarded either way: requests never
//!   reach the server and its replies vanish, with no error on either side
//!   (a partition, a frozen server);
//! * **lost replies** ([`FaultProxy::drop_replies`]): requests go through
//!   and the server applies them, but its replies vanish (the ambiguous
//!   "applied, but the caller never heard" outcome).
//!
//! [`FaultProxy::restore`] turns every fault off. Bytes that were dropped
//! leave a hole in their TCP stream, which no real network produces
//! without ending the connection, so `restore` also cuts every connection
//! that lost bytes: its client then sees a closed connection and must
//! reconnect, as it would after a real partition. Connections that lost
//! nothing stay open.
//!
//! [`FaultProxy::stats`] and [`FaultProxy::wait_for`] report what the proxy
//! did (connections accepted, bytes forwarded and dropped per direction),
//! so that a test waits for an event ("a reply was dropped") instead of
//! sleeping.
//!
//! ```
//! use std::time::Duration;
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use worklease::store::proxy::{Direction, FaultProxy};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // An upstream that answers every connection with "hello".
//! let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let upstream_addr = upstream.local_addr()?;
//! tokio::spawn(async move {
//!     while let Ok((mut s, _)) = upstream.accept().await {
//!         let _ = s.write_all(b"hello").await;
//!     }
//! });
//!
//! let proxy = FaultProxy::start(upstream_addr).await?;
//! proxy.set_latency(Direction::Reply, Duration::from_millis(20))?;
//! let mut conn = tokio::net::TcpStream::connect(proxy.local_addr()).await?;
//! let mut greeting = [0u8; 5];
//! conn.read_exact(&mut greeting).await?; // 20 ms late
//! assert_eq!(&greeting, b"hello");
//!
//! assert_eq!(proxy.cut().await, 1); // the connection is closed
//! assert_eq!(conn.read(&mut greeting).await?, 0);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The longest latency [`FaultProxy::set_latency`] accepts: an hour, far
/// beyond any TTL, and small enough for the clock's arithmetic.
pub const MAX_LATENCY: Duration = Duration::from_secs(3600);

/// The most bytes read from a socket at once (one chunk of the delay line).
const CHUNK_BYTES: usize = 16 * 1024;

/// How long the accept loop waits after a failed `accept` (out of file
/// descriptors, say) before it tries again.
const ACCEPT_RETRY: Duration = Duration::from_millis(10);

/// Which way bytes flow through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the client (the store) to the upstream server.
    Request,
    /// From the upstream server back to the client.
    Reply,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Direction::Request => 0,
            Direction::Reply => 1,
        }
    }
}

/// Why the proxy refused a call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The proxy could not listen on an ephemeral port of 127.0.0.1 (or
    /// read back the port it got).
    #[error("the fault proxy cannot listen on 127.0.0.1: {0}")]
    Bind(#[source] std::io::Error),
    /// A latency above [`MAX_LATENCY`]; nothing was changed.
    #[error("a latency of {latency:?} is longer than the limit of {max:?}")]
    LatencyTooLong {
        /// The latency asked for.
        latency: Duration,
        /// The limit, [`MAX_LATENCY`].
        max: Duration,
    },
}

/// What the proxy has done so far. Byte counts are payload bytes of the
/// proxied connections; counts only grow, except `open`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProxyStats {
    /// Connections accepted (refused ones included).
    pub accepted: u64,
    /// Connections closed at once because new ones were refused.
    pub refused: u64,
    /// Accepted connections whose upstream connection failed (closed at
    /// once).
    pub upstream_failures: u64,
    /// Connections open now.
    pub open: u64,
    /// Connections closed by [`FaultProxy::cut`] or [`FaultProxy::restore`].
    pub cut: u64,
    /// Bytes forwarded from clients to the upstream.
    pub request_bytes_forwarded: u64,
    /// Bytes forwarded from the upstream to clients.
    pub reply_bytes_forwarded: u64,
    /// Client bytes dropped (black hole).
    pub request_bytes_dropped: u64,
    /// Upstream bytes dropped (black hole, lost replies).
    pub reply_bytes_dropped: u64,
}

impl ProxyStats {
    /// Bytes forwarded in `direction`.
    pub fn forwarded(&self, direction: Direction) -> u64 {
        match direction {
            Direction::Request => self.request_bytes_forwarded,
            Direction::Reply => self.reply_bytes_forwarded,
        }
    }

    /// Bytes dropped in `direction`.
    pub fn dropped(&self, direction: Direction) -> u64 {
        match direction {
            Direction::Request => self.request_bytes_dropped,
            Direction::Reply => self.reply_bytes_dropped,
        }
    }
}

/// The faults in force, read for every chunk.
#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    latency: [Duration; 2],
    drop: [bool; 2],
    refuse: bool,
}

/// One proxied connection, as the registry sees it.
#[derive(Clone)]
struct Conn {
    /// Cancelling it closes both sockets.
    cancel: CancellationToken,
    /// Cancelled by the connection's task when its sockets are closed.
    finished: CancellationToken,
    /// Bytes of this connection were dropped: its streams have a hole.
    lossy: Arc<AtomicBool>,
}

struct Shared {
    upstream: SocketAddr,
    faults: Mutex<Faults>,
    conns: Mutex<(u64, HashMap<u64, Conn>)>,
    stats: watch::Sender<ProxyStats>,
    stop: CancellationToken,
}

/// Locks `m`; a panic elsewhere while it was held leaves plain data, still
/// usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn faults(&self) -> Faults {
        *lock(&self.faults)
    }

    fn count(&self, f: impl FnOnce(&mut ProxyStats)) {
        self.stats.send_modify(f);
    }

    /// Cancels the connections `pick` selects, and waits until their
    /// sockets are closed; returns how many.
    async fn close(&self, pick: impl Fn(&Conn) -> bool) -> usize {
        let picked: Vec<Conn> = lock(&self.conns)
            .1
            .values()
            .filter(|c| pick(c))
            .cloned()
            .collect();
        for c in &picked {
            c.cancel.cancel();
        }
        for c in &picked {
            c.finished.cancelled().await;
        }
        let n = picked.len();
        self.count(|s| s.cut += n as u64);
        n
    }
}

/// A fault-injecting TCP proxy on 127.0.0.1 (see the module docs). It runs
/// on the tokio runtime that started it, until it is dropped; dropping it
/// closes the listener and every connection.
pub struct FaultProxy {
    local: SocketAddr,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("local", &self.local)
            .field("upstream", &self.shared.upstream)
            .field("faults", &self.shared.faults())
            .finish()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

impl FaultProxy {
    /// Listens on an ephemeral port of 127.0.0.1 and forwards every
    /// connection to `upstream`, with no fault in force. The upstream is
    /// connected per accepted connection: when it cannot be reached, the
    /// accepted connection is closed (counted in
    /// [`ProxyStats::upstream_failures`]).
    ///
    /// # Errors
    /// [`ProxyError::Bind`] when no port can be had.
    pub async fn start(upstream: SocketAddr) -> Result<Self, ProxyError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(ProxyError::Bind)?;
        let local = listener.local_addr().map_err(ProxyError::Bind)?;
        let shared = Arc::new(Shared {
            upstream,
            faults: Mutex::new(Faults::default()),
            conns: Mutex::new((0, HashMap::new())),
            stats: watch::channel(ProxyStats::default()).0,
            stop: CancellationToken::new(),
        });
        tokio::spawn(accept_loop(listener, shared.clone()));
        tracing::debug!(%local, %upstream, "fault proxy started");
        Ok(Self { local, shared })
    }

    /// The address clients connect to (127.0.0.1 and the proxy's port).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The upstream server's address.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Delays every chunk read in `direction` from now on by `latency`
    /// before it is written on (zero: none). Chunks already on their way
    /// keep their delay; bytes never overtake each other.
    ///
    /// # Errors
    /// [`ProxyError::LatencyTooLong`] above [`MAX_LATENCY`]; nothing is
    /// changed then.
    pub fn set_latency(&self, direction: Direction, latency: Duration) -> Result<(), ProxyError> {
        if latency > MAX_LATENCY {
            return Err(ProxyError::LatencyTooLong {
                latency,
                max: MAX_LATENCY,
            });
        }
        lock(&self.shared.faults).latency[direction.index()] = latency;
        Ok(())
    }

    /// From now on, forwards nothing either way: connections (current and
    /// new) stay open, but every byte read from either side is dropped.
    /// Until [`FaultProxy::restore`].
    pub fn black_hole(&self) {
        lock(&self.shared.faults).drop = [true, true];
    }

    /// From now on, forwards requests but drops every reply: the server
    /// applies what it is sent, and the client never hears back. Until
    /// [`FaultProxy::restore`].
    pub fn drop_replies(&self) {
        lock(&self.shared.faults).drop[Direction::Reply.index()] = true;
    }

    /// Whether new connections are closed as soon as they are accepted
    /// (the client sees its connection closed before any reply). Current
    /// connections are not affected: [`FaultProxy::cut`] closes them.
    pub fn refuse_new(&self, refuse: bool) {
        lock(&self.shared.faults).refuse = refuse;
    }

    /// Closes every current connection on both sides (the client sees the
    /// connection closed by its peer, and so does the server), and returns
    /// once their sockets are closed, with how many there were. New
    /// connections are accepted as usual unless
    /// [`FaultProxy::refuse_new`] is on.
    pub async fn cut(&self) -> usize {
        self.shared.close(|_| true).await
    }

    /// Turns every fault off (latency, black hole, lost replies, refusal),
    /// then cuts the connections that lost bytes (their streams have a
    /// hole: see the module docs) and returns once they are closed, with
    /// how many there were.
    pub async fn restore(&self) -> usize {
        *lock(&self.shared.faults) = Faults::default();
        self.shared.close(|c| c.lossy.load(Ordering::SeqCst)).await
    }

    /// What the proxy has done so far.
    pub fn stats(&self) -> ProxyStats {
        self.shared.stats.borrow().clone()
    }

    /// Waits until `done` holds for the proxy's statistics (checked now and
    /// at every change), and returns them: for example until a reply was
    /// dropped, `|s| s.dropped(Direction::Reply) > 0`. Bound it with a
    /// timeout where the event may never come.
    pub async fn wait_for(&self, mut done: impl FnMut(&ProxyStats) -> bool) -> ProxyStats {
        let mut stats = self.shared.stats.subscribe();
        // The sender lives in `self.shared`, which `&self` keeps alive: the
        // wait ends only when `done` holds.
        let seen = match stats.wait_for(|s| done(s)).await {
            Ok(s) => s.clone(),
            Err(_) => self.stats(),
        };
        seen
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let accepted = tokio::select! {
            _ = shared.stop.cancelled() => return,
            r = listener.accept() => r,
        };
        let client = match accepted {
            Ok((client, _)) => client,
            Err(e) => {
                tracing::debug!(error = %e, "fault proxy: accept failed");
                tokio::select! {
                    _ = shared.stop.cancelled() => return,
                    _ = tokio::time::sleep(ACCEPT_RETRY) => continue,
                }
            }
        };
        shared.count(|s| s.accepted += 1);
        if shared.faults().refuse {
            shared.count(|s| s.refused += 1);
            drop(client);
            continue;
        }
        let conn = Conn {
            cancel: shared.stop.child_token(),
            finished: CancellationToken::new(),
            lossy: Arc::new(AtomicBool::new(false)),
        };
        let id = {
            let mut conns = lock(&shared.conns);
            conns.0 += 1;
            let id = conns.0;
            conns.1.insert(id, conn.clone());
            id
        };
        shared.count(|s| s.open += 1);
        tokio::spawn(serve(shared.clone(), id, client, conn));
    }
}

/// Removes a connection from the registry and tells waiters it is closed,
/// however its task ends.
struct Registered {
    shared: Arc<Shared>,
    id: u64,
    finished: CancellationToken,
}

impl Drop for Registered {
    fn drop(&mut self) {
        lock(&self.shared.conns).1.remove(&self.id);
        self.shared.count(|s| s.open = s.open.saturating_sub(1));
        self.finished.cancel();
    }
}

/// Proxies one connection until both directions ended or it is cancelled.
async fn serve(shared: Arc<Shared>, id: u64, client: TcpStream, conn: Conn) {
    // Declared first, dropped last: after both sockets are closed.
    let _registered = Registered {
        shared: shared.clone(),
        id,
        finished: conn.finished.clone(),
    };
    // A parameter would be dropped after `_registered`: make it a local.
    let client = client;
    let upstream = tokio::select! {
        _ = conn.cancel.cancelled() => return,
        r = TcpStream::connect(shared.upstream) => r,
    };
    let upstream = match upstream {
        Ok(upstream) => upstream,
        Err(e) => {
            tracing::debug!(error = %e, upstream = %shared.upstream, "fault proxy: cannot reach the upstream");
            shared.count(|s| s.upstream_failures += 1);
            return;
        }
    };
    // Small protocol messages must not wait for Nagle's algorithm, or the
    // latency the tests set would not be the latency they get.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    let requests = pump(
        client_read,
        upstream_write,
        Direction::Request,
        &shared,
        &conn,
    );
    let replies = pump(
        upstream_read,
        client_write,
        Direction::Reply,
        &shared,
        &conn,
    );
    tokio::select! {
        _ = conn.cancel.cancelled() => {}
        _ = futures_util::future::join(requests, replies) => {}
    }
}

/// Copies `from` to `to` through the delay line, dropping what the faults
/// say; half-closes `to` when `from` ends. A failed write (or read) ends
/// the whole connection, as a reset would.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    direction: Direction,
    shared: &Shared,
    conn: &Conn,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Bytes)>();
    let read = async move {
        let mut buf = vec![0u8; CHUNK_BYTES];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => n,
                Err(_) => {
                    conn.cancel.cancel();
                    break;
                }
            };
            let faults = shared.faults();
            if faults.drop[direction.index()] {
                conn.lossy.store(true, Ordering::SeqCst);
                shared.count(|s| match direction {
                    Direction::Request => s.request_bytes_dropped += n as u64,
                    Direction::Reply => s.reply_bytes_dropped += n as u64,
                });
                continue;
            }
            let due = Instant::now() + faults.latency[direction.index()];
            if tx.send((due, Bytes::copy_from_slice(&buf[..n]))).is_err() {
                break;
            }
        }
        // Dropping `tx` lets the writer flush what is queued, then
        // half-close.
    };
    let write = async move {
        while let Some((due, data)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&data).await.is_err() {
                conn.cancel.cancel();
                return;
            }
            shared.count(|s| match direction {
                Direction::Request => s.request_bytes_forwarded += data.len() as u64,
                Direction::Reply => s.reply_bytes_forwarded += data.len() as u64,
            });
        }
        let _ = to.shutdown().await;
    };
    futures_util::future::join(read, write).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream that echoes every byte back; returns its address.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.into_split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(conn: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        conn.write_all(msg).await?;
        let mut back = vec![0u8; msg.len()];
        conn.read_exact(&mut back).await?;
        Ok(back)
    }

    const BOUND: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn forwards_both_ways_and_counts() {
        let proxy = FaultProxy::start(echo_server().await).await.expect("start");
        let mut conn = TcpStream::connect(proxy.local_addr())
            .await
            .expect("connect");
        assert_eq!(round_trip(&mut conn, b"ping").await.expect("echo"), b"ping");
        let stats = proxy.wait_for(|s| s.forwarded(Direction::Reply) == 4).await;
        assert_eq!(stats.accepted, 1);
        assert_eq!(stats.open, 1);
        assert_eq!(stats.forwarded(Direction::Request), 4);
        assert_eq!(stats.dropped(Direction::Request), 0);
    }

    #[tokio::test]
    async fn latency_delays_each_direction() {
        let proxy = FaultProxy::start(echo_server().await).await.expect("start");
        let mut conn = TcpStream::connect(proxy.local_addr())
            .await
            .expect("connect");
        let latency = Duration::from_millis(60);
        proxy.set_latency(Direction::Request, latency).expect("ok");
        proxy.set_latency(Direction::Reply, latency).expect("ok");
        let sent = Instant::now();
        round_trip(&mut conn, b"slow").await.expect("echo");
        assert!(sent.elapsed() >= latency * 2, "{:?}", sent.elapsed());
        let e = proxy
            .set_latency(Direction::Reply, MAX_LATENCY + Duration::from_millis(1))
            .unwrap_err();
        assert!(e.to_string().contains("limit of 3600s"), "{e}");
    }

    #[tokio::test]
    async fn lost_replies_reach_the_server_and_restore_cuts_the_lossy_connection() {
        let proxy = FaultProxy::start(echo_server().await).await.expect("start");
        let mut lossy = TcpStream::connect(proxy.local_addr())
            .await
            .expect("connect");
        let mut idle = TcpStream::connect(proxy.local_addr())
            .await
            .expect("connect");
        proxy.wait_for(|s| s.open == 2).await;
        proxy.drop_replies();
        lossy.write_all(b"lost").await.expect("write");
        let stats =
            tokio::time::timeout(BOUND, proxy.wait_for(|s| s.dropped(Direction::Reply) == 4))
                .await
                .expect("the echo came back and was dropped");
        assert_eq!(stats.forwarded(Direction::Request), 4);
        assert_eq!(proxy.restore().await, 1, "only the lossy connection");
        let mut buf = [0u8; 4];
        assert_eq!(lossy.read(&mut buf).await.expect("eof"), 0);
        assert_eq!(round_trip(&mut idle, b"kept").await.expect("echo"), b"kept");
    }

    #[tokio::test]
    async fn a_black_hole_keeps_connections_open_and_forwards_nothing() {
        let proxy = FaultProxy::start(echo_server().await).await.expect("start");
        proxy.black_hole();
        let mut conn = TcpStream::connect(proxy.local_addr())
            .await
            .expect("connect");
        conn.write_all(b"void").await.expect("write");
        let stats = proxy.wait_for(|s| s.dropped(Direction::Request) == 4).await;
        assert_eq!(stats.forwarded(Direction::Request), 0);
        assert_eq!(stats.open, 1);
        assert_eq!(proxy.restore().await, 1);
        let mut fresh = TcpStream::connect(proxy.local_addr())
            .await
            .expect("connect");
        assert_eq!(
            round_trip(&mut fresh, b"back").await.expect("echo"),
            b"back"
        );
    }

    #[tokio::test]
    async fn cut_closes_current_connections_and_refuse_new_closes_new_ones() {
        let proxy = FaultProxy::start(echo_server().await).await.expect("start");
        let mut conn = TcpStream::connect(proxy.local_addr())
            .await
            .expect("connect");
        round_trip(&mut conn, b"one").await.expect("echo");
        proxy.refuse_new(true);
        assert_eq!(proxy.cut().await, 1);
        let mut buf = [0u8; 1];
        assert_eq!(conn.read(&mut buf).await.expect("eof"), 0);
        let mut refused = TcpStream::connect(proxy.local_addr())
            .await
            .expect("connect");
        assert_eq!(refused.read(&mut buf).await.unwrap_or(0), 0);
        assert_eq!(proxy.stats().refused, 1);
        proxy.refuse_new(false);
        let mut fresh = TcpStream::connect(proxy.local_addr())
            .await
            .expect("connect");
        assert_eq!(round_trip(&mut fresh, b"two").await.expect("echo"), b"two");
    }

    #[tokio::test]
    async fn an_unreachable_upstream_closes_the_client() {
        // A port that was free a moment ago: nothing listens on it.
        let gone = {
            let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .await
                .expect("bind");
            l.local_addr().expect("addr")
        };
        let proxy = FaultProxy::start(gone).await.expect("start");
        let mut conn = TcpStream::connect(proxy.local_addr())
            .await
            .expect("connect");
        let mut buf = [0u8; 1];
        assert_eq!(conn.read(&mut buf).await.unwrap_or(0), 0);
        assert_eq!(proxy.wait_for(|s| s.upstream_failures == 1).await.open, 0);
    }
}
