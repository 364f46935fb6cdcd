//! What the object-storage tests share (`tests/object_store.rs` on S3,
//! `tests/azure_blob.rs` on Azure): a prefix of the bucket or container of
//! each test's own, whose objects are deleted when the last register on it
//! is dropped.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::ObjectStore;
use worklease::store::object::ObjectRegister;
use worklease::store::register::{Handle, Register, RegisterError};
use worklease::WorkId;

/// A fresh prefix below `base`, for one test.
pub(crate) fn fresh_prefix(base: &str) -> String {
    format!("{base}/{:016x}", rand::random::<u64>())
}

/// Deletes every object under a prefix when dropped.
pub(crate) struct Cleanup {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
}

impl Cleanup {
    /// The cleanup of `prefix` in the bucket or container of `register`.
    pub(crate) fn of(register: &ObjectRegister, prefix: &str) -> Arc<Self> {
        Arc::new(Self {
            store: register.object_store().clone(),
            prefix: Path::parse(prefix).expect("prefix"),
        })
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (store, prefix) = (self.store.clone(), self.prefix.clone());
        // A runtime of its own: drop may run inside or outside one.
        let result = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let paths = store.list(Some(&prefix)).map_ok(|m| m.location).boxed();
                store
                    .delete_stream(paths)
                    .try_collect::<Vec<_>>()
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            })
        })
        .join();
        if let Ok(Err(e)) | Err(e) = result.map_err(|_| "panicked".to_string()) {
            eprintln!("cannot delete the test objects under {}: {e}", self.prefix);
        }
    }
}

/// A register that keeps the test's [`Cleanup`] alive as long as it lives.
pub(crate) struct Guarded<R> {
    pub(crate) inner: R,
    pub(crate) _cleanup: Arc<Cleanup>,
}

#[async_trait]
impl<R: Register> Register for Guarded<R> {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn read(&self, key: &WorkId) -> Result<Option<(Bytes, Handle)>, RegisterError> {
        self.inner.read(key).await
    }
    async fn write(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
    ) -> Result<Handle, RegisterError> {
        self.inner.write(key, previous, value).await
    }
    async fn delete(&self, key: &WorkId, handle: &Handle) -> Result<(), RegisterError> {
        self.inner.delete(key, handle).await
    }
    async fn list(&self) -> Result<Vec<WorkId>, RegisterError> {
        self.inner.list().await
    }
    async fn fencing_floor(&self, key: &WorkId) -> Result<u64, RegisterError> {
        self.inner.fencing_floor(key).await
    }
    async fn raise_fencing_floor(&self, key: &WorkId, token: u64) -> Result<bool, RegisterError> {
        self.inner.raise_fencing_floor(key, token).await
    }
    fn max_checkpoint_bytes(&self) -> usize {
        self.inner.max_checkpoint_bytes()
    }
}
