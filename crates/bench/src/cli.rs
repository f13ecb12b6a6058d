//! Command line: clap definitions, and their validation into a [`RunConfig`].

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use starling_codec::{Protocol, QoS};

use crate::client::Transport;
use crate::error::ArgError;
use crate::payload::STAMP_LEN;

/// Connections per run at most: past the descriptor limit of any machine we run on.
pub const CLIENTS_MAX: u32 = 1_000_000;
/// Payload size cap: a quarter of MQTT's largest packet keeps memory sane.
pub const PAYLOAD_SIZE_MAX: usize = 64 * 1024 * 1024;
/// Longest run phase.
pub const DURATION_MAX_SECS: f64 = 24.0 * 3600.0;
/// Descriptors kept for the runtime, stdio and /proc reads.
pub const FD_RESERVE: u64 = 64;

/// starling-bench: load an MQTT broker and measure it.
#[derive(Debug, Parser)]
#[command(name = "starling-bench", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The scenarios.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// N clients connect at --connect-rate and stay idle for --duration-secs:
    /// handshake rate, CONNECT→CONNACK latency, broker RSS per connection (--broker-pid).
    Conn(ConnArgs),
    /// N publishers to --topic (`%i` is the publisher index), nobody subscribed here.
    Pub(MsgArgs),
    /// N subscribers to --topic (a filter), reading what others publish.
    Sub(MsgArgs),
    /// N publishers, each on its own topic, to 1 wildcard subscriber.
    Fanin(MsgArgs),
    /// 1 publisher to N subscribers of its topic.
    Fanout(MsgArgs),
    /// N publisher/subscriber pairs, a topic each.
    Pairs(MsgArgs),
}

/// MQTT version on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MqttVersion {
    /// MQTT 3.1.1.
    #[value(name = "3.1.1", alias = "4")]
    V311,
    /// MQTT 5.0.
    #[value(name = "5", alias = "5.0")]
    V5,
}

/// Options of every scenario.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Broker host.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Broker port.
    #[arg(short, long, default_value_t = 1883)]
    pub port: u16,
    /// Transport.
    #[arg(long, value_enum, default_value_t = Transport::Tcp)]
    pub transport: Transport,
    /// MQTT version.
    #[arg(short = 'V', long, value_enum, default_value_t = MqttVersion::V311)]
    pub mqtt_version: MqttVersion,
    /// Clients: connections (conn), publishers (pub, fanin), subscribers (sub, fanout),
    /// pairs (pairs). Default 1000 for conn, 10 for pub/sub, 100 otherwise.
    #[arg(short, long)]
    pub clients: Option<u32>,
    /// New connections per second.
    #[arg(long, default_value_t = 5000.0)]
    pub connect_rate: f64,
    /// Bound on connect + CONNACK + SUBACK per client, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub connect_timeout_secs: f64,
    /// Keep alive, seconds (0 disables PINGREQ).
    #[arg(long, default_value_t = 60)]
    pub keep_alive_secs: u16,
    /// Seconds to run (publishing, or holding idle connections for conn).
    #[arg(short, long, default_value_t = 10.0)]
    pub duration_secs: f64,
    /// Do not bind clients to 127.0.0.2-251 (done only for a loopback broker,
    /// to go past the ephemeral-port limit of one source address).
    #[arg(long)]
    pub no_source_spread: bool,
    /// Broker pid: its VmRSS is read before and after the connections.
    #[arg(long)]
    pub broker_pid: Option<u32>,
    /// No live progress line.
    #[arg(long)]
    pub no_progress: bool,
    /// Client ids start with this instead of `sb<pid>`, so that a second run reconnects
    /// the first run's client ids (a reconnect to a session or, in a cluster, to a client
    /// id the node already claimed).
    #[arg(long)]
    pub id_prefix: Option<String>,
}

/// `conn` options.
#[derive(Debug, Clone, Args)]
pub struct ConnArgs {
    /// Common options.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Options of the publishing and subscribing scenarios.
#[derive(Debug, Clone, Args)]
pub struct MsgArgs {
    /// Common options.
    #[command(flatten)]
    pub common: CommonArgs,
    /// QoS of publishes and subscriptions.
    #[arg(short, long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub qos: u8,
    /// Payload size in bytes (at least 20: the send stamp, publisher and sequence).
    #[arg(short = 's', long, default_value_t = 64)]
    pub payload_size: usize,
    /// Total publish rate over all publishers, msg/s; unlimited if absent.
    #[arg(short, long)]
    pub rate: Option<f64>,
    /// Total messages over all publishers at most.
    #[arg(short = 'n', long, default_value_t = 10_000_000)]
    pub count: u64,
    /// Unacknowledged QoS 1/2 messages per publisher at most.
    #[arg(long, default_value_t = 64)]
    pub inflight: u32,
    /// Seconds to wait after publishing for the last acknowledgements and deliveries.
    #[arg(long, default_value_t = 5.0)]
    pub drain_secs: f64,
    /// pub: topic (`%i` = publisher index, default bench/t/%i); sub: filter (default
    /// bench/t/#); fanin/fanout/pairs: topic prefix (default bench/<pid>).
    #[arg(short, long)]
    pub topic: Option<String>,
    /// Subscribers keep a persistent session (3.1.1: clean session 0; 5: clean start 0
    /// with a session expiry of 300 s), so a broker with a store writes their deliveries.
    #[arg(long)]
    pub persistent: bool,
    /// Subscribers' broker host, when not --host: e.g. another node of a cluster, so that
    /// every delivery crosses from the publishers' node to the subscribers'.
    #[arg(long, value_name = "HOST")]
    pub sub_host: Option<String>,
    /// Subscribers' broker port, when not --port. A comma list spreads the subscribers
    /// round-robin over the ports (e.g. `--sub-port 1884,1885`: fanout subscribers over two
    /// cluster nodes).
    #[arg(
        long,
        visible_alias = "sub-ports",
        value_name = "PORT[,PORT...]",
        value_delimiter = ','
    )]
    pub sub_port: Vec<u16>,
}

/// Which scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Idle connections.
    Conn,
    /// Publishers only.
    Pub,
    /// Subscribers only.
    Sub,
    /// N → 1.
    Fanin,
    /// 1 → N.
    Fanout,
    /// N × (1 → 1).
    Pairs,
}

impl Scenario {
    /// The subcommand name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Conn => "conn",
            Scenario::Pub => "pub",
            Scenario::Sub => "sub",
            Scenario::Fanin => "fanin",
            Scenario::Fanout => "fanout",
            Scenario::Pairs => "pairs",
        }
    }

    /// (publishers, subscribers) for `clients`.
    pub fn roles(self, clients: u32) -> (u32, u32) {
        match self {
            Scenario::Conn => (0, 0),
            Scenario::Pub => (clients, 0),
            Scenario::Sub => (0, clients),
            Scenario::Fanin => (clients, 1),
            Scenario::Fanout => (1, clients),
            Scenario::Pairs => (clients, clients),
        }
    }

    /// Connections the scenario opens for `clients`.
    pub fn connections(self, clients: u32) -> u64 {
        match self {
            Scenario::Conn => u64::from(clients),
            _ => {
                let (p, s) = self.roles(clients);
                u64::from(p) + u64::from(s)
            }
        }
    }
}

/// A validated run: every figure bounded, every choice made.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Scenario.
    pub scenario: Scenario,
    /// Broker address.
    pub target: SocketAddr,
    /// Where subscriber `i` connects: `sub_targets[i % len]`. Never empty; `[target]`
    /// unless --sub-host/--sub-port say otherwise.
    pub sub_targets: Vec<SocketAddr>,
    /// As given, for the report (with the subscribers' addresses when they differ).
    pub target_label: String,
    /// Transport.
    pub transport: Transport,
    /// MQTT version.
    pub protocol: Protocol,
    /// QoS (0 for conn).
    pub qos: QoS,
    /// Clients as `--clients` counts them.
    pub clients: u32,
    /// Payload size.
    pub payload_size: usize,
    /// Total msg/s, or unlimited.
    pub rate: Option<f64>,
    /// Run phase length.
    pub duration: Duration,
    /// Total messages at most.
    pub count: u64,
    /// Per-publisher window.
    pub inflight: u16,
    /// Connections per second.
    pub connect_rate: f64,
    /// Per-client setup bound.
    pub connect_timeout: Duration,
    /// Wait for the tail after publishing.
    pub drain: Duration,
    /// Keep alive.
    pub keep_alive_secs: u16,
    /// Bind clients to 127.0.0.(2 + i % 250).
    pub source_spread: bool,
    /// Topic, filter or prefix, resolved per scenario.
    pub topic: String,
    /// Broker pid for RSS.
    pub broker_pid: Option<u32>,
    /// Live progress line.
    pub progress: bool,
    /// Subscribers keep a persistent session.
    pub persistent: bool,
    /// Client ids start with this (`sb<pid>` unless --id-prefix says).
    pub id_prefix: String,
}

impl RunConfig {
    /// The broker address of subscriber `s` (round-robin over `sub_targets`).
    pub fn sub_target_for(&self, s: u32) -> SocketAddr {
        self.sub_targets[s as usize % self.sub_targets.len()]
    }

    /// The source address for client `i`, if spreading.
    pub fn source_for(&self, i: u64) -> Option<IpAddr> {
        // 250 addresses × ~28k ephemeral ports each is far past any fd limit.
        self.source_spread
            .then(|| IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (i % 250) as u8)))
    }
}

impl Command {
    /// Validates the arguments. `fd_limit` is the open-file soft limit, if known.
    pub fn validate(&self, fd_limit: Option<u64>) -> Result<RunConfig, ArgError> {
        let (scenario, common, msg) = match self {
            Command::Conn(a) => (Scenario::Conn, &a.common, None),
            Command::Pub(a) => (Scenario::Pub, &a.common, Some(a)),
            Command::Sub(a) => (Scenario::Sub, &a.common, Some(a)),
            Command::Fanin(a) => (Scenario::Fanin, &a.common, Some(a)),
            Command::Fanout(a) => (Scenario::Fanout, &a.common, Some(a)),
            Command::Pairs(a) => (Scenario::Pairs, &a.common, Some(a)),
        };
        let clients = common.clients.unwrap_or(match scenario {
            Scenario::Conn => 1000,
            Scenario::Pub | Scenario::Sub => 10,
            _ => 100,
        });
        if clients == 0 || clients > CLIENTS_MAX {
            return Err(ArgError::ClientsOutOfRange {
                clients,
                max: CLIENTS_MAX,
            });
        }
        let needed = scenario.connections(clients);
        if let Some(limit) = fd_limit {
            if needed + FD_RESERVE > limit {
                return Err(ArgError::FileLimit {
                    needed,
                    limit,
                    reserve: FD_RESERVE,
                });
            }
        }
        positive("connect-rate", common.connect_rate)?;
        positive("connect-timeout-secs", common.connect_timeout_secs)?;
        let duration_secs = common.duration_secs;
        if !(duration_secs > 0.0 && duration_secs <= DURATION_MAX_SECS) {
            return Err(ArgError::DurationOutOfRange {
                secs: duration_secs,
                max: DURATION_MAX_SECS,
            });
        }
        let target = resolve(&common.host, common.port)?;
        let (publishers, subscribers) = scenario.roles(clients);
        let (sub_targets, target_label) = match msg {
            Some(m) => sub_targets(m, scenario, subscribers, target)?,
            None => (vec![target], format!("{}:{}", common.host, common.port)),
        };
        // Binding to 127.0.0.x only reaches loopback brokers: every address must be one.
        let source_spread = !common.no_source_spread
            && std::iter::once(&target)
                .chain(&sub_targets)
                .all(|t| matches!(t.ip(), IpAddr::V4(ip) if ip.is_loopback()));

        let pid = std::process::id();
        let mut cfg = RunConfig {
            scenario,
            target,
            sub_targets,
            target_label,
            transport: common.transport,
            protocol: match common.mqtt_version {
                MqttVersion::V311 => Protocol::V3_1_1,
                MqttVersion::V5 => Protocol::V5,
            },
            qos: QoS::AtMostOnce,
            clients,
            payload_size: STAMP_LEN,
            rate: None,
            duration: Duration::from_secs_f64(duration_secs),
            count: 0,
            inflight: 1,
            connect_rate: common.connect_rate,
            connect_timeout: Duration::from_secs_f64(common.connect_timeout_secs),
            drain: Duration::ZERO,
            keep_alive_secs: common.keep_alive_secs,
            source_spread,
            topic: String::new(),
            broker_pid: common.broker_pid,
            progress: !common.no_progress,
            persistent: false,
            id_prefix: common
                .id_prefix
                .clone()
                .unwrap_or_else(|| format!("sb{}", std::process::id())),
        };
        let Some(msg) = msg else {
            return Ok(cfg);
        };
        // The parser bounds qos to 0..=2.
        cfg.qos = QoS::from_u8(msg.qos).expect("qos parsed in 0..=2");
        if msg.payload_size < STAMP_LEN || msg.payload_size > PAYLOAD_SIZE_MAX {
            return Err(ArgError::PayloadSizeOutOfRange {
                size: msg.payload_size,
                min: STAMP_LEN,
                max: PAYLOAD_SIZE_MAX,
            });
        }
        cfg.payload_size = msg.payload_size;
        if let Some(rate) = msg.rate {
            positive("rate", rate)?;
        }
        cfg.rate = msg.rate;
        if msg.count < u64::from(publishers) {
            return Err(ArgError::CountTooSmall {
                count: msg.count,
                publishers,
            });
        }
        cfg.count = msg.count;
        // Packet identifiers are 16 bits; the window must fit them.
        if msg.inflight == 0 || msg.inflight > u32::from(u16::MAX) {
            return Err(ArgError::InflightOutOfRange {
                inflight: msg.inflight,
                max: u32::from(u16::MAX),
            });
        }
        cfg.inflight = msg.inflight as u16;
        if !(msg.drain_secs >= 0.0 && msg.drain_secs <= DURATION_MAX_SECS) {
            return Err(ArgError::DurationOutOfRange {
                secs: msg.drain_secs,
                max: DURATION_MAX_SECS,
            });
        }
        cfg.drain = Duration::from_secs_f64(msg.drain_secs);
        cfg.persistent = msg.persistent;
        cfg.topic = match (&msg.topic, scenario) {
            (Some(t), _) => t.clone(),
            (None, Scenario::Pub) => "bench/t/%i".to_string(),
            (None, Scenario::Sub) => "bench/t/#".to_string(),
            // A per-process prefix keeps two runs on one broker apart.
            (None, _) => format!("bench/{pid}"),
        };
        if scenario == Scenario::Pub && cfg.topic.contains(['+', '#']) {
            return Err(ArgError::WildcardInPublishTopic {
                topic: cfg.topic.clone(),
            });
        }
        Ok(cfg)
    }
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr, ArgError> {
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| ArgError::Unresolvable {
            host: host.to_string(),
            port,
        })
}

/// The subscribers' addresses from --sub-host/--sub-port (`[target]` without them), and
/// the report's label for the run's addresses.
fn sub_targets(
    msg: &MsgArgs,
    scenario: Scenario,
    subscribers: u32,
    target: SocketAddr,
) -> Result<(Vec<SocketAddr>, String), ArgError> {
    let common = &msg.common;
    let label = format!("{}:{}", common.host, common.port);
    if msg.sub_host.is_none() && msg.sub_port.is_empty() {
        return Ok((vec![target], label));
    }
    if subscribers == 0 {
        return Err(ArgError::NoSubscribers {
            scenario: scenario.name(),
        });
    }
    // Ports past the subscriber count would never be used: a mistake, not a plan.
    if msg.sub_port.len() > subscribers as usize {
        return Err(ArgError::SubPortsUnused {
            ports: msg.sub_port.len(),
            subscribers,
        });
    }
    let host = msg.sub_host.as_deref().unwrap_or(&common.host);
    let ports = if msg.sub_port.is_empty() {
        vec![common.port]
    } else {
        msg.sub_port.clone()
    };
    let targets = ports
        .iter()
        .map(|&p| resolve(host, p))
        .collect::<Result<Vec<_>, _>>()?;
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let label = format!("{label} (subscribers {host}:{})", ports.join(","));
    Ok((targets, label))
}

fn positive(name: &'static str, value: f64) -> Result<(), ArgError> {
    // Written so that NaN fails too.
    if value > 0.0 && value.is_finite() {
        Ok(())
    } else {
        Err(ArgError::ZeroRate { name })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<RunConfig, ArgError> {
        let mut argv = vec!["starling-bench"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
            .expect("clap accepts")
            .command
            .validate(Some(20_000))
    }

    #[test]
    fn pairs_defaults_are_bounded_in_count_and_time() {
        let c = parse(&["pairs"]).unwrap();
        assert_eq!(c.scenario, Scenario::Pairs);
        assert_eq!(c.clients, 100);
        assert_eq!(c.duration, Duration::from_secs(10));
        assert_eq!(c.count, 10_000_000);
        assert_eq!(c.payload_size, 64);
        assert!(c.source_spread, "loopback broker spreads sources");
        assert!(c.topic.starts_with("bench/"));
    }

    #[test]
    fn options_reach_the_config() {
        let c = parse(&[
            "fanin",
            "-c",
            "5",
            "-q",
            "2",
            "-V",
            "5",
            "-s",
            "128",
            "-r",
            "1000",
            "-n",
            "500",
            "--inflight",
            "10",
            "-p",
            "18830",
            "--no-source-spread",
            "-t",
            "x",
        ])
        .unwrap();
        assert_eq!((c.qos, c.protocol), (QoS::ExactlyOnce, Protocol::V5));
        assert_eq!(
            (c.payload_size, c.rate, c.count, c.inflight),
            (128, Some(1000.0), 500, 10)
        );
        assert_eq!(c.target.port(), 18830);
        assert!(!c.source_spread);
        assert_eq!(c.topic, "x");
    }

    #[test]
    fn payload_too_small_for_the_stamp_is_refused() {
        assert_eq!(
            parse(&["pairs", "-s", "19"]).unwrap_err(),
            ArgError::PayloadSizeOutOfRange {
                size: 19,
                min: STAMP_LEN,
                max: PAYLOAD_SIZE_MAX
            }
        );
    }

    #[test]
    fn zero_clients_rate_duration_and_window_are_refused() {
        assert!(matches!(
            parse(&["conn", "-c", "0"]),
            Err(ArgError::ClientsOutOfRange { .. })
        ));
        assert!(matches!(
            parse(&["pub", "-r", "0"]),
            Err(ArgError::ZeroRate { name: "rate" })
        ));
        assert!(matches!(
            parse(&["pub", "-d", "0"]),
            Err(ArgError::DurationOutOfRange { .. })
        ));
        assert!(matches!(
            parse(&["pub", "--inflight", "0"]),
            Err(ArgError::InflightOutOfRange { .. })
        ));
        assert!(matches!(
            parse(&["conn", "--connect-rate", "NaN"]),
            Err(ArgError::ZeroRate { .. })
        ));
    }

    #[test]
    fn count_below_one_message_per_publisher_is_refused() {
        assert_eq!(
            parse(&["pairs", "-c", "10", "-n", "5"]).unwrap_err(),
            ArgError::CountTooSmall {
                count: 5,
                publishers: 10
            }
        );
    }

    #[test]
    fn connections_past_the_file_limit_are_refused() {
        // pairs opens two connections per pair.
        assert!(parse(&["pairs", "-c", "9000"]).is_ok());
        assert!(matches!(
            parse(&["pairs", "-c", "10000"]),
            Err(ArgError::FileLimit { needed: 20_000, .. })
        ));
        assert!(parse(&["conn", "-c", "19000"]).is_ok());
    }

    #[test]
    fn wildcard_publish_topic_is_refused() {
        assert!(matches!(
            parse(&["pub", "-t", "a/+"]),
            Err(ArgError::WildcardInPublishTopic { .. })
        ));
    }

    #[test]
    fn bad_qos_and_version_are_refused_by_the_parser() {
        assert!(Cli::try_parse_from(["starling-bench", "pairs", "-q", "3"]).is_err());
        assert!(Cli::try_parse_from(["starling-bench", "pairs", "-V", "3"]).is_err());
    }

    #[test]
    fn source_addresses_cycle_over_250_loopback_addresses() {
        let c = parse(&["conn"]).unwrap();
        assert_eq!(c.source_for(0), Some("127.0.0.2".parse().unwrap()));
        assert_eq!(c.source_for(249), Some("127.0.0.251".parse().unwrap()));
        assert_eq!(c.source_for(250), Some("127.0.0.2".parse().unwrap()));
    }

    #[test]
    fn subscribers_default_to_the_publishers_address() {
        let c = parse(&["pairs", "-p", "1884"]).unwrap();
        assert_eq!(c.sub_targets, vec![c.target]);
        assert_eq!(c.sub_target_for(7), c.target);
        assert_eq!(c.target_label, "127.0.0.1:1884");
    }

    #[test]
    fn sub_host_and_port_move_the_subscribers_only() {
        let c = parse(&[
            "pairs",
            "-p",
            "1883",
            "--sub-host",
            "127.0.0.1",
            "--sub-port",
            "1884",
        ])
        .unwrap();
        assert_eq!(c.target.port(), 1883);
        assert_eq!(c.sub_targets, vec!["127.0.0.1:1884".parse().unwrap()]);
        assert_eq!(
            c.target_label,
            "127.0.0.1:1883 (subscribers 127.0.0.1:1884)"
        );
        assert!(c.source_spread);
        // --sub-host alone keeps --port.
        let c = parse(&["fanin", "-p", "1890", "--sub-host", "localhost"]).unwrap();
        assert_eq!(c.sub_targets[0].port(), 1890);
    }

    #[test]
    fn a_port_list_spreads_fanout_subscribers_round_robin() {
        let c = parse(&["fanout", "-c", "4", "--sub-ports", "1884,1885"]).unwrap();
        let ports: Vec<u16> = (0..4).map(|s| c.sub_target_for(s).port()).collect();
        assert_eq!(ports, [1884, 1885, 1884, 1885]);
        assert_eq!(c.target.port(), 1883);
        // The flag repeated appends, like the list.
        let c = parse(&["fanout", "--sub-port", "1884", "--sub-port", "1885"]).unwrap();
        assert_eq!(c.sub_targets.len(), 2);
    }

    #[test]
    fn sub_options_without_subscribers_or_with_unused_ports_are_refused() {
        assert_eq!(
            parse(&["pub", "--sub-port", "1884"]).unwrap_err(),
            ArgError::NoSubscribers { scenario: "pub" }
        );
        // fanin has one subscriber: a second port would get nobody.
        assert_eq!(
            parse(&["fanin", "--sub-port", "1884,1885"]).unwrap_err(),
            ArgError::SubPortsUnused {
                ports: 2,
                subscribers: 1
            }
        );
        assert!(Cli::try_parse_from(["starling-bench", "pairs", "--sub-port", "x"]).is_err());
        assert!(Cli::try_parse_from(["starling-bench", "pairs", "--sub-port", "70000"]).is_err());
        assert!(matches!(
            parse(&["pairs", "--sub-host", "no.such.host.invalid"]),
            Err(ArgError::Unresolvable { port: 1883, .. })
        ));
    }
}
