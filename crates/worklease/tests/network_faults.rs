//! Network faults between a networked store and its server, injected by the
//! in-process TCP proxy [`worklease::store::proxy::FaultProxy`] on loopback.
//! The same four scenarios run over PostgreSQL (feature `postgres`) and
//! Redis (feature `redis`):
//!
//! 1. the reply to an acquisition is lost after the server applied it: the
//!    caller sees an error or gives up; reading the lease back and retrying
//!    reconcile (the retry is told the lease is held, by the same holder),
//!    no second holder gets in, and the next token is larger;
//! 2. the connection is black-holed while the lease is renewed in the
//!    background: the renewal reports the lease lost by the holder's
//!    deadline, and a contender on a direct connection acquires it only
//!    after that, with a larger fencing token;
//! 3. the connection is cut: the next operation reconnects and succeeds;
//!    while reconnection is refused, operations fail with a store error,
//!    and succeed again once it is allowed;
//! 4. replies come later than the safety margin: the holder's deadline
//!    still counts from the request's send time, so renewals that succeed
//!    never make it believe past the server's expiry, and once replies come
//!    later than the renewal window the lease is counted lost by the
//!    deadline, before a contender can have it.
//!
//! Each test talks to the real server: `WORKLEASE_TEST_POSTGRES_URL`
//! (default `postgres://postgres@127.0.0.1:5432/test`) and
//! `WORKLEASE_TEST_REDIS_URL` (default `redis://127.0.0.1:6379/0`), as
//! `tests/postgres.rs` and `tests/redis.rs`, with a table or key prefix of
//! its own. Waits are for signals (the proxy's counters, the renewal's lost
//! signal, a waiting acquisition), each bounded.
#![cfg(any(feature = "postgres", feature = "redis"))]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use worklease::store::proxy::{Direction, FaultProxy};
use worklease::{
    AcquireOptions, Config, Error, LeaseEnd, LeaseStore, Leases, RenewalOptions, Token,
};

/// The TTL of every lease here; the safety margin is the default TTL/10.
const TTL: Duration = Duration::from_secs(2);

/// The safety margin of [`TTL`]: the default, TTL/10 (checked in
/// [`leases`]).
const MARGIN: Duration = Duration::from_millis(TTL.as_millis() as u64 / 10);

/// How late the lost signal, fired by a timer at the deadline, may come on
/// a loaded machine. Half the [`MARGIN`]: a loss reported this late still
/// comes before the server's expiry.
const TIMER_SLACK: Duration = Duration::from_millis(MARGIN.as_millis() as u64 / 2);

/// The poll interval of waiting contenders.
const POLL: Duration = Duration::from_millis(10);

/// The bound of every wait for an event that should come much sooner.
const BOUND: Duration = Duration::from_secs(20);

/// How long a caller waits for a reply that the proxy dropped before it
/// gives up on the call.
const GIVE_UP: Duration = Duration::from_millis(500);

/// The Redis store's response timeout through the proxy: above the
/// latency of scenario 4's first phase, so that those renewals succeed.
#[cfg(feature = "redis")]
const REDIS_RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a store through the proxy may take to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A test server, reached directly or through a proxy.
#[async_trait]
trait Server: Send + Sync {
    /// The server's address (what the proxy forwards to).
    fn addr(&self) -> SocketAddr;
    /// A store on direct connections, connected.
    async fn direct(&self) -> Arc<dyn LeaseStore>;
    /// A store whose every connection goes through `proxy`, connected.
    async fn through(&self, proxy: &FaultProxy) -> Arc<dyn LeaseStore>;
    /// Removes what the test wrote (its table, its keys).
    async fn cleanup(&self);
}

/// Splits `scheme://[userinfo@]host[:port][/...]` into what comes before
/// the host, `host[:port]`, and what follows it.
fn authority(url: &str) -> (&str, &str, &str) {
    let (scheme, rest) = url.split_once("://").expect("a URL with ://");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (auth, tail) = rest.split_at(end);
    let host_port = auth.rsplit_once('@').map_or(auth, |(_, hp)| hp);
    let prefix_len = scheme.len() + 3 + (auth.len() - host_port.len());
    (&url[..prefix_len], host_port, tail)
}

/// The resolved address of `url`'s host, with `default_port` where it
/// names none.
async fn server_addr(url: &str, default_port: u16) -> SocketAddr {
    let (_, host_port, _) = authority(url);
    let with_port = match host_port.rsplit_once(':') {
        Some((_, port)) if !host_port.ends_with(']') && port.parse::<u16>().is_ok() => {
            host_port.to_string()
        }
        _ => format!("{host_port}:{default_port}"),
    };
    tokio::net::lookup_host(&with_port)
        .await
        .ok()
        .and_then(|mut addrs| addrs.next())
        .unwrap_or_else(|| panic!("cannot resolve {with_port}"))
}

/// `url` with its host and port replaced by `addr` (user, path and query
/// kept).
fn via(url: &str, addr: SocketAddr) -> String {
    let (prefix, _, tail) = authority(url);
    format!("{prefix}{addr}{tail}")
}

fn leases(store: Arc<dyn LeaseStore>, holder: &str) -> Leases {
    let leases = Leases::new(store, Config::new(holder, TTL)).expect("config");
    assert_eq!(leases.safety_margin(), MARGIN);
    leases
}

/// A fresh work ID.
fn work_id(what: &str) -> String {
    format!("net-{what}-{:08x}", rand::random::<u32>())
}

/// Acquires and releases a lease through `leases`, so that the
/// connection is open and the server knows the statements or scripts
/// before a fault is armed (otherwise the first reply lost could be a
/// "prepare" or "no such script" reply, and the call would not apply).
async fn warm_up(leases: &Leases) {
    let t = leases
        .acquire(&work_id("warm"), AcquireOptions::new())
        .await
        .expect("warm-up acquire");
    leases.release(t).await.expect("warm-up release");
}

/// Retries `call` at once while it fails with a store error (a connection
/// that must be opened again), at most 3 times; returns the outcome and
/// the number of attempts.
async fn retry_transient<T, F, Fut>(mut call: F) -> (worklease::Result<T>, u32)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = worklease::Result<T>>,
{
    let mut attempts = 0;
    loop {
        attempts += 1;
        let r = tokio::time::timeout(BOUND, call())
            .await
            .expect("a call after the faults ended returns");
        match r {
            Err(e) if e.is_transient() && attempts < 3 => {
                eprintln!("attempt {attempts} failed: {e}; retrying");
            }
            other => return (other, attempts),
        }
    }
}

/// Starts a contender that waits for `work_id`; it yields the token and
/// the instant its successful request was sent (the token's deadline
/// minus the window).
fn contend(contender: &Leases, work_id: &str) -> tokio::task::JoinHandle<(Token, Instant)> {
    let (c, w) = (contender.clone(), work_id.to_string());
    tokio::spawn(async move {
        let options = AcquireOptions::new().wait_for_lease().poll_interval(POLL);
        let t = tokio::time::timeout(BOUND, c.acquire(&w, options))
            .await
            .expect("the contender gets the lease in time")
            .expect("the contender acquires");
        let sent = t.deadline().expect("fresh token") - (TTL - MARGIN);
        (t, sent)
    })
}

/// Waits (bounded) for the renewal's lost signal; returns when it fired.
async fn lost_at(renewal: &worklease::Renewal) -> Instant {
    tokio::time::timeout(BOUND, renewal.lost_signal().cancelled())
        .await
        .expect("the renewal reports the loss");
    Instant::now()
}

/// Checks the takeover after the renewal reported the lease lost at
/// `lost`: the loss was caused by the window running out, no later than
/// the deadline (plus timer slack), and before the contender's winning
/// request was sent; the contender's token is larger than `t1`'s, and
/// followed it by expiry. Returns the contender's token.
async fn check_takeover(
    renewal: &worklease::Renewal,
    lost: Instant,
    contender: tokio::task::JoinHandle<(Token, Instant)>,
    c: &Leases,
    t1: &Token,
) -> Token {
    let (t2, contender_sent) = contender.await.expect("contender");
    let cause = renewal.lost_cause().expect("a cause");
    assert!(
        matches!(cause, Error::WindowExhausted { .. }),
        "lost for {cause}"
    );
    let deadline = renewal.token().deadline().expect("deadline");
    assert!(
        lost <= deadline + TIMER_SLACK,
        "the loss was reported {:?} after the deadline",
        lost - deadline
    );
    assert!(
        renewal.ensure_live().is_err(),
        "the holder still counts the lease as its own"
    );
    assert!(
        contender_sent > lost,
        "the contender's winning request was sent {:?} before the holder counted the lease lost",
        lost - contender_sent
    );
    eprintln!(
        "lost {:?} after the deadline; the contender's winning request went out {:?} after the loss",
        lost.saturating_duration_since(deadline),
        contender_sent - lost
    );
    assert!(t2.fencing_token() > t1.fencing_token());
    assert_followed_expiry(c, &t2, t1.fencing_token()).await;
    t2
}

/// Checks that `t2` followed `previous` (of holder "a") by expiry, by the
/// store's own account.
async fn assert_followed_expiry(contender: &Leases, t2: &Token, previous: u64) {
    let read = contender.read_checkpoint(t2).await.expect("read");
    let prev = read.handoff.previous.expect("a previous holder");
    assert_eq!(
        (prev.holder_id.as_str(), prev.fencing_token, prev.ended),
        ("a", previous, LeaseEnd::Expired)
    );
}

/// Scenario 1: the reply to an acquisition is lost after the server
/// applied it.
async fn reply_lost_after_apply(server: &dyn Server) {
    let proxy = FaultProxy::start(server.addr()).await.expect("proxy");
    let a = leases(server.through(&proxy).await, "a");
    let direct = server.direct().await;
    let c = leases(direct.clone(), "c");
    warm_up(&a).await;
    let w = work_id("lost-reply");

    proxy.drop_replies();
    let outcome = tokio::select! {
        r = a.acquire(&w, AcquireOptions::new()) => Some(r),
        _ = async {
            proxy.wait_for(|s| s.dropped(Direction::Reply) > 0).await;
            tokio::time::sleep(GIVE_UP).await;
        } => None,
    };
    match &outcome {
        Some(Ok(t)) => panic!("the acquisition returned {t:?} though its reply was dropped"),
        Some(Err(e)) => {
            assert!(e.is_transient(), "not a store error: {e}");
            eprintln!("the caller saw: {e}");
        }
        None => eprintln!("the caller gave up {GIVE_UP:?} after the reply was dropped"),
    }

    // The request went through: the server holds the lease for "a".
    let wid = worklease::WorkId::new(w.as_str()).expect("work ID");
    let info = direct.inspect(&[wid]).await.expect("inspect");
    let info = info.first().expect("the acquisition was applied");
    assert_eq!(info.holder_id, "a");
    assert!(!info.expired, "{info:?}");
    let t1 = info.fencing_token;

    // No second holder.
    match c.acquire(&w, AcquireOptions::new()).await {
        Err(Error::Held { holder_id, .. }) => assert_eq!(holder_id, "a"),
        other => panic!("a contender got {other:?} while \"a\" holds the lease"),
    }

    // After the fault, the retry reconciles: "a" is told the lease is held,
    // by itself (the acquisition that applied), not granted a second one.
    assert!(proxy.restore().await >= 1, "the lossy connection is cut");
    let (retry, attempts) = retry_transient(|| a.acquire(&w, AcquireOptions::new())).await;
    match retry {
        Err(Error::Held {
            holder_id,
            expires_in,
            ..
        }) => {
            assert_eq!(holder_id, "a");
            assert!(expires_in.is_some_and(|d| d <= TTL), "{expires_in:?}");
        }
        other => panic!("the retry got {other:?}"),
    }
    eprintln!("the retry reconciled after {attempts} attempt(s)");

    // The lease nobody saw granted ends by expiry; the next one has a
    // larger token, and "a" does not get it too.
    let (t2, _) = contend(&c, &w).await.expect("contender");
    assert!(t2.fencing_token() > t1, "{} after {t1}", t2.fencing_token());
    match a.acquire(&w, AcquireOptions::new()).await {
        Err(Error::Held { holder_id, .. }) => assert_eq!(holder_id, "c"),
        other => panic!("\"a\" got {other:?} while \"c\" holds the lease"),
    }
    c.release(t2).await.expect("release");
    server.cleanup().await;
}

/// Scenario 2: the connection is black-holed during background renewal.
async fn black_hole_during_renewal(server: &dyn Server) {
    let proxy = FaultProxy::start(server.addr()).await.expect("proxy");
    let a = leases(server.through(&proxy).await, "a");
    let c = leases(server.direct().await, "c");
    let w = work_id("black-hole");
    let t1 = a.acquire(&w, AcquireOptions::new()).await.expect("acquire");
    let mut renewal = a
        .start_renewal(t1.clone(), RenewalOptions::new())
        .expect("renewal");
    tokio::time::timeout(BOUND, renewal.changed())
        .await
        .expect("a renewal in time")
        .expect("renewal works through the proxy");

    proxy.black_hole();
    match c.acquire(&w, AcquireOptions::new()).await {
        Err(Error::Held { holder_id, .. }) => assert_eq!(holder_id, "a"),
        other => panic!("a contender got {other:?} while the lease is live"),
    }
    let contender = contend(&c, &w);
    let lost = lost_at(&renewal).await;
    let dropped = proxy.stats().dropped(Direction::Request);
    assert!(dropped > 0, "no renewal request went into the black hole");
    let t2 = check_takeover(&renewal, lost, contender, &c, &t1).await;

    proxy.restore().await;
    c.release(t2).await.expect("release");
    server.cleanup().await;
}

/// Scenario 3: cut connections; refused reconnections. The lease is long
/// here: the scenario is about connections, not expiry.
async fn cut_connections(server: &dyn Server) {
    let proxy = FaultProxy::start(server.addr()).await.expect("proxy");
    let a = Leases::new(
        server.through(&proxy).await,
        Config::new("a", Duration::from_secs(60)),
    )
    .expect("config");
    let w = work_id("cut");
    let t = a.acquire(&w, AcquireOptions::new()).await.expect("acquire");

    let accepted = proxy.stats().accepted;
    assert!(proxy.cut().await >= 1, "no connection to cut");
    let t = a
        .renew(&t)
        .await
        .expect("the next operation after a cut reconnects and succeeds");
    assert!(
        proxy.stats().accepted > accepted,
        "no new connection was opened"
    );
    let t = a
        .checkpoint(&t, &b"after the cut"[..])
        .await
        .expect("checkpoint");

    // While reconnection is refused, operations fail (or hang until the
    // caller gives up)...
    proxy.refuse_new(true);
    proxy.cut().await;
    let asked = Instant::now();
    match tokio::time::timeout(GIVE_UP * 2, a.renew(&t)).await {
        Ok(Ok(_)) => panic!("a renewal succeeded with no connection to be had"),
        Ok(Err(e)) => {
            assert!(e.is_transient(), "not a store error: {e}");
            eprintln!("refused: {e} after {:?}", asked.elapsed());
        }
        Err(_) => eprintln!("refused: the caller gave up after {:?}", asked.elapsed()),
    }
    // ... and succeed again once it is allowed.
    proxy.refuse_new(false);
    let allowed = Instant::now();
    let (renewed, attempts) = retry_transient(|| a.renew(&t)).await;
    let t = renewed.expect("the store recovers once connections are accepted again");
    eprintln!(
        "recovered after {attempts} attempt(s), {:?}",
        allowed.elapsed()
    );
    let read = a.read_checkpoint(&t).await.expect("read");
    assert_eq!(read.data.as_deref(), Some(&b"after the cut"[..]));
    a.release(t).await.expect("release");
    server.cleanup().await;
}

/// Scenario 4: replies later than the safety margin, then later than the
/// renewal window.
async fn latency_beyond_the_margin(server: &dyn Server) {
    let proxy = FaultProxy::start(server.addr()).await.expect("proxy");
    let a = leases(server.through(&proxy).await, "a");
    let c = leases(server.direct().await, "c");
    warm_up(&a).await;
    let w = work_id("latency");

    let slow = MARGIN * 2;
    proxy.set_latency(Direction::Reply, slow).expect("latency");
    let called = Instant::now();
    let t1 = a.acquire(&w, AcquireOptions::new()).await.expect("acquire");
    let replied = Instant::now();
    assert!(replied - called >= slow, "the reply was not delayed");
    // The deadline counts from the request's send, which came at least the
    // latency before the reply: never from the late reply.
    let counted_from = t1.deadline().expect("deadline") - (TTL - MARGIN);
    assert!(
        counted_from + slow <= replied,
        "the deadline counts from {:?} before the reply, not the send",
        replied - counted_from
    );
    let mut renewal = a
        .start_renewal(t1.clone(), RenewalOptions::new())
        .expect("renewal");
    let renewed = tokio::time::timeout(BOUND, renewal.changed())
        .await
        .expect("a renewal in time")
        .expect("renewals within the window succeed despite the latency");
    assert_eq!(renewed.fencing_token(), t1.fencing_token());

    // Replies later than the whole TTL: no renewal can come back in time.
    proxy.set_latency(Direction::Reply, TTL).expect("latency");
    let contender = contend(&c, &w);
    let lost = lost_at(&renewal).await;
    let t2 = check_takeover(&renewal, lost, contender, &c, &t1).await;

    proxy.restore().await;
    c.release(t2).await.expect("release");
    server.cleanup().await;
}

#[cfg(feature = "postgres")]
#[path = "common/postgres.rs"]
mod common_postgres;

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use worklease::store::postgres::{tokio_postgres, PostgresOptions, PostgresStore, TableName};

    pub struct PostgresServer {
        url: String,
        addr: SocketAddr,
        table: String,
    }

    impl PostgresServer {
        pub async fn new() -> Self {
            let url = crate::common_postgres::server_url();
            let addr = server_addr(&url, 5432).await;
            let table = format!("wl_test_net_{:08x}", rand::random::<u32>());
            Self { url, addr, table }
        }

        fn options(&self) -> PostgresOptions {
            PostgresOptions::new().table(TableName::new(&self.table).expect("table name"))
        }
    }

    #[async_trait]
    impl Server for PostgresServer {
        fn addr(&self) -> SocketAddr {
            self.addr
        }

        async fn direct(&self) -> Arc<dyn LeaseStore> {
            let config: tokio_postgres::Config = self.url.parse().expect("valid URL");
            let store = PostgresStore::new(config, self.options()).expect("store");
            store
                .initialize()
                .await
                .expect("the test PostgreSQL server answers (see WORKLEASE_TEST_POSTGRES_URL)");
            Arc::new(store)
        }

        async fn through(&self, proxy: &FaultProxy) -> Arc<dyn LeaseStore> {
            let config: tokio_postgres::Config = via(&self.url, proxy.local_addr())
                .parse()
                .expect("valid URL");
            // One pooled connection: the statements the warm-up prepared
            // are those the faulty call uses.
            let options = self
                .options()
                .max_connections(1)
                .connect_timeout(CONNECT_TIMEOUT);
            let store = PostgresStore::new(config, options).expect("store");
            store
                .initialize()
                .await
                .expect("connects through the proxy");
            Arc::new(store)
        }

        async fn cleanup(&self) {
            let config: tokio_postgres::Config = self.url.parse().expect("valid URL");
            let store = PostgresStore::new(config, self.options()).expect("store");
            crate::common_postgres::drop_table(&store).await;
        }
    }
}

#[cfg(feature = "redis")]
mod rd {
    use super::*;
    use worklease::store::redis::{RedisConfig, RedisStore};

    pub struct RedisServer {
        url: String,
        addr: SocketAddr,
        prefix: String,
    }

    /// `url` with one more query parameter.
    fn with_param(url: &str, param: &str) -> String {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}{param}")
    }

    impl RedisServer {
        pub async fn new() -> Self {
            let url = std::env::var("WORKLEASE_TEST_REDIS_URL")
                .ok()
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| "redis://127.0.0.1:6379/0".to_string());
            let addr = server_addr(&url, 6379).await;
            let prefix = format!("worklease-test:{:016x}:", rand::random::<u64>());
            Self { url, addr, prefix }
        }
    }

    #[async_trait]
    impl Server for RedisServer {
        fn addr(&self) -> SocketAddr {
            self.addr
        }

        async fn direct(&self) -> Arc<dyn LeaseStore> {
            let url = with_param(&self.url, &format!("prefix={}", self.prefix));
            let store = RedisStore::connect(&url)
                .await
                .expect("the test Redis server answers (see WORKLEASE_TEST_REDIS_URL)");
            Arc::new(store)
        }

        async fn through(&self, proxy: &FaultProxy) -> Arc<dyn LeaseStore> {
            let url = with_param(
                &via(&self.url, proxy.local_addr()),
                &format!("prefix={}", self.prefix),
            );
            let config = RedisConfig::from_url(&url)
                .expect("valid URL")
                .response_timeout(REDIS_RESPONSE_TIMEOUT)
                .connection_timeout(CONNECT_TIMEOUT);
            let store = RedisStore::new(config).expect("store");
            store.ready().await.expect("connects through the proxy");
            Arc::new(store)
        }

        async fn cleanup(&self) {
            let mut conn = redis::Client::open(self.url.as_str())
                .expect("valid URL")
                .get_multiplexed_async_connection()
                .await
                .expect("connection");
            let keys: Vec<Vec<u8>> = {
                use futures_util::TryStreamExt;
                redis::AsyncCommands::scan_match(&mut conn, format!("{}*", self.prefix))
                    .await
                    .expect("list the test keys")
                    .try_collect()
                    .await
                    .expect("list the test keys")
            };
            if !keys.is_empty() {
                redis::cmd("UNLINK")
                    .arg(keys)
                    .exec_async(&mut conn)
                    .await
                    .expect("delete the test keys");
            }
        }
    }
}

/// The four scenarios as tests over one server kind.
macro_rules! network_fault_tests {
    ($module:ident, $feature:literal, $server:path) => {
        #[cfg(feature = $feature)]
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_reply_lost_after_the_acquisition_applied_is_reconciled() {
                reply_lost_after_apply(&<$server>::new().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_black_hole_during_renewal_loses_the_lease_by_its_deadline() {
                black_hole_during_renewal(&<$server>::new().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn after_a_cut_the_next_operation_reconnects() {
                cut_connections(&<$server>::new().await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn replies_later_than_the_margin_never_extend_the_lease_past_the_server() {
                latency_beyond_the_margin(&<$server>::new().await).await;
            }
        }
    };
}

network_fault_tests!(over_postgres, "postgres", pg::PostgresServer);
network_fault_tests!(over_redis, "redis", rd::RedisServer);
