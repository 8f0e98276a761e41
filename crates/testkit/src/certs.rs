//! Certificate authorities and the certificates they sign, for TLS tests:
//! each certificate is good for `localhost` and `127.0.0.1` and for both
//! server and client authentication, and is written next to its key the
//! way cert-manager updates a Secret volume (a new file renamed over the
//! old one, so a reader never sees half of one).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ca")
    }
}

/// A certificate and its private key, PEM.
#[derive(Clone, Debug)]
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    /// The certificate, DER (to compare with what a peer presented).
    pub der: Vec<u8>,
}

/// Writes `text` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp-write");
    std::fs::write(&tmp, text).expect("write a certificate file");
    std::fs::rename(&tmp, path).expect("rename a certificate file");
}

impl Ca {
    /// A new self-signed CA called `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        Ca {
            issuer: CertifiedIssuer::self_signed(params, key).expect("self-signed CA"),
        }
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// Writes the CA certificate to `dir/name`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        write_atomic(&p, &self.pem());
        p
    }

    /// A certificate for `localhost` and `127.0.0.1` named `cn`.
    pub fn leaf(&self, cn: &str) -> Leaf {
        self.leaf_valid(cn, false)
    }

    /// A certificate whose validity ended in 2001.
    pub fn expired_leaf(&self, cn: &str) -> Leaf {
        self.leaf_valid(cn, true)
    }

    fn leaf_valid(&self, cn: &str, expired: bool) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign leaf");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

impl Leaf {
    /// Writes `dir/{stem}.crt` and `dir/{stem}.key` (the key first, so a
    /// reader that sees the new certificate finds its key).
    pub fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let (c, k) = (dir.join(format!("{stem}.crt")), dir.join(format!("{stem}.key")));
        write_atomic(&k, &self.key_pem);
        write_atomic(&c, &self.cert_pem);
        (c, k)
    }
}
