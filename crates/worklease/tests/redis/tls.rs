//! TLS (`rediss://` and `rediss+cluster://`, feature `redis-tls`): a
//! module of `tests/redis_topologies.rs`.

use std::sync::Arc;
use std::time::Duration;

use worklease::store::fault::{Counter, FaultStore};
use worklease::store::redis::{RedisConfig, RedisStore};
use worklease::{AcquireOptions, Config, Leases};

use super::cluster::{Cluster, ClusterTls, Shape};
use super::server::OwnServer;

use super::common_tls::{checkpoint_round_trip, signed_cert, test_ca};

fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Why connecting with `url` fails (the error's text, causes included).
async fn refused(url: String) -> String {
    let config = RedisConfig::from_url(&url)
        .expect("a valid URL")
        .connection_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2));
    let e = RedisStore::new(config)
        .expect("store")
        .ready()
        .await
        .expect_err("the server must not be usable");
    format!("{e}")
}

/// Over the TLS connections of `url`: acquires, checkpoints, reads and
/// renews `work`, then releases it while a waiter (with a poll interval
/// longer than the test) waits for it: the release's announcement, which
/// comes through the TLS subscription, wakes the waiter.
async fn lifecycle_and_wake_up(url: &str, work: &str) {
    let store = Arc::new(RedisStore::connect(url).await.expect("connect over TLS"));
    let ttl = Duration::from_secs(30);
    let a = Leases::new(store, Config::new("tls-a", ttl)).expect("config");
    let t = checkpoint_round_trip(&a, work).await;
    let t = a.renew(&t).await.expect("renew over TLS");
    let attempts = Counter::new();
    let waiter_store = FaultStore::over(Arc::new(RedisStore::open(url).expect("URL")))
        .count_acquires_in(attempts.clone());
    let b = Leases::new(Arc::new(waiter_store), Config::new("tls-b", ttl)).expect("config");
    let waiter = tokio::spawn({
        let (b, work) = (b.clone(), work.to_string());
        async move {
            let options = AcquireOptions::new()
                .wait_for_lease()
                .poll_interval(Duration::from_secs(3600));
            b.acquire(&work, options).await
        }
    });
    // Its first attempt runs once it is subscribed.
    attempts.reaches(1).await;
    a.release(t).await.expect("release over TLS");
    let t = tokio::time::timeout(Duration::from_secs(600), waiter)
        .await
        .expect("the announcement woke the waiter")
        .expect("waiter task")
        .expect("the waiter gets the lease");
    assert_eq!(attempts.get(), 2, "one attempt per wake-up");
    b.release(t).await.expect("release");
}

/// A server that listens with TLS only, with a certificate of a
/// throwaway CA for 127.0.0.1, and requires client certificates of that
/// CA, takes `rediss://` URLs that trust that CA and give a client
/// certificate: a whole lifecycle works, and a waiter is woken through
/// the subscription (over TLS too). Without `cacert` (the system's
/// roots), with another CA, without a client certificate, or for a
/// server whose certificate names another host, connecting fails with
/// an error that says why; the password never shows.
#[tokio::test]
async fn tls_server_takes_rediss_urls_that_trust_its_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca_pem, issuer) = test_ca("worklease test CA");
    let (other_ca_pem, _) = test_ca("another CA");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write PEM");
        path.display().to_string()
    };
    let ca = write("ca.pem", &ca_pem);
    let other_ca = write("other-ca.pem", &other_ca_pem);
    let (pem, key) = signed_cert(&issuer, "127.0.0.1");
    let (server_cert, server_key) = (write("server.pem", &pem), write("server-key.pem", &key));
    let (pem, key) = signed_cert(&issuer, "worklease-test-client");
    let (client_cert, client_key) = (write("client.pem", &pem), write("client-key.pem", &key));
    let (pem, key) = signed_cert(&issuer, "redis.invalid");
    let (wrong_cert, wrong_key) = (write("wrong.pem", &pem), write("wrong-key.pem", &key));

    let server_args = |cert: &str, key: &str, auth_clients: &str| {
        [
            "--tls-cert-file",
            cert,
            "--tls-key-file",
            key,
            "--tls-ca-cert-file",
            ca.as_str(),
            "--tls-auth-clients",
            auth_clients,
            "--requirepass",
            "s3cret",
        ]
        .map(str::to_string)
    };
    let args = server_args(&server_cert, &server_key, "yes");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = OwnServer::start_tls(dir.path(), &args);
    let base = format!("rediss://:s3cret@127.0.0.1:{}/0?prefix=tls%3A", server.port);
    let url = format!(
        "{base}&cacert={}&cert={}&key={}",
        enc(&ca),
        enc(&client_cert),
        enc(&client_key)
    );

    let config = RedisConfig::from_url(&url).expect("a rediss:// URL");
    assert_eq!(
        RedisConfig::from_url(&config.to_url()).expect("round trip"),
        config
    );
    assert!(!format!("{config:?}").contains("s3cret"), "{config:?}");
    lifecycle_and_wake_up(&url, "jobs/tls").await;

    // A certificate that names another host.
    let args = server_args(&wrong_cert, &wrong_key, "no");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let wrong = OwnServer::start_tls(dir.path(), &args);
    // Refused connections are retried by the connection manager (about
    // 6 s of back-off): the four refusals run at once.
    let (no_ca, other, no_client_cert, wrong_name, plain, nobody) = tokio::join!(
        // The system's roots do not hold the throwaway CA.
        refused(format!(
            "{base}&cert={}&key={}",
            enc(&client_cert),
            enc(&client_key)
        )),
        // The other CA signed nothing of the server's.
        refused(format!(
            "{base}&cacert={}&cert={}&key={}",
            enc(&other_ca),
            enc(&client_cert),
            enc(&client_key)
        )),
        // The server wants a client certificate.
        refused(format!("{base}&cacert={}", enc(&ca))),
        refused(format!(
            "rediss://:s3cret@127.0.0.1:{}/0?cacert={}",
            wrong.port,
            enc(&ca)
        )),
        // No TLS at all: the server hangs up, and the message says what
        // that likely means.
        refused(format!(
            "redis://:s3cret@127.0.0.1:{}/0?prefix=tls%3A",
            server.port
        )),
        // Nothing listens there: nobody hung up, no TLS hint.
        refused(format!(
            "redis://127.0.0.1:{}/0",
            super::server::free_port()
        )),
    );
    assert!(!nobody.contains("rediss://"), "{nobody}");
    for text in [&no_ca, &other] {
        assert!(text.contains("not signed by a trusted CA"), "{text}");
    }
    assert!(
        no_client_cert.contains("cannot connect to rediss://"),
        "{no_client_cert}"
    );
    assert!(
        wrong_name.contains("does not name the host"),
        "{wrong_name}"
    );
    assert!(
        plain.contains("write rediss://") && plain.contains("?prefix=tls:"),
        "{plain}"
    );
    for text in [no_ca, other, no_client_cert, wrong_name, plain] {
        assert!(!text.contains("s3cret"), "{text}");
    }
}

/// A Redis Cluster over TLS (`tls-cluster yes`, `tls-replication yes`;
/// three primaries with a replica each, certificates of a throwaway CA)
/// takes `rediss+cluster://` URLs that trust that CA, with the replica
/// wait on: a lifecycle works and a waiter is woken through the TLS
/// subscription. Without `cacert`, connecting fails and says why.
#[tokio::test]
async fn tls_cluster_takes_rediss_cluster_urls_that_trust_its_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca_pem, issuer) = test_ca("worklease cluster CA");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write PEM");
        path.display().to_string()
    };
    let ca = write("ca.pem", &ca_pem);
    let (pem, key) = signed_cert(&issuer, "127.0.0.1");
    let (cert, key) = (write("node.pem", &pem), write("node-key.pem", &key));
    let server = ["--tls-cert-file", &cert, "--tls-key-file", &key]
        .into_iter()
        .chain(["--tls-ca-cert-file", &ca, "--tls-auth-clients", "no"])
        .map(str::to_string)
        .collect();
    let cli = ["--tls", "--cacert", &ca].map(str::to_string).to_vec();
    let tls = ClusterTls { server, cli };
    let shape = Shape {
        replicas: 1,
        tls: Some(&tls),
        ..Shape::default()
    };
    let cluster = Cluster::start_with(&shape).await;
    let base = cluster.url_with("rediss+cluster", "tls%3A");
    let url = format!(
        "{base}&cacert={}&wait_replicas=1&wait_timeout_ms=2000",
        enc(&ca)
    );
    let config = RedisConfig::from_url(&url).expect("a rediss+cluster:// URL");
    assert_eq!(
        RedisConfig::from_url(&config.to_url()).expect("round trip"),
        config
    );
    lifecycle_and_wake_up(&url, "jobs/tls-cluster").await;

    // The system's roots do not hold the throwaway CA.
    let text = refused(base).await;
    assert!(text.contains("not signed by a trusted CA"), "{text}");
}
