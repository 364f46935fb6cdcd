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

/// Acquires `work` with `leases`, checkpoints it and reads the checkpoint
/// back, each over the (TLS) connection under test; returns the token,
/// still held.
pub(crate) async fn checkpoint_round_trip(
    leases: &worklease::Leases,
    work: &str,
) -> worklease::Token {
    let t = leases
        .acquire(work, worklease::AcquireOptions::new())
        .await
        .expect("acquire over TLS");
    let t = leases
        .checkpoint(&t, &b"over TLS"[..])
        .await
        .expect("checkpoint over TLS");
    let c = leases.read_checkpoint(&t).await.expect("read over TLS");
    assert_eq!(c.data.as_deref(), Some(&b"over TLS"[..]));
    t
}
