//! The figures of one run: a serializable report, its one-line JSON form and
//! its human summary.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

/// The CPU share (of the cores this process may use) above which the tool
/// itself may be what limits the figures.
pub const CPU_WARN_FRACTION: f64 = 0.85;

/// A latency distribution in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Smallest.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    /// Reads a histogram of nanoseconds into microseconds; all zero when empty.
    pub fn from_ns(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        let us = |ns: u64| ns as f64 / 1_000.0;
        Percentiles {
            count: h.len(),
            min: us(h.min()),
            mean: h.mean() / 1_000.0,
            p50: us(h.value_at_quantile(0.50)),
            p90: us(h.value_at_quantile(0.90)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        }
    }
}

/// A histogram of nanoseconds from 1 ns to 1 minute at 3 significant digits.
/// Longer latencies are clamped to a minute: at that point the run has failed anyway.
pub fn latency_histogram() -> Histogram<u64> {
    // Bounds and precision are constants within what hdrhistogram accepts.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// Records `ns`, clamped into the histogram's range.
pub fn record_ns(h: &mut Histogram<u64>, ns: u64) {
    h.saturating_record(ns.max(1));
}

/// Connection figures.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct ConnectReport {
    /// Clients started.
    pub attempted: u64,
    /// Clients that got a successful CONNACK (and SUBACK, if they subscribe).
    pub ok: u64,
    /// Clients that did not.
    pub failed: u64,
    /// Successful handshakes per second, from the first attempt to the last ready client.
    pub rate_per_s: f64,
    /// CONNECT → CONNACK latency.
    pub latency_us: Percentiles,
}

/// The tool's own CPU use over the run.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct CpuReport {
    /// User seconds.
    pub user_s: f64,
    /// System seconds.
    pub system_s: f64,
    /// (user + system) / wall time, in percent of one core.
    pub percent_of_core: f64,
    /// Cores this process may run on.
    pub cores: usize,
    /// True when the tool used most of its cores: the figures may be its own limit.
    pub saturated: bool,
}

impl CpuReport {
    /// Builds the report from CPU seconds used over `wall_s` seconds on `cores` cores.
    pub fn new(user_s: f64, system_s: f64, wall_s: f64, cores: usize) -> CpuReport {
        let percent_of_core = if wall_s > 0.0 {
            (user_s + system_s) / wall_s * 100.0
        } else {
            0.0
        };
        CpuReport {
            user_s,
            system_s,
            percent_of_core,
            cores,
            saturated: percent_of_core >= CPU_WARN_FRACTION * 100.0 * cores as f64,
        }
    }
}

/// The broker's resident memory around the connection phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RssReport {
    /// The broker's pid.
    pub pid: u32,
    /// VmRSS before the first connection, KiB.
    pub before_kib: u64,
    /// VmRSS with every client connected, KiB.
    pub after_kib: u64,
    /// (after - before) / connected clients, bytes.
    pub per_connection_bytes: Option<f64>,
}

/// Everything one run measured. Serialized as the one JSON line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// conn, pub, sub, fanin, fanout or pairs.
    pub scenario: &'static str,
    /// host:port, then the subscribers' addresses when they differ (--sub-host/--sub-port).
    pub broker: String,
    /// tcp.
    pub transport: &'static str,
    /// "3.1.1" or "5".
    pub mqtt_version: &'static str,
    /// 0, 1 or 2.
    pub qos: u8,
    /// Payload size.
    pub payload_bytes: usize,
    /// Publishing connections.
    pub publishers: u32,
    /// Subscribing connections.
    pub subscribers: u32,
    /// Target total publish rate, msg/s; `None` for as fast as possible.
    pub rate_target: Option<f64>,
    /// Seconds from the start of publishing to the end of the run phase.
    pub run_s: f64,
    /// Connections.
    pub connect: ConnectReport,
    /// PUBLISH packets sent.
    pub sent: u64,
    /// PUBLISH packets acknowledged (QoS 1: PUBACK, QoS 2: PUBCOMP).
    pub acked: u64,
    /// PUBLISH packets received.
    pub received: u64,
    /// Deliveries expected from what was sent; `None` when unknowable (`sub`).
    pub expected: Option<u64>,
    /// Expected deliveries that never came.
    pub lost: Option<u64>,
    /// Deliveries of a message already delivered to the same subscriber.
    pub duplicates: u64,
    /// Deliveries that came after a later message of the same publisher.
    pub reordered: u64,
    /// Received payloads without our stamp (another publisher on the topic).
    pub foreign: u64,
    /// sent / publishing time.
    pub sent_per_s: f64,
    /// received / time from the start of publishing to the last delivery.
    pub delivered_per_s: f64,
    /// End-to-end latency from the payload stamp.
    pub latency_us: Percentiles,
    /// Clients that ended in error, after or before being ready.
    pub errors: u64,
    /// Errors by kind.
    pub error_kinds: BTreeMap<&'static str, u64>,
    /// The first error, to start a diagnosis.
    pub first_error: Option<String>,
    /// The tool's own CPU use.
    pub cpu: CpuReport,
    /// The broker's memory per connection, when given its pid.
    pub broker_rss: Option<RssReport>,
}

impl Report {
    /// The report as one JSON line (no newline inside).
    pub fn to_json_line(&self) -> String {
        // Serializing plain numbers, strings and maps cannot fail.
        serde_json::to_string(self).expect("report serializes")
    }

    /// Warnings a reader must see before trusting the figures.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.cpu.saturated {
            w.push(format!(
                "the load generator used {:.0}% of a core on {} core(s): it may be the bottleneck",
                self.cpu.percent_of_core, self.cpu.cores
            ));
        }
        if self.qos > 0 && self.lost.is_some_and(|l| l > 0) {
            w.push(format!(
                "{} QoS {} deliveries lost",
                self.lost.unwrap_or(0),
                self.qos
            ));
        }
        if self.errors > 0 {
            w.push(format!("{} client(s) ended in error", self.errors));
        }
        w
    }

    /// A few lines for a person.
    pub fn human_summary(&self) -> String {
        let mut s = String::new();
        let rate = self
            .rate_target
            .map_or_else(|| "unlimited".to_string(), |r| format!("{r:.0} msg/s"));
        if self.scenario == "conn" {
            let _ = writeln!(
                s,
                "conn against {} over {}, MQTT {}",
                self.broker, self.transport, self.mqtt_version
            );
        } else {
            let _ = writeln!(
                s,
                "{} against {} over {}, MQTT {}, QoS {}, {} B payload, rate {rate}",
                self.scenario,
                self.broker,
                self.transport,
                self.mqtt_version,
                self.qos,
                self.payload_bytes
            );
        }
        let c = &self.connect;
        let _ = writeln!(
            s,
            "  connections: {}/{} ok at {:.0}/s, CONNACK p50 {:.0} us p99 {:.0} us",
            c.ok, c.attempted, c.rate_per_s, c.latency_us.p50, c.latency_us.p99
        );
        if self.publishers > 0 || self.subscribers > 0 {
            let _ = writeln!(
                s,
                "  {} publisher(s), {} subscriber(s), {:.2} s: sent {} ({:.0}/s), acked {}, received {} ({:.0}/s delivered)",
                self.publishers, self.subscribers, self.run_s, self.sent, self.sent_per_s,
                self.acked, self.received, self.delivered_per_s
            );
            let expected = self.expected.map_or("n/a".to_string(), |e| e.to_string());
            let lost = self.lost.map_or("n/a".to_string(), |e| e.to_string());
            let _ = writeln!(
                s,
                "  expected {expected}, lost {lost}, duplicates {}, reordered {}",
                self.duplicates, self.reordered
            );
            let l = &self.latency_us;
            if l.count > 0 {
                let _ = writeln!(
                s,
                "  latency us: p50 {:.0}  p90 {:.0}  p99 {:.0}  p99.9 {:.0}  max {:.0}  ({} samples)",
                l.p50, l.p90, l.p99, l.p999, l.max, l.count
                );
            }
        }
        if let Some(r) = &self.broker_rss {
            let per = r
                .per_connection_bytes
                .map_or("n/a".to_string(), |b| format!("{b:.0} B"));
            let _ = writeln!(
                s,
                "  broker pid {} RSS {} KiB -> {} KiB: {per} per connection",
                r.pid, r.before_kib, r.after_kib
            );
        }
        let _ = writeln!(
            s,
            "  tool CPU: {:.0}% of a core ({} core(s) available)",
            self.cpu.percent_of_core, self.cpu.cores
        );
        if self.errors > 0 {
            let kinds: Vec<String> = self
                .error_kinds
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            let _ = writeln!(s, "  errors: {}", kinds.join(", "));
            if let Some(first) = &self.first_error {
                let _ = writeln!(s, "  first error: {first}");
            }
        }
        for w in self.warnings() {
            let _ = writeln!(s, "  WARNING: {w}");
        }
        s
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample_report() -> Report {
        let mut h = latency_histogram();
        for us in 1..=1000u64 {
            record_ns(&mut h, us * 1_000);
        }
        Report {
            scenario: "pairs",
            broker: "127.0.0.1:1883".into(),
            transport: "tcp",
            mqtt_version: "3.1.1",
            qos: 1,
            payload_bytes: 64,
            publishers: 10,
            subscribers: 10,
            rate_target: None,
            run_s: 2.0,
            connect: ConnectReport {
                attempted: 20,
                ok: 20,
                failed: 0,
                rate_per_s: 1000.0,
                latency_us: Percentiles::from_ns(&h),
            },
            sent: 1000,
            acked: 1000,
            received: 1000,
            expected: Some(1000),
            lost: Some(0),
            duplicates: 0,
            reordered: 0,
            foreign: 0,
            sent_per_s: 500.0,
            delivered_per_s: 500.0,
            latency_us: Percentiles::from_ns(&h),
            errors: 0,
            error_kinds: BTreeMap::new(),
            first_error: None,
            cpu: CpuReport::new(0.5, 0.1, 2.0, 1),
            broker_rss: None,
        }
    }

    #[test]
    fn percentiles_read_the_histogram_in_microseconds() {
        let p = sample_report().latency_us;
        assert_eq!(p.count, 1000);
        // 3 significant digits: within 0.1% of the exact quantiles.
        assert!((p.p50 - 500.0).abs() <= 0.5, "{p:?}");
        assert!((p.p90 - 900.0).abs() <= 1.0, "{p:?}");
        assert!((p.p99 - 990.0).abs() <= 1.0, "{p:?}");
        assert!((p.p999 - 999.0).abs() <= 1.0, "{p:?}");
        assert!(
            (p.min - 1.0).abs() < 0.01 && (p.max - 1000.0).abs() <= 1.0,
            "{p:?}"
        );
    }

    #[test]
    fn empty_histogram_gives_zero_percentiles() {
        assert_eq!(
            Percentiles::from_ns(&latency_histogram()),
            Percentiles::default()
        );
    }

    #[test]
    fn latency_beyond_a_minute_is_clamped_not_dropped() {
        let mut h = latency_histogram();
        record_ns(&mut h, u64::MAX);
        record_ns(&mut h, 0);
        assert_eq!(h.len(), 2);
    }

    #[test]
    fn json_is_one_line_with_every_figure() {
        let line = sample_report().to_json_line();
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        for key in [
            "scenario",
            "sent",
            "acked",
            "received",
            "lost",
            "duplicates",
            "delivered_per_s",
            "latency_us",
            "connect",
            "errors",
            "cpu",
            "rate_target",
        ] {
            assert!(v.get(key).is_some(), "missing {key} in {line}");
        }
        assert_eq!(v["latency_us"]["count"], 1000);
        assert!(v["latency_us"]["p999"].as_f64().unwrap() > 990.0);
        assert_eq!(v["connect"]["rate_per_s"], 1000.0);
        assert_eq!(v["rate_target"], serde_json::Value::Null);
    }

    #[test]
    fn summary_shows_percentiles_and_no_warning_on_a_clean_run() {
        let s = sample_report().human_summary();
        assert!(s.contains("p99.9"), "{s}");
        assert!(s.contains("lost 0"), "{s}");
        assert!(!s.contains("WARNING"), "{s}");
    }

    #[test]
    fn saturated_cpu_and_qos1_loss_are_warned() {
        let mut r = sample_report();
        r.cpu = CpuReport::new(1.7, 0.2, 2.0, 1);
        r.lost = Some(3);
        let s = r.human_summary();
        assert!(r.cpu.saturated);
        assert!(s.contains("may be the bottleneck"), "{s}");
        assert!(s.contains("3 QoS 1 deliveries lost"), "{s}");
    }

    #[test]
    fn cpu_below_the_threshold_is_not_saturated() {
        assert!(!CpuReport::new(0.8, 0.0, 1.0, 1).saturated);
        assert!(!CpuReport::new(1.5, 0.0, 1.0, 2).saturated);
        assert!(CpuReport::new(1.8, 0.0, 1.0, 2).saturated);
    }
}
