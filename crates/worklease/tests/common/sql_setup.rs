//! What only an operator can cure is a set-up error (`Error::StoreSetup`,
//! not transient), also when the server refuses the connection itself, so
//! that `worklease run --wait` exits 69 at once instead of waiting forever
//! (a break-test of issue 36 found both stores waiting): a database or a
//! user that does not exist. A module of `tests/postgres.rs` and
//! `tests/mysql.rs`.

use worklease::Error;

use crate::common_sql_store::{fresh_table, SqlStore};

/// `url` (`scheme://user@host:port/db...`) with another user or database.
fn with_user_and_database(url: &str, user: Option<&str>, database: Option<&str>) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (old_user, rest) = rest.split_once('@').expect("a URL with a user");
    let (authority, path) = rest.split_once('/').expect("a URL with a database");
    let tail = path.find('?').map_or("", |i| &path[i..]);
    let db = database.unwrap_or(path.split('?').next().unwrap_or(path));
    format!(
        "{scheme}://{}@{authority}/{db}{tail}",
        user.unwrap_or(old_user)
    )
}

/// A database, then a user, that the server does not know: the store's
/// first operation fails with a set-up error naming the cause.
pub(crate) async fn a_missing_database_or_user_is_a_setup_error<S: SqlStore>() {
    let table = fresh_table("setup");
    let missing = format!("wl_test_missing_{:08x}", rand::random::<u32>());
    for (user, database) in [
        (None, Some(missing.as_str())),
        (Some(missing.as_str()), None),
    ] {
        let url = with_user_and_database(&S::shared_url(), user, database);
        let e = S::unopened(&url, &table)
            .init()
            .await
            .expect_err("the server refuses the connection");
        assert!(
            matches!(e, Error::StoreSetup(_)),
            "user {user:?}, database {database:?}: {e:?}"
        );
        assert!(e.to_string().contains(&missing), "names the cause: {e}");
    }
}
