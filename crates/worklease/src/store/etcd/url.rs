//! The `etcd://` and `etcds://` URL of an [`EtcdConfig`]: parsing and
//! writing it back.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};

#[cfg(doc)]
use crate::error::InvalidInput;
use crate::error::Result;
#[cfg(doc)]
use crate::store::url_parts::redact;
use crate::store::url_parts::url_error;
use crate::store::url_query::QueryParams;

#[cfg(feature = "etcd-tls")]
use super::config::Tls;
use super::config::{bad_endpoint, check_prefix, host_port, with_slash};
#[cfg(doc)]
use super::DEFAULT_PORT;
use super::{EtcdConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, DEFAULT_REQUEST_TIMEOUT};

/// The query parameters of the URL (`cacert`, `cert` and `key` with
/// `etcds://` only).
const PARAMS: &[&str] = &["prefix", "max_txn_ops", "cacert", "cert", "key"];

/// What `to_url` percent-encodes in the user info and the prefix, besides
/// non-ASCII bytes: whatever would end or split them.
const URL_ESCAPED: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'%')
    .add(b'@')
    .add(b':')
    .add(b'/')
    .add(b'?')
    .add(b'#')
    .add(b'&')
    .add(b'=')
    .add(b'+')
    .add(b',')
    .add(b'[')
    .add(b']');

fn decode(url: &str, what: &str, s: &str) -> Result<String> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| url_error(url, format!("the {what} is not UTF-8 once percent-decoded")))
}

impl EtcdConfig {
    /// Parses `etcd://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...][/][?prefix=P]`:
    /// one or more members (the port defaults to [`DEFAULT_PORT`]), an
    /// optional user for etcd's authentication (user and password
    /// percent-encoded), and `prefix`, the key prefix (percent-decoded;
    /// default [`DEFAULT_PREFIX`]).
    ///
    /// `etcds://` (feature `etcd-tls`) is the same over TLS, with the
    /// parameters `cacert=PATH` (PEM certificates to trust; default: the
    /// system's roots) and `cert=PATH&key=PATH` (a PEM client certificate
    /// and its key), percent-decoded. The files are read here.
    ///
    /// # Errors
    /// [`InvalidInput::StoreUrl`], with the URL redacted, for another
    /// scheme (`etcds://` too in a build without `etcd-tls`), a bad member
    /// list, a path, a fragment, an unknown or repeated parameter, a bad
    /// prefix, `cacert`, `cert` or `key` in an `etcd://` URL, `cert`
    /// without `key` or the reverse, or a PEM file that cannot be read or
    /// holds no PEM certificate (no PEM private key for `key`): the reason
    /// names the file, never its contents.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(url_error(
                url,
                "not an etcd URL: write etcd://HOST:PORT,HOST:PORT?prefix=PREFIX",
            ));
        };
        let tls = match scheme.to_ascii_lowercase().as_str() {
            "etcd" => false,
            "etcds" if cfg!(feature = "etcd-tls") => true,
            "etcds" => {
                return Err(url_error(
                    url,
                    "TLS (etcds://) needs the cargo feature `etcd-tls` of worklease",
                ))
            }
            other => {
                return Err(url_error(
                    url,
                    format!("the etcd store takes etcd:// or etcds:// URLs, not {other}://"),
                ))
            }
        };
        if rest.contains('#') {
            return Err(url_error(url, "an etcd URL takes no #fragment"));
        }
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        // A raw '/' or '?' in a password ends the authority before its '@':
        // the user info would then be read as members or parameters, and
        // quoted in a reason. An '@' after the authority is refused without
        // naming any of the text around it.
        if tail.contains('@') {
            return Err(url_error(
                url,
                "the URL has an '@' after its member list: percent-encode '/', '?', '#' and '@' \
                 in a user name or password (%2F, %3F, %23, %40), and '@' in the prefix",
            ));
        }
        let (user, hosts) = match authority.rsplit_once('@') {
            Some((info, hosts)) => {
                let (name, password) = info.split_once(':').unwrap_or((info, ""));
                let name = decode(url, "user name", name)?;
                if name.is_empty() {
                    return Err(url_error(url, "the user name before '@' is empty"));
                }
                (Some((name, decode(url, "password", password)?)), hosts)
            }
            None => (None, authority),
        };
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        if !path.is_empty() && path != "/" {
            return Err(url_error(
                url,
                "an etcd URL takes no path: choose the key prefix with ?prefix=PREFIX",
            ));
        }
        let members: Vec<&str> = hosts.split(',').collect();
        let mut hosts_checked = Vec::new();
        for (i, h) in members.iter().enumerate() {
            hosts_checked.push(host_port(h).map_err(|why| {
                url_error(
                    url,
                    format!(
                        "{} (members are separated by commas)",
                        bad_endpoint(i + 1, members.len(), why)
                    ),
                )
            })?);
        }
        // Names as written, values percent-decoded when taken ('+' is a
        // plus sign, as `to_url` writes it).
        let pairs = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| p.split_once('=').unwrap_or((p, "")));
        let mut params = QueryParams::parse(pairs, PARAMS).map_err(|r| url_error(url, r))?;
        let mut take = |name: &str| {
            params
                .take(name)
                .map(|value| decode(url, name, value))
                .transpose()
        };
        let prefix = take("prefix")?;
        let max_ops = take("max_txn_ops")?;
        // `cacert`, `cert` and `key`, percent-decoded.
        let files = [take("cacert")?, take("cert")?, take("key")?];
        if !tls && files.iter().any(Option::is_some) {
            return Err(url_error(
                url,
                "cacert, cert and key are TLS settings: write etcds:// to use TLS",
            ));
        }
        let prefix = with_slash(prefix.unwrap_or_else(|| DEFAULT_PREFIX.to_string()));
        if let Some(reason) = check_prefix(&prefix) {
            return Err(url_error(url, reason));
        }
        let max_txn_ops = match max_ops {
            None => super::MAX_TXN_OPS,
            Some(n) => n
                .parse::<usize>()
                .ok()
                .filter(|n| *n > super::RESERVED_OPS)
                .ok_or_else(|| {
                    url_error(
                        url,
                        format!(
                            "max_txn_ops={n:?}: etcd's --max-txn-ops, a whole number of at least {}",
                            super::RESERVED_OPS + 1
                        ),
                    )
                })?,
        };
        #[cfg(feature = "etcd-tls")]
        let tls = match tls {
            false => None,
            true => {
                let [ca, cert, key] = files;
                Some(Tls::read(ca, cert, key).map_err(|why| url_error(url, why))?)
            }
        };
        Ok(Self {
            hosts: hosts_checked,
            user,
            prefix,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_txn_ops,
            #[cfg(feature = "etcd-tls")]
            tls,
        })
    }

    /// The URL of this configuration, password included (show it only
    /// through [`redact`]): [`EtcdConfig::from_url`] reads it back to the
    /// same configuration, but for the timeouts, which are not part of it.
    pub fn to_url(&self) -> String {
        let enc = |s: &str| utf8_percent_encode(s, URL_ESCAPED).to_string();
        let user = match &self.user {
            Some((name, password)) => format!("{}:{}@", enc(name), enc(password)),
            None => String::new(),
        };
        let mut params = Vec::new();
        if self.prefix != DEFAULT_PREFIX {
            params.push(format!("prefix={}", enc(&self.prefix)));
        }
        if self.max_txn_ops != super::MAX_TXN_OPS {
            params.push(format!("max_txn_ops={}", self.max_txn_ops));
        }
        #[cfg(feature = "etcd-tls")]
        let scheme = match &self.tls {
            None => "etcd",
            Some(tls) => {
                for (name, path) in tls.params() {
                    params.push(format!("{name}={}", enc(&path)));
                }
                "etcds"
            }
        };
        #[cfg(not(feature = "etcd-tls"))]
        let scheme = "etcd";
        let mut url = format!("{scheme}://{user}{}", self.hosts.join(","));
        if !params.is_empty() {
            url.push_str("/?");
            url.push_str(&params.join("&"));
        }
        url
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, InvalidInput};
    use crate::store::etcd::EtcdStore;

    fn reason(url: &str) -> String {
        match EtcdConfig::from_url(url) {
            Err(Error::Invalid(InvalidInput::StoreUrl { url, reason })) => {
                format!("{url} | {reason}")
            }
            other => panic!("expected a StoreUrl error for {url:?}, got {other:?}"),
        }
    }

    #[test]
    fn urls_parse_with_members_user_and_prefix() {
        let c = EtcdConfig::from_url("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(c.hosts(), ["127.0.0.1:2379"]);
        assert_eq!(c.get_prefix(), DEFAULT_PREFIX);
        assert_eq!(c.to_url(), "etcd://127.0.0.1:2379");
        let c = EtcdConfig::from_url(
            "ETCD://app:p%40ss%2Fw@h1,h2:32379,[::1]:2380/?prefix=jobs%2Fprod%2F",
        )
        .unwrap();
        assert_eq!(c.hosts(), ["h1:2379", "h2:32379", "[::1]:2380"]);
        assert_eq!(c.user, Some(("app".to_string(), "p@ss/w".to_string())));
        assert_eq!(c.get_prefix(), "jobs/prod/");
        assert_eq!(
            c.endpoints(),
            ["http://h1:2379", "http://h2:32379", "http://[::1]:2380"]
        );
        // The URL round-trips, and never shows the password through Debug.
        assert_eq!(EtcdConfig::from_url(&c.to_url()).unwrap(), c);
        assert!(!format!("{c:?}").contains("p%40ss"), "{c:?}");
        let store = EtcdStore::new(c);
        assert!(!format!("{store:?}").contains("p%40ss"), "{store:?}");
        let c = EtcdConfig::new(["a", "b:1"]).unwrap().prefix("x/").unwrap();
        assert_eq!(c.to_url(), "etcd://a:2379,b:1/?prefix=x%2F");
        // A prefix without its trailing `/` gets one: `app` names the keys
        // `app/live/...`, not `applive/...`.
        let c = EtcdConfig::from_url("etcd://h?prefix=app").unwrap();
        assert_eq!(c.get_prefix(), "app/");
        assert_eq!(
            EtcdConfig::new(["h"])
                .unwrap()
                .prefix("app")
                .unwrap()
                .get_prefix(),
            "app/"
        );
    }

    #[test]
    fn bad_urls_are_refused_clearly_and_redacted() {
        let r = reason("etcd://app:s3cret@h?prefix=a/&prefix=b/");
        assert!(
            r.contains("\"prefix\" appears twice") && !r.contains("s3cret"),
            "{r}"
        );
        let r = reason("etcd://app:s3cret@h?prefx=a");
        assert!(r.contains("unknown parameter \"prefx\""), "{r}");
        assert!(!r.contains("s3cret") && r.contains("app:***@h"), "{r}");
        assert!(reason("etcd://h?cacert=%2Fca.pem").contains("write etcds://"));
        if !cfg!(feature = "etcd-tls") {
            assert!(reason("etcds://h").contains("cargo feature `etcd-tls`"));
        }
        assert!(reason("etcd://h/leases").contains("no path"));
        assert!(reason("etcd://").contains("not HOST"));
        assert!(reason("etcd://h1,,h2").contains("not HOST"));
        assert!(reason("etcd://h:0").contains("not HOST"));
        assert!(reason("etcd://h:99999").contains("not HOST"));
        assert!(reason("etcd://h x").contains("not HOST"));
        assert!(reason("etcd://[zz]:1").contains("not HOST"));
        assert!(reason("etcd://h?prefix=").contains("empty"));
        assert!(reason("etcd://h?prefix=a%0Ab").contains("control"));
        assert!(reason(&format!("etcd://h?prefix={}", "x".repeat(300))).contains("256"));
        assert!(reason("etcd://h#x").contains("fragment"));
        assert!(reason("etcd://:pw@h").contains("user name"));
        assert!(reason("redis://h").contains("etcd://"));
        assert!(EtcdConfig::new(Vec::<String>::new()).is_err());
    }

    #[cfg(feature = "etcd-tls")]
    #[test]
    fn tls_urls_read_their_pem_files_and_name_them_in_errors() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["h".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let enc = |p: &str| utf8_percent_encode(p, URL_ESCAPED).to_string();
        let ca = write("ca.pem", &cert.pem());
        let key_file = write("key.pem", &key.serialize_pem());
        let bad = write("bad.pem", "S3cretContents");

        // System roots without cacert.
        let c = EtcdConfig::from_url("etcds://h1,h2:1?prefix=p").unwrap();
        assert!(c.is_tls());
        assert_eq!(c.endpoints(), ["https://h1:2379", "https://h2:1"]);
        assert_eq!(c.to_url(), "etcds://h1:2379,h2:1/?prefix=p%2F");
        let url = format!(
            "etcds://app:pw@h?cacert={}&cert={}&key={}",
            enc(&ca),
            enc(&ca),
            enc(&key_file)
        );
        let c = EtcdConfig::from_url(&url).unwrap();
        assert_eq!(EtcdConfig::from_url(&c.to_url()).unwrap(), c);
        assert!(!EtcdConfig::from_url("etcd://h").unwrap().is_tls());

        let missing = dir.path().join("missing.pem").display().to_string();
        for (query, names, says) in [
            (
                format!("cacert={}", enc(&bad)),
                &bad,
                "does not hold PEM certificates",
            ),
            (
                format!("cacert={}", enc(&missing)),
                &missing,
                "cannot read cacert",
            ),
            (
                format!("cert={}&key={}", enc(&ca), enc(&bad)),
                &bad,
                "does not hold a PEM private key",
            ),
            (
                format!("cert={}&key={}", enc(&key_file), enc(&key_file)),
                &key_file,
                "does not hold PEM certificates",
            ),
        ] {
            let r = reason(&format!("etcds://h?{query}"));
            assert!(r.contains(names.as_str()) && r.contains(says), "{r}");
            assert!(
                !r.contains("S3cretContents") && !r.contains("PRIVATE"),
                "{r}"
            );
        }
        let r = reason(&format!("etcds://h?cert={}", enc(&ca)));
        assert!(r.contains("both cert=PATH and key=PATH"), "{r}");
        let r = reason("etcds://h?cacert=a&cacert=b");
        assert!(r.contains("\"cacert\" appears twice"), "{r}");
    }

    #[test]
    fn no_reason_quotes_user_info_or_a_bad_member() {
        // A raw '?' or '/' in the password ends the authority before '@'.
        for url in [
            "etcd://app:S3cretPart?rest@127.0.0.1:32479",
            "etcd://app:S3cretPart/rest@127.0.0.1:32479",
            "etcd://app:1234?S3cretPart@h",
            "etcd://h1,app:S3cretPart?x@h2",
        ] {
            let r = reason(url);
            assert!(
                !r.contains("S3cretPart") && !r.contains("rest") && r.contains("percent-encode"),
                "{url}: {r}"
            );
        }
        // A member that does not parse is named by its position and why.
        for (url, why) in [
            (
                "etcd://h1,S3cretPart x",
                "2 of 2 is not HOST or HOST:PORT: the host has a character",
            ),
            (
                "etcd://h:S3cretPart",
                "1 of 1 is not HOST or HOST:PORT: the port is not a number",
            ),
            (
                "etcd://h,[S3cretPart]:1,h",
                "2 of 3 is not HOST or HOST:PORT: an address in brackets",
            ),
            (
                "etcd://[::1]S3cretPart",
                "1 of 1 is not HOST or HOST:PORT: only :PORT",
            ),
            (
                "etcd://h1,,h2",
                "2 of 3 is not HOST or HOST:PORT: the host is empty",
            ),
        ] {
            // The reason only: the redacted URL shows host names.
            let r = reason(url);
            let (_, why_given) = r.split_once(" | ").unwrap();
            assert!(
                why_given.contains(why) && !why_given.contains("S3cretPart"),
                "{url}: {r}"
            );
        }
        // A user name with an encoded colon is user info too: masked.
        let r = reason("etcd://app%3AS3cretPart@h?prefx=a");
        assert!(
            !r.contains("S3cretPart") && r.contains("etcd://***@h"),
            "{r}"
        );
        let err = EtcdConfig::new(["h", "app:S3cretPart"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("endpoint 2 of 2") && !err.contains("S3cretPart"),
            "{err}"
        );
    }
}
