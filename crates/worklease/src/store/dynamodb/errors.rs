//! What a failed DynamoDB request means for the register (module docs,
//! "Errors"): a lost condition, a missing table, throttling, a request
//! refused outright, or an outcome nobody knows.

use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

/// The kind of a failed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    /// A `ConditionExpression` did not hold (`ConditionalCheckFailedException`):
    /// nothing written by this attempt (an earlier attempt of the same
    /// call, retried by the SDK, may have been applied).
    Condition,
    /// The table does not exist (`ResourceNotFoundException`).
    MissingTable,
    /// Throttled (`ProvisionedThroughputExceededException`,
    /// `ThrottlingException`, `RequestLimitExceeded`) or in conflict with a
    /// transaction on the same item, after the SDK's own retries: retryable.
    Throttled,
    /// Refused before it could apply anything (validation, access denied,
    /// bad credentials, a request that could not be built).
    Refused,
    /// Timed out, cut, or a server error: it may or may not have been
    /// applied.
    Unknown,
}

impl Failure {
    /// The kind of `error`, and its text: a service error's code and
    /// message, or the chain of causes of a failure in transit (never a
    /// credential: the SDK's errors carry none).
    pub(super) fn of<E, R>(error: &SdkError<E, R>) -> (Self, String)
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug,
    {
        match error {
            SdkError::ServiceError(e) => {
                let e = e.err();
                let text = format!(
                    "{}: {}",
                    e.code().unwrap_or("an error without a code"),
                    e.message().unwrap_or("no message")
                );
                (Self::of_code(e.code()), text)
            }
            SdkError::ConstructionFailure(_) => {
                (Failure::Refused, DisplayErrorContext(error).to_string())
            }
            _ => (Failure::Unknown, DisplayErrorContext(error).to_string()),
        }
    }

    /// The kind of a service error with error code `code`.
    fn of_code(code: Option<&str>) -> Self {
        match code.unwrap_or_default() {
            "ConditionalCheckFailedException" => Failure::Condition,
            "ResourceNotFoundException" => Failure::MissingTable,
            "ProvisionedThroughputExceededException"
            | "ThrottlingException"
            | "RequestLimitExceeded"
            | "TransactionConflictException"
            | "TransactionInProgressException" => Failure::Throttled,
            "InternalServerError" | "ServiceUnavailable" | "" => Failure::Unknown,
            _ => Failure::Refused,
        }
    }
}

/// The message for a missing table: its name, where, and the one-line
/// command that makes it (or `?create=true` for development).
pub(super) fn missing_table(table: &str, region: &str, endpoint: Option<&str>) -> String {
    format!(
        "table {table:?} does not exist (region {region}{}): create it with `{}`, or add \
         ?create=true to the store URL (development)",
        endpoint.map_or(String::new(), |e| format!(", endpoint {e}")),
        create_table_command(table, region, endpoint)
    )
}

/// `aws dynamodb create-table ...` for the store's table: a string
/// partition key `pk`, on-demand capacity.
pub(super) fn create_table_command(table: &str, region: &str, endpoint: Option<&str>) -> String {
    format!(
        "aws dynamodb create-table --table-name {table} --attribute-definitions \
         AttributeName={pk},AttributeType=S --key-schema AttributeName={pk},KeyType=HASH \
         --billing-mode PAY_PER_REQUEST --region {region}{}",
        endpoint.map_or(String::new(), |e| format!(" --endpoint-url {e}")),
        pk = super::keys::PK,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_classified() {
        assert_eq!(
            Failure::of_code(Some("ConditionalCheckFailedException")),
            Failure::Condition
        );
        assert_eq!(
            Failure::of_code(Some("ProvisionedThroughputExceededException")),
            Failure::Throttled
        );
        assert_eq!(
            Failure::of_code(Some("ResourceNotFoundException")),
            Failure::MissingTable
        );
        assert_eq!(
            Failure::of_code(Some("ValidationException")),
            Failure::Refused
        );
        assert_eq!(
            Failure::of_code(Some("InternalServerError")),
            Failure::Unknown
        );
        assert_eq!(Failure::of_code(None), Failure::Unknown);
    }

    #[test]
    fn a_missing_table_names_it_and_the_command() {
        let m = missing_table("leases", "eu-west-1", Some("http://127.0.0.1:4567"));
        for want in [
            "\"leases\"",
            "aws dynamodb create-table --table-name leases",
            "AttributeName=pk,KeyType=HASH",
            "--region eu-west-1",
            "--endpoint-url http://127.0.0.1:4567",
            "create=true",
        ] {
            assert!(m.contains(want), "{want}: {m}");
        }
        assert!(!create_table_command("t", "r", None).contains("endpoint"));
    }
}
