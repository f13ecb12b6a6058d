//! The example cluster of `config/cluster/` as real processes (its three files, with free
//! ports put in): the nodes elect a leader and `starling cluster status` shows three members
//! and one leader; a subscriber on each of nodes 2 and 3 and a QoS 1/2 publisher on node 1;
//! node 3 is stopped and node 1 killed with SIGKILL mid-stream, and every message node 1
//! acknowledged has reached both subscribers; the publisher goes on through node 2; the
//! status shows node 1 down, and up again once it is restarted on its raft log; a retained
//! message set through node 3 while node 1 was down is read through node 1 after its
//! restart; node 2's `$SYS/brokers/+/cluster/...` topics name a leader and three members;
//! a shared group with members on nodes 2 and 3 gets each message once, and loses none
//! when its member on node 2 leaves mid-stream; a persistent
//! session moves from node 2 to node 3 with the messages queued for
//! it, and back (the connection on node 3 closes with 0x8E).

#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{
    acked_lines, configs, ctl_stats, gather, health, missing, publisher, publisher_with,
    running_cluster, running_cluster_each, until_forwarded, wait_status,
};
use common::{have, starling, temp_dir, watcher, watcher_with, Daemon};

#[test]
fn three_nodes_forward_fence_client_ids_and_a_killed_node_loses_no_acknowledged_message() {
    if !have(
        "python3",
        &["-c", "import paho.mqtt"],
        "pip install paho-mqtt",
    ) {
        return;
    }
    let dir = temp_dir("cluster");
    let (files, ports) = configs(&dir, "");
    let mut nodes: Vec<Option<Daemon>> = files.iter().map(|f| Some(Daemon::start(f))).collect();
    for n in nodes.iter_mut().flatten() {
        n.expect("cluster endpoint up");
    }

    // Three members and one leader, every one heard by it, seen from a node that may be a
    // follower (its answer is completed with the leader's).
    wait_status(
        &files[1],
        Duration::from_secs(30),
        "three members with their records, a leader hearing all",
        |st| {
            st["leader"].as_u64().is_some()
                && st["members"]
                    .as_array()
                    .is_some_and(|m| m.len() == 3 && m.iter().all(|m| m["mqtt"].is_string()))
                && (1..=3).all(|id| health(st, id) == Some(true))
        },
    );
    let out = starling()
        .args(["cluster", "status", "--config"])
        .arg(&files[1])
        .output()
        .expect("status runs");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 3, "{table}");
    assert_eq!(
        rows.iter().filter(|r| r.contains(" leader ")).count(),
        1,
        "{table}"
    );
    assert_eq!(
        rows.iter().filter(|r| r.contains(" up ")).count(),
        3,
        "{table}"
    );
    println!("{table}");

    // A subscriber on each of nodes 2 and 3: once subscribed, the routes hold them.
    let (mut w2, rx2) = watcher(ports[1].mqtt, "sub-on-2", "k/#");
    let (mut w3, rx3) = watcher(ports[2].mqtt, "sub-on-3", "k/#");
    common::next_line(&rx2, "subscribed");
    common::next_line(&rx3, "subscribed");

    // A publisher on node 1, killed after a random number of acknowledgements. At that
    // moment node 3 is stopped (SIGSTOP) for a while, so that it cannot take what node 1
    // forwards: node 1 is killed with batches for it unacknowledged, and what node 1
    // acknowledged meanwhile must still reach it (an acknowledgement that did not wait for
    // node 3 would be a lost message there).
    let kill_after = 300 + (std::process::id() as usize % 700);
    println!("node 1 is killed after {kill_after} acknowledgements, node 3 stopped");
    let pid1 = nodes[0].as_ref().expect("node 1").child.id();
    let pid3 = nodes[2].as_ref().expect("node 3").child.id();
    let mut p = publisher(ports[0].mqtt, "k/data", 3000);
    let mut chaos = None;
    let acked: BTreeSet<(String, String)> = acked_lines(&mut p, |n| {
        if n == kill_after && chaos.is_none() {
            signal("STOP", pid3);
            chaos = Some(std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(400));
                signal("KILL", pid1);
                std::thread::sleep(Duration::from_millis(300));
                signal("CONT", pid3);
            }));
        }
    })
    .into_iter()
    .map(|p| ("k/data".to_owned(), p))
    .collect();
    chaos
        .expect("the publisher ended before the kill")
        .join()
        .expect("signals sent");
    let _ = nodes[0].take().map(|mut d| d.child.wait());
    assert!(acked.len() >= kill_after);
    println!("{} acknowledged by node 1", acked.len());

    let (mut seen2, mut seen3) = (BTreeSet::new(), BTreeSet::new());
    gather(&rx2, &mut seen2, &acked, Duration::from_secs(20));
    gather(&rx3, &mut seen3, &acked, Duration::from_secs(20));
    assert_eq!(
        (missing(&acked, &seen2), missing(&acked, &seen3)),
        (0, 0),
        "acknowledged messages missing at nodes 2 and 3 (of {})",
        acked.len()
    );

    println!("every acknowledged message reached nodes 2 and 3");
    // The publisher goes on through node 2; node 3 still gets everything.
    let mut p = publisher(ports[1].mqtt, "k/more", 500);
    let more: BTreeSet<(String, String)> = acked_lines(&mut p, |_| {})
        .into_iter()
        .map(|p| ("k/more".to_owned(), p))
        .collect();
    assert_eq!(more.len(), 1000, "node 2 acknowledged every message");
    gather(&rx2, &mut seen2, &more, Duration::from_secs(20));
    gather(&rx3, &mut seen3, &more, Duration::from_secs(20));
    assert_eq!((missing(&more, &seen2), missing(&more, &seen3)), (0, 0));

    println!("node 2 took 1000 more, and both subscribers got them");
    // The survivors keep (or elect) a leader, which sees node 1 down.
    wait_status(&files[1], Duration::from_secs(30), "node 1 down", |st| {
        st["leader"].as_u64().is_some_and(|l| l != 1) && health(st, 1) == Some(false)
    });
    // A retained message set through node 3 while node 1 is down: acknowledged once the
    // majority logged it, and at once on node 2.
    let (mut r2, rx_r2) = watcher(ports[1].mqtt, "retained-on-2", "ret/#");
    common::next_line(&rx_r2, "subscribed");
    let mut p = publisher_with(ports[2].mqtt, "ret/state", 1, &["--retain"]);
    let acked = acked_lines(&mut p, |_| {});
    assert_eq!(
        acked.len(),
        2,
        "node 3 acknowledged both retained publishes"
    );
    common::next_line(&rx_r2, "msg ret/state 1:0");
    common::next_line(&rx_r2, "msg ret/state 2:0");

    // Restarted on its raft log, node 1 is heard again.
    nodes[0] = Some(Daemon::start(&files[0]));
    wait_status(
        &files[1],
        Duration::from_secs(30),
        "node 1 up again",
        |st| (1..=3).all(|id| health(st, id) == Some(true)),
    );
    println!("node 1 is back");
    // It has the retained message it missed: a subscription there gets the last one.
    let (mut r1, rx_r1) = watcher(ports[0].mqtt, "retained-on-1", "ret/#");
    common::next_line(&rx_r1, "subscribed");
    common::next_line(&rx_r1, "msg ret/state 2:0");
    println!("node 1 serves the retained message set through node 3 while it was down");
    // Node 2's view of the cluster in `$SYS` (retained, renewed every 10 s): its role, a
    // leader, three members, each with a health word.
    let (mut sys, rx_sys) = watcher(ports[1].mqtt, "sys-watcher", "$SYS/brokers/+/cluster/#");
    common::next_line(&rx_sys, "subscribed");
    let mut sys_seen = std::collections::BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    let sys_ok = |m: &std::collections::BTreeMap<String, String>| {
        m.get("leader").is_some_and(|l| l.parse::<u64>().is_ok())
            && m.get("members/count").map(String::as_str) == Some("3")
            && m.get("role")
                .is_some_and(|r| r == "leader" || r == "follower")
            && (1..=3).all(|i| {
                m.get(&format!("members/{i}/health"))
                    .is_some_and(|h| ["up", "down", "unknown"].contains(&h.as_str()))
            })
    };
    while !sys_ok(&sys_seen) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx_sys.recv_timeout(left) else {
            panic!("node 2's $SYS cluster topics incomplete: {sys_seen:?}");
        };
        let mut w = line.splitn(3, ' ');
        if let (Some("msg"), Some(t), Some(v)) = (w.next(), w.next(), w.next()) {
            if let Some((_, name)) = t.split_once("/cluster/") {
                sys_seen.insert(name.to_owned(), v.to_owned());
            }
        }
    }
    println!("node 2's $SYS cluster view: {sys_seen:?}");
    let _ = sys.kill();
    let _ = sys.wait();
    for w in [&mut r1, &mut r2] {
        let _ = w.kill();
        let _ = w.wait();
    }

    // A shared group with a member on node 2 and one on node 3, published to through node
    // 1: each message reaches exactly one of them (node 1 picks the node, that node its
    // member), none is lost, none goes to both.
    let (mut g2, rx_g2) = watcher(ports[1].mqtt, "member-on-2", "$share/workers/s/#");
    let (mut g3, rx_g3) = watcher(ports[2].mqtt, "member-on-3", "$share/workers/s/#");
    common::next_line(&rx_g2, "subscribed");
    common::next_line(&rx_g3, "subscribed");
    let mut p = publisher(ports[0].mqtt, "s/jobs", 100);
    let jobs: BTreeSet<(String, String)> = acked_lines(&mut p, |_| {})
        .into_iter()
        .map(|p| ("s/jobs".to_owned(), p))
        .collect();
    assert_eq!(jobs.len(), 200, "node 1 acknowledged every job");
    let (mut got2, mut got3) = (BTreeSet::new(), BTreeSet::new());
    let deadline = Instant::now() + Duration::from_secs(20);
    while got2.union(&got3).count() < jobs.len() && Instant::now() < deadline {
        gather(&rx_g2, &mut got2, &jobs, Duration::from_millis(200));
        gather(&rx_g3, &mut got3, &jobs, Duration::from_millis(200));
    }
    // Late duplicates, if any, would arrive now.
    gather(&rx_g2, &mut got2, &jobs, Duration::from_millis(500));
    gather(&rx_g3, &mut got3, &jobs, Duration::from_millis(500));
    let both = got2.intersection(&got3).count();
    let all: BTreeSet<_> = got2.union(&got3).cloned().collect();
    assert_eq!(
        (missing(&jobs, &all), both),
        (0, 0),
        "shared group across nodes: (missing, delivered to both members) of {} jobs; node 2 got {}, node 3 got {}",
        jobs.len(),
        got2.len(),
        got3.len()
    );
    println!(
        "the shared group split 200 jobs between nodes 2 and 3: {} and {}",
        got2.len(),
        got3.len()
    );
    for w in [&mut g2, &mut g3] {
        let _ = w.kill();
        let _ = w.wait();
    }

    // A persistent session moves: subscribed on node 2, its client gone (killed), QoS 1/2
    // messages queued for it there; it connects to node 3, which takes the client id over
    // and gets the session from node 2: every queued message arrives.
    let persistent = ["--expiry", "3600"];
    let (mut first, rx_first) = common::watcher_with(ports[1].mqtt, "mover", "m/#", &persistent);
    common::next_line(&rx_first, "subscribed");
    // Node 1 forwards to node 2 for it.
    assert!(
        until_forwarded(ports[0].mqtt, "m/probe", &rx_first),
        "node 1 never forwarded to the mover"
    );
    let _ = first.kill();
    let _ = first.wait();
    let mut p = publisher(ports[0].mqtt, "m/data", 100);
    let queued: BTreeSet<(String, String)> = acked_lines(&mut p, |_| {})
        .into_iter()
        .map(|p| ("m/data".to_owned(), p))
        .collect();
    assert_eq!(queued.len(), 200, "node 1 acknowledged every message");
    // This time with a will: when the session moves on from node 3, node 3 publishes it, as
    // a takeover on one node does (the connection it closes had a will with no delay). Its
    // watcher is on node 1, restarted above: its new subscription's route must commit
    // (once, the route batch it took before raft's handle arrived was never proposed, and
    // every later one waited behind it).
    let (mut wills, rx_wills) = watcher(ports[0].mqtt, "will-watcher", "will/#");
    common::next_line(&rx_wills, "subscribed");
    let with_will = ["--expiry", "3600", "--will-topic", "will/mover"];
    let (mut second, rx_second) = common::watcher_with(ports[2].mqtt, "mover", "m/#", &with_will);
    let mut got = BTreeSet::new();
    gather(&rx_second, &mut got, &queued, Duration::from_secs(20));
    if missing(&queued, &got) > 0 {
        dump(&files);
    }
    assert_eq!(
        missing(&queued, &got),
        0,
        "messages queued on node 2 missing after the move to node 3 (of {}; {} arrived)",
        queued.len(),
        got.len()
    );
    println!("the session moved from node 2 to node 3 with its 200 queued messages");
    // Back to node 2 while connected to node 3: node 3 closes its connection with
    // DISCONNECT 0x8E (Session taken over), and the session comes along again.
    let (mut third, rx_third) = common::watcher_with(ports[1].mqtt, "mover", "m/#", &persistent);
    common::next_line(&rx_third, "subscribed");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx_second.recv_timeout(left) {
            Ok(l) if l == "disconnected 142" => break,
            Ok(_) => continue,
            Err(_) => panic!("node 3 did not close the moved client's connection with 0x8E"),
        }
    }
    let want_will: BTreeSet<(String, String)> =
        [("will/mover".to_owned(), "gone mover".to_owned())]
            .into_iter()
            .collect();
    let mut got_will = BTreeSet::new();
    gather(
        &rx_wills,
        &mut got_will,
        &want_will,
        Duration::from_secs(10),
    );
    if missing(&want_will, &got_will) > 0 {
        dump(&files);
    }
    assert_eq!(
        missing(&want_will, &got_will),
        0,
        "the will of the connection node 3 closed for the move was not published"
    );
    let mut p = publisher(ports[0].mqtt, "m/after", 10);
    let after: BTreeSet<(String, String)> = acked_lines(&mut p, |_| {})
        .into_iter()
        .map(|p| ("m/after".to_owned(), p))
        .collect();
    let mut got = BTreeSet::new();
    gather(&rx_third, &mut got, &after, Duration::from_secs(20));
    assert_eq!(
        missing(&after, &got),
        0,
        "the session back on node 2 gets new messages"
    );

    for w in [
        &mut w2,
        &mut w3,
        &mut first,
        &mut second,
        &mut third,
        &mut wills,
    ] {
        let _ = w.kill();
        let _ = w.wait();
    }
}

/// Sends signal `name` (`STOP`, `CONT`, `KILL`) to process `pid`.
fn signal(name: &str, pid: u32) {
    let ok = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{name} {pid}");
}

/// Node `config`'s counters.
fn metrics(config: &Path) -> serde_json::Value {
    ctl_stats(config, 1, "metrics")
}

/// Node `config`'s state counts.
fn stats(config: &Path) -> serde_json::Value {
    ctl_stats(config, 0, "stats")
}

/// Prints what each node counted, for a failure's diagnosis.
fn dump(files: &[PathBuf]) {
    for (i, f) in files.iter().enumerate() {
        let m = metrics(f);
        let keys = [
            "messages.publish.lastwill",
            "messages.nonsubscribed",
            "cluster.forwarded",
            "cluster.received",
            "cluster.sessions.received",
            "cluster.handover.timeouts",
            "messages.dropped",
            "dropped.queue.full",
        ];
        let line: Vec<String> = keys.iter().map(|k| format!("{k}={}", m[*k])).collect();
        println!("node {}: {}", i + 1, line.join(" "));
    }
}

fn counter(m: &serde_json::Value, name: &str) -> u64 {
    m[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name} in {m}"))
}

/// Back-pressure crosses the node boundary: a QoS 1/2 flood published on node 1 for a
/// subscriber on node 2 that reads slowly (and allows 4 messages in flight) with a session
/// queue of 40 messages goes at the subscriber's pace, and nothing is dropped: node 2's
/// subscriber holds node 1's link back (node 2 acknowledges node 1's batches late) and node
/// 1 holds its publisher while its window to node 2 is full. Before, node 2 acknowledged at
/// once and dropped what did not fit in the subscriber's queue: most of the flood. The
/// window is set to 40 messages: the automatic one (2,078 with this queue) is wider than
/// this flood ever has in flight, so node 1 would not need to hold it.
#[test]
fn a_slow_subscriber_on_another_node_holds_the_publisher_back_and_loses_nothing() {
    let Some((files, ports, _nodes)) = running_cluster(
        "cluster-bp",
        "\n[mqtt]\nmax_mqueue_len = 40\n[cluster]\nforward_window_messages = 40\n",
    ) else {
        return;
    };

    let slow = ["--delay-ms", "2", "--receive-max", "4"];
    let (mut w, rx) = common::watcher_with(ports[1].mqtt, "slow-on-2", "bp/#", &slow);
    common::next_line(&rx, "subscribed");
    let before = metrics(&files[1]);

    let mut p = publisher(ports[0].mqtt, "bp/data", 1000);
    let acked: BTreeSet<(String, String)> = acked_lines(&mut p, |_| {})
        .into_iter()
        .map(|p| ("bp/data".to_owned(), p))
        .collect();
    assert_eq!(acked.len(), 2000, "node 1 acknowledged every message");
    let mut seen = BTreeSet::new();
    gather(&rx, &mut seen, &acked, Duration::from_secs(60));
    let after = metrics(&files[1]);
    let publisher_node = metrics(&files[0]);
    // Read while the subscriber is there (its route goes with it).
    let (s1, s2) = (stats(&files[0]), stats(&files[1]));
    let _ = w.kill();
    let _ = w.wait();
    println!(
        "node 2: link holds {}, dropped (queue full) {}; node 1: publisher holds {}",
        after["cluster.link.holds"],
        after["dropped.queue.full"],
        publisher_node["backpressure.holds"]
    );
    assert_eq!(
        missing(&acked, &seen),
        0,
        "acknowledged messages missing at the slow subscriber on node 2 (of {}; {} arrived)",
        acked.len(),
        seen.len()
    );
    for name in [
        "dropped.queue.full",
        "dropped.mailbox.full",
        "dropped.expired",
        "dropped.other",
    ] {
        assert_eq!(
            counter(&after, name),
            counter(&before, name),
            "node 2 dropped messages ({name})"
        );
    }
    assert!(
        counter(&after, "cluster.link.holds") > counter(&before, "cluster.link.holds"),
        "node 2 never held node 1's link back"
    );
    assert!(
        counter(&publisher_node, "backpressure.holds") > 0,
        "node 1 never held its publisher back"
    );
    // The forwarding and raft counters moved: node 1's batches to node 2 (2000 payloads
    // of some bytes each at least), node 2's proposal of the subscriber's route.
    let (batches, bytes) = (
        counter(&publisher_node, "cluster.forward.batches"),
        counter(&publisher_node, "cluster.forward.bytes"),
    );
    assert!(
        batches > 0 && bytes > 2000 * 8,
        "node 1's forwarding counters: {batches} batches, {bytes} bytes"
    );
    assert!(
        counter(&after, "cluster.raft.commits") > 0
            && counter(&after, "cluster.raft.commit.us") > 0,
        "node 2 counted no raft commit of its own: {after}"
    );
    // The state counts saw it: node 1's window to node 2 filled and drained, node 2's
    // subscriber queued; node 1 routes `bp/#` to node 2 by the replicated table.
    assert!(counter(&s1, "forwards.max") > 0, "{s1}");
    assert_eq!(counter(&s1, "forwards.count"), 0, "{s1}");
    assert!(counter(&s1, "routes.count") >= 1, "{s1}");
    assert!(counter(&s2, "message_queues.max") > 0, "{s2}");
    assert!(
        counter(&s2, "out_inflights.max") <= 4,
        "a window of 4: {s2}"
    );
}

/// `$exclusive/` and `$limit/N/` count cluster-wide: one holder of an exclusive filter and
/// N of a limited one among the clients of all three nodes (MQTT 5 SUBACK 0x97 for the
/// next), and the exclusive filter is free again once its holder's session ends.
#[test]
fn exclusive_and_limited_subscriptions_are_counted_across_the_nodes() {
    let Some((_files, ports, _nodes)) = running_cluster("cluster-ex", "") else {
        return;
    };
    let codes = ["--codes"];
    let sub = |node: usize, id: &str, filter: &str| {
        let (w, rx) = common::watcher_with(ports[node].mqtt, id, filter, &codes);
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{id}: no SUBACK"));
        (w, line)
    };
    let mut clients = Vec::new();
    let (w, first) = sub(1, "ex-on-2", "$exclusive/ex/a");
    clients.push(w);
    assert_eq!(
        first, "subscribed 1",
        "the first exclusive subscriber is granted"
    );
    let (mut w, second) = sub(2, "ex-on-3", "$exclusive/ex/a");
    assert_eq!(
        second, "subscribed 151",
        "a second exclusive subscriber on another node is refused (0x97)"
    );
    let _ = w.kill();
    let _ = w.wait();
    for (node, id, want) in [
        (0, "lim-on-1", "subscribed 1"),
        (1, "lim-on-2", "subscribed 1"),
        (2, "lim-on-3", "subscribed 151"),
    ] {
        let (w, line) = sub(node, id, "$limit/2/lim/a");
        assert_eq!(line, want, "{id} on $limit/2/lim/a");
        clients.push(w);
    }
    // The exclusive holder goes: its session ends, and the filter is free cluster-wide.
    let _ = clients[0].kill();
    let _ = clients[0].wait();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (mut w, line) = sub(2, "ex-on-3-again", "$exclusive/ex/a");
        if line == "subscribed 1" {
            clients.push(w);
            break;
        }
        let _ = w.kill();
        let _ = w.wait();
        assert!(
            Instant::now() < deadline,
            "the exclusive filter stayed held after its holder left: {line}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    for w in &mut clients {
        let _ = w.kill();
        let _ = w.wait();
    }
}

/// A shared group's last member on a node leaves mid-stream: node 1 goes on picking that
/// node until it applies the route's removal, and that node passes what comes meanwhile
/// on to the group's other node, once. Members on nodes 2 and 3, a QoS 1/2 publisher on
/// node 1; node 2's member unsubscribes after its 300th message and keeps reading what its
/// session still holds. Every acknowledged message reaches a member; node 2 drops none.
/// Before, node 2 dropped what came after the unsubscribe (`dropped.other`), while node 1
/// had told the publisher it arrived.
#[test]
fn a_shared_groups_member_leaving_its_node_mid_stream_loses_no_acknowledged_message() {
    let Some((files, ports, _nodes)) = running_cluster("cluster-share-left", "") else {
        return;
    };
    let leave = ["--unsubscribe-after", "300"];
    let (mut g2, rx_g2) = watcher_with(ports[1].mqtt, "leaver-on-2", "$share/crew/sl/#", &leave);
    let (mut g3, rx_g3) = watcher(ports[2].mqtt, "stayer-on-3", "$share/crew/sl/#");
    common::next_line(&rx_g2, "subscribed");
    common::next_line(&rx_g3, "subscribed");
    assert!(
        until_forwarded(ports[0].mqtt, "sl/probe", &rx_g3)
            || until_forwarded(ports[0].mqtt, "sl/probe", &rx_g2),
        "node 1 never forwarded to the group"
    );
    let before = metrics(&files[1]);
    let mut p = publisher(ports[0].mqtt, "sl/jobs", 1500);
    let jobs: BTreeSet<(String, String)> = acked_lines(&mut p, |_| {})
        .into_iter()
        .map(|p| ("sl/jobs".to_owned(), p))
        .collect();
    assert_eq!(jobs.len(), 3000, "node 1 acknowledged every job");
    let (mut got2, mut got3) = (BTreeSet::new(), BTreeSet::new());
    let deadline = Instant::now() + Duration::from_secs(30);
    while !jobs.is_subset(&got2.union(&got3).cloned().collect()) && Instant::now() < deadline {
        gather(&rx_g2, &mut got2, &jobs, Duration::from_millis(200));
        gather(&rx_g3, &mut got3, &jobs, Duration::from_millis(200));
    }
    let after = metrics(&files[1]);
    for w in [&mut g2, &mut g3] {
        let _ = w.kill();
        let _ = w.wait();
    }
    let all: BTreeSet<_> = got2.union(&got3).cloned().collect();
    let passed = counter(&after, "cluster.shared.passed.on");
    println!(
        "node 2's member got {} before it left, node 3's {}; node 2 passed {passed} on",
        got2.len(),
        got3.len()
    );
    // It left mid-stream: after its 300th message (the probe's among them), with the
    // rest of the jobs still to come.
    assert!(
        (250..2000).contains(&got2.len()),
        "node 2's member got {} jobs: it did not leave mid-stream",
        got2.len()
    );
    assert_eq!(
        missing(&jobs, &all),
        0,
        "acknowledged jobs that reached no member (of {}): node 2 passed {passed} on, dropped {}",
        jobs.len(),
        counter(&after, "dropped.other") - counter(&before, "dropped.other")
    );
    assert_eq!(
        counter(&after, "dropped.other"),
        counter(&before, "dropped.other"),
        "node 2 dropped jobs for the group"
    );
}

/// The outbox with real processes: node 3, with a subscriber, is stopped (SIGSTOP) while a
/// QoS 1/2 publisher on node 1 publishes; node 1 parks each batch once node 3 has not
/// acknowledged it for 1.1 s (`backpressure_max_secs = 1`, `forward_timeout_ms = 100`) and
/// then acknowledges its publishes. Node 1 is killed (SIGKILL) with every batch parked and
/// none acknowledged, node 3 resumed, node 1 started again: the batches its first run
/// parked go to node 3 from its store, and the subscriber gets every acknowledged message.
/// Without the outbox, node 1 would have answered 0x80 (unconfirmed) after 15 s, and the
/// kill would have lost what it held.
#[test]
fn batches_parked_for_a_stopped_node_reach_it_after_the_sender_is_killed_and_restarted() {
    let extra = "\n[mqtt]\nbackpressure_max_secs = 1\n[cluster]\nforward_timeout_ms = 100\n";
    let Some((files, ports, mut nodes)) = running_cluster("cluster-outbox", extra) else {
        return;
    };
    let (mut w, rx) = watcher(ports[2].mqtt, "sub-on-3", "ob/#");
    common::next_line(&rx, "subscribed");
    // The SUBACK waits for the route only up to a bound: on a loaded machine node 1 could
    // still lack it, route nothing to node 3 and park nothing (seen once in a full run).
    assert!(
        until_forwarded(ports[0].mqtt, "ob/probe", &rx),
        "node 1 never forwarded to node 3"
    );
    let pid3 = nodes[2].child.id();
    signal("STOP", pid3);
    let started = Instant::now();
    let mut p = publisher(ports[0].mqtt, "ob/data", 60);
    let acked: BTreeSet<(String, String)> = acked_lines(&mut p, |_| {})
        .into_iter()
        .map(|p| ("ob/data".to_owned(), p))
        .collect();
    let took = started.elapsed();
    let parked = counter(&metrics(&files[0]), "cluster.outbox.parked");
    println!(
        "node 1 acknowledged {} messages in {took:?} with node 3 stopped; {parked} parked",
        acked.len()
    );
    assert_eq!(acked.len(), 120, "node 1 acknowledged every message");
    assert!(
        parked >= 120,
        "every message went through the outbox: {parked}"
    );
    let depth = counter(&metrics(&files[0]), "cluster.outbox.depth");
    assert!(depth >= 120, "node 1's outbox holds {depth} messages");
    assert!(
        took >= Duration::from_millis(1100),
        "acknowledged before the forward timeout: {took:?}"
    );

    signal("KILL", nodes[0].child.id());
    let _ = nodes[0].child.wait();
    signal("CONT", pid3);
    nodes[0] = Daemon::start(&files[0]);
    nodes[0].expect("cluster endpoint up");
    // Its metrics come through its HTTP API, which may bind after the cluster endpoint.
    nodes[0].expect("HTTP API serving");

    let mut seen = BTreeSet::new();
    gather(&rx, &mut seen, &acked, Duration::ZERO);
    let early = seen.intersection(&acked).count();
    gather(&rx, &mut seen, &acked, Duration::from_secs(60));
    // Node 3 hands a replayed batch to its subscriber before node 1 hears the batch was
    // taken (and datagrams node 1's first run sent before the kill can still sit in node
    // 3's socket buffer and arrive on resume). So every message having arrived does not
    // mean node 1 has counted the replay yet: wait for it.
    let until = Instant::now() + Duration::from_secs(30);
    let mut replayed = counter(&metrics(&files[0]), "cluster.outbox.replayed");
    while replayed == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
        replayed = counter(&metrics(&files[0]), "cluster.outbox.replayed");
    }
    let _ = w.kill();
    let _ = w.wait();
    println!(
        "node 1's second run replayed {replayed} parked batches; {early} messages had arrived \
         by the time it was up"
    );
    assert_eq!(
        missing(&acked, &seen),
        0,
        "acknowledged messages missing at node 3 (of {}; {} arrived)",
        acked.len(),
        seen.len()
    );
    assert!(replayed > 0, "node 1's second run sent no parked batch");
    // Once node 3 took them, node 1's outbox is empty again.
    let until = Instant::now() + Duration::from_secs(10);
    let mut depth = counter(&metrics(&files[0]), "cluster.outbox.depth");
    while depth > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
        depth = counter(&metrics(&files[0]), "cluster.outbox.depth");
    }
    assert_eq!(
        depth, 0,
        "node 1's outbox still holds messages after the replay"
    );
}

/// A parked batch its node takes but cannot make durable: node 3's store is capped at
/// 1 MiB and its persistent subscriber never acknowledges, so the deliveries of the
/// batches node 1 parked while node 3 was stopped (and replays after its own kill) do not
/// fit. Node 3 says so (`NotDurable`); node 1 drops the rows, counts them as lost, and its
/// link to node 3 goes on: a message published afterwards reaches node 3. Before, node 3
/// stayed silent, node 1 sent the first such batch every second for good, and the shard's
/// later batches to node 3 waited behind it until node 3 restarted.
#[test]
fn a_parked_batch_its_node_cannot_store_is_counted_lost_and_the_link_goes_on() {
    let extra = "\n[mqtt]\nbackpressure_max_secs = 1\n[cluster]\nforward_timeout_ms = 100\n";
    let capped = format!("{extra}[storage]\nmax_bytes = 1048576\n");
    let Some((files, ports, mut nodes)) =
        running_cluster_each("cluster-outbox-full", [extra, extra, &capped])
    else {
        return;
    };
    let hoard = ["--expiry", "3600", "--no-ack", "--head"];
    let (mut w, rx) = watcher_with(ports[2].mqtt, "hoarder-on-3", "of/#", &hoard);
    common::next_line(&rx, "subscribed");
    assert!(
        until_forwarded(ports[0].mqtt, "of/probe", &rx),
        "node 1 never forwarded to node 3"
    );
    let pid3 = nodes[2].child.id();
    signal("STOP", pid3);
    // 200 messages of 8 KB: over node 3's 1 MiB.
    let mut p = publisher_with(ports[0].mqtt, "of/data", 100, &["--pad", "8000"]);
    let acked = acked_lines(&mut p, |_| {});
    assert_eq!(acked.len(), 200, "node 1 acknowledged every message");
    let parked = counter(&metrics(&files[0]), "cluster.outbox.parked");
    assert!(
        parked >= 200,
        "every message went through the outbox: {parked}"
    );

    signal("KILL", nodes[0].child.id());
    let _ = nodes[0].child.wait();
    signal("CONT", pid3);
    nodes[0] = Daemon::start(&files[0]);
    nodes[0].expect("cluster endpoint up");
    // Its metrics come through its HTTP API, which may bind after the cluster endpoint.
    nodes[0].expect("HTTP API serving");

    // Every parked batch answered: acknowledged, or refused as not durable.
    let until = Instant::now() + Duration::from_secs(60);
    let mut depth = counter(&metrics(&files[0]), "cluster.outbox.depth");
    while depth > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
        depth = counter(&metrics(&files[0]), "cluster.outbox.depth");
    }
    let m1 = metrics(&files[0]);
    let (lost, replayed) = (
        counter(&m1, "cluster.outbox.lost"),
        counter(&m1, "cluster.outbox.replayed"),
    );
    let not_durable = counter(&metrics(&files[2]), "cluster.forward.not.durable");
    println!(
        "node 1's second run: {replayed} parked batches acknowledged, {lost} parked messages \
         lost, {depth} still parked; node 3: {not_durable} writes not durable"
    );
    assert_eq!(depth, 0, "node 1's outbox still holds messages");
    assert!(
        not_durable > 0,
        "node 3's store took every delivery: the test did not fill it"
    );
    assert!(
        lost > 0 && lost <= 200,
        "node 1 counted {lost} parked messages as lost"
    );

    // The link goes on: a message published now reaches node 3 (a subscriber that keeps
    // nothing in the store, as node 3's store is still full).
    let (mut w2, rx2) = watcher(ports[2].mqtt, "after-on-3", "of/data");
    common::next_line(&rx2, "subscribed");
    let mut p = publisher(ports[0].mqtt, "of/data", 1);
    let _ = acked_lines(&mut p, |_| {});
    let want: BTreeSet<(String, String)> = ["1:0", "2:0"]
        .iter()
        .map(|p| ("of/data".to_owned(), (*p).to_owned()))
        .collect();
    let mut seen = BTreeSet::new();
    gather(&rx2, &mut seen, &want, Duration::from_secs(30));
    for c in [&mut w, &mut w2] {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert_eq!(
        missing(&want, &seen),
        0,
        "a message published after the refused batches did not reach node 3"
    );
}
