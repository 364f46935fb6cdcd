//! The store's settings: the table name, [`PostgresOptions`], the
//! `postgres://` URL and its parsing, and the password-free description of
//! a connection.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{InvalidInput, Result};
pub use crate::store::sql_config::DEFAULT_TABLE;
use crate::store::sql_config::{
    param_value, plain_lower_case, rebuilt, split_url, sql_options, sql_url,
};
use crate::store::url_parts::url_error;

use super::PostgresStore;

/// The longest table name (without schema), in bytes: leaves room for the
/// sequence's suffix `_fencing_seq` within PostgreSQL's 63-byte names.
pub const MAX_TABLE_NAME_BYTES: usize = 48;

/// The longest `schema.table` (or `table`), in bytes: the notification
/// channel `worklease:<schema.table>` must fit PostgreSQL's 63-byte names.
pub const MAX_QUALIFIED_NAME_BYTES: usize = 63 - CHANNEL_PREFIX.len();

const CHANNEL_PREFIX: &str = "worklease:";
const SEQUENCE_SUFFIX: &str = "_fencing_seq";

/// The name of the lease table: `table` or `schema.table`, each part
/// matching `^[a-z_][a-z0-9_]*$` (lower-case, so it never needs case
/// folding), the table at most [`MAX_TABLE_NAME_BYTES`] bytes and the whole
/// at most [`MAX_QUALIFIED_NAME_BYTES`]. Always quoted in SQL. The schema
/// must exist; an unqualified table goes where `search_path` puts it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: Option<String>,
    table: String,
}

impl TableName {
    /// Checks and wraps a table name.
    ///
    /// # Errors
    /// [`InvalidInput::Config`] naming the rule `name` breaks.
    pub fn new(name: &str) -> Result<Self, InvalidInput> {
        let bad = |why: String| {
            InvalidInput::Config(format!(
                "PostgreSQL table name {name:?}: {why} (expected table or schema.table, \
                 each part matching ^[a-z_][a-z0-9_]*$)"
            ))
        };
        let (schema, table) = match name.split_once('.') {
            Some((s, t)) => (Some(s), t),
            None => (None, name),
        };
        if let Some(part) = schema
            .iter()
            .chain([&table])
            .find(|part| !plain_lower_case(part))
        {
            return Err(bad(format!("{part:?} is not a plain lower-case name")));
        }
        if table.len() > MAX_TABLE_NAME_BYTES {
            return Err(bad(format!(
                "the table name is {} bytes: the limit is {MAX_TABLE_NAME_BYTES}",
                table.len()
            )));
        }
        if name.len() > MAX_QUALIFIED_NAME_BYTES {
            return Err(bad(format!(
                "the name is {} bytes: the limit is {MAX_QUALIFIED_NAME_BYTES} \
                 (the notification channel must fit 63 bytes)",
                name.len()
            )));
        }
        Ok(Self {
            schema: schema.map(str::to_string),
            table: table.to_string(),
        })
    }

    /// The table as quoted SQL: `"table"` or `"schema"."table"`.
    pub fn quoted(&self) -> String {
        self.quoted_with(&self.table)
    }

    /// The fencing sequence as quoted SQL: `"<table>_fencing_seq"`, in the
    /// table's schema.
    pub fn sequence_quoted(&self) -> String {
        self.quoted_with(&format!("{}{SEQUENCE_SUFFIX}", self.table))
    }

    /// The notification channel: `worklease:<schema.table>`.
    pub fn channel(&self) -> String {
        format!("{CHANNEL_PREFIX}{self}")
    }

    /// The schema as quoted SQL, where the name gives one.
    pub(crate) fn schema_quoted(&self) -> Option<String> {
        self.schema.as_ref().map(|s| format!("\"{s}\""))
    }

    fn quoted_with(&self, name: &str) -> String {
        match &self.schema {
            Some(s) => format!("\"{s}\".\"{name}\""),
            None => format!("\"{name}\""),
        }
    }
}

impl Default for TableName {
    fn default() -> Self {
        Self {
            schema: None,
            table: DEFAULT_TABLE.to_string(),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "{s}.{}", self.table),
            None => f.write_str(&self.table),
        }
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_string(), f)
    }
}

sql_options! {
    /// Settings of a [`PostgresStore`] beyond the connection itself.
    pub struct PostgresOptions {
        wake_jitter: Duration = Duration::from_millis(5),
    }
}

impl PostgresOptions {
    /// Defaults: table [`DEFAULT_TABLE`], at most 16 pooled connections, a
    /// 5 s connect timeout, a wake jitter of up to 5 ms, connections kept
    /// as long as they work.
    pub fn new() -> Self {
        Self::default()
    }

    /// A woken waiter waits a random time from zero to this before its
    /// attempt, so that the waiters of one release do not all try at the
    /// same instant. Zero turns it off.
    pub fn wake_jitter(mut self, jitter: Duration) -> Self {
        self.wake_jitter = jitter;
        self
    }
}

sql_url! {
    /// A `postgres://` (or `postgresql://`) store URL, checked: the
    /// connection settings tokio-postgres accepts (`postgres://user:password@host:port/db?
    /// sslmode=...&application_name=...`) plus `table=NAME` for the lease
    /// table (see [`TableName`]). Its `Debug` form hides the password
    /// ([`crate::store::url::redact`]); [`PostgresUrl::as_str`] does not,
    /// since a child process needs it to connect.
    pub struct PostgresUrl opens PostgresStore with PostgresOptions;
    /// # Errors
    /// [`InvalidInput::StoreUrl`] (URL redacted) for another scheme, a
    /// malformed or unknown connection setting, or a bad table name.
}

/// A parsed URL: tokio-postgres's settings and ours.
#[cfg_attr(test, derive(Debug))]
#[cfg_attr(not(feature = "postgres-tls"), allow(dead_code))]
pub(super) struct UrlParts {
    pub(super) config: tokio_postgres::Config,
    pub(super) table: TableName,
    /// `sslrootcert`: a PEM file of the certificates to trust.
    pub(super) root_cert: Option<std::path::PathBuf>,
    /// TLS is asked for (`sslmode=require` or `verify-full`).
    pub(super) tls: bool,
}

/// The query settings tokio-postgres 0.7 reads (its `Config::param`), and
/// ours (`sslrootcert`; `table` is split off before).
const KNOWN_SETTINGS: &[&str] = &[
    "sslrootcert",
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslmode",
    "sslnegotiation",
    "host",
    "hostaddr",
    "port",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// Splits the worklease settings (`table`, `sslrootcert`) off a URL, maps
/// `sslmode=verify-full` to tokio-postgres's `require` (which verifies
/// here), and parses the rest with tokio-postgres.
pub(super) fn parse_url(url: &str) -> Result<UrlParts> {
    let url = url.trim();
    let split = split_url(
        url,
        &["postgres", "postgresql"],
        "a PostgreSQL URL starts with postgres://",
        str::to_owned,
        TableName::new,
    )?;
    let mut root_cert = None;
    let mut kept: Vec<&str> = Vec::new();
    for (name, param) in split.params {
        if !KNOWN_SETTINGS.contains(&name.as_str()) {
            // tokio-postgres would say only "invalid connection string".
            return Err(url_error(
                url,
                format!(
                    "unknown parameter {name:?}: the accepted ones are table, {}",
                    KNOWN_SETTINGS.join(", ")
                ),
            ));
        }
        match name.as_str() {
            "sslrootcert" => root_cert = Some(std::path::PathBuf::from(param_value(url, param)?)),
            "sslmode" if param_value(url, param)? == "verify-full" => kept.push("sslmode=require"),
            _ => kept.push(param),
        }
    }
    // `postgresql://` is read as `postgres://`, tokio-postgres's same.
    let rebuilt = rebuilt("postgres", split.base, &kept);
    let config = tokio_postgres::Config::from_str(&rebuilt).map_err(|e| {
        url_error(
            url,
            format!("{e} (settings are tokio-postgres's, plus table=NAME and sslrootcert=PATH)"),
        )
    })?;
    let tls = matches!(
        config.get_ssl_mode(),
        tokio_postgres::config::SslMode::Require
    );
    if (tls || root_cert.is_some()) && !cfg!(feature = "postgres-tls") {
        return Err(url_error(
            url,
            "sslmode=require, verify-full and sslrootcert need the cargo feature `postgres-tls`",
        ));
    }
    Ok(UrlParts {
        config,
        table: split.table,
        root_cert,
        tls,
    })
}

/// `postgres://user@host:port/db` from a configuration: never the password.
pub(super) fn describe(config: &tokio_postgres::Config) -> String {
    let user = config
        .get_user()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            };
            match config.get_ports().get(i).or(config.get_ports().first()) {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }
        })
        .collect();
    let db = config.get_dbname().unwrap_or_default();
    format!("postgres://{user}{}/{db}", hosts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sql_config::{assert_refused, assert_table_rule};

    #[test]
    fn table_names_are_checked() {
        assert_eq!(TableName::new("leases").unwrap().quoted(), "\"leases\"");
        let t = TableName::new("app.leases_2").unwrap();
        assert_eq!(t.quoted(), "\"app\".\"leases_2\"");
        assert_eq!(t.sequence_quoted(), "\"app\".\"leases_2_fencing_seq\"");
        assert_eq!(t.channel(), "worklease:app.leases_2");
        let bad = [
            "",
            "Leases",
            "1x",
            "a.b.c",
            "x;drop table y",
            "a\"b",
            ".x",
            "x.",
            "le ases",
        ];
        assert_table_rule(TableName::new, MAX_TABLE_NAME_BYTES, &bad);
        let qualified = format!("{}.{}", "s".repeat(20), "t".repeat(MAX_TABLE_NAME_BYTES));
        assert!(TableName::new(&qualified)
            .unwrap_err()
            .to_string()
            .contains("channel"));
    }

    #[test]
    fn urls_are_parsed_and_redacted() {
        let UrlParts {
            config, table, tls, ..
        } = parse_url(
            "postgres://app:s3cret@db.internal:6543/leases?table=wl.t&application_name=x",
        )
        .unwrap();
        assert!(!tls);
        assert_eq!(table.to_string(), "wl.t");
        assert_eq!(config.get_dbname(), Some("leases"));
        assert_eq!(config.get_application_name(), Some("x"));
        assert_eq!(config.get_ports(), &[6543]);
        assert_eq!(describe(&config), "postgres://app@db.internal:6543/leases");
        let parts = parse_url("PostgreSQL://h/db").unwrap();
        assert_eq!(parts.table, TableName::default());
        let twice = parse_url("postgres://u:s3cret@h/db?table=a&table=b")
            .err()
            .unwrap()
            .to_string();
        assert!(
            twice.contains("\"table\" appears twice") && !twice.contains("s3cret"),
            "{twice}"
        );
        let tls = parse_url("postgres://h/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem");
        if cfg!(feature = "postgres-tls") {
            let parts = tls.unwrap();
            assert!(parts.tls);
            assert_eq!(
                parts.root_cert.as_deref(),
                Some(std::path::Path::new("/etc/ca.pem"))
            );
        } else {
            assert!(tls.unwrap_err().to_string().contains("postgres-tls"));
        }
        let refused = [
            ("postgres://u:pw@h/db?table=Bad", "[a-z_]"),
            ("postgres://u:pw@h/db?bogus=1", "bogus"),
            ("postgres://u:pw@h:notaport/db", "port"),
            ("mysql://u:pw@h/db", "postgres://"),
        ];
        assert_refused(parse_url, "pw", &refused);
        let u = PostgresUrl::parse("postgres://u:pw@h/db?table=t").unwrap();
        assert!(!format!("{u:?}").contains("pw"));
        assert_eq!(u.as_str(), "postgres://u:pw@h/db?table=t");
    }
}
