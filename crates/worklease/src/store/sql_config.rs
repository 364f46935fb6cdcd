//! What the configurations of the SQL stores (`postgres`, `mysql`) share:
//! the default table and the rule of a table name's parts, the options
//! beyond the connection ([`sql_options!`]), the checked URL type that
//! hides its password ([`sql_url!`]) and the split of a URL into our
//! settings and the client library's. Each store's `config.rs` keeps what
//! differs: its table name type, its TLS settings, its client library.

use crate::error::{InvalidInput, Result};
use crate::store::url_parts::url_error;
use crate::store::url_query::QueryParams;

/// The table name used when none is configured.
pub const DEFAULT_TABLE: &str = "worklease_leases";

/// Whether `part` matches `^[a-z_][a-z0-9_]*$`: lower-case, so that it
/// never needs case folding and means the same table on every server.
pub(crate) fn plain_lower_case(part: &str) -> bool {
    let mut chars = part.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// A SQL store URL, split: what stands between `://` and `?`, the lease
/// table (`table=NAME`) and the other query
/// parameters, each given once (names percent-decoded; each with its
/// `name=value` text as written, to pass on to the client library or to
/// read with [`param_value`]).
pub(crate) struct SqlUrl<'a, T> {
    /// User info, hosts and database.
    pub(crate) base: &'a str,
    /// The lease table: `table=NAME`, else the default.
    pub(crate) table: T,
    /// The other parameters, in the order given.
    pub(crate) params: QueryParams<&'a str>,
}

/// Splits `url` (trimmed) as a [`SqlUrl`] whose scheme is one of `schemes`,
/// its table name checked by `table`; `setting` maps a parameter's name to
/// the setting it stands for (two spellings of one setting count as one
/// parameter).
///
/// # Errors
/// [`crate::error::InvalidInput::StoreUrl`]: `expected` for another
/// scheme, an `@` that is not the one ending the user info (a password
/// with a raw `@`, `?`, `/` or `#`), or a name or value that is not UTF-8 once percent-decoded, a
/// setting given twice, or the refusal of `table`.
pub(crate) fn split_url<'a, T: Default>(
    url: &'a str,
    schemes: &[&str],
    expected: &str,
    setting: fn(&str) -> String,
    table: fn(&str) -> std::result::Result<T, InvalidInput>,
) -> Result<SqlUrl<'a, T>> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(url_error(url, expected));
    };
    if !schemes.contains(&scheme.to_ascii_lowercase().as_str()) {
        return Err(url_error(url, expected));
    }
    // A raw '@', '?', '/' or '#' in a password splits the URL where the
    // driver would not look for it: the driver's own messages (a host, a
    // parameter name) would then show a piece of the password. Refused,
    // naming only the redacted URL.
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if rest[..authority_end].matches('@').count() > 1 || rest[authority_end..].contains('@') {
        return Err(url_error(
            url,
            "an '@' after the user info or in the query: percent-encode '@', '?', '/' and '#' \
             in a password (%40, %3F, %2F, %23)",
        ));
    }
    let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
    let pairs = query
        .split('&')
        .filter(|param| !param.is_empty())
        .map(|param| {
            let (name, _) = param.split_once('=').unwrap_or((param, ""));
            Ok((decoded(url, name, name)?, param))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut params = QueryParams::passing_on(pairs, setting).map_err(|r| url_error(url, r))?;
    let table = match params.take("table") {
        Some(param) => {
            table(&param_value(url, param)?).map_err(|e| url_error(url, e.to_string()))?
        }
        None => T::default(),
    };
    Ok(SqlUrl {
        base,
        table,
        params,
    })
}

/// The value of the parameter `param` (`name=value` as written),
/// percent-decoded.
///
/// # Errors
/// [`crate::error::InvalidInput::StoreUrl`] for a value that is not UTF-8
/// once decoded.
pub(crate) fn param_value(url: &str, param: &str) -> Result<String> {
    let (name, value) = param.split_once('=').unwrap_or((param, ""));
    decoded(url, name, value)
}

/// `text` of the parameter `name` percent-decoded, or the URL error naming
/// the parameter.
fn decoded(url: &str, name: &str, text: &str) -> Result<String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| url_error(url, format!("query parameter {name:?} is not UTF-8")))
}

/// `scheme://base`, with the parameters `kept` (as written), for the client
/// library (`scheme` its own: `postgres`, `mysql`).
pub(crate) fn rebuilt(scheme: &str, base: &str, kept: &[&str]) -> String {
    if kept.is_empty() {
        format!("{scheme}://{base}")
    } else {
        format!("{scheme}://{base}?{}", kept.join("&"))
    }
}

/// Defines a SQL store's options type (`PostgresOptions`, `MysqlOptions`):
/// the lease table, the pool's size and connect timeout, the connections'
/// lifetime and whether the schema is created, with their builder methods
/// and defaults, plus the fields given (`name: type = default`, placed
/// after the connect timeout) whose methods the store writes itself. It
/// needs `TableName` and `Duration` in scope.
macro_rules! sql_options {
    (
        $(#[$doc:meta])*
        pub struct $name:ident {
            $($(#[$field_doc:meta])* $field:ident: $ty:ty = $default:expr,)*
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name {
            pub(super) table: TableName,
            pub(super) max_connections: usize,
            pub(super) connect_timeout: Duration,
            $($(#[$field_doc])* pub(super) $field: $ty,)*
            pub(super) max_connection_lifetime: Option<Duration>,
            /// Create the schema when missing; `false` for commands that
            /// must create nothing.
            pub(super) create_schema: bool,
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    table: TableName::default(),
                    max_connections: 16,
                    connect_timeout: Duration::from_secs(5),
                    $($field: $default,)*
                    max_connection_lifetime: None,
                    create_schema: true,
                }
            }
        }

        impl $name {
            /// The lease table (see [`TableName`]).
            pub fn table(mut self, table: TableName) -> Self {
                self.table = table;
                self
            }

            /// The most pooled connections (at least 1; a connection the
            /// store keeps for notifications, PostgreSQL's listener, comes
            /// on top).
            pub fn max_connections(mut self, n: usize) -> Self {
                self.max_connections = n.max(1);
                self
            }

            /// How long getting a connection (opening one, or waiting for
            /// a free one in the pool) may take before the call fails with
            /// a store error. Applies where the connection settings name
            /// no timeout of their own (PostgreSQL's `connect_timeout`).
            pub fn connect_timeout(mut self, timeout: Duration) -> Self {
                self.connect_timeout = timeout;
                self
            }

            /// Closes pooled connections older than this when they come
            /// back to the pool (for MySQL, mysql_async's absolute
            /// connection TTL), for servers or proxies that want
            /// connections refreshed. Default: never.
            pub fn max_connection_lifetime(mut self, lifetime: Duration) -> Self {
                self.max_connection_lifetime = Some(lifetime);
                self
            }

            /// Whether the first call creates the store's schema (the
            /// table, its fencing sequence and, for MySQL, its stored
            /// procedures) when the table is missing (default `true`).
            /// With `false` a missing table is a store error naming it
            /// ("no store"), and nothing is created: for read-only tools
            /// (`worklease status`, `leader`, `release`, `checkpoint`) and
            /// roles without `CREATE`, so that a mistyped table is not
            /// taken for an empty store.
            pub fn create_schema(mut self, on: bool) -> Self {
                self.create_schema = on;
                self
            }

            /// The configured table.
            pub fn table_name(&self) -> &TableName {
                &self.table
            }
        }
    };
}
pub(crate) use sql_options;

/// Defines a SQL store's checked URL type (`PostgresUrl`, `MysqlUrl`) for
/// the store type and options type given: `parse` checks a URL with the
/// store's `parse_url` (in scope), the `Debug` form hides the password
/// ([`crate::store::url::redact`]) and `as_str` does not, since a child
/// process needs it to connect. The `# Errors` of `parse` come after the
/// type's docs.
macro_rules! sql_url {
    (
        $(#[$doc:meta])*
        pub struct $name:ident opens $store:ident with $options:ident;
        $(#[$parse_errors:meta])*
    ) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq)]
        pub struct $name {
            url: String,
        }

        impl $name {
            /// Checks a URL.
            ///
            $(#[$parse_errors])*
            pub fn parse(url: &str) -> Result<Self> {
                let _ = parse_url(url)?;
                Ok(Self {
                    url: url.trim().to_string(),
                })
            }

            /// The URL as given, password included: keep it out of logs
            /// (use [`crate::store::url::redact`]).
            pub fn as_str(&self) -> &str {
                &self.url
            }

            /// Opens the store the URL names (connecting lazily, on first
            /// use).
            ///
            /// # Errors
            #[doc = concat!("As [`", stringify!($store), "::from_url`].")]
            pub fn open(&self) -> Result<$store> {
                $store::from_url(&self.url)
            }

            /// Opens the store without creating its schema
            #[doc = concat!("([`", stringify!($options), "::create_schema`]):")]
            /// a missing table is an error.
            ///
            /// # Errors
            #[doc = concat!("As [`", stringify!($store), "::from_url`].")]
            pub fn open_existing(&self) -> Result<$store> {
                let mut store = $store::from_url(&self.url)?;
                store.options.create_schema = false;
                Ok(store)
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(&crate::store::url_parts::redact(&self.url), f)
            }
        }
    };
}
pub(crate) use sql_url;

/// Test check of a store's table names: each of `bad` refused naming the
/// pattern, a name over `max` bytes refused naming the limit, one of `max`
/// bytes accepted.
#[cfg(test)]
pub(crate) fn assert_table_rule<T>(
    new: impl Fn(&str) -> std::result::Result<T, crate::error::InvalidInput>,
    max: usize,
    bad: &[&str],
) {
    for name in bad {
        let e = new(name).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("[a-z_]"), "{name:?}: {e}");
    }
    let long = new(&"t".repeat(max + 1)).err().map(|e| e.to_string());
    assert!(long.unwrap_or_default().contains(&max.to_string()));
    assert!(new(&"t".repeat(max)).is_ok());
}

/// Test check of a store's URL refusals: each URL of `cases` refused by
/// `parse` with a reason that holds the text paired with it and never
/// `secret`.
#[cfg(test)]
pub(crate) fn assert_refused<T>(
    parse: impl Fn(&str) -> Result<T>,
    secret: &str,
    cases: &[(&str, &str)],
) {
    for (url, want) in cases {
        let e = parse(url).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains(want), "{url}: {e}");
        assert!(!e.contains(secret), "the password leaked: {e}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_raw_delimiter_in_a_password_is_refused_without_showing_it() {
        for url in [
            "postgres://u:SEC@RETPW@127.0.0.1:1/db",
            "postgres://u:SEC?RETPW@127.0.0.1:1/db",
            "postgres://u:SEC/RETPW@127.0.0.1:1/db",
        ] {
            let e = split_url(url, &["postgres"], "x", str::to_owned, |_| Ok(()))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("percent-encode"), "{url}: {e}");
            assert!(!e.contains("RETPW") && !e.contains("SEC"), "{url}: {e}");
        }
    }

    use super::*;

    #[test]
    fn names_and_urls_split() {
        for (part, ok) in [("t_1", true), ("_x", true), ("", false), ("1x", false)] {
            assert_eq!(plain_lower_case(part), ok, "{part:?}");
        }
        assert!(!plain_lower_case("Leases") && !plain_lower_case("a.b"));
        // A table name type of the test's own: any plain lower-case name.
        let plain = |name: &str| match plain_lower_case(name) {
            true => Ok(name.to_string()),
            false => Err(InvalidInput::Config(format!("bad table {name:?}"))),
        };
        let split = |url, setting| split_url(url, &["pg"], "pg://", setting, plain);
        let parts = split("PG://u:pw@h/db?a=1&&table=t_1&b=%41", str::to_owned)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((parts.base, parts.table.as_str()), ("u:pw@h/db", "t_1"));
        let params: Vec<_> = parts.params.into_iter().collect();
        assert_eq!(params, [("a".into(), "a=1"), ("b".into(), "b=%41")]);
        assert_eq!(param_value("", "b=%41").unwrap(), "A");
        assert_eq!(rebuilt("pg", "h/db", &["a=1", "b=2"]), "pg://h/db?a=1&b=2");
        assert_eq!(rebuilt("pg", "h/db", &[]), "pg://h/db");
        let reason = |url, setting| match split(url, setting) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{url} parsed"),
        };
        let e = reason("pg://u:pw@h?a_b=1&a-b=2", |n: &str| n.replace('_', "-"));
        assert!(
            e.contains("\"a-b\" appears twice") && !e.contains("pw@"),
            "{e}"
        );
        assert!(reason("pg://h?table=T", str::to_owned).contains("bad table \"T\""));
        assert!(reason("my://h", str::to_owned).contains("pg://"));
        assert!(reason("pg://h?%FF=1", str::to_owned).contains("not UTF-8"));
    }
}
