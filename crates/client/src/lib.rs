//! A sans-IO MQTT client core (3.1, 3.1.1, 5.0; QoS 0/1/2) shared by the bench tool, the simulation suites, the broker tests and the bridge.
//!
//! [`ClientCore`] holds one client's protocol state: the CONNECT/CONNACK
//! handshake, packet identifiers and the in-flight window (the broker's
//! Receive Maximum in 5.0), the QoS 1 and QoS 2 flows both ways, keep-alive,
//! and resending on a resumed session (MQTT 5 §4.4). It reads no clock and
//! owns no socket: bytes and `now` go in, bytes and [`Event`]s come out, the
//! way quinn-proto's `Connection` is driven.
//!
//! ```
//! use std::time::Instant;
//! use bytes::{Bytes, BytesMut};
//! use starling_client::{ClientCore, ClientOptions, Event};
//! use starling_codec::{encode, Connack, Connect, Packet, Properties, Protocol, PubAck, QoS, ReasonCode};
//!
//! let connect = Connect {
//!     protocol: Protocol::V5, clean_start: true, keep_alive: 30, client_id: "c1".into(),
//!     will: None, username: None, password: None, properties: Properties::default(),
//! };
//! let mut client = ClientCore::new(ClientOptions::new(connect));
//! let now = Instant::now();
//! client.connect(now).unwrap();
//! let mut wire = BytesMut::new();
//! client.poll_transmit(&mut wire); // write these bytes to the broker
//!
//! // The broker's answer, as bytes read from the socket.
//! let mut read = BytesMut::new();
//! let connack = Connack { session_present: false, reason_code: ReasonCode::Success, properties: Properties::default() };
//! encode(&Packet::Connack(connack), Protocol::V5, u32::MAX, &mut read).unwrap();
//! client.handle_buf(now, &mut read).unwrap();
//! assert!(matches!(client.poll_event(), Some(Event::Connected(_))));
//!
//! let id = client.publish(now, "a/b", Bytes::from_static(b"hi"), QoS::AtLeastOnce, false, Properties::default()).unwrap();
//! encode(&Packet::Puback(PubAck::new(id.unwrap())), Protocol::V5, u32::MAX, &mut read).unwrap();
//! client.handle_buf(now, &mut read).unwrap();
//! assert!(matches!(client.poll_event(), Some(Event::Published { .. })));
//! ```
//!
//! Hot paths stay cheap: output goes into the caller's `BytesMut`
//! ([`ClientCore::poll_transmit`]), a payload can be written in place
//! ([`ClientCore::publish_with`]), input is decoded from the caller's read
//! buffer with payloads shared, not copied ([`ClientCore::handle_buf`]), and
//! packet-identifier bookkeeping is O(1) without allocation. A caller that
//! decodes itself hands PUBLISH and acknowledgements over by reference
//! ([`ClientCore::acknowledge_publish`], [`ClientCore::handle_ack`]) and so
//! skips the event queue: a `Packet` or an [`Event`] is 400 bytes, and
//! moving every message through the queue cost the load tool about a third
//! more CPU per message.
//!
//! With [`Acks::Manual`] the caller acknowledges what the broker sends and
//! sees every packet, and [`ClientCore::send_packet`] writes packets past the
//! core's bookkeeping: the mode of the broker tests and simulation suites,
//! which own the protocol state they check.

#![warn(missing_docs)]

mod core;
mod error;
mod event;
mod ids;
mod options;
#[cfg(test)]
mod tests;

pub use crate::core::ClientCore;
pub use error::Error;
pub use event::Event;
pub use options::{Acks, ClientOptions, State};
