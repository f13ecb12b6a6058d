//! The `Publish` frame's own layout (version 5), written straight from the shard's
//! messages and read straight into the receiver's: postcard through `MessageState` cost
//! each side of a cross-node delivery about a tenth of its node's CPU (a `String` per
//! topic and publisher, a buffer per property list, the frame copied once more behind its
//! version byte).
//!
//! ```text
//! 0       version (5)
//! 1..3    sending shard, u16 LE
//! 3..27   link position: incarnation, base, top, u64 LE each
//! 27..35  batch number, u64 LE
//! 35      probe (0 or 1)
//! 36..44  routed at: the log index of the routes its messages were routed under, u64 LE
//! 44..48  message count, u32 LE
//! then per message:
//!   flags: QoS (bits 0-1), RETAIN (2), expiry (3), announced (4), publisher (5),
//!          group (6), properties (7)
//!   topic, payload: varint length + bytes
//!   properties: varint length + the MQTT 5 PUBLISH property list (its own length first)
//!   expiry: u64 LE nanoseconds since the Unix epoch (wall clock)
//!   publisher: varint length + bytes
//!   group: name, then filter, each varint length + bytes; an empty name (MQTT allows
//!          none) marks a message relayed to one moving session, its client id in the
//!          filter's place (`routing::moving`)
//! ```
//!
//! Version 4 was the same without "routed at" (its count at 36..40): it is still read, as
//! routed at 0, and goes out again as version 5.
//!
//! The header has a fixed size, so a parked batch goes again at another place of its link
//! by rewriting the header alone ([`reposition`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use starling_codec::{PacketType, PropertyPlace, QoS};
use starling_session::{Expiry, Message, WallClock};

use super::{FrameError, LinkPos};
use crate::msg::SharedTo;

pub(super) const PUBLISH_V5: u8 = 5;
pub(super) const PUBLISH_V4: u8 = 4;
const HEADER: usize = 48;
const HEADER_V4: usize = 40;
const PLACE: PropertyPlace = PropertyPlace::Packet(PacketType::Publish);

const RETAIN: u8 = 1 << 2;
const EXPIRY: u8 = 1 << 3;
const ANNOUNCED: u8 = 1 << 4;
const PUBLISHER: u8 = 1 << 5;
const GROUP: u8 = 1 << 6;
const PROPERTIES: u8 = 1 << 7;

/// A decoded `Publish` frame: shard, position, batch number, probe, routed at, messages in
/// order.
pub(super) type Decoded = (
    u16,
    LinkPos,
    u64,
    bool,
    u64,
    Vec<(Arc<Message>, Option<SharedTo>)>,
);

/// `shard`'s batch `seq` holding `messages` in order, routed under the routes of log index
/// `routed_at`.
pub(super) fn encode<'a>(
    shard: u16,
    pos: LinkPos,
    (seq, probe): (u64, bool),
    routed_at: u64,
    messages: impl Iterator<Item = (&'a Arc<Message>, Option<&'a SharedTo>)>,
    clock: &WallClock,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.resize(HEADER, 0);
    header(&mut out, shard, pos, seq, probe, routed_at);
    let mut count: u32 = 0;
    let mut props = BytesMut::new();
    for (m, g) in messages {
        count += 1;
        let expiry = m
            .expires_at
            .and_then(|e| Some((clock.to_wall(e.at)?, e.announced)));
        props.clear();
        if !m.properties.is_empty() {
            // The router only forwards what a PUBLISH could carry: it encodes.
            if let Err(e) = starling_codec::encode_properties(&m.properties, PLACE, &mut props) {
                tracing::warn!(topic = %m.topic, error = %e, "forwarded without its properties");
                props.clear();
            }
        }
        let mut flags = m.qos.as_u8();
        flags |= if m.retain { RETAIN } else { 0 };
        if let Some((_, announced)) = expiry {
            flags |= EXPIRY | if announced { ANNOUNCED } else { 0 };
        }
        flags |= if m.publisher.is_some() { PUBLISHER } else { 0 };
        flags |= if g.is_some() { GROUP } else { 0 };
        flags |= if props.is_empty() { 0 } else { PROPERTIES };
        out.push(flags);
        put_bytes(&mut out, m.topic.as_bytes());
        put_bytes(&mut out, &m.payload);
        if !props.is_empty() {
            put_bytes(&mut out, &props);
        }
        if let Some((at, _)) = expiry {
            out.extend_from_slice(&nanos(at).to_le_bytes());
        }
        if let Some(p) = &m.publisher {
            put_bytes(&mut out, p.as_bytes());
        }
        if let Some(g) = g {
            put_bytes(&mut out, g.group.as_bytes());
            put_bytes(&mut out, g.filter.as_bytes());
        }
    }
    out[44..48].copy_from_slice(&count.to_le_bytes());
    out
}

/// The frame back; each message timed from `clock.now` (the publisher's node read it on
/// another clock), its expiry moved to this node's monotonic clock.
pub(super) fn decode(frame: &[u8], clock: &WallClock) -> Result<Decoded, FrameError> {
    let mut r = Reader(frame);
    let version = r.u8()?;
    if version != PUBLISH_V5 && version != PUBLISH_V4 {
        return Err(FrameError::Version(version));
    }
    let shard = u16::from_le_bytes(r.array()?);
    let pos = LinkPos {
        inc: r.u64()?,
        base: r.u64()?,
        top: r.u64()?,
    };
    let seq = r.u64()?;
    let probe = match r.u8()? {
        0 => false,
        1 => true,
        b => return Err(bad(format_args!("probe byte {b}"))),
    };
    let routed_at = if version == PUBLISH_V5 { r.u64()? } else { 0 };
    let count = u32::from_le_bytes(r.array()?) as usize;
    // A message takes at least three bytes: never trust the count for more room.
    let mut messages = Vec::with_capacity(count.min(r.0.len() / 3));
    for _ in 0..count {
        let flags = r.u8()?;
        let qos = QoS::from_u8(flags & 3).ok_or_else(|| bad(format_args!("QoS 3")))?;
        let topic: Arc<str> = Arc::from(r.str()?);
        let payload = Bytes::copy_from_slice(r.bytes()?);
        let properties = if flags & PROPERTIES != 0 {
            starling_codec::decode_properties(Bytes::copy_from_slice(r.bytes()?), PLACE)
                .map_err(|e| bad(format_args!("properties: {e}")))?
        } else {
            Default::default()
        };
        let expires_at = if flags & EXPIRY != 0 {
            let at = UNIX_EPOCH + Duration::from_nanos(r.u64()?);
            clock.to_instant(at).map(|at| Expiry {
                at,
                announced: flags & ANNOUNCED != 0,
            })
        } else {
            None
        };
        let publisher = (flags & PUBLISHER != 0)
            .then(|| r.str().map(Arc::from))
            .transpose()?;
        let group = if flags & GROUP != 0 {
            let group = Arc::from(r.str()?);
            let filter = Arc::from(r.str()?);
            Some(SharedTo { group, filter })
        } else {
            None
        };
        // Into its `Arc` here, read: a `Message` is over 500 bytes, and its moves on the way
        // to the shards were copies (6.7 % of a receiving node's CPU in pinned pairs).
        let m = Message {
            topic,
            payload,
            qos,
            retain: flags & RETAIN != 0,
            properties,
            expires_at,
            publisher,
            shared_headers: Default::default(),
            received_at: Some(clock.now),
        };
        messages.push((Arc::new(m), group));
    }
    if !r.0.is_empty() {
        return Err(bad(format_args!(
            "{} bytes past the last message",
            r.0.len()
        )));
    }
    Ok((shard, pos, seq, probe, routed_at, messages))
}

/// The same batch as a first send at `pos` of its link (a version 4 one as version 5,
/// routed at 0).
pub(super) fn reposition(frame: &[u8], pos: LinkPos) -> Option<Vec<u8>> {
    let (routed_at, count, body) = match *frame.first()? {
        PUBLISH_V5 if frame.len() >= HEADER => (
            u64::from_le_bytes(frame[36..44].try_into().ok()?),
            &frame[44..48],
            &frame[HEADER..],
        ),
        PUBLISH_V4 if frame.len() >= HEADER_V4 => (0, &frame[36..40], &frame[HEADER_V4..]),
        _ => return None,
    };
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.resize(HEADER, 0);
    out[44..48].copy_from_slice(count);
    out.extend_from_slice(body);
    let shard = u16::from_le_bytes([frame[1], frame[2]]);
    let seq = u64::from_le_bytes(frame[27..35].try_into().ok()?);
    header(&mut out, shard, pos, seq, false, routed_at);
    Some(out)
}

/// The routes' index a `Publish` frame's messages were routed under: 0 (before any)
/// for a frame of another layout, or of an earlier version.
pub(super) fn routed_at(frame: &[u8]) -> u64 {
    match frame.first() {
        Some(&PUBLISH_V5) if frame.len() >= HEADER => {
            u64::from_le_bytes(frame[36..44].try_into().unwrap_or_default())
        }
        _ => 0,
    }
}

fn header(out: &mut [u8], shard: u16, pos: LinkPos, seq: u64, probe: bool, routed_at: u64) {
    out[0] = PUBLISH_V5;
    out[1..3].copy_from_slice(&shard.to_le_bytes());
    out[3..11].copy_from_slice(&pos.inc.to_le_bytes());
    out[11..19].copy_from_slice(&pos.base.to_le_bytes());
    out[19..27].copy_from_slice(&pos.top.to_le_bytes());
    out[27..35].copy_from_slice(&seq.to_le_bytes());
    out[35] = u8::from(probe);
    out[36..44].copy_from_slice(&routed_at.to_le_bytes());
}

/// Nanoseconds since the epoch: one before it is the epoch, long past either way; one
/// past 2554 saturates (an expiry is at most 2^32 s from its publish).
fn nanos(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    let mut n = b.len() as u64;
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out.extend_from_slice(b);
}

fn bad(what: std::fmt::Arguments<'_>) -> FrameError {
    FrameError::Body(what.to_string())
}

/// Reads a frame front to back; every read checks the length left.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.0.len() < n {
            return Err(bad(format_args!(
                "cut short: {n} bytes wanted, {} left",
                self.0.len()
            )));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], FrameError> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn bytes(&mut self) -> Result<&'a [u8], FrameError> {
        let mut n: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return self.take(usize::try_from(n).unwrap_or(usize::MAX));
            }
        }
        Err(bad(format_args!("a length of more than ten bytes")))
    }

    fn str(&mut self) -> Result<&'a str, FrameError> {
        std::str::from_utf8(self.bytes()?).map_err(|e| bad(format_args!("{e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use starling_codec::Properties;

    /// One reading for the whole test: the generated expiries are relative to it.
    fn clock() -> WallClock {
        static CLOCK: std::sync::OnceLock<WallClock> = std::sync::OnceLock::new();
        *CLOCK.get_or_init(|| WallClock {
            now: starling_rt::time::now(),
            wall: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        })
    }

    prop_compose! {
        fn message()(
            topic in "[a-z/]{1,12}",
            payload in proptest::collection::vec(any::<u8>(), 0..40),
            qos in 0u8..3,
            retain in any::<bool>(),
            expiry in proptest::option::of((0u64..10_000_000_000, any::<bool>())),
            publisher in proptest::option::of("[a-z0-9]{0,8}"),
            content_type in proptest::option::of("[a-z/]{0,8}"),
            user in proptest::collection::vec(("[a-z]{0,4}", "[a-z]{0,4}"), 0..3),
            group in proptest::option::of(("[a-z]{1,4}", "[a-z/+#]{1,6}")),
        ) -> (Message, Option<SharedTo>, Option<u64>) {
            let c = clock();
            let properties = Properties {
                content_type,
                user_properties: user,
                ..Properties::default()
            };
            let m = Message {
                topic: Arc::from(topic),
                payload: Bytes::from(payload),
                qos: QoS::from_u8(qos).unwrap(),
                retain,
                properties,
                expires_at: expiry.map(|(ns, announced)| Expiry {
                    at: c.now + Duration::from_nanos(ns),
                    announced,
                }),
                publisher: publisher.map(Arc::from),
                shared_headers: Default::default(),
                received_at: None,
            };
            let g = group.map(|(g, f)| SharedTo { group: Arc::from(g), filter: Arc::from(f) });
            (m, g, expiry.map(|(ns, _)| ns))
        }
    }

    proptest! {
        /// Whatever a shard batches comes back whole, in order, under its header; the
        /// expiry keeps what was left of it to the nanosecond on a clock that agrees.
        #[test]
        fn a_batch_comes_back_as_it_was_sent(
            batch in proptest::collection::vec(message(), 0..20),
            shard in any::<u16>(),
            (inc, base, top, seq) in (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
            probe in any::<bool>(),
            routed_at in any::<u64>(),
            later_ms in 0u64..5_000,
        ) {
            let c = clock();
            let pos = LinkPos { inc, base, top };
            let sent: Vec<(Arc<Message>, Option<SharedTo>)> =
                batch.iter().map(|(m, g, _)| (Arc::new(m.clone()), g.clone())).collect();
            let frame = encode(
                shard,
                pos,
                (seq, probe),
                routed_at,
                sent.iter().map(|(m, g)| (m, g.as_ref())),
                &c,
            );
            let later = Duration::from_millis(later_ms);
            let there = WallClock { now: c.now + later, wall: c.wall + later };
            let (s, p, q, pr, at, back) = decode(&frame, &there).unwrap();
            prop_assert_eq!((s, p, q, pr, at), (shard, pos, seq, probe, routed_at));
            prop_assert_eq!(super::routed_at(&frame), routed_at);
            prop_assert_eq!(back.len(), batch.len());
            for ((m, g), (orig, og, ns)) in back.iter().zip(&batch) {
                prop_assert_eq!(&m.topic, &orig.topic);
                prop_assert_eq!(&m.payload, &orig.payload);
                prop_assert_eq!((m.qos, m.retain), (orig.qos, orig.retain));
                prop_assert_eq!(&m.properties, &orig.properties);
                prop_assert_eq!(&m.publisher, &orig.publisher);
                prop_assert_eq!(g, og);
                prop_assert_eq!(m.received_at, Some(there.now));
                match (m.expires_at, orig.expires_at, ns) {
                    (None, None, None) => {}
                    (Some(e), Some(o), Some(ns)) => {
                        prop_assert_eq!(e.announced, o.announced);
                        prop_assert_eq!(e.at, there.now - later + Duration::from_nanos(*ns));
                    }
                    other => prop_assert!(false, "expiry {:?}", other),
                }
            }
            // Sent again elsewhere in its link: only the header moves.
            let moved = LinkPos { inc, base: base ^ 1, top: top ^ 2 };
            let again = reposition(&frame, moved).unwrap();
            let (s, p, q, pr, at, back2) = decode(&again, &there).unwrap();
            prop_assert_eq!((s, p, q, pr, at), (shard, moved, seq, false, routed_at));
            prop_assert_eq!(back2.len(), back.len());
            prop_assert_eq!(&again[HEADER..], &frame[HEADER..]);
            // A version 4 frame of the same batch (no routes' index) is read as routed at
            // 0, and goes again as version 5.
            let mut v4 = frame[..HEADER_V4].to_vec();
            v4[0] = PUBLISH_V4;
            v4[36..40].copy_from_slice(&frame[44..48]);
            v4.extend_from_slice(&frame[HEADER..]);
            let (s, p, q, pr, at, back4) = decode(&v4, &there).unwrap();
            prop_assert_eq!((s, p, q, pr, at), (shard, pos, seq, probe, 0));
            prop_assert_eq!(back4.len(), back.len());
            let again4 = reposition(&v4, moved).unwrap();
            prop_assert_eq!(again4[0], PUBLISH_V5);
            let (_, p, _, _, at, _) = decode(&again4, &there).unwrap();
            prop_assert_eq!((p, at), (moved, 0));
            prop_assert_eq!(&again4[HEADER..], &frame[HEADER..]);
        }

        /// A frame cut anywhere, or with bytes flipped, is refused or read; never a panic.
        #[test]
        fn a_damaged_frame_is_refused_without_a_panic(
            batch in proptest::collection::vec(message(), 1..5),
            cut in any::<proptest::sample::Index>(),
            flips in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 0..4),
        ) {
            let c = clock();
            let sent: Vec<(Arc<Message>, Option<SharedTo>)> =
                batch.iter().map(|(m, g, _)| (Arc::new(m.clone()), g.clone())).collect();
            let mut frame = encode(1, LinkPos { inc: 1, base: 1, top: 1 }, (1, false), 7,
                sent.iter().map(|(m, g)| (m, g.as_ref())), &c);
            let short = &frame[..cut.index(frame.len())];
            prop_assert!(decode(short, &c).is_err());
            for (at, b) in flips {
                let i = at.index(frame.len() - 1) + 1;
                frame[i] ^= b;
            }
            let _ = decode(&frame, &c);
        }
    }

    #[test]
    fn a_count_past_the_frame_is_refused_without_its_room() {
        let c = clock();
        let mut frame = encode(
            0,
            LinkPos {
                inc: 0,
                base: 0,
                top: 0,
            },
            (0, false),
            0,
            std::iter::empty(),
            &c,
        );
        frame[44..48].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode(&frame, &c), Err(FrameError::Body(_))));
        assert!(reposition(
            &frame[..10],
            LinkPos {
                inc: 0,
                base: 0,
                top: 0
            }
        )
        .is_none());
    }
}
