//! `pasactl` against a real `pasa-pcp` (embedded sled store) on loopback: apply, errors that
//! name fields and write nothing, get in every format, watch, delete, status, and a restart
//! after SIGTERM that keeps everything.

use std::io::BufReader;
use std::process::{Command, Stdio};

mod common;

use common::{Pcp, WAIT, examples, line_channel};

#[test]
fn pasactl_end_to_end() {
    let data = tempfile::tempdir().unwrap();
    let pcp = Pcp::start(data.path());
    let shop = examples().join("shop");
    let shop = shop.to_str().unwrap();

    let out = pcp.ok(&["apply", "-f", shop]);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "destinationrule/shop/cart created",
            "virtualservice/shop/cart created",
            "gateway/shop/shop-gateway created",
            "virtualservice/shop/storefront created",
            "serviceentry/shop/payments-api created",
            "sidecar/shop/default created",
            "serviceendpoints/shop/cart created",
            "serviceendpoints/shop/checkout created",
        ]
    );
    let again = pcp.ok(&["apply", "-f", shop]);
    assert!(again.lines().all(|l| l.ends_with(" unchanged")), "{again}");

    // Cross-resource warnings against what is stored: the stored DestinationRule defines v1 and
    // v2 of cart, not v9; the write goes through and the warning names the field.
    let dir = tempfile::tempdir().unwrap();
    let canary = dir.path().join("canary.yaml");
    std::fs::write(
        &canary,
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: canary, namespace: shop}\n\
         spec:\n  hosts: [cart]\n  http:\n  - route:\n    - destination: {host: cart, subset: v2}\n\
         \x20     weight: 90\n    - destination: {host: cart, subset: v9}\n      weight: 10\n",
    )
    .unwrap();
    let out = pcp.ctl(&["apply", "-f", canary.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "virtualservice/shop/canary created\n"
    );
    let warn = String::from_utf8_lossy(&out.stderr);
    assert!(
        warn.contains("Warning: ")
            && warn.contains("spec.http[0].route[1].destination.subset")
            && warn.contains("cart.shop.svc.cluster.local+v9")
            && !warn.contains("+v2"),
        "{warn}"
    );
    pcp.ok(&["delete", "vs", "canary", "-n", "shop"]);

    // Bad documents: every problem named with file, document and field; nothing written.
    let broken = examples().join("broken.yaml");
    let out = pcp.ctl(&["apply", "-f", broken.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("broken.yaml document 0 (virtualservice/shop/Not_A_DNS_Name): metadata.name:"),
        "{err}"
    );
    assert!(
        err.contains("broken.yaml document 2 (destinationrule/shop/cart): apiVersion:"),
        "{err}"
    );
    assert!(
        err.contains(
            "broken.yaml document 3 (virtualservice/shop/split): spec.http[0].route[1].weight:"
        ),
        "{err}"
    );
    assert!(
        err.contains("broken.yaml document 4 (destinationrule/shop/cart-pool): spec.trafficPolicy.loadBalancer.simple:"),
        "{err}"
    );
    assert!(err.contains("nothing was written"), "{err}");
    let missing = pcp.ctl(&["get", "vs", "fine", "-n", "shop"]);
    assert_eq!(
        missing.status.code(),
        Some(1),
        "the good document of a bad batch is not written"
    );
    assert!(String::from_utf8_lossy(&missing.stderr).contains("not found"));

    // A reader that goes away (`| head`) ends pasactl quietly, not with a panic.
    let mut piped = Command::new(common::pasactl())
        .args(["--server", &pcp.addr, "get", "vs", "-A", "-o", "yaml"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(piped.stdout.take());
    let closed = piped.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&closed.stderr);
    assert!(closed.status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");

    // get: table, wide, all namespaces, yaml and json.
    let table = pcp.ok(&["get", "vs", "-n", "shop"]);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("cart.shop.svc.cluster.local"), "{table}");
    assert!(
        pcp.ok(&["get", "virtualservices", "-A", "-o", "wide"])
            .contains("shop/shop-gateway")
    );
    let yaml = pcp.ok(&["get", "dr", "cart", "-n", "shop", "-o", "yaml"]);
    let doc: serde_json::Value = serde_saphyr::from_str(&yaml).expect("yaml output parses");
    assert_eq!(doc["kind"], "DestinationRule");
    assert_eq!(doc["spec"]["subsets"][1]["name"], "v2");
    let json: serde_json::Value =
        serde_json::from_str(&pcp.ok(&["get", "se", "-n", "shop", "-o", "json"])).unwrap();
    assert_eq!(json["kind"], "List");
    assert_eq!(
        json["items"][0]["spec"]["hosts"][0],
        "*.payments.example.net"
    );

    // watch by host: snapshot, SYNCED, then the change.
    let mut watch = Command::new(common::pasactl())
        .args([
            "--server",
            &pcp.addr,
            "watch",
            "--host",
            "cart.shop.svc.cluster.local",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("pasactl watch");
    let lines = line_channel(BufReader::new(watch.stdout.take().unwrap()));
    let mut snapshot = Vec::new();
    loop {
        let line = lines.recv_timeout(WAIT).expect("watch line");
        let v: serde_json::Value = serde_json::from_str(&line).expect("one JSON object per line");
        if v["type"] == "SYNCED" {
            break;
        }
        snapshot.push(format!(
            "{} {}/{}",
            v["type"].as_str().unwrap(),
            v["kind"].as_str().unwrap(),
            v["name"].as_str().unwrap()
        ));
    }
    snapshot.sort();
    assert_eq!(
        snapshot,
        [
            "ADDED DestinationRule/cart",
            "ADDED ServiceEndpoints/cart",
            "ADDED VirtualService/cart"
        ]
    );
    let v2 = examples().join("shop-v2-only.yaml");
    assert_eq!(
        pcp.ok(&["apply", "-f", v2.to_str().unwrap()]).trim(),
        "virtualservice/shop/cart configured"
    );
    let line = lines.recv_timeout(WAIT).expect("event after the change");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["type"], "MODIFIED");
    assert_eq!(v["name"], "cart");
    let _ = watch.kill();
    let _ = watch.wait();

    // delete by name, then a missing one, then by file.
    assert_eq!(
        pcp.ok(&["delete", "gw", "shop-gateway", "-n", "shop"])
            .trim(),
        "gateway/shop/shop-gateway deleted"
    );
    let gone = pcp.ctl(&["delete", "gw", "shop-gateway", "-n", "shop"]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&gone.stderr).contains("not found"));
    let status = pcp.ok(&["status"]);
    assert!(status.contains("REVISION   12"), "{status}");
    assert!(
        status
            .lines()
            .any(|l| l.split_whitespace().eq(["TOTAL", "7"])),
        "{status}"
    );

    // apply from standard input, with -n for documents that name no namespace.
    let mut child = Command::new(common::pasactl())
        .args(["--server", &pcp.addr, "apply", "-n", "edge", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(
            b"apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata:\n  name: default\nspec:\n  egress:\n  - hosts: [\"./*\", \"istio-system/*\"]\n",
        )
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "sidecar/edge/default created"
    );

    // Replay the change log from a revision: every change since, then SYNCED.
    let mut replay = Command::new(common::pasactl())
        .args([
            "--server",
            &pcp.addr,
            "watch",
            "--namespace",
            "shop",
            "--kind",
            "gw",
            "--from-revision",
            "1",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = line_channel(BufReader::new(replay.stdout.take().unwrap()));
    let mut seen = Vec::new();
    loop {
        let v: serde_json::Value =
            serde_json::from_str(&lines.recv_timeout(WAIT).expect("replay line")).unwrap();
        if v["type"] == "SYNCED" {
            assert_eq!(v["revision"], 13);
            break;
        }
        seen.push(format!("{} {}", v["type"].as_str().unwrap(), v["revision"]));
    }
    assert_eq!(seen, ["ADDED 3", "DELETED 12"]);
    let _ = replay.kill();
    let _ = replay.wait();

    // A graceful restart keeps everything.
    pcp.terminate();
    let pcp = Pcp::start(data.path());
    let status = pcp.ok(&["status"]);
    assert!(status.contains("REVISION   13"), "{status}");
    let services = examples().join("shop/services.yaml");
    let out = pcp.ok(&["delete", "-f", services.to_str().unwrap()]);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "serviceendpoints/shop/cart deleted",
            "serviceendpoints/shop/checkout deleted"
        ]
    );
}

#[test]
fn one_answer_names_every_bad_document() {
    let data = tempfile::tempdir().unwrap();
    let pcp = Pcp::start(data.path());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("batch.yaml");
    let vs = |name: &str, weight: i32| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: shop}}\n\
             spec: {{hosts: [cart], http: [{{route: [{{destination: {{host: cart}}, weight: {weight}}}]}}]}}\n"
        )
    };
    let text = [vs("bad", -1), vs("twice", 1), vs("twice", 1)].join("---\n");
    std::fs::write(&file, text).unwrap();
    let out = pcp.ctl(&["apply", "-f", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("document 0 (virtualservice/shop/bad): spec.http[0].route[0].weight:"),
        "{err}"
    );
    assert!(
        err.contains("document 2 (virtualservice/shop/twice)") && err.contains("more than once"),
        "{err}"
    );
    assert!(err.contains("nothing was written"), "{err}");
}

/// A mesh export of more objects than one request carries: checked whole first (one bad
/// document anywhere writes nothing, and is named by its place in the file), then applied in
/// batches.
#[test]
fn a_large_export_applies_in_batches_and_a_bad_document_anywhere_writes_nothing() {
    const RULES: usize = 11_000;
    let data = tempfile::tempdir().unwrap();
    let pcp = Pcp::start(data.path());
    let rule = |i: usize, simple: &str| {
        format!(
            "---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: r{i}, namespace: bulk}}\nspec:\n  host: s{i}\n  trafficPolicy: {{loadBalancer: {{simple: {simple}}}}}\n"
        )
    };
    let export = |bad: Option<usize>| {
        (0..RULES)
            .map(|i| {
                rule(
                    i,
                    if Some(i) == bad {
                        "FASTEST"
                    } else {
                        "ROUND_ROBIN"
                    },
                )
            })
            .collect::<String>()
    };
    let file = data.path().join("export.yaml");
    std::fs::write(&file, export(Some(10_500))).unwrap();
    let out = pcp.ctl(&["apply", "-f", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("export.yaml document 10500 (destinationrule/bulk/r10500): spec.trafficPolicy.loadBalancer.simple:")
            && err.contains("nothing was written"),
        "{err}"
    );
    assert_eq!(
        pcp.ok(&["get", "dr", "-n", "bulk"]).trim(),
        "",
        "nothing written"
    );

    std::fs::write(&file, export(None)).unwrap();
    let out = pcp.ok(&["apply", "-f", file.to_str().unwrap()]);
    assert_eq!(out.lines().count(), RULES, "one line per object");
    assert!(out.lines().all(|l| l.ends_with(" created")));
    let listed = pcp.ok(&["get", "dr", "-n", "bulk"]);
    assert_eq!(listed.lines().count(), RULES + 1, "a header and every rule");
}
