//! State counts (`/stats`), counters (`/metrics`) and their Prometheus text exposition.
//! With one node, a sum is that node's figures; the shapes are RMQTT's, ready for a
//! cluster's fan-out.

use std::fmt::Write;

use actix_web::{web, HttpResponse};
use serde_json::{json, Map, Value};
use starling_broker::{BrokerStats, HistogramSnapshot, Latencies, MetricKind, MetricsSnapshot};

use crate::reply::{other_node, resource};
use crate::ApiState;

type State = web::Data<ApiState>;

pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    let get = web::get;
    // The fixed paths before `{id}`, which would take them.
    cfg.service(resource("/stats", "GET").route(get().to(stats)))
        .service(resource("/stats/sum", "GET").route(get().to(stats_sum)))
        .service(resource("/stats/{id}", "GET").route(get().to(stats_one)))
        .service(resource("/metrics", "GET").route(get().to(metrics)))
        .service(resource("/metrics/sum", "GET").route(get().to(metrics_sum)))
        .service(resource("/metrics/prometheus", "GET").route(get().to(prometheus)))
        .service(resource("/metrics/prometheus/sum", "GET").route(get().to(prometheus_sum)))
        .service(resource("/metrics/{id}", "GET").route(get().to(metrics_one)));
}

/// RMQTT's stats object: every count as `{name}.count` with its `{name}.max`, the
/// high-water mark since start.
fn stats_json(s: &BrokerStats) -> Value {
    Value::Object(s.pairs().map(|(k, v)| (k, Value::from(v))).collect())
}

fn node_head(s: &ApiState) -> Value {
    json!({"id": s.admin.node_id(), "name": s.admin.node_name(), "running": true})
}

async fn node_stats(s: &ApiState) -> Value {
    let st = s.admin.stats().await;
    json!({"node": node_head(s), "stats": stats_json(&st)})
}

async fn stats(s: State) -> HttpResponse {
    HttpResponse::Ok().json([node_stats(&s).await])
}

async fn stats_one(s: State, id: web::Path<String>) -> HttpResponse {
    match other_node(&s, &id) {
        Some(r) => r,
        None => HttpResponse::Ok().json(node_stats(&s).await),
    }
}

async fn stats_sum(s: State) -> HttpResponse {
    let st = s.admin.stats().await;
    let mut nodes = Map::new();
    nodes.insert(
        s.admin.node_id().to_string(),
        json!({"name": s.admin.node_name(), "running": true}),
    );
    HttpResponse::Ok().json(json!({"nodes": nodes, "stats": stats_json(&st)}))
}

/// The counters under dotted names (`messages.received`, as RMQTT spells its own), and
/// each latency histogram's count and sum of microseconds (`delivery.latency.count`,
/// `delivery.latency.us`: their quotient is the mean; the buckets are Prometheus').
fn metrics_json(m: &MetricsSnapshot, lat: &Latencies) -> Value {
    let mut out = Map::new();
    for (name, _, _, v) in m.every() {
        out.insert(name.replace('_', "."), json!(v));
    }
    let handshake = lat
        .handshake
        .iter()
        .fold(HistogramSnapshot::default(), |a, (_, h)| {
            HistogramSnapshot {
                buckets: std::array::from_fn(|i| a.buckets[i] + h.buckets[i]),
                sum_us: a.sum_us + h.sum_us,
            }
        });
    for (name, h) in [("handshake", handshake), ("delivery", lat.delivery)] {
        out.insert(format!("{name}.latency.count"), json!(h.count()));
        out.insert(format!("{name}.latency.us"), json!(h.sum_us));
    }
    Value::Object(out)
}

async fn metrics(s: State) -> HttpResponse {
    let m = s.admin.metrics();
    HttpResponse::Ok().json([json!({
        "node": {"id": s.admin.node_id(), "name": s.admin.node_name()},
        "metrics": metrics_json(&m, &s.admin.latencies()),
    })])
}

async fn metrics_one(s: State, id: web::Path<String>) -> HttpResponse {
    other_node(&s, &id).unwrap_or_else(|| {
        HttpResponse::Ok().json(json!({
            "node": {"id": s.admin.node_id(), "name": s.admin.node_name()},
            "metrics": metrics_json(&s.admin.metrics(), &s.admin.latencies()),
        }))
    })
}

async fn metrics_sum(s: State) -> HttpResponse {
    HttpResponse::Ok().json(metrics_json(&s.admin.metrics(), &s.admin.latencies()))
}

/// Prometheus text format 0.0.4: one family per figure, `starling_<name>` (counters end
/// in `_total`), labelled with the node; `node="all"` is the sum over the nodes. The
/// latency histograms follow ([`histograms`]).
pub(crate) fn exposition(
    m: &MetricsSnapshot,
    st: &BrokerStats,
    lat: &Latencies,
    nodes: &[(String, bool)],
) -> String {
    // Written in place, with no string made per family or sample: a scrape is about 640
    // lines, and an API flood may ask for it a hundred times a second.
    let mut out = String::with_capacity(48 << 10);
    let mut family = |name: &str, help: &str, kind: MetricKind, v: u64| {
        // Prometheus wants base units: microseconds go out as seconds.
        let (stem, seconds) = match name.strip_suffix("_us") {
            Some(stem) => (stem, true),
            None => (name, false),
        };
        let (suffix, kind) = match (kind, seconds) {
            (MetricKind::Counter, true) => ("_seconds_total", "counter"),
            (MetricKind::Counter, false) => ("_total", "counter"),
            (MetricKind::Gauge, true) => ("_seconds", "gauge"),
            (MetricKind::Gauge, false) => ("", "gauge"),
        };
        let _ = writeln!(out, "# HELP starling_{stem}{suffix} {help}");
        let _ = writeln!(out, "# TYPE starling_{stem}{suffix} {kind}");
        for (node, _) in nodes {
            let _ = write!(out, "starling_{stem}{suffix}{{node=\"{node}\"}} ");
            let _ = if seconds {
                writeln!(out, "{}", v as f64 / 1e6)
            } else {
                writeln!(out, "{v}")
            };
        }
    };
    for (name, help, kind, v) in m.every() {
        family(name, help, kind, v);
    }
    let g = MetricKind::Gauge;
    for (name, help, v) in stats_gauges(st) {
        family(&name, &help, g, v);
    }
    histograms(&mut out, lat, nodes);
    out
}

/// The latency histograms as Prometheus histogram families: cumulative `_bucket` samples
/// with their `le` bound in seconds, `+Inf` last (equal to `_count`), and `_sum` in
/// seconds. The handshake's carry a `listener` label (`tcp`, `tls`, `ws`, `wss`, `quic`).
fn histograms(out: &mut String, lat: &Latencies, nodes: &[(String, bool)]) {
    // Each family's series: their `listener` label, if they have one, and their figures.
    type Series<'a> = Vec<(Option<&'a str>, HistogramSnapshot)>;
    let families: [(&str, &str, Series); 2] = [
        (
            "starling_handshake_seconds",
            "Seconds from a connection's accept to its CONNACK written",
            lat.handshake.iter().map(|(k, h)| (Some(*k), *h)).collect(),
        ),
        (
            "starling_delivery_seconds",
            "Seconds from a PUBLISH read to a PUBLISH of it written to a subscriber",
            vec![(None, lat.delivery)],
        ),
    ];
    for (name, help, series) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (node, _) in nodes {
            for (listener, h) in &series {
                let labels = Labels { node, listener };
                for (le, n) in h.cumulative() {
                    let _ = write!(out, "{name}_bucket{{{labels},le=\"");
                    let _ = match le {
                        Some(b) => write!(out, "{b}"),
                        None => out.write_str("+Inf"),
                    };
                    let _ = writeln!(out, "\"}} {n}");
                }
                let sum = h.sum_us as f64 / 1e6;
                let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
                let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count());
            }
        }
    }
}

/// A histogram series' labels, written where they are used.
struct Labels<'a> {
    node: &'a str,
    listener: &'a Option<&'a str>,
}

impl std::fmt::Display for Labels<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node=\"{}\"", self.node)?;
        match self.listener {
            Some(l) => write!(f, ",listener=\"{l}\""),
            None => Ok(()),
        }
    }
}

/// The state counts as Prometheus gauges, each with its high-water mark since start (a
/// count that is a metric already, under its own name, only with its mark).
fn stats_gauges(st: &BrokerStats) -> Vec<(String, String, u64)> {
    let mut out = Vec::new();
    for l in st.levels() {
        if !l.count_elsewhere {
            out.push((l.stem.to_owned(), l.help.to_owned(), l.level.count));
        }
        out.push((
            format!("{}_max", l.stem),
            format!("Most at once since start: {}", lower_first(l.help)),
            l.level.max,
        ));
    }
    out
}

/// `help` with its first letter in lower case ("Subscriptions" → "subscriptions").
fn lower_first(help: &str) -> String {
    let mut c = help.chars();
    c.next()
        .map(|f| f.to_lowercase().chain(c).collect())
        .unwrap_or_default()
}

async fn prometheus_with(s: &ApiState, per_node: bool) -> HttpResponse {
    let m = s.admin.metrics();
    let lat = s.admin.latencies();
    let st = s.admin.stats().await;
    let mut nodes = Vec::new();
    if per_node {
        nodes.push((s.admin.node_id().to_string(), true));
    }
    nodes.push(("all".to_owned(), true));
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(exposition(&m, &st, &lat, &nodes))
}

async fn prometheus(s: State) -> HttpResponse {
    prometheus_with(&s, true).await
}

async fn prometheus_sum(s: State) -> HttpResponse {
    prometheus_with(&s, false).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_broker::BOUNDS_US;

    #[test]
    fn every_sample_follows_its_family_header() {
        let text = exposition(
            &MetricsSnapshot::default(),
            &BrokerStats::default(),
            &Latencies::default(),
            &[("1".into(), true), ("all".into(), true)],
        );
        let mut family = String::new();
        let mut histogram = false;
        let (mut samples, mut histogram_samples) = (0, 0);
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut words = rest.split(' ');
                family = words.next().unwrap().to_owned();
                histogram = words.next() == Some("histogram");
            } else if line.starts_with('#') {
                continue;
            } else if histogram {
                let ok = ["_bucket{node=", "_sum{node=", "_count{node="]
                    .iter()
                    .any(|s| line.starts_with(&format!("{family}{s}")));
                assert!(ok, "{line}");
                histogram_samples += 1;
            } else {
                assert!(line.starts_with(&format!("{family}{{node=")), "{line}");
                samples += 1;
            }
        }
        let named = MetricsSnapshot::default().every().len();
        assert_eq!(
            samples,
            2 * (named + stats_gauges(&BrokerStats::default()).len())
        );
        // Per series: every bound, +Inf, sum and count; 5 listener kinds and 1 delivery
        // series, for each of the 2 nodes.
        assert_eq!(histogram_samples, 2 * 6 * (BOUNDS_US.len() + 3));
        assert!(text.contains("starling_messages_received_total{node=\"1\"} 0"));
        assert!(text.contains("# TYPE starling_clients_connected gauge"));
        assert!(text.contains("starling_store_commit_seconds_total{node=\"all\"} 0"));
    }

    #[test]
    fn a_histogram_is_exposed_cumulative_in_seconds() {
        let mut lat = Latencies::default();
        // 2 deliveries at or under 50 µs, 1 under 1 ms, 1 past 10 s.
        lat.delivery.buckets[0] = 2;
        lat.delivery.buckets[4] = 1;
        lat.delivery.buckets[BOUNDS_US.len()] = 1;
        lat.delivery.sum_us = 12_000_500;
        lat.handshake[0] = ("tcp", lat.delivery);
        let text = exposition(
            &MetricsSnapshot::default(),
            &BrokerStats::default(),
            &lat,
            &[("all".into(), true)],
        );
        let d = "starling_delivery_seconds";
        for want in [
            format!("{d}_bucket{{node=\"all\",le=\"0.00005\"}} 2"),
            format!("{d}_bucket{{node=\"all\",le=\"0.0005\"}} 2"),
            format!("{d}_bucket{{node=\"all\",le=\"0.001\"}} 3"),
            format!("{d}_bucket{{node=\"all\",le=\"10\"}} 3"),
            format!("{d}_bucket{{node=\"all\",le=\"+Inf\"}} 4"),
            format!("{d}_sum{{node=\"all\"}} 12.0005"),
            format!("{d}_count{{node=\"all\"}} 4"),
            "starling_handshake_seconds_count{node=\"all\",listener=\"tcp\"} 4".to_owned(),
        ] {
            assert!(text.contains(&want), "{want} missing");
        }
        let json = metrics_json(&MetricsSnapshot::default(), &lat);
        assert_eq!(json["delivery.latency.count"], 4);
        assert_eq!(json["delivery.latency.us"], 12_000_500);
        assert_eq!(json["handshake.latency.count"], 4);
    }
}
