//! End-to-end runs of the tool against a real Mosquitto, when one is
//! installed (`apt-get install mosquitto`); each test prints a note and
//! passes without it, so the suite runs on machines that lack it.

// Tests wait for the broker's port with real sleeps and time.
#![allow(clippy::disallowed_methods)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use clap::Parser;
use starling_bench::{run::run, Cli, Report};

const MOSQUITTO: &str = "/usr/sbin/mosquitto";

/// A Mosquitto on a free loopback port, killed when dropped.
struct Mosquitto {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Mosquitto {
    fn start(name: &str) -> Option<Mosquitto> {
        if !Path::new(MOSQUITTO).exists() {
            eprintln!("note: {MOSQUITTO} not installed; skipping {name}");
            return None;
        }
        // The OS picks a free port; Mosquitto binds it right after.
        let port = TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let dir =
            std::env::temp_dir().join(format!("starling-bench-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let conf = dir.join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\nmax_connections -1\n\
                 max_queued_messages 0\npersistence false\n"
            ),
        )
        .ok()?;
        let child = Command::new(MOSQUITTO)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto starts");
        let broker = Mosquitto { child, port, dir };
        for _ in 0..100 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(broker);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("mosquitto did not listen on {port}");
    }

    fn run(&self, args: &[&str]) -> Report {
        let port = self.port.to_string();
        let mut argv = vec!["starling-bench"];
        argv.extend_from_slice(args);
        argv.extend_from_slice(&["-p", &port, "--no-progress"]);
        let cfg = Cli::parse_from(argv)
            .command
            .validate(None)
            .expect("valid arguments");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let report = rt.block_on(run(&cfg));
        eprint!("{}", report.human_summary());
        report
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn pairs_qos1_delivers_every_message_exactly_once() {
    let Some(broker) = Mosquitto::start("pairs") else {
        return;
    };
    let r = broker.run(&["pairs", "-c", "10", "-q", "1", "-d", "2"]);
    assert_eq!(r.connect.ok, 20, "{}", r.to_json_line());
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    assert!(r.sent > 0);
    assert_eq!(r.acked, r.sent);
    assert_eq!(r.expected, Some(r.sent));
    assert_eq!(r.received, r.sent);
    assert_eq!((r.lost, r.duplicates), (Some(0), 0));
    assert_eq!(r.latency_us.count, r.received);
    assert!(r.latency_us.p50 > 0.0 && r.latency_us.p50 <= r.latency_us.p999);
}

#[test]
fn fanout_qos2_mqtt5_counts_each_subscriber_delivery() {
    let Some(broker) = Mosquitto::start("fanout") else {
        return;
    };
    let r = broker.run(&[
        "fanout", "-c", "5", "-q", "2", "-V", "5", "-n", "2000", "-d", "10",
    ]);
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    assert_eq!((r.sent, r.acked), (2000, 2000));
    assert_eq!(r.expected, Some(10_000));
    assert_eq!((r.received, r.lost, r.duplicates), (10_000, Some(0), 0));
}

#[test]
fn fixed_rate_fanin_keeps_the_rate() {
    let Some(broker) = Mosquitto::start("fanin") else {
        return;
    };
    let r = broker.run(&["fanin", "-c", "10", "-q", "0", "-r", "2000", "-d", "1"]);
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    // 2000 msg/s for one second, give or take the scheduling of the last tick.
    assert!((1800..=2300).contains(&r.sent), "sent {}", r.sent);
    assert_eq!(r.lost, Some(0));
}

#[test]
fn conn_measures_broker_memory_per_connection() {
    let Some(broker) = Mosquitto::start("conn") else {
        return;
    };
    let pid = broker.child.id().to_string();
    let r = broker.run(&["conn", "-c", "300", "-d", "0.5", "--broker-pid", &pid]);
    assert_eq!((r.connect.ok, r.errors), (300, 0), "{:?}", r.first_error);
    assert_eq!(r.connect.latency_us.count, 300);
    let rss = r.broker_rss.expect("rss read");
    assert!(rss.after_kib >= rss.before_kib);
    assert!(rss.per_connection_bytes.is_some());
}
