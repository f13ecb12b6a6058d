//! Retained messages between the broker's form and the cluster state's: the cluster keeps
//! the payload, QoS and wall-clock expiry as plain fields and the rest of the message (its
//! properties, whether the expiry is announced) as opaque bytes, so that the state
//! machine needs no MQTT codec.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use starling_cluster::RetainedMsg;
use starling_codec::QoS;
use starling_session::state::MessageState;
use starling_session::{Instant, Message};

/// The cluster's form of a retained PUBLISH: `None` for one that deletes (an empty
/// payload, MQTT 3.3.1.3).
pub(crate) fn to_cluster(msg: &Message, now: Instant, wall: SystemTime) -> Option<RetainedMsg> {
    if msg.payload.is_empty() {
        return None;
    }
    let mut state = msg.to_state(now, wall);
    let payload = std::mem::take(&mut state.payload).to_vec();
    let expires_at = state.expiry.map(|e| unix_secs_ceil(e.at));
    Some(RetainedMsg {
        payload,
        qos: state.qos as u8,
        // Serializing plain data into a Vec cannot fail.
        properties: postcard::to_stdvec(&state).expect("message state serializes"),
        expires_at,
    })
}

/// The broker's form of the cluster's retained message of `topic`; `None` for bytes that
/// do not decode (written by a newer version), which are skipped rather than trusted.
pub(crate) fn from_cluster(
    topic: &str,
    m: &RetainedMsg,
    now: Instant,
    wall: SystemTime,
) -> Option<Arc<Message>> {
    let mut state: MessageState = match postcard::from_bytes(&m.properties) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(topic, error = %e, "replicated retained message not understood; skipped");
            return None;
        }
    };
    state.topic = topic.to_owned();
    state.payload = Bytes::copy_from_slice(&m.payload);
    state.qos = match m.qos {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    };
    state.retain = true;
    Some(Arc::new(Message::from_state(state, now, wall)))
}

fn unix_secs_ceil(t: SystemTime) -> u64 {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_codec::Properties;
    use std::time::Duration;

    #[test]
    fn a_retained_message_comes_back_with_its_properties_and_expiry() {
        let now = starling_rt::time::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000);
        let props = Properties {
            content_type: Some("text/plain".into()),
            ..Properties::default()
        };
        let m = Message {
            topic: Arc::from("r/1"),
            payload: Bytes::from_static(b"on"),
            qos: QoS::AtLeastOnce,
            retain: true,
            properties: props.clone(),
            expires_at: Some(starling_session::Expiry::announced(
                now + Duration::from_secs(60),
            )),
            publisher: Some(Arc::from("dev")),
            shared_headers: Default::default(),
            received_at: None,
        };
        let c = to_cluster(&m, now, wall).expect("a message to keep");
        assert_eq!((c.payload.as_slice(), c.qos), (&b"on"[..], 1));
        assert_eq!(c.expires_at, Some(2_000_060));
        // Read 10 s later on a node whose clock agrees: 50 s left.
        let later = now + Duration::from_secs(10);
        let back = from_cluster("r/1", &c, later, wall + Duration::from_secs(10)).unwrap();
        assert_eq!(
            (&*back.topic, &back.payload[..], back.qos, back.retain),
            ("r/1", &b"on"[..], QoS::AtLeastOnce, true)
        );
        assert_eq!(back.properties.content_type, props.content_type);
        let left = back.expires_at.unwrap().at.saturating_duration_since(later);
        assert_eq!(left, Duration::from_secs(50));

        let empty = Message {
            payload: Bytes::new(),
            ..m
        };
        assert!(
            to_cluster(&empty, now, wall).is_none(),
            "an empty payload deletes"
        );
        let junk = RetainedMsg {
            properties: vec![0xff; 3],
            ..c
        };
        assert!(from_cluster("r/1", &junk, now, wall).is_none());
    }
}
