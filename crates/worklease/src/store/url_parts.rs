//! What every store URL parser shares with the dispatcher
//! ([`crate::store::url`]): masking secrets for messages and logs
//! ([`redact`]), the scheme split, the one error for a malformed URL and
//! the refusal of SQLite's `file:` names; its query parameters are read
//! by `url_query.rs`. A store's own URL
//! parsing lives in its folder (`config.rs`) and imports this module,
//! never the dispatcher.

use crate::error::{Error, InvalidInput};

/// Why a SQLite path starting with `file:` is refused (by the dispatcher
/// [`crate::store::url::parse`] and by the SQLite store).
pub(crate) const URI_REFUSED: &str =
    "SQLite would read a name starting with `file:` as a URI (whose query can \
     choose an in-memory database, a read-only or immutable open, or another \
     VFS) and open another file than the one checked: write the plain path, \
     as sqlite:/path/to/leases.db";

/// Whether SQLite could read `name` as a `file:` URI (checked without
/// regard to case, as URL schemes are).
pub(crate) fn starts_with_file_scheme(name: &str) -> bool {
    name.get(..5)
        .is_some_and(|head| head.eq_ignore_ascii_case("file:"))
}

/// The error for a malformed store URL: [`InvalidInput::StoreUrl`] with the
/// URL [`redact`]ed and `reason` (which must not quote secrets).
pub(crate) fn url_error(url: &str, reason: impl Into<String>) -> Error {
    InvalidInput::StoreUrl {
        url: redact(url),
        reason: reason.into(),
    }
    .into()
}

/// `url` [`redact`]ed, with its `endpoint` query parameter decoded and
/// redacted on its own: a percent-encoded
/// `http%3A%2F%2Fuser%3Asecret%40host` would otherwise pass [`redact`]
/// untouched (the `s3://` and `dynamodb://` URLs name their server so).
/// The user part goes too (`***@`): in an AWS-style URL it would be an
/// access key ID.
#[cfg(any(feature = "object-store", feature = "dynamodb"))]
pub(crate) fn redact_with_endpoint(url: &str) -> String {
    let Some((head, query)) = url.split_once('?') else {
        return mask_user(&redact(url));
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some(("endpoint", value)) => {
                let decoded = percent_encoding::percent_decode_str(value).decode_utf8_lossy();
                format!("endpoint={}", mask_user(&redact(&decoded)))
            }
            _ => pair.to_string(),
        })
        .collect();
    mask_user(&redact(&format!("{head}?{}", query.join("&"))))
}

/// `url` with the user info of its authority (before an `@`) replaced by
/// `***`.
#[cfg(any(feature = "object-store", feature = "dynamodb"))]
fn mask_user(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    match url[start..end].rfind('@') {
        Some(at) => format!("{}***{}", &url[..start], &url[start + at..]),
        None => url.to_string(),
    }
}

/// What a URL naming a cloud resource (an S3 bucket, an Azure container,
/// a DynamoDB table) looks like, for the refusals of
/// [`parse_resource_url`].
#[cfg(any(feature = "object-store", feature = "dynamodb"))]
pub(crate) struct ResourceUrl {
    /// The scheme, lower-case (`s3`).
    pub(crate) scheme: &'static str,
    /// The store's name, as in "the S3 store".
    pub(crate) store: &'static str,
    /// How the URL is written (`s3://BUCKET/PREFIX?...`).
    pub(crate) usage: &'static str,
    /// Where the store's credentials come from, since never from a URL.
    pub(crate) credentials: &'static str,
    /// Why a port is refused: the URL names a resource, not a server.
    pub(crate) no_server: &'static str,
    /// The refusal of a `#fragment` ("an s3:// URL takes no #fragment").
    pub(crate) no_fragment: &'static str,
}

/// `url` parsed as a [`ResourceUrl`] of `shape`: its scheme, no user info
/// (credentials never go in a URL), no port, no fragment.
///
/// # Errors
/// [`InvalidInput::StoreUrl`] (by [`resource_url_error`]) saying which.
#[cfg(any(feature = "object-store", feature = "dynamodb"))]
pub(crate) fn parse_resource_url(url: &str, shape: &ResourceUrl) -> crate::Result<url::Url> {
    let parsed = url::Url::parse(url).map_err(|e| {
        resource_url_error(url, format!("not a valid URL ({e}): write {}", shape.usage))
    })?;
    let refusal = if parsed.scheme() != shape.scheme {
        format!(
            "the {} store takes {}:// URLs, not {}://",
            shape.store,
            shape.scheme,
            parsed.scheme()
        )
    } else if !parsed.username().is_empty() || parsed.password().is_some() {
        format!("credentials do not go in the URL: {}", shape.credentials)
    } else if parsed.port().is_some() {
        shape.no_server.to_string()
    } else if parsed.fragment().is_some() {
        shape.no_fragment.to_string()
    } else {
        return Ok(parsed);
    };
    Err(resource_url_error(url, refusal))
}

/// The error for a malformed [`ResourceUrl`]: as [`url_error`], the URL
/// redacted by [`redact_with_endpoint`].
#[cfg(any(feature = "object-store", feature = "dynamodb"))]
pub(crate) fn resource_url_error(url: &str, reason: impl Into<String>) -> Error {
    InvalidInput::StoreUrl {
        url: redact_with_endpoint(url),
        reason: reason.into(),
    }
    .into()
}

/// A setter's refusal ([`InvalidInput::Config`]) as the refusal of the
/// [`ResourceUrl`] `url` that set it (the reason kept).
#[cfg(any(feature = "object-store", feature = "dynamodb"))]
pub(crate) fn setting_error(url: &str, e: Error) -> Error {
    match e {
        Error::Invalid(InvalidInput::Config(reason)) => resource_url_error(url, reason),
        other => resource_url_error(url, other.to_string()),
    }
}

/// `endpoint`, checked to be the server of an AWS-style store (S3,
/// DynamoDB, Azure Blob): an `http://` or `https://` URL with a host and
/// without user info (`user:secret@`: credentials never go in a URL, and
/// the HTTP clients show an endpoint in their errors). `credentials` says
/// where the store's credentials come from instead.
///
/// # Errors
/// [`InvalidInput::Config`] saying why not.
#[cfg(any(feature = "object-store", feature = "dynamodb"))]
pub(crate) fn checked_endpoint(endpoint: &str, credentials: &str) -> crate::Result<String> {
    let parsed = url::Url::parse(endpoint).ok();
    let ok = parsed
        .as_ref()
        .is_some_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
    if !ok {
        return Err(InvalidInput::Config(format!(
            "endpoint {:?} is not an http:// or https:// URL with a host",
            redact(endpoint)
        ))
        .into());
    }
    if parsed.is_some_and(|u| !u.username().is_empty() || u.password().is_some()) {
        return Err(InvalidInput::Config(format!(
            "endpoint {:?} carries credentials: they do not go in the URL; {credentials}",
            redact(endpoint)
        ))
        .into());
    }
    Ok(endpoint.to_string())
}

/// `region`, checked to be an AWS region name: not empty, no spaces or
/// control characters.
///
/// # Errors
/// [`InvalidInput::Config`] saying why not.
#[cfg(any(feature = "object-store", feature = "dynamodb"))]
pub(crate) fn checked_region(region: &str) -> crate::Result<String> {
    if region.is_empty() || region.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(
            InvalidInput::Config(format!("region {region:?} is empty or has spaces")).into(),
        );
    }
    Ok(region.to_string())
}

/// The scheme of `url` (the text before the first `:`, lower-cased) and the
/// rest, or `None` when there is no valid scheme.
pub(crate) fn split_scheme(url: &str) -> Option<(String, &str)> {
    let (scheme, rest) = url.split_once(':')?;
    let mut chars = scheme.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')) {
        return None;
    }
    Some((scheme.to_ascii_lowercase(), rest))
}

/// `url` with its secrets masked, for messages and logs: the password of
/// the user info (`scheme://user:pass@host` → `scheme://user:***@host`; a
/// plain user name is kept, but user info without a `:` or with
/// percent-encoding in the user name, which may hide an encoded `:` and a
/// password, is masked whole: `scheme://***@host`) and the values of
/// query parameters whose names look secret (`password`, `secret`, `token`, `key`, `auth`, `credential`,
/// `signature`, ...). Also the "port" of `scheme://user:secret` when the
/// `@host` is missing, and the secret-looking values of a libpq-style
/// connection string (`host=db user=app password=secret`). It accepts any
/// text, also malformed URLs, and masks rather more than less when in
/// doubt.
pub fn redact(url: &str) -> String {
    // A libpq-style connection string (`host=db password=secret`), or
    // something like one: mask its secret-looking `key=value` pairs first.
    if url.contains('=') && (split_scheme(url).is_none() || url.contains(char::is_whitespace)) {
        return redact_url(&redact_pairs(url));
    }
    redact_url(url)
}

/// [`redact`] for the URL form.
fn redact_url(url: &str) -> String {
    let (head, rest) = match split_scheme(url) {
        Some(_) => match url.find(':') {
            Some(i) => url.split_at(i + 1),
            None => ("", url),
        },
        None => ("", url),
    };
    let (slashes, rest) = match rest.strip_prefix("//") {
        Some(r) => ("//", r),
        None => ("", rest),
    };
    let (authority_part, tail) = split_user_info(rest, names_a_user(head));
    // `scheme://user:secret` without an `@`: the "port" is a password.
    let tail = if authority_part.is_empty() && !slashes.is_empty() {
        mask_odd_port(tail)
    } else {
        tail.to_string()
    };
    let mut out = String::with_capacity(url.len());
    out.push_str(head);
    out.push_str(slashes);
    out.push_str(&authority_part);
    out.push_str(&redact_query(&tail));
    out
}

/// `rest` (a URL after `scheme://`, with no user info) with what follows
/// the first `:` of its authority masked when that is not a port number
/// (`user:secret` of a URL that lacks its `@host`). IPv6 literals
/// (`[::1]:6379`) and host lists (`h1:5432,h2:5433`) are understood.
fn mask_odd_port(rest: &str) -> String {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, after) = rest.split_at(end);
    if authority.split(',').all(plain_host_port) {
        return rest.to_string();
    }
    let colon = match authority.strip_prefix('[') {
        Some(inner) => inner
            .find(']')
            .and_then(|i| authority[i + 2..].find(':').map(|j| i + 2 + j)),
        None => authority.find(':'),
    };
    match colon {
        Some(c) => format!("{}***{after}", &authority[..=c]),
        None => format!("***{after}"),
    }
}

/// Whether `host_port` is a host, optionally followed by `:` and a port
/// number (or nothing).
fn plain_host_port(host_port: &str) -> bool {
    let port = match host_port.strip_prefix('[') {
        Some(inner) => match inner.find(']') {
            Some(i) => match inner[i + 1..].strip_prefix(':') {
                Some(port) => port,
                None => return inner[i + 1..].is_empty(),
            },
            None => return false,
        },
        None => match host_port.split_once(':') {
            Some((_, port)) => port,
            None => return true,
        },
    };
    port.bytes().all(|b| b.is_ascii_digit())
}

/// `text` with the values of its secret-looking `key=value` pairs masked,
/// as a libpq connection string has them: pairs separated by whitespace,
/// optional whitespace around `=`, values optionally in single quotes with
/// backslash escapes (`password='a b\'c'`).
fn redact_pairs(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let n = chars.len();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < n {
        if chars[i].is_whitespace() {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let start = i;
        while i < n && chars[i] != '=' && !chars[i].is_whitespace() {
            i += 1;
        }
        let key: String = chars[start..i].iter().collect();
        out.push_str(&key);
        let mut eq = i;
        while eq < n && chars[eq].is_whitespace() {
            eq += 1;
        }
        if eq >= n || chars[eq] != '=' {
            continue; // a word without a value
        }
        out.extend(&chars[i..=eq]);
        i = eq + 1;
        while i < n && chars[i].is_whitespace() {
            out.push(chars[i]);
            i += 1;
        }
        let value = i;
        if i < n && chars[i] == '\'' {
            i += 1;
            while i < n && chars[i] != '\'' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i = (i + 1).min(n);
        } else {
            while i < n && !chars[i].is_whitespace() {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i = i.min(n);
        }
        if secret_key(&key) {
            out.push_str("***");
        } else {
            out.extend(&chars[value..i]);
        }
    }
    out
}

/// Splits `rest` (the URL after `scheme:` and `//`) into its masked user
/// info with the `@` (empty when there is none) and the remainder.
fn split_user_info(rest: &str, bare_is_user: bool) -> (String, &str) {
    // A raw password may contain '@', '/', '?' or '#', so the user info is
    // taken to end at the LAST '@': a URL with an '@' further on (in its
    // query, say) is masked more than needed, never less.
    let Some(at) = rest.rfind('@') else {
        return (String::new(), rest);
    };
    let user_info = &rest[..at];
    let after = &rest[at..];
    match user_info.split_once(':') {
        // A plain user name is kept; one with percent-encoding may hide an
        // encoded ':' and a password after it (`app%3As3cret`).
        Some((user, _password)) if !user.contains('%') => (format!("{user}:***"), after),
        Some(_) => ("***".to_string(), after),
        // A bare user name of a database URL (`postgres://app@db`) is
        // kept, as the stores' own messages keep it: one rule, user names
        // kept and passwords masked (issue 37).
        None if bare_is_user && !user_info.is_empty() && !user_info.contains(['%', '/', ':']) => {
            (user_info.to_string(), after)
        }
        // Other user info without a ':' (a bare token of an HTTP endpoint,
        // `user%3Apassword`, or the password of `scheme:pass@host`) is
        // masked whole, unless it is a path (`s3://bucket/key@v2`,
        // `sqlite:/home/me/@work`).
        None if !user_info.contains('/') && !user_info.is_empty() => ("***".to_string(), after),
        None => (String::new(), rest),
    }
}

/// Whether user info without a `:` names a user in URLs of `scheme` (with
/// its `:`, as [`redact_url`] splits it): the database stores' schemes,
/// where a password always follows a `:`. Not HTTP(S) endpoints, where a
/// bare user info is often a token.
fn names_a_user(scheme: &str) -> bool {
    matches!(
        scheme.trim_end_matches(':').to_ascii_lowercase().as_str(),
        "postgres" | "postgresql" | "mysql" | "mariadb" | "redis" | "rediss" | "etcd" | "etcds"
    )
}

/// Whether a query parameter's name looks like it holds a secret.
fn secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "pass", "pwd", "secret", "token", "key", "auth", "cred", "sig", "session",
    ]
    .iter()
    .any(|s| key.contains(s))
}

/// Masks the values of secret-looking query parameters in `tail` (the URL
/// from the end of its user info on).
fn redact_query(tail: &str) -> String {
    let Some(q) = tail.find('?') else {
        return tail.to_string();
    };
    let (before, query) = tail.split_at(q + 1);
    let (query, fragment) = match query.find('#') {
        Some(h) => query.split_at(h),
        None => (query, ""),
    };
    let params: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k, _)) if secret_key(k) => format!("{k}=***"),
            _ => p.to_string(),
        })
        .collect();
    format!("{before}{}{fragment}", params.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_masks_passwords() {
        let cases = [
            (
                "postgres://user:pass@host/db",
                "postgres://user:***@host/db",
            ),
            (
                "redis://:pw@localhost:6379/0",
                "redis://:***@localhost:6379/0",
            ),
            // One rule: user names kept, passwords masked.
            ("redis://user@host", "redis://user@host"),
            ("postgres://app@db:5432/x", "postgres://app@db:5432/x"),
            ("https://tok3n@example.com/x", "https://***@example.com/x"),
            // An encoded ':' in the user name: anything before '@' is secret.
            ("etcd://app%3AS3cret@h:2379", "etcd://***@h:2379"),
            ("etcd://app%3AS3cret:pw@h", "etcd://***@h"),
            (
                "etcds://app:pw@h?cacert=%2Fca.pem",
                "etcds://app:***@h?cacert=%2Fca.pem",
            ),
            (
                "etcd://app:S3cretPart?rest@127.0.0.1:32479",
                "etcd://app:***@127.0.0.1:32479",
            ),
            ("redis://u:p@ss/w?rd#x@host:1/0", "redis://u:***@host:1/0"),
            ("redis://u:p@ss@host", "redis://u:***@host"),
            ("postgres://u:p@h/db?x=a@b", "postgres://u:***@b"),
            ("s3://bucket/key@v2", "s3://bucket/key@v2"),
            (
                "sqlite:/var/lib/worklease/leases.db",
                "sqlite:/var/lib/worklease/leases.db",
            ),
            (
                "sqlite:/home/me/@work/leases.db",
                "sqlite:/home/me/@work/leases.db",
            ),
            ("memory:", "memory:"),
            (
                "s3://bucket/prefix?access_key=AK&secret_key=SK&region=eu",
                "s3://bucket/prefix?access_key=***&secret_key=***&region=eu",
            ),
            (
                "postgres://h/db?password=pw#frag",
                "postgres://h/db?password=***#frag",
            ),
            ("user:pass@host", "user:***@host"),
            ("alice:secret@db:5432", "alice:***@db:5432"),
            ("", ""),
            // A URL whose `@host` is missing: the "port" is a password.
            ("postgres://user:secret", "postgres://user:***"),
            (
                "postgres://user:secret/db?x=1",
                "postgres://user:***/db?x=1",
            ),
            ("redis://localhost:6379/0", "redis://localhost:6379/0"),
            ("redis://[::1]:6379/0", "redis://[::1]:6379/0"),
            ("redis://[::1]:pw", "redis://[::1]:***"),
            (
                "postgres://h1:5432,h2:5433/db",
                "postgres://h1:5432,h2:5433/db",
            ),
            ("postgres://h1:5432,u:pw,x/db", "postgres://h1:***/db"),
            ("etcd://localhost:2379", "etcd://localhost:2379"),
            ("sqlite:///var/lib/x.db", "sqlite:///var/lib/x.db"),
            // libpq-style connection strings.
            (
                "host=h password=secret user=u",
                "host=h password=*** user=u",
            ),
            (
                "host=h password = 'sec ret\\' x' dbname=d",
                "host=h password = *** dbname=d",
            ),
            ("password=secret", "password=***"),
            (
                "user=u sslpassword=pw passfile=/p",
                "user=u sslpassword=*** passfile=***",
            ),
            (
                "postgres: host=h password=secret",
                "postgres: host=h password=***",
            ),
            ("dbname=leases port=5432", "dbname=leases port=5432"),
        ];
        for (url, want) in cases {
            assert_eq!(redact(url), want, "redact({url:?})");
        }
    }
}
