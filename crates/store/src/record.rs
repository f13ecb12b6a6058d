//! The values the tables hold, and their encoding: one layout version byte, then postcard.

use std::time::SystemTime;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use starling_codec::PacketId;
use starling_session::state::{
    DeliveryState, DetachedState, InflightPhase, InflightState, MessageState,
    PendingSubscribeState, PendingUnsubscribeState, SessionState, SubscriptionState, WillState,
};

use crate::error::DecodeProblem;

/// The first byte of every encoded value; a reader refuses any other it does not know.
/// Bump it when a value type changes shape (postcard is not self-describing: an added field
/// shifts every byte after it).
///
/// 2: [`SessionMeta::unheard`]. Values of layout 1 are read too: only the meta changed
/// shape, and [`decode_meta`] reads a layout 1 meta as one without that field.
pub const VALUE_VERSION: u8 = 2;
/// The layout before [`SessionMeta::unheard`].
const VALUE_VERSION_1: u8 = 1;

/// A stored session without its deliveries and inbound packet identifiers, which have
/// tables of their own so that a delivery changes one small record and never rewrites the
/// session.
///
/// The store's own type rather than [`SessionState`] with empty vectors: the store fixes
/// its bytes, so a field added to the session's state fails to compile in
/// [`SessionParts::split`] and [`SessionParts::join`] instead of silently changing the
/// on-disk layout under an unchanged [`VALUE_VERSION`]; and a meta record cannot carry a
/// delivery by mistake. Only sessions that outlive their connection are stored, so the
/// detached part is not optional here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionMeta {
    /// [`SessionState::version`] as the session gave it; restore checks it.
    pub state_version: u32,
    /// [`SessionState::next_packet_id`].
    pub next_packet_id: PacketId,
    /// [`DetachedState::expiry_interval_secs`].
    pub expiry_interval_secs: u32,
    /// [`DetachedState::expires_at`].
    pub expires_at: Option<SystemTime>,
    /// [`DetachedState::will`], with its due time.
    pub will: Option<WillState>,
    /// [`DetachedState::subscriptions`], with options and identifiers.
    pub subscriptions: Vec<SubscriptionState>,
    /// [`DetachedState::pending_subscribes`].
    pub pending_subscribes: Vec<PendingSubscribeState>,
    /// [`DetachedState::pending_unsubscribes`].
    pub pending_unsubscribes: Vec<PendingUnsubscribeState>,
    /// The username the session belongs to (the broker lets only it resume the session).
    pub owner: Option<String>,
    /// Written while a connection was attached: a crash cut that connection, so on
    /// recovery its session expiry and will delay run from the restart.
    pub connected: bool,
    /// [`DetachedState::unheard`]: its client was last told it had no session, and has
    /// said nothing since. Layout 2; a layout 1 meta reads as `false`.
    pub unheard: bool,
}

/// [`SessionMeta`] as layout 1 wrote it: the same fields, without `unheard`.
#[derive(Deserialize)]
struct SessionMetaV1 {
    state_version: u32,
    next_packet_id: PacketId,
    expiry_interval_secs: u32,
    expires_at: Option<SystemTime>,
    will: Option<WillState>,
    subscriptions: Vec<SubscriptionState>,
    pending_subscribes: Vec<PendingSubscribeState>,
    pending_unsubscribes: Vec<PendingUnsubscribeState>,
    owner: Option<String>,
    connected: bool,
}

impl From<SessionMetaV1> for SessionMeta {
    fn from(v: SessionMetaV1) -> Self {
        SessionMeta {
            state_version: v.state_version,
            next_packet_id: v.next_packet_id,
            expiry_interval_secs: v.expiry_interval_secs,
            expires_at: v.expires_at,
            will: v.will,
            subscriptions: v.subscriptions,
            pending_subscribes: v.pending_subscribes,
            pending_unsubscribes: v.pending_unsubscribes,
            owner: v.owner,
            connected: v.connected,
            // Layout 1 did not keep it: such a session was restored as heard from, as
            // before.
            unheard: false,
        }
    }
}

/// A [`SessionState`] taken apart into the records the store keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionParts {
    pub client_id: String,
    pub meta: SessionMeta,
    /// In the order they were first sent.
    pub inflight: Vec<InflightState>,
    /// Oldest first.
    pub queue: Vec<DeliveryState>,
    pub inbound_qos2: Vec<PacketId>,
}

impl SessionParts {
    /// Takes a session's state apart; `None` when it has no detached state, which is
    /// nothing to store (drop the session instead). The meta's `owner` and `connected` are
    /// not part of a session's state: set them after.
    pub fn split(state: SessionState) -> Option<SessionParts> {
        let SessionState {
            version,
            client_id,
            next_packet_id,
            detached,
        } = state;
        let DetachedState {
            expiry_interval_secs,
            expires_at,
            will,
            subscriptions,
            inflight,
            queue,
            inbound_qos2,
            pending_subscribes,
            pending_unsubscribes,
            unheard,
        } = detached?;
        let meta = SessionMeta {
            state_version: version,
            next_packet_id,
            expiry_interval_secs,
            expires_at,
            will,
            subscriptions,
            pending_subscribes,
            pending_unsubscribes,
            owner: None,
            connected: false,
            unheard,
        };
        Some(SessionParts {
            client_id,
            meta,
            inflight,
            queue,
            inbound_qos2,
        })
    }

    /// Puts a session's state back together (`owner` and `connected` stay in the meta).
    pub fn join(self) -> SessionState {
        let SessionParts {
            client_id,
            meta,
            inflight,
            queue,
            inbound_qos2,
        } = self;
        let SessionMeta {
            state_version,
            next_packet_id,
            expiry_interval_secs,
            expires_at,
            will,
            subscriptions,
            pending_subscribes,
            pending_unsubscribes,
            owner: _,
            connected: _,
            unheard,
        } = meta;
        SessionState {
            version: state_version,
            client_id,
            next_packet_id,
            detached: Some(DetachedState {
                expiry_interval_secs,
                expires_at,
                will,
                subscriptions,
                inflight,
                queue,
                inbound_qos2,
                pending_subscribes,
                pending_unsubscribes,
                unheard,
            }),
        }
    }
}

/// One outbound delivery of a session, queued or in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredDelivery {
    pub stage: DeliveryStage,
    pub delivery: DeliveryState,
}

/// Where a stored delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryStage {
    /// Waiting for the window or for a connection.
    Queued,
    /// Sent with this packet identifier, awaiting acknowledgement in this phase.
    Inflight {
        packet_id: PacketId,
        phase: InflightPhase,
    },
}

/// A message held back until its due time, and the topic it is then published to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DelayedRecord {
    pub target: String,
    pub message: MessageState,
}

/// Encodes `value` into `buf` (cleared first), version byte first.
pub(crate) fn encode<T: Serialize>(value: &T, buf: &mut Vec<u8>) -> Result<(), postcard::Error> {
    let mut out = std::mem::take(buf);
    out.clear();
    out.push(VALUE_VERSION);
    *buf = postcard::to_extend(value, out)?;
    Ok(())
}

/// Decodes a value [`encode`] wrote, of this layout or layout 1 (the same for every type
/// but [`SessionMeta`], which [`decode_meta`] reads); anything else, trailing bytes
/// included, is an error.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeProblem> {
    let (_, body) = versioned(bytes)?;
    whole(body)
}

/// Decodes a [`SessionMeta`] of either layout.
pub(crate) fn decode_meta(bytes: &[u8]) -> Result<SessionMeta, DecodeProblem> {
    match versioned(bytes)? {
        (VALUE_VERSION_1, body) => whole::<SessionMetaV1>(body).map(SessionMeta::from),
        (_, body) => whole(body),
    }
}

fn versioned(bytes: &[u8]) -> Result<(u8, &[u8]), DecodeProblem> {
    let (&version, body) = bytes.split_first().ok_or(DecodeProblem::Empty)?;
    if version != VALUE_VERSION && version != VALUE_VERSION_1 {
        return Err(DecodeProblem::UnknownValueVersion {
            found: version,
            supported: VALUE_VERSION,
        });
    }
    Ok((version, body))
}

fn whole<T: DeserializeOwned>(body: &[u8]) -> Result<T, DecodeProblem> {
    let (value, rest) = postcard::take_from_bytes(body).map_err(DecodeProblem::Malformed)?;
    if !rest.is_empty() {
        return Err(DecodeProblem::TrailingBytes(rest.len()));
    }
    Ok(value)
}

/// Milliseconds since the Unix epoch, the delayed table's key order; times before the
/// epoch count as 0 and times past `u64::MAX` ms as that.
pub(crate) fn wall_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(crate) fn from_wall_ms(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_round_trips_behind_its_version_byte() {
        let mut buf = vec![9, 9, 9];
        encode(&(7u32, String::from("x")), &mut buf).unwrap();
        assert_eq!(buf[0], VALUE_VERSION);
        assert_eq!(decode::<(u32, String)>(&buf), Ok((7, "x".into())));
    }

    #[test]
    fn unknown_version_empty_and_trailing_bytes_are_refused() {
        assert_eq!(decode::<u8>(&[]), Err(DecodeProblem::Empty));
        assert_eq!(
            decode::<u8>(&[VALUE_VERSION + 1, 0]),
            Err(DecodeProblem::UnknownValueVersion {
                found: VALUE_VERSION + 1,
                supported: VALUE_VERSION
            })
        );
        assert_eq!(
            decode::<u8>(&[VALUE_VERSION, 1, 2]),
            Err(DecodeProblem::TrailingBytes(1))
        );
        assert!(matches!(
            decode::<String>(&[VALUE_VERSION, 5, b'a']),
            Err(DecodeProblem::Malformed(_))
        ));
    }

    fn meta(unheard: bool) -> SessionMeta {
        SessionMeta {
            state_version: 3,
            next_packet_id: PacketId::new(9).unwrap(),
            expiry_interval_secs: 60,
            expires_at: None,
            will: None,
            subscriptions: Vec::new(),
            pending_subscribes: Vec::new(),
            pending_unsubscribes: Vec::new(),
            owner: Some("u".into()),
            connected: true,
            unheard,
        }
    }

    #[test]
    fn a_meta_keeps_its_unheard_mark_and_a_layout_1_meta_reads_as_heard_from() {
        let mut buf = Vec::new();
        encode(&meta(true), &mut buf).unwrap();
        assert_eq!(decode_meta(&buf), Ok(meta(true)));
        // Layout 1 wrote the same fields in the same order, without the last one.
        let mut v1 = buf[..buf.len() - 1].to_vec();
        v1[0] = VALUE_VERSION_1;
        assert_eq!(decode_meta(&v1), Ok(meta(false)));
        // Other values did not change shape: layout 1's are read as they are.
        assert_eq!(
            decode::<(u32, bool)>(&[VALUE_VERSION_1, 7, 1]),
            Ok((7, true))
        );
        // A layout 2 meta labelled 1 is caught, not misread.
        buf[0] = VALUE_VERSION_1;
        assert_eq!(decode_meta(&buf), Err(DecodeProblem::TrailingBytes(1)));
    }

    #[test]
    fn wall_ms_saturates_before_the_epoch() {
        let before = SystemTime::UNIX_EPOCH - std::time::Duration::from_secs(1);
        assert_eq!(wall_ms(before), 0);
        assert_eq!(wall_ms(from_wall_ms(1_234)), 1_234);
    }
}
