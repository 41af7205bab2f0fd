//! Steps 2 and 3 of the walk: the listener filters that decide what the filter chain match sees,
//! and the filter chain match.
//!
//! The chains are narrowed criterion by criterion: destination port, destination prefix ranges
//! (longest prefix wins), server names (exact name first, then the longest wildcard), transport
//! protocol, application protocols. A criterion no remaining chain sets is skipped. When some
//! chains set it but none matches, the chains that leave it unset survive: an unset criterion is a
//! fallback, not a wildcard competing with specific matches.

use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
use envoy_types::pb::envoy::config::listener::v3::listener_filter_chain_match_predicate::Rule;
use envoy_types::pb::envoy::config::listener::v3::{
    FilterChain, FilterChainMatch, Listener, ListenerFilterChainMatchPredicate, listener_filter,
};
use envoy_types::pb::envoy::extensions::filters::listener::http_inspector::v3::HttpInspector;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;

use super::{SimulateError, TlsMode, TrafficError, unpack};

/// The listener filters the walk cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Inspector {
    /// Reads SNI and ALPN from a TLS handshake, and tells TLS from raw bytes.
    Tls,
    /// Tells HTTP/1.1 from HTTP/2 in plaintext.
    Http,
}

impl Inspector {
    fn filter_name(self) -> &'static str {
        match self {
            Inspector::Tls => "envoy.filters.listener.tls_inspector",
            Inspector::Http => "envoy.filters.listener.http_inspector",
        }
    }
}

/// Whether the listener has `inspector` (by typed config or by name) and it is not disabled for
/// `port`.
pub(super) fn inspector_active(
    listener: &Listener,
    inspector: Inspector,
    port: u16,
    at: &str,
) -> Result<bool, SimulateError> {
    for (i, f) in listener.listener_filters.iter().enumerate() {
        let by_config = match &f.config_type {
            Some(listener_filter::ConfigType::TypedConfig(any)) => {
                let at = format!("{at}, listener filter {i} ({:?})", f.name);
                match inspector {
                    Inspector::Tls => unpack::<TlsInspector>(any, &at)?.is_some(),
                    Inspector::Http => unpack::<HttpInspector>(any, &at)?.is_some(),
                }
            }
            _ => false,
        };
        if by_config || f.name == inspector.filter_name() {
            return Ok(f
                .filter_disabled
                .as_ref()
                .is_none_or(|disabled| !predicate_matches(disabled, port)));
        }
    }
    Ok(false)
}

/// Evaluates a listener filter's disable predicate against a destination port.
fn predicate_matches(p: &ListenerFilterChainMatchPredicate, port: u16) -> bool {
    match &p.rule {
        Some(Rule::OrMatch(set)) => set.rules.iter().any(|r| predicate_matches(r, port)),
        Some(Rule::AndMatch(set)) => set.rules.iter().all(|r| predicate_matches(r, port)),
        Some(Rule::NotMatch(inner)) => !predicate_matches(inner, port),
        Some(Rule::AnyMatch(any)) => *any,
        Some(Rule::DestinationPortRange(range)) => {
            let port = i32::from(port);
            range.start <= port && port < range.end
        }
        None => false,
    }
}

/// The listener's socket address and port, if it has one.
pub(super) fn socket_address(listener: &Listener) -> Option<(&str, u32)> {
    match listener.address.as_ref()?.address.as_ref()? {
        address::Address::SocketAddress(sa) => match sa.port_specifier {
            Some(socket_address::PortSpecifier::PortValue(port)) => {
                Some((sa.address.as_str(), port))
            }
            _ => None,
        },
        _ => None,
    }
}

/// What the filter chain match sees of a connection, after the listener filters.
#[derive(Debug, Clone)]
pub(super) struct Traffic<'a> {
    pub port: u16,
    pub ip: IpAddr,
    pub sni: &'a str,
    pub tls: TlsMode,
    /// The ALPN as the listener filters left it.
    pub alpn: &'a str,
    pub tls_inspector: bool,
}

/// The filter chain `traffic` lands on, or why there is none.
pub(super) fn select<'l>(
    listener: &'l Listener,
    traffic: &Traffic<'_>,
    at: &str,
) -> Result<Result<&'l FilterChain, TrafficError>, SimulateError> {
    let port = u32::from(traffic.port);
    let mut chains: Vec<&FilterChain> = listener.filter_chains.iter().collect();
    chains = narrow(
        chains,
        |m| m.destination_port.is_some(),
        |m| {
            let matched = m.destination_port.as_ref().is_some_and(|p| p.value == port);
            Ok(matched.then_some(0))
        },
    )?;
    chains = narrow(
        chains,
        |m| !m.prefix_ranges.is_empty(),
        |m| longest_prefix(m, traffic.ip, at),
    )?;
    chains = narrow(
        chains,
        |m| !m.server_names.is_empty(),
        |m| Ok(server_name_rank(&m.server_names, traffic.sni)),
    )?;
    chains = narrow(
        chains,
        |m| !m.transport_protocol.is_empty(),
        |m| Ok(transport_matches(&m.transport_protocol, traffic).then_some(0)),
    )?;
    chains = narrow(
        chains,
        |m| !m.application_protocols.is_empty(),
        |m| {
            let offered = m.application_protocols.iter().any(|p| p == traffic.alpn);
            Ok(offered.then_some(0))
        },
    )?;
    Ok(match chains.as_slice() {
        [one] => Ok(*one),
        [] => listener
            .default_filter_chain
            .as_ref()
            .ok_or(TrafficError::NoFilterChain),
        _ => Err(TrafficError::MultipleFilterChain),
    })
}

fn criteria<'a>(fc: &'a FilterChain, unset: &'a FilterChainMatch) -> &'a FilterChainMatch {
    fc.filter_chain_match.as_ref().unwrap_or(unset)
}

/// One narrowing step: among the chains that set the criterion, those matching with the best rank
/// survive; if none matches, the chains that do not set it.
fn narrow(
    chains: Vec<&FilterChain>,
    is_set: impl Fn(&FilterChainMatch) -> bool,
    rank: impl Fn(&FilterChainMatch) -> Result<Option<u32>, SimulateError>,
) -> Result<Vec<&FilterChain>, SimulateError> {
    let unset = FilterChainMatch::default();
    if !chains.iter().any(|fc| is_set(criteria(fc, &unset))) {
        return Ok(chains);
    }
    let mut best: Option<u32> = None;
    let mut kept = Vec::new();
    for fc in &chains {
        let m = criteria(fc, &unset);
        if !is_set(m) {
            continue;
        }
        let Some(r) = rank(m)? else {
            continue;
        };
        match best {
            Some(b) if r < b => {}
            Some(b) if r == b => kept.push(*fc),
            _ => {
                best = Some(r);
                kept = vec![*fc];
            }
        }
    }
    if kept.is_empty() {
        kept = chains
            .into_iter()
            .filter(|fc| !is_set(criteria(fc, &unset)))
            .collect();
    }
    Ok(kept)
}

/// The longest prefix among the chain's ranges that contains `ip`.
fn longest_prefix(
    m: &FilterChainMatch,
    ip: IpAddr,
    at: &str,
) -> Result<Option<u32>, SimulateError> {
    let mut best = None;
    for range in &m.prefix_ranges {
        let len = range.prefix_len.as_ref().map_or(0, |l| l.value);
        let invalid = || SimulateError::Cidr {
            at: at.to_string(),
            prefix: range.address_prefix.clone(),
            len,
        };
        let prefix: IpAddr = range.address_prefix.parse().map_err(|_| invalid())?;
        let (p, width) = bits(prefix);
        if len > width {
            return Err(invalid());
        }
        let (a, family) = bits(ip);
        let contains = width == family && (len == 0 || (p ^ a) >> (width - len) == 0);
        if contains && best.is_none_or(|b| len > b) {
            best = Some(len);
        }
    }
    Ok(best)
}

fn bits(ip: IpAddr) -> (u128, u32) {
    match ip {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    }
}

/// Exact SNI equality ranks above every wildcard; a wildcard (`*.example.com`, `*`) that covers
/// the SNI ranks by its length.
fn server_name_rank(names: &[String], sni: &str) -> Option<u32> {
    names
        .iter()
        .filter_map(|name| {
            if name == sni {
                Some(u32::MAX)
            } else {
                let suffix = name.strip_prefix('*')?;
                let len = u32::try_from(name.len()).unwrap_or(u32::MAX - 1);
                sni.ends_with(suffix).then_some(len.min(u32::MAX - 1))
            }
        })
        .max()
}

/// `tls` matches TLS and mTLS, `raw_buffer` plaintext; without a TLS inspector every connection
/// is raw.
fn transport_matches(protocol: &str, traffic: &Traffic<'_>) -> bool {
    match protocol {
        "raw_buffer" => !traffic.tls_inspector || traffic.tls == TlsMode::Plaintext,
        "tls" => traffic.tls_inspector && traffic.tls != TlsMode::Plaintext,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::CidrRange;
    use envoy_types::pb::envoy::config::listener::v3::ListenerFilter;
    use envoy_types::pb::envoy::config::listener::v3::listener_filter_chain_match_predicate::MatchSet;
    use envoy_types::pb::envoy::r#type::v3::Int32Range;
    use envoy_types::pb::google::protobuf::UInt32Value;
    use envoy_types::util::pack_any;

    use super::*;

    fn chain(name: &str, m: FilterChainMatch) -> FilterChain {
        FilterChain {
            name: name.into(),
            filter_chain_match: Some(m),
            ..Default::default()
        }
    }

    fn listener(chains: Vec<FilterChain>) -> Listener {
        Listener {
            name: "l".into(),
            filter_chains: chains,
            ..Default::default()
        }
    }

    fn traffic(port: u16, ip: &str) -> Traffic<'static> {
        Traffic {
            port,
            ip: ip.parse().unwrap(),
            sni: "",
            tls: TlsMode::Plaintext,
            alpn: "",
            tls_inspector: true,
        }
    }

    fn picked(l: &Listener, t: &Traffic<'_>) -> Result<String, TrafficError> {
        select(l, t, "test").unwrap().map(|fc| fc.name.clone())
    }

    fn port(p: u32) -> Option<UInt32Value> {
        Some(UInt32Value { value: p })
    }

    fn cidr(prefix: &str, len: u32) -> CidrRange {
        CidrRange {
            address_prefix: prefix.into(),
            prefix_len: Some(UInt32Value { value: len }),
        }
    }

    #[test]
    fn destination_port_then_fallback_to_chains_without_one() {
        let l = listener(vec![
            chain(
                "80",
                FilterChainMatch {
                    destination_port: port(80),
                    ..Default::default()
                },
            ),
            chain("any", FilterChainMatch::default()),
        ]);
        assert_eq!(picked(&l, &traffic(80, "1.2.3.4")), Ok("80".into()));
        assert_eq!(picked(&l, &traffic(81, "1.2.3.4")), Ok("any".into()));
    }

    #[test]
    fn longest_prefix_wins_and_families_do_not_mix() {
        let l = listener(vec![
            chain(
                "wide",
                FilterChainMatch {
                    prefix_ranges: vec![cidr("10.0.0.0", 8)],
                    ..Default::default()
                },
            ),
            chain(
                "narrow",
                FilterChainMatch {
                    prefix_ranges: vec![cidr("10.1.0.0", 16), cidr("::", 0)],
                    ..Default::default()
                },
            ),
        ]);
        assert_eq!(picked(&l, &traffic(1, "10.1.2.3")), Ok("narrow".into()));
        assert_eq!(picked(&l, &traffic(1, "10.2.2.3")), Ok("wide".into()));
        assert_eq!(picked(&l, &traffic(1, "::1")), Ok("narrow".into()));
        assert_eq!(
            picked(&l, &traffic(1, "11.0.0.1")),
            Err(TrafficError::NoFilterChain)
        );
        let bad = listener(vec![chain(
            "bad",
            FilterChainMatch {
                prefix_ranges: vec![cidr("10.0.0.0", 33)],
                ..Default::default()
            },
        )]);
        let e = select(&bad, &traffic(1, "10.0.0.1"), "listener \"l\"").unwrap_err();
        assert!(e.to_string().contains("10.0.0.0/33"), "{e}");
    }

    #[test]
    fn exact_server_name_beats_wildcards_and_longer_wildcards_win() {
        let names = |n: &[&str]| FilterChainMatch {
            server_names: n.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let l = listener(vec![
            chain("star", names(&["*"])),
            chain("wild", names(&["*.example.com"])),
            chain("exact", names(&["a.example.com"])),
        ]);
        let with_sni = |sni: &'static str| Traffic {
            sni,
            ..traffic(443, "1.1.1.1")
        };
        assert_eq!(picked(&l, &with_sni("a.example.com")), Ok("exact".into()));
        assert_eq!(picked(&l, &with_sni("b.example.com")), Ok("wild".into()));
        assert_eq!(picked(&l, &with_sni("other.org")), Ok("star".into()));
    }

    #[test]
    fn transport_protocol_needs_the_tls_inspector() {
        let tp = |p: &str| FilterChainMatch {
            transport_protocol: p.into(),
            ..Default::default()
        };
        let l = listener(vec![
            chain("tls", tp("tls")),
            chain("raw", tp("raw_buffer")),
        ]);
        let tls = Traffic {
            tls: TlsMode::Tls,
            ..traffic(443, "1.1.1.1")
        };
        assert_eq!(picked(&l, &tls), Ok("tls".into()));
        assert_eq!(picked(&l, &traffic(443, "1.1.1.1")), Ok("raw".into()));
        let blind = Traffic {
            tls_inspector: false,
            ..tls
        };
        assert_eq!(picked(&l, &blind), Ok("raw".into()));
    }

    #[test]
    fn application_protocols_multiple_chains_and_the_default_chain() {
        let alpn = |p: &[&str]| FilterChainMatch {
            application_protocols: p.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let mut l = listener(vec![
            chain("h1", alpn(&["http/1.1"])),
            chain("h2", alpn(&["h2c", "h2"])),
        ]);
        let with = |alpn: &'static str| Traffic {
            alpn,
            ..traffic(80, "1.1.1.1")
        };
        assert_eq!(picked(&l, &with("h2c")), Ok("h2".into()));
        assert_eq!(picked(&l, &with("")), Err(TrafficError::NoFilterChain));
        l.default_filter_chain = Some(chain("default", FilterChainMatch::default()));
        assert_eq!(picked(&l, &with("")), Ok("default".into()));
        l.filter_chains.push(chain("h1-again", alpn(&["http/1.1"])));
        assert_eq!(
            picked(&l, &with("http/1.1")),
            Err(TrafficError::MultipleFilterChain)
        );
    }

    #[test]
    fn chains_without_any_match_compete_when_nothing_is_set() {
        let l = listener(vec![
            FilterChain {
                name: "a".into(),
                ..Default::default()
            },
            FilterChain {
                name: "b".into(),
                ..Default::default()
            },
        ]);
        assert_eq!(
            picked(&l, &traffic(1, "1.1.1.1")),
            Err(TrafficError::MultipleFilterChain)
        );
    }

    #[test]
    fn inspectors_by_config_or_name_and_their_disable_predicates() {
        let range = |start, end| ListenerFilterChainMatchPredicate {
            rule: Some(Rule::DestinationPortRange(Int32Range { start, end })),
        };
        let disabled = ListenerFilterChainMatchPredicate {
            rule: Some(Rule::OrMatch(MatchSet {
                rules: vec![range(80, 81), range(8080, 8081)],
            })),
        };
        let l = Listener {
            listener_filters: vec![
                ListenerFilter {
                    name: "tls".into(),
                    config_type: Some(listener_filter::ConfigType::TypedConfig(pack_any(
                        TlsInspector::default(),
                    ))),
                    filter_disabled: Some(disabled.clone()),
                },
                ListenerFilter {
                    name: "envoy.filters.listener.http_inspector".into(),
                    filter_disabled: Some(ListenerFilterChainMatchPredicate {
                        rule: Some(Rule::NotMatch(Box::new(range(80, 81)))),
                    }),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let active = |i, p| inspector_active(&l, i, p, "l").unwrap();
        assert!(!active(Inspector::Tls, 80));
        assert!(!active(Inspector::Tls, 8080));
        assert!(active(Inspector::Tls, 443));
        assert!(active(Inspector::Http, 80));
        assert!(!active(Inspector::Http, 81));
        assert!(!inspector_active(&listener(vec![]), Inspector::Tls, 80, "l").unwrap());
        let and = ListenerFilterChainMatchPredicate {
            rule: Some(Rule::AndMatch(MatchSet {
                rules: vec![range(1, 100), range(50, 200)],
            })),
        };
        assert!(predicate_matches(&and, 60));
        assert!(!predicate_matches(&and, 20));
        let any = ListenerFilterChainMatchPredicate {
            rule: Some(Rule::AnyMatch(true)),
        };
        assert!(predicate_matches(&any, 1));
    }
}
