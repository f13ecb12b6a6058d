//! The frames nodes exchange on their data streams, postcard behind a version byte:
//! - `Publish`: a batch of forwarded messages from one shard, numbered per destination node
//!   and per incarnation of the sending shard (a restarted node numbers afresh), each with
//!   the shared group the receiver was picked for (or none), each in its stored form
//!   (`MessageState`: expiry as wall-clock time, so it means the same on the receiving node
//!   as long as the nodes' clocks agree). The receiver takes a link's batches only in
//!   order, without a gap (`cluster/inlink.rs`);
//! - `Ack`: the receiver took that shard's batch `seq`, durably (one per batch, in order,
//!   so a batch before it that was not acknowledged was taken but is not durable, or its
//!   acknowledgement was lost);
//! - `Resend`: the receiver is missing the sender's batches from `from` on (lost with a
//!   replaced connection, or with the receiver's restart) and took none after them;
//! - `Session`: a session handed over to the receiver, which claimed its client id.

use std::sync::Arc;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use starling_session::state::MessageState;
use starling_session::{Instant, Message};

use crate::msg::{HandOff, SharedTo};

/// 3: batches are taken in order per sending shard's incarnation, with `Resend` (2 had
/// no incarnation; 1 no shared groups).
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

/// One frame of a data stream.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Frame {
    Publish {
        shard: u16,
        pos: LinkPos,
        seq: u64,
        /// Sent again because the receiver said nothing for a while: it answers with what
        /// it is missing up to `pos.top`.
        probe: bool,
        messages: Vec<MessageState>,
        /// One per message: the shared group (name, topic filter) the receiver was picked
        /// for, or `None` for its plain subscribers.
        groups: Vec<Option<(String, String)>>,
    },
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
    SessionPart {
        client_id: String,
        epoch: u64,
        index: u32,
        total: u32,
        bytes: Vec<u8>,
    },
}

/// The largest part of a `Session` frame cut up: half of what the data stream carries in
/// one frame, with room for the part's own fields.
pub(crate) const SESSION_PART_BYTES: usize = 8 << 20;

/// A `Session` frame.
pub(crate) fn encode_session(
    client_id: &str,
    epoch: u64,
    handoff: Option<Box<HandOff>>,
) -> Vec<u8> {
    frame_bytes(&Frame::Session {
        client_id: client_id.to_owned(),
        epoch,
        handoff,
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
            frame_bytes(&Frame::SessionPart {
                client_id: client_id.to_owned(),
                epoch,
                index: i as u32,
                total,
                bytes: bytes.to_vec(),
            })
        })
        .collect()
}

/// The messages of a `Publish` frame, in order, each with its shared group.
pub(crate) fn messages(
    states: Vec<MessageState>,
    groups: Vec<Option<(String, String)>>,
    now: Instant,
    wall: SystemTime,
) -> Vec<(Message, Option<SharedTo>)> {
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
                received_at: Some(now),
                ..Message::from_state(s, now, wall)
            };
            (m, g)
        })
        .collect()
}

fn frame_bytes(f: &Frame) -> Vec<u8> {
    let mut out = vec![FRAME_V3];
    // Serializing plain data into a Vec cannot fail.
    out.extend(postcard::to_stdvec(f).expect("frames serialize"));
    out
}

/// An acknowledgement of `shard`'s (incarnation `inc`) batch `seq`.
pub(crate) fn encode_ack(shard: u16, inc: u64, seq: u64) -> Vec<u8> {
    frame_bytes(&Frame::Ack { shard, inc, seq })
}

/// A request for `shard`'s (incarnation `inc`) batches from `from` on.
pub(crate) fn encode_resend(shard: u16, inc: u64, from: u64) -> Vec<u8> {
    frame_bytes(&Frame::Resend { shard, inc, from })
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

/// A `Publish` frame of `shard`'s batch `seq`, holding `messages` in order.
pub(crate) fn encode_publish<'a>(
    shard: u16,
    pos: LinkPos,
    (seq, probe): (u64, bool),
    messages: impl Iterator<Item = (&'a Arc<Message>, Option<&'a SharedTo>)>,
    now: Instant,
    wall: SystemTime,
) -> Vec<u8> {
    let (messages, groups) = messages
        .map(|(m, g)| {
            let g = g.map(|g| (g.group.to_string(), g.filter.to_string()));
            (m.to_state(now, wall), g)
        })
        .unzip();
    frame_bytes(&Frame::Publish {
        shard,
        pos,
        seq,
        probe,
        messages,
        groups,
    })
}

/// A `Publish` frame sent again at another place in its link (`pos`), as a first send;
/// `None` when it is not one this build reads.
pub(crate) fn reposition(frame: &[u8], pos: LinkPos) -> Option<Vec<u8>> {
    match decode(frame).ok()? {
        Frame::Publish {
            shard,
            seq,
            messages,
            groups,
            ..
        } => Some(frame_bytes(&Frame::Publish {
            shard,
            pos,
            seq,
            probe: false,
            messages,
            groups,
        })),
        _ => None,
    }
}

/// A frame back.
pub(crate) fn decode(frame: &[u8]) -> Result<Frame, FrameError> {
    let (v, body) = frame.split_first().ok_or(FrameError::Empty)?;
    if *v != FRAME_V3 {
        return Err(FrameError::Version(*v));
    }
    postcard::from_bytes(body).map_err(|e| FrameError::Body(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use starling_codec::{Properties, QoS};
    use std::time::Duration;

    #[test]
    fn a_batch_comes_back_in_order_with_its_expiry() {
        let now = starling_rt::time::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let m = |i: u8, qos| {
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
        };
        let batch = [
            m(0, QoS::AtMostOnce),
            m(1, QoS::AtLeastOnce),
            m(2, QoS::ExactlyOnce),
        ];
        let shared = SharedTo {
            group: Arc::from("g"),
            filter: Arc::from("t/+"),
        };
        let groups = [None, Some(&shared), None];
        let pos = LinkPos {
            inc: 99,
            base: 15,
            top: 18,
        };
        let frame = encode_publish(3, pos, (17, true), batch.iter().zip(groups), now, wall);
        // Decoded 10 s later on a node whose clock agrees: 20 s of expiry left.
        let later = now + Duration::from_secs(10);
        let Frame::Publish {
            shard: 3,
            pos: back_pos,
            seq: 17,
            probe: true,
            messages: states,
            groups,
        } = decode(&frame).unwrap()
        else {
            panic!("a publish frame of shard 3, batch 17");
        };
        assert_eq!(back_pos, pos);
        let back = messages(states, groups, later, wall + Duration::from_secs(10));
        assert_eq!(
            back.iter().map(|(_, g)| g.clone()).collect::<Vec<_>>(),
            vec![None, Some(shared), None]
        );
        let back: Vec<Message> = back.into_iter().map(|(m, _)| m).collect();
        assert_eq!(back.len(), 3);
        for (a, b) in batch.iter().zip(&back) {
            assert_eq!(
                (&a.topic, &a.payload, a.qos, a.retain),
                (&b.topic, &b.payload, b.qos, b.retain)
            );
            assert_eq!(b.publisher.as_deref(), Some("pub"));
        }
        let left = back[1]
            .expires_at
            .unwrap()
            .at
            .saturating_duration_since(later);
        assert_eq!(left, Duration::from_secs(20));
        assert!(back[0].expires_at.is_none());
        assert!(matches!(
            decode(&encode_ack(2, 99, 9)),
            Ok(Frame::Ack {
                shard: 2,
                inc: 99,
                seq: 9
            })
        ));
        assert!(matches!(
            decode(&encode_resend(2, 99, 7)),
            Ok(Frame::Resend {
                shard: 2,
                inc: 99,
                from: 7
            })
        ));
        assert!(matches!(decode(&[]), Err(FrameError::Empty)));
        assert!(matches!(decode(&[9, 1]), Err(FrameError::Version(9))));
        assert!(matches!(decode(&[2, 0]), Err(FrameError::Version(2))));
        assert!(matches!(decode(&[3, 0xff, 0xff]), Err(FrameError::Body(_))));
    }
}
