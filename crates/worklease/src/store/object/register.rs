//! [`ObjectRegister`]: the compare-and-swap [`Register`] over an object
//! store, with the read-back reconciliation of failed writes and the
//! conditional delete of S3 (module docs, "Error mapping").

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::header::IF_MATCH;
use http::{HeaderValue, Method, StatusCode};
use object_store::client::{HttpClient, HttpRequestBody};
use object_store::path::Path;
use object_store::signer::{SignedUrlOptions, Signer};
use object_store::{
    Attribute, Attributes, GetOptions, ObjectStore, PutMode, PutOptions, UpdateVersion,
};

use super::diagnose::diagnose;
use super::keys::{check_prefix, unescape};
#[cfg(doc)]
use super::{S3Config, MAX_PREFIX_BYTES};
use crate::error::{InvalidInput, Result, StoreError};
use crate::limits::WorkId;
use crate::store::register::{Handle, Register, RegisterError};

/// How long the signed URL of a conditional delete stays valid.
const SIGNED_DELETE_TTL: Duration = Duration::from_secs(300);
/// The content type of lease objects.
const CONTENT_TYPE: &str = "application/octet-stream";
/// [`Register::kind`] of a register over any object store.
const GENERIC_KIND: &str = "object-store";

/// A conditional delete through a signed URL with a signed `If-Match`
/// header, for stores where `object_store` offers none itself (S3).
pub(super) struct SignedDelete {
    pub(super) signer: Arc<dyn Signer>,
    pub(super) http: HttpClient,
}

/// One object per work ID under a prefix, as a compare-and-swap
/// [`Register`] (see the module docs for the key layout, the handle, the
/// error mapping and the reconciliation of lost replies).
///
/// [`Register::delete`] (only used by garbage collection, [`crate::gc`])
/// needs a
/// conditional delete, which `object_store` does not offer: the S3
/// register ([`S3Config::register`]) sends one itself (`DELETE` with
/// `If-Match`, through a signed URL); a register made with
/// [`ObjectRegister::new`] refuses deletes with a store error.
pub struct ObjectRegister {
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) prefix: String,
    pub(super) kind: &'static str,
    pub(super) delete: Option<SignedDelete>,
    /// The S3 bucket and endpoint, to name them when the bucket is missing.
    pub(super) bucket: Option<BucketName>,
}

/// Where an S3 register's objects are, for its error messages.
pub(super) struct BucketName {
    pub(super) name: String,
    /// The endpoint (credentials redacted); `None` for AWS's own.
    pub(super) endpoint: Option<String>,
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
    /// garbage collection, [`crate::gc`]) are refused: `object_store` has
    /// no conditional delete.
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

    fn error(&self, work_id: &WorkId, what: impl std::fmt::Display) -> RegisterError {
        StoreError::new(self.kind, format!("work ID {:?}: {what}", work_id.as_str())).into()
    }

    fn failed(&self, work_id: &WorkId, what: &str, e: object_store::Error) -> RegisterError {
        self.explain(format!("work ID {:?}: {what}", work_id.as_str()), e)
            .into()
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

    /// One floor for the whole prefix, the object
    /// `<prefix>/worklease=fencing-floor` (`floor.rs`).
    async fn fencing_floor(&self, _key: &WorkId) -> std::result::Result<u64, RegisterError> {
        Ok(self.read_floor().await?.0)
    }

    async fn raise_fencing_floor(
        &self,
        _key: &WorkId,
        fencing_token: u64,
    ) -> std::result::Result<bool, RegisterError> {
        self.raise_floor(fencing_token).await
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
