//! A fake certificate authority for tests: a self-signed root that issues certificates with the
//! SANs a test asks for (a SPIFFE URI, host names, IP addresses). Real X.509 throughout.

use std::path::Path;

/// A fake CA: a self-signed root with its key.
pub struct FakeCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

/// A certificate the fake CA issued, with its private key, as PEM.
pub struct Issued {
    pub cert: String,
    pub key: String,
}

impl FakeCa {
    /// A new root whose organisation is `name`.
    pub fn new(name: &str) -> FakeCa {
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, name);
        let key = rcgen::KeyPair::generate().expect("a key");
        FakeCa {
            issuer: rcgen::CertifiedIssuer::self_signed(params, key).expect("the fake CA"),
        }
    }

    /// The root certificate.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The root, for tests that sign with it themselves.
    pub fn issuer(&self) -> &rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
        &self.issuer
    }

    /// A certificate with `uri` (a SPIFFE ID, say) as URI SAN when given, and `names` as DNS or
    /// IP SANs.
    pub fn issue(&self, uri: Option<&str>, names: &[&str]) -> Issued {
        let mut params = rcgen::CertificateParams::default();
        if let Some(uri) = uri {
            params.subject_alt_names.push(rcgen::SanType::URI(
                rcgen::string::Ia5String::try_from(uri.to_string()).expect("a URI"),
            ));
        }
        for name in names {
            params.subject_alt_names.push(match name.parse() {
                Ok(ip) => rcgen::SanType::IpAddress(ip),
                Err(_) => rcgen::SanType::DnsName(
                    rcgen::string::Ia5String::try_from(name.to_string()).expect("a DNS name"),
                ),
            });
        }
        let key = rcgen::KeyPair::generate().expect("a key");
        let cert = params.signed_by(&key, &self.issuer).expect("a certificate");
        Issued {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// Writes the root as `dir/ca.pem` and returns its path.
    pub fn write(&self, dir: &Path) -> std::path::PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, self.pem()).expect("write the CA");
        path
    }
}

impl Issued {
    /// Writes `dir/<name>.pem` and `dir/<name>-key.pem`; returns their paths.
    pub fn write(&self, dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}-key.pem"));
        std::fs::write(&cert, &self.cert).expect("write the certificate");
        std::fs::write(&key, &self.key).expect("write the key");
        (cert, key)
    }
}
