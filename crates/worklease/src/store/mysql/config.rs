//! The store's settings: the table name, [`MysqlOptions`], the `mysql://`
//! URL and its parsing (`table`, `ssl-mode`, `ssl-ca`), and the
//! password-free description of a connection.

use std::fmt;
use std::time::Duration;

use crate::error::{InvalidInput, Result};
use crate::store::url_parts::url_error;

use super::MysqlStore;

/// The table name used when none is configured.
pub const DEFAULT_TABLE: &str = "worklease_leases";

/// The longest table name, in bytes: the stored procedures are named
/// `<table>_v<version>_<operation>` (the longest suffix is
/// `_v1_acquire_many`, 16 bytes) and must fit MySQL's 64-byte names.
pub const MAX_TABLE_NAME_BYTES: usize = 48;

/// The operations that have a stored procedure (`take` is the one the
/// others call).
const PROCEDURES: [&str; 6] = [
    "take",
    "acquire",
    "acquire_many",
    "update",
    "update_many",
    "revoke",
];

/// The name of the lease table in the URL's database: matching
/// `^[a-z_][a-z0-9_]*$` (lower-case, so that it means the same table on
/// servers with case-sensitive and case-insensitive table names), at most
/// [`MAX_TABLE_NAME_BYTES`] bytes. Always quoted in SQL (`` `name` ``).
/// The store also creates `<table>_fencing` (the fencing sequence) and
/// stored procedures named `<table>_v1_...`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName(String);

impl TableName {
    /// Checks and wraps a table name.
    ///
    /// # Errors
    /// [`InvalidInput::Config`] naming the rule `name` breaks.
    pub fn new(name: &str) -> Result<Self, InvalidInput> {
        let bad = |why: String| {
            InvalidInput::Config(format!(
                "MySQL table name {name:?}: {why} (expected a name matching ^[a-z_][a-z0-9_]*$, \
                 at most {MAX_TABLE_NAME_BYTES} bytes)"
            ))
        };
        let mut chars = name.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        if !first_ok || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
            return Err(bad("not a plain lower-case name".to_string()));
        }
        if name.len() > MAX_TABLE_NAME_BYTES {
            return Err(bad(format!(
                "the name is {} bytes: the limit is {MAX_TABLE_NAME_BYTES}",
                name.len()
            )));
        }
        Ok(Self(name.to_string()))
    }

    /// The table as quoted SQL: `` `table` ``.
    pub fn quoted(&self) -> String {
        format!("`{}`", self.0)
    }

    /// The fencing sequence table as quoted SQL: `` `<table>_fencing` ``.
    pub fn fencing_quoted(&self) -> String {
        format!("`{}_fencing`", self.0)
    }

    /// The names of the table's stored procedures (unquoted), which the
    /// store creates beside the table: to remove a store for good, drop
    /// them with the table and its fencing table.
    pub fn procedure_names(&self) -> Vec<String> {
        PROCEDURES.iter().map(|op| self.procedure(op)).collect()
    }

    /// The name of the procedure of operation `op` (unquoted).
    pub(super) fn procedure(&self, op: &str) -> String {
        format!("{}_v{}_{op}", self.0, super::SCHEMA_VERSION)
    }

    /// The table name, unquoted.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TableName {
    fn default() -> Self {
        Self(DEFAULT_TABLE.to_string())
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// Settings of a [`MysqlStore`] beyond the connection itself.
#[derive(Debug, Clone)]
pub struct MysqlOptions {
    pub(super) table: TableName,
    pub(super) max_connections: usize,
    pub(super) connect_timeout: Duration,
    pub(super) max_connection_lifetime: Option<Duration>,
    /// Create the tables (and, for MySQL, the procedures) when missing;
    /// `false` for commands that must create nothing.
    pub(super) create_schema: bool,
}

impl Default for MysqlOptions {
    fn default() -> Self {
        Self {
            table: TableName::default(),
            max_connections: 16,
            connect_timeout: Duration::from_secs(5),
            max_connection_lifetime: None,
            create_schema: true,
        }
    }
}

impl MysqlOptions {
    /// Defaults: table [`DEFAULT_TABLE`], at most 16 pooled connections, a
    /// 5 s connect timeout, connections kept as long as they work.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lease table (see [`TableName`]).
    pub fn table(mut self, table: TableName) -> Self {
        self.table = table;
        self
    }

    /// The most pooled connections (at least 1).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long getting a connection (opening one, or waiting for a free
    /// one in the pool) may take before the call fails with a store error.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Closes pooled connections older than this when they come back to
    /// the pool (mysql_async's absolute connection TTL), for servers or
    /// proxies that want connections refreshed. Default: never.
    pub fn max_connection_lifetime(mut self, lifetime: Duration) -> Self {
        self.max_connection_lifetime = Some(lifetime);
        self
    }

    /// Whether the first call creates the store's schema when the table is
    /// missing (default `true`). With `false` a missing table is a store
    /// error naming it ("no store"), and nothing is created: for read-only
    /// tools (`worklease status`, `leader`, `release`, `checkpoint`) and
    /// roles without `CREATE`, so that a mistyped table is not taken for
    /// an empty store.
    pub fn create_schema(mut self, on: bool) -> Self {
        self.create_schema = on;
        self
    }

    /// The configured table.
    pub fn table_name(&self) -> &TableName {
        &self.table
    }
}

/// `ssl-mode`: MySQL's client option of that name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SslMode {
    /// `DISABLED` (the default here): plain TCP.
    Disabled,
    /// `REQUIRED`: encrypted, the certificate not verified (MySQL's meaning).
    Required,
    /// `VERIFY_CA`: encrypted, the certificate chain verified, not the name.
    VerifyCa,
    /// `VERIFY_IDENTITY`: encrypted, chain and host name verified.
    VerifyIdentity,
}

/// A `mysql://` (or `mariadb://`) store URL, checked:
/// `mysql://user[:password]@host[:port]/database?table=NAME&ssl-mode=MODE&ssl-ca=PATH`
/// plus mysql_async's own connection settings (`pool_max`, `tcp_nodelay`,
/// ...; not its TLS ones, which `ssl-mode` replaces). Its `Debug` form
/// hides the password ([`crate::store::url::redact`]); [`MysqlUrl::as_str`]
/// does not, since a child process needs it to connect.
#[derive(Clone, PartialEq, Eq)]
pub struct MysqlUrl {
    url: String,
}

impl MysqlUrl {
    /// Checks a URL.
    ///
    /// # Errors
    /// [`InvalidInput::StoreUrl`] (URL redacted) for another scheme, a
    /// missing database, a malformed or unknown setting, a bad table name
    /// or a TLS setting in a build without `mysql-tls`.
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
    /// As [`MysqlStore::from_url`].
    pub fn open(&self) -> Result<MysqlStore> {
        MysqlStore::from_url(&self.url)
    }

    /// Opens the store without creating its schema
    /// ([`MysqlOptions::create_schema`]): a missing table is an error.
    ///
    /// # Errors
    /// As [`MysqlStore::from_url`].
    pub fn open_existing(&self) -> Result<MysqlStore> {
        let mut store = MysqlStore::from_url(&self.url)?;
        store.options.create_schema = false;
        Ok(store)
    }
}

impl fmt::Debug for MysqlUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&crate::store::url_parts::redact(&self.url), f)
    }
}

/// A parsed URL: mysql_async's settings and ours.
#[cfg_attr(test, derive(Debug))]
pub(super) struct UrlParts {
    pub(super) opts: mysql_async::Opts,
    pub(super) table: TableName,
    #[cfg_attr(not(feature = "mysql-tls"), allow(dead_code))]
    pub(super) ssl_mode: SslMode,
    /// `ssl-ca`: a PEM file of the certificates to trust.
    #[cfg_attr(not(feature = "mysql-tls"), allow(dead_code))]
    pub(super) ssl_ca: Option<std::path::PathBuf>,
}

/// mysql_async's TLS settings, refused in favour of `ssl-mode`.
const ITS_TLS_PARAMS: [&str; 4] = [
    "require_ssl",
    "verify_ca",
    "verify_identity",
    "built_in_roots",
];

/// Splits our settings (`table`, `ssl-mode`, `ssl-ca`) off a URL and
/// parses the rest with mysql_async (`mariadb://` read as `mysql://`).
pub(super) fn parse_url(url: &str) -> Result<UrlParts> {
    let url = url.trim();
    let expected = "a MySQL URL starts with mysql:// or mariadb://";
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(url_error(url, expected));
    };
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "mysql" && scheme != "mariadb" {
        return Err(url_error(url, expected));
    }
    let (base, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let mut table = TableName::default();
    let mut ssl_mode = SslMode::Disabled;
    let mut ssl_ca = None;
    let mut kept: Vec<&str> = Vec::new();
    // A parameter given twice is refused: "last one wins" would let a
    // copy-paste slip put two fleets on two tables.
    let mut seen = std::collections::HashSet::new();
    for param in query.into_iter().flat_map(|q| q.split('&')) {
        if param.is_empty() {
            continue;
        }
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| url_error(url, format!("query parameter {key:?} is not UTF-8")))
        };
        let name = decode(key)?;
        // Both spellings of a setting are one setting (`ssl-mode` and
        // `ssl_mode`): a second one must not turn TLS off.
        if !seen.insert(name.replace('_', "-")) {
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
            "ssl-mode" | "ssl_mode" => {
                ssl_mode = match decode(value)?.to_ascii_uppercase().as_str() {
                    "DISABLED" => SslMode::Disabled,
                    "REQUIRED" => SslMode::Required,
                    "VERIFY_CA" => SslMode::VerifyCa,
                    "VERIFY_IDENTITY" => SslMode::VerifyIdentity,
                    other => {
                        return Err(url_error(
                            url,
                            format!(
                                "ssl-mode={other}: expected DISABLED, REQUIRED, VERIFY_CA or \
                                 VERIFY_IDENTITY (PREFERRED is not supported: it would fall \
                                 back to plain text silently)"
                            ),
                        ))
                    }
                }
            }
            "ssl-ca" | "ssl_ca" => ssl_ca = Some(std::path::PathBuf::from(decode(value)?)),
            its if ITS_TLS_PARAMS.contains(&its) => {
                return Err(url_error(
                    url,
                    format!("{its} is not taken here: use ssl-mode=REQUIRED|VERIFY_CA|VERIFY_IDENTITY and ssl-ca=PATH"),
                ))
            }
            _ => kept.push(param),
        }
    }
    if ssl_ca.is_some() && ssl_mode == SslMode::Disabled {
        return Err(url_error(
            url,
            "ssl-ca needs ssl-mode=VERIFY_CA or VERIFY_IDENTITY",
        ));
    }
    if ssl_mode != SslMode::Disabled && !cfg!(feature = "mysql-tls") {
        return Err(url_error(
            url,
            "ssl-mode other than DISABLED needs the cargo feature `mysql-tls`",
        ));
    }
    let rebuilt = if kept.is_empty() {
        format!("mysql://{base}")
    } else {
        format!("mysql://{base}?{}", kept.join("&"))
    };
    let opts = mysql_async::Opts::from_url(&rebuilt).map_err(|e| {
        url_error(
            url,
            format!(
                "{e} (settings are mysql_async's, plus table=NAME, ssl-mode=MODE and ssl-ca=PATH)"
            ),
        )
    })?;
    // An IPv6 address keeps its URL brackets in mysql_async's host name,
    // which then fails to resolve: connect to the address itself.
    let host = opts.ip_or_hostname();
    let opts = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(address) => {
            let address = address.to_string();
            mysql_async::Opts::from(
                mysql_async::OptsBuilder::from_opts(opts).ip_or_hostname(address),
            )
        }
        None => opts,
    };
    if opts.db_name().is_none_or(str::is_empty) {
        return Err(url_error(
            url,
            "the URL names no database: mysql://user@host:3306/DATABASE",
        ));
    }
    Ok(UrlParts {
        opts,
        table,
        ssl_mode,
        ssl_ca,
    })
}

/// `mysql://user@host:port/db` from the options: never the password.
pub(super) fn describe(opts: &mysql_async::Opts) -> String {
    let user = opts.user().map(|u| format!("{u}@")).unwrap_or_default();
    let host = opts.ip_or_hostname();
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    format!(
        "mysql://{user}{host}:{}/{}",
        opts.tcp_port(),
        opts.db_name().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_checked() {
        let t = TableName::new("leases_2").unwrap();
        assert_eq!(t.quoted(), "`leases_2`");
        assert_eq!(t.fencing_quoted(), "`leases_2_fencing`");
        for bad in [
            "",
            "Leases",
            "1x",
            "a.b",
            "x;drop table y",
            "a`b",
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
        assert!(TableName::new(&"t".repeat(MAX_TABLE_NAME_BYTES)).is_ok());
    }

    #[test]
    fn urls_are_parsed_and_redacted() {
        let parts =
            parse_url("mysql://app:s3cret@db.internal:3307/leases?table=wl_t&pool_max=40").unwrap();
        assert_eq!(parts.table.as_str(), "wl_t");
        assert_eq!(parts.ssl_mode, SslMode::Disabled);
        assert_eq!(parts.opts.db_name(), Some("leases"));
        assert_eq!(parts.opts.pass(), Some("s3cret"));
        assert_eq!(describe(&parts.opts), "mysql://app@db.internal:3307/leases");
        let v6 = parse_url("mysql://root@[::1]:3307/db").unwrap();
        assert_eq!(v6.opts.ip_or_hostname(), "::1");
        assert_eq!(describe(&v6.opts), "mysql://root@[::1]:3307/db");
        let parts = parse_url("MariaDB://h/db").unwrap();
        assert_eq!(parts.table, TableName::default());
        assert_eq!(parts.opts.tcp_port(), 3306);
        let tls = parse_url("mysql://h/db?ssl-mode=verify_identity&ssl-ca=%2Fetc%2Fca.pem");
        if cfg!(feature = "mysql-tls") {
            let parts = tls.unwrap();
            assert_eq!(parts.ssl_mode, SslMode::VerifyIdentity);
            assert_eq!(
                parts.ssl_ca.as_deref(),
                Some(std::path::Path::new("/etc/ca.pem"))
            );
        } else {
            assert!(tls.unwrap_err().to_string().contains("mysql-tls"));
        }
        for (url, want) in [
            ("mysql://u:pw@h/db?table=Bad", "[a-z_]"),
            ("mysql://u:pw@h/db?table=a&table=b", "appears twice"),
            ("mysql://u:pw@h/db?bogus=1", "bogus"),
            ("mysql://u:pw@h:notaport/db", "port"),
            ("mysql://u:pw@h", "no database"),
            ("mysql://u:pw@h/db?ssl-mode=PREFERRED", "PREFERRED"),
            (
                "mysql://u:pw@h/db?ssl-mode=REQUIRED&ssl_mode=DISABLED",
                "appears twice",
            ),
            ("mysql://u:pw@h/db?require_ssl=true", "ssl-mode"),
            ("mysql://u:pw@h/db?ssl-ca=%2Fca.pem", "ssl-ca needs"),
            ("postgres://u:pw@h/db", "mysql://"),
        ] {
            let e = parse_url(url).unwrap_err().to_string();
            assert!(e.contains(want), "{url}: {e}");
            assert!(!e.contains("pw@"), "the password leaked: {e}");
        }
        let u = MysqlUrl::parse("mysql://u:pw@h/db?table=t").unwrap();
        assert!(!format!("{u:?}").contains("pw"));
        assert_eq!(u.as_str(), "mysql://u:pw@h/db?table=t");
    }
}
