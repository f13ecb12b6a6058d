//! One run: builds the clients of a scenario, paces their connections,
//! moves them through the phases, and folds their outcomes into a [`Report`].

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use starling_codec::{Protocol, QoS};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::cli::{RunConfig, Scenario};
use crate::client::{run_client, ClientOutcome, ClientSpec, Phase, PubSpec, Shared, SubSpec};
use crate::payload::Clock;
use crate::report::{
    latency_histogram, record_ns, ConnectReport, CpuReport, Percentiles, Report, RssReport,
};
use crate::sys;

/// How often the phases are checked and the progress line redrawn.
const TICK: Duration = Duration::from_millis(100);
/// Wait after the last connection before reading the broker's RSS, so that
/// allocations made right after CONNACK are counted.
const RSS_SETTLE: Duration = Duration::from_secs(1);

/// Which publishers' streams a subscriber should see in full.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Every publisher of the run.
    All,
    /// One publisher.
    One(u32),
    /// Unknown (messages come from outside the run).
    Unknown,
}

/// Runs `cfg` to the end and returns its report. Client failures are
/// counted in the report, not returned: a run always ends with figures.
pub async fn run(cfg: &RunConfig) -> Report {
    let clock = Clock::start();
    let cpu_before = sys::cpu_seconds();
    let rss_before = cfg.broker_pid.and_then(sys::rss_kib);
    let (specs, expects) = build_clients(cfg);
    let (publishers, subscribers) = cfg.scenario.roles(cfg.clients);
    let total = specs.len() as u64;

    let (lat_tx, mut lat_rx) = mpsc::unbounded_channel::<Vec<u64>>();
    let collector = tokio::spawn(async move {
        let mut h = latency_histogram();
        while let Some(batch) = lat_rx.recv().await {
            for ns in batch {
                record_ns(&mut h, ns);
            }
        }
        h
    });
    let shared = Arc::new(Shared {
        clock,
        live: Default::default(),
        latency: lat_tx,
    });
    let (phase_tx, phase_rx) = watch::channel(Phase::Connecting);

    // Connections are paced from a task of their own so that the progress
    // line and the phase checks keep going while they open.
    let spawner = {
        let shared = shared.clone();
        let rate = cfg.connect_rate;
        tokio::spawn(async move {
            let start = Instant::now();
            let mut handles: Vec<JoinHandle<ClientOutcome>> = Vec::with_capacity(specs.len());
            for (i, spec) in specs.into_iter().enumerate() {
                let at = start + Duration::from_secs_f64(i as f64 / rate);
                tokio::time::sleep_until(at.into()).await;
                handles.push(tokio::spawn(run_client(
                    spec,
                    shared.clone(),
                    phase_rx.clone(),
                )));
            }
            handles
        })
    };

    let bar = progress_bar(cfg.progress);
    let live = &shared.live;
    let connect_start = Instant::now();
    // Every client must have had its turn, plus its timeout, plus slack.
    let connect_deadline = connect_start
        + Duration::from_secs_f64(total as f64 / cfg.connect_rate)
        + cfg.connect_timeout
        + Duration::from_secs(1);
    let mut connected_at: Option<Instant> = None;
    let mut rss_after = None;
    let mut run_start = None;
    let mut run_end = None;
    let mut drain_deadline = None;
    let mut phase = Phase::Connecting;
    let mut tick = tokio::time::interval(TICK);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let ready = live.ready.load(Relaxed);
        let failed = live.failed.load(Relaxed);
        let sent = live.sent.load(Relaxed);
        let acked = live.acked.load(Relaxed);
        let received = live.received.load(Relaxed);
        match phase {
            Phase::Connecting => {
                if connected_at.is_none() && (ready + failed >= total || now >= connect_deadline) {
                    connected_at = Some(now);
                }
                let settle = if cfg.broker_pid.is_some() {
                    RSS_SETTLE
                } else {
                    Duration::ZERO
                };
                if connected_at.is_some_and(|at| now >= at + settle) {
                    rss_after = cfg.broker_pid.and_then(sys::rss_kib);
                    phase = Phase::Run;
                    run_start = Some(now);
                }
            }
            Phase::Run => {
                let started = run_start.unwrap_or(now);
                let all_done = publishers > 0
                    && live.publishers_done.load(Relaxed) + failed >= u64::from(publishers)
                    && live.publishers_done.load(Relaxed) > 0;
                if now >= started + cfg.duration || all_done {
                    run_end = Some(now);
                    phase = if publishers > 0 {
                        Phase::Drain
                    } else {
                        Phase::Stop
                    };
                    drain_deadline = Some(now + cfg.drain);
                }
            }
            Phase::Drain => {
                let expected = expected_live(cfg.scenario, sent, ready, publishers);
                let acks_in = cfg.qos == QoS::AtMostOnce || acked >= sent;
                if (acks_in && received >= expected) || drain_deadline.is_some_and(|d| now >= d) {
                    phase = Phase::Stop;
                }
            }
            Phase::Stop => break,
        }
        if *phase_tx.borrow() != phase {
            // Receivers live as long as their clients; none left means all ended.
            let _ = phase_tx.send(phase);
        }
        bar.set_message(format!(
            "{:?}: conn {}/{} failed {} | sent {} acked {} recv {} | errors {}",
            phase,
            ready,
            total,
            failed,
            sent,
            acked,
            received,
            live.errors.load(Relaxed)
        ));
    }
    bar.finish_and_clear();

    // The spawner ends once it has spawned everyone; a panic there is a bug.
    let handles = spawner.await.expect("spawner task does not panic");
    let mut outcomes = Vec::with_capacity(handles.len());
    for h in handles {
        // A client never panics on broker input; a panic is a bug worth surfacing.
        outcomes.push(h.await.expect("client task does not panic"));
    }
    let wall_end = Instant::now();
    let last_receive = clock.origin() + Duration::from_nanos(live.last_receive_ns.load(Relaxed));
    drop(shared);
    let latency = collector.await.expect("collector does not panic");

    let mut connect_h = latency_histogram();
    let mut connect_ok = 0u64;
    let mut sent_by = BTreeMap::<u32, u64>::new();
    let mut errors = BTreeMap::<&'static str, u64>::new();
    let mut first_error = None;
    let (mut sent, mut acked, mut received, mut foreign) = (0, 0, 0, 0);
    let (mut unique, mut duplicates, mut reordered) = (0u64, 0, 0);
    let mut expected = Some(0u64);
    let mut last_ready = None::<Instant>;
    for o in &outcomes {
        if let Some(l) = o.connack_latency {
            record_ns(&mut connect_h, l.as_nanos() as u64);
        }
        connect_ok += u64::from(o.ready);
        last_ready = last_ready.max(o.ready_at);
        if let Some(p) = o.publisher {
            sent_by.insert(p, o.sent);
        }
        if let Some(e) = &o.error {
            *errors.entry(e.kind()).or_default() += 1;
            first_error.get_or_insert_with(|| e.to_string());
        }
        sent += o.sent;
        acked += o.acked;
        received += o.received;
        foreign += o.foreign;
        for t in o.streams.values() {
            unique += t.unique;
            duplicates += t.duplicates;
            reordered += t.reordered;
        }
    }
    for (o, expect) in outcomes.iter().zip(&expects) {
        let Some(expect) = expect else { continue };
        if !o.ready {
            continue;
        }
        expected = match (expected, expect) {
            (Some(e), Expect::All) => Some(e + sent_by.values().sum::<u64>()),
            (Some(e), Expect::One(p)) => Some(e + sent_by.get(p).copied().unwrap_or(0)),
            _ => None,
        };
    }
    if subscribers == 0 {
        expected = if publishers > 0 { None } else { expected };
    }
    let lost = expected.map(|e| e.saturating_sub(unique));

    let run_start = run_start.unwrap_or(wall_end);
    let run_end = run_end.unwrap_or(wall_end);
    let publish_s = run_end.saturating_duration_since(run_start).as_secs_f64();
    let deliver_s = last_receive
        .saturating_duration_since(run_start)
        .as_secs_f64();
    // From the first attempt to the last client ready: the handshake rate
    // the broker sustained (the pacing caps it at --connect-rate).
    let connect_s = last_ready
        .unwrap_or(wall_end)
        .saturating_duration_since(connect_start)
        .as_secs_f64();
    let wall_s = wall_end
        .saturating_duration_since(clock.origin())
        .as_secs_f64();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cpu = match (cpu_before, sys::cpu_seconds()) {
        (Some((u0, s0)), Some((u1, s1))) => CpuReport::new(u1 - u0, s1 - s0, wall_s, cores),
        _ => CpuReport::new(0.0, 0.0, wall_s, cores),
    };
    let broker_rss = cfg.broker_pid.and_then(|pid| {
        let (before, after) = (rss_before?, rss_after?);
        let per =
            (connect_ok > 0).then(|| (after as f64 - before as f64) * 1024.0 / connect_ok as f64);
        Some(RssReport {
            pid,
            before_kib: before,
            after_kib: after,
            per_connection_bytes: per,
        })
    });
    let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    Report {
        scenario: cfg.scenario.name(),
        broker: cfg.target_label.clone(),
        transport: "tcp",
        mqtt_version: match cfg.protocol {
            Protocol::V5 => "5",
            _ => "3.1.1",
        },
        qos: cfg.qos.as_u8(),
        payload_bytes: cfg.payload_size,
        publishers,
        subscribers,
        rate_target: cfg.rate,
        run_s: publish_s,
        connect: ConnectReport {
            attempted: total,
            ok: connect_ok,
            failed: total - connect_ok,
            rate_per_s: rate(connect_ok, connect_s),
            latency_us: Percentiles::from_ns(&connect_h),
        },
        sent,
        acked,
        received,
        expected,
        lost,
        duplicates,
        reordered,
        foreign,
        sent_per_s: rate(sent, publish_s),
        delivered_per_s: rate(received, deliver_s),
        latency_us: Percentiles::from_ns(&latency),
        errors: errors.values().sum(),
        error_kinds: errors,
        first_error,
        cpu,
        broker_rss,
    }
}

/// Deliveries to wait for during the drain, from the live counters.
fn expected_live(scenario: Scenario, sent: u64, ready: u64, publishers: u32) -> u64 {
    match scenario {
        Scenario::Fanin | Scenario::Pairs => sent,
        // Every ready client but the publisher subscribes.
        Scenario::Fanout => sent * ready.saturating_sub(u64::from(publishers)),
        Scenario::Conn | Scenario::Pub | Scenario::Sub => 0,
    }
}

/// The clients of a scenario, subscribers first so that they are subscribed
/// before any publisher is ready, with what each subscriber expects.
fn build_clients(cfg: &RunConfig) -> (Vec<ClientSpec>, Vec<Option<Expect>>) {
    let (publishers, subscribers) = cfg.scenario.roles(cfg.clients);
    let ids = &cfg.id_prefix;
    let base = |i: u64, role: &str| ClientSpec {
        client_id: format!("{ids}{role}{i}"),
        target: cfg.target,
        source: cfg.source_for(i),
        transport: cfg.transport,
        protocol: cfg.protocol,
        keep_alive_secs: cfg.keep_alive_secs,
        connect_timeout: cfg.connect_timeout,
        subscribe: None,
        publish: None,
    };
    let prefix = &cfg.topic;
    let pub_topic = |p: u32| match cfg.scenario {
        Scenario::Pub => cfg.topic.replace("%i", &p.to_string()),
        Scenario::Fanin => format!("{prefix}/fanin/{p}"),
        Scenario::Fanout => format!("{prefix}/fanout"),
        Scenario::Pairs => format!("{prefix}/pairs/{p}"),
        Scenario::Conn | Scenario::Sub => String::new(),
    };
    let mut specs = Vec::new();
    let mut expects = Vec::new();
    if cfg.scenario == Scenario::Conn {
        for i in 0..u64::from(cfg.clients) {
            specs.push(base(i, "c"));
            expects.push(None);
        }
        return (specs, expects);
    }
    for s in 0..subscribers {
        let (filter, expect) = match cfg.scenario {
            Scenario::Sub => (cfg.topic.clone(), Expect::Unknown),
            Scenario::Fanin => (format!("{prefix}/fanin/+"), Expect::All),
            Scenario::Fanout => (pub_topic(0), Expect::One(0)),
            _ => (pub_topic(s), Expect::One(s)),
        };
        let mut spec = base(specs.len() as u64, "s");
        spec.target = cfg.sub_target_for(s);
        spec.subscribe = Some(SubSpec {
            filter,
            qos: cfg.qos,
            persistent: cfg.persistent,
        });
        specs.push(spec);
        expects.push(Some(expect));
    }
    let per_pub_rate = cfg.rate.map(|r| r / f64::from(publishers.max(1)));
    for p in 0..publishers {
        // Spread the count so the total is exact.
        let count = cfg.count / u64::from(publishers)
            + u64::from(u64::from(p) < cfg.count % u64::from(publishers));
        let mut spec = base(specs.len() as u64, "p");
        spec.publish = Some(PubSpec {
            publisher: p,
            topic: pub_topic(p),
            qos: cfg.qos,
            payload_size: cfg.payload_size,
            count,
            rate: per_pub_rate,
            phase_offset: f64::from(p) / f64::from(publishers),
            inflight: cfg.inflight,
        });
        specs.push(spec);
        expects.push(None);
    }
    (specs, expects)
}

fn progress_bar(enabled: bool) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    // Redraws are throttled so the bar costs nothing next to the load.
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(4));
    if let Ok(style) = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(250));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    fn config(args: &[&str]) -> RunConfig {
        let mut argv = vec!["starling-bench"];
        argv.extend_from_slice(args);
        Cli::parse_from(argv).command.validate(None).unwrap()
    }

    #[test]
    fn fanin_subscriber_comes_first_with_a_wildcard() {
        let (specs, expects) = build_clients(&config(&["fanin", "-c", "3", "-t", "x"]));
        assert_eq!(specs.len(), 4);
        assert_eq!(specs[0].subscribe.as_ref().unwrap().filter, "x/fanin/+");
        assert!(matches!(expects[0], Some(Expect::All)));
        let topics: Vec<_> = specs[1..]
            .iter()
            .map(|s| s.publish.as_ref().unwrap().topic.clone())
            .collect();
        assert_eq!(topics, ["x/fanin/0", "x/fanin/1", "x/fanin/2"]);
    }

    #[test]
    fn count_and_rate_split_exactly_over_publishers() {
        let (specs, _) = build_clients(&config(&["pairs", "-c", "3", "-n", "10", "-r", "300"]));
        let pubs: Vec<_> = specs.iter().filter_map(|s| s.publish.as_ref()).collect();
        assert_eq!(pubs.iter().map(|p| p.count).sum::<u64>(), 10);
        assert!(pubs.iter().all(|p| p.rate == Some(100.0)));
        assert_eq!(specs[1].subscribe.as_ref().unwrap().filter, pubs[1].topic);
    }

    #[test]
    fn fanout_has_one_publisher_and_n_subscribers_on_its_topic() {
        let (specs, _) = build_clients(&config(&["fanout", "-c", "4"]));
        assert_eq!(specs.iter().filter(|s| s.publish.is_some()).count(), 1);
        let topic = &specs[4].publish.as_ref().unwrap().topic;
        assert!(specs[..4]
            .iter()
            .all(|s| &s.subscribe.as_ref().unwrap().filter == topic));
        assert_eq!(expected_live(Scenario::Fanout, 10, 5, 1), 40);
    }

    #[test]
    fn client_ids_are_unique() {
        let (specs, _) = build_clients(&config(&["pairs", "-c", "50"]));
        let ids: std::collections::BTreeSet<_> = specs.iter().map(|s| &s.client_id).collect();
        assert_eq!(ids.len(), 100);
    }

    #[test]
    fn subscribers_go_to_their_own_address_and_publishers_to_the_main_one() {
        let cfg = config(&["fanout", "-c", "3", "-p", "1883", "--sub-port", "1884,1885"]);
        let (specs, _) = build_clients(&cfg);
        let ports: Vec<u16> = specs.iter().map(|s| s.target.port()).collect();
        // Three subscribers round-robin, then the publisher.
        assert_eq!(ports, [1884, 1885, 1884, 1883]);
    }
}
