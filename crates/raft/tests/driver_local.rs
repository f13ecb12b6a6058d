//! Three driver actors on the production (actix) backend, connected in process: a leader is
//! elected, proposals made on any node are applied once, reads see them.

use std::collections::BTreeMap;
use std::time::Duration;

use starling_raft::{
    start, Config, Consistency, DiskLog, LocalNet, MemDisk, Node, RaftHandle, RequestId,
    StateMachine,
};

#[derive(Default)]
struct Kv(BTreeMap<String, String>);

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
        self.0
            .iter()
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

fn boot(net: &LocalNet, id: u64) -> RaftHandle {
    let mut c = Config::new(id);
    c.initial_voters = vec![1, 2, 3];
    c.tick_interval = Duration::from_millis(10);
    c.request_timeout = Duration::from_secs(3);
    let log = DiskLog::open(MemDisk::new(), c.log.clone()).unwrap();
    let node = Node::new(
        c.validate().unwrap(),
        log,
        Kv::default(),
        starling_rt::rng::rng(),
    )
    .unwrap();
    let h = start(node, net.transport());
    net.register(id, h.clone());
    h
}

#[test]
fn three_drivers_replicate_and_read_linearizably() {
    starling_rt::Runtime::new(2).block_on(async {
        let net = LocalNet::new();
        let hs: Vec<RaftHandle> = (1..=3).map(|id| boot(&net, id)).collect();
        let mut leader = None;
        for _ in 0..200 {
            starling_rt::time::sleep(Duration::from_millis(10)).await;
            if let Ok(s) = hs[0].status().await {
                if s.leader.is_some() {
                    leader = s.leader;
                    break;
                }
            }
        }
        let leader = leader.expect("a leader within 2 s");
        let follower = (1..=3u64).find(|&i| i != leader).unwrap();
        let fh = &hs[(follower - 1) as usize];
        let id = RequestId {
            client_id: 42,
            seq: 1,
        };
        let prev = fh.propose(id, b"k=v1".to_vec()).await.unwrap();
        assert_eq!(prev, b"");
        // A retry of the same request answers the same and does not apply twice.
        let again = fh.propose(id, b"k=v1".to_vec()).await.unwrap();
        assert_eq!(again, b"");
        let mut client = fh.client(43);
        assert_eq!(client.propose(b"k=v2".to_vec(), 3).await.unwrap(), b"v1");
        for h in &hs {
            let v = h
                .read(b"k".to_vec(), Consistency::Linearizable)
                .await
                .unwrap();
            assert_eq!(v, b"v2");
        }
        let s = hs[(leader - 1) as usize].status().await.unwrap();
        assert_eq!(s.progress.len(), 3);
        assert!(s.applied >= 3);
        let stale = fh.read(b"k".to_vec(), Consistency::Stale).await.unwrap();
        assert!(stale == b"v2" || stale == b"v1");
        for h in &hs {
            h.stop();
        }
    });
}
