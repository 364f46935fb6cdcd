//! The store's settings: the table name, [`MysqlOptions`], the `mysql://`
//! URL and its parsing (`table`, `ssl-mode`, `ssl-ca`), and the
//! password-free description of a connection.

use std::fmt;
use std::time::Duration;

use crate::error::{InvalidInput, Result};
pub use crate::store::sql_config::DEFAULT_TABLE;
use crate::store::sql_config::{
    param_value, plain_lower_case, rebuilt, split_url, sql_options, sql_url,
};
use crate::store::url_parts::url_error;

use super::MysqlStore;

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
        if !plain_lower_case(name) {
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

sql_options! {
    /// Settings of a [`MysqlStore`] beyond the connection itself.
    pub struct MysqlOptions {}
}

impl MysqlOptions {
    /// Defaults: table [`DEFAULT_TABLE`], at most 16 pooled connections, a
    /// 5 s connect timeout, connections kept as long as they work.
    pub fn new() -> Self {
        Self::default()
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

sql_url! {
    /// A `mysql://` (or `mariadb://`) store URL, checked:
    /// `mysql://user[:password]@host[:port]/database?table=NAME&ssl-mode=MODE&ssl-ca=PATH`
    /// plus mysql_async's own connection settings (`pool_max`, `tcp_nodelay`,
    /// ...; not its TLS ones, which `ssl-mode` replaces). Its `Debug` form
    /// hides the password ([`crate::store::url::redact`]); [`MysqlUrl::as_str`]
    /// does not, since a child process needs it to connect.
    pub struct MysqlUrl opens MysqlStore with MysqlOptions;
    /// # Errors
    /// [`InvalidInput::StoreUrl`] (URL redacted) for another scheme, a
    /// missing database, a malformed or unknown setting, a bad table name
    /// or a TLS setting in a build without `mysql-tls`.
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
    // Both spellings of a setting are one setting (`ssl-mode` and
    // `ssl_mode`): a second one must not turn TLS off.
    let split = split_url(
        url,
        &["mysql", "mariadb"],
        "a MySQL URL starts with mysql:// or mariadb://",
        |name| name.replace('_', "-"),
        TableName::new,
    )?;
    let mut ssl_mode = SslMode::Disabled;
    let mut ssl_ca = None;
    let mut kept: Vec<&str> = Vec::new();
    for (name, param) in split.params {
        match name.as_str() {
            "ssl-mode" | "ssl_mode" => {
                ssl_mode = match param_value(url, param)?.to_ascii_uppercase().as_str() {
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
            "ssl-ca" | "ssl_ca" => ssl_ca = Some(std::path::PathBuf::from(param_value(url, param)?)),
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
    // `mariadb://` is read as `mysql://`.
    let opts = mysql_async::Opts::from_url(&rebuilt("mysql", split.base, &kept)).map_err(|e| {
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
        table: split.table,
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
    use crate::store::sql_config::{assert_refused, assert_table_rule};

    #[test]
    fn table_names_are_checked() {
        let t = TableName::new("leases_2").unwrap();
        assert_eq!(t.quoted(), "`leases_2`");
        assert_eq!(t.fencing_quoted(), "`leases_2_fencing`");
        let bad = [
            "",
            "Leases",
            "1x",
            "a.b",
            "x;drop table y",
            "a`b",
            "le ases",
        ];
        assert_table_rule(TableName::new, MAX_TABLE_NAME_BYTES, &bad);
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
        let refused = [
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
        ];
        assert_refused(parse_url, "pw@", &refused);
        let u = MysqlUrl::parse("mysql://u:pw@h/db?table=t").unwrap();
        assert!(!format!("{u:?}").contains("pw"));
        assert_eq!(u.as_str(), "mysql://u:pw@h/db?table=t");
    }
}
