//! Choosing a store from a URL, and showing URLs without their secrets.
//!
//! Over 600 lines with its unit tests: the dispatcher is the first 500, and
//! the tests of every scheme's parsing (one table of URLs and verdicts)
//! stay beside it.
//!
//! | URL | store |
//! |---|---|
//! | `sqlite:PATH` or `sqlite://PATH` | the embedded SQLite store ([`crate::store::sqlite::SqliteStore`], feature `sqlite`) in the file PATH; missing parent directories are created |
//! | `memory:` or `memory://` | a new, empty in-memory store ([`MemoryStore`]), private to the process that opens it |
//! | `postgres://user@host:port/db?table=NAME` or `postgresql://…` | the PostgreSQL store (`store::postgres::PostgresStore`, feature `postgres`): tokio-postgres's connection settings plus `table` (default `worklease_leases`); connects on first use |
//! | `mysql://user[:password]@host:port/db?table=NAME` or `mariadb://…` | the MySQL / MariaDB store (`store::mysql::MysqlStore`, feature `mysql`): mysql_async's connection settings plus `table` (default `worklease_leases`) and `ssl-mode=DISABLED\|REQUIRED\|VERIFY_CA\|VERIFY_IDENTITY` with `ssl-ca=PATH` (feature `mysql-tls`); connects on first use; no notifications (waiters poll) |
//! | `redis://[user:password@]host:port/db?prefix=P` | the Redis store (`store::redis::RedisStore`, feature `redis`): key prefix `P` (default `worklease:`), optional `wait_replicas=N&wait_timeout_ms=T`; connects on first use. `rediss://…?cacert=PATH[&cert=PATH&key=PATH]` is the same over TLS (feature `redis-tls`; the system's roots without `cacert`); `redis+sentinel://[user:password@]s1:26379,s2:26379,…/PRIMARY[/db]?prefix=P` (and `rediss+sentinel://`) follows the primary that the sentinels name; `redis+cluster://[user:password@]h1:7000,h2:7001,…/?prefix=P` (and `rediss+cluster://`) runs on a Redis Cluster |
//! | `s3://BUCKET[/PREFIX]?endpoint=URL&region=R` | the object-storage store (`store::object::S3Config`, feature `object-store`) on S3 or an S3-compatible server: one object per work ID under PREFIX (default `worklease`); credentials from the `AWS_*` environment variables, never from the URL |
//! | `azblob://CONTAINER[/PREFIX]?endpoint=URL&account=NAME` | the object-storage store on Azure Blob Storage (`store::object::AzureConfig`, feature `azure`): one blob per work ID under PREFIX (default `worklease`); `endpoint` for an emulator (Azurite: `http://HOST:PORT/ACCOUNT`); the account from the URL or `AZURE_STORAGE_ACCOUNT_NAME`; credentials from the standard `AZURE_*` variables, never from the URL |
//! | `dynamodb://TABLE?region=R&endpoint=URL&prefix=P&create=true` | the DynamoDB store (`store::dynamodb::DynamoConfig`, feature `dynamodb`): one item per work ID in TABLE under key prefix `P` (default `worklease`); `endpoint` only for a local or compatible server; `create=true` makes a missing table (development); credentials from the standard AWS sources, never from the URL; connects on first use |
//! | `etcd://[user:password@]host:port,host:port,…?prefix=P` | the etcd store (`store::etcd::EtcdStore`, feature `etcd`): one or more members (port 2379 by default), key prefix `P` (default `worklease/`); connects on first use. `etcds://…?cacert=PATH[&cert=PATH&key=PATH]` is the same over TLS (feature `etcd-tls`; the system's roots without `cacert`) |
//!
//! A SQLite PATH is taken literally (no percent-decoding, no query
//! parameters): `sqlite:/var/lib/worklease/leases.db` and
//! `sqlite:///var/lib/worklease/leases.db` name the same absolute file,
//! `sqlite:leases.db` and `sqlite://leases.db` a file relative to the
//! current directory. A path starting with `~` is refused: no shell
//! expanded it. [`StoreSpec::open_existing`] opens only a store file that
//! exists, creating nothing. Scheme names are case-insensitive.
//!
//! Every error message, log line and `status` output shows a store URL only
//! through [`redact`], which masks passwords.
//!
//! ```
//! use worklease::store::url;
//!
//! assert_eq!(
//!     url::redact("postgres://app:s3cret@db.internal:5432/leases"),
//!     "postgres://app:***@db.internal:5432/leases"
//! );
//! let err = url::open("bogus://x").err().unwrap();
//! assert!(err.to_string().contains("unknown store scheme"));
//! let store = url::open("memory:").unwrap();
//! assert_eq!(store.kind(), "memory");
//! ```

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(doc)]
use crate::error::InvalidInput;
use crate::error::Result;
use crate::store::memory::MemoryStore;
use crate::store::url_parts::{split_scheme, starts_with_file_scheme, url_error, URI_REFUSED};
use crate::store::LeaseStore;

pub use crate::store::url_parts::redact;

/// What the store URLs look like, for error messages (a scheme whose
/// feature this build lacks is refused with a reason naming the feature).
const ACCEPTED: &str = "use sqlite:PATH (for example sqlite:/var/lib/worklease/leases.db), \
     memory:, postgres://..., mysql://..., redis://..., etcd://..., s3://BUCKET/PREFIX, \
     azblob://CONTAINER/PREFIX or dynamodb://TABLE";

/// A parsed store URL: which store to open, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreSpec {
    /// The embedded SQLite store in this file.
    Sqlite(PathBuf),
    /// A new in-memory store, private to the opening process.
    Memory,
    /// The PostgreSQL store at this URL (feature `postgres`).
    #[cfg(feature = "postgres")]
    Postgres(crate::store::postgres::PostgresUrl),
    /// The MySQL / MariaDB store at this URL (feature `mysql`).
    #[cfg(feature = "mysql")]
    Mysql(crate::store::mysql::MysqlUrl),
    /// The Redis store with these settings (feature `redis`).
    #[cfg(feature = "redis")]
    Redis(crate::store::redis::RedisConfig),
    /// The object-storage store on S3 with these settings (feature
    /// `object-store`).
    #[cfg(feature = "object-store")]
    S3(crate::store::object::S3Config),
    /// The etcd store with these settings (feature `etcd`).
    #[cfg(feature = "etcd")]
    Etcd(crate::store::etcd::EtcdConfig),
    /// The DynamoDB store with these settings (feature `dynamodb`).
    #[cfg(feature = "dynamodb")]
    DynamoDb(crate::store::dynamodb::DynamoConfig),
    /// The object-storage store on Azure Blob Storage with these settings
    /// (feature `azure`).
    #[cfg(feature = "azure")]
    Azure(crate::store::object::AzureConfig),
}

impl StoreSpec {
    /// Opens the store. For SQLite, creates the file's missing parent
    /// directories first.
    ///
    /// # Errors
    /// [`crate::Error::Store`] when a directory or the file cannot be
    /// created or opened; [`InvalidInput::StoreUrl`] for a SQLite URL in a
    /// build without the `sqlite` feature.
    pub fn open(&self) -> Result<Arc<dyn LeaseStore>> {
        match self {
            StoreSpec::Memory => Ok(Arc::new(MemoryStore::new())),
            StoreSpec::Sqlite(path) => open_sqlite(path),
            #[cfg(feature = "postgres")]
            StoreSpec::Postgres(url) => Ok(Arc::new(url.open()?)),
            #[cfg(feature = "mysql")]
            StoreSpec::Mysql(url) => Ok(Arc::new(url.open()?)),
            #[cfg(feature = "redis")]
            StoreSpec::Redis(config) => Ok(Arc::new(crate::store::redis::RedisStore::new(
                config.clone(),
            )?)),
            #[cfg(feature = "object-store")]
            StoreSpec::S3(config) => Ok(Arc::new(config.open()?)),
            #[cfg(feature = "etcd")]
            StoreSpec::Etcd(config) => {
                Ok(Arc::new(crate::store::etcd::EtcdStore::new(config.clone())))
            }
            #[cfg(feature = "dynamodb")]
            StoreSpec::DynamoDb(config) => Ok(Arc::new(config.open())),
            #[cfg(feature = "azure")]
            StoreSpec::Azure(config) => Ok(Arc::new(config.open()?)),
        }
    }

    /// The URL in its canonical form: `sqlite:PATH` or `memory:`, which
    /// [`parse`] reads back to the same spec. A relative SQLite path stays
    /// relative (see [`StoreSpec::absolute`]); a path that starts with `//`
    /// is written `sqlite://PATH`, since `parse` takes a leading `//` off.
    pub fn to_url(&self) -> String {
        match self {
            StoreSpec::Sqlite(path) => {
                let path = path.display().to_string();
                let slashes = if path.starts_with("//") { "//" } else { "" };
                format!("sqlite:{slashes}{path}")
            }
            StoreSpec::Memory => "memory:".to_string(),
            #[cfg(feature = "postgres")]
            StoreSpec::Postgres(url) => url.as_str().to_string(),
            #[cfg(feature = "mysql")]
            StoreSpec::Mysql(url) => url.as_str().to_string(),
            #[cfg(feature = "redis")]
            StoreSpec::Redis(config) => config.to_url(),
            #[cfg(feature = "object-store")]
            StoreSpec::S3(config) => config.to_url(),
            #[cfg(feature = "etcd")]
            StoreSpec::Etcd(config) => config.to_url(),
            #[cfg(feature = "dynamodb")]
            StoreSpec::DynamoDb(config) => config.to_url(),
            #[cfg(feature = "azure")]
            StoreSpec::Azure(config) => config.to_url(),
        }
    }

    /// The same store with a relative SQLite path made absolute against the
    /// current directory, so that the URL still names the same file for a
    /// process that changes directory. Unchanged when the current directory
    /// cannot be read.
    pub fn absolute(&self) -> StoreSpec {
        match self {
            StoreSpec::Sqlite(path) if path.is_relative() => {
                StoreSpec::Sqlite(std::path::absolute(path).unwrap_or_else(|_| path.clone()))
            }
            other => other.clone(),
        }
    }

    /// Opens a store that must exist already, creating nothing: for
    /// commands that only read or change existing leases (`status`,
    /// `release --force`, `checkpoint`), so that a mistyped path does not
    /// leave an empty store (and its directories) behind. A SQLite file
    /// must be there; a PostgreSQL or MySQL store creates no table (a
    /// missing one is an error at the first call); other stores open as
    /// with [`StoreSpec::open`] (their keys or objects appear only when a
    /// lease is written; a DynamoDB URL with `create=true` asks for its
    /// table).
    ///
    /// # Errors
    /// [`crate::Error::Store`] naming the path ("no store at PATH") when
    /// the SQLite file does not exist; else as [`StoreSpec::open`].
    pub fn open_existing(&self) -> Result<Arc<dyn LeaseStore>> {
        if let StoreSpec::Sqlite(path) = self {
            use crate::error::StoreError;
            use std::io::ErrorKind;
            match std::fs::metadata(path) {
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                    return Err(StoreError::new(
                        "sqlite",
                        format!("no store at {}: the file does not exist", path.display()),
                    )
                    .into());
                }
                Err(e) => {
                    return Err(StoreError::with_source(
                        "sqlite",
                        format!("cannot read the store file {}", path.display()),
                        e,
                    )
                    .into());
                }
            }
        }
        match self {
            #[cfg(feature = "postgres")]
            StoreSpec::Postgres(url) => Ok(Arc::new(url.open_existing()?)),
            #[cfg(feature = "mysql")]
            StoreSpec::Mysql(url) => Ok(Arc::new(url.open_existing()?)),
            _ => self.open(),
        }
    }
}

#[cfg(feature = "sqlite")]
fn open_sqlite(path: &Path) -> Result<Arc<dyn LeaseStore>> {
    use crate::error::StoreError;
    use crate::store::sqlite::SqliteStore;

    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        // Directories it creates are for this user alone (0700): the
        // store refuses a file others could replace.
        let mut dirs = std::fs::DirBuilder::new();
        dirs.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut dirs, 0o700);
        dirs.create(parent).map_err(|e| {
            // "File exists" for a name that is there but leads to no
            // directory: say why (a loop of symbolic links, a file).
            let e = match (e.kind(), std::fs::metadata(parent)) {
                (std::io::ErrorKind::AlreadyExists, Err(why)) => why,
                (std::io::ErrorKind::AlreadyExists, Ok(m)) if !m.is_dir() => {
                    std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory")
                }
                _ => e,
            };
            StoreError::with_source(
                "sqlite",
                format!(
                    "cannot create the directory {} for the store file",
                    parent.display()
                ),
                e,
            )
        })?;
    }
    Ok(Arc::new(SqliteStore::open(path)?))
}

#[cfg(not(feature = "sqlite"))]
fn open_sqlite(path: &Path) -> Result<Arc<dyn LeaseStore>> {
    Err(url_error(
        &format!("sqlite:{}", path.display()),
        "this build of worklease has no SQLite store (cargo feature `sqlite`)",
    ))
}

#[cfg(feature = "postgres")]
fn postgres_spec(url: &str) -> Result<StoreSpec> {
    Ok(StoreSpec::Postgres(
        crate::store::postgres::PostgresUrl::parse(url)?,
    ))
}

#[cfg(not(feature = "postgres"))]
fn postgres_spec(url: &str) -> Result<StoreSpec> {
    Err(url_error(
        url,
        "this build of worklease has no PostgreSQL store (cargo feature `postgres`)",
    ))
}

#[cfg(feature = "mysql")]
fn mysql_spec(url: &str) -> Result<StoreSpec> {
    Ok(StoreSpec::Mysql(crate::store::mysql::MysqlUrl::parse(url)?))
}

#[cfg(not(feature = "mysql"))]
fn mysql_spec(url: &str) -> Result<StoreSpec> {
    Err(url_error(
        url,
        "this build of worklease has no MySQL store (cargo feature `mysql`)",
    ))
}

#[cfg(feature = "redis")]
fn redis_spec(url: &str) -> Result<StoreSpec> {
    Ok(StoreSpec::Redis(
        crate::store::redis::RedisConfig::from_url(url)?,
    ))
}

#[cfg(not(feature = "redis"))]
fn redis_spec(url: &str) -> Result<StoreSpec> {
    Err(url_error(
        url,
        "this build of worklease has no Redis store (cargo feature `redis`)",
    ))
}

#[cfg(feature = "object-store")]
fn s3_spec(url: &str) -> Result<StoreSpec> {
    Ok(StoreSpec::S3(crate::store::object::S3Config::from_url(
        url,
    )?))
}

#[cfg(not(feature = "object-store"))]
fn s3_spec(url: &str) -> Result<StoreSpec> {
    Err(url_error(
        url,
        "this build of worklease has no S3 store (cargo feature `object-store`)",
    ))
}

#[cfg(feature = "etcd")]
fn etcd_spec(url: &str) -> Result<StoreSpec> {
    Ok(StoreSpec::Etcd(crate::store::etcd::EtcdConfig::from_url(
        url,
    )?))
}

#[cfg(not(feature = "etcd"))]
fn etcd_spec(url: &str) -> Result<StoreSpec> {
    Err(url_error(
        url,
        "this build of worklease has no etcd store (cargo feature `etcd`)",
    ))
}

#[cfg(feature = "dynamodb")]
fn dynamodb_spec(url: &str) -> Result<StoreSpec> {
    Ok(StoreSpec::DynamoDb(
        crate::store::dynamodb::DynamoConfig::from_url(url)?,
    ))
}

#[cfg(not(feature = "dynamodb"))]
fn dynamodb_spec(url: &str) -> Result<StoreSpec> {
    Err(url_error(
        url,
        "this build of worklease has no DynamoDB store (cargo feature `dynamodb`)",
    ))
}

#[cfg(feature = "azure")]
fn azure_spec(url: &str) -> Result<StoreSpec> {
    Ok(StoreSpec::Azure(
        crate::store::object::AzureConfig::from_url(url)?,
    ))
}

#[cfg(not(feature = "azure"))]
fn azure_spec(url: &str) -> Result<StoreSpec> {
    Err(url_error(
        url,
        "this build of worklease has no Azure Blob store (cargo feature `azure`)",
    ))
}

/// Parses a store URL without opening anything.
///
/// # Errors
/// [`InvalidInput::StoreUrl`] (the URL redacted in the message) for a URL
/// without a scheme, a SQLite URL without a path, a `memory:` URL with a
/// path, the scheme of a store this build lacks (its cargo feature is off),
/// or an unknown scheme.
pub fn parse(url: &str) -> Result<StoreSpec> {
    let url = url.trim();
    if url.is_empty() {
        return Err(url_error(url, format!("the URL is empty: {ACCEPTED}")));
    }
    let Some((scheme, rest)) = split_scheme(url) else {
        let hint = if url.starts_with('/') || url.starts_with('.') || url.ends_with(".db") {
            format!(" (a file? write sqlite:{url})")
        } else {
            String::new()
        };
        return Err(url_error(
            url,
            format!("the URL has no scheme{hint}: {ACCEPTED}"),
        ));
    };
    match scheme.as_str() {
        "sqlite" => {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(url_error(
                    url,
                    "a sqlite URL needs the path of the store file, for example sqlite:/var/lib/worklease/leases.db",
                ));
            }
            if starts_with_file_scheme(path) {
                return Err(url_error(url, URI_REFUSED));
            }
            if let Some(after) = path.strip_prefix('~') {
                let hint = match after.strip_prefix('/') {
                    Some(rest) => format!("sqlite:$HOME/{rest}"),
                    None => "sqlite:/home/NAME/...".to_string(),
                };
                return Err(url_error(
                    url,
                    format!(
                        "the path starts with `~`, which only a shell expands, and only at the \
                         start of a word: write the full path, for example {hint} \
                         (or sqlite:./~... for a file really named so)"
                    ),
                ));
            }
            if path.contains('?') {
                // SQLite's own URIs take `?mode=ro`, `?cache=shared`: here
                // they would become part of a file's name.
                return Err(url_error(
                    url,
                    "a sqlite: URL takes no parameters (?...): it is the store file's path \
                     alone, and the store opens the file read-write",
                ));
            }
            if path.ends_with('/')
                || path.ends_with("/.")
                || path.ends_with("/..")
                || path == "."
                || path == ".."
            {
                // The path functions would take `/srv/leases/` for the file
                // `/srv/leases`: SQLite would create a file where the user
                // meant a directory.
                return Err(url_error(
                    url,
                    format!(
                        "the path names a directory, not a file: write the file's name, \
                         for example sqlite:{}/leases.db",
                        path.trim_end_matches('/')
                    ),
                ));
            }
            Ok(StoreSpec::Sqlite(PathBuf::from(path)))
        }
        "memory" => {
            if !rest.is_empty() && rest != "//" {
                return Err(url_error(
                    url,
                    "a memory URL takes no path or host: write memory:",
                ));
            }
            Ok(StoreSpec::Memory)
        }
        "postgres" | "postgresql" => postgres_spec(url),
        "mysql" | "mariadb" => mysql_spec(url),
        "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" | "redis+cluster"
        | "rediss+cluster" => redis_spec(url),
        "s3" => s3_spec(url),
        "etcd" | "etcds" => etcd_spec(url),
        "dynamodb" => dynamodb_spec(url),
        "azblob" => azure_spec(url),
        other => Err(url_error(
            url,
            format!("unknown store scheme {other:?}: {ACCEPTED}"),
        )),
    }
}

/// Opens the store a URL names (see the module docs for the URLs).
///
/// # Errors
/// As [`parse`] for a malformed or unsupported URL
/// ([`InvalidInput::StoreUrl`]); as [`StoreSpec::open`] when the store
/// cannot be opened ([`crate::Error::Store`]).
pub fn open(url: &str) -> Result<Arc<dyn LeaseStore>> {
    parse(url)?.open()
}

/// The default store file: `$WORKLEASE_HOME/leases.db` when `WORKLEASE_HOME`
/// is set; else `$XDG_DATA_HOME/worklease/leases.db` when `XDG_DATA_HOME`
/// is set to an absolute path; else `$HOME/.local/share/worklease/leases.db`;
/// else (no `HOME`, as for some system services)
/// `/var/lib/worklease/leases.db`. Empty variables count as unset.
///
/// Every process that should coordinate must resolve the same file: give
/// them the same environment, or name the store explicitly.
pub fn default_sqlite_path() -> PathBuf {
    default_sqlite_path_from(|name| std::env::var_os(name))
}

fn default_sqlite_path_from(var: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(home) = set("WORKLEASE_HOME") {
        return home.join("leases.db");
    }
    if let Some(data) = set("XDG_DATA_HOME").filter(|p| p.is_absolute()) {
        return data.join("worklease").join("leases.db");
    }
    if let Some(home) = set("HOME") {
        return home.join(".local/share/worklease/leases.db");
    }
    PathBuf::from("/var/lib/worklease/leases.db")
}

/// The default store URL: `sqlite:` followed by [`default_sqlite_path`]
/// (a path that is not UTF-8 is shown lossily).
pub fn default_url() -> String {
    StoreSpec::Sqlite(default_sqlite_path()).to_url()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::InvalidInput;
    use crate::Error;

    fn reason(url: &str) -> String {
        match parse(url) {
            Err(Error::Invalid(InvalidInput::StoreUrl { url, reason })) => {
                format!("{url} | {reason}")
            }
            other => panic!("expected a StoreUrl error for {url:?}, got {other:?}"),
        }
    }

    #[test]
    fn sqlite_urls_name_a_path() {
        let abs = StoreSpec::Sqlite(PathBuf::from("/var/lib/x.db"));
        assert_eq!(parse("sqlite:/var/lib/x.db").unwrap(), abs);
        assert_eq!(parse("sqlite:///var/lib/x.db").unwrap(), abs);
        assert_eq!(parse("SQLite:/var/lib/x.db").unwrap(), abs);
        let rel = StoreSpec::Sqlite(PathBuf::from("data/x.db"));
        assert_eq!(parse("sqlite:data/x.db").unwrap(), rel);
        assert_eq!(parse("sqlite://data/x.db").unwrap(), rel);
        assert_eq!(rel.to_url(), "sqlite:data/x.db");
        assert!(rel.absolute().to_url().starts_with("sqlite:/"));
        assert_eq!(abs.absolute(), abs);
        assert!(reason("sqlite:").contains("needs the path"));
        assert!(reason("sqlite://").contains("needs the path"));
    }

    #[test]
    fn sqlite_urls_round_trip() {
        for path in [
            "/tmp/x.db",
            "//tmp/x.db",
            "///tmp/x.db",
            "data/x.db",
            "x.db",
            "./x.db",
            "../up/x.db",
            "/home/me/@work/a b.db",
        ] {
            let spec = StoreSpec::Sqlite(PathBuf::from(path));
            let url = spec.to_url();
            assert_eq!(parse(&url).unwrap(), spec, "{path:?} -> {url:?}");
        }
        // The reviewer's case: four slashes name //tmp/x.db, never tmp/x.db.
        let spec = parse("sqlite:////tmp/x.db").unwrap();
        assert_eq!(spec, StoreSpec::Sqlite(PathBuf::from("//tmp/x.db")));
        assert_eq!(spec.to_url(), "sqlite:////tmp/x.db");
        assert_eq!(parse(&spec.absolute().to_url()).unwrap(), spec);
        assert_eq!(
            StoreSpec::Sqlite(PathBuf::from("/tmp/x.db")).to_url(),
            "sqlite:/tmp/x.db"
        );
    }

    #[test]
    fn sqlite_file_uris_are_refused_with_the_plain_form() {
        for url in [
            "sqlite:file:/var/lib/worklease/leases.db",
            "sqlite://file:leases.db?mode=memory",
            "SQLITE:FILE:/x.db?vfs=unix-none",
        ] {
            let r = reason(url);
            assert!(r.contains("URI") && r.contains("sqlite:/"), "{url}: {r}");
        }
        assert!(
            parse("sqlite:./file:x.db").is_ok(),
            "a file really named so"
        );
    }

    #[test]
    fn sqlite_paths_naming_a_directory_are_refused() {
        for url in [
            "sqlite:/srv/leases/",
            "sqlite:///srv/",
            "sqlite:.",
            "sqlite:a/..",
            "sqlite:a/.",
        ] {
            let r = reason(url);
            assert!(r.contains("names a directory"), "{url}: {r}");
        }
        assert!(reason("sqlite:/srv/leases/").contains("sqlite:/srv/leases/leases.db"));
        assert!(reason("sqlite:/srv/e.db?mode=ro").contains("no parameters"));
    }

    #[test]
    fn sqlite_paths_with_a_tilde_are_refused_with_a_hint() {
        let r = reason("sqlite:~/leases.db");
        assert!(
            r.contains("`~`") && r.contains("sqlite:$HOME/leases.db"),
            "{r}"
        );
        let r = reason("sqlite://~bob/leases.db");
        assert!(r.contains("`~`"), "{r}");
        assert_eq!(
            parse("sqlite:./~/leases.db").unwrap(),
            StoreSpec::Sqlite(PathBuf::from("./~/leases.db"))
        );
        assert_eq!(
            parse("sqlite:/srv/~x.db").unwrap(),
            StoreSpec::Sqlite(PathBuf::from("/srv/~x.db"))
        );
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn open_existing_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a/b/leases.db");
        let spec = StoreSpec::Sqlite(file.clone());
        let err = spec.open_existing().err().unwrap();
        let text = err.to_string();
        assert!(
            text.contains("no store at") && text.contains(&file.display().to_string()),
            "{text}"
        );
        assert!(matches!(err, Error::Store(_)), "{err:?}");
        assert!(!dir.path().join("a").exists(), "a directory was created");
        // A file under a regular file: no store there either.
        let blocker = dir.path().join("blocker");
        std::fs::write(&blocker, b"x").unwrap();
        let err = StoreSpec::Sqlite(blocker.join("leases.db"))
            .open_existing()
            .err()
            .unwrap();
        assert!(err.to_string().contains("no store at"), "{err}");
        // Once created (by open), it opens.
        spec.open().unwrap();
        assert_eq!(spec.open_existing().unwrap().kind(), "sqlite");
        assert_eq!(StoreSpec::Memory.open_existing().unwrap().kind(), "memory");
    }

    #[test]
    fn memory_urls() {
        assert_eq!(parse("memory:").unwrap(), StoreSpec::Memory);
        assert_eq!(parse("memory://").unwrap(), StoreSpec::Memory);
        assert_eq!(StoreSpec::Memory.to_url(), "memory:");
        assert!(reason("memory:/x").contains("no path"));
        assert_eq!(open("memory:").unwrap().kind(), "memory");
    }

    #[cfg(feature = "object-store")]
    #[test]
    fn s3_urls() {
        let url = "s3://bucket/team/leases?endpoint=http://127.0.0.1:9000&region=eu-west-1";
        let spec = parse(url).unwrap();
        assert!(matches!(&spec, StoreSpec::S3(c) if c.get_prefix() == "team/leases"));
        assert_eq!(parse(&spec.to_url()).unwrap(), spec);
        // Opening sends nothing. Without an endpoint it needs no credentials
        // in the environment (EC2 instance metadata is the last resort);
        // with an S3-compatible one it does (see `store::object`).
        let aws = parse("s3://bucket/team/leases?region=eu-west-1").unwrap();
        assert_eq!(aws.open().unwrap().kind(), "s3");
    }

    #[test]
    fn other_schemes_are_refused_clearly() {
        let r = reason("postgres://app:s3cret@db/leases?table=Bad");
        let want = if cfg!(feature = "postgres") {
            "[a-z_]"
        } else {
            "cargo feature `postgres`"
        };
        assert!(r.contains(want), "{r}");
        assert!(!r.contains("s3cret"), "{r}");
        assert!(r.contains("app:***@db"), "{r}");
        let r = reason("mysql://app:s3cret@db/leases?table=Bad");
        let want = if cfg!(feature = "mysql") {
            "[a-z_]"
        } else {
            "cargo feature `mysql`"
        };
        assert!(r.contains(want) && r.contains("app:***@db"), "{r}");
        assert!(!r.contains("s3cret"), "{r}");
        let r = reason("redis://app:s3cret@localhost?prefx=a");
        let want = if cfg!(feature = "redis") {
            "unknown parameter"
        } else {
            "cargo feature `redis`"
        };
        assert!(r.contains(want) && !r.contains("s3cret"), "{r}");
        let r = reason("etcd://app:s3cret@localhost?prefx=a");
        let want = if cfg!(feature = "etcd") {
            "unknown parameter"
        } else {
            "cargo feature `etcd`"
        };
        assert!(r.contains(want) && !r.contains("s3cret"), "{r}");
        let r = reason("s3://AK:s3cret@bucket/key");
        let want = if cfg!(feature = "object-store") {
            "AWS_ACCESS_KEY_ID"
        } else {
            "cargo feature `object-store`"
        };
        assert!(r.contains(want) && !r.contains("s3cret"), "{r}");
        let r = reason("bogus://x");
        assert!(r.contains("unknown store scheme \"bogus\""), "{r}");
        assert!(r.contains("sqlite:PATH"), "{r}");
    }

    #[test]
    fn malformed_urls_are_refused_clearly() {
        assert!(reason("").contains("empty"));
        assert!(reason("   ").contains("empty"));
        let r = reason("/tmp/leases.db");
        assert!(
            r.contains("no scheme") && r.contains("sqlite:/tmp/leases.db"),
            "{r}"
        );
        assert!(reason("1abc:x").contains("no scheme"));
        assert!(reason("://x").contains("no scheme"));
        let r = reason("alice:secret@db:5432");
        assert!(!r.contains("secret"), "{r}");
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_open_creates_parent_directories() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a/b/leases.db");
        let store = open(&format!("sqlite:{}", file.display())).unwrap();
        assert_eq!(store.kind(), "sqlite");
        assert!(file.exists());
        // The directories it made are this user's alone.
        #[cfg(unix)]
        for made in ["a", "a/b"] {
            use std::os::unix::fs::MetadataExt;
            let mode = std::fs::metadata(dir.path().join(made)).unwrap().mode();
            assert_eq!(mode & 0o777, 0o700, "{made}");
        }
        // A parent that is a file cannot be created: a store error, not a panic.
        let blocker = dir.path().join("blocker");
        std::fs::write(&blocker, b"x").unwrap();
        let err = open(&format!("sqlite:{}/sub/leases.db", blocker.display()))
            .err()
            .unwrap();
        assert!(err.is_transient(), "{err}");
        assert!(
            err.to_string().contains("cannot create the directory"),
            "{err}"
        );
    }

    #[test]
    fn default_path_follows_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        let all = env(&[
            ("WORKLEASE_HOME", "/wl"),
            ("XDG_DATA_HOME", "/xdg"),
            ("HOME", "/home/u"),
        ]);
        assert_eq!(
            default_sqlite_path_from(all),
            PathBuf::from("/wl/leases.db")
        );
        let xdg = env(&[
            ("WORKLEASE_HOME", ""),
            ("XDG_DATA_HOME", "/xdg"),
            ("HOME", "/home/u"),
        ]);
        assert_eq!(
            default_sqlite_path_from(xdg),
            PathBuf::from("/xdg/worklease/leases.db")
        );
        let rel_xdg = env(&[("XDG_DATA_HOME", "rel"), ("HOME", "/home/u")]);
        assert_eq!(
            default_sqlite_path_from(rel_xdg),
            PathBuf::from("/home/u/.local/share/worklease/leases.db")
        );
        assert_eq!(
            default_sqlite_path_from(env(&[])),
            PathBuf::from("/var/lib/worklease/leases.db")
        );
        assert!(default_url().starts_with("sqlite:"));
    }
}
