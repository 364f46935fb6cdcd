//! [`S3Config`]: the settings of the S3 store, its `s3://` URL (parsing,
//! printing, redaction) and the S3 register built from them (module docs,
//! "URL").

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey, S3ConditionalPut};
use object_store::client::{HttpConnector, ReqwestConnector};
use object_store::{BackoffConfig, ClientOptions, RetryConfig};
use percent_encoding::percent_decode_str;

use super::credentials::missing_credentials;
use super::keys::check_prefix;
use super::register::{BucketName, SignedDelete};
use super::{
    ObjectLeaseStore, ObjectRegister, DEFAULT_PREFIX, DEFAULT_REQUEST_TIMEOUT, RETRIES,
    RETRY_TIMEOUT,
};
use crate::error::{InvalidInput, Result, StoreError};
#[cfg(doc)]
use crate::store::register::Register;
use crate::store::register::RegisterStore;
use crate::store::url_parts::{
    checked_endpoint, checked_region, parse_resource_url, redact, resource_url_error,
    setting_error, ResourceUrl,
};
use crate::store::url_query::QueryParams;

/// [`Register::kind`] of the S3 register.
const S3_KIND: &str = "s3";
/// The URL parameters the S3 store reads.
const PARAMS: &[&str] = &["endpoint", "region"];
/// Where the S3 store's credentials come from (never from a URL).
const CREDENTIALS: &str =
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or another AWS credential source)";
/// The `s3://` URL, for its refusals.
const S3_URL: ResourceUrl = ResourceUrl {
    scheme: "s3",
    store: "S3",
    usage: "s3://BUCKET/PREFIX?endpoint=URL&region=REGION",
    credentials: CREDENTIALS,
    no_server: "the URL names a bucket, not a server: give the server as \
                ?endpoint=http://HOST:PORT",
    no_fragment: "an s3:// URL takes no #fragment",
};

/// An S3 (or S3-compatible) store's settings, from an `s3://` URL or by
/// hand; credentials always come from the environment (see the module
/// docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Config {
    bucket: String,
    prefix: String,
    endpoint: Option<String>,
    region: Option<String>,
    request_timeout: Duration,
}

impl S3Config {
    /// The settings for `bucket`, with the default prefix, endpoint and
    /// region (from the environment, else AWS's defaults).
    ///
    /// # Errors
    /// [`InvalidInput::Config`] for an empty bucket name or one with
    /// characters other than ASCII letters, digits, `.`, `-` and `_`.
    pub fn new(bucket: impl Into<String>) -> Result<Self> {
        let bucket = bucket.into();
        if let Some(reason) = check_bucket(&bucket) {
            return Err(InvalidInput::Config(reason).into());
        }
        Ok(Self {
            bucket,
            prefix: DEFAULT_PREFIX.to_string(),
            endpoint: None,
            region: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        })
    }

    /// Parses `s3://BUCKET[/PREFIX][?endpoint=URL&region=REGION]` (see the
    /// module docs).
    ///
    /// # Errors
    /// [`InvalidInput::StoreUrl`] (the URL redacted) for another scheme, a
    /// missing or malformed bucket, credentials in the URL, a bad prefix
    /// (as [`S3Config::prefix`]), an endpoint that is not an `http(s)://`
    /// URL, an empty region, or an unknown or repeated parameter.
    pub fn from_url(url: &str) -> Result<Self> {
        from_object_url(
            url,
            &S3_URL,
            PARAMS,
            |bucket, prefix| Self::new(bucket)?.prefix(prefix),
            |config, name, value| match name {
                "endpoint" => config.endpoint(value),
                _ => config.region(value),
            },
        )
    }

    /// Sets the prefix the lease objects are under. Stores with different
    /// prefixes share nothing.
    ///
    /// # Errors
    /// [`InvalidInput::Config`] as [`ObjectRegister::new`].
    pub fn prefix(mut self, prefix: impl Into<String>) -> Result<Self> {
        let prefix = prefix.into();
        if let Some(reason) = check_prefix(&prefix) {
            return Err(InvalidInput::Config(reason).into());
        }
        self.prefix = prefix;
        Ok(self)
    }

    /// Sets the endpoint, for an S3-compatible server
    /// (`http://127.0.0.1:9000`); plain HTTP is allowed for an `http://`
    /// endpoint.
    ///
    /// # Errors
    /// [`InvalidInput::Config`] when `endpoint` is not an `http://` or
    /// `https://` URL with a host, or carries user info (`user:secret@`):
    /// credentials come from the `AWS_*` environment only, since the HTTP
    /// client would show an endpoint's user info in its errors and logs.
    pub fn endpoint(mut self, endpoint: &str) -> Result<Self> {
        self.endpoint = Some(checked_endpoint(endpoint, CREDENTIALS)?);
        Ok(self)
    }

    /// Sets the region (else `AWS_REGION`, else `us-east-1`).
    ///
    /// # Errors
    /// [`InvalidInput::Config`] for an empty region.
    pub fn region(mut self, region: &str) -> Result<Self> {
        self.region = Some(checked_region(region)?);
        Ok(self)
    }

    /// Sets how long one request may take (default
    /// [`DEFAULT_REQUEST_TIMEOUT`]; connecting counts too).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The prefix of the lease objects.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// The URL of these settings (the request timeout is not part of it).
    pub fn to_url(&self) -> String {
        object_url(
            "s3",
            &self.bucket,
            &self.prefix,
            [("endpoint", &self.endpoint), ("region", &self.region)],
        )
    }

    /// The S3 register of these settings: `object_store`'s [`AmazonS3`]
    /// with conditional puts (`If-Match` / `If-None-Match`), this
    /// configuration on top of the `AWS_*` environment (the URL's endpoint
    /// wins over `AWS_ENDPOINT`, `AWS_ENDPOINT_URL` and
    /// `AWS_ENDPOINT_URL_S3`), and conditional deletes sent through signed
    /// URLs. Nothing is sent yet.
    ///
    /// Credentials come from the environment (see the module docs,
    /// "Credentials"). With an endpoint other than AWS's own
    /// (`*.amazonaws.com`) and no credential source in the environment,
    /// this fails at once instead of asking the EC2 instance metadata
    /// service, which only AWS's endpoints accept credentials of.
    ///
    /// # Errors
    /// [`crate::Error::Store`] when `object_store` refuses the settings
    /// (for example an `AWS_*` variable it cannot parse) or cannot make
    /// its HTTP client, and when an S3-compatible endpoint is given without
    /// credentials (the message names the variables to set).
    pub fn register(&self) -> Result<ObjectRegister> {
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&self.bucket)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_retry(retry_config());
        if let Some(region) = &self.region {
            builder = builder.with_region(region);
        }
        // object_store prefers AWS_ENDPOINT_URL_S3 to the endpoint: the
        // URL's goes into both.
        let endpoint = self
            .endpoint
            .clone()
            .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::S3Endpoint))
            .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::Endpoint));
        if let Some(reason) = missing_credentials(&builder, endpoint.as_deref()) {
            return Err(StoreError::new(S3_KIND, reason).into());
        }
        let allow_http = endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"))
            || std::env::var("AWS_ALLOW_HTTP").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
        if let Some(endpoint) = &self.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_config(AmazonS3ConfigKey::S3Endpoint, endpoint);
        }
        let options = client_options(self.request_timeout, allow_http);
        let s3: AmazonS3 = builder
            .with_client_options(options.clone())
            .build()
            .map_err(|e| StoreError::with_source(S3_KIND, "cannot set up the S3 client", e))?;
        let http = ReqwestConnector::default()
            .connect(&options)
            .map_err(|e| StoreError::with_source(S3_KIND, "cannot set up the HTTP client", e))?;
        let s3 = Arc::new(s3);
        let mut register = ObjectRegister::new(s3.clone(), &self.prefix)?;
        register.kind = S3_KIND;
        register.delete = Some(SignedDelete { signer: s3, http });
        register.bucket = Some(BucketName {
            name: self.bucket.clone(),
            endpoint: endpoint.as_deref().map(redact),
        });
        Ok(register)
    }

    /// The lease store of these settings: [`S3Config::register`] through
    /// the register adapter.
    ///
    /// # Errors
    /// As [`S3Config::register`].
    pub fn open(&self) -> Result<ObjectLeaseStore> {
        Ok(RegisterStore::new(self.register()?))
    }
}

/// The settings an `s3://` or `azblob://` URL of `shape` names: `new`
/// makes them for the bucket (container) its host names and the prefix
/// its path names (percent-decoded, without the slashes around it; no
/// path: [`DEFAULT_PREFIX`]), `set` applies each query parameter, one of
/// `known`, in the order given.
///
/// # Errors
/// [`InvalidInput::StoreUrl`] (the URL redacted) for what
/// [`parse_resource_url`] refuses, a prefix that is not UTF-8, an unknown
/// or repeated parameter, or what `new` or `set` refuse.
pub(super) fn from_object_url<C>(
    url: &str,
    shape: &ResourceUrl,
    known: &[&str],
    new: impl FnOnce(&str, &str) -> Result<C>,
    set: impl Fn(C, &str, &str) -> Result<C>,
) -> Result<C> {
    let url = url.trim();
    let parsed = parse_resource_url(url, shape)?;
    let path = percent_decode_str(parsed.path())
        .decode_utf8()
        .map_err(|_| resource_url_error(url, "the prefix is not UTF-8"))?;
    let path = path.strip_prefix('/').unwrap_or(&path);
    let path = path.strip_suffix('/').unwrap_or(path);
    let prefix = if path.is_empty() {
        DEFAULT_PREFIX
    } else {
        path
    };
    let mut config =
        new(parsed.host_str().unwrap_or_default(), prefix).map_err(|e| setting_error(url, e))?;
    let params =
        QueryParams::parse(parsed.query_pairs(), known).map_err(|r| resource_url_error(url, r))?;
    for (name, value) in params {
        config = set(config, &name, &value).map_err(|e| setting_error(url, e))?;
    }
    Ok(config)
}

/// The URL of an object store's settings: `scheme://PLACE/PREFIX` with the
/// parameters that are set.
pub(super) fn object_url(
    scheme: &str,
    place: &str,
    prefix: &str,
    params: [(&str, &Option<String>); 2],
) -> String {
    let mut u = match url::Url::parse(&format!("{scheme}://{place}")) {
        Ok(u) => u,
        Err(_) => return format!("{scheme}://{place}/{prefix}"),
    };
    if let Ok(mut segments) = u.path_segments_mut() {
        segments.clear().extend(prefix.split('/'));
    }
    let params: Vec<(&str, &str)> = params
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
        .collect();
    if !params.is_empty() {
        u.query_pairs_mut().extend_pairs(params);
    }
    u.to_string()
}

/// How `object_store` retries a failed request of the store.
pub(super) fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: RETRIES,
        retry_timeout: RETRY_TIMEOUT,
    }
}

/// The HTTP client's options: `timeout` for a request and for connecting,
/// plain HTTP when `allow_http`.
pub(super) fn client_options(timeout: Duration, allow_http: bool) -> ClientOptions {
    ClientOptions::new()
        .with_timeout(timeout)
        .with_connect_timeout(timeout)
        .with_allow_http(allow_http)
}

/// Why `bucket` is no bucket name, or `None`.
fn check_bucket(bucket: &str) -> Option<String> {
    if bucket.is_empty() {
        return Some("the URL names no bucket: write s3://BUCKET/PREFIX".into());
    }
    if !bucket
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    {
        return Some(format!(
            "bucket {bucket:?} has characters other than letters, digits, `.`, `-` and `_`"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_urls() {
        let c = S3Config::from_url(
            "s3://worklease-test/ci/run%201?endpoint=http://127.0.0.1:5000&region=eu-west-1",
        )
        .unwrap();
        assert_eq!(c.bucket(), "worklease-test");
        assert_eq!(c.get_prefix(), "ci/run 1");
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:5000"));
        assert_eq!(c.region.as_deref(), Some("eu-west-1"));
        assert_eq!(S3Config::from_url(&c.to_url()).unwrap(), c);
        let d = S3Config::from_url("S3://bucket").unwrap();
        assert_eq!(d.get_prefix(), DEFAULT_PREFIX);
        assert_eq!(d.to_url(), "s3://bucket/worklease");
        assert_eq!(
            S3Config::from_url("s3://bucket/p/").unwrap().get_prefix(),
            "p"
        );

        let reason = |u: &str| match S3Config::from_url(u) {
            Err(crate::Error::Invalid(InvalidInput::StoreUrl { url, reason })) => {
                format!("{url} | {reason}")
            }
            other => panic!("{u}: {other:?}"),
        };
        let r = reason("s3://AKIA:s3cret@bucket/p");
        assert!(
            r.contains("AWS_ACCESS_KEY_ID") && !r.contains("s3cret"),
            "{r}"
        );
        let r = reason("s3://AKIAEXAMPLEKEY@bucket/p");
        assert!(!r.contains("AKIAEXAMPLEKEY"), "{r}");
        for endpoint in [
            "http://u:SuperSecret6@127.0.0.1:1",
            "http%3A%2F%2Fu%3ASuperSecret6%40127.0.0.1%3A1",
        ] {
            let r = reason(&format!("s3://bucket/p?endpoint={endpoint}"));
            assert!(
                r.contains("carries credentials") && !r.contains("SuperSecret6"),
                "{r}"
            );
        }
        assert!(reason("s3:///p").contains("no bucket"));
        assert!(reason("s3://bucket:9000/p").contains("endpoint"));
        assert!(reason("s3://bucket/a//b").contains("segment"));
        assert!(reason("s3://bucket/p?prefix=x").contains("unknown parameter"));
        assert!(reason("s3://bucket/p?region=a&region=b").contains("twice"));
        assert!(reason("s3://bucket/p?endpoint=localhost:9000").contains("http://"));
        assert!(reason("s3://bucket/p?region=").contains("region"));
        assert!(reason("gs://bucket/p").contains("s3://"));
    }
}
