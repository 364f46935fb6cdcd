//! ACL users: a user limited to the store's prefix and to the commands
//! [`RedisConfig::acl_rules`] lists runs the whole conformance suite; a
//! user without one of them gets an error that names what is missing.
//! (A module of `tests/redis_topologies.rs`.)

use std::sync::Arc;

use worklease::conformance::Suite;
use worklease::store::fault::FaultStore;
use worklease::store::redis::{RedisConfig, RedisStore};
use worklease::{AcquireOptions, Config, Error, LeaseStore, Leases};

use super::server::{raw, OwnServer, READY};

/// A throwaway server (so that no ACL change reaches a shared one) and
/// its directory, kept while a store uses it.
struct AclServer {
    _server: OwnServer,
    _dir: tempfile::TempDir,
}

/// A server of the test's own with a user `worklease` whose rules are
/// `rules` (the default user, open, sets it up); returns the server and
/// the user's URL with `prefix`.
async fn acl_server(
    prefix: &str,
    rules: impl FnOnce(&RedisConfig) -> String,
) -> (Arc<AclServer>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = OwnServer::start(dir.path(), None, &[], READY);
    let password = format!("{:032x}", rand::random::<u128>());
    let url = format!(
        "redis://worklease:{password}@127.0.0.1:{}/0?prefix={prefix}",
        server.port
    );
    let config = RedisConfig::from_url(&url).expect("URL");
    let mut conn = raw(&server.url()).await;
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("worklease")
        .arg("on")
        .arg(format!(">{password}"))
        .arg(rules(&config).split_whitespace().collect::<Vec<_>>())
        .exec_async(&mut conn)
        .await
        .expect("ACL SETUSER");
    let guard = AclServer {
        _server: server,
        _dir: dir,
    };
    (Arc::new(guard), url)
}

worklease::conformance_tests!(least_privilege_user, paused = false, async {
    let (server, url) = acl_server("acl%3A", RedisConfig::acl_rules).await;
    let store = RedisStore::connect(&url)
        .await
        .expect("the restricted user connects");
    Suite::new(Arc::new(
        FaultStore::over(Arc::new(store)).with_guard(server),
    ))
});

/// The error of the first operation that needs what `rules` leave
/// out: a store error quoting the server's NOPERM reason, which names
/// the command (also one a script runs) or says that keys are out of
/// reach. The password never shows.
#[tokio::test]
async fn a_missing_permission_is_named() {
    let ttl = std::time::Duration::from_secs(30);
    // Without PUBLISH, which the release script runs, and SCAN.
    let lacking = |c: &RedisConfig| c.acl_rules().replace(" +publish", "").replace(" +scan", "");
    let (_server, url) = acl_server("acl%3A", lacking).await;
    let store = Arc::new(RedisStore::connect(&url).await.expect("connect"));
    let a = Leases::new(store.clone(), Config::new("acl-a", ttl)).expect("config");
    let t = a
        .acquire("jobs/acl", AcquireOptions::new())
        .await
        .expect("acquire needs no PUBLISH");
    let e = a.release(t).await.expect_err("the release publishes");
    let text = e.to_string();
    assert!(
        text.contains("lacks a permission") && text.contains("'publish'"),
        "{text}"
    );
    // SCAN, which listing every lease runs.
    let e = store.inspect(&[]).await.expect_err("listing scans");
    assert!(matches!(&e, Error::Store(_)), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("NOPERM") && text.contains("'scan'"), "{text}");

    // Keys outside the user's pattern: the store's prefix is not the
    // one the rules allow.
    let (_server, url) = acl_server("other%3A", |_| {
        RedisConfig::from_url("redis://h/0?prefix=acl%3A")
            .expect("URL")
            .acl_rules()
    })
    .await;
    let store = Arc::new(RedisStore::connect(&url).await.expect("connect"));
    let a = Leases::new(store, Config::new("acl-a", ttl)).expect("config");
    let e = a
        .acquire("jobs/acl", AcquireOptions::new())
        .await
        .expect_err("keys out of reach");
    let text = format!("{e} {e:?}");
    assert!(
        text.contains("lacks a permission") && text.contains("key"),
        "{text}"
    );
    assert!(
        !text.contains(url.split('@').next().unwrap_or("?")),
        "{text}"
    );
}
