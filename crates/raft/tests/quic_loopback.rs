//! Three raft drivers over the QUIC transport on loopback (real UDP, mutual TLS): a leader is
//! elected and proposals commit; a node whose certificate comes from another CA is never
//! heard; a fourth added at run time is dialed back and catches up.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use starling_net::CertAuthority;
use starling_raft::{
    node_name, start, Config, Consistency, DiskLog, MemDisk, Node, NodeTls, QuicNet, QuicOptions,
    RaftHandle, RequestId, StateMachine,
};

/// Last-writer-wins register per key; a write returns the previous value.
#[derive(Default)]
struct Kv(HashMap<String, String>);

impl StateMachine for Kv {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
        let s = String::from_utf8_lossy(command);
        let (k, v) = s.split_once('=').unwrap_or((&s, ""));
        self.0
            .insert(k.into(), v.into())
            .unwrap_or_default()
            .into_bytes()
    }
    async fn query(&self, q: &[u8]) -> Vec<u8> {
        self.0
            .get(&*String::from_utf8_lossy(q))
            .cloned()
            .unwrap_or_default()
            .into_bytes()
    }
    fn snapshot(&self) -> Vec<u8> {
        let mut kv: Vec<_> = self.0.iter().collect();
        kv.sort();
        kv.iter()
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect::<String>()
            .into_bytes()
    }
    fn restore(&mut self, s: &[u8]) -> Result<(), String> {
        self.0.clear();
        for line in String::from_utf8_lossy(s).lines() {
            let (k, v) = line.split_once('=').ok_or("bad line")?;
            self.0.insert(k.into(), v.into());
        }
        Ok(())
    }
}

fn tls(ca: &CertAuthority, id: u64) -> NodeTls {
    let name = node_name(id);
    NodeTls {
        identity: ca.issue(&name, &[&name]).unwrap().identity(),
        ca: ca.cert_der(),
    }
}

async fn bind(ca: &CertAuthority, id: u64) -> QuicNet {
    let opts = QuicOptions::new(id, "127.0.0.1:0".parse().unwrap());
    QuicNet::bind(opts, &tls(ca, id)).await.unwrap()
}

fn boot(net: &mut QuicNet, id: u64, peers: &BTreeMap<u64, SocketAddr>) -> RaftHandle {
    boot_as(net, id, peers, &[1, 2, 3])
}

/// As [`boot`], with `voters` as the first membership (none: a node that waits to be added).
fn boot_as(
    net: &mut QuicNet,
    id: u64,
    peers: &BTreeMap<u64, SocketAddr>,
    voters: &[u64],
) -> RaftHandle {
    let mut c = Config::new(id);
    c.initial_voters = voters.to_vec();
    c.tick_interval = Duration::from_millis(20);
    c.request_timeout = Duration::from_secs(5);
    let log = DiskLog::open(MemDisk::new(), c.log.clone()).unwrap();
    let node = Node::new(
        c.validate().unwrap(),
        log,
        Kv::default(),
        starling_rt::rng::rng(),
    )
    .unwrap();
    let h = start(node, net.transport(peers.clone()));
    net.serve(h.clone());
    h
}

async fn leader_of(hs: &[RaftHandle]) -> Option<u64> {
    for _ in 0..500 {
        starling_rt::time::sleep(Duration::from_millis(10)).await;
        if let Ok(s) = hs[0].status().await {
            if s.leader.is_some() {
                return s.leader;
            }
        }
    }
    None
}

#[test]
fn three_nodes_over_quic_elect_a_leader_and_commit() {
    starling_rt::Runtime::new(2).block_on(async {
        let ca = CertAuthority::generate("test CA").unwrap();
        let mut nets = Vec::new();
        for id in 1..=3 {
            nets.push(bind(&ca, id).await);
        }
        let peers: BTreeMap<u64, SocketAddr> = nets
            .iter()
            .enumerate()
            .map(|(i, n)| (i as u64 + 1, n.local_addr()))
            .collect();
        let hs: Vec<RaftHandle> = nets
            .iter_mut()
            .enumerate()
            .map(|(i, n)| boot(n, i as u64 + 1, &peers))
            .collect();
        let leader = leader_of(&hs).await.expect("a leader within 5 s");
        // Propose through a follower: forwarded to the leader over QUIC.
        let follower = (1..=3u64).find(|&i| i != leader).unwrap();
        let fh = &hs[(follower - 1) as usize];
        for seq in 1..=20u64 {
            let id = RequestId { client_id: 9, seq };
            fh.propose(id, format!("k=v{seq}").into_bytes())
                .await
                .unwrap();
        }
        for h in &hs {
            let v = h
                .read(b"k".to_vec(), Consistency::Linearizable)
                .await
                .unwrap();
            assert_eq!(v, b"v20");
        }
        for n in &nets {
            let m = n.metrics();
            assert!(m.delivered.load(Ordering::Relaxed) > 0);
            assert_eq!(m.refused.load(Ordering::Relaxed), 0);
            assert_eq!(m.connects.load(Ordering::Relaxed), 2);
        }
        for (h, n) in hs.iter().zip(&nets) {
            h.stop();
            n.close();
        }
    });
}

#[test]
fn a_node_with_a_foreign_certificate_is_not_heard() {
    starling_rt::Runtime::new(2).block_on(async {
        let ca = CertAuthority::generate("cluster CA").unwrap();
        let rogue_ca = CertAuthority::generate("rogue CA").unwrap();
        let mut nets = vec![bind(&ca, 1).await, bind(&ca, 2).await];
        // Node 3 claims the right name but its certificate is signed by another CA.
        nets.push(bind(&rogue_ca, 3).await);
        let peers: BTreeMap<u64, SocketAddr> = nets
            .iter()
            .enumerate()
            .map(|(i, n)| (i as u64 + 1, n.local_addr()))
            .collect();
        let hs: Vec<RaftHandle> = nets
            .iter_mut()
            .enumerate()
            .map(|(i, n)| boot(n, i as u64 + 1, &peers))
            .collect();
        // 1 and 2 form a majority and elect a leader between them.
        let leader = leader_of(&hs).await.expect("a leader among 1 and 2");
        assert!(leader == 1 || leader == 2);
        starling_rt::time::sleep(Duration::from_millis(500)).await;
        // Node 3 never completed a handshake either way, and never heard a message.
        assert_eq!(nets[2].metrics().connects.load(Ordering::Relaxed), 0);
        assert_eq!(nets[2].metrics().delivered.load(Ordering::Relaxed), 0);
        for n in &nets[..2] {
            assert_eq!(n.metrics().connects.load(Ordering::Relaxed), 1);
        }
        for (h, n) in hs.iter().zip(&nets) {
            h.stop();
            n.close();
        }
    });
}

/// Application frames on the data stream arrive in order, from the right sender, beside a
/// working raft group.
#[test]
fn data_frames_arrive_in_order_beside_raft() {
    starling_rt::Runtime::new(2).block_on(async {
        let ca = CertAuthority::generate("test CA").unwrap();
        let mut nets = Vec::new();
        for id in 1..=3 {
            nets.push(bind(&ca, id).await);
        }
        let peers: BTreeMap<u64, SocketAddr> = nets
            .iter()
            .enumerate()
            .map(|(i, n)| (i as u64 + 1, n.local_addr()))
            .collect();
        let mut inboxes = Vec::new();
        let mut hs = Vec::new();
        for (i, n) in nets.iter_mut().enumerate() {
            let id = i as u64 + 1;
            let mut c = Config::new(id);
            c.initial_voters = vec![1, 2, 3];
            c.tick_interval = Duration::from_millis(20);
            let log = DiskLog::open(MemDisk::new(), c.log.clone()).unwrap();
            let node = Node::new(
                c.validate().unwrap(),
                log,
                Kv::default(),
                starling_rt::rng::rng(),
            )
            .unwrap();
            let h = start(node, n.transport(peers.clone()));
            let (tx, rx) = tokio::sync::mpsc::channel(16);
            n.serve_with_data(h.clone(), Some(tx));
            inboxes.push(rx);
            hs.push(h);
        }
        leader_of(&hs).await.expect("a leader within 5 s");
        let links = nets[0].data();
        let mut sent = 0u32;
        while sent < 1000 {
            match links.try_send(3, sent.to_be_bytes().to_vec()) {
                Ok(()) => sent += 1,
                Err(starling_raft::DataSendError::Full(_)) => {
                    starling_rt::time::sleep(Duration::from_millis(1)).await
                }
                Err(e) => panic!("{e:?}"),
            }
        }
        assert_eq!(
            links.try_send(7, vec![1]),
            Err(starling_raft::DataSendError::Closed)
        );
        for want in 0..1000u32 {
            let (from, frame) = tokio::time::timeout(Duration::from_secs(5), inboxes[2].recv())
                .await
                .expect("frames within 5 s")
                .unwrap();
            assert_eq!(from, 1);
            assert_eq!(frame, want.to_be_bytes());
        }
        assert!(inboxes[1].try_recv().is_err(), "node 2 got nothing");
        for (h, n) in hs.iter().zip(&nets) {
            h.stop();
            n.close();
        }
    });
}

/// A node added while the cluster runs: the members are told its address
/// (`PeerControl::set`); it knows none of theirs, yet answers the leader (a node that
/// connects in unlisted is dialed back where it came from), catches up as a learner, becomes
/// a voter; once removed and dropped from the peers, it is not dialed any more.
#[test]
fn a_node_added_at_run_time_is_dialed_back_and_catches_up() {
    starling_rt::Runtime::new(2).block_on(async {
        let ca = CertAuthority::generate("test CA").unwrap();
        let mut nets = Vec::new();
        for id in 1..=4 {
            nets.push(bind(&ca, id).await);
        }
        let peers: BTreeMap<u64, SocketAddr> = nets[..3]
            .iter()
            .enumerate()
            .map(|(i, n)| (i as u64 + 1, n.local_addr()))
            .collect();
        let mut hs: Vec<RaftHandle> = nets[..3]
            .iter_mut()
            .enumerate()
            .map(|(i, n)| boot(n, i as u64 + 1, &peers))
            .collect();
        // Node 4: no initial membership, and only itself as a peer.
        let four = nets[3].local_addr();
        let h4 = boot_as(&mut nets[3], 4, &BTreeMap::from([(4, four)]), &[]);
        hs.push(h4.clone());

        let leader = leader_of(&hs[..3]).await.expect("a leader within 5 s");
        let lh = hs[(leader - 1) as usize].clone();
        for n in &nets[..3] {
            assert!(n.peer_control().set(4, four));
            assert!(
                !n.peer_control().set(4, four),
                "setting it again changes nothing"
            );
        }
        lh.add_learner(4).await.unwrap();
        let id = RequestId {
            client_id: 9,
            seq: 1,
        };
        lh.propose(id, b"k=added".to_vec()).await.unwrap();
        let mut caught_up = false;
        for _ in 0..500 {
            if h4.read(b"k".to_vec(), Consistency::Stale).await.unwrap() == b"added" {
                caught_up = true;
                break;
            }
            starling_rt::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(caught_up, "the learner caught up");
        assert!(
            nets[3].peer_control().list().contains_key(&leader),
            "node 4 dials the leader back at the address it came from"
        );
        let conf = lh.add_voter(4).await.unwrap();
        assert!(conf.voters.contains(&4));

        let conf = lh.remove_node(4).await.unwrap();
        assert!(!conf.voters.contains(&4));
        for n in &nets[..3] {
            assert!(n.peer_control().remove(4));
            assert!(!n.peer_control().list().contains_key(&4));
        }
        for (h, n) in hs.iter().zip(&nets) {
            h.stop();
            n.close();
        }
    });
}
