//! What an `object_store` error is known to mean beyond its kind (a
//! missing bucket, no credentials from the EC2 instance metadata service),
//! and the store errors that say so.

use super::credentials::CREDENTIALS_ADVICE;
use super::ObjectRegister;
use crate::error::StoreError;

impl ObjectRegister {
    /// A store error for `e` with `message`; when `e` is the S3 answer
    /// `NoSuchBucket`, one that names the missing bucket instead, and when
    /// it is a failure to get credentials from the EC2 instance metadata
    /// service, one that says which variables to set.
    pub(super) fn explain(&self, message: String, e: object_store::Error) -> StoreError {
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
}

/// What an `object_store` error is known to mean, beyond its kind.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Diagnosis {
    /// S3 answered `NoSuchBucket`: the bucket does not exist.
    NoSuchBucket,
    /// Getting credentials from the EC2 instance metadata service failed
    /// (off EC2, or no role attached).
    NoCredentials,
}

/// Recognises the errors of [`Diagnosis`] in `e` and its causes, by the
/// S3 error code in the response body and by the instance metadata
/// service's address (`object_store` has no typed form of either).
pub(super) fn diagnose(e: &object_store::Error) -> Option<Diagnosis> {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::object::keys::escape;
    use crate::store::object::register::BucketName;

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
}
