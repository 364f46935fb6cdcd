//! What the least-privilege tests of the SQL stores share: a lease's
//! whole life, whose first failure is the privilege missing, and a
//! cleanup that runs async SQL from `Drop`. (A module of
//! `tests/postgres.rs` and `tests/mysql.rs`.)

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use worklease::{AcquireOptions, Config, Error, LeaseStore, Leases};

/// The first failure of a lease's whole life (acquire, checkpoint, renew,
/// read, release, status) on `store`.
pub async fn life(store: Arc<dyn LeaseStore>) -> Result<(), Error> {
    let a = Leases::new(
        store.clone(),
        Config::new("priv-a", Duration::from_secs(30)),
    )?;
    let t = a.acquire("jobs/priv", AcquireOptions::new()).await?;
    let t = a.checkpoint(&t, &b"state"[..]).await?;
    let t = a.renew(&t).await?;
    a.read_checkpoint(&t).await?;
    a.release(t).await?;
    store.inspect(&[]).await?;
    Ok(())
}

/// Runs `cleanup` to its end from a `Drop`, which runs inside a test's
/// runtime: on a thread and runtime of its own.
pub fn run_to_end(cleanup: impl Future<Output = ()> + Send + 'static) {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(cleanup);
    })
    .join()
    .expect("the cleanup ran");
}

/// The conformance suite on `store`, keeping `guard` (the test's role or
/// user and tables, dropped after the check) alive as long as the store.
pub fn suite_keeping(
    store: Arc<dyn LeaseStore>,
    guard: impl std::any::Any + Send + Sync,
) -> worklease::conformance::Suite {
    worklease::conformance::Suite::new(Arc::new(
        worklease::store::fault::FaultStore::over(store).with_guard(Arc::new(guard)),
    ))
}

/// The text of the store error that ends a lease's [`life`] on `store`,
/// where a privilege is missing.
pub async fn store_error_of_life(store: Arc<dyn LeaseStore>) -> String {
    let e = life(store).await.expect_err("a privilege is missing");
    // A set-up error: waiting does not cure it.
    assert!(matches!(e, Error::StoreSetup(_)), "{e:?}");
    e.to_string()
}
