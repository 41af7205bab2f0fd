//! Validation of `Telemetry`, following istiod's webhook and the CRD schema: what it attaches to,
//! provider references, tracing (sampling, custom tags), metric overrides, and access log filters
//! (CEL expressions, parsed as istiod parses them).

use pasa_istio::telemetry::{AccessLogging, Metrics, ProviderRef, Telemetry, Tracing};
use pasa_proto::Object;

use super::common::{attachment, validate_enum};
use super::{Path, Report, parse};

/// Which side of the traffic a setting is for.
const MODES: [&str; 3] = ["CLIENT_AND_SERVER", "CLIENT", "SERVER"];

/// Istio's standard metrics.
const METRICS: [&str; 11] = [
    "ALL_METRICS",
    "REQUEST_COUNT",
    "REQUEST_DURATION",
    "REQUEST_SIZE",
    "RESPONSE_SIZE",
    "TCP_OPENED_CONNECTIONS",
    "TCP_CLOSED_CONNECTIONS",
    "TCP_SENT_BYTES",
    "TCP_RECEIVED_BYTES",
    "GRPC_REQUEST_MESSAGES",
    "GRPC_RESPONSE_MESSAGES",
];

/// Checks one Telemetry.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(telemetry) = parse::<Telemetry>(obj, report) else {
        return;
    };
    let spec = Path::spec();
    attachment(
        telemetry.selector.as_ref(),
        telemetry.target_ref.as_ref(),
        &telemetry.target_refs,
        &spec,
        report,
    );
    for (i, metrics) in telemetry.metrics.iter().enumerate() {
        if let Some(metrics) = metrics {
            validate_metrics(&spec.field("metrics").index(i), metrics, report);
        }
    }
    if telemetry.tracing.len() > 1 {
        report.warn(
            &spec.field("tracing"),
            "multiple tracing is not currently supported",
        );
    }
    for (i, tracing) in telemetry.tracing.iter().enumerate() {
        if let Some(tracing) = tracing {
            validate_tracing(&spec.field("tracing").index(i), tracing, report);
        }
    }
    for (i, logging) in telemetry.access_logging.iter().enumerate() {
        if let Some(logging) = logging {
            validate_access_logging(&spec.field("accessLogging").index(i), logging, report);
        }
    }
}

/// Each provider named.
fn validate_providers(at: &Path, providers: &[Option<ProviderRef>], report: &mut Report) {
    for (i, provider) in providers.iter().enumerate() {
        if provider.as_ref().is_none_or(|p| p.name.is_empty()) {
            report.error(
                &at.field("providers").index(i).field("name"),
                "providers.name may not be empty",
            );
        }
    }
}

fn validate_tracing(at: &Path, tracing: &Tracing, report: &mut Report) {
    if tracing.providers.len() > 1 {
        report.warn(
            &at.field("providers"),
            "multiple providers is not currently supported",
        );
    }
    validate_providers(at, &tracing.providers, report);
    if let Some(m) = &tracing.match_ {
        validate_enum(
            &at.field("match").field("mode"),
            m.mode.as_deref(),
            &MODES,
            report,
        );
    }
    if let Some(p) = tracing.random_sampling_percentage
        && !(0.0..=100.0).contains(&p)
    {
        report.error(
            &at.field("randomSamplingPercentage"),
            "randomSamplingPercentage must be in range [0.0, 100.0]",
        );
    }
    for (name, tag) in &tracing.custom_tags {
        let here = at.field("customTags").key(name);
        if name.is_empty() {
            report.error(&here, "tag name may not be empty");
        }
        let Some(tag) = tag else {
            report.error(&here, format!("tag '{name}' may not have a nil value"));
            continue;
        };
        let set = [
            tag.literal.is_some(),
            tag.environment.is_some(),
            tag.header.is_some(),
            tag.formatter.is_some(),
        ];
        if set.iter().filter(|s| **s).count() > 1 {
            report.error(
                &here,
                "only one of literal, environment, header and formatter may be set",
            );
        }
        if tag.literal.as_ref().is_some_and(|l| l.value.is_empty()) {
            report.error(
                &here.field("literal").field("value"),
                "literal tag value may not be empty",
            );
        }
        if tag.header.as_ref().is_some_and(|h| h.name.is_empty()) {
            report.error(
                &here.field("header").field("name"),
                "header tag name may not be empty",
            );
        }
        if tag.environment.as_ref().is_some_and(|e| e.name.is_empty()) {
            report.error(
                &here.field("environment").field("name"),
                "environment tag name may not be empty",
            );
        }
    }
}

fn validate_metrics(at: &Path, metrics: &Metrics, report: &mut Report) {
    validate_providers(at, &metrics.providers, report);
    for (i, o) in metrics.overrides.iter().enumerate() {
        let here = at.field("overrides").index(i);
        let Some(o) = o else {
            report.error(&here, "tagOverrides may not be null");
            continue;
        };
        for (tag, change) in &o.tag_overrides {
            let there = here.field("tagOverrides").key(tag);
            if tag.is_empty() {
                report.warn(&there, "tagOverrides.name may not be empty");
            }
            let Some(change) = change else {
                report.error(&there, "tagOverrides may not be null");
                continue;
            };
            let operation = change.operation.as_deref().unwrap_or("UPSERT");
            match operation {
                "UPSERT" if change.value.is_empty() => report.error(
                    &there.field("value"),
                    "tagOverrides.value must be set when operation is UPSERT",
                ),
                "REMOVE" if !change.value.is_empty() => report.error(
                    &there.field("value"),
                    "tagOverrides.value may only be set when operation is UPSERT",
                ),
                "UPSERT" | "REMOVE" => {}
                other => report.error(
                    &there.field("operation"),
                    format!("{other:?} is not one of UPSERT, REMOVE"),
                ),
            }
        }
        if let Some(m) = &o.match_ {
            let there = here.field("match");
            if m.metric.is_some() && m.custom_metric.is_some() {
                report.error(&there, "only one of metric and customMetric may be set");
            }
            if m.custom_metric.as_deref() == Some("") {
                report.error(
                    &there.field("customMetric"),
                    "customMetric may not be empty",
                );
            }
            validate_enum(
                &there.field("metric"),
                m.metric.as_deref(),
                &METRICS,
                report,
            );
            validate_enum(&there.field("mode"), m.mode.as_deref(), &MODES, report);
        }
    }
}

fn validate_access_logging(at: &Path, logging: &AccessLogging, report: &mut Report) {
    if let Some(filter) = &logging.filter
        && let Err(e) = cel_parser::parse(&filter.expression)
    {
        report.error(
            &at.field("filter").field("expression"),
            format!("must be a valid CEL expression, {e}"),
        );
    }
    validate_providers(at, &logging.providers, report);
    if let Some(m) = &logging.match_ {
        validate_enum(
            &at.field("match").field("mode"),
            m.mode.as_deref(),
            &MODES,
            report,
        );
    }
}
