//! Behaviour of one session, driven by hand: packets in, effects out, time
//! jumped to the next deadline.

use std::num::NonZeroU16;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use starling_codec::{
    decode, Connect, Disconnect, LastWill, Packet, PacketId, PayloadFormat, Properties, Protocol,
    PubAck, Publish, QoS, ReasonCode, RetainHandling, Subscribe, SubscribeFilter,
    SubscriptionOptions, Unsubscribe,
};

use crate::*;

mod connect;
mod delivery;
mod inbound;
mod issue10;
mod lifecycle;
mod load;
mod operator;
mod outbound;
mod snapshot;

fn pid(n: u16) -> PacketId {
    NonZeroU16::new(n).expect("test ids are non-zero")
}

fn connect(protocol: Protocol, client_id: &str, clean_start: bool) -> Connect {
    Connect {
        protocol,
        clean_start,
        keep_alive: 60,
        client_id: client_id.to_string(),
        will: None,
        username: None,
        password: None,
        properties: Properties::default(),
    }
}

/// An MQTT 5 CONNECT with a session that outlives the connection.
fn v5_persistent(client_id: &str) -> Connect {
    let mut c = connect(Protocol::V5, client_id, false);
    c.properties.session_expiry_interval = Some(3600);
    c
}

fn msg(topic: &str, qos: QoS, payload: &'static [u8]) -> Arc<Message> {
    Arc::new(Message {
        topic: Arc::from(topic),
        payload: Bytes::from_static(payload),
        qos,
        retain: false,
        properties: Properties::default(),
        expires_at: None,
        publisher: Some(Arc::from("publisher")),
        shared_headers: Default::default(),
        received_at: None,
    })
}

fn sub(qos: QoS) -> DeliveryOptions {
    DeliveryOptions {
        qos,
        ..DeliveryOptions::default()
    }
}

fn publish(topic: &str, qos: QoS, id: Option<u16>, payload: &'static [u8]) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.to_string(),
        packet_id: id.map(pid),
        properties: Properties::default(),
        payload: Bytes::from_static(payload),
    })
}

struct H {
    s: Session,
    now: Instant,
}

impl H {
    fn new(limits: SessionLimits) -> Self {
        Self {
            s: Session::new(Arc::from("c1"), limits),
            now: base_instant(),
        }
    }

    fn attached(limits: SessionLimits, c: &Connect) -> Self {
        let mut h = Self::new(limits);
        h.s.attach(h.now, c).expect("attach");
        h.drain();
        h
    }

    fn drain(&mut self) -> Vec<Effect> {
        std::iter::from_fn(|| self.s.poll_effect()).collect()
    }

    fn packet(&mut self, p: Packet) -> Result<(), SessionError> {
        self.s.handle_packet(self.now, p, &mut AllowAll)
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.s.handle_timeout(self.now);
    }
}

fn sent(effects: &[Effect]) -> Vec<&Packet> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send(p) => Some(p),
            _ => None,
        })
        .collect()
}

fn published(effects: &[Effect]) -> Vec<&OutgoingPublish> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::SendPublish(p) => Some(p),
            _ => None,
        })
        .collect()
}

fn routed(effects: &[Effect]) -> Vec<&Arc<Message>> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Publish(m) => Some(m),
            _ => None,
        })
        .collect()
}

fn drops(effects: &[Effect]) -> Vec<DropReason> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Dropped { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}

fn wills(effects: &[Effect]) -> Vec<&Arc<Message>> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Will(m) => Some(m),
            _ => None,
        })
        .collect()
}

/// The PUBLISH as the client decodes it.
fn wire(out: &OutgoingPublish, protocol: Protocol) -> Publish {
    let mut buf = BytesMut::from(&out.header[..]);
    buf.extend_from_slice(&out.msg.payload);
    match decode(&mut buf, protocol, u32::MAX) {
        Ok(Some(Packet::Publish(p))) => p,
        other => panic!("not a PUBLISH: {other:?}"),
    }
}

fn connack(effects: &[Effect]) -> &starling_codec::Connack {
    match effects.first() {
        Some(Effect::Send(Packet::Connack(c))) => c,
        other => panic!("first effect is not a CONNACK: {other:?}"),
    }
}

fn closed(effects: &[Effect]) -> Option<Option<ReasonCode>> {
    effects.iter().find_map(|e| match e {
        Effect::Close(c) => Some(*c),
        _ => None,
    })
}

struct DenyAll;
impl Gate for DenyAll {
    fn allow_publish(&mut self, _: &str, _: QoS, _: bool) -> bool {
        false
    }
    fn allow_subscribe(&mut self, _: &str, _: QoS) -> bool {
        false
    }
}

fn subscribe(id: u16, filters: &[(&str, QoS)]) -> Subscribe {
    Subscribe {
        packet_id: pid(id),
        filters: filters
            .iter()
            .map(|(f, q)| SubscribeFilter {
                filter: f.to_string(),
                options: SubscriptionOptions {
                    qos: *q,
                    ..SubscriptionOptions::default()
                },
            })
            .collect(),
        properties: Properties::default(),
    }
}

fn with_will(mut c: Connect, delay: Option<u32>) -> Connect {
    let properties = Properties {
        will_delay_interval: delay,
        ..Properties::default()
    };
    c.will = Some(LastWill {
        topic: "will/c1".into(),
        payload: Bytes::from_static(b"gone"),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties,
    });
    c
}

/// Where a test's time starts: any instant will do, the test moves time itself.
#[allow(clippy::disallowed_methods)] // no clock is read again: time only advances by hand
fn base_instant() -> std::time::Instant {
    std::time::Instant::now()
}
