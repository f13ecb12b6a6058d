//! Persistent sessions across a SIGKILL, with real clients: a persistent MQTT 5 subscriber
//! (`mosquitto_sub -c`) that is away and a persistent MQTT 3.1.1 one that stays connected
//! while a paho-mqtt publisher sends 10,000 QoS 1 and 10,000 QoS 2 messages; the broker is killed with
//! SIGKILL after a random number of acknowledgements and restarted on the same store. Every
//! message the publisher saw acknowledged reaches both subscribers after they reconnect,
//! each QoS 2 message exactly once; a retained message and a pending `$delayed/` publish
//! survive; a session that expired while the broker was down does not come back.

#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, have, mosquitto, temp_dir, Daemon};

const COUNT: usize = 10_000;

/// A persistent `mosquitto_sub` on `k/#` at QoS 2, printing `topic payload` lines to `out`.
fn subscriber(port: u16, id: &str, version: &str, out: &Path) -> Child {
    let file = std::fs::File::create(out).expect("output file");
    Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", "-i", id, "-V", version, "-q", "2", "-t", "k/#", "-v"])
        .stdout(file)
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto_sub starts")
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

fn pub1(port: u16, args: &[&str]) {
    let port = port.to_string();
    let mut all = vec!["-h", "127.0.0.1", "-p", &port, "-q", "1"];
    all.extend_from_slice(args);
    let out = mosquitto("mosquitto_pub", &all).expect("checked above");
    assert!(out.status.success(), "mosquitto_pub {args:?}: {out:?}");
}

/// Waits until `cond` holds, up to `within`.
fn wait_for(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn config(dir: &Path, port: u16) -> PathBuf {
    let config = dir.join("starling.toml");
    std::fs::write(
        &config,
        format!(
            "[[listeners]]\nkind = \"tcp\"\nbind = \"127.0.0.1:{port}\"\n\
             [mqtt]\nmax_mqueue_len = 25000\n\
             [storage]\nfsync = \"always\"\n"
        ),
    )
    .expect("write config");
    config
}

/// Whether a persistent v5 session for `id` is present, by paho's CONNACK.
fn session_present(port: u16, id: &str) -> bool {
    let script = format!(
        "import paho.mqtt.client as m, threading\n\
         e = threading.Event(); r = {{}}\n\
         c = m.Client(m.CallbackAPIVersion.VERSION2, client_id={id:?}, protocol=m.MQTTv5)\n\
         def on_connect(c, u, f, rc, p):\n    r['p'] = f.session_present; e.set()\n\
         c.on_connect = on_connect\n\
         c.connect('127.0.0.1', {port}, clean_start=False)\n\
         c.loop_start(); e.wait(10); c.disconnect(); c.loop_stop()\n\
         print(r.get('p'))\n"
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .expect("python3 runs");
    let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(said == "True" || said == "False", "{out:?}");
    said == "True"
}

#[test]
fn persistent_sessions_lose_no_acknowledged_message_across_a_kill_9() {
    if mosquitto("mosquitto_sub", &["--help"]).is_none()
        || !have(
            "python3",
            &["-c", "import paho.mqtt.client as m; m.CallbackAPIVersion"],
            "pip install paho-mqtt",
        )
    {
        return;
    }
    let dir = temp_dir("kill9-sessions");
    let port = free_port();
    let config = config(&dir, port);
    let mut d = Daemon::start(&config);
    d.expect("starling started");

    let (out5, out3) = (dir.join("sub5.txt"), dir.join("sub3.txt"));
    let mut subs = [
        subscriber(port, "kill9-v5", "mqttv5", &out5),
        subscriber(port, "kill9-v311", "mqttv311", &out3),
    ];
    // Both subscribed once a probe reaches both.
    wait_for(Duration::from_secs(20), "the subscriptions", || {
        pub1(port, &["-t", "k/probe", "-m", "probe"]);
        [&out5, &out3]
            .iter()
            .all(|o| lines(o).iter().any(|l| l == "k/probe probe"))
    });
    // The v5 subscriber is away while the publisher runs: what it gets after the restart
    // comes from its stored queue. The 3.1.1 one stays: its in-flight flows cross the kill.
    let _ = subs[0].kill();
    let _ = subs[0].wait();
    // A session that expires a second after its client leaves.
    let _ = mosquitto(
        "mosquitto_sub",
        &[
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-c",
            "-i",
            "kill9-gone",
            "-V",
            "mqttv5",
            "-x",
            "1",
            "-t",
            "g/x",
            "-W",
            "1",
        ],
    );
    pub1(port, &["-r", "-t", "r/kept", "-m", "kept"]);
    pub1(port, &["-t", "$delayed/8/k/delayed", "-m", "delayed"]);

    // The kill lands after a number of acknowledgements drawn here (printed to replay).
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(7, |t| t.subsec_nanos() as usize);
    let kill_after = 1_000 + seed % (2 * COUNT - 4_000);
    println!("kill after {kill_after} acknowledgements");
    let mut publisher = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/publish_acked.py"
        ))
        .args(["--port", &port.to_string(), "--topic", "k/data"])
        .args(["--count", &COUNT.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 runs");
    let mut acked = BTreeSet::new();
    let mut killed_at = None;
    let started = Instant::now();
    for line in BufReader::new(publisher.stdout.take().expect("piped"))
        .lines()
        .map_while(Result::ok)
    {
        if let Some(p) = line.strip_prefix("acked ") {
            acked.insert(p.to_owned());
        }
        if acked.len() >= kill_after && killed_at.is_none() {
            d.child.kill().expect("SIGKILL");
            let _ = d.child.wait();
            killed_at = Some(started.elapsed());
        }
    }
    let _ = publisher.wait();
    let killed_at = killed_at.expect("the publisher reached the kill point");
    println!(
        "killed after {} acknowledgements, {killed_at:?} into publishing",
        acked.len()
    );
    drop(d);

    let mut d = Daemon::start(&config);
    d.expect("starling started");
    subs[0] = subscriber(port, "kill9-v5", "mqttv5", &out5);
    // Drained: the delayed message came and nothing more for two seconds.
    let mut last = (0, Instant::now());
    wait_for(Duration::from_secs(90), "the subscribers to drain", || {
        let n = lines(&out5).len() + lines(&out3).len();
        if n != last.0 {
            last = (n, Instant::now());
        }
        let delayed = [&out5, &out3]
            .iter()
            .all(|o| lines(o).iter().any(|l| l == "k/delayed delayed"));
        delayed && last.1.elapsed() > Duration::from_secs(2)
    });
    for s in &mut subs {
        let _ = s.kill();
        let _ = s.wait();
    }

    for (name, out) in [("v5", &out5), ("3.1.1", &out3)] {
        let mut seen: BTreeMap<String, u32> = BTreeMap::new();
        for l in lines(out) {
            if let Some(p) = l.strip_prefix("k/data ") {
                *seen.entry(p.to_owned()).or_insert(0) += 1;
            }
        }
        let missing: Vec<&String> = acked.iter().filter(|p| !seen.contains_key(*p)).collect();
        assert!(
            missing.is_empty(),
            "{name}: {} acknowledged messages never arrived, first {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        let twice: Vec<(&String, &u32)> = seen
            .iter()
            .filter(|(p, n)| p.starts_with("2:") && **n > 1)
            .collect();
        assert!(twice.is_empty(), "{name}: QoS 2 duplicates {twice:?}");
        println!(
            "{name}: {} distinct messages received, {} acknowledged",
            seen.len(),
            acked.len()
        );
    }

    let out = mosquitto(
        "mosquitto_sub",
        &[
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            "r/kept",
            "-C",
            "1",
            "-W",
            "5",
            "-v",
        ],
    )
    .expect("checked above");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "r/kept kept");
    assert!(
        !session_present(port, "kill9-gone"),
        "an expired session came back"
    );
    assert!(
        session_present(port, "kill9-v5"),
        "the persistent session is gone"
    );
}

/// A raw MQTT 5 CONNECT of `id` with clean start 0 and an hour's session expiry: the
/// connection and the CONNACK's session present flag.
fn connect_v5(port: u16, id: &str) -> (std::net::TcpStream, bool) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 5, 0x00, 0, 60];
    // Properties: session expiry interval 3600.
    body.extend_from_slice(&[5, 0x11, 0, 0, 0x0e, 0x10]);
    body.extend_from_slice(&(id.len() as u16).to_be_bytes());
    body.extend_from_slice(id.as_bytes());
    let mut packet = vec![0x10, body.len() as u8];
    packet.extend_from_slice(&body);
    s.write_all(&packet).expect("CONNECT");
    let mut head = [0u8; 2];
    s.read_exact(&mut head).expect("CONNACK");
    assert_eq!(head[0], 0x20, "a CONNACK");
    let mut rest = vec![0u8; usize::from(head[1])];
    s.read_exact(&mut rest).expect("CONNACK body");
    assert_eq!(rest[1], 0, "CONNACK reason code");
    (s, rest[0] & 1 == 1)
}

/// A client told its session was not there (session present 0) that has said nothing
/// since is told so again after a SIGKILL and a restart, and not handed an empty session
/// as if it were its old one; a client that spoke after its CONNACK finds its session.
#[test]
fn a_session_its_client_never_answered_stays_unheard_across_a_kill_9() {
    use std::io::{Read, Write};
    let dir = temp_dir("kill9-unheard");
    let port = free_port();
    let config = config(&dir, port);
    let mut d = Daemon::start(&config);
    d.expect("starling started");
    let (_silent, present) = connect_v5(port, "kill9-silent");
    assert!(!present);
    let (mut heard, present) = connect_v5(port, "kill9-heard");
    assert!(!present);
    // A QoS 1 PUBLISH and its PUBACK: the client went on from its CONNACK.
    heard
        .write_all(&[0x32, 8, 0, 3, b'h', b'/', b'x', 0, 1, 0])
        .expect("PUBLISH");
    let mut head = [0u8; 2];
    heard.read_exact(&mut head).expect("PUBACK");
    assert_eq!(head[0], 0x40, "a PUBACK");
    let mut rest = vec![0u8; usize::from(head[1])];
    heard.read_exact(&mut rest).expect("PUBACK body");
    // The meta's rewrite is not a barrier for the PUBACK: let it commit.
    std::thread::sleep(Duration::from_secs(1));
    d.child.kill().expect("SIGKILL");
    let _ = d.child.wait();
    drop(d);

    let mut d = Daemon::start(&config);
    d.expect("starling started");
    let (_, present) = connect_v5(port, "kill9-silent");
    assert!(
        !present,
        "a client never heard from after session present 0 was told present 1 after the restart"
    );
    let (_, present) = connect_v5(port, "kill9-heard");
    assert!(present, "the session of a client that went on was lost");
}
