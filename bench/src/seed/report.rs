//! `--html`: the seed's report as one self-contained page (inline SVG, no script, nothing
//! fetched), drawn from the JSON summary alone: each scenario against its goal, the latency
//! distributions, and PASA against the baselines.

use std::fmt::Write as _;

use serde_json::Value;

/// Colours of the series, in order.
const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// The goals table, row by row: scenario, what, where the measured figure is in the summary
/// (several are summed), where its goal is, and the unit. Lower is better everywhere.
const GOALS: [(&str, &str, &[&str], &str, &str); 17] = [
    (
        "S1",
        "load + every snapshot",
        &["/s1/total_s"],
        "/s1/goal/total_s",
        "s",
    ),
    (
        "S1",
        "store peak RSS",
        &["/s1/peak_rss_mib"],
        "/s1/goal/peak_rss_mib",
        "MiB",
    ),
    (
        "S2",
        "the DestinationRule batch: to the last subscriber",
        &["/s2/last_subscriber_ms/max"],
        "/s2/goal/max_ms",
        "ms",
    ),
    (
        "S2",
        "wrong + missed wake-ups",
        &["/s2/wrong", "/s2/missed"],
        "/s2/goal/wrong",
        "",
    ),
    (
        "S3",
        "churn: commit → subscriber p99",
        &["/s3/commit_to_subscriber_ms/churn/p99"],
        "/s3/goal/commit_to_subscriber_p99_ms",
        "ms",
    ),
    (
        "S3",
        "burst: commit → subscriber p99",
        &["/s3/commit_to_subscriber_ms/burst/p99"],
        "/s3/goal/commit_to_subscriber_p99_ms",
        "ms",
    ),
    (
        "S4",
        "VS change: write → client holds it, p99",
        &["/s4/write_to_client_ms/p99"],
        "/s4/goal/p99_ms",
        "ms",
    ),
    (
        "S5",
        "mesh-wide change: to all",
        &["/s5/last_subscriber_ms/max"],
        "/s5/goal/max_ms",
        "ms",
    ),
    (
        "S6",
        "restart: all resumed",
        &["/s6/converge_s"],
        "/s6/goal/converge_s",
        "s",
    ),
    (
        "S6",
        "peak RSS over steady",
        &["/s6/peak_over_steady"],
        "/s6/goal/peak_over_steady",
        "×",
    ),
    (
        "A1",
        "full translation p99",
        &["/a1/full_ms/p99"],
        "/a1/goal/full_ms",
        "ms",
    ),
    (
        "A1",
        "DR change p99",
        &["/a1/change_ms/destination_rule/p99"],
        "/a1/goal/change_ms",
        "ms",
    ),
    (
        "A1",
        "VS change p99",
        &["/a1/change_ms/virtual_service/p99"],
        "/a1/goal/change_ms",
        "ms",
    ),
    (
        "A1",
        "endpoint change p99",
        &["/a1/change_ms/endpoints/p99"],
        "/a1/goal/change_ms",
        "ms",
    ),
    (
        "A1",
        "agent RSS peak while it starts",
        &["/a1/process/rss_peak_start_mib"],
        "/a1/goal/rss_mib",
        "MiB",
    ),
    (
        "A1",
        "agent RSS peak while changes come",
        &["/a1/process/rss_peak_changes_mib"],
        "/a1/goal/rss_mib",
        "MiB",
    ),
    (
        "A1",
        "agent idle CPU",
        &["/a1/process/cpu_idle_percent"],
        "/a1/goal/idle_cpu_percent",
        "%",
    ),
];

fn goals_table(out: &mut String, s: &Value) {
    out.push_str("<table><tr><th>id</th><th>what</th><th>measured</th><th>goal</th><th></th></tr>");
    for (id, what, measured, goal, unit) in GOALS {
        let measured: Option<f64> = measured.iter().map(|p| s.pointer(p).and_then(num)).sum();
        let goal = s.pointer(goal).and_then(num);
        let (value, verdict) = match (measured, goal) {
            (Some(m), Some(g)) => (
                format!("{m:.2} {unit}"),
                if m <= g {
                    "<td class=ok>met</td>"
                } else {
                    "<td class=no>missed</td>"
                },
            ),
            _ => ("not run".into(), "<td></td>"),
        };
        let goal = goal.map_or("?".into(), |g| format!("≤ {g} {unit}"));
        let _ = write!(
            out,
            "<tr><td>{id}</td><td>{}</td><td>{}</td><td>{goal}</td>{verdict}</tr>",
            esc(what),
            esc(&value),
        );
    }
    out.push_str("</table>");
}

/// A CDF chart of several distributions (101 percentiles each, in ms), log-scaled in x.
fn cdf_chart(out: &mut String, title: &str, series: &[(&str, &Value)]) {
    let series: Vec<(&str, Vec<f64>)> = series
        .iter()
        .filter_map(|(name, v)| {
            let points: Vec<f64> = v.as_array()?.iter().filter_map(Value::as_f64).collect();
            (points.len() == 101).then_some((*name, points))
        })
        .collect();
    if series.is_empty() {
        return;
    }
    let (w, h, left, bottom) = (720.0, 300.0, 60.0, 40.0);
    let lo = series
        .iter()
        .flat_map(|(_, p)| p.iter().copied())
        .filter(|x| *x > 0.0)
        .fold(f64::INFINITY, f64::min)
        .max(0.01);
    let hi = series
        .iter()
        .flat_map(|(_, p)| p.iter().copied())
        .fold(0.0, f64::max)
        .max(lo * 10.0);
    let (l0, l1) = (lo.log10().floor(), hi.log10().ceil());
    // A point at 0 ms is drawn at the axis (the first decade), as are decades' lines.
    let floor = 10f64.powf(l0);
    let x = |ms: f64| left + (ms.max(floor).log10() - l0) / (l1 - l0) * (w - left - 20.0);
    let y = |pct: f64| 10.0 + (1.0 - pct / 100.0) * (h - bottom - 10.0);
    let _ = write!(
        out,
        "<h3>{}</h3><svg viewBox='0 0 {w} {h}' width='{w}' height='{h}' role='img'>",
        esc(title)
    );
    for decade in (l0 as i32)..=(l1 as i32) {
        let ms = 10f64.powi(decade);
        let (at, axis, label_y) = (x(ms), h - bottom, h - bottom + 15.0);
        let label = if ms >= 1.0 {
            format!("{ms:.0} ms")
        } else {
            format!("{ms} ms")
        };
        // Centred under its line; the last one ends at it, inside the chart.
        let anchor = if decade == l1 as i32 { "end" } else { "middle" };
        let _ = write!(
            out,
            "<line x1='{at:.1}' x2='{at:.1}' y1='10' y2='{axis}' class='grid'/><text x='{at:.1}' \
             y='{label_y}' class='axis' text-anchor='{anchor}'>{label}</text>"
        );
    }
    // p100 has its line but no label: it is too close to p99's to read.
    for pct in [0.0, 50.0, 90.0, 99.0, 100.0] {
        let (right, at, label_x) = (w - 20.0, y(pct), left - 5.0);
        let _ = write!(
            out,
            "<line x1='{left}' x2='{right}' y1='{at:.1}' y2='{at:.1}' class='grid'/>"
        );
        if pct < 100.0 {
            let _ = write!(
                out,
                "<text x='{label_x}' y='{:.1}' class='axis' text-anchor='end'>p{pct}</text>",
                at + 4.0
            );
        }
    }
    for (i, (name, points)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = points
            .iter()
            .enumerate()
            .map(|(p, ms)| format!("{:.1},{:.1}", x(*ms), y(p as f64)))
            .collect();
        let _ = write!(
            out,
            "<polyline fill=none stroke='{colour}' stroke-width=2 points='{}'/><text x='{}' \
             y='{}' fill='{colour}'>{}</text>",
            path.join(" "),
            left + 10.0,
            25.0 + 16.0 * i as f64,
            esc(name)
        );
    }
    out.push_str("</svg>");
}

/// Horizontal bars on a log scale: (label, value, unit, PASA or not).
fn bars(out: &mut String, title: &str, rows: &[(String, Option<f64>, &str, bool)]) {
    let rows: Vec<_> = rows
        .iter()
        .filter_map(|(l, v, u, p)| Some((l, (*v)?, *u, *p)))
        .filter(|(_, v, _, _)| *v > 0.0)
        .collect();
    if rows.is_empty() {
        return;
    }
    let (w, row_h, left) = (720.0, 28.0, 300.0);
    let h = row_h * rows.len() as f64 + 20.0;
    let lo = rows.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
    let hi = rows.iter().map(|r| r.1).fold(0.0, f64::max);
    let (l0, l1) = (
        (lo.log10() - 0.3).floor(),
        hi.log10().ceil().max(lo.log10() + 1.0),
    );
    let len = |v: f64| (v.log10() - l0) / (l1 - l0) * (w - left - 110.0);
    let _ = write!(
        out,
        "<h3>{}</h3><svg viewBox='0 0 {w} {h}' width='{w}' height='{h}' role='img'>",
        esc(title)
    );
    for (i, (label, value, unit, pasa)) in rows.iter().enumerate() {
        let top = 10.0 + row_h * i as f64;
        let colour = if *pasa { COLOURS[0] } else { "#999" };
        let _ = write!(
            out,
            "<text x='{}' y='{:.1}' text-anchor=end>{}</text><rect x='{left}' y='{top:.1}' \
             width='{:.1}' height='{}' fill='{colour}'/><text x='{:.1}' y='{:.1}'>{} {}</text>",
            left - 8.0,
            top + 17.0,
            esc(label),
            len(*value).max(2.0),
            row_h - 8.0,
            left + len(*value).max(2.0) + 6.0,
            top + 17.0,
            pretty(*value),
            unit
        );
    }
    out.push_str("</svg><p class=note>Log scale. Blue: PASA here (measured, or composed from measured parts where the label says so); grey: baselines.</p>");
}

fn pretty(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The whole page.
pub fn html(s: &Value) -> String {
    let mut out = String::new();
    out.push_str(
        "<!doctype html><html><head><meta charset=utf-8><title>PASA seed report</title><style>\
         body{font-family:system-ui,sans-serif;max-width:780px;margin:2em auto;color:#222}\
         table{border-collapse:collapse}td,th{padding:3px 10px;border-bottom:1px solid #ddd;\
         text-align:left}.ok{color:#2ca02c}.no{color:#d62728;font-weight:bold}\
         .grid{stroke:#eee}.axis{font-size:11px;fill:#666}svg text{font-size:12px}\
         .note{color:#666;font-size:13px}</style></head><body>",
    );
    let p = &s["parameters"];
    let clusters = match (p["clusters"].as_u64(), p["networks"].as_u64()) {
        (Some(n), Some(m)) if n > 1 && m > 1 => format!(" in {n} clusters on {m} networks"),
        (Some(n), _) if n > 1 => format!(" in {n} clusters"),
        _ => String::new(),
    };
    let _ = write!(
        out,
        "<h1>PASA seed: {} services, {} pods{}</h1><p class=note>commit {}, seed {}; {} cores, \
         {} GiB. Every figure is in the JSON report this page was drawn from.</p>",
        p["services"],
        p["pods"],
        esc(&clusters),
        esc(s["commit"].as_str().unwrap_or("unknown")),
        p["seed"],
        s["machine"]["cores"],
        s["machine"]["memory_gib"]
    );
    out.push_str("<h2>Scenarios against their goals</h2>");
    goals_table(&mut out, s);
    out.push_str("<h2>Latency distributions</h2>");
    let batch_label = format!(
        "S2: {} DestinationRules, to each subscriber's last event",
        p["batch"]
    );
    let (churn_label, burst_label) = (
        format!("{} changes/s", p["churn_rate"]),
        format!("{} at once", p["burst"]),
    );
    cdf_chart(
        &mut out,
        "Store delivery: from the write to each affected subscriber",
        &[
            (batch_label.as_str(), &s["s2"]["cdf_ms"]),
            ("S5: mesh-wide PeerAuthentication", &s["s5"]["cdf_ms"]),
        ],
    );
    cdf_chart(
        &mut out,
        "S3: endpoint churn, commit → subscriber, per event",
        &[
            (
                churn_label.as_str(),
                &s["s3"]["commit_to_subscriber_ms"]["churn"]["cdf"],
            ),
            (
                burst_label.as_str(),
                &s["s3"]["commit_to_subscriber_ms"]["burst"]["cdf"],
            ),
        ],
    );
    cdf_chart(
        &mut out,
        "S4: one VirtualService change, write → each real agent's client holds the new route",
        &[("real agents", &s["s4"]["write_to_client_ms"]["cdf"])],
    );
    out.push_str("<h2>PASA against the baselines</h2>");
    let b = &s["baselines"];
    let q = &b["quoted"]["article_2000_services_100k_pods_500_drs"];
    bars(
        &mut out,
        &format!("S2 push completion ({} DestinationRules)", p["batch"]),
        &[
            (
                "PASA here (composed: delivery + translation)".into(),
                num(&s["s2_push_completion"]["push_completion_ms"]).map(|m| m / 1e3),
                "s",
                true,
            ),
            (
                "central push here (extrapolated)".into(),
                num(&b["central_push"]["wall_s_on_this_machine"]),
                "s",
                false,
            ),
            (
                "istiod (article)".into(),
                num(&q["istiod"]["push_completion_s"]),
                "s",
                false,
            ),
            (
                "PASA (article)".into(),
                num(&q["pasa"]["push_completion_s"]),
                "s",
                false,
            ),
        ],
    );
    bars(
        &mut out,
        "Control-plane memory",
        &[
            (
                format!(
                    "PASA store here, {} subscribers (the agents not counted)",
                    p["pods"]
                ),
                num(&s["s1"]["peak_rss_mib"]).map(|m| m / 1024.0),
                "GiB",
                true,
            ),
            (
                "istiod (article)".into(),
                num(&q["istiod"]["control_plane_memory_gib"]),
                "GiB",
                false,
            ),
            (
                "PASA (article)".into(),
                num(&q["pasa"]["control_plane_memory_gib"]),
                "GiB",
                false,
            ),
            (
                "istiod at 20k–30k sidecars (published)".into(),
                b["quoted"]["istiod_at_20k_to_30k_sidecars_memory_gb"][1]
                    .as_f64()
                    .map(|gb| gb * 1e9 / 1024f64.powi(3)),
                "GiB",
                false,
            ),
        ],
    );
    bars(
        &mut out,
        "Matching the S2 batch against every watcher",
        &[
            (
                "rule index".into(),
                num(&b["brute_force"]["index_ms"]),
                "ms",
                true,
            ),
            (
                "brute force".into(),
                num(&b["brute_force"]["brute_force_ms"]),
                "ms",
                false,
            ),
        ],
    );
    out.push_str(
        "<p class=note>Measured: S1–S6 on the real store through its watch code (S4 and A1 with \
         real pasa-agent processes over loopback gRPC). Composed: S2's push completion = the \
         store's delivery to the last subscriber + A1's translation of a DestinationRule change \
         (each agent translates on its own pod). Extrapolated: the central push, from sampled \
         full translations. Quoted: the article's and published figures.</p></body></html>",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The x position and text of each axis label of a chart, in order.
    fn axis_labels(svg: &str) -> Vec<(f64, String)> {
        svg.split("<text x='")
            .skip(1)
            .filter(|t| t.contains("class='axis'"))
            .map(|t| {
                let x = t[..t.find('\'').unwrap()].parse().unwrap();
                let text = &t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()];
                (x, text.to_string())
            })
            .collect()
    }

    /// Decades below the fastest point sit at their own place on the axis (not all at the
    /// fastest point, over the next decade's label), the last decade's label ends inside the
    /// chart, and only one label is drawn at the top (p99; p100 is too close to it).
    #[test]
    fn axis_labels_neither_overlap_nor_leave_the_chart() {
        let cdf: Vec<f64> = (0..=100).map(|p| 0.65 + f64::from(p) * 0.2).collect();
        let mut out = String::new();
        cdf_chart(&mut out, "t", &[("s", &serde_json::json!(cdf))]);
        let labels = axis_labels(&out);
        let decade = |text: &str| labels.iter().find(|(_, t)| t == text).map(|(x, _)| *x);
        let (tenth, one) = (decade("0.1 ms").unwrap(), decade("1 ms").unwrap());
        assert!(one - tenth > 100.0, "{labels:?}");
        assert!(out.contains("text-anchor='end'>100 ms</text>"), "{out}");
        let percentiles: Vec<&str> = labels
            .iter()
            .map(|(_, t)| t.as_str())
            .filter(|t| t.starts_with('p'))
            .collect();
        assert_eq!(percentiles, ["p0", "p50", "p90", "p99"]);
    }

    #[test]
    fn the_page_draws_what_the_summary_holds_and_escapes_it() {
        let cdf: Vec<f64> = (0..=100).map(|p| 1.0 + f64::from(p)).collect();
        let summary = serde_json::json!({
            "parameters": {"services": 20, "pods": 200, "seed": 1},
            "commit": "<abc>", "machine": {"cores": 2, "memory_gib": 8},
            "s1": {"total_s": 3.0, "peak_rss_mib": 100.0},
            "s2": {"last_subscriber_ms": {"max": 3000.0}, "wrong": 0, "missed": 0, "cdf_ms": cdf,
                   "goal": {"max_ms": 2000, "wrong": 0, "missed": 0}},
            "baselines": {"brute_force": {"index_ms": 1.0, "brute_force_ms": 50.0}},
        });
        let page = html(&summary);
        assert!(page.starts_with("<!doctype html>") && page.ends_with("</html>"));
        assert!(page.contains("&lt;abc&gt;") && !page.contains("<abc>"));
        assert!(page.contains("<polyline"), "the S2 distribution is drawn");
        // An unquoted attribute value before `/>` would take the slash: the line would not
        // close, and the chart would be drawn inside it, that is, not at all.
        assert!(
            !regex_like_unquoted_self_close(&page),
            "every self-closed element's last attribute is quoted"
        );
        assert!(
            page.contains("class=no>missed"),
            "S2's 3 s misses its 2 s goal"
        );
        assert!(page.contains("not run"), "A1 absent");
        assert!(page.contains("brute force"));
    }

    /// Whether `page` holds `=value/>` with `value` unquoted.
    fn regex_like_unquoted_self_close(page: &str) -> bool {
        page.match_indices("/>").any(|(at, _)| {
            let before = &page[..at];
            let word = before.trim_end_matches(|c: char| c.is_ascii_alphanumeric() || c == '-');
            word.len() < before.len() && word.ends_with('=')
        })
    }
}
