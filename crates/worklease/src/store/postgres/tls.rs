//! TLS for `sslmode=require` and `verify-full` (feature `postgres-tls`).

use std::sync::Arc;

use crate::error::{Result, StoreError};

use super::KIND;

/// The rustls connector of `postgres-tls`: trusts the certificates of the
/// PEM file `root_cert`, or else the system's roots (`SSL_CERT_FILE` and
/// `SSL_CERT_DIR` are honoured), and verifies the server's name.
#[cfg(feature = "postgres-tls")]
pub(super) fn rustls_connector(
    root_cert: Option<&std::path::Path>,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    let tls_err = |what: String| StoreError::new(KIND, what);
    let mut roots = rustls::RootCertStore::empty();
    match root_cert {
        Some(path) => {
            let shown = path.display();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| tls_err(format!("cannot read sslrootcert {shown}: {e}")))?;
            for cert in certs {
                let cert =
                    cert.map_err(|e| tls_err(format!("cannot read sslrootcert {shown}: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| tls_err(format!("sslrootcert {shown}: {e}")))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (_, ignored) = roots.add_parsable_certificates(found.certs);
            if ignored > 0 || !found.errors.is_empty() {
                tracing::debug!(
                    ignored,
                    errors = found.errors.len(),
                    "some system root certificates were not usable"
                );
            }
        }
    }
    if roots.is_empty() {
        return Err(tls_err(
            "no trusted root certificates for TLS: name a PEM file with sslrootcert=PATH".into(),
        )
        .into());
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| StoreError::with_source(KIND, "cannot set up TLS", e))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}
