//! `proxy-config route`: NAME, VHOST NAME, DOMAINS, MATCH, VIRTUAL SERVICE — one row per route
//! of each virtual host (routes to `PassthroughCluster` left out, a host without routes shown as
//! `/*` → `404`), as istioctl shows them. VIRTUAL SERVICE is the route's `istio` filter
//! metadata as `name.namespace`.

use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteConfiguration, RouteMatch, route, route_action,
};

use super::cluster::managed_by;
use crate::cli::table;

pub const HEADER: [&str; 5] = ["NAME", "VHOST NAME", "DOMAINS", "MATCH", "VIRTUAL SERVICE"];

/// How many domains a row lists before `+ N more...`.
const DOMAINS_SHOWN: usize = 2;

/// istioctl's route filter.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RouteFilter {
    /// Only the route configuration of this name (e.g. 9080).
    #[arg(long)]
    pub name: Option<String>,
}

impl RouteFilter {
    pub fn keeps(&self, rc: &RouteConfiguration) -> bool {
        self.name.as_ref().is_none_or(|n| *n == rc.name)
    }
}

/// A route's match as istioctl writes it (`/api*`, `/exact`, `PathPrefix:/p`, `regex …`);
/// headers are left out.
pub fn describe_match(m: Option<&RouteMatch>) -> String {
    match m.and_then(|m| m.path_specifier.as_ref()) {
        Some(PathSpecifier::Prefix(p)) if !p.is_empty() => format!("{p}*"),
        Some(PathSpecifier::PathSeparatedPrefix(p)) if !p.is_empty() => format!("PathPrefix:{p}"),
        Some(PathSpecifier::Path(p)) => p.clone(),
        Some(PathSpecifier::SafeRegex(r)) => format!("regex {}", r.regex),
        _ => String::new(),
    }
}

/// A virtual host's domains without the `host:port` forms and without the longer spellings of
/// a short name also listed (`reviews.default.svc.cluster.local` when `reviews` is there), at
/// most two then `+ N more...`.
pub fn describe_domains(domains: &[String]) -> String {
    match domains {
        [] => return String::new(),
        [one] => return one.clone(),
        _ => {}
    }
    let without_port: Vec<&str> = domains
        .iter()
        .map(String::as_str)
        .filter(|d| {
            let colons = d.matches(':').count();
            colons == 0 || (colons > 2 && d.ends_with(']'))
        })
        .collect();
    let shorter_listed = |d: &str| {
        [".svc.cluster.local", ".svc"].iter().any(|suffix| {
            d.strip_suffix(suffix)
                .is_some_and(|short| without_port.contains(&short))
        })
    };
    let kept: Vec<&str> = without_port
        .iter()
        .copied()
        .filter(|d| !shorter_listed(d))
        .collect();
    if kept.len() > DOMAINS_SHOWN {
        format!(
            "{} + {} more...",
            kept[..DOMAINS_SHOWN].join(", "),
            kept.len() - DOMAINS_SHOWN
        )
    } else {
        kept.join(", ")
    }
}

fn is_passthrough(r: &Route) -> bool {
    matches!(&r.action, Some(route::Action::Route(a))
        if matches!(&a.cluster_specifier,
            Some(route_action::ClusterSpecifier::Cluster(c)) if c == "PassthroughCluster"))
}

/// Numeric names (ports) first, in numeric order, then the others by name.
fn order(rc: &RouteConfiguration) -> (Option<u64>, &str) {
    (rc.name.parse().ok(), &rc.name)
}

/// One row per route (or route-less virtual host) of the route configurations kept.
pub fn rows<'a>(routes: impl IntoIterator<Item = &'a RouteConfiguration>) -> Vec<Vec<String>> {
    let mut configs: Vec<&RouteConfiguration> = routes.into_iter().collect();
    configs.sort_by(|a, b| match (order(a), order(b)) {
        ((Some(x), _), (Some(y), _)) => x.cmp(&y),
        ((Some(_), _), (None, _)) => std::cmp::Ordering::Less,
        ((None, _), (Some(_), _)) => std::cmp::Ordering::Greater,
        ((None, x), (None, y)) => x.cmp(y),
    });
    let mut rows = Vec::new();
    for rc in configs {
        for vh in &rc.virtual_hosts {
            let domains = describe_domains(&vh.domains);
            for r in vh.routes.iter().filter(|r| !is_passthrough(r)) {
                rows.push(vec![
                    rc.name.clone(),
                    vh.name.clone(),
                    domains.clone(),
                    describe_match(r.r#match.as_ref()),
                    managed_by(r.metadata.as_ref()),
                ]);
            }
            if vh.routes.is_empty() {
                rows.push(vec![
                    rc.name.clone(),
                    vh.name.clone(),
                    domains,
                    "/*".into(),
                    "404".into(),
                ]);
            }
        }
    }
    rows
}

/// The table of `routes`.
pub fn render<'a>(routes: impl IntoIterator<Item = &'a RouteConfiguration>) -> String {
    table::render(&HEADER, &rows(routes), table::WIDE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::route::v3::{RouteAction, VirtualHost};

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn domains_shortened_as_istioctl_does() {
        let domains = strings(&[
            "reviews.default.svc.cluster.local",
            "reviews.default.svc.cluster.local:9080",
            "reviews",
            "reviews:9080",
            "reviews.default.svc",
            "reviews.default",
            "10.96.0.20",
            "10.96.0.20:9080",
        ]);
        assert_eq!(
            describe_domains(&domains),
            "reviews, reviews.default + 1 more..."
        );
        assert_eq!(describe_domains(&strings(&["*"])), "*");
        assert_eq!(describe_domains(&strings(&["a", "a:80"])), "a");
    }

    #[test]
    fn rows_per_route_with_the_virtual_service() {
        let route = |prefix: &str, cluster: &str| Route {
            r#match: Some(RouteMatch {
                path_specifier: Some(PathSpecifier::Prefix(prefix.into())),
                ..Default::default()
            }),
            action: Some(route::Action::Route(RouteAction {
                cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster.into())),
                ..Default::default()
            })),
            ..Default::default()
        };
        let rc = |name: &str, hosts: Vec<VirtualHost>| RouteConfiguration {
            name: name.into(),
            virtual_hosts: hosts,
            ..Default::default()
        };
        let configs = [
            rc(
                "9080",
                vec![
                    VirtualHost {
                        name: "reviews.default.svc.cluster.local:9080".into(),
                        domains: strings(&["reviews.default.svc.cluster.local", "reviews"]),
                        routes: vec![route("/", "outbound|9080|v1|reviews")],
                        ..Default::default()
                    },
                    VirtualHost {
                        name: "allow_any".into(),
                        domains: strings(&["*"]),
                        routes: vec![route("/", "PassthroughCluster")],
                        ..Default::default()
                    },
                    VirtualHost {
                        name: "block".into(),
                        domains: strings(&["*"]),
                        ..Default::default()
                    },
                ],
            ),
            rc("80", vec![]),
        ];
        let rows = rows(&configs);
        assert_eq!(
            rows,
            vec![
                strings(&[
                    "9080",
                    "reviews.default.svc.cluster.local:9080",
                    "reviews.default.svc.cluster.local, reviews",
                    "/*",
                    ""
                ]),
                strings(&["9080", "block", "*", "/*", "404"]),
            ]
        );
        let filter = RouteFilter {
            name: Some("80".into()),
        };
        assert!(filter.keeps(&configs[1]) && !filter.keeps(&configs[0]));
    }
}
