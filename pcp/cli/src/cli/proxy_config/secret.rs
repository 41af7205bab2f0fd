//! `proxy-config secret`: RESOURCE NAME, TYPE, STATUS, VALID CERT, SERIAL NUMBER, NOT AFTER,
//! NOT BEFORE — one row per certificate the proxy is served over SDS (the workload certificate
//! `default`, the root `ROOTCA`, a gateway's `kubernetes://NAME` credentials), as istioctl
//! prints them: the chain's leaf for a certificate, each root of a trust bundle for a CA.

use envoy_types::pb::envoy::config::core::v3::DataSource;
use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{Secret, secret};
use x509_parser::pem::Pem;

use crate::cli::table;

pub const HEADER: [&str; 7] = [
    "RESOURCE NAME",
    "TYPE",
    "STATUS",
    "VALID CERT",
    "SERIAL NUMBER",
    "NOT AFTER",
    "NOT BEFORE",
];

/// The certificates of a data source given inline (the agent serves secrets inline), in order.
fn certificates(source: Option<&DataSource>) -> Vec<Vec<u8>> {
    let bytes = match source.and_then(|s| s.specifier.as_ref()) {
        Some(Specifier::InlineBytes(b)) => b.clone(),
        Some(Specifier::InlineString(s)) => s.clone().into_bytes(),
        _ => return Vec::new(),
    };
    Pem::iter_from_buffer(&bytes)
        .filter_map(Result::ok)
        .map(|pem| pem.contents)
        .collect()
}

/// One row: a certificate's validity now, serial and dates; `-` where it cannot be read.
fn row(name: &str, kind: &str, der: Option<&[u8]>, now: i64) -> Vec<String> {
    let parsed = der.and_then(|d| x509_parser::parse_x509_certificate(d).ok());
    let Some((_, cert)) = parsed else {
        return [name, kind, "ACTIVE", "false", "-", "-", "-"]
            .map(String::from)
            .to_vec();
    };
    let validity = cert.validity();
    let (not_before, not_after) = (validity.not_before, validity.not_after);
    let valid = not_before.timestamp() <= now && now <= not_after.timestamp();
    let date = |t: x509_parser::time::ASN1Time| {
        t.to_rfc2822().unwrap_or_else(|_| t.timestamp().to_string())
    };
    vec![
        name.to_string(),
        kind.to_string(),
        "ACTIVE".into(),
        valid.to_string(),
        format!("{:x}", cert.serial),
        date(not_after),
        date(not_before),
    ]
}

/// The table of `secrets`, sorted by name as istioctl sorts them.
pub fn render<'a>(secrets: impl Iterator<Item = &'a Secret>, now: i64) -> String {
    let mut rows = Vec::new();
    for s in secrets {
        match &s.r#type {
            Some(secret::Type::TlsCertificate(tls)) => {
                let chain = certificates(tls.certificate_chain.as_ref());
                rows.push(row(
                    &s.name,
                    "Cert Chain",
                    chain.first().map(Vec::as_slice),
                    now,
                ));
            }
            Some(secret::Type::ValidationContext(ctx)) => {
                let roots = certificates(ctx.trusted_ca.as_ref());
                if roots.is_empty() {
                    rows.push(row(&s.name, "CA", None, now));
                }
                for root in &roots {
                    rows.push(row(&s.name, "CA", Some(root), now));
                }
            }
            _ => rows.push(row(&s.name, "Other", None, now)),
        }
    }
    rows.sort_by(|a, b| a[0].cmp(&b[0]));
    table::render(&HEADER, &rows, table::WIDE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        CertificateValidationContext, TlsCertificate,
    };

    #[test]
    fn a_certificate_and_a_root_show_their_dates_and_serials() {
        let ca = pasa_testing::pki::FakeCa::new("root");
        let leaf = ca.issue(Some("spiffe://cluster.local/ns/shop/sa/web"), &[]);
        let inline = |pem: String| {
            Some(DataSource {
                specifier: Some(Specifier::InlineBytes(pem.into_bytes())),
                ..Default::default()
            })
        };
        let secrets = [
            Secret {
                name: "default".into(),
                r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
                    certificate_chain: inline(leaf.cert.clone()),
                    ..Default::default()
                })),
            },
            Secret {
                name: "ROOTCA".into(),
                r#type: Some(secret::Type::ValidationContext(
                    CertificateValidationContext {
                        trusted_ca: inline(ca.pem()),
                        ..Default::default()
                    },
                )),
            },
        ];
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let text = render(secrets.iter(), now);
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| {
                l.split("  ")
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .collect();
        assert_eq!(lines[0][0], "RESOURCE NAME", "{text}");
        assert_eq!(&lines[1][..4], ["ROOTCA", "CA", "ACTIVE", "true"], "{text}");
        assert_eq!(
            &lines[2][..4],
            ["default", "Cert Chain", "ACTIVE", "true"],
            "{text}"
        );
        assert!(lines[2][4].chars().all(|c| c.is_ascii_hexdigit()), "{text}");
        // Before they were valid (the fake CA's run from 1975): not valid.
        let then = render(secrets.iter(), 0);
        assert!(then.contains("ACTIVE     false"), "{then}");
    }
}
