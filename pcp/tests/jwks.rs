//! PCP fetches the keys of RequestAuthentication rules that do not write them (`jwksUri`, or the
//! issuer's discovery document), once for the mesh, and keeps them in the store for the agents;
//! a key set no rule needs any more is deleted. The issuer here is a small HTTP server of the
//! test's own, on loopback.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

use common::{Pcp, WAIT};

const KEYS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","kid":"k1","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#;

/// Serves `/keys` and the discovery document on a free loopback port, until the test ends.
fn issuer() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let discovery = format!(r#"{{"issuer":"{base}","jwks_uri":"{base}/keys"}}"#);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = String::new();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            // The rest of the request head.
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let (status, body) = if request.starts_with("GET /keys ") {
                ("200 OK", KEYS.to_string())
            } else if request.starts_with("GET /.well-known/openid-configuration ") {
                ("200 OK", discovery.clone())
            } else {
                ("404 Not Found", String::new())
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    base
}

fn key_sets(pcp: &Pcp) -> String {
    let out = pcp.ctl(&["get", "jwks", "-n", "istio-system", "-o", "yaml"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn until(pcp: &Pcp, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let listed = key_sets(pcp);
        if ok(&listed) {
            return listed;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never {what}: {listed}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn pcp_fetches_jwt_keys_once_for_the_mesh() {
    let base = issuer();
    let dir = tempfile::tempdir().unwrap();
    let pcp = Pcp::start(&dir.path().join("data"));
    let policies = dir.path().join("ra.yaml");
    std::fs::write(
        &policies,
        format!(
            "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata:\n  name: by-uri\n  namespace: shop\nspec:\n  jwtRules:\n  - issuer: uri-issuer\n    jwksUri: {base}/keys\n---\napiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata:\n  name: by-discovery\n  namespace: shop\nspec:\n  jwtRules:\n  - issuer: {base}\n"
        ),
    )
    .unwrap();
    pcp.ok(&["apply", "-f", policies.to_str().unwrap()]);
    let listed = until(&pcp, "both key sets stored", |l| {
        l.matches("kind: JsonWebKeySet").count() == 2
    });
    assert!(
        listed.contains(&format!("jwksUri: {base}/keys")),
        "{listed}"
    );
    assert!(listed.contains(&format!("issuer: {base}")), "{listed}");
    assert!(
        listed.contains("f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU"),
        "{listed}"
    );

    pcp.ok(&["delete", "ra", "by-uri", "-n", "shop"]);
    let listed = until(&pcp, "the unneeded key set deleted", |l| {
        l.matches("kind: JsonWebKeySet").count() == 1
    });
    assert!(!listed.contains("jwksUri:"), "{listed}");
    pcp.terminate();
}
