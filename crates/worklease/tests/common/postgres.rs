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

/// A database of the shared server whose default transaction isolation is
/// SERIALIZABLE (`ALTER DATABASE ... SET default_transaction_isolation`,
/// as a DBA may set it) and whose `synchronous_commit` is off, created once per test process and named
/// `wl_test_serializable_*`; its URL. `.ci/services/postgres.sh` drops such
/// databases at exit on a shared server (a throwaway cluster goes whole).
#[allow(dead_code)] // Used by tests/postgres.rs only.
pub(crate) async fn serializable_database_url() -> String {
    static URL: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    URL.get_or_init(|| async {
        let url = server_url();
        let name = format!("wl_test_serializable_{:08x}", rand::random::<u32>());
        let (client, connection) = worklease::store::postgres::tokio_postgres::connect(
            &url,
            worklease::store::postgres::tokio_postgres::NoTls,
        )
        .await
        .expect("the shared server answers");
        let connection = tokio::spawn(connection);
        // Two messages: CREATE DATABASE cannot run in the implicit
        // transaction of a multi-statement one.
        for sql in [
            format!("CREATE DATABASE {name}"),
            format!("ALTER DATABASE {name} SET default_transaction_isolation = 'serializable'"),
            format!("ALTER DATABASE {name} SET synchronous_commit = off"),
        ] {
            client.batch_execute(&sql).await.expect(&sql);
        }
        drop(client);
        let _ = connection.await;
        let (base, _) = url.rsplit_once('/').expect("a URL with a database");
        format!("{base}/{name}")
    })
    .await
    .clone()
}
