//! [`AzureConfig`]: the settings of the object-storage store on Azure Blob
//! Storage (feature `azure`), its `azblob://` URL (parsing, printing) and
//! the register built from them (module docs, "Azure Blob Storage").

use std::sync::Arc;
use std::time::Duration;

use object_store::azure::{AzureConfigKey, MicrosoftAzure, MicrosoftAzureBuilder};

use super::config::{client_options, from_object_url, object_url, retry_config};
use super::keys::check_prefix;
use super::{ObjectLeaseStore, ObjectRegister, DEFAULT_PREFIX, DEFAULT_REQUEST_TIMEOUT};
use crate::error::{InvalidInput, Result, StoreError};
use crate::store::register::RegisterStore;
use crate::store::url_parts::{checked_endpoint, ResourceUrl};

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
/// The `azblob://` URL, for its refusals.
const AZURE_URL: ResourceUrl = ResourceUrl {
    scheme: "azblob",
    store: "Azure Blob",
    usage: "azblob://CONTAINER/PREFIX?endpoint=URL",
    credentials: CREDENTIALS_ADVICE,
    no_server: "the URL names a container, not a server: give the server as \
                ?endpoint=http://HOST:PORT/ACCOUNT",
    no_fragment: "an azblob:// URL takes no #fragment",
};

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
        from_object_url(
            url,
            &AZURE_URL,
            PARAMS,
            |container, prefix| Self::new(container)?.prefix(prefix),
            |config, name, value| match name {
                "endpoint" => config.endpoint(value),
                _ => config.account(value),
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

    /// Sets the account's blob endpoint, for an emulator or another cloud
    /// (Azurite: `http://127.0.0.1:10000/devstoreaccount1`, the account
    /// in the path); plain HTTP is allowed for an `http://` endpoint.
    ///
    /// # Errors
    /// [`InvalidInput::Config`] when `endpoint` is not an `http://` or
    /// `https://` URL with a host, or carries user info: credentials come
    /// from the Azure variables only.
    pub fn endpoint(mut self, endpoint: &str) -> Result<Self> {
        self.endpoint = Some(checked_endpoint(endpoint, CREDENTIALS_ADVICE)?);
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
        object_url(
            "azblob",
            &self.container,
            &self.prefix,
            [("endpoint", &self.endpoint), ("account", &self.account)],
        )
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
            .with_retry(retry_config());
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
        let options = client_options(self.request_timeout, allow_http);
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
