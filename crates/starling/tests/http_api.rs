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

#[test]
fn the_http_api_lists_kicks_publishes_and_counts_with_real_clients() {
    if !have("curl", &["--version"], "apt-get install curl")
        || !have("promtool", &["--version"], "apt-get install prometheus")
        || !have(
            "python3",
            &["-c", "import paho.mqtt.client as m; m.CallbackAPIVersion"],
            "pip install paho-mqtt",
        )
    {
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
    // Prometheus's own checker accepts the exposition, lint included.
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
