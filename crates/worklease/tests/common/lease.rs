//! Steps of a lease's life that the tests of the networked stores share
//! (`tests/postgres.rs`, `tests/mysql.rs`, `tests/redis.rs`): a lease
//! acquired with a checkpoint, and the error of a server that cannot be
//! reached, which must not show the password of its URL.

use std::sync::Arc;
use std::time::Duration;

use worklease::{AcquireOptions, Config, Error, LeaseStore, Leases, Token};

/// Acquires `work` with `leases` and checkpoints `data`; returns the
/// token, still held.
pub(crate) async fn acquire_checkpointed(
    leases: &Leases,
    work: &str,
    data: &'static [u8],
) -> Token {
    let t = leases
        .acquire(work, AcquireOptions::new())
        .await
        .expect("acquire");
    leases.checkpoint(&t, data).await.expect("checkpoint")
}

/// The error of a first acquisition through `store`, whose server refuses
/// it or cannot be reached, shown in full (`Display` and `Debug`); asserts
/// that the text does not contain `secret` (the URL's password).
pub(crate) async fn refusal_without(store: Arc<dyn LeaseStore>, secret: &str) -> (Error, String) {
    let a = Leases::new(store, Config::new("url-a", Duration::from_secs(5))).expect("config");
    let e = a
        .acquire("jobs/unreachable", AcquireOptions::new())
        .await
        .expect_err("the server refuses or cannot be reached");
    let shown = format!("{e} {e:?}");
    assert!(!shown.contains(secret), "the password leaked: {shown}");
    (e, shown)
}

/// Checks the error of a store whose server nothing answers for: a store
/// error (transient, so that renewal retries it) that names the server
/// (`server`: its port, or address and port) and hides `secret`.
pub(crate) async fn unreachable_error_is_redacted(
    store: Arc<dyn LeaseStore>,
    secret: &str,
    server: &str,
) {
    let (e, shown) = refusal_without(store, secret).await;
    assert!(e.is_transient(), "{e:?}");
    assert!(
        shown.contains(server),
        "the error names the server: {shown}"
    );
}
