//! The DynamoDB client of a register, made on first use: the AWS
//! configuration from the standard sources with the URL's region and
//! endpoint on top, the timeouts and retries of the module docs, and, with
//! `create=true`, the table (module docs, "URL" and "Credentials").

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::error::DisplayErrorContext;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
};
use aws_sdk_dynamodb::Client;

use super::errors::{create_table_command, missing_table};
use super::keys::PK;
use super::{DynamoConfig, KIND, MAX_ATTEMPTS, OPERATION_TIMEOUT};
use crate::error::StoreError;
use crate::store::url_parts::redact;

/// How long `create=true` waits for a table it made (or found being made)
/// to become active (polling `DescribeTable` from 50 ms, doubling up to
/// 1 s). The first request of the store waits for it, and a lease acquired
/// by it starts only then: for development, where a local server makes a
/// table in milliseconds.
const TABLE_ACTIVE_WAIT: Duration = Duration::from_secs(60);

/// A client and what its errors name.
pub(super) struct Connection {
    pub(super) client: Client,
    /// The region in use (the URL's or the environment's).
    pub(super) region: String,
    /// The endpoint, redacted; `None` for AWS's own.
    pub(super) endpoint: Option<String>,
}

impl Connection {
    /// Loads the AWS configuration and makes the client (and the table,
    /// with `create`).
    pub(super) async fn open(config: &DynamoConfig) -> Result<Self, StoreError> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(config.request_timeout)
                    .operation_attempt_timeout(config.request_timeout)
                    .operation_timeout(OPERATION_TIMEOUT.max(config.request_timeout))
                    .build(),
            )
            .retry_config(RetryConfig::standard().with_max_attempts(MAX_ATTEMPTS));
        if let Some(region) = &config.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(endpoint) = &config.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        let sdk = loader.load().await;
        let Some(region) = sdk.region().map(|r| r.to_string()) else {
            return Err(StoreError::new(
                KIND,
                format!(
                    "no AWS region for table {:?}: add ?region=REGION to the store URL, or set \
                     AWS_REGION",
                    config.table
                ),
            ));
        };
        let connection = Self {
            client: Client::new(&sdk),
            region,
            endpoint: config.endpoint.as_deref().map(redact),
        };
        if config.create {
            connection.create_table(&config.table).await?;
        }
        Ok(connection)
    }

    /// The message for a missing `table`.
    pub(super) fn missing_table(&self, table: &str) -> String {
        missing_table(table, &self.region, self.endpoint.as_deref())
    }

    /// Makes `table` unless it exists (another process may be making it at
    /// the same moment) and waits until it is active.
    async fn create_table(&self, table: &str) -> Result<(), StoreError> {
        let failed = |what: &str, text: String| {
            StoreError::new(
                KIND,
                format!(
                    "create=true: {what} table {table:?} failed: {text} (the command that makes \
                     it: `{}`)",
                    create_table_command(table, &self.region, self.endpoint.as_deref())
                ),
            )
        };
        let exists = match self.client.describe_table().table_name(table).send().await {
            Ok(_) => true,
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) =>
            {
                false
            }
            Err(e) => return Err(failed("describing", DisplayErrorContext(&e).to_string())),
        };
        if !exists {
            let key = KeySchemaElement::builder()
                .attribute_name(PK)
                .key_type(KeyType::Hash)
                .build()
                .map_err(|e| failed("describing", e.to_string()))?;
            let attribute = AttributeDefinition::builder()
                .attribute_name(PK)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(|e| failed("describing", e.to_string()))?;
            let made = self
                .client
                .create_table()
                .table_name(table)
                .key_schema(key)
                .attribute_definitions(attribute)
                .billing_mode(BillingMode::PayPerRequest)
                .send()
                .await;
            match made {
                Ok(_) => tracing::info!(table, "made the DynamoDB table (create=true)"),
                // Made by another process meanwhile.
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_resource_in_use_exception()) => {}
                Err(e) => return Err(failed("creating", DisplayErrorContext(&e).to_string())),
            }
        }
        // The SDK's waiter polls every 20 s at least: a lease's first
        // acquisition would outlive its TTL. Poll from 50 ms, doubling.
        let started = tokio::time::Instant::now();
        let mut delay = Duration::from_millis(50);
        loop {
            let described = self.client.describe_table().table_name(table).send().await;
            match described {
                Ok(out) => {
                    let status = out.table().and_then(|t| t.table_status());
                    if status == Some(&TableStatus::Active) {
                        break;
                    }
                }
                Err(e)
                    if e.as_service_error()
                        .is_some_and(|s| s.is_resource_not_found_exception()) => {}
                Err(e) => return Err(failed("waiting for", DisplayErrorContext(&e).to_string())),
            }
            if started.elapsed() >= TABLE_ACTIVE_WAIT {
                return Err(failed(
                    "waiting for",
                    format!("not active after {TABLE_ACTIVE_WAIT:?}"),
                ));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
        Ok(())
    }
}
