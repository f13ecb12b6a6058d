//! Each op kind, committed to a file and read back by a reopen.

mod common;

use std::path::Path;

use common::{delivery, message, meta, pid, queued, wall};
use starling_session::state::{InflightPhase, InflightState};
use starling_store::{
    check, DeliveryStage, Fsync, Limits, Location, Op, Recovered, Refusal, Refused, SessionParts,
    Store, StoredDelivery, Usage,
};

const UNLIMITED: Limits = Limits {
    max_bytes: u64::MAX,
};

fn open(path: &Path) -> (Store, Recovered) {
    Store::open(Location::File(path.to_owned()), UNLIMITED).expect("the store opens")
}

fn reopen(store: Store, path: &Path) -> (Store, Recovered) {
    let usage = store.usage();
    drop(store);
    let (store, recovered) = open(path);
    assert_eq!(store.usage(), usage, "usage recounted at open differs");
    (store, recovered)
}

fn put_session(client: &str) -> Op {
    Op::PutSession {
        client_id: client.into(),
        meta: meta(&["t/#"]),
    }
}

fn commit(store: &mut Store, ops: &[Op]) {
    let committed = store.commit(ops, Fsync::Always).expect("commit");
    assert_eq!(committed.refused, [], "nothing is refused here");
}

#[test]
fn a_new_store_is_empty_and_reopens_empty() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (store, recovered) = open(&path);
    assert_eq!(recovered, Recovered::default());
    assert_eq!(store.usage(), Usage::default());
    let (_, recovered) = reopen(store, &path);
    assert_eq!(recovered, Recovered::default());
}

#[test]
fn a_session_with_deliveries_and_inbound_ids_is_reassembled_in_seq_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (mut store, _) = open(&path);
    let inflight = |seq: u64, p: u16, phase| Op::PutDelivery {
        client_id: "c".into(),
        seq,
        record: StoredDelivery {
            stage: DeliveryStage::Inflight {
                packet_id: pid(p),
                phase,
            },
            delivery: delivery("t/in", &[seq as u8]),
        },
    };
    let queue = |seq: u64| Op::PutDelivery {
        client_id: "c".into(),
        seq,
        record: queued("t/q", &[seq as u8]),
    };
    commit(
        &mut store,
        &[
            put_session("c"),
            queue(12),
            inflight(3, 9, InflightPhase::AwaitingPubrec),
            queue(10),
            inflight(2, 8, InflightPhase::AwaitingPuback),
            Op::PutInbound {
                client_id: "c".into(),
                packet_id: pid(5),
            },
            Op::PutInbound {
                client_id: "c".into(),
                packet_id: pid(2),
            },
        ],
    );
    let (_, recovered) = reopen(store, &path);
    let [s] = &recovered.sessions[..] else {
        panic!("one session: {recovered:?}");
    };
    assert_eq!(s.inflight_seqs, [2, 3]);
    assert_eq!(s.queue_seqs, [10, 12]);
    let parts = SessionParts::split(s.state.clone()).expect("a stored session is detached");
    assert_eq!(parts.client_id, "c");
    assert_eq!(parts.meta, meta(&["t/#"]));
    assert_eq!(
        parts.inflight,
        [
            InflightState {
                packet_id: pid(8),
                phase: InflightPhase::AwaitingPuback,
                delivery: delivery("t/in", &[2]),
            },
            InflightState {
                packet_id: pid(9),
                phase: InflightPhase::AwaitingPubrec,
                delivery: delivery("t/in", &[3]),
            },
        ]
    );
    assert_eq!(
        parts.queue,
        [delivery("t/q", &[10]), delivery("t/q", &[12])]
    );
    assert_eq!(parts.inbound_qos2, [pid(2), pid(5)]);
}

#[test]
fn a_delivery_changes_stage_by_overwriting_its_seq() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (mut store, _) = open(&path);
    commit(&mut store, &[put_session("c")]);
    let stage = |stage| Op::PutDelivery {
        client_id: "c".into(),
        seq: 1,
        record: StoredDelivery {
            stage,
            delivery: delivery("t", b"x"),
        },
    };
    let flight = |phase| DeliveryStage::Inflight {
        packet_id: pid(4),
        phase,
    };
    for s in [
        DeliveryStage::Queued,
        flight(InflightPhase::AwaitingPubrec),
        flight(InflightPhase::AwaitingPubcomp),
    ] {
        commit(&mut store, &[stage(s)]);
        let (s2, recovered) = reopen(store, &path);
        store = s2;
        assert_eq!(store.usage().deliveries, 1);
        let parts = SessionParts::split(recovered.sessions[0].state.clone()).unwrap();
        match s {
            DeliveryStage::Queued => assert_eq!(parts.queue.len(), 1),
            DeliveryStage::Inflight { phase, .. } => assert_eq!(parts.inflight[0].phase, phase),
        }
    }
    commit(
        &mut store,
        &[Op::DropDelivery {
            client_id: "c".into(),
            seq: 1,
        }],
    );
    let (_, recovered) = reopen(store, &path);
    assert_eq!(recovered.sessions[0].inflight_seqs, [] as [u64; 0]);
}

#[test]
fn dropping_a_session_drops_its_deliveries_and_inbound_ids_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (mut store, _) = open(&path);
    let mut ops = Vec::new();
    // "a" sorts just before "a\0..." and "ab": the range delete must stop at "a".
    for c in ["a", "ab", "a\u{1}"] {
        ops.push(put_session(c));
        for seq in [0, u64::MAX] {
            ops.push(Op::PutDelivery {
                client_id: c.into(),
                seq,
                record: queued("t", b"p"),
            });
        }
        ops.push(Op::PutInbound {
            client_id: c.into(),
            packet_id: pid(u16::MAX),
        });
    }
    commit(&mut store, &ops);
    commit(
        &mut store,
        &[Op::DropSession {
            client_id: "a".into(),
        }],
    );
    let usage = store.usage();
    assert_eq!((usage.sessions, usage.deliveries, usage.inbound), (2, 4, 2));
    let (_, recovered) = reopen(store, &path);
    let ids: Vec<_> = recovered
        .sessions
        .iter()
        .map(|s| s.state.client_id.as_str())
        .collect();
    assert_eq!(ids, ["a\u{1}", "ab"]);
    for s in &recovered.sessions {
        assert_eq!(s.queue_seqs, [0, u64::MAX]);
    }
}

#[test]
fn inbound_ids_come_and_go() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (mut store, _) = open(&path);
    let inbound = |p| Op::PutInbound {
        client_id: "c".into(),
        packet_id: pid(p),
    };
    commit(&mut store, &[put_session("c"), inbound(1), inbound(2)]);
    commit(
        &mut store,
        &[Op::DropInbound {
            client_id: "c".into(),
            packet_id: pid(1),
        }],
    );
    let (_, recovered) = reopen(store, &path);
    let parts = SessionParts::split(recovered.sessions[0].state.clone()).unwrap();
    assert_eq!(parts.inbound_qos2, [pid(2)]);
}

#[test]
fn deliveries_and_inbound_ids_of_an_unknown_session_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (mut store, _) = open(&path);
    let committed = store
        .commit(
            &[
                Op::PutDelivery {
                    client_id: "ghost".into(),
                    seq: 0,
                    record: queued("t", b"p"),
                },
                Op::PutInbound {
                    client_id: "ghost".into(),
                    packet_id: pid(1),
                },
                put_session("c"),
            ],
            Fsync::Always,
        )
        .unwrap();
    let refused = |op| Refused {
        op,
        reason: Refusal::NoSession,
    };
    assert_eq!(committed.refused, [refused(0), refused(1)]);
    assert_eq!(store.usage().sessions, 1);
    let (_, recovered) = reopen(store, &path);
    assert_eq!(recovered.sessions.len(), 1);
}

#[test]
fn retained_messages_are_replaced_and_dropped_by_topic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (mut store, _) = open(&path);
    let put = |topic: &str, payload: &[u8]| Op::PutRetained {
        topic: topic.into(),
        message: message(topic, payload),
    };
    commit(
        &mut store,
        &[put("b", b"1"), put("a", b"1"), put("b", b"2")],
    );
    let (mut store, recovered) = reopen(store, &path);
    assert_eq!(
        recovered.retained,
        [
            ("a".to_string(), message("a", b"1")),
            ("b".to_string(), message("b", b"2"))
        ]
    );
    commit(&mut store, &[Op::DropRetained { topic: "a".into() }]);
    let (_, recovered) = reopen(store, &path);
    assert_eq!(recovered.retained, [("b".to_string(), message("b", b"2"))]);
}

#[test]
fn delayed_messages_come_back_in_due_order_and_ids_are_never_reused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (mut store, _) = open(&path);
    let put = |id, due| Op::PutDelayed {
        id,
        due: wall(due),
        target: "t/out".into(),
        message: message("$delayed/1/t/out", b"d"),
    };
    commit(&mut store, &[put(7, 30), put(2, 10), put(5, 20)]);
    let (mut store, recovered) = reopen(store, &path);
    let order: Vec<_> = recovered.delayed.iter().map(|d| (d.id, d.due)).collect();
    assert_eq!(order, [(2, wall(10)), (5, wall(20)), (7, wall(30))]);
    assert_eq!(recovered.delayed[0].target, "t/out");
    assert_eq!(recovered.next_delayed_id, 8);
    let drop_all: Vec<_> = [(7, 30), (2, 10), (5, 20)]
        .into_iter()
        .map(|(id, due)| Op::DropDelayed { id, due: wall(due) })
        .collect();
    commit(&mut store, &drop_all);
    let (_, recovered) = reopen(store, &path);
    assert_eq!(recovered.delayed, []);
    assert_eq!(
        recovered.next_delayed_id, 8,
        "the mark outlives its messages"
    );
}

#[test]
fn applying_every_op_twice_is_the_same_as_once() {
    let dir = tempfile::tempdir().unwrap();
    let (once, twice) = (dir.path().join("once"), dir.path().join("twice"));
    let ops = [
        put_session("c"),
        Op::PutDelivery {
            client_id: "c".into(),
            seq: 1,
            record: queued("t", b"p"),
        },
        Op::PutInbound {
            client_id: "c".into(),
            packet_id: pid(3),
        },
        Op::PutRetained {
            topic: "r".into(),
            message: message("r", b"x"),
        },
        Op::PutDelayed {
            id: 1,
            due: wall(5),
            target: "t".into(),
            message: message("t", b"x"),
        },
        Op::DropDelivery {
            client_id: "c".into(),
            seq: 9,
        },
        Op::DropRetained { topic: "zz".into() },
        Op::DropSession {
            client_id: "nobody".into(),
        },
    ];
    let (mut a, _) = open(&once);
    commit(&mut a, &ops);
    let (mut b, _) = open(&twice);
    commit(&mut b, &ops);
    commit(&mut b, &ops);
    let doubled: Vec<Op> = ops.iter().flat_map(|op| [op.clone(), op.clone()]).collect();
    commit(&mut b, &doubled);
    assert_eq!(a.usage(), b.usage());
    let (_, ra) = reopen(a, &once);
    let (_, rb) = reopen(b, &twice);
    assert_eq!(ra, rb);
}

#[test]
fn check_counts_what_the_store_holds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (mut store, _) = open(&path);
    commit(
        &mut store,
        &[
            put_session("c"),
            Op::PutDelivery {
                client_id: "c".into(),
                seq: 1,
                record: queued("t", b"p"),
            },
            Op::PutRetained {
                topic: "r".into(),
                message: message("r", b"x"),
            },
        ],
    );
    let usage = store.usage();
    drop(store);
    let report = check(&path).expect("a good store checks");
    assert_eq!(report.usage, usage);
    assert_eq!(report.format_version, starling_store::FORMAT_VERSION);
    assert_eq!(
        (usage.sessions, usage.deliveries, usage.retained),
        (1, 1, 1)
    );
}

#[test]
fn check_refuses_a_store_another_handle_has_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (_store, _) = open(&path);
    let err = check(&path).expect_err("the store is open");
    let text = err.to_string();
    assert!(text.contains("store.redb"), "{text}");
}

#[test]
fn never_commits_are_durable_after_a_clean_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (mut store, _) = open(&path);
    store.commit(&[put_session("c")], Fsync::Never).unwrap();
    let (_, recovered) = reopen(store, &path);
    assert_eq!(recovered.sessions.len(), 1);
}

#[test]
fn staging_a_delivery_keeps_its_message_and_skips_one_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (mut store, _) = open(&path);
    let put = Op::PutDelivery {
        client_id: "c".into(),
        seq: 3,
        record: StoredDelivery {
            stage: DeliveryStage::Queued,
            delivery: delivery("t", b"payload"),
        },
    };
    let stage = |seq, phase| Op::StageDelivery {
        client_id: "c".into(),
        seq,
        stage: DeliveryStage::Inflight {
            packet_id: pid(9),
            phase,
        },
    };
    commit(&mut store, &[put_session("c"), put]);
    let bytes = store.usage().bytes;
    // seq 4 was never stored: nothing happens, nothing is refused.
    commit(
        &mut store,
        &[
            stage(3, InflightPhase::AwaitingPubrec),
            stage(4, InflightPhase::AwaitingPubrec),
        ],
    );
    assert_eq!(store.usage().deliveries, 1);
    assert!(store.usage().bytes > bytes, "the stage adds a packet id");
    commit(&mut store, &[stage(3, InflightPhase::AwaitingPubcomp)]);
    let (_, recovered) = reopen(store, &path);
    let s = &recovered.sessions[0];
    assert_eq!(s.inflight_seqs, [3]);
    let parts = SessionParts::split(s.state.clone()).unwrap();
    assert_eq!(parts.inflight[0].phase, InflightPhase::AwaitingPubcomp);
    assert_eq!(parts.inflight[0].packet_id, pid(9));
    assert_eq!(&parts.inflight[0].delivery.message.payload[..], b"payload");
}

#[test]
fn a_parked_batch_comes_back_in_parking_order_until_dropped() {
    use starling_store::OutboxBatch;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let (mut store, recovered) = open(&path);
    assert!(recovered.outbox.is_empty());
    let batch = |seq: u64, parked_ms: u64| OutboxBatch {
        node: 3,
        shard: 1,
        inc: 99,
        seq,
        parked_ms,
        messages: 2,
        map_seed: 17,
        shards: 2,
        frame: vec![seq as u8; 40],
    };
    // Parked in another order than their keys: they come back by parking time.
    commit(
        &mut store,
        &[
            Op::PutOutbox(batch(7, 2_000)),
            Op::PutOutbox(batch(5, 1_000)),
            Op::PutOutbox(batch(6, 3_000)),
        ],
    );
    assert_eq!(store.usage().outbox, 3);
    let (mut store, recovered) = reopen(store, &path);
    let seqs: Vec<u64> = recovered.outbox.iter().map(|b| b.seq).collect();
    assert_eq!(seqs, [5, 7, 6]);
    assert_eq!(recovered.outbox[0], batch(5, 1_000));
    commit(
        &mut store,
        &[
            Op::DropOutbox {
                node: 3,
                inc: 99,
                seq: 7,
            },
            // Not there: nothing.
            Op::DropOutbox {
                node: 4,
                inc: 99,
                seq: 7,
            },
        ],
    );
    let (_, recovered) = reopen(store, &path);
    let seqs: Vec<u64> = recovered.outbox.iter().map(|b| b.seq).collect();
    assert_eq!(seqs, [5, 6]);
    assert_eq!(check(&path).unwrap().usage.outbox, 2);
}

#[test]
fn a_shards_record_of_a_moving_session_is_replaced_and_dropped_by_shard_and_client() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let (mut store, recovered) = open(&path);
    assert!(recovered.moves.is_empty());
    let put = |shard: u16, client: &str, record: &[u8]| Op::PutMove {
        shard,
        client_id: client.to_owned(),
        record: record.to_vec(),
    };
    commit(
        &mut store,
        &[
            put(1, "b", b"one"),
            put(0, "b", b"two"),
            put(0, "a", b"three"),
            put(0, "b", b"four"),
        ],
    );
    // Not counted against the cap: the broker bounds them.
    assert_eq!(store.usage().bytes, 0);
    let (mut store, recovered) = reopen(store, &path);
    let back = |r: &Recovered| -> Vec<(u16, String, Vec<u8>)> { r.moves.clone() };
    assert_eq!(
        back(&recovered),
        vec![
            (0, "a".to_owned(), b"three".to_vec()),
            (0, "b".to_owned(), b"four".to_vec()),
            (1, "b".to_owned(), b"one".to_vec()),
        ]
    );
    commit(
        &mut store,
        &[
            Op::DropMove {
                shard: 0,
                client_id: "b".to_owned(),
            },
            // Not there: nothing.
            Op::DropMove {
                shard: 5,
                client_id: "b".to_owned(),
            },
        ],
    );
    let (_, recovered) = reopen(store, &path);
    assert_eq!(
        back(&recovered),
        vec![
            (0, "a".to_owned(), b"three".to_vec()),
            (1, "b".to_owned(), b"one".to_vec()),
        ]
    );
}
