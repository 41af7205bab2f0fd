//! `pasactl` against a real `pasa-pcp` (embedded sled store) on loopback: apply, errors that
//! name fields and write nothing, get in every format, watch, delete, status, and a restart
//! after SIGTERM that keeps everything; a stopped server, Ctrl-C during a large apply, and the
//! messages a user gets when pointed at the wrong port or data directory; and `x
//! create-remote-secret` against a fake remote API server that authorises as RBAC does.

use std::io::BufReader;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

mod common;

use common::{Pcp, WAIT, examples, line_channel};

/// Sends `signal` (`STOP`, `CONT`, `INT`, `KILL`) to process `pid`.
fn signal(pid: u32, signal: &str) {
    let sent = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -{signal} {pid}");
}

/// A process stopped with SIGSTOP; continued when dropped (also when the test fails), so that
/// it can stop cleanly.
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Stopped {
        signal(pid, "STOP");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// A pasactl running in the background, its output read line by line; killed when dropped.
struct Running {
    child: Child,
    stdout: Receiver<String>,
    stderr: Receiver<String>,
}

/// pasactl against `server` with `args`, its output piped.
fn spawn_piped(server: &str, args: &[&str]) -> Child {
    Command::new(common::pasactl())
        .arg("--server")
        .arg(server)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start pasactl")
}

impl Running {
    fn spawn(server: &str, args: &[&str]) -> Running {
        let mut child = spawn_piped(server, args);
        let stdout = line_channel(BufReader::new(child.stdout.take().expect("stdout")));
        let stderr = line_channel(BufReader::new(child.stderr.take().expect("stderr")));
        Running {
            child,
            stdout,
            stderr,
        }
    }

    /// The next line on stdout, which must come within `limit`.
    fn line(&self, limit: Duration) -> serde_json::Value {
        let line = self
            .stdout
            .recv_timeout(limit)
            .unwrap_or_else(|e| panic!("no line from pasactl within {limit:?}: {e}"));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    /// Waits for the end (each line within `limit`): the rest of stdout and stderr, and the
    /// exit code.
    fn finish(&mut self, limit: Duration) -> (Vec<String>, Vec<String>, Option<i32>) {
        let rest = |lines: &Receiver<String>| {
            let mut seen = Vec::new();
            loop {
                match lines.recv_timeout(limit) {
                    Ok(line) => seen.push(line),
                    Err(RecvTimeoutError::Disconnected) => return seen,
                    Err(RecvTimeoutError::Timeout) => {
                        panic!("pasactl did not end within {limit:?}; so far: {seen:?}")
                    }
                }
            }
        };
        let stderr = rest(&self.stderr);
        let stdout = rest(&self.stdout);
        let status = self.child.wait().expect("wait for pasactl");
        (stdout, stderr, status.code())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs pasactl to its end, which must come within `limit` (it is killed otherwise).
fn ctl_within(server: &str, args: &[&str], limit: Duration) -> Output {
    let child = spawn_piped(server, args);
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("pasactl output"),
        Err(_) => {
            signal(pid, "KILL");
            panic!("pasactl {args:?} did not end within {limit:?}");
        }
    }
}

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
            "serviceendpoints/shop/web created",
        ]
    );
    let again = pcp.ok(&["apply", "-f", shop]);
    assert!(again.lines().all(|l| l.ends_with(" unchanged")), "{again}");

    // `x wait` with no agent reporting says so rather than waiting; a missing object is named.
    let out = pcp.ctl(&["x", "wait", "vs", "cart", "-n", "shop"]);
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no agent reports to the server"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = pcp.ctl(&["x", "wait", "vs/nope", "-n", "shop"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"nope\" not found in namespace shop"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

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
        err.contains("broken.yaml document 1 (virtualservice/shop/Not_A_DNS_Name): metadata.name:"),
        "{err}"
    );
    assert!(
        err.contains("broken.yaml document 3 (destinationrule/shop/cart): apiVersion:"),
        "{err}"
    );
    assert!(
        err.contains(
            "broken.yaml document 4 (virtualservice/shop/split): spec.http[0].route[1].weight:"
        ),
        "{err}"
    );
    assert!(
        err.contains("broken.yaml document 5 (destinationrule/shop/cart-pool): spec.trafficPolicy.loadBalancer.simple:"),
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
    assert!(status.contains("REVISION   13"), "{status}");
    assert!(
        status
            .lines()
            .any(|l| l.split_whitespace().eq(["TOTAL", "8"])),
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
            assert_eq!(v["revision"], 14);
            break;
        }
        seen.push(format!("{} {}", v["type"].as_str().unwrap(), v["revision"]));
    }
    assert_eq!(seen, ["ADDED 3", "DELETED 13"]);
    let _ = replay.kill();
    let _ = replay.wait();

    // A graceful restart keeps everything.
    pcp.terminate();
    let pcp = Pcp::start(data.path());
    let status = pcp.ok(&["status"]);
    assert!(status.contains("REVISION   14"), "{status}");
    let services = examples().join("shop/services.yaml");
    let out = pcp.ok(&["delete", "-f", services.to_str().unwrap()]);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "serviceendpoints/shop/cart deleted",
            "serviceendpoints/shop/checkout deleted",
            "serviceendpoints/shop/web deleted"
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
        err.contains("document 1 (virtualservice/shop/bad): spec.http[0].route[0].weight:"),
        "{err}"
    );
    assert!(
        err.contains("document 3 (virtualservice/shop/twice)") && err.contains("more than once"),
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
        err.contains("export.yaml document 10501 (destinationrule/bulk/r10500): spec.trafficPolicy.loadBalancer.simple:")
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

/// A PCP that stops answering (SIGSTOP: its sockets stay open, nothing reads them) is named
/// within the request deadline, and a watch on it notices the silence; a watch ended by a PCP
/// restart says where to resume. Each says which command goes on without losing a change.
#[test]
fn a_stopped_or_restarting_server_is_named_and_a_watch_says_how_to_resume() {
    let data = tempfile::tempdir().unwrap();
    let pcp = Pcp::start_with(data.path(), &["--progress-interval-secs", "1"]);
    let shop = examples().join("shop");
    pcp.ok(&["apply", "-f", shop.to_str().unwrap()]);
    let watch_args = ["watch", "--namespace", "shop", "--liveness-timeout", "3s"];
    let synced = |watch: &Running| loop {
        let v = watch.line(WAIT);
        if v["type"] == "SYNCED" {
            return v["revision"].as_u64().expect("revision");
        }
    };
    let mut watch = Running::spawn(&pcp.addr, &watch_args);
    let revision = synced(&watch);

    let stopped = Stopped::new(pcp.pid);
    let out = ctl_within(
        &pcp.addr,
        &["--request-timeout", "2s", "status"],
        Duration::from_secs(15),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "the server at {} did not answer `status` within 2s",
            pcp.addr
        )) && err.contains("--request-timeout"),
        "{err}"
    );
    let (_, err, code) = watch.finish(WAIT);
    let err = err.join("\n");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "the server at {} sent nothing for 3s (not even a progress marker): the watch is lost",
            pcp.addr
        )),
        "{err}"
    );
    let resume = format!(
        "run: pasactl --server {} watch --namespace shop --from-revision {}",
        pcp.addr,
        revision + 1
    );
    assert!(err.contains(&resume), "{err}");
    drop(stopped);

    // Answering again; then a restart ends the next watch.
    assert!(
        pcp.ok(&["status"])
            .contains(&format!("REVISION   {revision}"))
    );
    let mut watch = Running::spawn(&pcp.addr, &watch_args);
    assert_eq!(synced(&watch), revision);
    pcp.terminate();
    let (out, err, code) = watch.finish(WAIT);
    let err = err.join("\n");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        out.last().is_some_and(|l| l.contains("SHUTDOWN")),
        "{out:?}"
    );
    assert!(err.contains(&resume), "{err}");
}

/// Ctrl-C in the middle of a large apply stops after the batch in flight and says what was
/// written and how to finish; running the same apply again finishes it. Deleting more than one
/// request carries is split the same way.
#[test]
fn ctrl_c_during_a_large_apply_says_what_was_written_and_the_same_apply_finishes_it() {
    const RULES: usize = 15_000;
    let data = tempfile::tempdir().unwrap();
    let pcp = Pcp::start(data.path());
    let file = data.path().join("export.yaml");
    let export: String = (0..RULES)
        .map(|i| {
            format!(
                "---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: r{i}, namespace: bulk}}\nspec: {{host: s{i}}}\n"
            )
        })
        .collect();
    std::fs::write(&file, export).unwrap();
    let file = file.to_str().unwrap();

    let mut apply = Running::spawn(&pcp.addr, &["apply", "-f", file]);
    // Results are printed as each batch commits: the first line says one has.
    let first = apply
        .stdout
        .recv_timeout(Duration::from_secs(300))
        .expect("the first batch's results");
    signal(apply.child.id(), "INT");
    let (rest, err, code) = apply.finish(Duration::from_secs(300));
    let err = err.join("\n");
    assert_eq!(code, Some(130), "{err}");
    let written = 1 + rest.len();
    assert!(
        written % 5_000 == 0 && written < RULES,
        "whole batches, not all: {written}"
    );
    assert_eq!(first, "destinationrule/bulk/r0 created");
    let last = written - 1;
    assert!(
        err.contains(&format!(
            "interrupted: {written} of {RULES} objects were written, the last destinationrule/bulk/r{last} ("
        )) && err.contains(&format!("export.yaml document {written})"))
            && err.contains("Run the same apply again to write the rest: applying is idempotent"),
        "{err}"
    );
    let listed = pcp.ok(&["get", "dr", "-n", "bulk"]);
    assert_eq!(
        listed.lines().count(),
        written + 1,
        "a header and each written"
    );

    let out = pcp.ok(&["apply", "-f", file]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), RULES);
    assert!(lines[..written].iter().all(|l| l.ends_with(" unchanged")));
    assert!(lines[written..].iter().all(|l| l.ends_with(" created")));

    // More than the store takes in one request (10,000): deleted in batches.
    let out = pcp.ok(&["delete", "-f", file]);
    assert_eq!(out.lines().count(), RULES);
    assert!(out.lines().all(|l| l.ends_with(" deleted")), "{out}");
    assert_eq!(pcp.ok(&["get", "dr", "-n", "bulk"]).trim(), "");
}

/// pasactl pointed at PCP's admin port says so and where the API is; a second PCP on a data
/// directory in use names the one holding it; logs read by a program carry no colour codes.
#[test]
fn the_wrong_port_or_a_data_dir_in_use_is_explained() {
    let data = tempfile::tempdir().unwrap();
    let pcp = Pcp::start(data.path());
    let admin = pcp.admin.to_string();
    let out = ctl_within(&admin, &["status"], WAIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "the server at {admin} answered, but not with the PASA API"
        )) && err.contains("admin endpoint")
            && err.contains("7400"),
        "{err}"
    );
    drop(pcp);

    // A PCP whose logs go to a pipe (a file, a log collector): plain text.
    let mut first = common::pcp_command()
        .arg("--data-dir")
        .arg(data.path())
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start pasa-pcp");
    let pid = first.id();
    let logs = line_channel(BufReader::new(first.stderr.take().expect("stderr")));
    let first = pasa_testing::Process::new("pasa-pcp", first);
    let serving = loop {
        let line = logs
            .recv_timeout(WAIT)
            .expect("pasa-pcp logs that it serves");
        if line.contains("serving") {
            break line;
        }
    };
    assert!(
        !serving.contains('\x1b'),
        "colour codes in a pipe: {serving:?}"
    );

    let second = common::pcp_command()
        .arg("--data-dir")
        .arg(data.path())
        .output()
        .expect("run a second pasa-pcp");
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success());
    assert!(
        err.contains(&format!(
            "another process holds {} (its lock, held by pasa-pcp (pid {pid})); stop it or use another --data-dir",
            data.path().display()
        )),
        "{err}"
    );
    assert!(!err.contains("WouldBlock"), "{err}");
    first.terminate();
}

/// `pasa-agent --help` (and its subcommands') reads as help for an operator: no Rust paths or
/// doc links, which clap would show as written.
#[test]
fn agent_help_has_no_rust_names() {
    use clap::CommandFactory;
    let mut command = pasa_agent::run::AgentArgs::command();
    command.build();
    let mut commands = vec![command];
    while let Some(mut c) = commands.pop() {
        let help = c.render_long_help().to_string();
        for bad in ["[`", "::", "Args`", "crate"] {
            assert!(
                !help.contains(bad),
                "help of {} shows {bad:?}:\n{help}",
                c.get_name()
            );
        }
        commands.extend(c.get_subcommands().cloned());
    }
}

/// What fingers used to other mesh CLIs type works, or is refused with what to type
/// instead: `-n` against the documents' namespace, several kinds, `-o name|yaml|json`, `watch
/// -n`, `status -o json`.
#[test]
fn common_habits_work_or_name_the_alternative() {
    let data = tempfile::tempdir().unwrap();
    let pcp = Pcp::start(data.path());
    let shop = examples().join("shop");
    let shop = shop.to_str().unwrap();

    // The documents name shop: -n other is refused, and nothing is written.
    let out = pcp.ctl(&["apply", "-n", "other", "-f", shop]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("document 1: metadata.namespace is \"shop\", but -n is \"other\"")
            && err.contains("drop -n"),
        "{err}"
    );
    assert_eq!(pcp.ok(&["get", "vs,dr,gw,se", "-A", "-o", "name"]), "");
    let out = pcp.ctl(&["delete", "-n", "other", "-f", shop]);
    assert_eq!(out.status.code(), Some(2));
    pcp.ok(&["apply", "-n", "shop", "-f", shop, "--dry-run=server"]);
    assert_eq!(pcp.ok(&["get", "vs", "-A", "-o", "name"]), "");
    pcp.ok(&["apply", "-n", "shop", "-f", shop]);

    // Several kinds at once, a table for each.
    let table = pcp.ok(&["get", "vs,dr", "-n", "shop"]);
    assert!(
        table.contains("destinationrule/cart")
            && table.contains("virtualservice/storefront")
            && table.matches("NAME").count() == 2,
        "{table}"
    );
    let mut names: Vec<String> = pcp
        .ok(&["get", "vs,dr", "-n", "shop", "-o", "name"])
        .lines()
        .map(String::from)
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "destinationrule.networking.istio.io/cart",
            "virtualservice.networking.istio.io/cart",
            "virtualservice.networking.istio.io/storefront",
        ]
    );
    assert!(
        pcp.ok(&["get", "vs/cart", "-n", "shop"])
            .contains("cart.shop.svc.cluster.local")
    );

    // Lists written as they are read still parse whole.
    let yaml: serde_json::Value =
        serde_saphyr::from_str(&pcp.ok(&["get", "vs,dr", "-A", "-o", "yaml"])).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&pcp.ok(&["get", "vs,dr", "-A", "-o", "json"])).unwrap();
    for list in [&yaml, &json] {
        assert_eq!(list["kind"], "List");
        let items = list["items"].as_array().unwrap();
        assert_eq!(items.len(), 3, "{list}");
        assert!(items.iter().all(|i| i["metadata"]["namespace"] == "shop"));
    }
    let cart = yaml["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["kind"] == "DestinationRule")
        .unwrap();
    assert_eq!(cart["spec"]["subsets"][1]["name"], "v2");
    let none: serde_json::Value =
        serde_json::from_str(&pcp.ok(&["get", "vs", "-n", "nowhere", "-o", "json"])).unwrap();
    assert_eq!(none["items"], serde_json::json!([]));

    let status: serde_json::Value =
        serde_json::from_str(&pcp.ok(&["status", "-o", "json"])).unwrap();
    assert_eq!(status["total"], 9, "{status}");
    let status: serde_json::Value =
        serde_saphyr::from_str(&pcp.ok(&["status", "-o", "yaml"])).unwrap();
    assert_eq!(status["total"], 9, "{status}");

    // watch -n: the namespace's snapshot, then SYNCED.
    let watch = Running::spawn(&pcp.addr, &["watch", "-n", "shop", "--kind", "vs,dr"]);
    let mut seen = Vec::new();
    loop {
        let line = watch.line(WAIT);
        if line["type"] == "SYNCED" {
            break;
        }
        assert_eq!(line["namespace"], "shop", "{line}");
        seen.push(line["name"].as_str().unwrap().to_string());
        assert!(seen.len() <= 3, "{seen:?}");
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    drop(watch);

    // What get cannot do names what does it.
    let out = pcp.ctl(&["get", "vs", "-n", "shop", "-w"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("pasactl watch --kind vs -n shop"));
    // Labels: -l selects as kubectl's does (the listed objects filtered), --show-labels shows
    // them, and delete takes -l and --all.
    assert_eq!(
        pcp.ok(&["get", "sep", "-A", "-l", "app in (cart,web)", "-o", "name"]),
        "serviceendpoints.pasa.io/cart\nserviceendpoints.pasa.io/web\n"
    );
    let labelled = pcp.ok(&[
        "get",
        "sep",
        "-n",
        "shop",
        "-l",
        "app=cart",
        "--show-labels",
    ]);
    assert_eq!(labelled.lines().count(), 2, "{labelled}");
    assert!(
        labelled.lines().next().unwrap().ends_with("LABELS")
            && labelled.lines().nth(1).unwrap().ends_with("app=cart"),
        "{labelled}"
    );
    let out = pcp.ctl(&["get", "vs", "cart", "-l", "app=cart"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        pcp.ok(&["delete", "sep", "-n", "shop", "-l", "app notin (cart,web)"]),
        "serviceendpoints/shop/checkout deleted\n"
    );
    let out = pcp.ctl(&["delete", "sep", "--all", "-n", "nowhere"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("No resources found"));
    let out = pcp.ctl(&["delete", "sep", "cart", "-A"]);
    assert_eq!(out.status.code(), Some(2));
    // Verbs and flags of kubectl and istioctl that pasactl has not: answered with what does it.
    for (args, said) in [
        (
            &["describe", "vs", "cart", "-n", "shop"][..],
            "pasactl get vs cart -n shop -o yaml",
        ),
        (&["get", "vs", "-o", "jsonpath={.items}"][..], "jq"),
        (
            &["apply", "-k", "overlays/prod"][..],
            "kubectl kustomize overlays/prod | pasactl apply -f -",
        ),
        (&["wait", "vs", "cart"][..], "pasactl x wait vs cart"),
        (
            &["pc", "bootstrap", "web-1.shop"][..],
            "pasa-agent bootstrap",
        ),
        (
            &["apply", "-o", "yaml", "-f", "x.yaml"][..],
            "pasactl get KIND NAME -o yaml",
        ),
    ] {
        let out = pcp.ctl(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let said_here = String::from_utf8_lossy(&out.stderr);
        assert!(said_here.contains(said), "{args:?}: {said_here}");
    }
    let shop = examples().join("shop");
    let named = pcp.ok(&["apply", "-f", shop.to_str().unwrap(), "-o", "name"]);
    assert!(
        named.lines().next() == Some("destinationrule.networking.istio.io/cart"),
        "{named}"
    );
    let version = pcp.ok(&["version"]);
    assert_eq!(
        version,
        format!(
            "client version: {v}\ncontrol plane version: {v} ({})\ndata plane version: none (no agent reports to this server)\n",
            pcp.addr,
            v = env!("CARGO_PKG_VERSION")
        )
    );
    assert_eq!(
        pcp.ok(&["get", "vs", "-n", "shop", "--no-headers", "-o", "wide"])
            .lines()
            .next()
            .map(|l| l.split_whitespace().next()),
        Some(Some("cart"))
    );
    let out = pcp.ctl(&["get", "sep", "-l", "app in cart"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs its values in parentheses"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = pcp.ctl(&["delete", "vs/cart", "-n", "shop", "--dry-run"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("pasactl get KIND NAME -n shop"));
    assert_eq!(
        pcp.ok(&["delete", "vs/cart", "dr/cart", "-n", "shop"]),
        "virtualservice/shop/cart deleted\ndestinationrule/shop/cart deleted\n"
    );
    pcp.terminate();
}

/// `pasactl x create-remote-secret` against a remote cluster's (fake) API server, which
/// authorises requests with deploy/remote's RBAC and an operator's: the Secret it writes holds a
/// kubeconfig with which the reader may read what PCP's syncer reads, and nothing more; every
/// failure names the flag or the object at fault, with a non-zero exit code.
#[tokio::test(flavor = "multi_thread")]
async fn create_remote_secret_writes_the_remote_readers_kubeconfig() {
    use base64::Engine;
    use pasa_kube::fake_apiserver::FakeApiServer;
    use serde_json::{Value, json};

    let api = FakeApiServer::start().await;
    api.put_namespace("kube-system", &[]);
    api.put_namespace("istio-system", &[]);
    let remote = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/remote");
    let manifest = |file: &str| -> Value {
        serde_saphyr::from_str(&std::fs::read_to_string(remote.join(file)).unwrap()).unwrap()
    };
    let reader_rbac = ["clusterrole.yaml", "clusterrolebinding.yaml"].map(manifest);
    // The operator running pasactl may read namespaces and the Secrets of istio-system.
    let operator = [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "operator"},
               "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "operator"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": "operator"},
               "subjects": [{"kind": "ServiceAccount", "name": "admin", "namespace": "ops"}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "secrets", "namespace": "istio-system"},
               "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "secrets", "namespace": "istio-system"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                           "name": "secrets"},
               "subjects": [{"kind": "ServiceAccount", "name": "admin", "namespace": "ops"}]}),
    ];
    api.enforce_rbac(&operator);
    api.enforce_rbac(&reader_rbac);

    let dir = tempfile::tempdir().unwrap();
    let server = format!("http://{}", api.addr);
    // A kubeconfig whose current context reaches the API server as `ops/<account>`.
    let kubeconfig = |account: &str| {
        let path = dir.path().join(format!("{account}.kubeconfig"));
        let text = json!({"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "remote", "cluster": {"server": server}}],
            "users": [{"name": account,
                       "user": {"token": FakeApiServer::token_for("ops", account)}}],
            "contexts": [{"name": "remote", "context": {"cluster": "remote", "user": account}}],
            "current-context": "remote"});
        std::fs::write(&path, text.to_string()).unwrap();
        path.to_str().unwrap().to_string()
    };
    let admin = kubeconfig("admin");
    let run = |args: Vec<&str>| {
        let mut command = tokio::process::Command::new(common::pasactl());
        command.args(["x", "create-remote-secret"]).args(args);
        async move {
            let out = command.output().await.expect("run pasactl");
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            (out.status.code(), text(&out.stdout), text(&out.stderr))
        }
    };

    // No token yet: pasactl creates the reader, which this operator may not.
    let (code, out, err) = run(vec!["--kubeconfig", &admin, "--name", "east"]).await;
    assert_eq!((code, out.as_str()), (Some(1), ""), "{err}");
    assert!(
        err.contains("cannot create ServiceAccount istio-system/istio-reader-service-account")
            && err.contains("--create-service-account")
            && err.contains("forbidden"),
        "{err}"
    );
    let (code, _, err) = run(vec![
        "--kubeconfig",
        &admin,
        "--name",
        "east",
        "--create-service-account=false",
    ])
    .await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("ServiceAccount istio-system/istio-reader-service-account (--service-account) has no token Secret")
            && err.contains("deploy/remote"),
        "{err}"
    );

    // The token Secret of deploy/remote, as Kubernetes' token controller fills it in.
    let ca = rcgen::generate_simple_self_signed(vec!["kubernetes".into()])
        .unwrap()
        .cert
        .pem();
    let base64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let token = FakeApiServer::token_for("istio-system", "istio-reader-service-account");
    let mut secret = manifest("token-secret.yaml");
    secret["data"] = json!({"token": base64(token.as_bytes()), "ca.crt": base64(ca.as_bytes())});
    api.put(secret);
    // Other Secrets of the namespace are passed over.
    api.put(
        json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "aaa", "namespace": "istio-system"}, "data": {"token": "eA=="}}),
    );

    let (code, out, err) = run(vec!["--kubeconfig", &admin, "--name", "east"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("--server"),
        "a loopback server is warned of: {err}"
    );
    let secret_of = |out: &str| -> Value {
        let docs: Vec<Value> =
            serde_saphyr::from_str_multiple(out).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_eq!(docs.len(), 1, "one Secret: {out}");
        docs.into_iter().next().unwrap()
    };
    let written = secret_of(&out);
    assert_eq!(written["kind"], "Secret");
    assert_eq!(
        written["metadata"],
        json!({"name": "istio-remote-secret-east", "namespace": "istio-system",
               "labels": {"istio/multiCluster": "true"},
               "annotations": {"networking.istio.io/cluster": "east"}})
    );
    let config = written["stringData"]["east"]
        .as_str()
        .expect("the kubeconfig");
    let config = kube::config::Kubeconfig::from_yaml(config).expect("a kubeconfig");
    assert_eq!(config.current_context.as_deref(), Some("east"));
    let cluster = config.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(cluster.server.as_deref(), Some(server.as_str()));
    assert_eq!(
        cluster.certificate_authority_data.as_deref(),
        Some(base64(ca.as_bytes()).as_str())
    );

    // The kubeconfig reaches the remote cluster as its reader: what the syncer reads, no more.
    let reader = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(config, &Default::default())
            .await
            .unwrap(),
    )
    .unwrap();
    let listed = |path: &'static str| {
        let reader = reader.clone();
        async move {
            let request = http::Request::get(path).body(Vec::new()).unwrap();
            match reader.request_text(request).await {
                Ok(_) => 200,
                Err(kube::Error::Api(status)) => status.code,
                Err(e) => panic!("{path}: {e}"),
            }
        }
    };
    for path in [
        "/api/v1/pods",
        "/api/v1/services",
        "/api/v1/nodes",
        "/api/v1/namespaces",
        "/apis/discovery.k8s.io/v1/endpointslices",
    ] {
        assert_eq!(listed(path).await, 200, "{path}");
    }
    assert_eq!(listed("/api/v1/secrets").await, 403);

    // Unnamed, the cluster is named by its kube-system namespace's UID; --server wins over the
    // kubeconfig's (and is not warned of).
    let uid = api.get("v1", "Namespace", "", "kube-system").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, out, err) = run(vec![
        "--kubeconfig",
        &admin,
        "--context",
        "remote",
        "--server",
        "https://east.example:6443",
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(err.is_empty(), "{err}");
    let written = secret_of(&out);
    assert_eq!(
        written["metadata"]["name"],
        format!("istio-remote-secret-{uid}")
    );
    let config = written["stringData"][uid.as_str()].as_str().unwrap();
    assert!(config.contains("https://east.example:6443"), "{config}");

    // Failures name what is at fault.
    let (code, _, err) = run(vec!["--kubeconfig", &admin, "--context", "west"]).await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("--context west") && err.contains("remote"),
        "{err}"
    );
    let (code, _, err) = run(vec!["--kubeconfig", &admin, "--name", "East_1"]).await;
    assert_eq!(code, Some(2));
    assert!(err.contains("--name \"East_1\""), "{err}");
    let missing = dir.path().join("missing").display().to_string();
    let (code, _, err) = run(vec!["--kubeconfig", &missing, "--name", "east"]).await;
    assert_eq!(code, Some(1));
    assert!(err.contains(&format!("--kubeconfig {missing}")), "{err}");
    let nobody = kubeconfig("nobody");
    let (code, _, err) = run(vec!["--kubeconfig", &nobody, "--name", "east"]).await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("cannot list the Secrets of namespace istio-system")
            && err.contains("forbidden"),
        "{err}"
    );
    let (code, _, err) = run(vec!["--kubeconfig", &nobody]).await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("kube-system") && err.contains("pass --name"),
        "{err}"
    );
    let (code, _, err) = run(vec![
        "--kubeconfig",
        &admin,
        "--name",
        "east",
        "--secret-name",
        "aaa",
    ])
    .await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("Secret istio-system/aaa (--secret-name) is no token of ServiceAccount"),
        "{err}"
    );
    // A token Secret Kubernetes has not filled in (its ServiceAccount missing) is waited for.
    api.put(json!({"apiVersion": "v1", "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {"name": "unfilled", "namespace": "istio-system",
            "annotations": {"kubernetes.io/service-account.name": "istio-reader-service-account"}}}));
    let (code, _, err) = run(vec![
        "--kubeconfig",
        &admin,
        "--name",
        "east",
        "--secret-name",
        "unfilled",
    ])
    .await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("Secret istio-system/unfilled has no \"ca.crt\""),
        "{err}"
    );
}
