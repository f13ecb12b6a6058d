//! The HTTP API end to end: the daemon with `[http]` on, a real HTTP client (curl) and
//! real MQTT clients (paho-mqtt, mosquitto_pub): listing and searching clients, kicking
//! one (it gets DISCONNECT 0x98), publishing through the API to a subscriber, the bearer
//! token, the node, stats and metrics endpoints, and JSON errors for bad requests.

#![allow(clippy::disallowed_methods)]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{free_port, have, next_line, temp_dir, watcher, Daemon};

const TOKEN: &str = "t0ken-for-tests";

/// A `curl` call: (status, body). `auth` sends the bearer token.
fn curl(port: u16, method: &str, path: &str, body: Option<&str>, auth: bool) -> (u16, String) {
    let mut c = Command::new("curl");
    c.args(["-s", "-S", "-X", method, "-w", "\n%{http_code}"])
        .arg(format!("http://127.0.0.1:{port}/api/v1{path}"));
    if auth {
        c.args(["-H", &format!("Authorization: Bearer {TOKEN}")]);
    }
    if let Some(b) = body {
        c.args(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    let out = c.output().expect("curl runs");
    assert!(out.status.success(), "curl failed: {out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let (body, code) = text.rsplit_once('\n').expect("status line");
    (code.trim().parse().expect("status"), body.to_owned())
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// Prometheus's own checker accepts the exposition, lint included.
fn promtool_accepts(text: &str) {
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    std::io::Write::write_all(&mut check.stdin.take().expect("piped"), text.as_bytes())
        .expect("write to promtool");
    let out = check.wait_with_output().expect("promtool ends");
    assert!(out.status.success(), "promtool check metrics: {out:?}");
}

/// curl, promtool and paho-mqtt 2.x, which these tests drive the broker with (a missing one
/// fails under CI).
fn api_tools() -> bool {
    have("curl", &["--version"], "apt-get install curl")
        && have("promtool", &["--version"], "apt-get install prometheus")
        && have(
            "python3",
            &["-c", "import paho.mqtt.client as m; m.CallbackAPIVersion"],
            "pip install paho-mqtt",
        )
}

#[test]
fn the_http_api_lists_kicks_publishes_and_counts_with_real_clients() {
    if !api_tools() {
        return;
    }
    let dir = temp_dir("http-api");
    let mqtt = free_port();
    let config = dir.join("starling.toml");
    let acl = dir.join("acl.toml");
    std::fs::write(
        &acl,
        "[[rules]]\npermission = \"deny\"\naction = \"subscribe\"\ntopics = [\"secret/#\"]\n",
    )
    .expect("write acl");
    std::fs::write(
        &config,
        format!(
            "[node]\ndata_dir = \"{}\"\n\
             [auth]\nacl_file = \"{}\"\n\
             [[listeners]]\nkind = \"tcp\"\nbind = \"127.0.0.1:{mqtt}\"\n\
             [http]\nenabled = true\nbind = \"127.0.0.1:0\"\nbearer_token = \"{TOKEN}\"\n\
             max_body_bytes = 2048\n",
            dir.join("data").display(),
            acl.display()
        ),
    )
    .expect("write config");
    let mut d = Daemon::start(&config);
    // From the daemon's "HTTP API serving http_addr=..." line.
    let port = common::logged_addr(&mut d, "HTTP API serving", "http_addr=").port();

    // The token is enforced on every path, known or not.
    for path in ["/clients", "/brokers", "/nope"] {
        let (code, body) = curl(port, "GET", path, None, false);
        assert_eq!(code, 401, "{path}: {body}");
        assert_eq!(json(&body)["code"], 401);
    }

    let (mut sub, lines) = watcher(mqtt, "watcher", "api/#");
    next_line(&lines, "subscribed");

    // Listing and search.
    let (code, body) = curl(port, "GET", "/clients", None, true);
    assert_eq!(code, 200, "{body}");
    let all = json(&body);
    let me = all
        .as_array()
        .expect("a list")
        .iter()
        .find(|c| c["clientid"] == "watcher")
        .unwrap_or_else(|| panic!("watcher not listed: {body}"));
    assert_eq!(me["connected"], true);
    assert_eq!(me["proto_ver"], 5);
    assert_eq!(me["ip_address"], "127.0.0.1");
    assert_eq!(me["subscriptions_cnt"], 1);
    assert_eq!(me["keepalive"], 30);
    let search = |q: &str| json(&curl(port, "GET", &format!("/clients?{q}"), None, true).1);
    assert_eq!(
        search("_like_clientid=watch&connected=true")
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(search("clientid=nobody").as_array().unwrap().len(), 0);
    assert_eq!(search("proto_ver=4").as_array().unwrap().len(), 0);
    assert_eq!(
        search("_gte_connected_at=2000-01-01%2000:00:00")
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(search("_lte_connected_at=0").as_array().unwrap().len(), 0);
    assert_eq!(search("_limit=1").as_array().unwrap().len(), 1);
    let (code, body) = curl(port, "GET", "/clients?_gte_connected_at=soon", None, true);
    assert_eq!(
        (code, json(&body)["code"].clone()),
        (400, 400.into()),
        "{body}"
    );
    let (code, body) = curl(port, "GET", "/clients/watcher", None, true);
    assert_eq!(
        (code, json(&body)["clientid"].clone()),
        (200, "watcher".into())
    );
    assert_eq!(
        curl(port, "GET", "/clients/watcher/online", None, true).1,
        "true"
    );

    // Publishing through the API reaches the subscriber, plain and base64, to one topic
    // or several.
    let publish = |b: &str| curl(port, "POST", "/mqtt/publish", Some(b), true);
    assert_eq!(
        publish(r#"{"topic":"api/one","payload":"hello","qos":1}"#),
        (200, "ok".to_owned())
    );
    next_line(&lines, "msg api/one hello");
    assert_eq!(
        publish(r#"{"topics":"api/two, api/three","payload":"d29ybGQ=","encoding":"base64"}"#).0,
        200
    );
    next_line(&lines, "msg api/two world");
    next_line(&lines, "msg api/three world");
    for (bad, code) in [
        (r#"{"topic":"api/+","payload":"x"}"#, 400),
        (r#"{"topic":"api/x","payload":"x","qos":3}"#, 400),
        (r#"{"topic":"$SYS/x","payload":"x"}"#, 400),
        (r#"{"payload":"x"}"#, 400),
        (r#"{"topic":"api/x"}"#, 400),
        (r#"{"topic":null,"topics":"api/x","payload":"x"}"#, 400),
        (
            r#"{"topic":"api/x","payload":"%%%","encoding":"base64"}"#,
            400,
        ),
        ("not json", 400),
    ] {
        let (got, body) = publish(bad);
        assert_eq!(got, code, "{bad}: {body}");
        assert_eq!(json(&body)["code"], code, "{bad}: {body}");
    }
    let big = format!(r#"{{"topic":"api/x","payload":"{}"}}"#, "x".repeat(4096));
    assert_eq!(publish(&big).0, 413);

    // Stats and metrics count what happened.
    let (code, body) = curl(port, "GET", "/stats", None, true);
    assert_eq!(code, 200);
    let stats = &json(&body)[0]["stats"];
    assert_eq!(stats["connections.count"], 1, "{body}");
    assert_eq!(stats["subscriptions.count"], 1, "{body}");
    assert_eq!(stats["sessions.count"], 1, "{body}");
    // No persistent session here: the store holds no message for one.
    assert_eq!(stats["message_storages.count"], 0, "{body}");
    // High-water marks: at least what is there now.
    let at_least = |max: &str, now: &str| {
        let (m, n) = (stats[max].as_u64(), stats[now].as_u64());
        assert!(
            m.is_some() && m >= n && m >= Some(1),
            "{max} {m:?} < {now} {n:?}: {body}"
        );
    };
    at_least("connections.max", "connections.count");
    at_least("sessions.max", "sessions.count");
    let (code, body) = curl(port, "GET", "/metrics/sum", None, true);
    assert_eq!(code, 200);
    assert!(
        json(&body)["messages.sent"].as_u64().unwrap() >= 3,
        "{body}"
    );
    // The latency histograms' count and sum (the exact counts are crates/broker's
    // tests/latency.rs; here, that they are served): at least the watcher's handshake and
    // the three API publishes it received.
    let sums = json(&body);
    assert!(
        sums["handshake.latency.count"].as_u64() >= Some(1),
        "{body}"
    );
    assert!(sums["delivery.latency.count"].as_u64() >= Some(3), "{body}");
    assert!(sums["delivery.latency.us"].as_u64() > Some(0), "{body}");
    let (code, text) = curl(port, "GET", "/metrics/prometheus", None, true);
    assert_eq!(code, 200);
    assert!(
        text.contains("# TYPE starling_messages_sent_total counter"),
        "{text}"
    );
    assert!(
        text.contains("starling_clients_connected{node=\"1\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("starling_subscriptions{node=\"all\"} 1"),
        "{text}"
    );
    // Both histogram families, with what the JSON counts above (promtool checks their
    // shape: cumulative buckets, +Inf equal to _count).
    let sample = |series: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("no {series}: {text}"));
        line[series.len() + 1..].parse().expect("an integer count")
    };
    for family in ["starling_handshake_seconds", "starling_delivery_seconds"] {
        assert!(
            text.contains(&format!("# TYPE {family} histogram")),
            "{text}"
        );
    }
    let handshakes = "starling_handshake_seconds_count{node=\"1\",listener=\"tcp\"}";
    assert!(sample(handshakes) >= 1, "{text}");
    assert_eq!(
        sample("starling_handshake_seconds_bucket{node=\"1\",listener=\"tcp\",le=\"+Inf\"}"),
        sample(handshakes)
    );
    assert!(
        sample("starling_delivery_seconds_count{node=\"all\"}") >= 3,
        "{text}"
    );
    promtool_accepts(&text);
    for path in [
        "",
        "/brokers",
        "/brokers/1",
        "/nodes",
        "/nodes/1",
        "/health/check",
        "/stats/1",
        "/stats/sum",
        "/metrics",
        "/metrics/1",
    ] {
        let (code, body) = curl(port, "GET", path, None, true);
        assert_eq!(code, 200, "{path}: {body}");
        json(&body);
    }
    // What `GET /api/v1` lists is what is served: every listed GET without a parameter
    // answers 200 (the list and the routes are two tables that must not drift).
    let listed = json(&curl(port, "GET", "", None, true).1);
    let mut served = 0;
    for e in listed.as_array().expect("a list") {
        let path = e["path"].as_str().expect("a path");
        if e["method"] != "GET" || path.contains(['{', '?']) {
            continue;
        }
        let rest = path.strip_prefix("/api/v1").expect("under /api/v1");
        let (code, body) = curl(port, "GET", rest, None, true);
        assert_eq!(code, 200, "listed {path}: {body}");
        served += 1;
    }
    assert!(served >= 12, "{listed}");

    // The hook chain's providers, as RMQTT's plugins: the ACL this config names (with its
    // one rule) and the $SYS events; no password file is configured, so none is listed.
    let (code, body) = curl(port, "GET", "/plugins", None, true);
    assert_eq!(code, 200, "{body}");
    let nodes = json(&body);
    assert_eq!(nodes[0]["node"], 1, "{body}");
    let names: Vec<&str> = nodes[0]["plugins"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|p| p["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(names, ["starling-acl", "starling-sys-events"], "{body}");
    let acl_plugin = json(&curl(port, "GET", "/plugins/1/starling-acl", None, true).1);
    assert_eq!(
        acl_plugin["attrs"]["hooks"],
        serde_json::json!(["authorize"])
    );
    assert_eq!(acl_plugin["immutable"], true);
    let (code, body) = curl(port, "GET", "/plugins/1/starling-acl/config", None, true);
    assert_eq!(code, 200, "{body}");
    let settings = json(&body);
    assert_eq!(settings["rules"], "1", "{body}");
    assert_eq!(settings["acl_file"], acl.display().to_string(), "{body}");
    for (method, path, code) in [
        ("GET", "/plugins/2", 404),
        ("GET", "/plugins/1/rmqtt-web-hook", 404),
        ("GET", "/plugins/1/rmqtt-web-hook/config", 404),
        ("PUT", "/plugins/1/starling-acl/config/reload", 409),
        ("PUT", "/plugins/1/starling-acl/unload", 409),
        ("PUT", "/plugins/1/starling-sys-events/load", 409),
    ] {
        let (got, body) = curl(port, method, path, None, true);
        assert_eq!(got, code, "{method} {path}: {body}");
        assert_eq!(json(&body)["code"], code, "{method} {path}: {body}");
    }
    // A path that exists, asked with a method it does not take: 405, not 404.
    let (code, body) = curl(port, "PUT", "/clients/watcher", None, true);
    assert_eq!(
        (code, json(&body)["code"].clone()),
        (405, 405.into()),
        "{body}"
    );
    for path in ["/brokers/2", "/nodes/x", "/stats/7", "/nope"] {
        let (code, body) = curl(port, "GET", path, None, true);
        assert_eq!(
            (code, json(&body)["code"].clone()),
            (404, 404.into()),
            "{path}"
        );
    }

    // Subscriptions and routes: the watcher's one filter.
    let (code, body) = curl(port, "GET", "/subscriptions", None, true);
    assert_eq!(code, 200, "{body}");
    let subs = json(&body);
    assert_eq!(subs.as_array().unwrap().len(), 1, "{body}");
    assert_eq!(subs[0]["clientid"], "watcher");
    assert_eq!(subs[0]["topic"], "api/#");
    assert_eq!(subs[0]["opts"]["qos"], 1);
    assert_eq!(subs[0]["opts"]["no_local"], false);
    let count = |path: &str| {
        json(&curl(port, "GET", path, None, true).1)
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(count("/subscriptions?_match_topic=api/x/y"), 1);
    assert_eq!(count("/subscriptions?_match_topic=other"), 0);
    assert_eq!(count("/subscriptions?qos=2"), 0);
    assert_eq!(count("/subscriptions/watcher"), 1);
    assert_eq!(
        curl(port, "GET", "/subscriptions/nobody", None, true).0,
        404
    );
    assert_eq!(count("/routes"), 1);
    assert_eq!(count("/routes/api%2Fx"), 1);
    assert_eq!(count("/routes/elsewhere"), 0);

    // Retained messages: listed with their payload, paged, deleted.
    for (t, p) in [("api/r1", "one"), ("api/r2", "two"), ("other/r3", "three")] {
        assert_eq!(
            publish(&format!(
                r#"{{"topic":"{t}","payload":"{p}","retain":true}}"#
            ))
            .0,
            200
        );
        if t.starts_with("api/") {
            next_line(&lines, &format!("msg {t} {p}"));
        }
    }
    let (code, body) = curl(port, "GET", "/retains?topic_filter=api/%23", None, true);
    assert_eq!(code, 200, "{body}");
    let r = json(&body);
    assert_eq!(r["items"].as_array().unwrap().len(), 2, "{body}");
    assert_eq!(r["items"][0]["topic"], "api/r1");
    assert_eq!(r["items"][0]["publish"]["payload"], "b25l"); // "one"
    assert_eq!(r["has_more"], false);
    let r = json(
        &curl(
            port,
            "GET",
            "/retains?topic_filter=%23&offset=1&limit=1",
            None,
            true,
        )
        .1,
    );
    assert_eq!(
        (r["items"][0]["topic"].clone(), r["has_more"].clone()),
        ("api/r2".into(), true.into())
    );
    assert_eq!(
        curl(port, "DELETE", "/retains?topic=api/r1", None, true),
        (200, "ok".to_owned())
    );
    // The delete is a retained publish with an empty payload: subscribers get it too.
    next_line(&lines, "msg api/r1 ");
    assert_eq!(
        curl(port, "DELETE", "/retains?topic=api/r1", None, true).0,
        404
    );
    assert_eq!(
        curl(port, "DELETE", "/retains?topic=api/%2B", None, true).0,
        400
    );
    assert_eq!(curl(port, "DELETE", "/retains", None, true).0, 400);
    let r = json(&curl(port, "GET", "/retains?topic_filter=api/%23", None, true).1);
    assert_eq!(r["items"].as_array().unwrap().len(), 1, "{r}");
    // The deleted one left its mark: the high-water mark stays above the count. The
    // shards move the gauges at the end of a burst, so this may take a moment.
    let mut stats = serde_json::Value::Null;
    for _ in 0..50 {
        stats = json(&curl(port, "GET", "/stats/sum", None, true).1)["stats"].clone();
        let (count, max) = (&stats["retaineds.count"], &stats["retaineds.max"]);
        if max.as_u64() > count.as_u64() && count.as_u64() >= Some(2) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let n = |k: &str| stats[k].as_u64().unwrap_or_else(|| panic!("{k}: {stats}"));
    assert!(
        n("retaineds.count") >= 2 && n("retaineds.max") > n("retaineds.count"),
        "{stats}"
    );
    for g in [
        "subscriptions",
        "subscriptions_shared",
        "delayed_publishs",
        "topics",
    ] {
        assert!(
            n(&format!("{g}.max")) >= n(&format!("{g}.count")),
            "{g}: {stats}"
        );
    }
    assert!(n("topics.count") >= 1, "{stats}");

    // Subscribing the watcher through the API: a subscription of its own session, under
    // its ACL, listed, and unsubscribed again.
    let subscribe = |b: &str| curl(port, "POST", "/mqtt/subscribe", Some(b), true);
    let (code, body) =
        subscribe(r#"{"clientid":"watcher","topics":"extra/a, secret/x","topic":"more/+"}"#);
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        json(&body),
        serde_json::json!({"extra/a": true, "secret/x": "NotAuthorized (0x87)", "more/+": true})
    );
    for (t, p) in [("extra/a", "one"), ("more/b", "two")] {
        let b = format!(r#"{{"topic":"{t}","payload":"{p}"}}"#);
        assert_eq!(publish(&b).0, 200);
        next_line(&lines, &format!("msg {t} {p}"));
    }
    assert_eq!(count("/subscriptions/watcher"), 3);
    for (bad, want) in [
        (r#"{"clientid":"watcher","topic":"a/#/b"}"#, 400),
        (r#"{"clientid":"watcher","topic":"a","qos":3}"#, 400),
        (r#"{"clientid":"watcher"}"#, 400),
        (r#"{"topic":"a"}"#, 400),
        (r#"{"clientid":"nobody","topic":"a"}"#, 404),
    ] {
        let (code, body) = subscribe(bad);
        assert_eq!(
            (code, json(&body)["code"].clone()),
            (want, want.into()),
            "{bad}: {body}"
        );
    }
    let unsubscribe = |b: &str| curl(port, "POST", "/mqtt/unsubscribe", Some(b), true);
    for f in ["extra/a", "more/+"] {
        let b = format!(r#"{{"clientid":"watcher","topic":"{f}"}}"#);
        assert_eq!(unsubscribe(&b), (200, "true".to_owned()));
    }
    assert_eq!(
        unsubscribe(r#"{"clientid":"watcher","topic":"extra/a"}"#),
        (200, "false".to_owned())
    );
    assert_eq!(
        unsubscribe(r#"{"clientid":"nobody","topic":"extra/a"}"#).0,
        404
    );
    assert_eq!(count("/subscriptions/watcher"), 1);
    // Unsubscribed, the next message it gets is the one on its own filter.
    publish(r#"{"topic":"more/c","payload":"not for it"}"#);
    publish(r#"{"topic":"api/after","payload":"for it"}"#);
    next_line(&lines, "msg api/after for it");

    // `starling ctl`, pointed at the node by a config file with its [http] section.
    let ctl_config = dir.join("ctl.toml");
    let write_ctl = |token: &str| {
        std::fs::write(
            &ctl_config,
            format!(
                "[http]\nenabled = true\nbind = \"127.0.0.1:{port}\"\nbearer_token = \"{token}\"\n"
            ),
        )
        .expect("write ctl config")
    };
    let ctl = |args: &[&str]| {
        common::starling()
            .arg("--config")
            .arg(&ctl_config)
            .arg("ctl")
            .args(args)
            .output()
            .expect("starling ctl runs")
    };
    write_ctl(TOKEN);
    let out = ctl(&["clients", "--like", "watch", "--connected", "true"]);
    assert!(out.status.success(), "{out:?}");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(listed.lines().count(), 1, "{listed}");
    assert!(listed.contains("\"clientid\":\"watcher\""), "{listed}");
    let out = ctl(&["publish", "api/ctl", "from ctl", "--qos", "1"]);
    assert!(out.status.success(), "{out:?}");
    next_line(&lines, "msg api/ctl from ctl");
    let out = ctl(&["plugins"]);
    assert!(out.status.success(), "{out:?}");
    let listed = String::from_utf8_lossy(&out.stdout);
    let acl_line = listed
        .lines()
        .map(json)
        .find(|p| p["name"] == "starling-acl")
        .unwrap_or_else(|| panic!("no starling-acl in {listed}"));
    assert_eq!(acl_line["config"]["rules"], "1", "{listed}");
    assert_eq!(listed.lines().count(), 2, "{listed}");
    let out = ctl(&["stats"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("connections.count"),
        "{out:?}"
    );
    let out = ctl(&["kick", "nobody"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("HTTP 404"),
        "{out:?}"
    );
    write_ctl("wrong");
    let out = ctl(&["stats"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("HTTP 401"),
        "{out:?}"
    );

    // A kick: the client is told 0x98 and its session is gone.
    let (code, body) = curl(port, "DELETE", "/clients/watcher", None, true);
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["clientid"], "watcher");
    next_line(&lines, "disconnected 152");
    let _ = sub.wait();
    assert_eq!(curl(port, "GET", "/clients/watcher", None, true).0, 404);
    assert_eq!(
        curl(port, "GET", "/clients/watcher/online", None, true).1,
        "false"
    );
    assert_eq!(curl(port, "DELETE", "/clients/watcher", None, true).0, 404);
    std::thread::sleep(Duration::from_millis(100));
    let (_, body) = curl(port, "GET", "/stats", None, true);
    assert_eq!(json(&body)[0]["stats"]["sessions.count"], 0, "{body}");
}

fn refs(a: &[String]) -> Vec<&str> {
    a.iter().map(String::as_str).collect()
}

/// `mosquitto_pub` sending each line of `lines` as one message, over one connection.
fn publish_lines(args: &[&str], lines: &str) -> std::process::Output {
    let mut child = Command::new("mosquitto_pub")
        .args(args)
        .arg("-l")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mosquitto_pub runs");
    std::io::Write::write_all(&mut child.stdin.take().expect("piped"), lines.as_bytes())
        .expect("write to mosquitto_pub");
    child.wait_with_output().expect("mosquitto_pub ends")
}

/// RMQTT's metric names, read from `/metrics/sum`, count what real clients did: a refused
/// login, a subscriber, a denied subscribe, five publishes of which two match nothing, and
/// every client gone. Differences from before the clients, so that the `$SYS` actor's
/// publications at start do not count.
#[test]
fn rmqtt_metric_names_count_what_real_clients_did() {
    if !api_tools() {
        return;
    }
    let dir = temp_dir("http-api-rmqtt");
    let mqtt = free_port();
    let passwd = dir.join("passwd");
    starling_auth::add_or_update(&passwd, "alice", b"alice-pw").expect("password file");
    let acl = dir.join("acl.toml");
    std::fs::write(
        &acl,
        "[[rules]]\npermission = \"deny\"\naction = \"subscribe\"\ntopics = [\"secret/#\"]\n",
    )
    .expect("write acl");
    // `$SYS` once, at start: its next round would count within the test.
    let config = common::api_config(
        &dir,
        mqtt,
        TOKEN,
        &format!(
            "[mqtt]\nsys_interval_secs = 86400\n[auth]\npassword_file = {:?}\nacl_file = {:?}\n",
            passwd.display().to_string(),
            acl.display().to_string()
        ),
    );
    let mut d = Daemon::start(&config);
    let port = common::logged_addr(&mut d, "HTTP API serving", "http_addr=").port();
    let sum = || {
        let (code, body) = curl(port, "GET", "/metrics/sum", None, true);
        assert_eq!(code, 200, "{body}");
        json(&body)
    };
    let n = |m: &serde_json::Value, k: &str| {
        m[k].as_u64()
            .unwrap_or_else(|| panic!("{k} is not counted: {m}"))
    };
    // At start only `$SYS` has published, to no subscriber. Its round at start ends with
    // the listener's counters: once the last is retained, the round is all counted.
    let last = "/retains?topic_filter=%24SYS/brokers/%2B/listeners/%2B/%2B/connect_timed_out";
    let mut round_done = false;
    for _ in 0..100 {
        let (code, body) = curl(port, "GET", last, None, true);
        assert_eq!(code, 200, "{body}");
        round_done = !json(&body)["items"].as_array().expect("items").is_empty();
        if round_done {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(round_done, "{last} is not retained");
    let mut before = sum();
    for _ in 0..100 {
        if n(&before, "messages.publish.system") > 0
            && n(&before, "messages.nonsubscribed") == n(&before, "messages.publish.system")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        before = sum();
    }
    assert!(n(&before, "messages.publish.system") > 0, "{before}");
    assert_eq!(
        n(&before, "messages.nonsubscribed"),
        n(&before, "messages.publish.system"),
        "{before}"
    );

    let (mut watcher, lines) = watcher(mqtt, "watcher", "api/#");
    next_line(&lines, "subscribed");
    let alice = ["-h", "127.0.0.1", "-p", &mqtt.to_string(), "-u", "alice"].map(String::from);
    let with = |pw: &str, more: &[&str]| {
        let mut a: Vec<String> = alice.to_vec();
        a.extend(["-P", pw].iter().chain(more).map(|s| s.to_string()));
        a
    };
    // A wrong password: refused, nothing published.
    let Some(out) = common::mosquitto(
        "mosquitto_pub",
        &refs(&with("wrong", &["-t", "api/x", "-m", "x"])),
    ) else {
        return;
    };
    assert!(!out.status.success(), "{out:?}");
    // A subscriber whose one filter the ACL denies: it exits at its SUBACK.
    let out = common::mosquitto(
        "mosquitto_sub",
        &refs(&with("alice-pw", &["-V", "5", "-t", "secret/x", "-E"])),
    )
    .expect("installed");
    assert!(out.status.success(), "{out:?}");
    // Three QoS 1 messages the watcher gets, two that match nothing.
    for (topic, body) in [("api/n", "a\nb\nc\n"), ("nobody/n", "d\ne\n")] {
        let out = publish_lines(&refs(&with("alice-pw", &["-q", "1", "-t", topic])), body);
        assert!(out.status.success(), "{out:?}");
    }
    for p in ["a", "b", "c"] {
        next_line(&lines, &format!("msg api/n {p}"));
    }
    // The watcher goes away without a DISCONNECT.
    let _ = watcher.kill();
    let _ = watcher.wait();

    // Each of the four clients that connected made two `$SYS` events (connected and
    // disconnected), which match nothing. The watcher's acknowledgements and its
    // disconnection are counted after what the test saw: wait for them.
    let want: &[(&str, u64)] = &[
        ("client.connect", 5),
        ("client.authenticate", 5),
        ("client.auth.anonymous", 1),
        ("client.auth.anonymous.error", 0),
        ("client.connack", 5),
        ("client.connack.error", 1),
        ("client.connack.auth.error", 1),
        ("client.connected", 4),
        ("client.disconnected", 4),
        ("client.handshaking.timeout", 0),
        ("client.subscribe", 2),
        ("client.subscribe.check.acl", 2),
        ("client.subscribe.auth.error", 1),
        ("client.subscribe.error", 0),
        ("client.unsubscribe", 0),
        ("client.publish.check.acl", 5),
        ("client.publish.auth.error", 0),
        ("client.publish.error", 0),
        ("session.created", 4),
        ("session.resumed", 0),
        ("session.subscribed", 1),
        ("session.unsubscribed", 0),
        ("session.terminated", 4),
        ("messages.publish", 5 + 8),
        ("messages.publish.custom", 5),
        ("messages.publish.admin", 0),
        ("messages.publish.lastwill", 0),
        ("messages.publish.system", 8),
        ("messages.delivered", 3),
        ("messages.acked", 3),
        ("messages.dropped", 0),
        ("messages.nonsubscribed", 2 + 8),
    ];
    let grew = |now: &serde_json::Value| -> Vec<(String, u64)> {
        want.iter()
            .map(|(k, _)| ((*k).to_owned(), n(now, k) - n(&before, k)))
            .collect()
    };
    let expected: Vec<(String, u64)> = want.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
    let mut got = grew(&sum());
    for _ in 0..100 {
        if got == expected {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        got = grew(&sum());
    }
    assert_eq!(got, expected);

    // Prometheus text has them as counters, and its checker still accepts it.
    let (code, text) = curl(port, "GET", "/metrics/prometheus/sum", None, true);
    assert_eq!(code, 200);
    for family in [
        "starling_client_connack_auth_error_total",
        "starling_messages_nonsubscribed_total",
        "starling_session_created_total",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} counter")),
            "{family}: {text}"
        );
    }
    let line = format!(
        "starling_messages_nonsubscribed_total{{node=\"all\"}} {}",
        n(&before, "messages.nonsubscribed") + 2 + 8
    );
    assert!(text.contains(&line), "{line}: {text}");
    promtool_accepts(&text);
}
