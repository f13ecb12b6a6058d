//! Membership of a running cluster, with real processes: the three example nodes run; a
//! fourth, started alone with `cluster.bootstrap = false` and only its own address, is
//! added with `starling cluster join` through a member that may be a follower, becomes a
//! voter heard by the leader, and gets publishes made on node 1 at its subscriber (whose
//! route node 1's `GET /api/v1/routes` lists); node 2 sends its persistent subscriber away
//! (0x9C), whose session follows it to node 3 with what was published meanwhile; node 2
//! then leaves with `starling cluster leave` and its process stops by itself, the others
//! show three members and still forward to node 4; then the leader leaves (it hands
//! leadership away first), and the last two elect a leader and forward to each other.
//! Apart: batches node 1 parked for a node that left while node 1 was down go at node 1's
//! restart, counted lost; a node restarted on a raft snapshot forwards to the subscribers
//! its snapshot routes to; a node asked to leave with batches parked for a stopped node
//! delivers them once that node resumes, before it leaves.

#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::cluster::{
    acked_lines, gather, health, low_port, missing, node_certs, publisher, running_cluster,
    until_forwarded, wait_status,
};
use common::{starling, watcher, watcher_with, Daemon};

/// The ids of the members a status lists.
fn member_ids(st: &serde_json::Value) -> BTreeSet<u64> {
    st["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["id"].as_u64())
        .collect()
}

/// Whether every member of `st` is a voter heard by the leader, and there is a leader.
fn all_voters_heard(st: &serde_json::Value) -> bool {
    st["leader"].as_u64().is_some()
        && member_ids(st)
            .iter()
            .all(|id| health(st, *id) == Some(true))
        && st["members"].as_array().is_some_and(|m| {
            m.iter()
                .all(|m| m["voter"] == true && m["mqtt"].is_string())
        })
}

/// Node 4's file: alone in its peer list, waiting to be added.
fn fourth_node(dir: &Path) -> (PathBuf, u16) {
    let (mqtt, http, cluster) = (low_port(false), low_port(false), low_port(true));
    let text = format!(
        r#"[node]
id = 4
name = "starling4@127.0.0.1"
data_dir = "data/node4"

[[listeners]]
kind = "tcp"
bind = "127.0.0.1:{mqtt}"

[http]
enabled = true
bind = "127.0.0.1:{http}"

[cluster]
enabled = true
bootstrap = false
certs_dir = "certs"

[cluster.peers]
4 = "127.0.0.1:{cluster}"
"#
    );
    let path = dir.join("node4.toml");
    std::fs::write(&path, text).expect("write node4.toml");
    node_certs(dir, "4");
    (path, mqtt)
}

/// `starling cluster ARGS --config config`, which must succeed; its output.
fn cluster_cli(config: &Path, args: &[&str]) -> String {
    let out = starling()
        .arg("cluster")
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .expect("starling cluster runs");
    assert!(
        out.status.success(),
        "starling cluster {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The status and JSON of `METHOD /api/v1{path}` (with a JSON `body`) on the HTTP API at
/// 127.0.0.1:`port` (no token).
fn api(port: u16, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the HTTP API");
    write!(
        s,
        "{method} /api/v1{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("request");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("answer");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status");
    let json =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{method} {path}: {e}: {body}"));
    (status, json)
}

/// `starling cluster leave --drain-secs 30` of the node `config` names, under way.
fn leave_started(config: &Path) -> std::process::Child {
    starling()
        .args(["cluster", "leave", "--drain-secs", "30", "--config"])
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starling cluster leave runs")
}

/// What a leave under way said once it ended, which must be a success.
fn left_said(leave: std::process::Child) -> String {
    let out = leave
        .wait_with_output()
        .expect("starling cluster leave ends");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    said
}

/// Waits for a daemon that left to stop on its own, successfully.
fn stops_by_itself(d: &mut Daemon, which: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(st) = d.child.try_wait().expect("try_wait") {
            assert!(st.success(), "{which} stopped with {st}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{which} still runs 30 s after it left"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `count` QoS 1 and `count` QoS 2 messages on `topic` through the broker at `port`, each
/// reaching the watcher `rx`.
fn forwarded(port: u16, topic: &str, count: usize, rx: &std::sync::mpsc::Receiver<String>) {
    let mut p = publisher(port, topic, count);
    let acked = acked_lines(&mut p, |_| {});
    assert_eq!(acked.len(), 2 * count, "every publish acknowledged");
    let want: BTreeSet<(String, String)> =
        acked.into_iter().map(|a| (topic.to_owned(), a)).collect();
    let mut seen = BTreeSet::new();
    gather(rx, &mut seen, &want, Duration::from_secs(20));
    assert_eq!(missing(&want, &seen), 0, "messages on {topic} lost");
}

#[test]
fn a_node_joins_a_running_cluster_and_members_leave_it() {
    let Some((files, ports, nodes)) = running_cluster("membership", "") else {
        return;
    };
    let mut nodes: Vec<Daemon> = nodes;
    let dir = files[0].parent().expect("dir").to_path_buf();
    let (node4_file, node4_mqtt) = fourth_node(&dir);
    let mut node4 = Daemon::start(&node4_file);
    node4.expect("cluster endpoint up");

    // Through node 2's API (a follower, or the leader): the request follows the leader.
    let node2_api = format!("127.0.0.1:{}", ports[1].http);
    let said = cluster_cli(&node4_file, &["join", &node2_api]);
    assert!(said.contains("node 4 joined"), "{said}");
    let st = wait_status(
        &node4_file,
        Duration::from_secs(30),
        "four voters heard by the leader, seen from node 4",
        |st| member_ids(st) == BTreeSet::from([1, 2, 3, 4]) && all_voters_heard(st),
    );
    assert_eq!(st["self"]["mqtt"], format!("127.0.0.1:{node4_mqtt}"));
    // Joining again changes nothing and is not an error.
    cluster_cli(&node4_file, &["join", &node2_api]);
    // A node id that is a member already is not taken by another address.
    let impostor = r#"{"id": 2, "mqtt": "127.0.0.1:1", "cluster": "127.0.0.1:9"}"#;
    let (status, answer) = api(ports[0].http, "POST", "/cluster/members", impostor);
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .is_some_and(|m| m.contains("already a member")),
        "{answer}"
    );

    // A subscriber on the new node gets what node 1 takes: node 1 forwards to a peer it
    // was not configured with.
    let (mut sub, rx) = watcher(node4_mqtt, "on-node-4", "joined/#");
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(20)).ok().as_deref(),
        Some("subscribed")
    );
    forwarded(ports[0].mqtt, "joined/a", 50, &rx);
    // Node 1's API lists the replicated routes, node 4's among them.
    let (status, routes) = api(ports[0].http, "GET", "/routes", "");
    assert_eq!(status, 200, "{routes}");
    assert!(
        routes.as_array().is_some_and(|r| r
            .iter()
            .any(|r| r["node_id"] == 4 && r["topic"] == "joined/#")),
        "node 1's routes: {routes}"
    );

    // Node 2 leaves: a persistent subscriber of its own is sent away (0x9C), reconnects to
    // node 3, and finds its session there with what was published for it meanwhile; node
    // 2's process stops, the others show three voters.
    let (mut moving, moving_rx) = watcher_with(
        ports[1].mqtt,
        "moves-off-node-2",
        "drain/#",
        &["--expiry", "3600"],
    );
    assert_eq!(
        moving_rx
            .recv_timeout(Duration::from_secs(20))
            .ok()
            .as_deref(),
        Some("subscribed")
    );
    let leave = leave_started(&files[1]);
    // MQTT 5: the DISCONNECT names another member as the server to use.
    let others: Vec<String> = [ports[0].mqtt, ports[2].mqtt, node4_mqtt]
        .iter()
        .map(|p| format!("disconnected 156 ref=127.0.0.1:{p}"))
        .collect();
    let said = moving_rx.recv_timeout(Duration::from_secs(20)).ok();
    assert!(
        said.as_ref().is_some_and(|l| others.contains(l)),
        "node 2 sends its client away with 0x9C Use another server, naming one of the \
         others ({others:?}): {said:?}"
    );
    let _ = moving.wait();
    // While node 2 drains (the session is still there), a new MQTT 5 CONNECT to it is
    // refused with 0x9C, and pointed to another member too.
    let (mut turned, turned_rx) = watcher_with(ports[1].mqtt, "turned-away", "drain/#", &[]);
    let refused: Vec<String> = others
        .iter()
        .map(|l| l.replace("disconnected", "refused"))
        .collect();
    let said = turned_rx.recv_timeout(Duration::from_secs(20)).ok();
    assert!(
        said.as_ref().is_some_and(|l| refused.contains(l)),
        "node 2 refuses a CONNECT while it drains with 0x9C, naming one of the others \
         ({refused:?}): {said:?}"
    );
    let _ = turned.wait();
    let mut p = publisher(ports[0].mqtt, "drain/x", 20);
    let queued = acked_lines(&mut p, |_| {});
    assert_eq!(queued.len(), 40, "published while the subscriber moves");
    let (mut moved, moved_rx) = watcher_with(
        ports[2].mqtt,
        "moves-off-node-2",
        "drain/#",
        &["--expiry", "3600"],
    );
    let want: BTreeSet<(String, String)> = queued
        .into_iter()
        .map(|a| ("drain/x".to_owned(), a))
        .collect();
    let mut seen = BTreeSet::new();
    gather(&moved_rx, &mut seen, &want, Duration::from_secs(30));
    assert_eq!(
        missing(&want, &seen),
        0,
        "the session moved to node 3 with what was queued for it"
    );
    let _ = moved.kill();
    let said = left_said(leave);
    assert!(
        said.contains("left the cluster") && said.contains("0 sessions did not move"),
        "{said}"
    );
    stops_by_itself(&mut nodes[1], "node 2");
    wait_status(
        &files[0],
        Duration::from_secs(30),
        "three voters after node 2 left",
        |st| member_ids(st) == BTreeSet::from([1, 3, 4]) && all_voters_heard(st),
    );
    forwarded(ports[0].mqtt, "joined/b", 50, &rx);
    let _ = sub.kill();

    // The leader leaves: it hands leadership over first, and the other two go on.
    let st = wait_status(&files[0], Duration::from_secs(10), "a leader", |st| {
        st["leader"].as_u64().is_some()
    });
    let leader = st["leader"].as_u64().expect("leader");
    let leader_file = match leader {
        4 => node4_file.clone(),
        n => files[n as usize - 1].clone(),
    };
    cluster_cli(&leader_file, &["leave"]);
    match leader {
        4 => stops_by_itself(&mut node4, "node 4"),
        n => stops_by_itself(&mut nodes[n as usize - 1], &format!("node {n}")),
    }
    let rest: Vec<u64> = [1, 3, 4].into_iter().filter(|n| *n != leader).collect();
    let node_of = |n: u64| -> (PathBuf, u16) {
        match n {
            4 => (node4_file.clone(), node4_mqtt),
            n => (files[n as usize - 1].clone(), ports[n as usize - 1].mqtt),
        }
    };
    let (a_file, a_mqtt) = node_of(rest[0]);
    let (_, b_mqtt) = node_of(rest[1]);
    let want: BTreeSet<u64> = rest.iter().copied().collect();
    wait_status(
        &a_file,
        Duration::from_secs(30),
        "two voters and a new leader after the leader left",
        |st| member_ids(st) == want && all_voters_heard(st),
    );
    let (mut sub, rx) = watcher(b_mqtt, "on-the-last-two", "last/#");
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(20)).ok().as_deref(),
        Some("subscribed")
    );
    forwarded(a_mqtt, "last/a", 50, &rx);
    let _ = sub.kill();
}

/// Node `config`'s metric `name` (`starling ctl stats`), 0 if it has none yet.
fn metric(config: &Path, name: &str) -> u64 {
    let m = common::cluster::ctl_stats(config, 1, "metrics");
    m[name].as_u64().unwrap_or(0)
}

/// The example cluster with what node 1 parked for a stopped node 3 (below).
struct Parked {
    files: Vec<PathBuf>,
    nodes: Vec<Daemon>,
    /// The watcher on node 3, and its lines.
    sub: std::process::Child,
    rx: std::sync::mpsc::Receiver<String>,
    /// The payloads node 1 acknowledged, all parked.
    acked: BTreeSet<String>,
}

/// The three example nodes (forwards parked after 1 s) and a watcher on node 3 subscribed
/// to `{topic}/#` (with `watcher_args`); once node 1 forwards to it, node 3 stops answering
/// (SIGSTOP), and 10 QoS 1 and 10 QoS 2 publishes to `{topic}/x` through node 1 are parked
/// there and acknowledged once their rows are durable. `None` without paho-mqtt (outside
/// CI).
fn parked_for_stopped_node_3(name: &str, topic: &str, watcher_args: &[&str]) -> Option<Parked> {
    let extra = "\n[cluster]\nforward_timeout_ms = 1000\n";
    let (files, ports, nodes) = running_cluster(name, extra)?;
    let (sub, rx) = watcher_with(ports[2].mqtt, name, &format!("{topic}/#"), watcher_args);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(20)).ok().as_deref(),
        Some("subscribed")
    );
    assert!(
        until_forwarded(ports[0].mqtt, &format!("{topic}/probe"), &rx),
        "node 1 forwards to node 3"
    );
    nodes[2].signal("STOP");
    let mut p = publisher(ports[0].mqtt, &format!("{topic}/x"), 10);
    let acked = acked_lines(&mut p, |_| {});
    assert_eq!(acked.len(), 20, "acknowledged once parked");
    let parked = metric(&files[0], "cluster.outbox.parked");
    assert!(parked >= 20, "node 1 parked them: {parked}");
    Some(Parked {
        files,
        nodes,
        sub,
        rx,
        acked,
    })
}

/// Batches node 1 parked for node 3 (stopped), then node 1 killed; node 3 comes back and
/// leaves while node 1 is down. At its restart node 1 finds the rows again, and they go,
/// counted lost, rather than being sent every second for ever to a node that is gone:
/// the `Leave` reaches node 1 from the leader after its start, and is applied as a live
/// one. (A `Leave` already in node 1's own log, whose drop its store did not commit before
/// a crash, is replayed without a drop; the members' read after the start covers that
/// case: `routing/departed.rs`, unit-tested there.)
#[test]
fn batches_parked_for_a_node_that_left_while_their_node_was_down_go_at_its_restart() {
    let Some(Parked {
        files,
        mut nodes,
        mut sub,
        acked,
        ..
    }) = parked_for_stopped_node_3("cluster-departed", "d", &[])
    else {
        return;
    };
    nodes[0].signal("KILL");
    let _ = nodes[0].child.wait();

    // Node 3 comes back and leaves, committed with node 2 alone.
    nodes[2].signal("CONT");
    let _ = sub.kill();
    let _ = sub.wait();
    let leave = starling()
        .args(["cluster", "leave", "--drain-secs", "1", "--config"])
        .arg(&files[2])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starling cluster leave runs");
    wait_status(&files[1], Duration::from_secs(30), "node 3 gone", |st| {
        member_ids(st) == BTreeSet::from([1, 2])
    });
    let _ = leave.wait_with_output();
    // A node that left stops by itself. Node 1 must not start before it has: a node 3
    // still up (on a loaded machine it lingers) takes the replayed batches, rightly, and
    // node 1 counts them as delivered, not lost.
    let by = Instant::now() + Duration::from_secs(30);
    while nodes[2].child.try_wait().ok().flatten().is_none() {
        assert!(Instant::now() < by, "node 3 left but did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }

    // Node 1 again, with its parked rows: they go.
    let _old = std::mem::replace(&mut nodes[0], Daemon::start(&files[0]));
    nodes[0].expect("cluster endpoint up");
    // The metrics come through its HTTP API, which may bind after the cluster endpoint.
    nodes[0].expect("HTTP API serving");
    let by = Instant::now() + Duration::from_secs(30);
    loop {
        let lost = metric(&files[0], "cluster.outbox.lost");
        if lost >= acked.len() as u64 && metric(&files[0], "cluster.outbox.depth") == 0 {
            break;
        }
        assert!(
            Instant::now() < by,
            "node 1 gave up {lost} of the {} messages parked for node 3 ({} parked batches \
             acknowledged)",
            acked.len(),
            metric(&files[0], "cluster.outbox.replayed")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A node asked to leave while batches it parked for a stopped node are in its outbox
/// waits, within its drain time, for that node to take them: node 3 is stopped (SIGSTOP),
/// node 1 parks and acknowledges what it forwards to node 3's subscriber, and is asked to
/// leave; node 3 resumes 3 s later. The subscriber gets every message node 1
/// acknowledged, the leave reports nothing left behind, and node 1 stops. (Before, node 1
/// left at once, and the parked messages were lost with it.)
#[test]
fn a_node_that_leaves_first_delivers_what_it_parked_for_a_stopped_node() {
    let Some(Parked {
        files,
        mut nodes,
        mut sub,
        rx,
        acked,
    }) = parked_for_stopped_node_3("cluster-leave-owed", "o", &["--expiry", "3600"])
    else {
        return;
    };

    let leave = leave_started(&files[0]);
    std::thread::sleep(Duration::from_secs(3));
    nodes[2].signal("CONT");
    let said = left_said(leave);
    assert!(
        said.contains("left the cluster") && !said.contains("did not take"),
        "node 1 left nothing behind: {said}"
    );
    let want: BTreeSet<(String, String)> =
        acked.into_iter().map(|a| ("o/x".to_owned(), a)).collect();
    let mut seen = BTreeSet::new();
    gather(&rx, &mut seen, &want, Duration::from_secs(30));
    assert_eq!(
        missing(&want, &seen),
        0,
        "node 3's subscriber got what node 1 parked for it before it left"
    );
    stops_by_itself(&mut nodes[0], "node 1");
    let _ = sub.kill();
}

/// A node restarted on a raft snapshot forwards to the subscribers it knew of. With the
/// log compacted every 10 entries (`cluster.snapshot_entries`), node 1 is killed (SIGKILL)
/// and started again: opening its log restores the snapshot, routes and all, before
/// anything else runs. That used to happen before its shards were wired to the cluster,
/// which dropped the routes: node 1 acknowledged every publish and forwarded none, until a
/// route changed (the joiners-with-kills simulation found it; 10,000 entries in, the
/// default, any node restarts that way).
#[test]
fn a_node_restarted_on_a_snapshot_forwards_to_the_subscribers_it_knew_of() {
    let extra = "\n[cluster]\nsnapshot_entries = 10\n";
    let Some((files, ports, mut nodes)) = running_cluster("cluster-snapshot", extra) else {
        return;
    };
    let (mut w2, rx2) = watcher_with(ports[1].mqtt, "snap-on-2", "snap/#", &[]);
    let (mut w3, rx3) = watcher_with(ports[2].mqtt, "snap-on-3", "snap/#", &[]);
    for rx in [&rx2, &rx3] {
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(20)).ok().as_deref(),
            Some("subscribed")
        );
    }
    assert!(until_forwarded(ports[0].mqtt, "snap/probe", &rx2));
    assert!(until_forwarded(ports[0].mqtt, "snap/probe", &rx3));
    // Past a compaction on every node: each new client id is a claim, each new filter a
    // route, one entry each.
    for i in 0..6 {
        let (mut f, rx) = watcher_with(
            ports[0].mqtt,
            &format!("filler-{i}"),
            &format!("f/{i}"),
            &[],
        );
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(20)).ok().as_deref(),
            Some("subscribed")
        );
        let _ = f.kill();
        let _ = f.wait();
    }
    nodes[0].signal("KILL");
    let _ = nodes[0].child.wait();

    let _old = std::mem::replace(&mut nodes[0], Daemon::start(&files[0]));
    // Logged by the cluster actor when it takes the state in, maybe after the endpoint is up.
    nodes[0].expect("cluster state restored from a snapshot");
    let restored = nodes[0]
        .seen
        .iter()
        .filter(|l| l.contains("cluster state restored from a snapshot"))
        .filter_map(|l| {
            let n = l.split("routes=").nth(1)?.split_whitespace().next()?;
            n.parse::<u64>().ok()
        })
        .max();
    assert!(
        restored.is_some_and(|routes| routes > 0),
        "node 1 did not start from a snapshot with routes in it: {restored:?}\n{}",
        nodes[0].seen.join("\n")
    );
    wait_status(
        &files[1],
        Duration::from_secs(30),
        "node 1 up again",
        |st| (1..=3).all(|id| health(st, id) == Some(true)),
    );

    // Published through node 1 at once: both subscribers, on the routes of its snapshot.
    let mut p = publisher(ports[0].mqtt, "snap/after", 100);
    let acked: BTreeSet<(String, String)> = acked_lines(&mut p, |_| {})
        .into_iter()
        .map(|p| ("snap/after".to_owned(), p))
        .collect();
    assert_eq!(acked.len(), 200, "node 1 acknowledged every message");
    for (name, rx) in [("node 2", &rx2), ("node 3", &rx3)] {
        let mut seen = BTreeSet::new();
        gather(rx, &mut seen, &acked, Duration::from_secs(20));
        assert_eq!(
            missing(&acked, &seen),
            0,
            "messages node 1 acknowledged after its restart missing at {name} (of {}); it \
             counted {} forwarded",
            acked.len(),
            metric(&files[0], "cluster.forwarded")
        );
    }
    for w in [&mut w2, &mut w3] {
        let _ = w.kill();
        let _ = w.wait();
    }
}
