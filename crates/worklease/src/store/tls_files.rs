//! The PEM files a TLS store URL names (`cacert`, `cert`, `key`), read and
//! checked when the URL is parsed: shared by the etcd (`etcds://`) and
//! Redis (`rediss://`) stores.

use std::path::PathBuf;

/// A PEM file named in a store URL, and its contents as read when the URL
/// was parsed.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct PemFile {
    /// The path as given in the URL (written back by `to_url`).
    pub(crate) path: PathBuf,
    /// The file's contents.
    pub(crate) pem: Vec<u8>,
}

impl PemFile {
    /// Reads `path` (named `what` in errors: `cacert`, `cert` or `key`)
    /// and checks that it holds PEM certificates, or a PEM private key
    /// when `what` is `key`. The reason names the file, never its
    /// contents.
    pub(crate) fn read(what: &str, path: PathBuf) -> std::result::Result<Self, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};

        let shown = path.display().to_string();
        let pem = std::fs::read(&path).map_err(|e| format!("cannot read {what} {shown}: {e}"))?;
        let valid = if what == "key" {
            PrivateKeyDer::from_pem_slice(&pem).is_ok()
        } else {
            let mut certs = CertificateDer::pem_slice_iter(&pem).peekable();
            certs.peek().is_some() && certs.all(|c| c.is_ok())
        };
        if !valid {
            let holds = if what == "key" {
                "a PEM private key"
            } else {
                "PEM certificates"
            };
            return Err(format!("{what} {shown} does not hold {holds}"));
        }
        Ok(Self { path, pem })
    }
}

/// TLS settings: the certificates to trust (`None`: the system's roots)
/// and an optional client certificate and key.
#[derive(Clone, PartialEq, Eq, Default)]
pub(crate) struct TlsFiles {
    pub(crate) ca: Option<PemFile>,
    pub(crate) identity: Option<(PemFile, PemFile)>,
}

impl TlsFiles {
    /// Reads the files of the URL parameters `cacert`, `cert` and `key`
    /// (paths, already percent-decoded).
    ///
    /// # Errors
    /// The reason (naming the parameter and path, never the contents) when
    /// a file cannot be read or holds no PEM of its kind, or when only one
    /// of `cert` and `key` is given.
    pub(crate) fn read(
        ca: Option<String>,
        cert: Option<String>,
        key: Option<String>,
    ) -> std::result::Result<Self, String> {
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((
                PemFile::read("cert", cert.into())?,
                PemFile::read("key", key.into())?,
            )),
            (None, None) => None,
            _ => return Err("a client certificate needs both cert=PATH and key=PATH".to_string()),
        };
        let ca = ca
            .map(|ca| PemFile::read("cacert", ca.into()))
            .transpose()?;
        Ok(Self { ca, identity })
    }

    /// The URL parameters (name, path) that name these files.
    pub(crate) fn params(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let path = |f: &PemFile| f.path.to_string_lossy().into_owned();
        if let Some(ca) = &self.ca {
            out.push(("cacert", path(ca)));
        }
        if let Some((cert, key)) = &self.identity {
            out.push(("cert", path(cert)));
            out.push(("key", path(key)));
        }
        out
    }
}
