//! `pasactl proxy-status [AGENT]`: every proxy's sync state as its agent reports it to the store,
//! like `istioctl proxy-status`, or one proxy in detail with its last NACK.
//!
//! The list shows per proxy (sorted by namespace, then name): NAME (`pod.namespace`, as
//! istioctl), TYPE, the CDS/LDS/EDS/RDS/ECDS states (SYNCED, STALE, STALE (Never Acknowledged),
//! NOT SENT), the applied REVISION and its LAG behind the store, DEGRADED (`no`, `yes`, or
//! `lost contact 12s ago` when the agent stopped reporting) and the agent VERSION.
//!
//! Each store server knows only the agents reporting to it: with several replicas, ask each
//! (`--server`).

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use pasa_proto::store::v1::{
    ListProxyStatusRequest, ListProxyStatusResponse, NackInfo, ProxyStatus, ProxyStatusEntry,
    ProxyType, SyncState, TypeSyncStatus, XdsSyncStatus,
};
use serde_json::{Value, json};

use super::{CmdResult, REQUEST_TIMEOUT, Reported, connect, out, status_error, structured};

/// `pasactl proxy-status` options.
#[derive(clap::Args, Debug)]
pub struct ProxyStatusArgs {
    /// One proxy to show in detail: `pod.namespace`, a pod name, or a node ID.
    pub agent: Option<String>,
    /// Only proxies of this namespace.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "short")]
    pub output: Output,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// A table (a detail page with AGENT).
    Short,
    /// The store's answer as JSON.
    Json,
    /// The store's answer as YAML.
    Yaml,
}

/// What the store at `server` knows of the proxies named `name` (all if empty) in `namespace`
/// (all if empty).
pub async fn list(
    server: &crate::cli::Server,
    name: &str,
    namespace: &str,
) -> anyhow::Result<ListProxyStatusResponse> {
    let request = ListProxyStatusRequest {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        local_only: false,
    };
    let ask = async {
        let mut client = connect(server).await?;
        pasa_proto::client::list_proxy_status(&mut client, request)
            .await
            .map_err(|status| status_error(server, status))
    };
    server.within("`proxy-status`", REQUEST_TIMEOUT, ask).await
}

/// The one proxy `agent` names in the store's answer; otherwise an error that says why (none,
/// or which ones it could mean, by node ID and IP, for the user to give one).
///
/// A proxy is listed again when its agent restarts (by the store replica it reports to now, or
/// under a new node ID when its pod got a new IP) while the old entry waits to expire: of
/// several, the one whose agent is connected is meant when it is the only one; entries of one
/// node ID are one proxy, and the freshest is meant.
pub fn the_one<'a>(
    answer: &'a ListProxyStatusResponse,
    agent: &str,
    server: &crate::cli::Server,
) -> anyhow::Result<&'a ProxyStatusEntry> {
    let all: Vec<&ProxyStatusEntry> = answer
        .proxies
        .iter()
        .filter(|e| e.status.is_some())
        .collect();
    let connected: Vec<&ProxyStatusEntry> = all.iter().copied().filter(|e| e.connected).collect();
    let candidates = if connected.is_empty() {
        &all
    } else {
        &connected
    };
    let node_id = |e: &ProxyStatusEntry| e.status.as_ref().map(|s| s.node_id.clone());
    let one_node = candidates
        .first()
        .is_some_and(|first| candidates.iter().all(|e| node_id(e) == node_id(first)));
    if one_node {
        // The freshest contact: connected ones by their last report, others by when it was lost.
        if let Some(entry) = candidates
            .iter()
            .min_by_key(|e| (e.lost_contact_ms_ago, e.last_contact_ms_ago))
        {
            return Ok(entry);
        }
    }
    if all.is_empty() {
        anyhow::bail!(
            "no proxy {agent:?} reports to the store at {server} (give pod.namespace, a pod name or a node ID; proxies whose agents stopped reporting are removed after {})",
            age(answer.expiry_ms)
        );
    }
    let mut lines = String::new();
    for e in candidates {
        let Some(s) = &e.status else { continue };
        let ip = pasa_istio::node::NodeId::parse(&s.node_id)
            .map(|n| n.ip.to_string())
            .unwrap_or_else(|_| "-".into());
        let contact = if e.connected {
            "connected".to_string()
        } else {
            format!("lost contact {} ago", age(e.lost_contact_ms_ago))
        };
        let _ = write!(lines, "\n  {}  IP {ip}  {contact}", s.node_id);
    }
    anyhow::bail!(
        "{agent:?} names {} proxies; give the node ID of the one you mean:{lines}",
        candidates.len()
    )
}

pub async fn run(server: &crate::cli::Server, args: ProxyStatusArgs) -> CmdResult {
    let answer = list(
        server,
        args.agent.as_deref().unwrap_or_default(),
        args.namespace.as_deref().unwrap_or_default(),
    )
    .await?;
    let now = now_unix_ms();
    let Some(agent) = &args.agent else {
        return Ok(out(&match args.output {
            Output::Short => table(&answer),
            Output::Json | Output::Yaml => structured(
                args.output == Output::Yaml,
                &json!({
                    "revision": answer.revision,
                    "proxies": answer.proxies.iter().map(|e| entry_json(e, answer.revision)).collect::<Vec<_>>(),
                }),
            )?,
        })?);
    };
    let entry = match the_one(&answer, agent, server) {
        Ok(entry) => entry,
        Err(e) => {
            eprintln!("error: {e}");
            return Err(Reported.into());
        }
    };
    out(&match args.output {
        Output::Short => detail(entry, &answer, now),
        Output::Json | Output::Yaml => structured(
            args.output == Output::Yaml,
            &entry_json(entry, answer.revision),
        )?,
    })?;
    Ok(())
}

fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `pod.namespace`, as istioctl names proxies.
pub fn name(status: &ProxyStatus) -> String {
    format!("{}.{}", status.pod_name, status.namespace)
}

fn proxy_type(status: &ProxyStatus) -> &'static str {
    match ProxyType::try_from(status.proxy_type) {
        Ok(ProxyType::Router) => "router",
        Ok(ProxyType::Sidecar) => "sidecar",
        _ => "unknown",
    }
}

/// The state word of one type, as istioctl prints it.
pub fn state(t: Option<&TypeSyncStatus>) -> &'static str {
    let Some(t) = t else { return "NOT SENT" };
    match SyncState::try_from(t.state) {
        Ok(SyncState::Synced) => "SYNCED",
        Ok(SyncState::Stale) if t.version_acked.is_empty() => "STALE (Never Acknowledged)",
        Ok(SyncState::Stale) => "STALE",
        _ => "NOT SENT",
    }
}

/// The types in istioctl's column order.
pub fn types(xds: Option<&XdsSyncStatus>) -> [(&'static str, Option<&TypeSyncStatus>); 5] {
    [
        ("CDS", xds.and_then(|x| x.cds.as_ref())),
        ("LDS", xds.and_then(|x| x.lds.as_ref())),
        ("EDS", xds.and_then(|x| x.eds.as_ref())),
        ("RDS", xds.and_then(|x| x.rds.as_ref())),
        ("ECDS", xds.and_then(|x| x.ecds.as_ref())),
    ]
}

/// `5s`, `3m`, `2h`, `4d`, as kubectl shows ages.
pub fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

fn ago(now_unix_ms: i64, at_unix_ms: i64) -> String {
    age(u64::try_from(now_unix_ms.saturating_sub(at_unix_ms)).unwrap_or(0))
}

/// The DEGRADED column: `lost contact 12s ago`, `yes` or `no`.
pub fn degraded(entry: &ProxyStatusEntry) -> String {
    if !entry.connected {
        return format!("lost contact {} ago", age(entry.lost_contact_ms_ago));
    }
    match &entry.status {
        Some(s) if s.degraded => "yes".into(),
        _ => "no".into(),
    }
}

fn lag(status: &ProxyStatus, store_revision: u64) -> u64 {
    store_revision.saturating_sub(status.applied_revision)
}

/// Lines of cells as left-aligned columns two spaces apart.
fn columns(rows: &[Vec<String>]) -> String {
    let mut widths = Vec::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if widths.len() <= i {
                widths.push(0);
            }
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:width$}  ", width = widths[i]);
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// The list, one proxy a line.
pub fn table(answer: &ListProxyStatusResponse) -> String {
    let mut rows = vec![
        [
            "NAME", "TYPE", "CDS", "LDS", "EDS", "RDS", "ECDS", "REVISION", "LAG", "DEGRADED",
            "VERSION",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for entry in &answer.proxies {
        let Some(s) = &entry.status else { continue };
        let mut row = vec![name(s), proxy_type(s).into()];
        row.extend(types(s.xds.as_ref()).map(|(_, t)| state(t).to_string()));
        row.extend([
            s.applied_revision.to_string(),
            lag(s, answer.revision).to_string(),
            degraded(entry),
            s.agent_version.clone(),
        ]);
        rows.push(row);
    }
    columns(&rows)
}

fn nack_line(kind: &str, nack: &NackInfo, now: i64) -> String {
    format!(
        "{kind} rejected version {:?} {} ago: {}",
        nack.version,
        ago(now, nack.time_unix_ms),
        nack.error
    )
}

fn or_dash(text: &str) -> String {
    if text.is_empty() {
        "-".into()
    } else {
        text.into()
    }
}

/// One proxy in detail.
pub fn detail(entry: &ProxyStatusEntry, answer: &ListProxyStatusResponse, now: i64) -> String {
    let Some(s) = &entry.status else {
        return String::new();
    };
    let mut text = String::new();
    let mut field = |label: &str, value: String| {
        let _ = writeln!(text, "{label:<12}{value}");
    };
    field("NAME", name(s));
    field("NODE", s.node_id.clone());
    field("TYPE", proxy_type(s).into());
    field("GENERATORS", or_dash(&s.generators.join(", ")));
    field(
        "SCOPE",
        match s.scope.as_str() {
            "on-demand" => format!("on-demand, {} hosts learned", s.learned_hosts),
            scope => or_dash(scope),
        },
    );
    field(
        "AGENT",
        format!(
            "version {}, admin {}",
            or_dash(&s.agent_version),
            or_dash(&s.admin_address)
        ),
    );
    field(
        "REVISION",
        format!(
            "applied {}, store {} (lag {})",
            s.applied_revision,
            answer.revision,
            lag(s, answer.revision)
        ),
    );
    field(
        "CONTACT",
        if entry.connected {
            format!(
                "reporting, last report {} ago",
                age(entry.last_contact_ms_ago)
            )
        } else {
            format!(
                "lost contact {} ago (listed until {} after that)",
                age(entry.lost_contact_ms_ago),
                age(answer.expiry_ms)
            )
        },
    );
    field(
        "DEGRADED",
        if s.degraded {
            let since = match s.degraded_since_unix_ms {
                0 => String::new(),
                at => format!(" for {}", ago(now, at)),
            };
            format!("yes{since}: {}", s.degraded_reason)
        } else {
            "no".into()
        },
    );
    text.push('\n');
    let mut rows = vec![
        ["TYPE", "STATE", "SENT", "ACKED"]
            .map(String::from)
            .to_vec(),
    ];
    for (kind, t) in types(s.xds.as_ref()) {
        rows.push(vec![
            kind.into(),
            state(t).into(),
            or_dash(t.map_or("", |t| &t.version_sent)),
            or_dash(t.map_or("", |t| &t.version_acked)),
        ]);
    }
    text.push_str(&columns(&rows));
    let nacks: Vec<String> = types(s.xds.as_ref())
        .into_iter()
        .filter_map(|(kind, t)| Some(nack_line(kind, t?.last_nack.as_ref()?, now)))
        .collect();
    text.push('\n');
    if nacks.is_empty() {
        text.push_str("LAST NACK   none\n");
    } else {
        for nack in nacks {
            let _ = writeln!(text, "LAST NACK   {nack}");
        }
    }
    text.push('\n');
    if s.connections.is_empty() {
        text.push_str("CONNECTIONS none\n");
    } else {
        let mut rows = vec![
            [
                "ID",
                "PROTOCOL",
                "GENERATOR",
                "CDS",
                "LDS",
                "EDS",
                "RDS",
                "ECDS",
                "NODE",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for c in &s.connections {
            let mut row = vec![c.id.to_string(), c.protocol.clone(), or_dash(&c.generator)];
            row.extend(types(c.xds.as_ref()).map(|(_, t)| state(t).to_string()));
            row.push(or_dash(&c.node_id));
            rows.push(row);
        }
        text.push_str(&columns(&rows));
    }
    text
}

fn type_json(t: Option<&TypeSyncStatus>) -> Value {
    json!({
        "state": state(t),
        "version_sent": t.map(|t| t.version_sent.as_str()).unwrap_or_default(),
        "version_acked": t.map(|t| t.version_acked.as_str()).unwrap_or_default(),
        "last_nack": t.and_then(|t| t.last_nack.as_ref()).map(|n| json!({
            "error": n.error, "version": n.version, "time_unix_ms": n.time_unix_ms,
        })),
    })
}

fn xds_json(xds: Option<&XdsSyncStatus>) -> Value {
    types(xds)
        .into_iter()
        .map(|(kind, t)| (kind.to_string(), type_json(t)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// One proxy as `-o json` prints it.
pub fn entry_json(entry: &ProxyStatusEntry, store_revision: u64) -> Value {
    let Some(s) = &entry.status else {
        return Value::Null;
    };
    json!({
        "name": name(s),
        "node_id": s.node_id,
        "pod": s.pod_name,
        "namespace": s.namespace,
        "type": proxy_type(s),
        "generators": s.generators,
        "admin_address": s.admin_address,
        "agent_version": s.agent_version,
        "applied_revision": s.applied_revision,
        "store_revision": store_revision,
        "lag": lag(s, store_revision),
        "degraded": s.degraded,
        "degraded_reason": s.degraded_reason,
        "degraded_since_unix_ms": s.degraded_since_unix_ms,
        "connected": entry.connected,
        "last_contact_ms_ago": entry.last_contact_ms_ago,
        "lost_contact_ms_ago": entry.lost_contact_ms_ago,
        "xds": xds_json(s.xds.as_ref()),
        "connections": s.connections.iter().map(|c| json!({
            "id": c.id,
            "node_id": c.node_id,
            "protocol": c.protocol,
            "generator": c.generator,
            "xds": xds_json(c.xds.as_ref()),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(state: SyncState, sent: &str, acked: &str) -> Option<TypeSyncStatus> {
        Some(TypeSyncStatus {
            state: state as i32,
            version_sent: sent.into(),
            version_acked: acked.into(),
            last_nack: None,
        })
    }

    fn entry(
        pod: &str,
        ns: &str,
        xds: XdsSyncStatus,
        degraded: bool,
        connected: bool,
    ) -> ProxyStatusEntry {
        ProxyStatusEntry {
            status: Some(ProxyStatus {
                node_id: format!("sidecar~10.0.0.1~{pod}.{ns}~{ns}.svc.cluster.local"),
                pod_name: pod.into(),
                namespace: ns.into(),
                proxy_type: ProxyType::Sidecar as i32,
                agent_version: "0.1.0".into(),
                applied_revision: 4,
                degraded,
                xds: Some(xds),
                ..Default::default()
            }),
            connected,
            last_contact_ms_ago: 1000,
            lost_contact_ms_ago: if connected { 0 } else { 12_000 },
        }
    }

    #[test]
    fn the_table_has_istioctls_columns_and_state_words() {
        let synced = XdsSyncStatus {
            cds: t(SyncState::Synced, "1", "1"),
            lds: t(SyncState::Synced, "1", "1"),
            eds: t(SyncState::NotSent, "", ""),
            rds: None,
            ecds: None,
        };
        let nacked = XdsSyncStatus {
            lds: t(SyncState::Stale, "2", ""),
            cds: t(SyncState::Stale, "3", "2"),
            ..synced.clone()
        };
        let answer = ListProxyStatusResponse {
            proxies: vec![
                entry("cart", "shop", synced.clone(), false, true),
                entry("web", "shop", nacked, false, true),
                entry("gone", "shop", synced, true, false),
            ],
            revision: 6,
            expiry_ms: 300_000,
        };
        let text = table(&answer);
        let lines: Vec<&str> = text.lines().collect();
        let cells = |line: &str| {
            line.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            cells(lines[0]),
            [
                "NAME", "TYPE", "CDS", "LDS", "EDS", "RDS", "ECDS", "REVISION", "LAG", "DEGRADED",
                "VERSION"
            ]
        );
        assert_eq!(
            cells(lines[1]),
            [
                "cart.shop",
                "sidecar",
                "SYNCED",
                "SYNCED",
                "NOT SENT",
                "NOT SENT",
                "NOT SENT",
                "4",
                "2",
                "no",
                "0.1.0"
            ]
        );
        assert_eq!(
            cells(lines[2])[2..4],
            ["STALE", "STALE (Never Acknowledged)"]
        );
        assert_eq!(cells(lines[3])[9], "lost contact 12s ago");
    }

    fn server() -> crate::cli::Server {
        crate::cli::Server {
            address: "127.0.0.1:7400".into(),
            tls: None,
            request_timeout: None,
        }
    }

    fn at(ip: &str, pod: &str, connected: bool) -> ProxyStatusEntry {
        let mut e = entry(pod, "shop", XdsSyncStatus::default(), false, connected);
        if let Some(s) = e.status.as_mut() {
            s.node_id = format!("sidecar~{ip}~{pod}.shop~shop.svc.cluster.local");
        }
        e
    }

    fn answer(proxies: Vec<ProxyStatusEntry>) -> ListProxyStatusResponse {
        ListProxyStatusResponse {
            proxies,
            revision: 6,
            expiry_ms: 300_000,
        }
    }

    fn node(e: &ProxyStatusEntry) -> &str {
        &e.status.as_ref().unwrap().node_id
    }

    #[test]
    fn a_restarted_agent_is_the_connected_one_of_its_name() {
        // The pod came back with a new IP: its old entry waits to expire.
        let restarted = answer(vec![
            at("10.0.0.1", "web-1", false),
            at("10.0.0.2", "web-1", true),
        ]);
        let one = the_one(&restarted, "web-1.shop", &server()).unwrap();
        assert_eq!(
            node(one),
            "sidecar~10.0.0.2~web-1.shop~shop.svc.cluster.local"
        );

        // Listed by two store replicas under one node ID: one proxy, the freshest entry.
        let mut old = at("10.0.0.1", "web-1", false);
        old.lost_contact_ms_ago = 60_000;
        let mut recent = at("10.0.0.1", "web-1", false);
        recent.lost_contact_ms_ago = 2_000;
        let twice = answer(vec![old, recent]);
        let one = the_one(&twice, "web-1.shop", &server()).unwrap();
        assert_eq!(one.lost_contact_ms_ago, 2_000);
    }

    #[test]
    fn proxies_a_name_cannot_tell_apart_are_listed_by_node_id_and_ip() {
        let both = answer(vec![
            at("10.0.0.1", "web-1", true),
            at("10.0.0.2", "web-1", true),
        ]);
        let err = the_one(&both, "web-1.shop", &server())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("\"web-1.shop\" names 2 proxies; give the node ID"),
            "{err}"
        );
        assert!(
            err.contains(
                "\n  sidecar~10.0.0.1~web-1.shop~shop.svc.cluster.local  IP 10.0.0.1  connected"
            ) && err.contains(
                "\n  sidecar~10.0.0.2~web-1.shop~shop.svc.cluster.local  IP 10.0.0.2  connected"
            ),
            "{err}"
        );
        let gone = answer(vec![
            at("10.0.0.1", "web-1", false),
            at("10.0.0.2", "web-1", false),
        ]);
        let err = the_one(&gone, "web-1", &server()).unwrap_err().to_string();
        assert!(err.contains("IP 10.0.0.2  lost contact 12s ago"), "{err}");
        let none = the_one(&answer(vec![]), "web-9", &server())
            .unwrap_err()
            .to_string();
        assert!(none.starts_with("no proxy \"web-9\" reports"), "{none}");
    }

    #[test]
    fn ages_read_like_kubectls() {
        assert_eq!(age(999), "0s");
        assert_eq!(age(59_000), "59s");
        assert_eq!(age(300_000), "5m");
        assert_eq!(age(3 * 3_600_000), "3h");
        assert_eq!(age(3 * 86_400_000), "3d");
    }
}
