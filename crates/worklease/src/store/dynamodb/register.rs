//! [`DynamoRegister`]: one DynamoDB item per work ID as a compare-and-swap
//! [`Register`], a fencing-floor item beside it, and the read-back
//! reconciliation of failed writes (module docs).

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use bytes::Bytes;
use tokio::sync::OnceCell;

use super::client::Connection;
use super::errors::Failure;
use super::keys::{fence_key, lease_key, lease_key_start, work_id_of, FLOOR, PK, RECORD, VERSION};
use super::{DynamoConfig, KIND, MAX_CHECKPOINT_BYTES};
use crate::error::StoreError;
use crate::limits::WorkId;
use crate::store::register::{Handle, Register, RegisterError};

type Item = HashMap<String, AttributeValue>;

/// One item per work ID in a DynamoDB table, as a compare-and-swap
/// [`Register`]: every write is conditional on the item's version
/// attribute, and every acquisition first raises the work ID's fencing
/// floor, an item of its own that survives the lease item's deletion (see
/// the module docs). Made by [`DynamoConfig::register`]; the client is made
/// on the first request.
pub struct DynamoRegister {
    config: DynamoConfig,
    connection: OnceCell<Connection>,
}

impl std::fmt::Debug for DynamoRegister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoRegister")
            .field("table", &self.config.table)
            .field("prefix", &self.config.prefix)
            .finish()
    }
}

/// A string attribute.
fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

/// A fresh version for a write: 128 random bits, so no two writes share one
/// and a version never comes back (no ABA).
fn new_version() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl DynamoRegister {
    pub(super) fn new(config: DynamoConfig) -> Self {
        Self {
            config,
            connection: OnceCell::new(),
        }
    }

    /// The settings of this register.
    pub fn config(&self) -> &DynamoConfig {
        &self.config
    }

    /// The client, made on the first call (a failed attempt is made again
    /// by the next call).
    async fn connection(&self) -> Result<&Connection, RegisterError> {
        Ok(self
            .connection
            .get_or_try_init(|| Connection::open(&self.config))
            .await?)
    }

    /// The client underneath (made on the first call), for tests and
    /// tools that look at the table beside the store.
    ///
    /// # Errors
    /// [`RegisterError::Store`] when the AWS configuration has no region,
    /// or `create=true` cannot make the table.
    pub async fn client(&self) -> Result<&aws_sdk_dynamodb::Client, RegisterError> {
        Ok(&self.connection().await?.client)
    }

    /// The partition key of `work_id`'s lease item.
    pub fn lease_key(&self, work_id: &WorkId) -> String {
        lease_key(&self.config.prefix, work_id)
    }

    /// The partition key of `work_id`'s fencing-floor item.
    pub fn fence_key(&self, work_id: &WorkId) -> String {
        fence_key(&self.config.prefix, work_id)
    }

    fn error(&self, work_id: &WorkId, what: impl std::fmt::Display) -> RegisterError {
        StoreError::new(KIND, format!("work ID {:?}: {what}", work_id.as_str())).into()
    }

    /// The store error for a failed request of kind `failure`.
    async fn failed(
        &self,
        work_id: &WorkId,
        what: &str,
        failure: &Failure,
        text: &str,
    ) -> RegisterError {
        let table = &self.config.table;
        match failure {
            Failure::MissingTable => match self.connection().await {
                Ok(c) => self.error(work_id, c.missing_table(table)),
                Err(e) => e,
            },
            Failure::Throttled => self.error(
                work_id,
                format!(
                    "{what}: throttled by DynamoDB after the SDK's retries (retryable): {text}"
                ),
            ),
            _ => self.error(work_id, format!("{what}: {text}")),
        }
    }

    /// The lease item of `work_id` (strongly consistent), or `None`.
    async fn get(&self, work_id: &WorkId, key: String) -> Result<Option<Item>, RegisterError> {
        let c = self.connection().await?;
        match c
            .client
            .get_item()
            .table_name(&self.config.table)
            .key(PK, s(key))
            .consistent_read(true)
            .send()
            .await
        {
            Ok(out) => Ok(out.item),
            Err(e) => Err(self
                .request_failed(work_id, "reading the lease item", &e)
                .await),
        }
    }

    async fn request_failed<E, R>(
        &self,
        work_id: &WorkId,
        what: &str,
        e: &SdkError<E, R>,
    ) -> RegisterError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug,
    {
        let (failure, text) = Failure::of(e);
        self.failed(work_id, what, &failure, &text).await
    }

    /// The version of `work_id`'s lease item, read back after a failed
    /// write, or `None` when there is no item.
    async fn version(&self, work_id: &WorkId) -> Result<Option<String>, RegisterError> {
        let item = self.get(work_id, self.lease_key(work_id)).await?;
        Ok(item.and_then(|i| match i.get(VERSION) {
            Some(AttributeValue::S(v)) => Some(v.clone()),
            _ => None,
        }))
    }

    /// Raises `work_id`'s fencing floor to `token` unless it is above it
    /// already: the first step of [`Register::write_acquisition`], which
    /// then writes the lease item with [`Register::write`] (module docs,
    /// "Items"). Public for tools and tests that take the two steps apart.
    ///
    /// # Errors
    /// [`RegisterError::Conflict`] when the floor is above `token` already
    /// (raised by another acquisition since it was read; nothing written);
    /// [`RegisterError::Store`] when the request fails.
    pub async fn raise_floor(&self, work_id: &WorkId, token: u64) -> Result<(), RegisterError> {
        let c = self.connection().await?;
        let sent = c
            .client
            .update_item()
            .table_name(&self.config.table)
            .key(PK, s(self.fence_key(work_id)))
            .update_expression("SET #f = :t")
            .condition_expression("attribute_not_exists(#f) OR #f <= :t")
            .expression_attribute_names("#f", FLOOR)
            .expression_attribute_values(":t", AttributeValue::N(token.to_string()))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(()),
            // Raised past `token` by another acquisition since the caller
            // read it: the adapter reads both again and decides.
            Err(e) => match Failure::of(&e) {
                (Failure::Condition, _) => Err(RegisterError::Conflict),
                (failure, text) => Err(self
                    .failed(work_id, "raising the fencing floor", &failure, &text)
                    .await),
            },
        }
    }

    /// The conditional put of `value` over `previous`, reconciled by
    /// reading back when it fails (module docs, "Lost replies").
    async fn put(
        &self,
        work_id: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
    ) -> Result<Handle, RegisterError> {
        let c = self.connection().await?;
        let version = new_version();
        let mut request = c
            .client
            .put_item()
            .table_name(&self.config.table)
            .item(PK, s(self.lease_key(work_id)))
            .item(VERSION, s(version.clone()))
            .item(RECORD, AttributeValue::B(Blob::new(value.to_vec())))
            .expression_attribute_names("#k", PK);
        request = match previous {
            None => request.condition_expression("attribute_not_exists(#k)"),
            Some(h) => request
                .condition_expression("attribute_exists(#k) AND #v = :v")
                .expression_attribute_names("#v", VERSION)
                .expression_attribute_values(":v", s(h.0.clone())),
        };
        let (failure, text) = match request.send().await {
            Ok(_) => return Ok(Handle(version)),
            Err(e) => Failure::of(&e),
        };
        if matches!(failure, Failure::MissingTable | Failure::Refused) {
            return Err(self
                .failed(work_id, "writing the lease item", &failure, &text)
                .await);
        }
        // The SDK retries a request whose reply was lost; the retry of a
        // write that was applied meets its own version and fails its
        // condition. What is there decides.
        let now = match self.version(work_id).await {
            Ok(now) => now,
            Err(read) => {
                return Err(self.error(
                    work_id,
                    format!(
                        "writing the lease item failed ({text}), and reading it back to learn \
                         whether the write took effect failed too ({read})"
                    ),
                ))
            }
        };
        match now {
            Some(v) if v == version => {
                tracing::debug!(
                    work_id = work_id.as_str(),
                    error = text,
                    "the lease item holds this write: it took effect, its reply was lost"
                );
                Ok(Handle(version))
            }
            _ if failure == Failure::Condition => Err(RegisterError::Conflict),
            // Another version is in place: a write conditional on the one
            // named (or on none) can never take effect any more.
            Some(v) if Some(v.as_str()) != previous.map(|h| h.0.as_str()) => {
                Err(RegisterError::Conflict)
            }
            None if previous.is_some() => Err(RegisterError::Conflict),
            _ => Err(self
                .failed(
                    work_id,
                    "writing the lease item failed with its outcome unknown (it may still take \
                     effect)",
                    &failure,
                    &text,
                )
                .await),
        }
    }
}

#[async_trait]
impl Register for DynamoRegister {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn read(&self, key: &WorkId) -> Result<Option<(Bytes, Handle)>, RegisterError> {
        let Some(item) = self.get(key, self.lease_key(key)).await? else {
            return Ok(None);
        };
        match (item.get(RECORD), item.get(VERSION)) {
            (Some(AttributeValue::B(record)), Some(AttributeValue::S(version))) => Ok(Some((
                Bytes::copy_from_slice(record.as_ref()),
                Handle(version.clone()),
            ))),
            _ => Err(self.error(
                key,
                format!(
                    "the lease item has no binary {RECORD:?} or no string {VERSION:?} attribute \
                     (not written by worklease?)"
                ),
            )),
        }
    }

    async fn write(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
    ) -> Result<Handle, RegisterError> {
        self.put(key, previous, value).await
    }

    async fn write_acquisition(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
        fencing_token: u64,
    ) -> Result<Handle, RegisterError> {
        self.raise_floor(key, fencing_token).await?;
        self.put(key, previous, value).await
    }

    /// The work ID's own floor item ([`DynamoRegister::raise_floor`]); a
    /// floor already above `fencing_token` is kept, and counts as raised.
    async fn raise_fencing_floor(
        &self,
        key: &WorkId,
        fencing_token: u64,
    ) -> Result<bool, RegisterError> {
        match self.raise_floor(key, fencing_token).await {
            Ok(()) | Err(RegisterError::Conflict) => Ok(true),
            Err(e) => Err(e),
        }
    }

    async fn fencing_floor(&self, key: &WorkId) -> Result<u64, RegisterError> {
        let Some(item) = self.get(key, self.fence_key(key)).await? else {
            return Ok(0);
        };
        match item.get(FLOOR) {
            Some(AttributeValue::N(n)) => n
                .parse()
                .map_err(|_| self.error(key, format!("the fencing floor {n:?} is no u64"))),
            _ => Err(self.error(
                key,
                format!("the fencing floor item has no number {FLOOR:?} attribute"),
            )),
        }
    }

    async fn delete(&self, key: &WorkId, handle: &Handle) -> Result<(), RegisterError> {
        let c = self.connection().await?;
        let deleted = c
            .client
            .delete_item()
            .table_name(&self.config.table)
            .key(PK, s(self.lease_key(key)))
            .condition_expression("#v = :v")
            .expression_attribute_names("#v", VERSION)
            .expression_attribute_values(":v", s(handle.0.clone()))
            .send()
            .await;
        match deleted {
            Ok(_) => Ok(()),
            Err(e) => match Failure::of(&e) {
                (Failure::Condition, _) => match self.version(key).await {
                    // Gone: deleted by this call's earlier attempt, or by
                    // another purge.
                    Ok(None) => Ok(()),
                    _ => Err(RegisterError::Conflict),
                },
                (failure, text) => Err(self
                    .failed(key, "deleting the lease item", &failure, &text)
                    .await),
            },
        }
    }

    async fn list(&self) -> Result<Vec<WorkId>, RegisterError> {
        let c = self.connection().await?;
        let start = lease_key_start(&self.config.prefix);
        let mut pages = c
            .client
            .scan()
            .table_name(&self.config.table)
            .consistent_read(true)
            .projection_expression("#k")
            .filter_expression("begins_with(#k, :p)")
            .expression_attribute_names("#k", PK)
            .expression_attribute_values(":p", s(start))
            .into_paginator()
            .send();
        let mut ids = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| {
                let message = match Failure::of(&e) {
                    (Failure::MissingTable, _) => c.missing_table(&self.config.table),
                    (_, text) => format!(
                        "listing the lease items of table {:?}: {text}",
                        self.config.table
                    ),
                };
                StoreError::new(KIND, message)
            })?;
            for item in page.items() {
                if let Some(AttributeValue::S(key)) = item.get(PK) {
                    ids.extend(work_id_of(&self.config.prefix, key));
                }
            }
        }
        Ok(ids)
    }

    /// [`MAX_CHECKPOINT_BYTES`]: the item limit is 400 KiB.
    fn max_checkpoint_bytes(&self) -> usize {
        MAX_CHECKPOINT_BYTES
    }
}
