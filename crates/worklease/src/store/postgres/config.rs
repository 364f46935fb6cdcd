//! The store's settings: the table name, [`PostgresOptions`], the
//! `postgres://` URL and its parsing, and the password-free description of
//! a connection.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{InvalidInput, Result};
use crate::store::url_parts::url_error;

use super::PostgresStore;

/// The table name used when none is configured.
pub const DEFAULT_TABLE: &str = "worklease_leases";

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
        for part in schema.iter().chain([&table]) {
            let mut chars = part.chars();
            let first_ok = chars
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
            if !first_ok || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                return Err(bad(format!("{part:?} is not a plain lower-case name")));
            }
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

/// Settings of a [`PostgresStore`] beyond the connection itself.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    pub(super) table: TableName,
    pub(super) max_connections: usize,
    pub(super) connect_timeout: Duration,
    pub(super) wake_jitter: Duration,
    pub(super) max_connection_lifetime: Option<Duration>,
    /// Create the table and its sequence when missing; `false` for
    /// commands that must create nothing.
    pub(super) create_schema: bool,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            table: TableName::default(),
            max_connections: 16,
            connect_timeout: Duration::from_secs(5),
            wake_jitter: Duration::from_millis(5),
            max_connection_lifetime: None,
            create_schema: true,
        }
    }
}

impl PostgresOptions {
    /// Defaults: table [`DEFAULT_TABLE`], at most 16 pooled connections, a
    /// 5 s connect timeout, a wake jitter of up to 5 ms, connections kept
    /// as long as they work.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lease table (see [`TableName`]).
    pub fn table(mut self, table: TableName) -> Self {
        self.table = table;
        self
    }

    /// The most pooled connections (at least 1; the listener's connection
    /// comes on top).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long opening a connection, or waiting for a free one in the
    /// pool, may take before the call fails with a store error. Applies
    /// where the connection settings name no `connect_timeout` of their own.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// A woken waiter waits a random time from zero to this before its
    /// attempt, so that the waiters of one release do not all try at the
    /// same instant. Zero turns it off.
    pub fn wake_jitter(mut self, jitter: Duration) -> Self {
        self.wake_jitter = jitter;
        self
    }

    /// Closes pooled connections older than this when they come back to the
    /// pool (for servers or proxies that want connections refreshed).
    /// Default: never.
    pub fn max_connection_lifetime(mut self, lifetime: Duration) -> Self {
        self.max_connection_lifetime = Some(lifetime);
        self
    }

    /// Whether the first call creates the store's table and sequence when
    /// the table is missing (default `true`). With `false` a missing table
    /// is a store error naming it ("no store"), and nothing is created:
    /// for read-only tools (`worklease status`, `leader`, `release`,
    /// `checkpoint`) and roles without `CREATE`, so that a mistyped table
    /// is not taken for an empty store.
    pub fn create_schema(mut self, on: bool) -> Self {
        self.create_schema = on;
        self
    }

    /// The configured table.
    pub fn table_name(&self) -> &TableName {
        &self.table
    }
}

/// A `postgres://` (or `postgresql://`) store URL, checked: the connection
/// settings tokio-postgres accepts (`postgres://user:password@host:port/db?
/// sslmode=...&application_name=...`) plus `table=NAME` for the lease
/// table (see [`TableName`]). Its `Debug` form hides the password
/// ([`crate::store::url::redact`]); [`PostgresUrl::as_str`] does not, since
/// a child process needs it to connect.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresUrl {
    url: String,
}

impl PostgresUrl {
    /// Checks a URL.
    ///
    /// # Errors
    /// [`InvalidInput::StoreUrl`] (URL redacted) for another scheme, a
    /// malformed or unknown connection setting, or a bad table name.
    pub fn parse(url: &str) -> Result<Self> {
        let _ = parse_url(url)?;
        Ok(Self {
            url: url.trim().to_string(),
        })
    }

    /// The URL as given, password included: keep it out of logs (use
    /// [`crate::store::url::redact`]).
    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// Opens the store the URL names (connecting lazily, on first use).
    ///
    /// # Errors
    /// As [`PostgresStore::from_url`].
    pub fn open(&self) -> Result<PostgresStore> {
        PostgresStore::from_url(&self.url)
    }

    /// Opens the store without creating its schema
    /// ([`PostgresOptions::create_schema`]): a missing table is an error.
    ///
    /// # Errors
    /// As [`PostgresStore::from_url`].
    pub fn open_existing(&self) -> Result<PostgresStore> {
        let mut store = PostgresStore::from_url(&self.url)?;
        store.options.create_schema = false;
        Ok(store)
    }
}

impl fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&crate::store::url_parts::redact(&self.url), f)
    }
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

/// Splits the worklease settings (`table`, `sslrootcert`) off a URL, maps
/// `sslmode=verify-full` to tokio-postgres's `require` (which verifies
/// here), and parses the rest with tokio-postgres.
pub(super) fn parse_url(url: &str) -> Result<UrlParts> {
    let url = url.trim();
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(url_error(url, "a PostgreSQL URL starts with postgres://"));
    };
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "postgres" && scheme != "postgresql" {
        return Err(url_error(url, "a PostgreSQL URL starts with postgres://"));
    }
    let (base, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let mut table = TableName::default();
    let mut root_cert = None;
    let mut kept: Vec<&str> = Vec::new();
    // A parameter given twice is refused: "last one wins" would let a
    // copy-paste slip put two fleets on two tables.
    let mut seen = std::collections::HashSet::new();
    for param in query.into_iter().flat_map(|q| q.split('&')) {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| url_error(url, format!("query parameter {key:?} is not UTF-8")))
        };
        let name = decode(key)?;
        if !param.is_empty() && !seen.insert(name.clone()) {
            return Err(url_error(
                url,
                format!("the parameter {name:?} appears twice"),
            ));
        }
        match name.as_str() {
            "table" => {
                table =
                    TableName::new(&decode(value)?).map_err(|e| url_error(url, e.to_string()))?
            }
            "sslrootcert" => root_cert = Some(std::path::PathBuf::from(decode(value)?)),
            "sslmode" if decode(value)? == "verify-full" => kept.push("sslmode=require"),
            _ if param.is_empty() => {}
            _ => kept.push(param),
        }
    }
    let rebuilt = if kept.is_empty() {
        format!("{scheme}://{base}")
    } else {
        format!("{scheme}://{base}?{}", kept.join("&"))
    };
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
        table,
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

    #[test]
    fn table_names_are_checked() {
        assert_eq!(TableName::new("leases").unwrap().quoted(), "\"leases\"");
        let t = TableName::new("app.leases_2").unwrap();
        assert_eq!(t.quoted(), "\"app\".\"leases_2\"");
        assert_eq!(t.sequence_quoted(), "\"app\".\"leases_2_fencing_seq\"");
        assert_eq!(t.channel(), "worklease:app.leases_2");
        for bad in [
            "",
            "Leases",
            "1x",
            "a.b.c",
            "x;drop table y",
            "a\"b",
            ".x",
            "x.",
            "le ases",
        ] {
            let e = TableName::new(bad).unwrap_err().to_string();
            assert!(e.contains("[a-z_]"), "{bad:?}: {e}");
        }
        let long = "t".repeat(MAX_TABLE_NAME_BYTES + 1);
        assert!(TableName::new(&long)
            .unwrap_err()
            .to_string()
            .contains(&MAX_TABLE_NAME_BYTES.to_string()));
        let qualified = format!("{}.{}", "s".repeat(20), "t".repeat(MAX_TABLE_NAME_BYTES));
        assert!(TableName::new(&qualified)
            .unwrap_err()
            .to_string()
            .contains("channel"));
        assert!(TableName::new(&"t".repeat(MAX_TABLE_NAME_BYTES)).is_ok());
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
        for (url, want) in [
            ("postgres://u:pw@h/db?table=Bad", "[a-z_]"),
            ("postgres://u:pw@h/db?bogus=1", "bogus"),
            ("postgres://u:pw@h:notaport/db", "port"),
            ("mysql://u:pw@h/db", "postgres://"),
        ] {
            let e = parse_url(url).unwrap_err().to_string();
            assert!(e.contains(want), "{url}: {e}");
            assert!(!e.contains("pw"), "the password leaked: {e}");
        }
        let u = PostgresUrl::parse("postgres://u:pw@h/db?table=t").unwrap();
        assert!(!format!("{u:?}").contains("pw"));
        assert_eq!(u.as_str(), "postgres://u:pw@h/db?table=t");
    }
}
