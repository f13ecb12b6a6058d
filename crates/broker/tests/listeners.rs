//! Listeners of every kind, exercised by real clients: mosquitto_pub/mosquitto_sub over TLS
//! (with and without a client certificate), Python paho-mqtt over ws and wss, MQTT.js over
//! ws, our own codec client over QUIC, and a browser page (headless Chromium running MQTT.js)
//! over ws. Then bad input on each transport, and certificate reload.
//!
//! A test whose client program is missing prints a note saying what to install and passes,
//! except under CI (`CI` set), where it fails: `.ci/run` installs them all
//! (mosquitto-clients, chromium, paho-mqtt, `npm ci` in `tests/js`).
//!
//! Listeners are built as typed config rather than TOML: the file format refuses two
//! listeners on the same address and port, and port 0 on 127.0.0.1 is that for every kind.

// Real processes on the wall clock, never under the simulator: threads and `Instant::now`
// are what they need.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{connect_packet, ByteStream, Client, WAIT};
use starling_broker::Broker;
use starling_codec::{Packet, Protocol, QoS, ReasonCode};
use starling_config::{Config, ListenerConfig, ListenerKind, QuicConfig, TlsConfig, WsConfig};
use starling_net::{
    load_certs, tls_connect, write_dev_certificates, ws_connect, CertAuthority, CertificateDer,
    ClientTls, DevCertFiles, Identity, QuicBiStream, QuicEndpoint, ALPN_MQTT,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long a client program may take for its whole run.
const PROGRAM_WAIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------
// Fixture: certificates, listeners, a broker.

/// A development CA and server certificate in a fresh directory.
struct Certs {
    dir: PathBuf,
    dev: DevCertFiles,
    ca: CertificateDer<'static>,
}

impl Certs {
    fn new(name: &str) -> Certs {
        let dir = common::temp_dir(name);
        let dev = write_dev_certificates(&dir.join("dev"), &[]).expect("dev certificates");
        let ca = load_certs(&dev.ca_cert).expect("dev CA loads").remove(0);
        Certs { dir, dev, ca }
    }

    /// The listener's TLS settings; with `verify`, client certificates from the dev CA are
    /// required and their CN is the username.
    fn tls(&self, verify: bool) -> TlsConfig {
        TlsConfig {
            cert_file: self.dev.server_cert.clone(),
            key_file: self.dev.server_key.clone(),
            ca_file: verify.then(|| self.dev.ca_cert.clone()),
            verify_client: verify,
            cn_as_username: verify,
        }
    }

    /// A client certificate for `cn` signed by the dev CA, written as `{cn}.pem` and
    /// `{cn}.key`; returns the files and the identity. ECDSA P-256: OpenSSL (mosquitto)
    /// does not load the PKCS#8 v2 Ed25519 keys that `CertAuthority::issue` writes.
    fn client(&self, cn: &str) -> (PathBuf, PathBuf, Identity) {
        let read = |p: &Path| std::fs::read_to_string(p).expect("read dev CA");
        let ca_key = rcgen::KeyPair::from_pem(&read(&self.dev.ca_key)).expect("CA key");
        let issuer = rcgen::Issuer::from_ca_cert_pem(&read(&self.dev.ca_cert), ca_key).expect("CA");
        let mut params = rcgen::CertificateParams::new(vec![cn.to_owned()]).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let cert = params.signed_by(&key, &issuer).expect("sign");
        let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
        let cert_file = self.dir.join(format!("{cn}.pem"));
        let key_file = self.dir.join(format!("{cn}.key"));
        std::fs::write(&cert_file, &cert_pem).expect("write cert");
        std::fs::write(&key_file, &key_pem).expect("write key");
        let identity = Identity::from_pem(&cert_pem, &key_pem).expect("identity");
        (cert_file, key_file, identity)
    }

    /// A client trusting the dev CA.
    fn client_tls(&self) -> ClientTls {
        ClientTls::new(vec![self.ca.clone()])
    }
}

fn listener(kind: ListenerKind, tls: Option<TlsConfig>) -> ListenerConfig {
    ListenerConfig {
        kind,
        bind: "127.0.0.1:0".parse().expect("address"),
        tls,
        ws: kind.is_websocket().then(|| WsConfig {
            path: "/mqtt".to_owned(),
            x_forwarded_for: false,
        }),
        quic: (kind == ListenerKind::Quic).then_some(QuicConfig {
            idle_timeout_secs: 30,
        }),
        ..ListenerConfig::default()
    }
}

/// A broker with these listeners and `$SYS` every second; `tweak` adjusts the rest.
async fn start(listeners: Vec<ListenerConfig>, tweak: impl FnOnce(&mut Config)) -> Broker {
    let mut config = Config {
        listeners,
        ..Config::default()
    };
    config.mqtt.sys_interval_secs = 1;
    // Tests run in parallel: a store under the default data_dir would be shared by all.
    config.storage.enabled = false;
    tweak(&mut config);
    Broker::start(config).await.expect("broker starts")
}

fn addr(broker: &Broker, kind: ListenerKind) -> SocketAddr {
    broker.local_addr(kind).expect("listener bound")
}

// ---------------------------------------------------------------------------------------
// Our own client over each transport.

async fn tls_stream(addr: SocketAddr, tls: &ClientTls) -> Box<dyn ByteStream> {
    let tcp = TcpStream::connect(addr).await.expect("tcp connect");
    Box::new(
        tls_connect(tcp, tls, "localhost", addr)
            .await
            .expect("tls handshake"),
    )
}

async fn ws_stream(addr: SocketAddr) -> Box<dyn ByteStream> {
    let tcp = TcpStream::connect(addr).await.expect("tcp connect");
    let uri = format!("ws://{addr}/mqtt");
    Box::new(
        ws_connect(tcp, &uri, &["mqtt"], addr)
            .await
            .expect("ws upgrade"),
    )
}

/// A QUIC client endpoint trusting `tls`'s CAs and offering ALPN `mqtt`.
async fn quic_endpoint(tls: &ClientTls) -> QuicEndpoint {
    let config = starling_net::QuicConfig::new([7; 32]);
    QuicEndpoint::client(
        "127.0.0.1:0".parse().expect("address"),
        &tls.clone().alpn(&[ALPN_MQTT]),
        &config,
    )
    .await
    .expect("quic client endpoint")
}

async fn mqtt_on(stream: Box<dyn ByteStream>, id: &str) -> Client {
    let (c, ack) = Client::open_on(stream, connect_packet(Protocol::V5, id, true)).await;
    assert_eq!(ack.reason_code, ReasonCode::Success, "{ack:?}");
    c
}

/// One subscriber and one publisher (each on its own connection): a message at each QoS
/// arrives at the QoS it was sent with.
async fn round_trips(mut sub: Client, mut publ: Client, topic: &str) {
    let ack = sub.subscribe(1, topic, QoS::ExactlyOnce).await;
    assert_eq!(ack.reason_codes, vec![ReasonCode::GrantedQoS2]);
    for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
        let payload = format!("{qos:?}");
        publ.publish(topic, payload.as_bytes(), qos, false).await;
        let p = sub.recv_publish().await;
        assert_eq!((p.payload.as_ref(), p.qos), (payload.as_bytes(), qos));
    }
    sub.disconnect().await;
    publ.disconnect().await;
}

/// Waits until `check` holds for the listener counters of `kind`.
async fn wait_counter(
    broker: &Broker,
    kind: ListenerKind,
    what: &str,
    check: impl Fn(&starling_net::CounterSnapshot) -> bool,
) {
    let deadline = Instant::now() + WAIT;
    loop {
        let counters = broker.listener_counters();
        let (_, _, c) = counters
            .iter()
            .find(|(k, _, _)| *k == kind)
            .expect("listener");
        if check(c) {
            return;
        }
        assert!(Instant::now() < deadline, "{kind} {what}: counters {c:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------
// External programs.

/// Whether `program` can be started; prints why the test is skipped when it cannot.
fn have(program: &str, install: &str) -> bool {
    let found = Command::new(program)
        .arg("--help")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        common::tool_missing(program, install);
    }
    found
}

fn js_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js")
}

/// Whether MQTT.js is installed under `tests/js`; prints why the test is skipped if not.
fn have_mqtt_js() -> bool {
    if !have("node", "apt-get install nodejs") {
        return false;
    }
    let found = js_dir().join("node_modules/mqtt/dist/mqtt.min.js").exists();
    if !found {
        common::tool_missing("MQTT.js", "cd crates/broker/tests/js && npm ci");
    }
    found
}

/// A child process killed when the test ends, passed or not.
struct Spawned(Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs a program to completion (at most [`PROGRAM_WAIT`]) off the runtime's threads;
/// returns its stdout, or a message with its exit status and stderr.
async fn run(program: &str, args: Vec<String>) -> Result<String, String> {
    let program = program.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut child = Spawned(
            Command::new(&program)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("{program}: {e}"))?,
        );
        let deadline = Instant::now() + PROGRAM_WAIT;
        let status = loop {
            if let Some(status) = child.0.try_wait().map_err(|e| e.to_string())? {
                break status;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{program} {args:?}: still running after {PROGRAM_WAIT:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = String::new();
        let mut err = String::new();
        if let Some(s) = child.0.stdout.as_mut() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(s) = child.0.stderr.as_mut() {
            let _ = s.read_to_string(&mut err);
        }
        if status.success() {
            Ok(out)
        } else {
            Err(format!(
                "{program} {args:?}: {status}\nstdout:\n{out}\nstderr:\n{err}"
            ))
        }
    })
    .await
    .expect("runner thread")
}

/// mosquitto_sub subscribes (waiting for its SUBACK), mosquitto_pub publishes one message
/// at `qos`, and the subscriber must print it. `tls` is added to both command lines.
fn mosquitto_round_trip(port: u16, tls: &[String], topic: &str, qos: u8) -> Result<(), String> {
    let payload = format!("mosquitto qos {qos}");
    let common = |id: &str| -> Vec<String> {
        let mut v: Vec<String> = [
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            topic,
            "-q",
            &qos.to_string(),
            "-i",
            id,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        v.extend_from_slice(tls);
        v
    };
    let mut sub_args = common(&format!("sub-q{qos}"));
    sub_args.extend(["-C", "1", "-W", "20", "-d"].map(str::to_owned));
    // Line-buffered (coreutils' stdbuf): a pipe would otherwise hold mosquitto_sub's lines,
    // the SUBACK among them, until it exits.
    let mut sub = Spawned(
        Command::new("stdbuf")
            .arg("-oL")
            .arg("mosquitto_sub")
            .args(&sub_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("mosquitto_sub: {e}"))?,
    );
    let stdout = sub.0.stdout.take().expect("piped");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    let mut wait_line = |want: &dyn Fn(&str) -> bool| -> Result<(), String> {
        let deadline = Instant::now() + PROGRAM_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = want(&line);
                    seen.push(line);
                    if hit {
                        return Ok(());
                    }
                }
                Err(_) => return Err(format!("mosquitto_sub printed {seen:#?}")),
            }
        }
    };
    wait_line(&|l| l.contains("received SUBACK"))?;
    let mut pub_args = common(&format!("pub-q{qos}"));
    pub_args.extend(["-m".to_owned(), payload.clone()]);
    let out = Command::new("mosquitto_pub")
        .args(&pub_args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("mosquitto_pub: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mosquitto_pub {pub_args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    wait_line(&|l| l == payload)?;
    let status = sub.0.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("mosquitto_sub: {status}"));
    }
    Ok(())
}

async fn mosquitto_round_trips(port: u16, tls: Vec<String>, topic: &str) {
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        for qos in 0..=2 {
            if let Err(e) = mosquitto_round_trip(port, &tls, &topic, qos) {
                panic!("QoS {qos}: {e}");
            }
        }
    })
    .await
    .expect("mosquitto round trips");
}

fn path_arg(p: &Path) -> String {
    p.to_str().expect("UTF-8 temp path").to_owned()
}

// ---------------------------------------------------------------------------------------
// Real clients.

#[test]
fn mosquitto_over_tls_without_client_certificate_round_trips_qos_0_1_2() {
    common::on_actix(async {
        if !have("mosquitto_sub", "apt-get install mosquitto-clients") {
            return;
        }
        let certs = Certs::new("mosq-tls");
        let broker = start(
            vec![listener(ListenerKind::Tls, Some(certs.tls(false)))],
            |_| {},
        )
        .await;
        let port = addr(&broker, ListenerKind::Tls).port();
        let tls = vec!["--cafile".to_owned(), path_arg(&certs.dev.ca_cert)];
        mosquitto_round_trips(port, tls, "mosq/tls").await;
        broker.shutdown().await;
    })
}

#[test]
fn mosquitto_over_tls_with_client_certificate_round_trips_with_the_cn_as_username() {
    common::on_actix(async {
        if !have("mosquitto_sub", "apt-get install mosquitto-clients") {
            return;
        }
        let certs = Certs::new("mosq-mtls");
        // Anonymous clients are refused and the ACL grants only `devices/{username}/#`: a
        // client gets in and reaches its topics only as the CN of its certificate.
        let acl = certs.dir.join("acl.toml");
        std::fs::write(
            &acl,
            "[[rules]]\npermission = \"allow\"\naction = \"all\"\ntopics = [\"devices/%u/#\"]\n",
        )
        .expect("write acl");
        let mut l = listener(ListenerKind::Tls, Some(certs.tls(true)));
        l.allow_anonymous = false;
        let broker = start(vec![l], |c| {
            c.auth.acl_file = Some(acl.clone());
            c.auth.acl_default = starling_config::AclDefault::Deny;
        })
        .await;
        let tls_addr = addr(&broker, ListenerKind::Tls);
        let (cert, key, identity) = certs.client("device-1");
        let tls = vec![
            "--cafile".to_owned(),
            path_arg(&certs.dev.ca_cert),
            "--cert".to_owned(),
            path_arg(&cert),
            "--key".to_owned(),
            path_arg(&key),
        ];
        mosquitto_round_trips(tls_addr.port(), tls, "devices/device-1/temp").await;

        // The username is the CN: our own client with the same certificate may subscribe to
        // its own subtree only.
        let client_tls = certs.client_tls().identity(identity);
        let mut c = mqtt_on(tls_stream(tls_addr, &client_tls).await, "own-device-1").await;
        let own = c.subscribe(1, "devices/device-1/#", QoS::AtLeastOnce).await;
        assert_eq!(own.reason_codes, vec![ReasonCode::GrantedQoS1]);
        let other = c.subscribe(2, "devices/device-2/#", QoS::AtLeastOnce).await;
        assert_eq!(other.reason_codes, vec![ReasonCode::NotAuthorized]);
        c.disconnect().await;

        // Without a certificate the TLS handshake fails: counted, and nothing else disturbed.
        let before = broker.listener_counters()[0].2.handshake_failed;
        let no_cert = run(
            "mosquitto_pub",
            [
                "-h",
                "127.0.0.1",
                "-p",
                &tls_addr.port().to_string(),
                "--cafile",
                &path_arg(&certs.dev.ca_cert),
                "-t",
                "devices/device-1/x",
                "-m",
                "nope",
            ]
            .map(str::to_owned)
            .to_vec(),
        )
        .await;
        assert!(
            no_cert.is_err(),
            "mosquitto_pub without a certificate got in"
        );
        wait_counter(&broker, ListenerKind::Tls, "handshake_failed", |c| {
            c.handshake_failed > before
        })
        .await;
        broker.shutdown().await;
    })
}

#[test]
fn paho_over_ws_and_wss_round_trips_qos_0_1_2() {
    common::on_actix(async {
        if !have("python3", "apt-get install python3") {
            return;
        }
        if run(
            "python3",
            vec!["-c".into(), "import paho.mqtt.client".into()],
        )
        .await
        .is_err()
        {
            common::tool_missing("Python paho-mqtt", "pip install paho-mqtt");
            return;
        }
        let certs = Certs::new("paho");
        let broker = start(
            vec![
                listener(ListenerKind::Ws, None),
                listener(ListenerKind::Wss, Some(certs.tls(false))),
            ],
            |_| {},
        )
        .await;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/paho_roundtrip.py");
        for (kind, tls) in [
            (ListenerKind::Ws, vec![]),
            (
                ListenerKind::Wss,
                vec!["--cafile".to_owned(), path_arg(&certs.dev.ca_cert)],
            ),
        ] {
            let mut args = vec![
                path_arg(&script),
                "--port".to_owned(),
                addr(&broker, kind).port().to_string(),
                "--transport".to_owned(),
                "websockets".to_owned(),
                "--path".to_owned(),
                "/mqtt".to_owned(),
            ];
            args.extend(tls);
            let out = run("python3", args)
                .await
                .unwrap_or_else(|e| panic!("paho over {kind}: {e}"));
            assert_eq!(out.lines().count(), 3, "paho over {kind}: {out}");
        }
        broker.shutdown().await;
    })
}

#[test]
fn mqtt_js_over_ws_round_trips_qos_0_1_2() {
    common::on_actix(async {
        if !have_mqtt_js() {
            return;
        }
        let broker = start(vec![listener(ListenerKind::Ws, None)], |_| {}).await;
        let url = format!("ws://{}/mqtt", addr(&broker, ListenerKind::Ws));
        let script = path_arg(&js_dir().join("roundtrip.js"));
        let out = run("node", vec![script, url])
            .await
            .unwrap_or_else(|e| panic!("MQTT.js: {e}"));
        assert_eq!(out.lines().count(), 3, "MQTT.js: {out}");
        broker.shutdown().await;
    })
}

#[test]
fn own_client_over_quic_round_trips_qos_0_1_2() {
    common::on_actix(async {
        let certs = Certs::new("quic");
        let broker = start(
            vec![listener(ListenerKind::Quic, Some(certs.tls(false)))],
            |_| {},
        )
        .await;
        let quic = addr(&broker, ListenerKind::Quic);
        let endpoint = quic_endpoint(&certs.client_tls()).await;
        let open = |id: &'static str| {
            let endpoint = endpoint.clone();
            async move {
                let s = QuicBiStream::connect(&endpoint, quic, "localhost")
                    .await
                    .expect("quic connect");
                mqtt_on(Box::new(s), id).await
            }
        };
        let sub = open("quic-sub").await;
        let publ = open("quic-pub").await;
        round_trips(sub, publ, "quic/t").await;
        broker.shutdown().await;
    })
}

#[test]
fn browser_page_over_ws_receives_what_mosquitto_pub_publishes_over_tcp() {
    common::on_actix(async {
        let Some(chromium) = ["chromium", "chromium-browser"]
            .into_iter()
            .find(|p| Command::new(p).arg("--version").output().is_ok())
        else {
            common::tool_missing("chromium", "apt-get install chromium");
            return;
        };
        if !have("mosquitto_pub", "apt-get install mosquitto-clients") || !have_mqtt_js() {
            return;
        }
        let broker = start(
            vec![
                listener(ListenerKind::Tcp, None),
                listener(ListenerKind::Ws, None),
            ],
            |_| {},
        )
        .await;
        let tcp = addr(&broker, ListenerKind::Tcp);
        let ws = addr(&broker, ListenerKind::Ws);
        let http = serve_page().await;

        // The test watches the page's messages over TCP.
        let mut watcher = Client::connect(tcp, Protocol::V5, "watcher", true).await;
        watcher.subscribe(1, "browser/+", QoS::AtLeastOnce).await;

        let profile = common::temp_dir("chromium-profile");
        let url = format!("http://{http}/page.html?ws=ws://{ws}/mqtt");
        let _browser = Spawned(
            Command::new(chromium)
                .args([
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    &format!("--user-data-dir={}", profile.display()),
                    &url,
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("chromium starts"),
        );

        // A browser takes seconds to start; the page says when its subscription is in place.
        let ready = wait_publish(&mut watcher, "browser/ready", Duration::from_secs(60)).await;
        assert_eq!(ready, "ready");
        let args = [
            "-h",
            "127.0.0.1",
            "-p",
            &tcp.port().to_string(),
            "-t",
            "browser/in",
            "-q",
            "1",
            "-m",
            "hello from mosquitto_pub",
        ]
        .map(str::to_owned)
        .to_vec();
        run("mosquitto_pub", args)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let ack = wait_publish(&mut watcher, "browser/ack", Duration::from_secs(20)).await;
        assert_eq!(ack, "got:hello from mosquitto_pub");
        drop(_browser);
        let _ = std::fs::remove_dir_all(&profile);
        broker.shutdown().await;
    })
}

/// The payload of the next PUBLISH on `topic` within `limit` (others are skipped).
async fn wait_publish(c: &mut Client, topic: &str, limit: Duration) -> String {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match c.recv_within(left).await {
            Ok(Some(Packet::Publish(p))) => {
                if let Some(id) = p.packet_id {
                    c.send(Packet::Puback(starling_codec::PubAck::new(id)))
                        .await;
                }
                if p.topic == topic {
                    return String::from_utf8_lossy(&p.payload).into_owned();
                }
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("broker closed the watcher"),
            Err(()) => panic!("nothing on {topic} within {limit:?}"),
        }
    }
}

/// Serves `tests/js/page.html` and MQTT.js's browser bundle on an ephemeral port; one
/// request per connection.
async fn serve_page() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("http bind");
    let addr = listener.local_addr().expect("http addr");
    let dir = js_dir();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let dir = dir.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16 * 1024 {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&req);
                let path = line.split_whitespace().nth(1).unwrap_or("/");
                let path = path.split('?').next().unwrap_or("/");
                let (status, kind, body) = match path {
                    "/page.html" => ("200 OK", "text/html", std::fs::read(dir.join("page.html"))),
                    "/mqtt.min.js" => (
                        "200 OK",
                        "text/javascript",
                        std::fs::read(dir.join("node_modules/mqtt/dist/mqtt.min.js")),
                    ),
                    _ => ("404 Not Found", "text/plain", Ok(b"not found".to_vec())),
                };
                let body = body.expect("page files");
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&body).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

// ---------------------------------------------------------------------------------------
// Bad input.

#[test]
fn bad_handshakes_end_only_their_connection_and_are_counted_in_sys() {
    common::on_actix(async {
        let certs = Certs::new("bad");
        let broker = start(
            vec![
                listener(ListenerKind::Tcp, None),
                listener(ListenerKind::Tls, Some(certs.tls(true))),
                listener(ListenerKind::Ws, None),
                listener(ListenerKind::Quic, Some(certs.tls(false))),
            ],
            |_| {},
        )
        .await;
        let tcp = addr(&broker, ListenerKind::Tcp);
        let tls = addr(&broker, ListenerKind::Tls);
        let ws = addr(&broker, ListenerKind::Ws);
        let quic = addr(&broker, ListenerKind::Quic);

        // A client that stays connected through all of it.
        let mut bystander = Client::connect(tcp, Protocol::V5, "bystander", true).await;
        bystander
            .subscribe(1, "bystander/t", QoS::AtLeastOnce)
            .await;

        // TLS: a client certificate from a CA the listener does not trust.
        let stranger = CertAuthority::generate("not the dev CA").expect("ca");
        let wrong = stranger.issue("intruder", &["intruder"]).expect("cert");
        let tcp_conn = TcpStream::connect(tls).await.expect("tcp connect");
        let client_tls = certs.client_tls().identity(wrong.identity());
        // TLS 1.3 lets the client finish before the server checks its certificate: the failure
        // shows on the server, and the client's next read ends.
        if let Ok(mut s) = tls_connect(tcp_conn, &client_tls, "localhost", tls).await {
            let _ = s.write_all(b"\x10\x00").await;
            let mut scratch = [0u8; 16];
            let read = tokio::time::timeout(WAIT, s.read(&mut scratch)).await;
            assert!(
                !matches!(read, Ok(Ok(n)) if n > 0),
                "the broker answered a client with a wrong certificate"
            );
        }
        wait_counter(&broker, ListenerKind::Tls, "handshake_failed", |c| {
            c.handshake_failed == 1 && c.accepted == 0
        })
        .await;
        // A right certificate still gets in.
        let (_, _, good) = certs.client("device-ok");
        let c = mqtt_on(
            tls_stream(tls, &certs.client_tls().identity(good)).await,
            "tls-ok",
        )
        .await;
        c.disconnect().await;

        // WebSocket: an upgrade without the mqtt subprotocol gets 400 and is closed.
        let mut raw = TcpStream::connect(ws).await.expect("tcp connect");
        raw.write_all(
        b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .await
    .expect("write upgrade");
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(WAIT, raw.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        wait_counter(&broker, ListenerKind::Ws, "handshake_failed", |c| {
            c.handshake_failed == 1
        })
        .await;
        let c = mqtt_on(ws_stream(ws).await, "ws-ok").await;
        c.disconnect().await;

        // QUIC: datagrams of garbage never become a connection (quinn drops what does not
        // parse or authenticate); a client offering the wrong ALPN fails its handshake; a
        // connection sending garbage where the CONNECT belongs is closed.
        let udp = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("udp bind");
        let mut junk = vec![0xC3u8; 1200];
        for (i, b) in junk.iter_mut().enumerate().skip(1) {
            *b = (i * 31 % 251) as u8;
        }
        for datagram in [&junk[..], b"garbage", &[0u8; 1300][..]] {
            udp.send_to(datagram, quic).await.expect("udp send");
        }
        let wrong_alpn = QuicEndpoint::client(
            "127.0.0.1:0".parse().expect("address"),
            &certs.client_tls().alpn(&[b"not-mqtt"]),
            &starling_net::QuicConfig::new([9; 32]),
        )
        .await
        .expect("endpoint");
        assert!(QuicBiStream::connect(&wrong_alpn, quic, "localhost")
            .await
            .is_err());
        wait_counter(&broker, ListenerKind::Quic, "handshake_failed", |c| {
            c.handshake_failed == 1
        })
        .await;
        let refused_before = broker.metrics().connections_refused;
        let endpoint = quic_endpoint(&certs.client_tls()).await;
        let mut s = QuicBiStream::connect(&endpoint, quic, "localhost")
            .await
            .expect("quic connect");
        // A CONNECT header whose remaining length never ends: malformed.
        s.write_all(b"\x10\xff\xff\xff\xff\x7f")
            .await
            .expect("write");
        s.flush().await.expect("flush");
        let mut scratch = [0u8; 16];
        let read = tokio::time::timeout(WAIT, s.read(&mut scratch)).await;
        assert!(matches!(read, Ok(Ok(0) | Err(_))), "{read:?}");
        assert_eq!(broker.metrics().connections_refused, refused_before + 1);
        let ok = QuicBiStream::connect(&endpoint, quic, "localhost")
            .await
            .expect("quic connect");
        mqtt_on(Box::new(ok), "quic-ok").await.disconnect().await;

        // The bystander never noticed.
        let mut publ = Client::connect(tcp, Protocol::V5, "bystander-pub", true).await;
        publ.publish("bystander/t", b"still here", QoS::AtLeastOnce, false)
            .await;
        assert_eq!(
            bystander.recv_publish().await.payload.as_ref(),
            b"still here"
        );

        // `$SYS` shows the listener counters.
        let topic = format!(
            "$SYS/brokers/+/listeners/tls/{}/handshake_failed",
            tls.port()
        );
        bystander.subscribe(2, &topic, QoS::AtMostOnce).await;
        let deadline = Instant::now() + WAIT;
        loop {
            let p = bystander.recv_publish().await;
            if p.payload.as_ref() == b"1" {
                break;
            }
            assert!(Instant::now() < deadline, "$SYS says {:?}", p.payload);
        }
        broker.shutdown().await;
    })
}

// ---------------------------------------------------------------------------------------
// Certificate reload.

#[test]
fn reload_swaps_certificates_for_new_handshakes_and_keeps_connections() {
    common::on_actix(async {
        let certs = Certs::new("reload");
        let broker = start(
            vec![
                listener(ListenerKind::Tcp, None),
                listener(ListenerKind::Tls, Some(certs.tls(false))),
                listener(ListenerKind::Quic, Some(certs.tls(false))),
            ],
            |_| {},
        )
        .await;
        let tls = addr(&broker, ListenerKind::Tls);
        let quic = addr(&broker, ListenerKind::Quic);
        let mut before = mqtt_on(tls_stream(tls, &certs.client_tls()).await, "before").await;
        before.subscribe(1, "reload/t", QoS::AtLeastOnce).await;

        // A second CA's server certificate replaces the files in place.
        let next_dir = certs.dir.join("next");
        let next = write_dev_certificates(&next_dir, &[]).expect("second dev certificates");
        let next_ca = ClientTls::new(starling_net::load_certs(&next.ca_cert).expect("next ca"));
        std::fs::copy(&next.server_cert, &certs.dev.server_cert).expect("copy cert");
        std::fs::copy(&next.server_key, &certs.dev.server_key).expect("copy key");
        assert_eq!(broker.reload_tls().expect("reload"), 2);

        let after = mqtt_on(tls_stream(tls, &next_ca).await, "after").await;
        let tcp = TcpStream::connect(tls).await.expect("tcp");
        assert!(
            tls_connect(tcp, &certs.client_tls(), "localhost", tls)
                .await
                .is_err(),
            "the old certificate is still served"
        );
        let endpoint = quic_endpoint(&next_ca).await;
        let q = QuicBiStream::connect(&endpoint, quic, "localhost")
            .await
            .expect("quic with the new certificate");
        mqtt_on(Box::new(q), "quic-after").await.disconnect().await;

        // The connection from before the reload still works.
        let mut after = after;
        after
            .publish("reload/t", b"across reload", QoS::AtLeastOnce, false)
            .await;
        assert_eq!(
            before.recv_publish().await.payload.as_ref(),
            b"across reload"
        );

        // A key that does not load: the error names the file, the current certificate stays.
        std::fs::write(&certs.dev.server_key, "not a key").expect("write");
        let err = broker.reload_tls().expect_err("a broken key reloads");
        assert!(err.to_string().contains("server.key"), "{err}");
        mqtt_on(tls_stream(tls, &next_ca).await, "after-failure")
            .await
            .disconnect()
            .await;
        before.disconnect().await;
        after.disconnect().await;
        broker.shutdown().await;
    })
}
