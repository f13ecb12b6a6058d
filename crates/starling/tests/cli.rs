//! The `starling` binary end to end: `cert dev`, a first run without certificates, and
//! certificate reload on SIGHUP.

// Real processes on the wall clock, never under the simulator: threads and `Instant::now`
// are what they need.
#![allow(clippy::disallowed_methods)]

use std::process::Command;
use std::time::Duration;

mod common;

use common::{listening_addr, mosquitto, starling, temp_dir, Daemon};

#[test]
fn cert_dev_writes_certificates_prints_their_config_and_never_overwrites() {
    let dir = temp_dir("cert-dev").join("certs");
    let out = starling()
        .args(["cert", "dev"])
        .arg(&dir)
        .output()
        .expect("starling runs");
    assert!(out.status.success(), "{out:?}");
    for f in ["ca.pem", "ca.key", "server.pem", "server.key"] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    let snippet = String::from_utf8(out.stdout).expect("UTF-8");
    assert!(
        snippet.contains("[listeners.tls]") && snippet.contains("server.pem"),
        "{snippet}"
    );

    let again = starling()
        .args(["cert", "dev"])
        .arg(&dir)
        .output()
        .expect("starling runs");
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("ca.pem"), "{err}");
}

#[test]
fn first_run_without_certificate_starts_plain_listeners_and_says_tls_needs_one() {
    let dir = temp_dir("first-run");
    let config = dir.join("starling.toml");
    std::fs::write(
        &config,
        "[[listeners]]\nkind = \"tcp\"\nbind = \"127.0.0.1:0\"\n\n\
         [[listeners]]\nkind = \"tls\"\nbind = \"127.0.0.1:8883\"\n",
    )
    .expect("write config");
    let mut d = Daemon::start(&config);
    d.expect("needs a certificate");
    d.expect("starling cert dev");
    d.expect("starling started");
    assert!(
        !d.seen
            .iter()
            .any(|l| l.contains("listening") && l.contains("kind=tls")),
        "a TLS listener without certificate started:\n{}",
        d.seen.join("\n")
    );
}

#[test]
fn sighup_reloads_the_certificates_of_tls_listeners() {
    let dir = temp_dir("sighup");
    let out = starling()
        .args(["cert", "dev"])
        .arg(dir.join("certs"))
        .output()
        .expect("starling runs");
    assert!(out.status.success(), "{out:?}");
    let config = dir.join("starling.toml");
    std::fs::write(
        &config,
        "[[listeners]]\nkind = \"tls\"\nbind = \"127.0.0.1:0\"\n\
         [listeners.tls]\ncert_file = \"certs/server.pem\"\nkey_file = \"certs/server.key\"\n",
    )
    .expect("write config");
    let mut d = Daemon::start(&config);
    d.expect("starling started");
    d.signal("HUP");
    d.expect("certificate reloaded");

    // A broken key: the failure names the file, the broker keeps running.
    std::fs::write(dir.join("certs/server.key"), "not a key").expect("write");
    d.signal("HUP");
    d.expect("server.key");
}

/// The address a `listening` line of the log names.
#[test]
fn a_flood_of_malformed_connects_is_logged_a_line_at_a_time_and_volatility_is_announced() {
    let dir = temp_dir("log-flood");
    let config = dir.join("starling.toml");
    std::fs::write(
        &config,
        "[[listeners]]\nkind = \"tcp\"\nbind = \"127.0.0.1:0\"\n[storage]\nenabled = false\n",
    )
    .expect("write config");
    let mut d = Daemon::start(&config);
    // Without the store nothing survives a restart, and the operator is told so.
    d.expect("kept in memory only");
    let addr = listening_addr(&mut d);
    d.expect("starling started");
    for _ in 0..200 {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        // A CONNECT whose protocol name is garbage.
        let _ = s.write_all(&[0x10, 0x06, 0x00, 0x04, b'X', b'Y', b'Z', b'W']);
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.read(&mut [0u8; 16]);
    }
    // Collect what the flood wrote.
    while let Ok(line) = d.lines.recv_timeout(Duration::from_millis(500)) {
        d.seen.push(line);
    }
    let lines = d
        .seen
        .iter()
        .filter(|l| l.contains("malformed CONNECT"))
        .count();
    assert!(
        (1..=2).contains(&lines),
        "{lines} log lines for 200 malformed CONNECTs:\n{}",
        d.seen.join("\n")
    );
}

#[test]
fn a_retained_message_survives_a_kill_9_and_store_check_reads_the_store() {
    let dir = temp_dir("kill9");
    let config = dir.join("starling.toml");
    std::fs::write(
        &config,
        "[[listeners]]\nkind = \"tcp\"\nbind = \"127.0.0.1:0\"\n",
    )
    .expect("write config");
    let mut d = Daemon::start(&config);
    d.expect("store opened");
    let port = listening_addr(&mut d).port().to_string();
    d.expect("starling started");
    let Some(out) = mosquitto(
        "mosquitto_pub",
        &[
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-q",
            "1",
            "-r",
            "-t",
            "fleet/7/cmd",
            "-m",
            "reboot",
        ],
    ) else {
        return;
    };
    assert!(out.status.success(), "{out:?}");
    // mosquitto_pub got its PUBACK: the retained message is durable. Killed at once,
    // without a chance to close anything, the broker must still have it.
    d.child.kill().expect("SIGKILL");
    let _ = d.child.wait();
    drop(d);

    // Offline, the store checks out and holds the message.
    let store = dir.join("data").join("store.redb");
    let out = starling()
        .args(["store", "check"])
        .arg(&store)
        .output()
        .expect("starling runs");
    assert!(out.status.success(), "{out:?}");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("1 retained"), "{report}");

    let mut d = Daemon::start(&config);
    let port = listening_addr(&mut d).port().to_string();
    d.expect("starling started");
    let out = mosquitto(
        "mosquitto_sub",
        &[
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "fleet/+/cmd",
            "-C",
            "1",
            "-W",
            "5",
            "-v",
        ],
    )
    .expect("found above");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "fleet/7/cmd reboot"
    );

    // A damaged store: check names the file, and the broker refuses to start on it.
    drop(d);
    std::fs::write(&store, vec![0x33; 4096]).expect("damage");
    let out = starling()
        .args(["--config"])
        .arg(&config)
        .args(["store", "check"])
        .output()
        .expect("starling runs");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("store.redb"),
        "{out:?}"
    );
    // Under `timeout`: a broker that started anyway would otherwise run forever.
    let out = Command::new("timeout")
        .arg("20")
        .arg(env!("CARGO_BIN_EXE_starling"))
        .arg("--config")
        .arg(&config)
        .output()
        .expect("starling runs");
    assert!(!out.status.success(), "started on a damaged store");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("store.redb"),
        "{out:?}"
    );
}
