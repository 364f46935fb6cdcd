//! `worklease run --wait` when the store fails its first, fail-fast try
//! (issue 36: a transient failure, such as a PostgreSQL serialization
//! failure, ended the run with exit 69): the run waits through it, as
//! through a store failure while waiting, and runs its child once the
//! store answers. The store is PostgreSQL (`WORKLEASE_TEST_POSTGRES_URL`,
//! `.ci/services/postgres.sh`) behind a fault proxy that refuses new
//! connections until the test lets them through.

mod common;
use common::{World, LONG};

use std::net::{SocketAddr, ToSocketAddrs};

use worklease::store::proxy::FaultProxy;

/// The shared test server's URL (as in the library's tests/postgres.rs).
fn server_url() -> String {
    std::env::var("WORKLEASE_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// `url` split around its `host:port`, and that address.
fn authority(url: &str) -> (String, SocketAddr, String) {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (userinfo, rest) = rest.split_once('@').map_or(("", rest), |(u, r)| (u, r));
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let addr = rest[..end]
        .to_socket_addrs()
        .expect("host:port")
        .next()
        .expect("an address");
    let before = if userinfo.is_empty() {
        format!("{scheme}://")
    } else {
        format!("{scheme}://{userinfo}@")
    };
    (before, addr, rest[end..].to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_run_waits_through_a_store_failure_of_its_first_try() {
    let (before, upstream, after) = authority(&server_url());
    let proxy = FaultProxy::start(upstream).await.expect("proxy");
    proxy.refuse_new(true);
    let table = format!("wl_test_first_try_{:08x}", rand::random::<u32>());
    let sep = if after.contains('?') { '&' } else { '?' };
    let mut w = World::new();
    w.store = format!("{before}{}{after}{sep}table={table}", proxy.local_addr());
    let w = std::sync::Arc::new(w);

    let world = w.clone();
    let waiting = tokio::task::spawn_blocking(move || {
        let mut waiting = world.spawn_sh(
            &["run", "--wait", "--poll", "100ms", "job"],
            "touch \"$D/ran\"",
        );
        waiting.wait_for_line("store failed on the first try for the lease; waiting", LONG);
        waiting
    })
    .await
    .expect("the first try fails and the run waits");
    assert!(!w.path("ran").exists(), "the child ran without the lease");

    proxy.refuse_new(false);
    let world = w.clone();
    tokio::task::spawn_blocking(move || {
        waiting.exits(0);
        assert!(world.path("ran").exists(), "the child did not run");
    })
    .await
    .expect("the run takes the lease once the store answers");
}
