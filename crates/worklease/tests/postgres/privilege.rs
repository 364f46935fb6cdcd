//! Least privilege: a role with only [`TABLE_PRIVILEGES`] on the lease
//! table and [`SEQUENCE_PRIVILEGES`] on its sequence runs the whole
//! conformance suite; a role that may not create gets the DDL in its
//! error; a role missing one privilege gets an error naming it and the
//! object. Each test makes its own schema (so that no `CREATE` on
//! `public` leaks in, whatever the server's version) and login role,
//! both dropped afterwards. (A module of `tests/postgres.rs`.)

use std::sync::Arc;

use worklease::store::postgres::tokio_postgres::{self, NoTls};
use worklease::store::postgres::{
    PostgresOptions, PostgresStore, TableName, SEQUENCE_PRIVILEGES, TABLE_PRIVILEGES,
};
use worklease::Error;

use super::common_privilege::{life, run_to_end, store_error_of_life, suite_keeping};
use super::server_url;

/// A schema and a login role of one test, dropped when it is.
struct Scratch {
    schema: String,
    role: String,
    table: TableName,
}

/// Runs `sql` as the shared server's (owning) user.
async fn as_owner(sql: &str) {
    let (client, conn) = tokio_postgres::connect(&server_url(), NoTls)
        .await
        .expect("the owner connects");
    let driver = tokio::spawn(conn);
    client.batch_execute(sql).await.expect("owner's statement");
    drop(client);
    let _ = driver.await;
}

impl Scratch {
    /// A fresh schema with the role's `USAGE` (nothing else: no `CREATE`)
    /// and a role that may log in.
    async fn new() -> Self {
        let id = format!("{:08x}", rand::random::<u32>());
        let (schema, role) = (format!("wl_priv_{id}"), format!("wl_role_{id}"));
        as_owner(&format!(
            "CREATE SCHEMA {schema}; CREATE ROLE {role} LOGIN; \
             GRANT USAGE ON SCHEMA {schema} TO {role}"
        ))
        .await;
        let table = TableName::new(&format!("{schema}.leases")).expect("table name");
        Self {
            schema,
            role,
            table,
        }
    }

    /// Has the owner create the table and sequence with [`TableName::ddl`]
    /// and grant the role `table` privileges and `sequence` ones.
    async fn create_and_grant(&self, table: &str, sequence: &str) {
        let (t, s, r) = (
            self.table.quoted(),
            self.table.sequence_quoted(),
            &self.role,
        );
        let mut sql = self.table.ddl();
        if !table.is_empty() {
            sql.push_str(&format!("GRANT {table} ON TABLE {t} TO {r};"));
        }
        if !sequence.is_empty() {
            sql.push_str(&format!("GRANT {sequence} ON SEQUENCE {s} TO {r};"));
        }
        as_owner(&sql).await;
    }

    /// A store that connects as the role.
    fn store(&self) -> PostgresStore {
        let mut config: tokio_postgres::Config = server_url().parse().expect("server URL");
        config.user(&self.role);
        PostgresStore::new(config, PostgresOptions::new().table(self.table.clone())).expect("store")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let sql = format!(
            "DROP SCHEMA IF EXISTS {} CASCADE; DROP OWNED BY {role}; DROP ROLE IF EXISTS {role}",
            self.schema,
            role = self.role
        );
        run_to_end(async move { as_owner(&sql).await });
    }
}

worklease::conformance_tests!(least_privilege_role, paused = false, async {
    let scratch = Scratch::new().await;
    scratch
        .create_and_grant(TABLE_PRIVILEGES, SEQUENCE_PRIVILEGES)
        .await;
    let mut suite = suite_keeping(Arc::new(scratch.store()), scratch);
    // Without DELETE (GC_PRIVILEGES) gc is refused naming it (checked);
    // every lease operation works.
    suite.deletes = false;
    suite
});

/// Without `CREATE` and without the table: an error carrying the DDL,
/// which an owner runs; then the role starts.
#[tokio::test]
async fn a_role_that_may_not_create_gets_the_ddl() {
    let scratch = Scratch::new().await;
    let e = scratch
        .store()
        .initialize()
        .await
        .expect_err("no CREATE on the schema");
    let text = e.to_string();
    // A set-up error: waiting does not cure it.
    assert!(matches!(e, Error::StoreSetup(_)), "{e:?}");
    assert!(
        text.contains("42501")
            && text.contains(&scratch.table.ddl())
            && text.contains(&format!(
                "{TABLE_PRIVILEGES} ON TABLE {}",
                scratch.table.quoted()
            )),
        "{text}"
    );
    scratch
        .create_and_grant(TABLE_PRIVILEGES, SEQUENCE_PRIVILEGES)
        .await;
    life(Arc::new(scratch.store()))
        .await
        .expect("the whole life, once the owner ran the DDL");
}

/// Each listed privilege is needed: without any one of them the lease's
/// life fails with an error naming the object the server refused, the
/// privileges the store needs, and SQLSTATE 42501.
#[tokio::test]
async fn a_missing_privilege_is_named() {
    let table: Vec<&str> = TABLE_PRIVILEGES.split(", ").collect();
    let mut cases: Vec<(String, &str, &str)> = table
        .iter()
        .map(|p| {
            let rest: Vec<&str> = table.iter().copied().filter(|q| q != p).collect();
            (rest.join(", "), SEQUENCE_PRIVILEGES, "table")
        })
        .collect();
    cases.push((TABLE_PRIVILEGES.to_string(), "", "sequence"));
    for (table_grants, sequence_grants, object) in cases {
        let scratch = Scratch::new().await;
        scratch
            .create_and_grant(&table_grants, sequence_grants)
            .await;
        let text = store_error_of_life(Arc::new(scratch.store())).await;
        assert!(
            text.contains("lacks a privilege (SQLSTATE 42501)")
                && text.contains(&format!("permission denied for {object}"))
                && text.contains(TABLE_PRIVILEGES),
            "granted {table_grants:?} and {sequence_grants:?}: {text}"
        );
    }
}
