//! [`AzureConfig`]: the settings of the object-storage store on Azure Blob
//! Storage (feature `azure`), its `azblob://` URL (parsing, printing) and
//! the register built from them (module docs, "Azure Blob Storage").

use std::sync::Arc;
use std::time::Duration;

use object_store::azure::{AzureConfigKey, MicrosoftAzure, MicrosoftAzureBuilder};
use object_store::{BackoffConfig, ClientOptions, RetryConfig};
use percent_encoding::percent_decode_str;

use super::config::invalid_reason;
use super::keys::check_prefix;
use super::{
    ObjectLeaseStore, ObjectRegister, DEFAULT_PREFIX, DEFAULT_REQUEST_TIMEOUT, RETRIES,
    RETRY_TIMEOUT,
};
use crate::error::{InvalidInput, Result, StoreError};
use crate::store::register::RegisterStore;
use crate::store::url_parts::{check_endpoint, redact_with_endpoint};

/// [`crate::store::register::Register::kind`] of the Azure register.
const AZURE_KIND: &str = "azblob";
/// The URL parameters the Azure store reads.
const PARAMS: &[&str] = &["endpoint", "account"];
/// Where the credentials come from, for error messages.
const CREDENTIALS_ADVICE: &str = "credentials come from the standard Azure variables: \
    AZURE_STORAGE_ACCOUNT_KEY (a shared key), AZURE_STORAGE_SAS_KEY (a SAS token), \
    AZURE_STORAGE_TOKEN (a bearer token), AZURE_CLIENT_ID with AZURE_CLIENT_SECRET or \
    AZURE_FEDERATED_TOKEN_FILE and AZURE_TENANT_ID (a service principal, workload \
    identity), else a managed identity";

/// An Azure Blob Storage container's settings, from an `azblob://` URL or
/// by hand; the account name may come from the URL or from
/// `AZURE_STORAGE_ACCOUNT_NAME`, credentials only from the standard Azure
/// variables (module docs, "Azure Blob Storage").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AzureConfig {
    container: String,
    prefix: String,
    endpoint: Option<String>,
    account: Option<String>,
    request_timeout: Duration,
}

fn url_error(url: &str, reason: impl Into<String>) -> crate::Error {
    InvalidInput::StoreUrl {
        url: redact_with_endpoint(url),
        reason: reason.into(),
    }
    .into()
}

impl AzureConfig {
    /// The settings for `container`, with the default prefix, the account
    /// of `AZURE_STORAGE_ACCOUNT_NAME` and Azure's own endpoint
    /// (`https://ACCOUNT.blob.core.windows.net`).
    ///
    /// # Errors
    /// [`InvalidInput::Config`] for a name Azure refuses (3 to 63 of
    /// lower-case letters, digits and single `-`, starting and ending with
    /// a letter or digit).
    pub fn new(container: impl Into<String>) -> Result<Self> {
        let container = container.into();
        if let Some(reason) = check_container(&container) {
            return Err(InvalidInput::Config(reason).into());
        }
        Ok(Self {
            container,
            prefix: DEFAULT_PREFIX.to_string(),
            endpoint: None,
            account: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        })
    }

    /// Parses `azblob://CONTAINER[/PREFIX][?endpoint=URL&account=NAME]`
    /// (module docs, "Azure Blob Storage").
    ///
    /// # Errors
    /// [`InvalidInput::StoreUrl`] (the URL redacted) for another scheme, a
    /// missing or malformed container, credentials in the URL or in its
    /// endpoint, a port, a bad prefix, account or endpoint, or an unknown
    /// or repeated parameter.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = url.trim();
        let parsed = url::Url::parse(url).map_err(|e| {
            url_error(
                url,
                format!("not a valid URL ({e}): write azblob://CONTAINER/PREFIX?endpoint=URL"),
            )
        })?;
        if parsed.scheme() != "azblob" {
            return Err(url_error(
                url,
                format!(
                    "the Azure Blob store takes azblob:// URLs, not {}://",
                    parsed.scheme()
                ),
            ));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(url_error(
                url,
                format!("credentials do not go in the URL: {CREDENTIALS_ADVICE}"),
            ));
        }
        if parsed.port().is_some() {
            return Err(url_error(
                url,
                "the URL names a container, not a server: give the server as \
                 ?endpoint=http://HOST:PORT/ACCOUNT",
            ));
        }
        let mut config = Self::new(parsed.host_str().unwrap_or_default())
            .map_err(|e| url_error(url, invalid_reason(e)))?;
        let path = percent_decode_str(parsed.path())
            .decode_utf8()
            .map_err(|_| url_error(url, "the prefix is not UTF-8"))?;
        let path = path.strip_prefix('/').unwrap_or(&path);
        let path = path.strip_suffix('/').unwrap_or(path);
        if !path.is_empty() {
            config = config
                .prefix(path)
                .map_err(|e| url_error(url, invalid_reason(e)))?;
        }
        let mut seen = std::collections::HashSet::new();
        for (key, value) in parsed.query_pairs() {
            if !seen.insert(key.clone().into_owned()) {
                return Err(url_error(
                    url,
                    format!("the parameter {key:?} appears twice"),
                ));
            }
            config = match key.as_ref() {
                "endpoint" => config.endpoint(value.as_ref()),
                "account" => config.account(value.as_ref()),
                other => {
                    return Err(url_error(
                        url,
                        format!(
                            "unknown parameter {other:?}: the accepted ones are {}",
                            PARAMS.join(", ")
                        ),
                    ))
                }
            }
            .map_err(|e| url_error(url, invalid_reason(e)))?;
        }
        if parsed.fragment().is_some() {
            return Err(url_error(url, "an azblob:// URL takes no #fragment"));
        }
        Ok(config)
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

    /// Sets the account's blob endpoint, for an emulator or another cloud
    /// (Azurite: `http://127.0.0.1:10000/devstoreaccount1`, the account
    /// in the path); plain HTTP is allowed for an `http://` endpoint.
    ///
    /// # Errors
    /// [`InvalidInput::Config`] when `endpoint` is not an `http://` or
    /// `https://` URL with a host, or carries user info: credentials come
    /// from the Azure variables only.
    pub fn endpoint(mut self, endpoint: &str) -> Result<Self> {
        if let Some(reason) = check_endpoint(endpoint, CREDENTIALS_ADVICE) {
            return Err(InvalidInput::Config(reason).into());
        }
        self.endpoint = Some(endpoint.to_string());
        Ok(self)
    }

    /// Sets the storage account (else `AZURE_STORAGE_ACCOUNT_NAME`).
    ///
    /// # Errors
    /// [`InvalidInput::Config`] for a name that is not 3 to 24 lower-case
    /// letters and digits.
    pub fn account(mut self, account: &str) -> Result<Self> {
        let ok = (3..=24).contains(&account.len())
            && account
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if !ok {
            return Err(InvalidInput::Config(format!(
                "account {account:?} is not 3 to 24 lower-case letters and digits"
            ))
            .into());
        }
        self.account = Some(account.to_string());
        Ok(self)
    }

    /// Sets how long one request may take (default
    /// [`DEFAULT_REQUEST_TIMEOUT`]; connecting counts too).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The container.
    pub fn container(&self) -> &str {
        &self.container
    }

    /// The prefix of the lease objects.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// The URL of these settings (the request timeout is not part of it).
    pub fn to_url(&self) -> String {
        let mut u = match url::Url::parse(&format!("azblob://{}", self.container)) {
            Ok(u) => u,
            Err(_) => return format!("azblob://{}/{}", self.container, self.prefix),
        };
        if let Ok(mut segments) = u.path_segments_mut() {
            segments.clear().extend(self.prefix.split('/'));
        }
        let params: Vec<(&str, &str)> = [("endpoint", &self.endpoint), ("account", &self.account)]
            .into_iter()
            .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
            .collect();
        if !params.is_empty() {
            u.query_pairs_mut().extend_pairs(params);
        }
        u.to_string()
    }

    /// The Azure register of these settings: `object_store`'s
    /// [`MicrosoftAzure`] (conditional puts: `If-None-Match: *` and
    /// `If-Match: <ETag>`) from the `AZURE_*` environment, with this
    /// configuration on top. Nothing is sent yet.
    ///
    /// # Errors
    /// [`crate::Error::Store`] when no account is named (URL or
    /// `AZURE_STORAGE_ACCOUNT_NAME`), when an endpoint is given and the
    /// environment has no credential of the kinds that work off Azure
    /// (a shared key, a SAS or bearer token), or when `object_store`
    /// refuses the settings (the message names no credential).
    pub fn register(&self) -> Result<ObjectRegister> {
        let mut builder = MicrosoftAzureBuilder::from_env()
            .with_container_name(&self.container)
            .with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: RETRIES,
                retry_timeout: RETRY_TIMEOUT,
            });
        if let Some(account) = &self.account {
            builder = builder.with_account(account);
        }
        if builder
            .get_config_value(&AzureConfigKey::AccountName)
            .is_none()
        {
            return Err(StoreError::new(
                AZURE_KIND,
                format!(
                    "no storage account for container {:?}: add ?account=NAME to the store URL, \
                     or set AZURE_STORAGE_ACCOUNT_NAME",
                    self.container
                ),
            )
            .into());
        }
        if let Some(endpoint) = &self.endpoint {
            let keyed = [
                AzureConfigKey::AccessKey,
                AzureConfigKey::SasKey,
                AzureConfigKey::Token,
            ]
            .iter()
            .any(|k| builder.get_config_value(k).is_some());
            if !keyed {
                return Err(StoreError::new(
                    AZURE_KIND,
                    format!(
                        "no credentials for the endpoint {}: set AZURE_STORAGE_ACCOUNT_KEY (for \
                         Azurite, its well-known development key), AZURE_STORAGE_SAS_KEY or \
                         AZURE_STORAGE_TOKEN",
                        crate::store::url_parts::redact(endpoint)
                    ),
                )
                .into());
            }
            builder = builder.with_endpoint(endpoint.clone());
        }
        let allow_http = self
            .endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"));
        let options = ClientOptions::new()
            .with_timeout(self.request_timeout)
            .with_connect_timeout(self.request_timeout)
            .with_allow_http(allow_http);
        // object_store's errors here name keys and kinds, never a
        // credential's value.
        let azure: MicrosoftAzure = builder.with_client_options(options).build().map_err(|e| {
            StoreError::with_source(AZURE_KIND, "cannot set up the Azure Blob client", e)
        })?;
        let mut register = ObjectRegister::new(Arc::new(azure), &self.prefix)?;
        register.kind = AZURE_KIND;
        Ok(register)
    }

    /// The lease store of these settings: [`AzureConfig::register`]
    /// through the register adapter.
    ///
    /// # Errors
    /// As [`AzureConfig::register`].
    pub fn open(&self) -> Result<ObjectLeaseStore> {
        Ok(RegisterStore::new(self.register()?))
    }
}

/// Why `container` is no container name, or `None`.
fn check_container(container: &str) -> Option<String> {
    if container.is_empty() {
        return Some("the URL names no container: write azblob://CONTAINER/PREFIX".into());
    }
    let ok = (3..=63).contains(&container.len())
        && container
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !container.starts_with('-')
        && !container.ends_with('-')
        && !container.contains("--");
    if !ok {
        return Some(format!(
            "container {container:?} is not 3 to 63 lower-case letters, digits and single `-` \
             (starting and ending with a letter or digit)"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn azblob_urls() {
        let c = AzureConfig::from_url(
            "azblob://leases/ci/run%201?endpoint=http://127.0.0.1:10000/devstoreaccount1&account=devstoreaccount1",
        )
        .unwrap();
        assert_eq!(c.container(), "leases");
        assert_eq!(c.get_prefix(), "ci/run 1");
        assert_eq!(
            c.endpoint.as_deref(),
            Some("http://127.0.0.1:10000/devstoreaccount1")
        );
        assert_eq!(c.account.as_deref(), Some("devstoreaccount1"));
        assert_eq!(AzureConfig::from_url(&c.to_url()).unwrap(), c);
        let d = AzureConfig::from_url("azblob://leases").unwrap();
        assert_eq!(d.get_prefix(), DEFAULT_PREFIX);
        assert_eq!(d.to_url(), "azblob://leases/worklease");

        let reason = |u: &str| match AzureConfig::from_url(u) {
            Err(crate::Error::Invalid(InvalidInput::StoreUrl { url, reason })) => {
                format!("{url} | {reason}")
            }
            other => panic!("{u}: {other:?}"),
        };
        let r = reason("azblob://acct:S3cretKey@leases/p");
        assert!(
            r.contains("AZURE_STORAGE_ACCOUNT_KEY") && !r.contains("S3cretKey"),
            "{r}"
        );
        let r = reason("azblob://leases/p?endpoint=http://u:SuperSecret6@127.0.0.1:1/a");
        assert!(!r.contains("SuperSecret6"), "{r}");
        assert!(reason("azblob:///p").contains("no container"));
        assert!(reason("azblob://a--b/p").contains("container"));
        assert!(reason("azblob://leases:10000/p").contains("endpoint"));
        assert!(reason("azblob://leases/a//b").contains("segment"));
        assert!(reason("azblob://leases/p?prefix=x").contains("unknown parameter"));
        assert!(reason("azblob://leases/p?account=abc&account=def").contains("twice"));
        assert!(reason("azblob://leases/p?account=Bad_Name").contains("account"));
        assert!(reason("s3://leases/p").contains("azblob://"));
    }
}
