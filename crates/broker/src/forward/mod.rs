//! The frames nodes exchange on their data streams:
//! - `Publish`: a batch of forwarded messages from one shard, numbered per destination node
//!   and per incarnation of the sending shard (a restarted node numbers afresh), each with
//!   the shared group the receiver was picked for (or none), each with its expiry as
//!   wall-clock time, so it means the same on the receiving node as long as the nodes'
//!   clocks agree, and with the log index of the routes it was routed under. The receiver
//!   takes a link's batches only in order, without a gap (`cluster/inlink.rs`). Its own
//!   layout (`batch`), version 5; batches parked by a build that wrote version 4 (no
//!   routes' index) or version 3 (postcard through `MessageState`) are still read;
//! - `Ack`: the receiver took that shard's batch `seq`, durably (one per batch, in order,
//!   so a batch before it that was not acknowledged was taken but is not durable, or its
//!   acknowledgement was lost);
//! - `NotDurable`: the receiver took that shard's batch `seq` but could not make it durable
//!   (its store failed or was full): the sender stops sending it. A build without it logs
//!   the frame as undecodable and goes on;
//! - `Resend`: the receiver is missing the sender's batches from `from` on (lost with a
//!   replaced connection, or with the receiver's restart) and took none after them;
//! - `Through`: nothing the sender routed before that log index is still on its way to the
//!   receiver (sent, or to be sent, and not acknowledged, parked or not): a moved
//!   session's relay and judgement end by it (`routing::moving`). A build without it logs
//!   the frame as undecodable and goes on;
//! - `Session`: a session handed over to the receiver, which claimed its client id (or
//!   `SessionPart`s of one too large for a frame); `SessionWanted`: the receiver still
//!   waits for one, sent again.
//!
//! All but `Publish` are postcard behind version byte 3.

mod batch;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use starling_session::state::MessageState;
use starling_session::{Message, WallClock};

use crate::msg::{HandOff, SharedTo};

/// 3: batches are taken in order per sending shard's incarnation, with `Resend` (2 had
/// no incarnation; 1 no shared groups). `Publish` is written as version 4 now.
const FRAME_V3: u8 = 3;

/// How long a request for missing batches covers later ones: about what a batch sent
/// again takes to arrive and be seen, with room. Both ends keep to it: a receiver asks at
/// most once per damping, and a sender serves a request that a go-back it began within the
/// damping covers only once.
pub(crate) const RESEND_DAMP: std::time::Duration = std::time::Duration::from_millis(200);

/// Where a batch stands on its link: the sending shard's incarnation, the oldest batch it
/// still holds for the receiver (older ones it acknowledged or gave up on: the receiver
/// need not wait for them), and the newest it sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LinkPos {
    pub inc: u64,
    pub base: u64,
    pub top: u64,
}

/// One frame of a data stream, `P` being a batch of forwarded publishes: as read
/// ([`Batch`], version 4) or as version 3 wrote it (`BatchV3`, postcard). The other frames
/// are postcard, version 3. Variants keep their order: postcard writes the index.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Wire<P> {
    Publish(P),
    Ack {
        shard: u16,
        inc: u64,
        seq: u64,
    },
    Resend {
        shard: u16,
        inc: u64,
        from: u64,
    },
    /// The session of `client_id`, handed over to the receiver's claim `epoch` (`None`:
    /// the sender had none to give).
    Session {
        client_id: String,
        epoch: u64,
        handoff: Option<Box<HandOff>>,
    },
    /// Part `index` of `total` of a `Session` frame too large for one frame of the data
    /// stream (its bytes, cut in order): the receiver puts them together (`cluster::parts`).
    /// `Bytes`, not `Vec<u8>`: serde writes a `Vec<u8>` byte by byte, which took seconds
    /// for a 24 MB session in a debug build; postcard writes both alike on the wire.
    SessionPart {
        client_id: String,
        epoch: u64,
        index: u32,
        total: u32,
        bytes: bytes::Bytes,
    },
    /// The receiver's claim `epoch` of `client_id` still waits for the session the
    /// sender handed over: it sends it again (the first went on a link that was down and
    /// was dropped when it was redialled).
    SessionWanted {
        client_id: String,
        epoch: u64,
    },
    /// The receiver took `shard`'s batch `seq` but its writes are not durable there: it
    /// will never acknowledge it, and does not take it again (that would deliver its
    /// messages twice), so sending it again is in vain. Sent once the writes failed, and
    /// again whenever the batch comes again.
    NotDurable {
        shard: u16,
        inc: u64,
        seq: u64,
    },
    /// Every copy the sender routed to the receiver under routes older than log index `at`
    /// was taken there (or given up on): none is still on its way.
    Through {
        at: u64,
    },
}

/// A frame as read.
pub(crate) type Frame = Wire<Batch>;

/// A batch of forwarded publishes from one shard.
#[derive(Debug)]
pub(crate) struct Batch {
    pub shard: u16,
    pub pos: LinkPos,
    pub seq: u64,
    /// Sent again because the receiver said nothing for a while: it answers with what it
    /// is missing up to `pos.top`.
    pub probe: bool,
    /// The log index of the routes its messages were routed under (0: unknown, a batch
    /// of an earlier build): see `routing::moving`.
    pub routed_at: u64,
    /// In order, each with the shared group (name, topic filter) the receiver was picked
    /// for, or `None` for its plain subscribers.
    pub messages: Vec<(Arc<Message>, Option<SharedTo>)>,
}

/// A batch as version 3 wrote it (parked rows of an earlier build keep it).
#[derive(Debug, Serialize, Deserialize)]
struct BatchV3 {
    shard: u16,
    pos: LinkPos,
    seq: u64,
    probe: bool,
    messages: Vec<MessageState>,
    groups: Vec<Option<(String, String)>>,
}

impl<P> Wire<P> {
    /// The same frame with its batch, if it is one, made by `f`.
    fn map_batch<Q>(self, f: impl FnOnce(P) -> Q) -> Wire<Q> {
        match self {
            Wire::Publish(p) => Wire::Publish(f(p)),
            Wire::Ack { shard, inc, seq } => Wire::Ack { shard, inc, seq },
            Wire::Resend { shard, inc, from } => Wire::Resend { shard, inc, from },
            Wire::Session {
                client_id,
                epoch,
                handoff,
            } => Wire::Session {
                client_id,
                epoch,
                handoff,
            },
            Wire::SessionPart {
                client_id,
                epoch,
                index,
                total,
                bytes,
            } => Wire::SessionPart {
                client_id,
                epoch,
                index,
                total,
                bytes,
            },
            Wire::SessionWanted { client_id, epoch } => Wire::SessionWanted { client_id, epoch },
            Wire::NotDurable { shard, inc, seq } => Wire::NotDurable { shard, inc, seq },
            Wire::Through { at } => Wire::Through { at },
        }
    }
}

/// The largest part of a `Session` frame cut up, well under what the data stream carries
/// in one frame. Each part that comes restarts the claiming CONNECT's wait for the
/// session, so a link must bring one within that wait (3 s: about 85 KB/s), and forwarded
/// batches queued behind a part wait for one part only. (The receiver takes parts of any
/// size.)
pub(crate) const SESSION_PART_BYTES: usize = 256 << 10;

/// A `Session` frame.
pub(crate) fn encode_session(
    client_id: &str,
    epoch: u64,
    handoff: Option<Box<HandOff>>,
) -> Vec<u8> {
    frame_bytes(&Wire::Session {
        client_id: client_id.to_owned(),
        epoch,
        handoff,
    })
}

/// A `SessionWanted` frame.
pub(crate) fn encode_session_wanted(client_id: &str, epoch: u64) -> Vec<u8> {
    frame_bytes(&Wire::<BatchV3>::SessionWanted {
        client_id: client_id.to_owned(),
        epoch,
    })
}

/// A `Session` frame, as frames the data stream carries: itself, or its parts.
pub(crate) fn encode_session_parts(
    client_id: &str,
    epoch: u64,
    handoff: Option<Box<HandOff>>,
) -> Vec<Vec<u8>> {
    let whole = encode_session(client_id, epoch, handoff);
    if whole.len() <= SESSION_PART_BYTES {
        return vec![whole];
    }
    let total = whole.len().div_ceil(SESSION_PART_BYTES) as u32;
    whole
        .chunks(SESSION_PART_BYTES)
        .enumerate()
        .map(|(i, bytes)| {
            frame_bytes(&Wire::SessionPart {
                client_id: client_id.to_owned(),
                epoch,
                index: i as u32,
                total,
                bytes: bytes::Bytes::copy_from_slice(bytes),
            })
        })
        .collect()
}

/// The messages of a version 3 `Publish` frame, in order, each with its shared group.
fn messages(
    states: Vec<MessageState>,
    groups: Vec<Option<(String, String)>>,
    clock: &WallClock,
) -> Vec<(Arc<Message>, Option<SharedTo>)> {
    let mut groups = groups.into_iter();
    states
        .into_iter()
        .map(|s| {
            let g = groups.next().flatten().map(|(group, filter)| SharedTo {
                group: Arc::from(group),
                filter: Arc::from(filter),
            });
            // Timed from its arrival here: the publisher's node read it on another clock.
            let m = Message {
                received_at: Some(clock.now),
                ..Message::from_state(s, clock.now, clock.wall)
            };
            (Arc::new(m), g)
        })
        .collect()
}

fn frame_bytes(f: &Wire<BatchV3>) -> Vec<u8> {
    // Serializing plain data into a Vec cannot fail.
    postcard::to_extend(f, vec![FRAME_V3]).expect("frames serialize")
}

/// An acknowledgement of `shard`'s (incarnation `inc`) batch `seq`.
pub(crate) fn encode_ack(shard: u16, inc: u64, seq: u64) -> Vec<u8> {
    frame_bytes(&Wire::Ack { shard, inc, seq })
}

/// `shard`'s (incarnation `inc`) batch `seq` was taken here but is not durable.
pub(crate) fn encode_not_durable(shard: u16, inc: u64, seq: u64) -> Vec<u8> {
    frame_bytes(&Wire::NotDurable { shard, inc, seq })
}

/// Nothing this node routed to the receiver before log index `at` is on its way any more.
pub(crate) fn encode_through(at: u64) -> Vec<u8> {
    frame_bytes(&Wire::Through { at })
}

/// A request for `shard`'s (incarnation `inc`) batches from `from` on.
pub(crate) fn encode_resend(shard: u16, inc: u64, from: u64) -> Vec<u8> {
    frame_bytes(&Wire::Resend { shard, inc, from })
}

/// Why a forwarded frame was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    #[error("empty frame")]
    Empty,
    #[error("unknown frame version {0}")]
    Version(u8),
    #[error("undecodable frame: {0}")]
    Body(String),
}

/// A `Publish` frame of `shard`'s batch `seq`, holding `messages` in order, routed under
/// the routes of log index `routed_at`.
pub(crate) fn encode_publish<'a>(
    shard: u16,
    pos: LinkPos,
    seq_probe: (u64, bool),
    routed_at: u64,
    messages: impl Iterator<Item = (&'a Arc<Message>, Option<&'a SharedTo>)>,
    clock: &WallClock,
) -> Vec<u8> {
    batch::encode(shard, pos, seq_probe, routed_at, messages, clock)
}

/// The routes' index a parked `Publish` frame was routed under (0: unknown, as old as any).
pub(crate) fn frame_routed_at(frame: &[u8]) -> u64 {
    batch::routed_at(frame)
}

/// A `Publish` frame sent again at another place in its link (`pos`), as a first send, in
/// this build's layout; `None` when it is not one this build reads.
pub(crate) fn reposition(frame: &[u8], pos: LinkPos, clock: &WallClock) -> Option<Vec<u8>> {
    if let Some(again) = batch::reposition(frame, pos) {
        return Some(again);
    }
    match decode(frame, clock).ok()? {
        Wire::Publish(b) => {
            let it = b.messages.iter().map(|(m, g)| (m, g.as_ref()));
            Some(encode_publish(
                b.shard,
                pos,
                (b.seq, false),
                b.routed_at,
                it,
                clock,
            ))
        }
        _ => None,
    }
}

/// A frame back; a `Publish` frame's messages timed and expiring on `clock`.
pub(crate) fn decode(frame: &[u8], clock: &WallClock) -> Result<Frame, FrameError> {
    let v = *frame.first().ok_or(FrameError::Empty)?;
    if v == batch::PUBLISH_V5 || v == batch::PUBLISH_V4 {
        let (shard, pos, seq, probe, routed_at, messages) = batch::decode(frame, clock)?;
        return Ok(Wire::Publish(Batch {
            shard,
            pos,
            seq,
            probe,
            routed_at,
            messages,
        }));
    }
    if v != FRAME_V3 {
        return Err(FrameError::Version(v));
    }
    let wire: Wire<BatchV3> =
        postcard::from_bytes(&frame[1..]).map_err(|e| FrameError::Body(e.to_string()))?;
    Ok(wire.map_batch(|b| Batch {
        shard: b.shard,
        pos: b.pos,
        seq: b.seq,
        probe: b.probe,
        routed_at: 0,
        messages: messages(b.messages, b.groups, clock),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use starling_codec::{Properties, QoS};
    use std::time::{Duration, SystemTime};

    fn message(i: u8, qos: QoS, now: starling_session::Instant) -> Arc<Message> {
        Arc::new(Message {
            topic: Arc::from(format!("t/{i}")),
            payload: Bytes::from(vec![i; 3]),
            qos,
            retain: i.is_multiple_of(2),
            properties: Properties::default(),
            expires_at: (i == 1)
                .then(|| starling_session::Expiry::announced(now + Duration::from_secs(30))),
            publisher: Some(Arc::from("pub")),
            shared_headers: Default::default(),
            received_at: None,
        })
    }

    /// A batch parked by a build that wrote version 3 goes again, in this build's layout,
    /// with its messages, groups and expiry; the other frames read back.
    #[test]
    fn a_version_3_batch_is_read_and_sent_again_as_version_5() {
        let now = starling_rt::time::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let clock = WallClock { now, wall };
        let batch = [
            message(0, QoS::AtMostOnce, now),
            message(1, QoS::AtLeastOnce, now),
            message(2, QoS::ExactlyOnce, now),
        ];
        let shared = SharedTo {
            group: Arc::from("g"),
            filter: Arc::from("t/+"),
        };
        let groups = [None, Some(&shared), None];
        let old = frame_bytes(&Wire::Publish(BatchV3 {
            shard: 3,
            pos: LinkPos {
                inc: 99,
                base: 15,
                top: 18,
            },
            seq: 17,
            probe: true,
            messages: batch.iter().map(|m| m.to_state(now, wall)).collect(),
            groups: groups
                .iter()
                .map(|g| g.map(|g| (g.group.to_string(), g.filter.to_string())))
                .collect(),
        }));
        assert_eq!(old[0], FRAME_V3);
        let pos = LinkPos {
            inc: 99,
            base: 17,
            top: 17,
        };
        let again = reposition(&old, pos, &clock).unwrap();
        assert_eq!(again[0], batch::PUBLISH_V5);
        // Read 10 s later on a node whose clock agrees: 20 s of expiry left.
        let later = now + Duration::from_secs(10);
        let there = WallClock {
            now: later,
            wall: wall + Duration::from_secs(10),
        };
        let Frame::Publish(Batch {
            shard: 3,
            pos: back_pos,
            seq: 17,
            probe: false,
            routed_at: 0,
            messages: back,
        }) = decode(&again, &there).unwrap()
        else {
            panic!("a publish frame of shard 3, batch 17");
        };
        assert_eq!(back_pos, pos);
        assert_eq!(
            back.iter().map(|(_, g)| g.clone()).collect::<Vec<_>>(),
            vec![None, Some(shared), None]
        );
        assert_eq!(back.len(), 3);
        for (a, (b, _)) in batch.iter().zip(&back) {
            assert_eq!(
                (&a.topic, &a.payload, a.qos, a.retain),
                (&b.topic, &b.payload, b.qos, b.retain)
            );
            assert_eq!(b.publisher.as_deref(), Some("pub"));
            assert_eq!(b.received_at, Some(later));
        }
        let left = back[1]
            .0
            .expires_at
            .unwrap()
            .at
            .saturating_duration_since(later);
        assert_eq!(left, Duration::from_secs(20));
        assert!(back[0].0.expires_at.is_none());
        assert!(matches!(
            decode(&encode_ack(2, 99, 9), &clock),
            Ok(Frame::Ack {
                shard: 2,
                inc: 99,
                seq: 9
            })
        ));
        assert!(matches!(
            decode(&encode_resend(2, 99, 7), &clock),
            Ok(Frame::Resend {
                shard: 2,
                inc: 99,
                from: 7
            })
        ));
        assert!(matches!(
            decode(&encode_not_durable(2, 99, 9), &clock),
            Ok(Frame::NotDurable {
                shard: 2,
                inc: 99,
                seq: 9
            })
        ));
        // The variant after the others (postcard writes its index): a build that knows
        // the others reads them as before.
        assert_eq!(encode_not_durable(2, 99, 9), [FRAME_V3, 6, 2, 99, 9]);
        assert_eq!(encode_through(100), [FRAME_V3, 7, 100]);
        assert!(matches!(
            decode(&encode_through(1 << 40), &clock),
            Ok(Frame::Through { at }) if at == 1 << 40
        ));
        assert!(matches!(decode(&[], &clock), Err(FrameError::Empty)));
        assert!(matches!(
            decode(&[9, 1], &clock),
            Err(FrameError::Version(9))
        ));
        assert!(matches!(
            decode(&[2, 0], &clock),
            Err(FrameError::Version(2))
        ));
        assert!(matches!(
            decode(&[3, 0xff, 0xff], &clock),
            Err(FrameError::Body(_))
        ));
        assert!(matches!(decode(&[4, 0], &clock), Err(FrameError::Body(_))));
    }

    /// A session's part is written as before its bytes became `Bytes` (postcard writes a
    /// `Vec<u8>` and a byte string alike), so a node of either build reads the other's.
    #[test]
    fn a_session_part_keeps_its_layout() {
        #[derive(Serialize)]
        enum Before {
            _Publish(()),
            _Ack,
            _Resend,
            _Session,
            SessionPart {
                client_id: String,
                epoch: u64,
                index: u32,
                total: u32,
                bytes: Vec<u8>,
            },
        }
        let bytes: Vec<u8> = (0..=255).cycle().take(1000).collect();
        let before = postcard::to_extend(
            &Before::SessionPart {
                client_id: "c".into(),
                epoch: 7,
                index: 1,
                total: 3,
                bytes: bytes.clone(),
            },
            vec![FRAME_V3],
        )
        .unwrap();
        let now = frame_bytes(&Wire::SessionPart {
            client_id: "c".into(),
            epoch: 7,
            index: 1,
            total: 3,
            bytes: Bytes::from(bytes.clone()),
        });
        assert_eq!(before, now);
        let clock = WallClock {
            now: starling_rt::time::now(),
            wall: SystemTime::UNIX_EPOCH,
        };
        let Ok(Frame::SessionPart {
            epoch: 7,
            index: 1,
            total: 3,
            bytes: back,
            ..
        }) = decode(&before, &clock)
        else {
            panic!("a session part");
        };
        assert_eq!(back, bytes);
    }
}
