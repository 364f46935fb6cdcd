//! The shared PostgreSQL test server (`tests/postgres.rs`,
//! `tests/network_faults.rs`): its URL, and dropping a test's table.

use worklease::store::postgres::PostgresStore;

/// The shared server's URL: `WORKLEASE_TEST_POSTGRES_URL`, by default
/// `postgres://postgres@127.0.0.1:5432/test`.
pub(crate) fn server_url() -> String {
    std::env::var("WORKLEASE_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// Drops `store`'s table and its sequence.
pub(crate) async fn drop_table(store: &PostgresStore) {
    let client = store.pool().get().await.expect("connection");
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {}; DROP SEQUENCE IF EXISTS {}",
            store.table().quoted(),
            store.table().sequence_quoted()
        ))
        .await
        .expect("drop the test table");
}
