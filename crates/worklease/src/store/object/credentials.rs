//! Whether the environment has AWS credentials for an endpoint (module
//! docs, "Credentials"), and what to set when it has none.

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};

use crate::store::url_parts::redact;

/// What to do without credentials, for error messages.
pub(super) const CREDENTIALS_ADVICE: &str = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and \
     AWS_SESSION_TOKEN for temporary credentials), or AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN; \
     AWS_PROFILE and the files in ~/.aws are not read (`aws configure export-credentials --format \
     env` prints a profile's credentials as these variables)";

/// Why the S3 client `builder` (from the environment) has no credentials
/// for `endpoint`, or `None` when it has a source: static keys, a web
/// identity, ECS or EKS container credentials, unsigned requests
/// (`AWS_SKIP_SIGNATURE`), or the EC2 instance metadata service, which
/// counts only for AWS's own endpoints (no endpoint, or one under
/// `amazonaws.com`) unless `AWS_METADATA_ENDPOINT` names it explicitly.
pub(super) fn missing_credentials(
    builder: &AmazonS3Builder,
    endpoint: Option<&str>,
) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
