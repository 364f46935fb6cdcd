//! TLS (feature `redis-tls`): the `cacert`, `cert` and `key` parameters of
//! a `rediss://` URL, and the `redis` crate's rustls client built from them
//! (certificates and host names always verified).

use crate::store::tls_files::TlsFiles;

/// The `redis` client for `info` (a `rediss://` address) that trusts the
/// certificates of `tls.ca`, or else the system's roots, and presents
/// `tls.identity` when set.
///
/// # Errors
/// The `redis` crate's error when it refuses the certificates.
pub(super) fn client(
    info: redis::ConnectionInfo,
    tls: &TlsFiles,
) -> redis::RedisResult<redis::Client> {
    // The `redis` crate builds its rustls configuration with the process's
    // default crypto provider: make sure there is one (ring, as the rest
    // of this crate uses); an error means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certificates = redis::TlsCertificates {
        client_tls: tls
            .identity
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.pem.clone(),
                client_key: key.pem.clone(),
            }),
        root_cert: tls.ca.as_ref().map(|ca| ca.pem.clone()),
    };
    redis::Client::build_with_tls(info, certificates)
}

/// A hint appended to a connection error whose cause is the server's
/// certificate, or `None` for other errors.
pub(super) fn hint(e: &redis::RedisError) -> Option<&'static str> {
    let text = format!("{e:?}");
    if text.contains("NotValidForName") || text.contains("not valid for name") {
        Some(
            "the server's certificate does not name the host of the URL: \
             connect by a name the certificate holds",
        )
    } else if text.contains("UnknownIssuer") || text.contains("invalid peer certificate") {
        Some(
            "the server's certificate is not signed by a trusted CA: \
             name its CA's certificate with cacert=PATH",
        )
    } else {
        None
    }
}
