//! TLS (feature `redis-tls`): the `cacert`, `cert` and `key` parameters of
//! a `rediss://` (or `rediss+cluster://`) URL, and the `redis` crate's
//! rustls clients built from them (certificates and host names always
//! verified).

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
    redis::Client::build_with_tls(info, certificates(tls))
}

/// The certificates of `tls` as the `redis` crate takes them (for one
/// server's client and a Cluster's), with a default crypto provider
/// installed.
pub(super) fn certificates(tls: &TlsFiles) -> redis::TlsCertificates {
    // The `redis` crate builds its rustls configuration with the process's
    // default crypto provider: make sure there is one (ring, as the rest
    // of this crate uses); an error means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    redis::TlsCertificates {
        client_tls: tls
            .identity
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.pem.clone(),
                client_key: key.pem.clone(),
            }),
        root_cert: tls.ca.as_ref().map(|ca| ca.pem.clone()),
    }
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
