//! Step 5 of the walk, inside an HTTP connection manager: the virtual host for the Host header,
//! then the first route whose path matcher accepts the path.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, VirtualHost, route,
};

use super::SimulateError;

/// The virtual host for `host`: an exact domain; else the longest suffix wildcard (`*.foo.com`,
/// and a bare `*` as a wildcard of length 1); else the longest prefix wildcard (`foo.*`); else a
/// `*` domain. With `ignore_port_in_host_matching`, a `:port` suffix of the host is dropped first.
/// Host names are case-insensitive: Envoy lower-cases the host and the domains.
pub(crate) fn virtual_host<'r>(rc: &'r RouteConfiguration, host: &str) -> Option<&'r VirtualHost> {
    let host = host.to_ascii_lowercase();
    let host = if rc.ignore_port_in_host_matching {
        without_port(&host)
    } else {
        &host
    };
    let lower: Vec<Vec<String>> = rc
        .virtual_hosts
        .iter()
        .map(|vh| vh.domains.iter().map(|d| d.to_ascii_lowercase()).collect())
        .collect();
    let domains = || {
        rc.virtual_hosts
            .iter()
            .zip(&lower)
            .flat_map(|(vh, domains)| domains.iter().map(move |d| (vh, d.as_str())))
    };
    if let Some((vh, _)) = domains().find(|(_, d)| *d == host) {
        return Some(vh);
    }
    let longest = |covers: &dyn Fn(&str) -> bool| {
        let mut best: Option<(&'r VirtualHost, usize)> = None;
        for (vh, d) in domains() {
            if host.len() >= d.len() && covers(d) && best.is_none_or(|(_, len)| d.len() > len) {
                best = Some((vh, d.len()));
            }
        }
        best.map(|(vh, _)| vh)
    };
    longest(&|d| d.strip_prefix('*').is_some_and(|rest| host.ends_with(rest)))
        .or_else(|| {
            longest(&|d| {
                d.strip_suffix('*')
                    .is_some_and(|rest| host.starts_with(rest))
            })
        })
        .or_else(|| domains().find(|(_, d)| *d == "*").map(|(vh, _)| vh))
}

/// `host` without a `:port` suffix (`[::1]:80` gives `::1`); unchanged when it has none.
fn without_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.split_once("]:") {
            Some((h, _)) => h,
            None => host,
        };
    }
    match host.rsplit_once(':') {
        Some((h, _)) if !h.contains(':') => h,
        _ => host,
    }
}

/// The first route of `vh` whose path matcher accepts `path`. A path-separated prefix matches the
/// path itself or what continues it with `/`; a safe regex must match the whole path, as in
/// Envoy.
pub(super) fn route<'v>(
    vh: &'v VirtualHost,
    path: &str,
    at: &str,
) -> Result<Option<&'v Route>, SimulateError> {
    for (i, r) in vh.routes.iter().enumerate() {
        let at = || format!("{at}, route {i} ({:?})", r.name);
        let matched = match r.r#match.as_ref().and_then(|m| m.path_specifier.as_ref()) {
            Some(PathSpecifier::Prefix(p)) => path.starts_with(p.as_str()),
            Some(PathSpecifier::PathSeparatedPrefix(p)) => path
                .strip_prefix(p.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['/', '?', '#'])),
            Some(PathSpecifier::Path(p)) => path == p,
            Some(PathSpecifier::SafeRegex(re)) => regex::Regex::new(&format!("^(?:{})$", re.regex))
                .map_err(|source| SimulateError::Regex {
                    at: at(),
                    regex: re.regex.clone(),
                    source: Box::new(source),
                })?
                .is_match(path),
            _ => return Err(SimulateError::PathMatcher { at: at() }),
        };
        if matched {
            return Ok(Some(r));
        }
    }
    Ok(None)
}

/// The route's target when it sends to one cluster (not weighted clusters, a redirect or a direct
/// response).
pub(super) fn single_cluster(r: &Route) -> Option<&str> {
    match &r.action {
        Some(route::Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster)),
            ..
        })) => Some(cluster),
        _ => None,
    }
}

/// The split of a route to weighted clusters (empty for any other action).
pub(super) fn weighted_clusters(r: &Route) -> Vec<super::WeightedCluster> {
    match &r.action {
        Some(route::Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::WeightedClusters(split)),
            ..
        })) => split
            .clusters
            .iter()
            .map(|c| super::WeightedCluster {
                name: c.name.clone(),
                weight: c.weight.as_ref().map_or(0, |w| w.value),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Domain to clusters of a route configuration: for every virtual host, the single target
/// clusters of its routes (sorted), under every domain it lists. A domain listed by two virtual
/// hosts gets the later one's clusters.
pub fn route_table(rc: &RouteConfiguration) -> BTreeMap<String, Vec<String>> {
    let mut table = BTreeMap::new();
    for vh in &rc.virtual_hosts {
        let mut clusters: Vec<String> = vh
            .routes
            .iter()
            .filter_map(single_cluster)
            .map(str::to_string)
            .collect();
        clusters.sort();
        for d in &vh.domains {
            table.insert(d.clone(), clusters.clone());
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::route::v3::{RedirectAction, RouteMatch, WeightedCluster};
    use envoy_types::pb::envoy::r#type::matcher::v3::RegexMatcher;

    use super::*;

    fn vh(name: &str, domains: &[&str]) -> VirtualHost {
        VirtualHost {
            name: name.into(),
            domains: domains.iter().map(|d| d.to_string()).collect(),
            ..Default::default()
        }
    }

    fn picked(rc: &RouteConfiguration, host: &str) -> Option<String> {
        virtual_host(rc, host).map(|vh| vh.name.clone())
    }

    fn to(cluster: &str, path: PathSpecifier) -> Route {
        Route {
            name: cluster.into(),
            r#match: Some(RouteMatch {
                path_specifier: Some(path),
                ..Default::default()
            }),
            action: Some(route::Action::Route(RouteAction {
                cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.into())),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    #[test]
    fn virtual_hosts_exact_then_suffix_then_prefix_then_star() {
        let rc = RouteConfiguration {
            virtual_hosts: vec![
                vh("any", &["*"]),
                vh("prefix", &["foo.*"]),
                vh("short-suffix", &["*.com"]),
                vh("suffix", &["*.example.com"]),
                vh("exact", &["a.example.com", "a.example.com:80"]),
            ],
            ..Default::default()
        };
        assert_eq!(picked(&rc, "a.example.com").as_deref(), Some("exact"));
        assert_eq!(picked(&rc, "a.example.com:80").as_deref(), Some("exact"));
        assert_eq!(picked(&rc, "b.example.com").as_deref(), Some("suffix"));
        assert_eq!(picked(&rc, "b.other.com").as_deref(), Some("short-suffix"));
        // A bare `*` is a suffix wildcard of length 1: it beats `foo.*`.
        assert_eq!(picked(&rc, "foo.org").as_deref(), Some("any"));
        assert_eq!(picked(&rc, "").as_deref(), Some("any"));

        let no_star = RouteConfiguration {
            virtual_hosts: vec![vh("prefix", &["foo.*"]), vh("suffix", &["*.foo.com"])],
            ..Default::default()
        };
        assert_eq!(picked(&no_star, "foo.org").as_deref(), Some("prefix"));
        // A suffix wildcard does not cover its bare remainder.
        assert_eq!(picked(&no_star, "bar.com"), None);
        assert_eq!(picked(&no_star, "foo.com").as_deref(), Some("prefix"));
    }

    #[test]
    fn the_port_is_stripped_only_when_the_route_configuration_ignores_it() {
        let mut rc = RouteConfiguration {
            virtual_hosts: vec![vh("exact", &["a.example.com"])],
            ..Default::default()
        };
        assert_eq!(picked(&rc, "a.example.com:80"), None);
        rc.ignore_port_in_host_matching = true;
        assert_eq!(picked(&rc, "a.example.com:80").as_deref(), Some("exact"));
        assert_eq!(without_port("[::1]:80"), "::1");
        assert_eq!(without_port("::1"), "::1");
        assert_eq!(without_port("host"), "host");
    }

    #[test]
    fn routes_by_path_in_order() {
        let mut host = vh("h", &["*"]);
        host.routes = vec![
            to("exact", PathSpecifier::Path("/exact".into())),
            to("sep", PathSpecifier::PathSeparatedPrefix("/api".into())),
            to(
                "regex",
                PathSpecifier::SafeRegex(RegexMatcher {
                    regex: "/v[0-9]+".into(),
                    ..Default::default()
                }),
            ),
            to("root", PathSpecifier::Prefix("/".into())),
        ];
        let name = |path| route(&host, path, "t").unwrap().map(|r| r.name.clone());
        assert_eq!(name("/exact").as_deref(), Some("exact"));
        assert_eq!(name("/exact/more").as_deref(), Some("root"));
        assert_eq!(name("/api").as_deref(), Some("sep"));
        assert_eq!(name("/api/v1").as_deref(), Some("sep"));
        assert_eq!(
            name("/apis").as_deref(),
            Some("root"),
            "a path-separated prefix matches whole segments"
        );
        assert_eq!(name("/v12").as_deref(), Some("regex"));
        assert_eq!(
            name("/v12/x").as_deref(),
            Some("root"),
            "a regex matches the whole path"
        );
        host.routes.pop();
        assert!(route(&host, "/other", "t").unwrap().is_none());

        host.routes = vec![to(
            "bad",
            PathSpecifier::SafeRegex(RegexMatcher {
                regex: "(".into(),
                ..Default::default()
            }),
        )];
        let e = route(&host, "/", "vh").unwrap_err();
        assert!(e.to_string().contains("invalid regular expression"), "{e}");
        host.routes = vec![Route::default()];
        assert!(matches!(
            route(&host, "/", "vh"),
            Err(SimulateError::PathMatcher { .. })
        ));
    }

    #[test]
    fn route_table_keeps_single_clusters_sorted_and_the_later_host_wins() {
        let mut a = vh("a", &["a", "shared"]);
        a.routes = vec![
            to("z", PathSpecifier::Prefix("/z".into())),
            to("b", PathSpecifier::Prefix("/".into())),
            Route {
                action: Some(route::Action::Route(RouteAction {
                    cluster_specifier: Some(ClusterSpecifier::WeightedClusters(
                        WeightedCluster::default(),
                    )),
                    ..Default::default()
                })),
                ..Default::default()
            },
            Route {
                action: Some(route::Action::Redirect(RedirectAction::default())),
                ..Default::default()
            },
        ];
        let mut later = vh("later", &["shared"]);
        later.routes = vec![to("c", PathSpecifier::Prefix("/".into()))];
        let rc = RouteConfiguration {
            virtual_hosts: vec![a, later, vh("empty", &["e"])],
            ..Default::default()
        };
        let table = route_table(&rc);
        assert_eq!(table["a"], ["b", "z"]);
        assert_eq!(table["shared"], ["c"]);
        assert!(table["e"].is_empty());
    }
}
