//! TLS (feature `mysql-tls`): mysql_async's rustls with ring, set from the
//! URL's `ssl-mode` and `ssl-ca`.

use std::path::Path;

use mysql_async::SslOpts;

use crate::error::{Result, StoreError};

use super::config::SslMode;
use super::KIND;

/// mysql_async's TLS settings for `mode` (MySQL's meanings: `REQUIRED`
/// encrypts without verifying the certificate, `VERIFY_CA` verifies the
/// chain, `VERIFY_IDENTITY` the chain and the host name), trusting the
/// PEM file `ca` or, without it, the built-in web roots. `None` for
/// `DISABLED`.
///
/// `VERIFY_CA` sets mysql_async's `skip_domain_validation`, which 0.37.1
/// ignores under rustls 0.23 (it looks for "NotValidForName" in the
/// error's text, which now reads "certificate not valid for name":
/// blackbeam/mysql_async#404): the name is checked as under
/// `VERIFY_IDENTITY` until a release with the fix (#408).
///
/// # Errors
/// A [`StoreError`] when `ca` cannot be read.
pub(super) fn ssl_opts(mode: SslMode, ca: Option<&Path>) -> Result<Option<SslOpts>> {
    if mode == SslMode::Disabled {
        return Ok(None);
    }
    // mysql_async builds its rustls configuration with the process's
    // default crypto provider: make sure there is one (ring, as the rest
    // of this crate uses); an error means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut opts = SslOpts::default();
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).map_err(|e| {
            StoreError::with_source(
                KIND,
                format!("cannot read the ssl-ca file {}", ca.display()),
                e,
            )
        })?;
        opts = opts
            .with_root_certs(vec![pem.into()])
            .with_disable_built_in_roots(true);
    }
    Ok(Some(match mode {
        SslMode::Disabled | SslMode::VerifyIdentity => opts,
        SslMode::VerifyCa => opts.with_danger_skip_domain_validation(true),
        SslMode::Required => opts
            .with_danger_accept_invalid_certs(true)
            .with_danger_skip_domain_validation(true),
    }))
}
