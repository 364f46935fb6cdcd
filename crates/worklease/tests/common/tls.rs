//! Throwaway certificates for the TLS tests (etcd, MySQL), made by rcgen.

/// A throwaway CA (its certificate in PEM, and an issuer to sign with),
/// named `name`.
pub(crate) fn test_ca(name: &str) -> (String, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = rcgen::KeyPair::generate().expect("CA key");
    let pem = params.self_signed(&key).expect("CA certificate").pem();
    (pem, rcgen::Issuer::new(params, key))
}

/// A certificate for `name` (a DNS name or an IP address) signed by
/// `issuer`: the certificate and its private key, in PEM.
pub(crate) fn signed_cert(
    issuer: &rcgen::Issuer<'static, rcgen::KeyPair>,
    name: &str,
) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec![name.to_string()])
        .expect("certificate params")
        .signed_by(&key, issuer)
        .expect("certificate");
    (cert.pem(), key.serialize_pem())
}
