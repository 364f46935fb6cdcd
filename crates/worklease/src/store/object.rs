//! The object-storage store (feature `object-store`): one object per work
//! ID in S3 or any store of the [`object_store`] crate that has conditional
//! writes, used as a compare-and-swap register ([`ObjectRegister`]) through
//! the generic register adapter ([`RegisterStore`]).
//!
//! With conditional writes an object is exactly the `hoplock` backend:
//! `If-None-Match: *` creates it only where there is none
//! ([`PutMode::Create`]), `If-Match: <ETag>` replaces it only while it is
//! the version read ([`PutMode::Update`]). Amazon S3 has both since 2024;
//! so do Cloudflare R2, MinIO, Google Cloud Storage (features `gcp`) and
//! Azure Blob Storage (feature `azure`).
//!
//! * **Key layout.** The lease of a work ID is the object
//!   `<prefix>/<escaped work ID>` (default prefix [`DEFAULT_PREFIX`]). The
//!   escaping percent-encodes every byte except ASCII letters, digits, `-`,
//!   `_` and `.` (and the dots of a work ID that is `.` or `..`), so a work
//!   ID is always one path segment: `jobs/a` is `<prefix>/jobs%2Fa`, never
//!   a key in a sub-folder, and no work ID names anything outside the
//!   prefix. A key may be at most [`MAX_KEY_BYTES`] long (S3's, GCS's and
//!   Azure's limit): a longer one fails with a store error naming the limit,
//!   and nothing is written. Objects under the prefix that are not ours
//!   (other names, sub-folders) are left alone.
//! * **Value and its encoding.** The object holds the adapter's lease
//!   record: holder, fencing generation (token), TTL, phase (held,
//!   released, revoked), checkpoint and previous holder, in the versioned
//!   binary `WLR1` encoding documented in [`crate::store::register`]; the
//!   version is in its magic, so a future `WLR2` is told apart, and an
//!   object that does not decode fails every operation on its work ID with
//!   a store error naming the work ID (nothing is overwritten). Objects are
//!   written with content type `application/octet-stream`.
//! * **Handle.** The version a conditional write names is the object's
//!   ETag together with its version (S3 version ID, GCS generation) where
//!   the store reports one; every write changes the bytes (the record
//!   carries a write counter), so every write changes the ETag.
//! * **Expiry by observation, not by clocks.** An object store has no
//!   clock to judge expiry by, and the wall clocks of two hosts are never
//!   compared: a contender counts a held lease expired only after it has
//!   seen the same version (handle) unchanged for a full TTL on its own
//!   monotonic clock, and a holder counts its lease lost at the send of its
//!   last successful write plus the TTL (the crate docs' "Clocks"; the
//!   proof is in [`crate::store::register`]). So an abandoned lease is
//!   taken over no sooner than one TTL after the contender first saw its
//!   version, and no later than a TTL plus a poll interval.
//! * **Release writes a tombstone.** Release (and an operator's revoke)
//!   writes the record with phase `released` (`revoked`) instead of
//!   deleting the object, so the fencing generation is kept and never goes
//!   backwards. Purging old tombstones is an explicit operator command:
//!   [`purge_released`].
//!
//! # Error mapping
//!
//! | the store answers | [`object_store::Error`] | meaning |
//! |---|---|---|
//! | 412 Precondition Failed to `If-Match` / `If-None-Match` | `Precondition`, `AlreadyExists` | the compare-and-swap was lost ([`RegisterError::Conflict`]): the adapter reads again and decides |
//! | 409 Conflict (a concurrent conditional request) | `AlreadyExists` (after `object_store`'s own retries) | the same: read again and decide |
//! | 404 Not Found to a conditional replace | `Precondition` (S3, memory) | the object is gone, so is the lease: the adapter's re-read finds no record and answers `Fenced` |
//! | 404 to a read | `NotFound` | no lease yet |
//! | 404 `NoSuchBucket` to anything | `NotFound` or `Generic` | a store error naming the missing bucket (never "no lease yet", never a lost compare-and-swap) |
//! | a timeout, a reset, a 5xx after the request was sent | anything else | outcome unknown: reconciled below |
//!
//! A lost compare-and-swap is not always a loss: `object_store` retries a
//! request whose reply was lost, and the retry of a conditional write that
//! had been applied meets its own new version and gets 412. So after every
//! failed write the register reads the object back and decides by what is
//! there: the very bytes it wrote (which name this holder and the new
//! generation, and no other write produces) mean the write was applied,
//! and it succeeds with the handle read; another version means it lost
//! ([`RegisterError::Conflict`]); the version it wrote over, still in
//! place after a timeout, means the write may yet land, and it fails with
//! a store error (the adapter's next read decides again). A holder whose
//! acquisition reply was dropped therefore holds the lease, and never two
//! holders do.
//!
//! # URL
//!
//! `s3://BUCKET[/PREFIX][?endpoint=URL&region=REGION]` ([`S3Config`]):
//! the prefix is the URL's path (percent-decoded; default
//! [`DEFAULT_PREFIX`]); `endpoint` selects an S3-compatible server (an
//! `http://` endpoint allows plain HTTP); `region` is optional (else
//! `AWS_REGION`, else `us-east-1`). Credentials, and settings the URL
//! leaves out, come from the usual `AWS_*` environment variables
//! (`AWS_REGION`, `AWS_ENDPOINT`, ...; see [`AmazonS3Builder::from_env`]),
//! never from the URL.
//!
//! # Credentials
//!
//! `object_store` takes the first of: `AWS_ACCESS_KEY_ID` and
//! `AWS_SECRET_ACCESS_KEY` (with `AWS_SESSION_TOKEN` for temporary ones);
//! `AWS_WEB_IDENTITY_TOKEN_FILE` with `AWS_ROLE_ARN` (EKS IRSA);
//! `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` (ECS tasks);
//! `AWS_CONTAINER_CREDENTIALS_FULL_URI` with
//! `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` (EKS Pod Identity); else the
//! EC2 instance metadata service (`169.254.169.254`, or
//! `AWS_METADATA_ENDPOINT`). `AWS_SKIP_SIGNATURE=true` sends unsigned
//! requests. `AWS_PROFILE` and the files in `~/.aws` are not read.
//!
//! Instance metadata only gives credentials for AWS itself, so with an
//! endpoint that is not AWS's (not under `amazonaws.com`) and none of the
//! sources above, [`S3Config::register`] (and so opening an `s3://` URL)
//! fails at once, naming the variables to set, instead of failing at the
//! first request with an instance-metadata error. Without an endpoint (or
//! with AWS's own) instance metadata stays the last resort, as in the AWS
//! SDKs, for hosts on EC2; off EC2 its failure is reported the same way,
//! as missing credentials. Each request may
//! take [`DEFAULT_REQUEST_TIMEOUT`]; `object_store` retries a failed one at
//! most [`RETRIES`] times within [`RETRY_TIMEOUT`]. Google Cloud Storage
//! and Azure are used through [`ObjectRegister::new`] with a store built by
//! `object_store` (features `gcp`, `azure`).
//!
//! # Not supported, by the nature of an object store
//!
//! No notifications (waiters poll), fencing tokens per work ID only (not
//! across work IDs), and a takeover of an abandoned lease that waits a full
//! observed TTL, as for every [`RegisterStore`]. The store must be strongly
//! consistent (read-after-write and list-after-write, as S3 is since 2020).
//!
//! ```no_run
//! # async fn demo() -> worklease::Result<()> {
//! use std::time::Duration;
//! use worklease::store::object::{purge_released, S3Config};
//!
//! let store = S3Config::from_url("s3://my-bucket/leases?region=eu-west-1")?.open()?;
//! // Operator: delete the tombstones of leases released over 30 days ago.
//! let purged = purge_released(&store, Duration::from_secs(30 * 24 * 3600)).await?;
//! println!("purged {} tombstones", purged.len());
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use http::header::IF_MATCH;
use http::{HeaderValue, Method, StatusCode};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey, S3ConditionalPut};
use object_store::client::{HttpClient, HttpConnector, HttpRequestBody, ReqwestConnector};
use object_store::path::Path;
use object_store::signer::{SignedUrlOptions, Signer};
use object_store::{
    Attribute, Attributes, BackoffConfig, ClientOptions, GetOptions, ObjectStore, PutMode,
    PutOptions, RetryConfig, UpdateVersion,
};
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::error::{InvalidInput, Result, StoreError};
use crate::limits::WorkId;
use crate::store::register::{Handle, Register, RegisterError, RegisterStore};
use crate::store::url_parts::redact;
use crate::store::{LeaseEnd, LeaseStore};

/// The prefix of the lease objects when none is given.
pub const DEFAULT_PREFIX: &str = "worklease";
/// The longest prefix accepted, in bytes (leaving room for work IDs in a
/// key of [`MAX_KEY_BYTES`]).
pub const MAX_PREFIX_BYTES: usize = 256;
/// The longest object key, in bytes: the limit of S3, GCS and Azure.
pub const MAX_KEY_BYTES: usize = 1024;
/// How long one request to the store may take (connecting included).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often `object_store` retries a request that failed in transit or
/// with a 5xx, at most.
pub const RETRIES: usize = 2;
/// How long after its first attempt `object_store` may still retry a request.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the signed URL of a conditional delete stays valid.
const SIGNED_DELETE_TTL: Duration = Duration::from_secs(300);
/// The content type of lease objects.
const CONTENT_TYPE: &str = "application/octet-stream";
/// [`Register::kind`] of a register over any object store.
const GENERIC_KIND: &str = "object-store";
/// [`Register::kind`] of the S3 register.
const S3_KIND: &str = "s3";
/// The URL parameters the S3 store reads.
const PARAMS: &[&str] = &["endpoint", "region"];

/// What the escaping of a work ID encodes: every byte but ASCII letters,
/// digits, `-`, `_` and `.` (non-ASCII bytes are always encoded).
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.');

/// The leases of an object store: the generic register adapter over an
/// [`ObjectRegister`].
pub type ObjectLeaseStore = RegisterStore<ObjectRegister>;

/// A conditional delete through a signed URL with a signed `If-Match`
/// header, for stores where `object_store` offers none itself (S3).
struct SignedDelete {
    signer: Arc<dyn Signer>,
    http: HttpClient,
}

/// One object per work ID under a prefix, as a compare-and-swap
/// [`Register`] (see the module docs for the key layout, the handle, the
/// error mapping and the reconciliation of lost replies).
///
/// [`Register::delete`] (only used by [`purge_released`]) needs a
/// conditional delete, which `object_store` does not offer: the S3
/// register ([`S3Config::register`]) sends one itself (`DELETE` with
/// `If-Match`, through a signed URL); a register made with
/// [`ObjectRegister::new`] refuses deletes with a store error.
pub struct ObjectRegister {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    kind: &'static str,
    delete: Option<SignedDelete>,
    /// The S3 bucket and endpoint, to name them when the bucket is missing.
    bucket: Option<BucketName>,
}

/// Where an S3 register's objects are, for its error messages.
struct BucketName {
    name: String,
    /// The endpoint (credentials redacted); `None` for AWS's own.
    endpoint: Option<String>,
}

impl std::fmt::Debug for ObjectRegister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectRegister")
            .field("store", &self.store.to_string())
            .field("prefix", &self.prefix)
            .field("kind", &self.kind)
            .finish()
    }
}

impl ObjectRegister {
    /// A register over `store` (any [`ObjectStore`] with
    /// [`PutMode::Create`] and [`PutMode::Update`]: S3, GCS, Azure, the
    /// in-memory store) keeping its objects under `prefix`. Deletes (and so
    /// [`purge_released`]) are refused: `object_store` has no conditional
    /// delete.
    ///
    /// # Errors
    /// [`InvalidInput::Config`] for a prefix that is empty, longer than
    /// [`MAX_PREFIX_BYTES`], has control characters, or has an empty, `.`
    /// or `..` segment (between `/`s).
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Result<Self> {
        if let Some(reason) = check_prefix(prefix) {
            return Err(InvalidInput::Config(reason).into());
        }
        Ok(Self {
            store,
            prefix: prefix.to_string(),
            kind: GENERIC_KIND,
            delete: None,
            bucket: None,
        })
    }

    /// The prefix the lease objects are under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The object store underneath.
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The object key of `work_id`'s lease: `<prefix>/<escaped work ID>`.
    ///
    /// # Errors
    /// [`crate::Error::Invalid`] naming [`MAX_KEY_BYTES`] when the key would
    /// be longer.
    pub fn key(&self, work_id: &WorkId) -> Result<Path> {
        self.path(work_id).map_err(|e| match e {
            RegisterError::Store(e) => e.into(),
            RegisterError::Invalid(e) => e.into(),
            other => StoreError::new(self.kind, other.to_string()).into(),
        })
    }

    fn path(&self, work_id: &WorkId) -> std::result::Result<Path, RegisterError> {
        let key = format!("{}/{}", self.prefix, escape(work_id.as_str()));
        if key.len() > MAX_KEY_BYTES {
            return Err(InvalidInput::Config(format!(
                "work ID {:?}: its object key would be {} bytes, over the limit of \
                 {MAX_KEY_BYTES} bytes (prefix, `/` and the escaped work ID)",
                work_id.as_str(),
                key.len()
            ))
            .into());
        }
        Path::parse(&key).map_err(|e| {
            StoreError::with_source(
                self.kind,
                format!("work ID {:?}: no valid object key", work_id.as_str()),
                e,
            )
            .into()
        })
    }

    fn error(&self, work_id: &WorkId, what: impl std::fmt::Display) -> RegisterError {
        StoreError::new(self.kind, format!("work ID {:?}: {what}", work_id.as_str())).into()
    }

    fn failed(&self, work_id: &WorkId, what: &str, e: object_store::Error) -> RegisterError {
        self.explain(format!("work ID {:?}: {what}", work_id.as_str()), e)
            .into()
    }

    /// A store error for `e` with `message`; when `e` is the S3 answer
    /// `NoSuchBucket`, one that names the missing bucket instead, and when
    /// it is a failure to get credentials from the EC2 instance metadata
    /// service, one that says which variables to set.
    fn explain(&self, message: String, e: object_store::Error) -> StoreError {
        match diagnose(&e) {
            Some(Diagnosis::NoSuchBucket) => {
                let (name, at) = match &self.bucket {
                    Some(b) => (
                        format!("{:?}", b.name),
                        b.endpoint
                            .as_ref()
                            .map_or(String::new(), |e| format!(" on {e}")),
                    ),
                    None => ("of the lease objects".to_string(), String::new()),
                };
                StoreError::new(
                    self.kind,
                    format!(
                        "the bucket {name} does not exist{at} (the server answered \
                         NoSuchBucket): create it, or correct the bucket in the store URL"
                    ),
                )
            }
            Some(Diagnosis::NoCredentials) => StoreError::with_source(
                self.kind,
                format!(
                    "{message}: no AWS credentials: none in the environment, and the EC2 \
                     instance metadata service (169.254.169.254) gave none: {CREDENTIALS_ADVICE}"
                ),
                e,
            ),
            None => StoreError::with_source(self.kind, message, e),
        }
    }

    fn handle(
        &self,
        work_id: &WorkId,
        e_tag: Option<String>,
        version: Option<String>,
    ) -> std::result::Result<Handle, RegisterError> {
        encode_handle(e_tag.as_deref(), version.as_deref()).ok_or_else(|| {
            self.error(
                work_id,
                "the object store reported neither an ETag nor a version for the lease object",
            )
        })
    }

    /// Decides the outcome of a conditional put that failed with `error`,
    /// by reading the object back (see the module docs).
    async fn reconcile(
        &self,
        work_id: &WorkId,
        previous: Option<&Handle>,
        value: &Bytes,
        error: object_store::Error,
    ) -> std::result::Result<Handle, RegisterError> {
        use object_store::Error as E;
        let lost = matches!(
            error,
            E::Precondition { .. }
                | E::AlreadyExists { .. }
                | E::NotModified { .. }
                | E::NotFound { .. }
        );
        let current = match self.read(work_id).await {
            Ok(current) => current,
            Err(read) => {
                return Err(self.failed(
                    work_id,
                    &format!(
                        "writing the lease object failed, and reading it back to learn whether \
                         the write took effect failed too ({read})"
                    ),
                    error,
                ))
            }
        };
        match current {
            Some((bytes, handle)) if bytes == *value => {
                tracing::debug!(
                    work_id = work_id.as_str(),
                    %error,
                    "the lease object holds this write: it took effect, its reply was lost"
                );
                Ok(handle)
            }
            _ if lost => Err(RegisterError::Conflict),
            // Another version is in place: a write conditional on the one
            // we named (or on none) can never take effect any more.
            Some((_, handle)) if Some(&handle) != previous => Err(RegisterError::Conflict),
            None if previous.is_some() => Err(RegisterError::Conflict),
            _ => Err(self.failed(
                work_id,
                "writing the lease object failed with its outcome unknown (it may still take \
                 effect)",
                error,
            )),
        }
    }
}

#[async_trait]
impl Register for ObjectRegister {
    fn kind(&self) -> &'static str {
        self.kind
    }

    async fn read(
        &self,
        key: &WorkId,
    ) -> std::result::Result<Option<(Bytes, Handle)>, RegisterError> {
        let path = self.path(key)?;
        match self.store.get_opts(&path, GetOptions::default()).await {
            Ok(got) => {
                let (e_tag, version) = (got.meta.e_tag.clone(), got.meta.version.clone());
                let bytes = got
                    .bytes()
                    .await
                    .map_err(|e| self.failed(key, "reading the lease object", e))?;
                Ok(Some((bytes, self.handle(key, e_tag, version)?)))
            }
            Err(e @ object_store::Error::NotFound { .. }) if diagnose(&e).is_none() => Ok(None),
            Err(e) => Err(self.failed(key, "reading the lease object", e)),
        }
    }

    async fn write(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
    ) -> std::result::Result<Handle, RegisterError> {
        let path = self.path(key)?;
        let mode = match previous {
            None => PutMode::Create,
            Some(h) => PutMode::Update(
                decode_handle(h).ok_or_else(|| self.error(key, "a malformed handle"))?,
            ),
        };
        let mut attributes = Attributes::new();
        attributes.insert(Attribute::ContentType, CONTENT_TYPE.into());
        let options = PutOptions {
            mode,
            attributes,
            ..PutOptions::default()
        };
        match self
            .store
            .put_opts(&path, value.clone().into(), options)
            .await
        {
            Ok(put) => self.handle(key, put.e_tag, put.version),
            Err(e) => self.reconcile(key, previous, &value, e).await,
        }
    }

    async fn delete(
        &self,
        key: &WorkId,
        handle: &Handle,
    ) -> std::result::Result<(), RegisterError> {
        let Some(signed) = &self.delete else {
            return Err(self.error(
                key,
                "this object store has no conditional delete (object_store offers none; the S3 \
                 store sends DELETE with If-Match itself)",
            ));
        };
        let path = self.path(key)?;
        let e_tag = decode_handle(handle)
            .and_then(|v| v.e_tag)
            .and_then(|t| HeaderValue::from_str(&t).ok())
            .ok_or_else(|| self.error(key, "a handle without a valid ETag"))?;
        let options = SignedUrlOptions::new().with_signed_header(IF_MATCH, e_tag.clone());
        let url = signed
            .signer
            .signed_url_opts(Method::DELETE, &path, SIGNED_DELETE_TTL, &options)
            .await
            .map_err(|e| self.failed(key, "signing the conditional delete", e))?;
        // The signed URL carries the credential's signature: it never goes
        // into an error or a log line.
        let request = http::Request::builder()
            .method(Method::DELETE)
            .uri(url.as_str())
            .header(IF_MATCH, e_tag)
            .body(HttpRequestBody::empty())
            .map_err(|_| self.error(key, "cannot build the conditional delete request"))?;
        match signed.http.execute(request).await {
            Ok(response) => match response.status() {
                s if s.is_success() => Ok(()),
                StatusCode::PRECONDITION_FAILED | StatusCode::NOT_FOUND | StatusCode::CONFLICT => {
                    Err(RegisterError::Conflict)
                }
                s => Err(self.error(key, format!("the conditional delete was refused: HTTP {s}"))),
            },
            // Outcome unknown: gone means done (by us or by another purge).
            Err(e) => match self.read(key).await {
                Ok(None) => Ok(()),
                _ => Err(self.error(
                    key,
                    format!(
                        "the conditional delete failed ({:?}) with its outcome unknown",
                        e.kind()
                    ),
                )),
            },
        }
    }

    async fn list(&self) -> std::result::Result<Vec<WorkId>, RegisterError> {
        let prefix = Path::parse(&self.prefix).map_err(|e| {
            StoreError::with_source(self.kind, "the prefix is no valid object path", e)
        })?;
        let listing = self
            .store
            .list_with_delimiter(Some(&prefix))
            .await
            .map_err(|e| {
                self.explain(
                    format!("listing the lease objects under {:?}", self.prefix),
                    e,
                )
            })?;
        Ok(listing
            .objects
            .iter()
            .filter_map(|o| o.location.filename().and_then(unescape))
            .collect())
    }
}

/// The escaped form of a work ID: one object key segment.
fn escape(work_id: &str) -> String {
    match work_id {
        // Not even these may be a relative path segment.
        "." => "%2E".to_string(),
        ".." => "%2E%2E".to_string(),
        _ => utf8_percent_encode(work_id, ESCAPED).to_string(),
    }
}

/// The work ID whose escaped form is `segment`, or `None` when `segment`
/// is not the canonical escaping of a valid work ID (an object of another
/// program under the prefix).
fn unescape(segment: &str) -> Option<WorkId> {
    let id = percent_decode_str(segment).decode_utf8().ok()?;
    if escape(&id) != segment {
        return None;
    }
    WorkId::new(id.into_owned()).ok()
}

/// Why `prefix` cannot be a prefix of lease objects, or `None` when it can.
fn check_prefix(prefix: &str) -> Option<String> {
    if prefix.is_empty() {
        return Some("the object prefix is empty".into());
    }
    if prefix.len() > MAX_PREFIX_BYTES {
        return Some(format!(
            "the object prefix is {} bytes, over the limit of {MAX_PREFIX_BYTES}",
            prefix.len()
        ));
    }
    if prefix.chars().any(char::is_control) {
        return Some("the object prefix has control characters".into());
    }
    if prefix
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Some(format!(
            "the object prefix {prefix:?} has an empty, `.` or `..` segment: write segments \
             separated by single `/`s, without a leading or trailing `/`"
        ));
    }
    None
}

/// A handle's text: `e<length>:<ETag>` and/or `v<version>`.
fn encode_handle(e_tag: Option<&str>, version: Option<&str>) -> Option<Handle> {
    let mut text = String::new();
    if let Some(e) = e_tag {
        text.push_str(&format!("e{}:{e}", e.len()));
    }
    if let Some(v) = version {
        text.push('v');
        text.push_str(v);
    }
    (!text.is_empty()).then_some(Handle(text))
}

/// The version a handle of [`encode_handle`] names.
fn decode_handle(h: &Handle) -> Option<UpdateVersion> {
    let mut rest = h.0.as_str();
    let mut e_tag = None;
    if let Some(after) = rest.strip_prefix('e') {
        let (len, after) = after.split_once(':')?;
        let len: usize = len.parse().ok()?;
        if !after.is_char_boundary(len.min(after.len())) || after.len() < len {
            return None;
        }
        e_tag = Some(after[..len].to_string());
        rest = &after[len..];
    }
    let version = match rest {
        "" => None,
        r => Some(r.strip_prefix('v')?.to_string()),
    };
    (e_tag.is_some() || version.is_some()).then_some(UpdateVersion { e_tag, version })
}

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

fn url_error(url: &str, reason: impl Into<String>) -> crate::Error {
    InvalidInput::StoreUrl {
        url: shown_url(url),
        reason: reason.into(),
    }
    .into()
}

/// `url` redacted, with its `endpoint` parameter decoded and redacted on
/// its own: a percent-encoded `http%3A%2F%2Fuser%3Asecret%40host` would
/// otherwise pass [`redact`] untouched.
fn shown_url(url: &str) -> String {
    let Some((head, query)) = url.split_once('?') else {
        return redact(url);
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some(("endpoint", value)) => {
                let decoded = percent_decode_str(value).decode_utf8_lossy();
                format!("endpoint={}", redact(&decoded))
            }
            _ => pair.to_string(),
        })
        .collect();
    redact(&format!("{head}?{}", query.join("&")))
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
        let url = url.trim();
        let parsed = url::Url::parse(url).map_err(|e| {
            url_error(
                url,
                format!(
                    "not a valid URL ({e}): write s3://BUCKET/PREFIX?endpoint=URL&region=REGION"
                ),
            )
        })?;
        if parsed.scheme() != "s3" {
            return Err(url_error(
                url,
                format!("the S3 store takes s3:// URLs, not {}://", parsed.scheme()),
            ));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(url_error(
                url,
                "credentials do not go in the URL: set AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY (or another AWS credential source)",
            ));
        }
        if parsed.port().is_some() {
            return Err(url_error(
                url,
                "the URL names a bucket, not a server: give the server as ?endpoint=http://HOST:PORT",
            ));
        }
        let bucket = parsed.host_str().unwrap_or_default();
        if let Some(reason) = check_bucket(bucket) {
            return Err(url_error(url, reason));
        }
        let path = percent_decode_str(parsed.path())
            .decode_utf8()
            .map_err(|_| url_error(url, "the prefix is not UTF-8"))?;
        let path = path.strip_prefix('/').unwrap_or(&path);
        let path = path.strip_suffix('/').unwrap_or(path);
        let prefix = if path.is_empty() {
            DEFAULT_PREFIX
        } else {
            path
        };
        if let Some(reason) = check_prefix(prefix) {
            return Err(url_error(url, reason));
        }
        let mut config = Self {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            endpoint: None,
            region: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        };
        let mut seen = std::collections::HashSet::new();
        for (key, value) in parsed.query_pairs() {
            if !seen.insert(key.clone().into_owned()) {
                return Err(url_error(
                    url,
                    format!("the parameter {key:?} appears twice"),
                ));
            }
            match key.as_ref() {
                "endpoint" => {
                    config = config
                        .endpoint(value.as_ref())
                        .map_err(|e| url_error(url, invalid_reason(e)))?
                }
                "region" => {
                    config = config
                        .region(value.as_ref())
                        .map_err(|e| url_error(url, invalid_reason(e)))?
                }
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
        }
        if parsed.fragment().is_some() {
            return Err(url_error(url, "an s3:// URL takes no #fragment"));
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
                "endpoint {:?} carries credentials: they do not go in the URL; set \
                 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or another AWS credential source)",
                redact(endpoint)
            ))
            .into());
        }
        self.endpoint = Some(endpoint.to_string());
        Ok(self)
    }

    /// Sets the region (else `AWS_REGION`, else `us-east-1`).
    ///
    /// # Errors
    /// [`InvalidInput::Config`] for an empty region.
    pub fn region(mut self, region: &str) -> Result<Self> {
        if region.is_empty() || region.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(
                InvalidInput::Config(format!("region {region:?} is empty or has spaces")).into(),
            );
        }
        self.region = Some(region.to_string());
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
        let mut u = match url::Url::parse(&format!("s3://{}", self.bucket)) {
            Ok(u) => u,
            Err(_) => return format!("s3://{}/{}", self.bucket, self.prefix),
        };
        if let Ok(mut segments) = u.path_segments_mut() {
            segments.clear().extend(self.prefix.split('/'));
        }
        let params: Vec<(&str, &str)> = [("endpoint", &self.endpoint), ("region", &self.region)]
            .into_iter()
            .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
            .collect();
        if !params.is_empty() {
            u.query_pairs_mut().extend_pairs(params);
        }
        u.to_string()
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
            .with_retry(RetryConfig {
                backoff: BackoffConfig::default(),
                max_retries: RETRIES,
                retry_timeout: RETRY_TIMEOUT,
            });
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
        let options = ClientOptions::new()
            .with_timeout(self.request_timeout)
            .with_connect_timeout(self.request_timeout)
            .with_allow_http(allow_http);
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

/// The reason of an [`InvalidInput::Config`], for a URL error.
fn invalid_reason(e: crate::Error) -> String {
    match e {
        crate::Error::Invalid(InvalidInput::Config(reason)) => reason,
        other => other.to_string(),
    }
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

/// What to do without credentials, for error messages.
const CREDENTIALS_ADVICE: &str = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and \
     AWS_SESSION_TOKEN for temporary credentials), or AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN; \
     AWS_PROFILE and the files in ~/.aws are not read (`aws configure export-credentials --format \
     env` prints a profile's credentials as these variables)";

/// Why the S3 client `builder` (from the environment) has no credentials
/// for `endpoint`, or `None` when it has a source: static keys, a web
/// identity, ECS or EKS container credentials, unsigned requests
/// (`AWS_SKIP_SIGNATURE`), or the EC2 instance metadata service, which
/// counts only for AWS's own endpoints (no endpoint, or one under
/// `amazonaws.com`) unless `AWS_METADATA_ENDPOINT` names it explicitly.
fn missing_credentials(builder: &AmazonS3Builder, endpoint: Option<&str>) -> Option<String> {
    let set = |key: AmazonS3ConfigKey| builder.get_config_value(&key).is_some();
    let has_source = set(AmazonS3ConfigKey::AccessKeyId)
        || set(AmazonS3ConfigKey::SecretAccessKey)
        || (set(AmazonS3ConfigKey::WebIdentityTokenFile) && set(AmazonS3ConfigKey::RoleArn))
        || set(AmazonS3ConfigKey::ContainerCredentialsRelativeUri)
        || (set(AmazonS3ConfigKey::ContainerCredentialsFullUri)
            && set(AmazonS3ConfigKey::ContainerAuthorizationTokenFile))
        || builder
            .get_config_value(&AmazonS3ConfigKey::SkipSignature)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || set(AmazonS3ConfigKey::MetadataEndpoint);
    let aws = |e: &str| {
        url::Url::parse(e).is_ok_and(|u| {
            u.host_str().is_some_and(|h| {
                let h = h.to_ascii_lowercase();
                h.ends_with(".amazonaws.com") || h.ends_with(".amazonaws.com.cn")
            })
        })
    };
    match endpoint {
        _ if has_source => None,
        None => None,
        Some(e) if aws(e) => None,
        Some(e) => Some(format!(
            "no AWS credentials in the environment for the S3-compatible server {}: \
             {CREDENTIALS_ADVICE}. The EC2 instance metadata service is asked only for AWS's own \
             endpoints (or when AWS_METADATA_ENDPOINT is set)",
            redact(e)
        )),
    }
}

/// What an `object_store` error is known to mean, beyond its kind.
#[derive(Debug, PartialEq, Eq)]
enum Diagnosis {
    /// S3 answered `NoSuchBucket`: the bucket does not exist.
    NoSuchBucket,
    /// Getting credentials from the EC2 instance metadata service failed
    /// (off EC2, or no role attached).
    NoCredentials,
}

/// Recognises the errors of [`Diagnosis`] in `e` and its causes, by the
/// S3 error code in the response body and by the instance metadata
/// service's address (`object_store` has no typed form of either).
fn diagnose(e: &object_store::Error) -> Option<Diagnosis> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        let text = err.to_string();
        if text.contains("<Code>NoSuchBucket</Code>") {
            return Some(Diagnosis::NoSuchBucket);
        }
        if text.contains("169.254.169.254") {
            return Some(Diagnosis::NoCredentials);
        }
        next = err.source();
    }
    None
}

/// An operator's purge: deletes the records of leases that were released
/// or revoked (tombstones) at least `older_than` ago, and returns their
/// work IDs. Live leases and expired ones (whose holder vanished) are kept.
///
/// After a purge the work ID is unknown to the store, and its next
/// acquisition gets fencing token 1 again, with no previous holder and no
/// checkpoint: purge only work IDs that are retired, or whose fenced
/// systems no longer hold tokens of them. The age is judged by the wall
/// clock of whoever released (as `status` shows it) against this host's:
/// it is a bookkeeping age, never used for lease safety.
///
/// Each deletion is conditional on the version that was judged (`DELETE`
/// with `If-Match`), so a lease acquired meanwhile is never deleted.
///
/// # Errors
/// [`crate::Error::Store`] when listing, reading or deleting fails, or the
/// register has no conditional delete ([`ObjectRegister::new`]); the work
/// IDs purged before the failure stay purged.
pub async fn purge_released<R: Register>(
    store: &RegisterStore<R>,
    older_than: Duration,
) -> Result<Vec<WorkId>> {
    let now = SystemTime::now();
    let old = |info: &crate::store::LeaseInfo| {
        matches!(info.ended, Some(LeaseEnd::Released | LeaseEnd::Revoked))
            && now
                .duration_since(info.expires_at)
                .is_ok_and(|age| age >= older_than)
    };
    let mut purged = Vec::new();
    for info in store.inspect(&[]).await? {
        if !old(&info) {
            continue;
        }
        let id = info.work_id;
        // Read the handle first, then judge again: a deletion conditional
        // on this handle succeeds only if what was judged is still there
        // (handles never repeat: every write changes the bytes).
        let handle = match store.register().read(&id).await {
            Ok(Some((_, handle))) => handle,
            Ok(None) => continue,
            Err(RegisterError::Store(e)) => return Err(e.into()),
            Err(RegisterError::Invalid(e)) => return Err(e.into()),
            Err(RegisterError::Conflict) => continue,
        };
        let still = store.inspect(std::slice::from_ref(&id)).await?;
        if !still.first().is_some_and(old) {
            continue;
        }
        match store.register().delete(&id, &handle).await {
            Ok(()) => {
                tracing::info!(
                    work_id = id.as_str(),
                    "purged the tombstone of a released lease"
                );
                purged.push(id);
            }
            Err(RegisterError::Conflict) => {}
            Err(RegisterError::Store(e)) => return Err(e.into()),
            Err(RegisterError::Invalid(e)) => return Err(e.into()),
        }
    }
    Ok(purged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wid(s: &str) -> WorkId {
        WorkId::new(s).unwrap()
    }

    #[test]
    fn work_ids_are_one_segment_and_round_trip() {
        for id in [
            "a", "jobs/a", "jobs/a/b", "jobs%2Fa", ".", "..", "...", "a b?#[]", "日本", "-_.x",
        ] {
            let e = escape(id);
            assert!(!e.contains('/'), "{id:?} -> {e:?}");
            assert!(e != "." && e != "..", "{id:?} -> {e:?}");
            assert_eq!(unescape(&e).unwrap().as_str(), id);
        }
        assert_eq!(escape("jobs/a"), "jobs%2Fa");
        assert_eq!(escape("nightly-2024.01_x"), "nightly-2024.01_x");
        // Only the canonical escaping is ours.
        assert!(unescape("jobs%2fa").is_none());
        assert!(unescape("a%20").is_some());
        assert!(unescape("a ").is_none());
        assert!(unescape("%FF").is_none());
        assert!(unescape("").is_none());
    }

    #[test]
    fn keys_stay_under_the_prefix_and_within_the_limit() {
        let store = Arc::new(object_store::memory::InMemory::new());
        let reg = ObjectRegister::new(store, "team/leases").unwrap();
        assert_eq!(
            reg.key(&wid("jobs/../x")).unwrap().as_ref(),
            "team/leases/jobs%2F..%2Fx"
        );
        assert_eq!(reg.key(&wid("..")).unwrap().as_ref(), "team/leases/%2E%2E");
        let at_limit = "x".repeat(MAX_KEY_BYTES - "team/leases/".len());
        assert!(reg.key(&wid(&at_limit)).is_ok());
        let e = reg.key(&wid(&format!("{at_limit}x"))).unwrap_err();
        assert!(e.to_string().contains(&MAX_KEY_BYTES.to_string()), "{e}");
        for bad in ["", "/x", "x/", "a//b", "a/./b", "..", "a\nb"] {
            let e = ObjectRegister::new(Arc::new(object_store::memory::InMemory::new()), bad);
            assert!(e.is_err(), "{bad:?} accepted");
        }
        let long = "p".repeat(MAX_PREFIX_BYTES + 1);
        let e = ObjectRegister::new(Arc::new(object_store::memory::InMemory::new()), &long)
            .unwrap_err();
        assert!(e.to_string().contains(&MAX_PREFIX_BYTES.to_string()), "{e}");
    }

    #[test]
    fn handles_round_trip() {
        for (e, v) in [
            (Some("\"abc\""), None),
            (Some("\"a:b\"v"), Some("12")),
            (None, Some("v:1")),
            (Some(""), Some("")),
        ] {
            let h = encode_handle(e, v).unwrap();
            let back = decode_handle(&h).unwrap();
            assert_eq!(
                (back.e_tag.as_deref(), back.version.as_deref()),
                (e, v),
                "{h:?}"
            );
        }
        assert!(encode_handle(None, None).is_none());
        for bad in ["", "x", "e9:ab", "e2:abx", "ex:1"] {
            assert!(decode_handle(&Handle(bad.into())).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn an_s3_compatible_endpoint_needs_credentials_from_the_environment() {
        let moto = Some("http://user:pw@127.0.0.1:5000");
        let why = missing_credentials(&AmazonS3Builder::new(), moto).expect("refused");
        for want in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_PROFILE",
            "127.0.0.1:5000",
        ] {
            assert!(why.contains(want), "{want} missing: {why}");
        }
        assert!(!why.contains("pw@"), "{why}");
        // Without an endpoint, or with AWS's own, instance metadata is the
        // last resort (EC2).
        for endpoint in [
            None,
            Some("https://s3.eu-west-1.amazonaws.com"),
            Some("https://bucket.vpce-1a2b.s3.us-east-1.vpce.amazonaws.com"),
        ] {
            assert_eq!(
                missing_credentials(&AmazonS3Builder::new(), endpoint),
                None,
                "{endpoint:?}"
            );
        }
        // Every credential source object_store reads counts.
        use AmazonS3ConfigKey as K;
        let sources: &[&[(K, &str)]] = &[
            &[(K::AccessKeyId, "AK"), (K::SecretAccessKey, "SK")],
            &[(K::WebIdentityTokenFile, "/t"), (K::RoleArn, "arn:r")],
            &[(K::ContainerCredentialsRelativeUri, "/v2/creds")],
            &[
                (K::ContainerCredentialsFullUri, "http://169.254.170.23/v1"),
                (K::ContainerAuthorizationTokenFile, "/t"),
            ],
            &[(K::SkipSignature, "true")],
            &[(K::MetadataEndpoint, "http://169.254.169.254")],
        ];
        for source in sources {
            let builder = source
                .iter()
                .fold(AmazonS3Builder::new(), |b, (k, v)| b.with_config(*k, *v));
            assert_eq!(missing_credentials(&builder, moto), None, "{source:?}");
        }
        // Half a source is none.
        let half = AmazonS3Builder::new().with_config(K::RoleArn, "arn:r");
        assert!(missing_credentials(&half, moto).is_some());
    }

    #[test]
    fn missing_buckets_and_instance_metadata_failures_are_recognised() {
        let not_found = |body: &str| object_store::Error::NotFound {
            path: "p/j".into(),
            source: format!("Server returned non-2xx status code: 404 Not Found: {body}").into(),
        };
        let no_bucket = not_found("<Error><Code>NoSuchBucket</Code></Error>");
        assert_eq!(diagnose(&no_bucket), Some(Diagnosis::NoSuchBucket));
        assert_eq!(
            diagnose(&not_found("<Error><Code>NoSuchKey</Code></Error>")),
            None
        );
        // A work ID that spells the code is escaped in the path: no match.
        assert_eq!(
            diagnose(&object_store::Error::NotFound {
                path: escape("<Code>NoSuchBucket</Code>"),
                source: "404".into(),
            }),
            None
        );
        let imds = object_store::Error::Generic {
            store: "S3",
            source: "Error performing PUT http://169.254.169.254/latest/api/token: 403".into(),
        };
        assert_eq!(diagnose(&imds), Some(Diagnosis::NoCredentials));

        let mut reg = ObjectRegister::new(Arc::new(object_store::memory::InMemory::new()), "p")
            .expect("register");
        reg.bucket = Some(BucketName {
            name: "missing-bucket".into(),
            endpoint: Some("http://127.0.0.1:9000".into()),
        });
        let e = reg.explain("reading".into(), no_bucket).to_string();
        assert!(
            e.contains("\"missing-bucket\" does not exist on http://127.0.0.1:9000"),
            "{e}"
        );
        assert!(!e.contains("<Error>"), "{e}");
        let e = reg.explain("reading".into(), imds).to_string();
        assert!(
            e.contains("no AWS credentials") && e.contains("AWS_ACCESS_KEY_ID"),
            "{e}"
        );
    }

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
