//! `pasactl x simulate`: sends one call to a pasa-agent's `POST /simulate` (plain HTTP/1.1 on
//! its admin address) and prints the outcome, one line per object the call went through.

use std::net::IpAddr;

use hyper::StatusCode;
use serde_json::{Map, Value, json};

use crate::cli::agent::{self, DEFAULT_ADMIN, post, resolve_agent};
use crate::cli::{CmdResult, Reported, Server, UsageError, out};

/// The resources to simulate on: those served to Envoy or to proxyless gRPC clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Generator {
    Envoy,
    Grpc,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// HTTP/1.1.
    Http,
    Http2,
    /// Opaque bytes.
    Tcp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsMode {
    Plaintext,
    /// TLS originated by the application.
    Tls,
    /// Istio mutual TLS, as a sidecar originates it.
    Mtls,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Captured on its way out of the workload.
    Outbound,
    /// Captured on its way in (lands on virtualInbound).
    Inbound,
    /// Sent to the proxy's own address, as to a gateway.
    Gateway,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// One line per object the call went through.
    Short,
    /// The agent's answer as it is.
    Json,
}

#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    /// The agent: its admin address (its --admin), host:port or http://host:port, or its
    /// proxy as `proxy-status` lists it (`web-1.shop`).
    #[arg(long, env = "PASA_AGENT_ADMIN", default_value = DEFAULT_ADMIN)]
    pub agent: String,
    /// Simulate on the resources served to Envoy or to proxyless gRPC clients.
    #[arg(long, value_enum, default_value = "envoy")]
    pub generator: Generator,
    /// Destination IP; by default 1.3.3.7, an address no listener binds, so the port decides.
    #[arg(long)]
    pub address: Option<IpAddr>,
    /// Destination port.
    #[arg(long)]
    pub port: u16,
    /// Host header (:authority).
    #[arg(long)]
    pub host: Option<String>,
    /// Request path (default /).
    #[arg(long)]
    pub path: Option<String>,
    #[arg(long, value_enum, default_value = "http")]
    pub protocol: Protocol,
    #[arg(long, value_enum, default_value = "plaintext")]
    pub tls: TlsMode,
    /// TLS server name (default for --tls tls: the host).
    #[arg(long)]
    pub sni: Option<String>,
    /// ALPN offered in the TLS handshake (default from --protocol and --tls).
    #[arg(long)]
    pub alpn: Option<String>,
    /// Extra request header, name=value; repeatable.
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    /// How the call reaches the proxy (default: outbound).
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    #[arg(short = 'o', long, value_enum, default_value = "short")]
    pub output: Output,
}

fn parse_header(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => {
            Ok((name.trim().to_string(), value.to_string()))
        }
        _ => Err(format!("{text:?}: write a header as name=value")),
    }
}

/// The call as the agent reads it: only the fields given.
pub fn call_json(args: &SimulateArgs) -> Value {
    let mut call = Map::new();
    call.insert("port".into(), args.port.into());
    let protocol = match args.protocol {
        Protocol::Http => "http",
        Protocol::Http2 => "http2",
        Protocol::Tcp => "tcp",
    };
    call.insert("protocol".into(), protocol.into());
    let tls = match args.tls {
        TlsMode::Plaintext => "plaintext",
        TlsMode::Tls => "tls",
        TlsMode::Mtls => "mtls",
    };
    call.insert("tls".into(), tls.into());
    if let Some(address) = args.address {
        call.insert("address".into(), address.to_string().into());
    }
    for (field, value) in [
        ("host", &args.host),
        ("path", &args.path),
        ("sni", &args.sni),
        ("alpn", &args.alpn),
    ] {
        if let Some(value) = value {
            call.insert(field.into(), value.clone().into());
        }
    }
    if let Some(mode) = args.mode {
        let mode = match mode {
            Mode::Outbound => "outbound",
            Mode::Inbound => "inbound",
            Mode::Gateway => "gateway",
        };
        call.insert("mode".into(), mode.into());
    }
    if !args.headers.is_empty() {
        let mut headers: Map<String, Value> = Map::new();
        for (name, value) in &args.headers {
            let values = headers.entry(name.clone()).or_insert_with(|| json!([]));
            if let Value::Array(list) = values {
                list.push(value.clone().into());
            }
        }
        call.insert("headers".into(), Value::Object(headers));
    }
    Value::Object(call)
}

/// The outcome in short form: one line per step reached, then `error: KIND` if it stopped.
pub fn short(outcome: &Value) -> String {
    let mut text = String::new();
    for (field, label) in [("listener", "listener"), ("filter_chain", "filter chain")] {
        if let Some(name) = outcome[field].as_str().filter(|n| !n.is_empty()) {
            text.push_str(&format!("{label} {name}\n"));
        }
    }
    if let Some(tls) = outcome["filter_chain_tls"].as_object() {
        let secret = tls
            .get("certificate_sds_secret")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let client = if tls
            .get("require_client_certificate")
            .and_then(Value::as_bool)
            .unwrap_or(false)
        {
            "required"
        } else {
            "not required"
        };
        text.push_str(&format!(
            "tls certificate {secret}, client certificate {client}\n"
        ));
    }
    for (field, label) in [
        ("route_config", "route config"),
        ("virtual_host", "virtual host"),
        ("route", "route"),
        ("cluster", "cluster"),
    ] {
        if let Some(name) = outcome[field].as_str().filter(|n| !n.is_empty()) {
            text.push_str(&format!("{label} {name}\n"));
        }
    }
    for split in outcome["weighted_clusters"]
        .as_array()
        .into_iter()
        .flatten()
    {
        text.push_str(&format!(
            "cluster {} (weight {})\n",
            split["name"].as_str().unwrap_or_default(),
            split["weight"]
        ));
    }
    if let Some(error) = outcome["error"].as_str() {
        text.push_str(&format!("error: {error}\n"));
    }
    text
}

pub async fn run(server: anyhow::Result<Server>, args: SimulateArgs) -> CmdResult {
    let agent = match agent::agent_ref(&args.agent)? {
        agent::AgentRef::Address(address) => address.to_owned(),
        agent::AgentRef::Proxy(_) => resolve_agent(&server?, &args.agent).await?,
    };
    let generator = match args.generator {
        Generator::Envoy => "envoy",
        Generator::Grpc => "grpc",
    };
    let body = serde_json::to_vec(&call_json(&args))?;
    let (status, answer) = post(&agent, &format!("/simulate?generator={generator}"), body).await?;
    let answer = String::from_utf8_lossy(&answer);
    match status {
        StatusCode::OK => {}
        StatusCode::BAD_REQUEST => {
            return Err(
                UsageError(format!("the agent rejected the call: {}", answer.trim())).into(),
            );
        }
        StatusCode::NOT_FOUND => anyhow::bail!(
            "the agent at {agent} has no /simulate endpoint; is --agent the address of a pasa-agent's admin endpoint, and is that agent up to date?"
        ),
        _ => anyhow::bail!("the agent at {agent} answered {status}: {}", answer.trim()),
    }
    let outcome: Value = serde_json::from_str(&answer).map_err(|e| {
        anyhow::anyhow!(
            "the agent at {agent} answered something that is not an outcome ({e}): {}",
            answer.trim()
        )
    })?;
    match args.output {
        Output::Json => out(&format!("{}\n", serde_json::to_string_pretty(&outcome)?))?,
        Output::Short => out(&short(&outcome))?,
    }
    if outcome.get("error").is_some_and(|e| !e.is_null()) {
        return Err(Reported.into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Test {
        #[command(flatten)]
        args: SimulateArgs,
    }

    fn args(argv: &[&str]) -> SimulateArgs {
        Test::try_parse_from(std::iter::once("t").chain(argv.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn the_call_holds_what_was_given() {
        let call = call_json(&args(&[
            "--port", "9080", "--host", "reviews", "--header", "x-a=1", "--header", "x-a=2",
            "--mode", "inbound",
        ]));
        assert_eq!(
            call,
            json!({"port": 9080, "protocol": "http", "tls": "plaintext", "host": "reviews",
                   "mode": "inbound", "headers": {"x-a": ["1", "2"]}})
        );
        let bad = Test::try_parse_from(["t", "--port", "1", "--header", "novalue"]);
        assert!(bad.is_err());
        assert!(Test::try_parse_from(["t", "--port", "1", "--address", "reviews"]).is_err());
    }

    #[test]
    fn short_output_lists_the_steps_then_the_error() {
        let outcome = json!({
            "listener": "0.0.0.0_9080",
            "route_config": "9080",
            "virtual_host": "reviews.default.svc.cluster.local:9080",
            "error": "NoRoute",
        });
        assert_eq!(
            short(&outcome),
            "listener 0.0.0.0_9080\nroute config 9080\nvirtual host reviews.default.svc.cluster.local:9080\nerror: NoRoute\n"
        );
        let tls = json!({"listener": "virtualInbound", "filter_chain_tls":
            {"certificate_sds_secret": "default", "require_client_certificate": true}});
        assert!(short(&tls).contains("tls certificate default, client certificate required"));
    }
}
