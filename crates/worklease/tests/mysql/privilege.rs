//! Least privilege: a user with only [`TABLE_PRIVILEGES`] on the lease
//! table, [`FENCING_PRIVILEGES`] on its fencing table and
//! [`PROCEDURE_PRIVILEGES`] on its procedures runs the whole conformance
//! suite; a user that may not create gets the DDL in its error; a user
//! missing one privilege gets an error naming it and the object. Each
//! test makes its own user and tables, dropped afterwards. (A module of
//! `tests/mysql.rs`.)

use std::sync::Arc;

use worklease::store::mysql::mysql_async::{self, prelude::Queryable};
use worklease::store::mysql::{
    MysqlOptions, MysqlStore, TableName, FENCING_PRIVILEGES, PROCEDURE_PRIVILEGES, TABLE_PRIVILEGES,
};
use worklease::Error;

use super::common_privilege::{life, run_to_end, store_error_of_life, suite_keeping};
use super::{fresh_table, server_url};

/// The grants of one user: on the table, the fencing table, each procedure.
struct Grants<'a> {
    table: &'a str,
    fencing: &'a str,
    procedures: &'a str,
}

const ALL: Grants<'static> = Grants {
    table: TABLE_PRIVILEGES,
    fencing: FENCING_PRIVILEGES,
    procedures: PROCEDURE_PRIVILEGES,
};

/// A user and a table name of one test, dropped when it is.
struct Scratch {
    user: String,
    table: TableName,
}

/// Runs each of `statements` as the shared server's (owning) user.
async fn as_owner(statements: &[String]) {
    let opts = mysql_async::Opts::from_url(&server_url()).expect("server URL");
    let mut conn = mysql_async::Conn::new(opts)
        .await
        .expect("the owner connects");
    for sql in statements {
        conn.query_drop(sql).await.expect(sql);
    }
    conn.disconnect().await.expect("disconnect");
}

impl Scratch {
    /// A fresh user with no privilege, and a fresh table name.
    async fn new() -> Self {
        let user = format!("wl_user_{:08x}", rand::random::<u32>());
        as_owner(&[format!("CREATE USER '{user}'@'%'")]).await;
        let table = TableName::new(&fresh_table("priv")).expect("table name");
        Self { user, table }
    }

    /// Has the owner create the table with [`TableName::ddl_statements`]
    /// and grant the user `grants`.
    async fn create_and_grant(&self, grants: &Grants<'_>) {
        let account = format!("'{}'@'%'", self.user);
        let mut sql = self.table.ddl_statements();
        let mut grant = |privileges: &str, object: String| {
            if !privileges.is_empty() {
                sql.push(format!("GRANT {privileges} ON {object} TO {account}"));
            }
        };
        grant(grants.table, self.table.quoted());
        grant(grants.fencing, self.table.fencing_quoted());
        for name in self.table.procedure_names() {
            grant(grants.procedures, format!("PROCEDURE `{name}`"));
        }
        as_owner(&sql).await;
    }

    /// A store that connects as the user.
    fn store(&self) -> MysqlStore {
        let opts = mysql_async::Opts::from_url(&server_url()).expect("server URL");
        let opts = mysql_async::OptsBuilder::from_opts(opts).user(Some(&self.user));
        MysqlStore::new(opts.into(), MysqlOptions::new().table(self.table.clone())).expect("store")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let t = self.table.as_str();
        let mut sql = vec![
            format!("DROP USER IF EXISTS '{}'@'%'", self.user),
            format!("DROP TABLE IF EXISTS `{t}`, `{t}_fencing`"),
        ];
        for name in self.table.procedure_names() {
            sql.push(format!("DROP PROCEDURE IF EXISTS `{name}`"));
        }
        run_to_end(async move { as_owner(&sql).await });
    }
}

worklease::conformance_tests!(least_privilege_user, paused = false, async {
    let scratch = Scratch::new().await;
    scratch.create_and_grant(&ALL).await;
    let mut suite = suite_keeping(Arc::new(scratch.store()), scratch);
    // Without DELETE (GC_PRIVILEGES) gc is refused naming it (checked);
    // every lease operation works.
    suite.deletes = false;
    suite
});

/// Without `CREATE` and without the table: an error carrying the DDL,
/// which an owner runs; then the user starts.
#[tokio::test]
async fn a_user_that_may_not_create_gets_the_ddl() {
    let scratch = Scratch::new().await;
    // Some privilege in the database, so that the user may connect to it.
    let opts = mysql_async::Opts::from_url(&server_url()).expect("server URL");
    let db = opts.db_name().expect("the URL names a database");
    as_owner(&[format!(
        "GRANT {PROCEDURE_PRIVILEGES} ON `{db}`.* TO '{}'@'%'",
        scratch.user
    )])
    .await;
    let e = scratch.store().initialize().await.expect_err("no CREATE");
    let text = e.to_string();
    // A set-up error: waiting does not cure it.
    assert!(matches!(e, Error::StoreSetup(_)), "{e:?}");
    assert!(
        text.contains(&scratch.table.ddl())
            && text.contains(&format!("{TABLE_PRIVILEGES} ON {}", scratch.table.quoted()))
            && text.contains("CREATE command denied"),
        "{text}"
    );
    scratch.create_and_grant(&ALL).await;
    life(Arc::new(scratch.store()))
        .await
        .expect("the whole life, once the owner ran the DDL");
}

/// `list` without `p`.
fn without(list: &str, p: &str) -> String {
    list.split(", ")
        .filter(|q| *q != p)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Each listed privilege is needed: without any one of them the lease's
/// life fails with an error naming the privilege (the server's "...
/// command denied") and the privileges the store needs.
#[tokio::test]
async fn a_missing_privilege_is_named() {
    let mut cases = Vec::new();
    for p in TABLE_PRIVILEGES.split(", ") {
        cases.push((
            p,
            without(TABLE_PRIVILEGES, p),
            FENCING_PRIVILEGES.into(),
            PROCEDURE_PRIVILEGES.into(),
        ));
    }
    for p in FENCING_PRIVILEGES.split(", ") {
        cases.push((
            p,
            TABLE_PRIVILEGES.into(),
            without(FENCING_PRIVILEGES, p),
            PROCEDURE_PRIVILEGES.into(),
        ));
    }
    cases.push((
        PROCEDURE_PRIVILEGES,
        TABLE_PRIVILEGES.into(),
        FENCING_PRIVILEGES.into(),
        String::new(),
    ));
    for (missing, table, fencing, procedures) in cases {
        let scratch = Scratch::new().await;
        let grants = Grants {
            table: &table,
            fencing: &fencing,
            procedures: &procedures,
        };
        scratch.create_and_grant(&grants).await;
        let text = store_error_of_life(Arc::new(scratch.store())).await;
        // Without EXECUTE the procedures are hidden: the error is the
        // DDL's, which names the grant.
        let named = if missing == PROCEDURE_PRIVILEGES {
            text.contains(&format!("{PROCEDURE_PRIVILEGES} ON PROCEDURE"))
                && text.contains("may not execute is hidden")
        } else {
            text.contains("lacks a privilege")
                && text
                    .to_uppercase()
                    .contains(&format!("{missing} COMMAND DENIED"))
        };
        assert!(
            named && text.contains(TABLE_PRIVILEGES),
            "without {missing}: {text}"
        );
    }
}
