//! [`DynamoConfig`]: the settings of the DynamoDB store and its
//! `dynamodb://` URL (parsing, printing, redaction) (module docs, "URL").

use std::time::Duration;

use super::keys::{check_prefix, check_table};
use super::{DynamoLeaseStore, DynamoRegister, DEFAULT_PREFIX, DEFAULT_REQUEST_TIMEOUT};
use crate::error::{InvalidInput, Result};
use crate::store::register::RegisterStore;
use crate::store::url_parts::{
    checked_endpoint, checked_region, parse_resource_url, resource_url_error, setting_error,
    ResourceUrl,
};
use crate::store::url_query::QueryParams;

/// The URL parameters the DynamoDB store reads.
const PARAMS: &[&str] = &["region", "endpoint", "prefix", "create"];
/// Where the DynamoDB store's credentials come from (never from a URL).
const CREDENTIALS: &str = "they come from the standard AWS sources (AWS_ACCESS_KEY_ID and \
    AWS_SECRET_ACCESS_KEY, AWS_PROFILE, a web identity, ECS or EC2 roles)";
/// The `dynamodb://` URL, for its refusals.
const DYNAMODB_URL: ResourceUrl = ResourceUrl {
    scheme: "dynamodb",
    store: "DynamoDB",
    usage: "dynamodb://TABLE?region=REGION",
    credentials: CREDENTIALS,
    // A path is refused with the same words.
    no_server: "the URL names a table, not a server or a path: give the server as \
                ?endpoint=http://HOST:PORT and the key prefix as ?prefix=P",
    no_fragment: "a dynamodb:// URL takes no #fragment",
};

/// The DynamoDB store's settings, from a `dynamodb://` URL or by hand;
/// credentials always come from the standard AWS sources (module docs,
/// "Credentials"), never from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamoConfig {
    pub(super) table: String,
    pub(super) prefix: String,
    pub(super) endpoint: Option<String>,
    pub(super) region: Option<String>,
    pub(super) create: bool,
    pub(super) request_timeout: Duration,
}

impl DynamoConfig {
    /// The settings for `table`, with the default prefix
    /// ([`DEFAULT_PREFIX`]), the region of the AWS environment and AWS's
    /// own endpoint.
    ///
    /// # Errors
    /// [`InvalidInput::Config`] for a name DynamoDB refuses (3 to 255 of
    /// ASCII letters, digits, `_`, `-`, `.`).
    pub fn new(table: impl Into<String>) -> Result<Self> {
        let table = table.into();
        if let Some(reason) = check_table(&table) {
            return Err(InvalidInput::Config(reason).into());
        }
        Ok(Self {
            table,
            prefix: DEFAULT_PREFIX.to_string(),
            endpoint: None,
            region: None,
            create: false,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        })
    }

    /// Parses `dynamodb://TABLE[?region=R&endpoint=URL&prefix=P&create=true]`
    /// (module docs, "URL").
    ///
    /// # Errors
    /// [`InvalidInput::StoreUrl`] (the URL redacted) for another scheme, a
    /// missing or malformed table name, credentials in the URL or in its
    /// endpoint, a path or port, a bad prefix, region or endpoint, a
    /// `create` other than `true`/`false`, or an unknown or repeated
    /// parameter.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = url.trim();
        let parsed = parse_resource_url(url, &DYNAMODB_URL)?;
        if !matches!(parsed.path(), "" | "/") {
            return Err(resource_url_error(url, DYNAMODB_URL.no_server));
        }
        let mut config =
            Self::new(parsed.host_str().unwrap_or_default()).map_err(|e| setting_error(url, e))?;
        let params = QueryParams::parse(parsed.query_pairs(), PARAMS)
            .map_err(|r| resource_url_error(url, r))?;
        for (name, value) in params {
            config = match name.as_str() {
                "region" => config.region(&value),
                "endpoint" => config.endpoint(&value),
                "prefix" => config.prefix(value),
                // The one left of PARAMS: `create`.
                _ => match value.as_ref() {
                    "true" => Ok(config.create(true)),
                    "false" => Ok(config.create(false)),
                    other => Err(InvalidInput::Config(format!(
                        "create={other:?}: write create=true or create=false"
                    ))
                    .into()),
                },
            }
            .map_err(|e| setting_error(url, e))?;
        }
        Ok(config)
    }

    /// Sets the key prefix of the items (default [`DEFAULT_PREFIX`]).
    /// Stores with different prefixes share nothing, in one table.
    ///
    /// # Errors
    /// [`InvalidInput::Config`] for a prefix that is empty, longer than
    /// [`super::MAX_PREFIX_BYTES`], or has a `#` or control characters.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Result<Self> {
        let prefix = prefix.into();
        if let Some(reason) = check_prefix(&prefix) {
            return Err(InvalidInput::Config(reason).into());
        }
        self.prefix = prefix;
        Ok(self)
    }

    /// Sets the endpoint, for a local or DynamoDB-compatible server
    /// (`http://127.0.0.1:8000`); without one, AWS's own endpoint of the
    /// region.
    ///
    /// # Errors
    /// [`InvalidInput::Config`] when `endpoint` is not an `http://` or
    /// `https://` URL with a host, or carries user info (`user:secret@`):
    /// credentials never go in a URL.
    pub fn endpoint(mut self, endpoint: &str) -> Result<Self> {
        self.endpoint = Some(checked_endpoint(endpoint, CREDENTIALS)?);
        Ok(self)
    }

    /// Sets the region (else the AWS environment's: `AWS_REGION`, the
    /// profile's).
    ///
    /// # Errors
    /// [`InvalidInput::Config`] for an empty region or one with spaces.
    pub fn region(mut self, region: &str) -> Result<Self> {
        self.region = Some(checked_region(region)?);
        Ok(self)
    }

    /// Whether the store creates its table when it is missing (on-demand
    /// capacity) and waits until it is active: for development and tests.
    /// Off by default: a production table is made by its operator.
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Sets how long one request attempt may take (default
    /// [`DEFAULT_REQUEST_TIMEOUT`]); the SDK makes at most
    /// [`super::MAX_ATTEMPTS`] attempts within [`super::OPERATION_TIMEOUT`].
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The key prefix of the items.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// The URL of these settings (the request timeout is not part of it).
    pub fn to_url(&self) -> String {
        let mut u = match url::Url::parse(&format!("dynamodb://{}", self.table)) {
            Ok(u) => u,
            Err(_) => return format!("dynamodb://{}", self.table),
        };
        let create = self.create.then_some("true");
        let params: Vec<(&str, &str)> = [
            ("region", self.region.as_deref()),
            ("endpoint", self.endpoint.as_deref()),
            ("prefix", Some(self.prefix.as_str())),
            ("create", create),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
        u.query_pairs_mut().extend_pairs(params);
        u.to_string()
    }

    /// The register of these settings. Nothing is sent yet: the AWS
    /// configuration (region, credentials) is loaded, and the table made
    /// with [`DynamoConfig::create`], on the first request.
    pub fn register(&self) -> DynamoRegister {
        DynamoRegister::new(self.clone())
    }

    /// The lease store of these settings: [`DynamoConfig::register`]
    /// through the register adapter. Nothing is sent yet.
    pub fn open(&self) -> DynamoLeaseStore {
        RegisterStore::new(self.register())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamodb_urls() {
        let c = DynamoConfig::from_url(
            "dynamodb://Leases_1.x?region=eu-west-1&endpoint=http://127.0.0.1:4567&prefix=ci%2Frun&create=true",
        )
        .unwrap();
        assert_eq!(c.table(), "Leases_1.x");
        assert_eq!(c.get_prefix(), "ci/run");
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:4567"));
        assert_eq!(c.region.as_deref(), Some("eu-west-1"));
        assert!(c.create);
        assert_eq!(DynamoConfig::from_url(&c.to_url()).unwrap(), c);
        let d = DynamoConfig::from_url("dynamodb://leases").unwrap();
        assert_eq!(d.get_prefix(), DEFAULT_PREFIX);
        assert!(!d.create && d.region.is_none() && d.endpoint.is_none());
        assert_eq!(DynamoConfig::from_url(&d.to_url()).unwrap(), d);

        let reason = |u: &str| match DynamoConfig::from_url(u) {
            Err(crate::Error::Invalid(InvalidInput::StoreUrl { url, reason })) => {
                format!("{url} | {reason}")
            }
            other => panic!("{u}: {other:?}"),
        };
        let r = reason("dynamodb://AKIA:s3cret@leases");
        assert!(
            r.contains("AWS_ACCESS_KEY_ID") && !r.contains("s3cret"),
            "{r}"
        );
        // Nor the access key ID, in the URL the error shows.
        let e = DynamoConfig::from_url("dynamodb://AKIAEXAMPLE:s3cret@leases")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("AKIAEXAMPLE") && !e.contains("s3cret"), "{e}");
        assert!(!reason("dynamodb://AKIAEXAMPLEKEY@leases").contains("AKIAEXAMPLEKEY"));
        for endpoint in [
            "http://u:SuperSecret6@127.0.0.1:1",
            "http%3A%2F%2Fu%3ASuperSecret6%40127.0.0.1%3A1",
        ] {
            let r = reason(&format!("dynamodb://leases?endpoint={endpoint}"));
            assert!(
                r.contains("carries credentials") && !r.contains("SuperSecret6"),
                "{r}"
            );
        }
        assert!(reason("dynamodb://").contains("no table"));
        assert!(reason("dynamodb://ab").contains("3 to 255"));
        assert!(reason("dynamodb://leases:8000").contains("endpoint"));
        assert!(reason("dynamodb://leases/p").contains("prefix"));
        assert!(reason("dynamodb://leases?prefix=a%23b").contains('#'));
        assert!(reason("dynamodb://leases?table=x").contains("unknown parameter"));
        assert!(reason("dynamodb://leases?region=a&region=b").contains("twice"));
        assert!(reason("dynamodb://leases?endpoint=localhost:8000").contains("http://"));
        assert!(reason("dynamodb://leases?region=").contains("region"));
        assert!(reason("dynamodb://leases?create=yes").contains("create=true"));
        assert!(reason("s3://leases").contains("dynamodb://"));
    }
}
