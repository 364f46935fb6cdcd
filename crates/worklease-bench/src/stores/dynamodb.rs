//! The DynamoDB store (`dynamodb://TABLE?endpoint=...`), on dynalite here,
//! one key prefix per scenario in the URL's table. Credentials come from
//! the standard AWS sources (`AWS_*` environment variables), as for the
//! store itself.
//!
//! * Baseline: one conditional `PutItem` (`attribute_not_exists(pk)` for
//!   the first write, then the version number this client last wrote)
//!   through the store's own `aws-sdk-dynamodb` client, as the store
//!   writes its items.
//! * Peer: the AWS DynamoDB Lock Client's pattern, hand-rolled on the same
//!   client: lock is a strongly consistent `GetItem` of the lock item, then
//!   a `PutItem` of it with a random record version number (`rvn`) on
//!   condition `attribute_not_exists(pk)`; a heartbeat is an `UpdateItem`
//!   giving it a new `rvn` on condition that `rvn` and the owner are this
//!   client's; unlock a `DeleteItem` on the same condition. A contender
//!   that finds the item held polls it, and takes it over (a `PutItem` on
//!   condition `rvn = <seen>`) only once it has seen the same `rvn`
//!   unchanged for the lease duration (the TTL, as ours). No fencing: the
//!   `rvn` is random.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{DisplayErrorContext, SdkError};
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use bytes::Bytes;
use futures_util::StreamExt;
use worklease::store::dynamodb::DynamoConfig;
use worklease::store::url;

use super::server::{self, Parts, Server};
use super::{cas_lost, Baseline, Entry, Peer, PeerClient, Register, Settings};
use crate::Result;

/// The DynamoDB store's entry.
pub const ENTRY: Entry = server::entry::<Dynamo>();

/// How often the peer's contender reads the lock item again (the Lock
/// Client's `refreshPeriod`, 1 s by default; shorter here, as the S3
/// peer's retry).
const PEER_REFRESH: Duration = Duration::from_millis(100);
/// The table's partition key (as the store's).
const PK: &str = "pk";
/// How many items cleanup deletes at once.
const CLEANUP_CONCURRENCY: usize = 8;

/// An SDK error as text, with its causes.
fn sdk_text<E, R>(e: &SdkError<E, R>) -> String
where
    E: std::error::Error + 'static,
    R: std::fmt::Debug,
{
    DisplayErrorContext(e).to_string()
}

struct Dynamo {
    config: DynamoConfig,
    client: Client,
}

/// Every key of run `run` starts with this.
fn run_prefix(run: &str) -> String {
    format!("wl-bench-{run}")
}

#[async_trait]
impl Server for Dynamo {
    const NAME: &'static str = "dynamodb";

    fn url(settings: &Settings) -> &str {
        &settings.dynamodb_url
    }

    async fn connect(settings: &Settings) -> Result<Self> {
        let config = DynamoConfig::from_url(&settings.dynamodb_url)?;
        let register = config.register();
        // Loads the AWS configuration (and, with create=true, makes the
        // table); then one request, to see that the server answers.
        let client = register
            .client()
            .await
            .map_err(|e| format!("cannot reach {}: {e}", url::redact(&settings.dynamodb_url)))?
            .clone();
        client
            .describe_table()
            .table_name(config.table())
            .send()
            .await
            .map_err(|e| {
                format!(
                    "cannot reach {}: {}",
                    url::redact(&settings.dynamodb_url),
                    sdk_text(&e)
                )
            })?;
        Ok(Dynamo { config, client })
    }

    fn describe(&self) -> String {
        "a DynamoDB API server (the URL's endpoint: dynalite in CI)".to_string()
    }

    fn namespace(&self, run: &str, tag: &str) -> String {
        format!("{}-{tag}", run_prefix(run))
    }

    fn namespace_url(&self, _settings: &Settings, prefix: &str) -> Result<String> {
        Ok(self.config.clone().prefix(prefix.to_string())?.to_url())
    }

    async fn open(&self, settings: &Settings, url: &str, prefix: &str) -> Result<Parts> {
        let config = DynamoConfig::from_url(url)?;
        let store = Arc::new(config.open());
        let client = store.register().client().await?.clone();
        let table = config.table().to_string();
        let baseline = Arc::new(Cas {
            client: client.clone(),
            table: table.clone(),
            prefix: format!("{prefix}-baseline#{:08x}", rand::random::<u32>()),
            next: AtomicU64::new(0),
        });
        let peer = Arc::new(LockClient {
            client,
            table,
            prefix: format!("{prefix}-lock#"),
            lease: settings.ttl,
        });
        Ok(Parts {
            store,
            baseline,
            peer,
        })
    }

    async fn cleanup(&self, settings: &Settings) -> Result<()> {
        let mut items = self
            .client
            .scan()
            .table_name(self.config.table())
            .projection_expression("#k")
            .filter_expression("begins_with(#k, :p)")
            .expression_attribute_names("#k", PK)
            .expression_attribute_values(":p", AttributeValue::S(run_prefix(&settings.run)))
            .into_paginator()
            .items()
            .send();
        let mut keys: Vec<AttributeValue> = Vec::new();
        while let Some(item) = items.next().await {
            let mut item =
                item.map_err(|e| format!("listing this run's items: {}", sdk_text(&e)))?;
            keys.extend(item.remove(PK));
        }
        let table = self.config.table();
        let deleted: Vec<Result<()>> = futures_util::stream::iter(keys)
            .map(|key| async move {
                self.client
                    .delete_item()
                    .table_name(table)
                    .key(PK, key)
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("deleting an item: {}", sdk_text(&e)).into())
            })
            .buffer_unordered(CLEANUP_CONCURRENCY)
            .collect()
            .await;
        deleted.into_iter().collect()
    }
}

/// The baseline: one conditional `PutItem` per compare-and-set.
struct Cas {
    client: Client,
    table: String,
    prefix: String,
    next: AtomicU64,
}

#[async_trait]
impl Baseline for Cas {
    fn describe(&self) -> String {
        "one conditional PutItem (on the version number of the previous one) through the store's aws-sdk-dynamodb client".to_string()
    }

    async fn register(&self) -> Result<Box<dyn Register>> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(Item {
            client: self.client.clone(),
            table: self.table.clone(),
            key: format!("{}#{n}", self.prefix),
            version: 0,
        }))
    }
}

struct Item {
    client: Client,
    table: String,
    key: String,
    /// The version this client last wrote (0: no item yet).
    version: u64,
}

#[async_trait]
impl Register for Item {
    async fn cas(&mut self, data: &Bytes) -> Result<()> {
        let next = self.version + 1;
        let mut put = self
            .client
            .put_item()
            .table_name(&self.table)
            .item(PK, AttributeValue::S(self.key.clone()))
            .item("v", AttributeValue::N(next.to_string()))
            .item("d", AttributeValue::B(data.to_vec().into()));
        put = if self.version == 0 {
            put.condition_expression("attribute_not_exists(#k)")
                .expression_attribute_names("#k", PK)
        } else {
            put.condition_expression("#v = :v")
                .expression_attribute_names("#v", "v")
                .expression_attribute_values(":v", AttributeValue::N(self.version.to_string()))
        };
        put.send().await.map_err(|e| {
            if e.as_service_error()
                .is_some_and(|s| s.is_conditional_check_failed_exception())
            {
                cas_lost("a DynamoDB item")
            } else {
                crate::BoxError::from(sdk_text(&e))
            }
        })?;
        self.version = next;
        Ok(())
    }
}

/// The AWS DynamoDB Lock Client's pattern, hand-rolled.
struct LockClient {
    client: Client,
    table: String,
    prefix: String,
    lease: Duration,
}

#[async_trait]
impl Peer for LockClient {
    fn describe(&self) -> String {
        format!(
            "the AWS DynamoDB Lock Client's pattern, hand-rolled: GetItem, then PutItem of the lock item with a random record version number on condition attribute_not_exists; heartbeat = UpdateItem to a new record version on condition of the old one; unlock = conditional DeleteItem; a contender reads every {PEER_REFRESH:?} and takes over only after seeing the same record version for the lease duration ({:?})",
            self.lease
        )
    }

    async fn client(&self, _dedicated: bool) -> Result<Box<dyn PeerClient>> {
        Ok(Box::new(LockSession {
            client: self.client.clone(),
            table: self.table.clone(),
            prefix: self.prefix.clone(),
            lease: self.lease,
            owner: format!("owner-{:016x}", rand::random::<u64>()),
            rvn: None,
        }))
    }
}

/// One owner of the peer's locks.
struct LockSession {
    client: Client,
    table: String,
    prefix: String,
    lease: Duration,
    owner: String,
    /// The record version number of the lock this owner holds.
    rvn: Option<String>,
}

/// What a read of the lock item found.
enum Found {
    Free,
    /// Held, with this record version number.
    Held(String),
}

fn new_rvn() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl LockSession {
    fn key(&self, key: &str) -> AttributeValue {
        AttributeValue::S(format!("{}{key}", self.prefix))
    }

    /// A strongly consistent read of the lock item.
    async fn read(&self, key: &str) -> Result<Found> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(PK, self.key(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| sdk_text(&e))?;
        Ok(match out.item.and_then(|mut i| i.remove("rvn")) {
            Some(AttributeValue::S(rvn)) => Found::Held(rvn),
            _ => Found::Free,
        })
    }

    /// Puts the lock item with a new record version number, on condition
    /// that there is none (`over` = `None`) or that its version is `over`.
    /// `Ok(false)` when the condition failed.
    async fn put(&mut self, key: &str, over: Option<&str>) -> Result<bool> {
        let rvn = new_rvn();
        let mut put = self
            .client
            .put_item()
            .table_name(&self.table)
            .item(PK, self.key(key))
            .item("owner", AttributeValue::S(self.owner.clone()))
            .item("rvn", AttributeValue::S(rvn.clone()))
            .item(
                "leaseDuration",
                AttributeValue::N(self.lease.as_millis().to_string()),
            )
            .expression_attribute_names("#k", PK);
        put = match over {
            None => put.condition_expression("attribute_not_exists(#k)"),
            Some(seen) => put
                .condition_expression("attribute_exists(#k) AND rvn = :seen")
                .expression_attribute_values(":seen", AttributeValue::S(seen.to_string())),
        };
        match put.send().await {
            Ok(_) => {
                self.rvn = Some(rvn);
                Ok(true)
            }
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_conditional_check_failed_exception()) =>
            {
                Ok(false)
            }
            Err(e) => Err(sdk_text(&e).into()),
        }
    }

    fn held(&self) -> Result<String> {
        self.rvn
            .clone()
            .ok_or_else(|| "the peer lock is not held by this owner".into())
    }
}

#[async_trait]
impl PeerClient for LockSession {
    async fn try_lock(&mut self, key: &str) -> Result<()> {
        match self.read(key).await? {
            Found::Free if self.put(key, None).await? => Ok(()),
            _ => Err(format!("the lock item {key:?} is held").into()),
        }
    }

    async fn lock(&mut self, key: &str) -> Result<()> {
        // The version seen, and since when (this owner's monotonic clock).
        let mut seen: Option<(String, Instant)> = None;
        loop {
            match self.read(key).await? {
                Found::Free => {
                    if self.put(key, None).await? {
                        return Ok(());
                    }
                }
                Found::Held(rvn) => match &seen {
                    Some((v, since)) if *v == rvn && since.elapsed() >= self.lease => {
                        if self.put(key, Some(&rvn)).await? {
                            return Ok(());
                        }
                        seen = None;
                    }
                    Some((v, _)) if *v == rvn => {}
                    _ => seen = Some((rvn, Instant::now())),
                },
            }
            tokio::time::sleep(PEER_REFRESH).await;
        }
    }

    async fn unlock(&mut self, key: &str) -> Result<()> {
        let rvn = self.held()?;
        self.client
            .delete_item()
            .table_name(&self.table)
            .key(PK, self.key(key))
            .condition_expression("rvn = :rvn AND #o = :o")
            .expression_attribute_names("#o", "owner")
            .expression_attribute_values(":rvn", AttributeValue::S(rvn))
            .expression_attribute_values(":o", AttributeValue::S(self.owner.clone()))
            .send()
            .await
            .map_err(|e| sdk_text(&e))?;
        self.rvn = None;
        Ok(())
    }

    async fn extend(&mut self, key: &str) -> Option<Result<()>> {
        let rvn = match self.held() {
            Ok(rvn) => rvn,
            Err(e) => return Some(Err(e)),
        };
        let next = new_rvn();
        let sent = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(PK, self.key(key))
            .update_expression("SET rvn = :next, leaseDuration = :d")
            .condition_expression("rvn = :rvn AND #o = :o")
            .expression_attribute_names("#o", "owner")
            .expression_attribute_values(":next", AttributeValue::S(next.clone()))
            .expression_attribute_values(":rvn", AttributeValue::S(rvn))
            .expression_attribute_values(":o", AttributeValue::S(self.owner.clone()))
            .expression_attribute_values(
                ":d",
                AttributeValue::N(self.lease.as_millis().to_string()),
            )
            .send()
            .await;
        Some(match sent {
            Ok(_) => {
                self.rvn = Some(next);
                Ok(())
            }
            Err(e) => Err(sdk_text(&e).into()),
        })
    }
}
