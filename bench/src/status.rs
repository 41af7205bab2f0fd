//! `status`: the store's proxy-status table at scale. N agents open a report stream each and send
//! a full report (four xDS types, one connection, versions, one in a hundred with a NACK), then
//! R reports change random agents' state (as pushes and ACKs would), then `proxy-status` lists
//! every proxy and looks one up by name. Measures the cost per report, the memory per agent and
//! the listing time, against what the agents' heartbeats alone ask of a store.

use std::time::{Duration, Instant};

use anyhow::ensure;
use pasa_proto::store::v1::{
    ListProxyStatusRequest, NackInfo, ProxyConnection, ProxyStatus, ProxyType, SyncState,
    TypeSyncStatus, XdsSyncStatus,
};
use pasa_store::metrics::Metrics;
use pasa_store::status::ProxyTable;
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::{Value, json};

use crate::stats::{peak_rss_mib, round2, rss_mib};

#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// Agents reporting.
    #[arg(long, default_value_t = 100_000)]
    pub agents: usize,
    /// Change reports after every agent has reported once.
    #[arg(long, default_value_t = 200_000)]
    pub reports: usize,
    /// The agents' heartbeat, in seconds (what the store must sustain with nothing changing).
    #[arg(long, default_value_t = 30)]
    pub heartbeat: u64,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

fn type_status(version: u64, nack: bool) -> TypeSyncStatus {
    let version = format!("{version:016x}");
    TypeSyncStatus {
        state: if nack {
            SyncState::Stale as i32
        } else {
            SyncState::Synced as i32
        },
        version_sent: version.clone(),
        version_acked: version.clone(),
        last_nack: nack.then(|| NackInfo {
            version,
            error: "Error adding/updating listener(s) 0.0.0.0_8080: duplicate filter chain match"
                .into(),
            time_unix_ms: 1_764_000_000_000,
        }),
    }
}

fn status(i: usize, revision: u64, version: u64, nack: bool) -> ProxyStatus {
    let xds = XdsSyncStatus {
        cds: Some(type_status(version, false)),
        lds: Some(type_status(version, nack)),
        eds: Some(type_status(version, false)),
        rds: Some(type_status(version, false)),
        // Most proxies ask for no extension config.
        ecds: None,
    };
    let namespace = format!("ns-{}", i % 500);
    let pod = format!("svc-{}-7d4b9c8f6-{i:05x}", i % 5000);
    ProxyStatus {
        node_id: format!(
            "sidecar~10.{}.{}.{}~{pod}.{namespace}~{namespace}.svc.cluster.local",
            i >> 16 & 255,
            i >> 8 & 255,
            i & 255
        ),
        pod_name: pod,
        namespace,
        proxy_type: ProxyType::Sidecar as i32,
        generators: vec!["envoy".into()],
        admin_address: format!("10.{}.{}.{}:15000", i >> 16 & 255, i >> 8 & 255, i & 255),
        agent_version: "0.1.0".into(),
        applied_revision: revision,
        connections: vec![ProxyConnection {
            id: 1,
            node_id: String::new(),
            protocol: "Delta".into(),
            generator: "envoy".into(),
            xds: Some(xds.clone()),
        }],
        xds: Some(xds),
        heartbeat_interval_ms: 30_000,
        ..Default::default()
    }
}

pub fn run(args: &StatusArgs) -> anyhow::Result<Value> {
    ensure!(args.agents > 0, "--agents must be at least 1");
    ensure!(args.heartbeat > 0, "--heartbeat must be at least 1 second");
    let mut rng = StdRng::seed_from_u64(args.seed);
    let table = ProxyTable::new(Duration::from_secs(300), Metrics::new());
    let before = rss_mib().unwrap_or(0.0);

    let started = Instant::now();
    let mut streams = Vec::with_capacity(args.agents);
    for i in 0..args.agents {
        let mut stream = table.open_stream();
        stream.report(Some(status(i, 1, 1, i % 100 == 0)))?;
        streams.push(stream);
    }
    let first = started.elapsed();
    let after = rss_mib().unwrap_or(0.0);
    let per_agent_kib = (after - before) * 1024.0 / args.agents as f64;
    println!(
        "{} agents reported once in {:.0} ms ({:.2} µs a report); table memory {:.1} MiB, {:.2} KiB an agent",
        args.agents,
        first.as_secs_f64() * 1e3,
        first.as_secs_f64() * 1e6 / args.agents as f64,
        after - before,
        per_agent_kib
    );

    // Statuses are built before timing: the agents build them, the store only records them.
    let changes: Vec<(usize, ProxyStatus)> = (0..args.reports)
        .map(|r| {
            let i = rng.random_range(0..args.agents);
            (
                i,
                status(i, 2 + r as u64, 2 + r as u64, rng.random_bool(0.01)),
            )
        })
        .collect();
    let started = Instant::now();
    for (i, change) in changes {
        streams[i].report(Some(change))?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let per_second = args.reports as f64 / elapsed.max(f64::EPSILON);
    let heartbeat_load = args.agents as f64 / args.heartbeat as f64;
    println!(
        "{} change reports: {:.0} reports/s on one core ({:.2} µs each); heartbeats alone ask {:.0}/s",
        args.reports,
        per_second,
        elapsed * 1e6 / args.reports.max(1) as f64,
        heartbeat_load
    );

    let started = Instant::now();
    let all = table.list(&ListProxyStatusRequest::default());
    let list_all = started.elapsed();
    ensure!(all.len() == args.agents, "every agent is listed");
    // What the listing costs on the wire (sent in pages; see the store's ListProxyStatus).
    let bytes: usize = all.iter().map(prost::Message::encoded_len).sum();
    let started = Instant::now();
    let one = table.list(&ListProxyStatusRequest {
        name: all[all.len() / 2]
            .status
            .as_ref()
            .map(|s| format!("{}.{}", s.pod_name, s.namespace))
            .unwrap_or_default(),
        namespace: String::new(),
        local_only: true,
    });
    let list_one = started.elapsed();
    ensure!(one.len() == 1, "one agent by name");
    println!(
        "proxy-status: listing all {} in {:.0} ms ({:.1} MiB encoded, {} bytes a proxy), one by name in {:.1} ms",
        all.len(),
        list_all.as_secs_f64() * 1e3,
        bytes as f64 / (1 << 20) as f64,
        bytes / all.len(),
        list_one.as_secs_f64() * 1e3
    );
    drop(streams);

    let mut summary = json!({
        "mode": "status",
        "agents": args.agents,
        "first_report_us": round2(first.as_secs_f64() * 1e6 / args.agents as f64),
        "table_mib": round2(after - before),
        "kib_per_agent": round2(per_agent_kib),
        "reports_per_s": per_second.round(),
        "heartbeat_reports_per_s": heartbeat_load.round(),
        "list_all_ms": round2(list_all.as_secs_f64() * 1e3),
        "list_bytes_per_proxy": bytes / all.len(),
        "list_one_ms": round2(list_one.as_secs_f64() * 1e3),
    });
    if let Some(rss) = peak_rss_mib() {
        summary["peak_rss_mib"] = json!(round2(rss));
    }
    Ok(summary)
}
