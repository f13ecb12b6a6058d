//! [`ClientCore`]: one MQTT client connection's protocol state, driven by
//! its caller.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use starling_codec::{
    decode, encode, encode_publish_header, Connack, Disconnect, Packet, PacketId, PacketType,
    Properties, Protocol, PubAck, Publish, PublishHeader, QoS, ReasonCode, Subscribe,
    SubscribeFilter, Unsubscribe, PACKET_SIZE_MAX,
};

use crate::ids::Ring;
use crate::options::{Acks, ClientOptions, State};
use crate::{Error, Event};

/// What an acknowledgement did to our exchange.
enum Step {
    /// It ended, with this reason code.
    Ended(ReasonCode),
    /// It goes on (PUBREL sent).
    Continued,
}

/// A packet identifier's outstanding exchange.
#[derive(Debug)]
enum Pending {
    /// QoS 1 PUBLISH sent; the message if kept for resending.
    Puback(Option<Box<Publish>>),
    /// QoS 2 PUBLISH sent.
    Pubrec(Option<Box<Publish>>),
    /// PUBREL sent.
    Pubcomp,
    Suback,
    Unsuback,
}

/// One MQTT client connection's protocol state, sans I/O.
///
/// Call order: [`connect`](Self::connect), then write out
/// [`poll_transmit`](Self::poll_transmit); feed what the broker sends to
/// [`handle_buf`](Self::handle_buf) (or `handle_bytes`, `handle_packet`);
/// after each input or command, drain [`poll_transmit`](Self::poll_transmit)
/// and [`poll_event`](Self::poll_event); sleep until
/// [`poll_timeout`](Self::poll_timeout) and then call
/// [`handle_timeout`](Self::handle_timeout). `now` is always the caller's.
#[derive(Debug)]
pub struct ClientCore {
    options: ClientOptions,
    state: State,
    /// Received bytes not yet a whole packet, for [`Self::handle_bytes`].
    rbuf: BytesMut,
    /// Encoded packets not yet taken by [`Self::poll_transmit`].
    out: BytesMut,
    events: VecDeque<Event>,
    ids: Ring<Pending>,
    /// PUBLISHes among `ids`, which the window bounds.
    inflight: usize,
    window: u16,
    /// The broker's Maximum Packet Size (MQTT 5 §3.2.2.3.6).
    peer_packet_size_max: u32,
    keep_alive: Option<Duration>,
    last_sent: Option<Instant>,
    ping_sent: Option<Instant>,
    /// QoS 2 messages delivered and PUBREC'd, awaiting PUBREL (Acks::Auto).
    received_qos2: BTreeSet<PacketId>,
}

impl ClientCore {
    /// A core that has not connected yet.
    pub fn new(options: ClientOptions) -> Self {
        let window = options.inflight_max.get();
        ClientCore {
            options,
            state: State::Idle,
            rbuf: BytesMut::new(),
            out: BytesMut::new(),
            events: VecDeque::new(),
            ids: Ring::new(),
            inflight: 0,
            window,
            peer_packet_size_max: PACKET_SIZE_MAX,
            keep_alive: None,
            last_sent: None,
            ping_sent: None,
            received_qos2: BTreeSet::new(),
        }
    }

    /// The options; change `connect` (e.g. Clean Start) before a reconnect.
    pub fn options_mut(&mut self) -> &mut ClientOptions {
        &mut self.options
    }

    /// The protocol version of every connection.
    pub fn protocol(&self) -> Protocol {
        self.options.connect.protocol
    }

    /// Where the connection is.
    pub fn state(&self) -> State {
        self.state
    }

    /// QoS 1/2 PUBLISHes awaiting acknowledgement.
    pub fn inflight(&self) -> usize {
        self.inflight
    }

    /// The in-flight window of this connection: `inflight_max`, lowered by
    /// the broker's Receive Maximum.
    pub fn window(&self) -> u16 {
        self.window
    }

    /// Whether a QoS 1/2 PUBLISH would fit the window now.
    pub fn can_publish(&self) -> bool {
        self.state == State::Connected && self.inflight < usize::from(self.window)
    }

    /// Bytes queued for [`Self::poll_transmit`].
    pub fn transmit_len(&self) -> usize {
        self.out.len()
    }

    /// Starts a connection on a new transport: queues the CONNECT of the
    /// options. Unsent output and partial input of an earlier connection are
    /// dropped with it, and so are its pending SUBSCRIBE/UNSUBSCRIBE; the
    /// session's messages wait for the CONNACK, which resumes or abandons them.
    pub fn connect(&mut self, now: Instant) -> Result<(), Error> {
        self.rbuf.clear();
        self.out.clear();
        let stale: Vec<PacketId> = self
            .ids
            .iter()
            .filter(|(_, p)| matches!(p, Pending::Suback | Pending::Unsuback))
            .map(|(id, _)| id)
            .collect();
        for id in stale {
            self.ids.remove(id);
        }
        self.peer_packet_size_max = PACKET_SIZE_MAX;
        self.ping_sent = None;
        self.keep_alive = None;
        let connect = Packet::Connect(Box::new(self.options.connect.clone()));
        self.queue(now, &connect)?;
        self.state = State::Connecting;
        Ok(())
    }

    /// The transport is gone (closed, reset, timed out). Timers stop; the
    /// session stays for the next [`Self::connect`].
    pub fn connection_lost(&mut self) {
        self.state = State::Idle;
        self.ping_sent = None;
    }

    /// Copies `bytes` from the broker into the core's own buffer and handles
    /// every whole packet in it.
    pub fn handle_bytes(&mut self, now: Instant, bytes: &[u8]) -> Result<(), Error> {
        let mut buf = std::mem::take(&mut self.rbuf);
        buf.extend_from_slice(bytes);
        let result = self.handle_buf(now, &mut buf);
        self.rbuf = buf;
        result
    }

    /// Decodes and handles every whole packet in the caller's read buffer,
    /// leaving a partial one there for the next read, and queues their
    /// events. Payloads are slices of `buf`, not copies.
    ///
    /// # Errors
    /// The broker broke the protocol; the connection is [`State::Closed`].
    pub fn handle_buf(&mut self, now: Instant, buf: &mut BytesMut) -> Result<(), Error> {
        while let Some(packet) = self.decode(buf)? {
            self.handle_packet(now, packet)?;
        }
        Ok(())
    }

    /// Handles one packet from the broker, decoded by the caller, and
    /// queues its event.
    pub fn handle_packet(&mut self, now: Instant, packet: Packet) -> Result<(), Error> {
        if let Some(event) = self.dispatch(now, packet)? {
            self.events.push_back(event);
        }
        Ok(())
    }

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Packet>, Error> {
        decode(buf, self.protocol(), self.options.packet_size_max)
            .map_err(|e| self.fail(Error::Decode(e)))
    }

    /// Handles one packet and returns its event, if it has one. The CONNACK
    /// queues its events instead, as it may have several.
    #[inline]
    fn dispatch(&mut self, now: Instant, packet: Packet) -> Result<Option<Event>, Error> {
        let result = match self.state {
            State::Closed => return Ok(None),
            State::Idle => Err(unexpected(&packet, "not connected")),
            State::Connecting => match packet {
                Packet::Connack(connack) => self.on_connack(now, connack).map(|()| None),
                // MQTT 5 §4.12: enhanced authentication precedes the CONNACK.
                Packet::Auth(auth) => Ok(Some(Event::Auth(auth))),
                other => Err(unexpected(&other, "awaiting CONNACK")),
            },
            State::Connected => self.on_packet(now, packet),
        };
        result.map_err(|e| self.fail(e))
    }

    /// Publishes `payload`, which is copied once, into the output. QoS 0
    /// returns `None`; QoS 1/2 the packet identifier that a later
    /// [`Event::Published`] reports.
    ///
    /// # Errors
    /// [`Error::NotConnected`], [`Error::WindowFull`] (see
    /// [`Self::can_publish`]), [`Error::PacketIdsExhausted`], or
    /// [`Error::Encode`] (bad topic, too large for the broker).
    pub fn publish(
        &mut self,
        now: Instant,
        topic: &str,
        payload: Bytes,
        qos: QoS,
        retain: bool,
        properties: Properties,
    ) -> Result<Option<PacketId>, Error> {
        let packet_id = self.reserve(qos)?;
        let header = PublishHeader {
            dup: false,
            qos,
            retain,
            topic,
            packet_id,
            properties: &properties,
        };
        let max = self.peer_packet_size_max;
        encode_publish_header(&header, payload.len(), self.protocol(), max, &mut self.out)
            .map_err(encode_error(PacketType::Publish))?;
        self.out.put_slice(&payload);
        self.last_sent = Some(now);
        if let Some(id) = packet_id {
            let message = self.options.resend_on_reconnect.then(|| {
                Box::new(Publish {
                    dup: false,
                    qos,
                    retain,
                    topic: topic.to_owned(),
                    packet_id,
                    properties,
                    payload,
                })
            });
            self.track(id, qos, message);
        }
        Ok(packet_id)
    }

    /// Publishes a payload that `fill` writes straight into the caller's
    /// output buffer `out` after the header: no payload buffer at all, for
    /// load generation. Output queued in the core goes into `out` first, so
    /// the order on the wire is kept. Such a message is never kept for
    /// resending; a resumed session reports it [`Event::Abandoned`].
    ///
    /// Errors as [`Self::publish`].
    ///
    /// # Panics
    /// If `fill` does not append exactly `payload_len` bytes: the header
    /// already announced that many.
    #[allow(clippy::too_many_arguments)] // a PUBLISH has this many parts
    pub fn publish_with(
        &mut self,
        now: Instant,
        topic: &str,
        qos: QoS,
        retain: bool,
        properties: &Properties,
        payload_len: usize,
        out: &mut BytesMut,
        fill: impl FnOnce(&mut BytesMut),
    ) -> Result<Option<PacketId>, Error> {
        let packet_id = self.reserve(qos)?;
        self.poll_transmit(out);
        let header = PublishHeader {
            dup: false,
            qos,
            retain,
            topic,
            packet_id,
            properties,
        };
        let max = self.peer_packet_size_max;
        encode_publish_header(&header, payload_len, self.protocol(), max, out)
            .map_err(encode_error(PacketType::Publish))?;
        let start = out.len();
        fill(out);
        assert_eq!(
            out.len() - start,
            payload_len,
            "fill wrote the declared payload"
        );
        self.last_sent = Some(now);
        if let Some(id) = packet_id {
            self.track(id, qos, None);
        }
        Ok(packet_id)
    }

    /// Subscribes to `filters`; [`Event::Subscribed`] carries the SUBACK.
    pub fn subscribe(
        &mut self,
        now: Instant,
        filters: Vec<SubscribeFilter>,
        properties: Properties,
    ) -> Result<PacketId, Error> {
        self.request(now, Pending::Suback, |packet_id| {
            Packet::Subscribe(Subscribe {
                packet_id,
                filters,
                properties,
            })
        })
    }

    /// Unsubscribes from `filters`; [`Event::Unsubscribed`] carries the UNSUBACK.
    pub fn unsubscribe(
        &mut self,
        now: Instant,
        filters: Vec<String>,
        properties: Properties,
    ) -> Result<PacketId, Error> {
        self.request(now, Pending::Unsuback, |packet_id| {
            Packet::Unsubscribe(Unsubscribe {
                packet_id,
                filters,
                properties,
            })
        })
    }

    /// Sends a PINGREQ now; [`Event::Pong`] follows. Keep-alive pings need
    /// no call: [`Self::handle_timeout`] sends them.
    pub fn ping(&mut self, now: Instant) -> Result<(), Error> {
        self.connected()?;
        self.queue(now, &Packet::Pingreq)?;
        self.ping_sent.get_or_insert(now);
        Ok(())
    }

    /// The receiving half of a PUBLISH the caller decoded itself and keeps
    /// (a load generator's hot loop: a PUBLISH is 400 bytes, and
    /// not moving it through an [`Event`] saved a third of the receive path): with [`Acks::Auto`], queues its PUBACK or
    /// PUBREC; returns whether it is a new message, false for a QoS 2 repeat
    /// before PUBREL (MQTT 5 §4.3.3). With [`Acks::Manual`], always true.
    #[inline]
    pub fn acknowledge_publish(&mut self, now: Instant, publish: &Publish) -> Result<bool, Error> {
        match self.state {
            State::Connected => {}
            // As `handle_packet`: the connection is over, its input ignored.
            State::Closed => return Ok(false),
            State::Idle | State::Connecting => {
                let state = if self.state == State::Idle {
                    "not connected"
                } else {
                    "awaiting CONNACK"
                };
                return Err(self.fail(Error::Unexpected {
                    packet_type: PacketType::Publish,
                    state,
                }));
            }
        }
        if self.options.acks == Acks::Manual {
            return Ok(true);
        }
        // Present exactly for QoS 1/2: the codec checks MQTT 5 §2.2.1.
        let Some(id) = publish.packet_id else {
            return Ok(true);
        };
        match publish.qos {
            QoS::AtMostOnce => Ok(true),
            QoS::AtLeastOnce => {
                self.queue(now, &Packet::Puback(PubAck::new(id)))?;
                Ok(true)
            }
            QoS::ExactlyOnce => {
                self.queue(now, &Packet::Pubrec(PubAck::new(id)))?;
                // Until PUBREL, a repeat is the same message.
                Ok(self.received_qos2.insert(id))
            }
        }
    }

    /// With [`Acks::Manual`]: answers a PUBLISH of `qos` (PUBACK for 1,
    /// PUBREC for 2) or, for `None`, a PUBREL (PUBCOMP).
    pub fn acknowledge(
        &mut self,
        now: Instant,
        packet_id: PacketId,
        qos: Option<QoS>,
    ) -> Result<(), Error> {
        self.connected()?;
        let ack = PubAck::new(packet_id);
        match qos {
            Some(QoS::AtMostOnce) => Ok(()),
            Some(QoS::AtLeastOnce) => self.queue(now, &Packet::Puback(ack)),
            Some(QoS::ExactlyOnce) => self.queue(now, &Packet::Pubrec(ack)),
            None => self.queue(now, &Packet::Pubcomp(ack)),
        }
    }

    /// Ends the connection with `disconnect` (MQTT 5 §3.14); the core is
    /// [`State::Closed`] and the caller closes the transport after writing.
    pub fn disconnect(&mut self, now: Instant, disconnect: Disconnect) -> Result<(), Error> {
        if !matches!(self.state, State::Connecting | State::Connected) {
            return Err(Error::NotConnected);
        }
        self.queue(now, &Packet::Disconnect(disconnect))?;
        self.state = State::Closed;
        Ok(())
    }

    /// Queues `packet` as given, outside the core's bookkeeping and the
    /// broker's Maximum Packet Size: for tests that send what a client must
    /// not, or own a flow themselves. The codec's rules still apply.
    pub fn send_packet(&mut self, packet: &Packet) -> Result<(), Error> {
        encode(packet, self.protocol(), PACKET_SIZE_MAX, &mut self.out)
            .map(|_| ())
            .map_err(encode_error(packet.packet_type()))
    }

    /// Moves everything queued for the broker into `out` and returns how
    /// many bytes that was. Queued bytes are copied, unless `out` is empty
    /// and too small to take them, when the two buffers trade places.
    pub fn poll_transmit(&mut self, out: &mut BytesMut) -> usize {
        let n = self.out.len();
        if n == 0 {
            return 0;
        }
        // Trading always would hand a caller's large, reused buffer to the
        // core and leave the caller growing a small one: measurably slower
        // for the load tool, whose acknowledgements are a few bytes a read.
        if out.is_empty() && out.capacity() < n {
            std::mem::swap(out, &mut self.out);
        } else {
            out.extend_from_slice(&self.out);
            self.out.clear();
        }
        n
    }

    /// The next event, in the order of the input that caused it.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Self::handle_timeout`] has work: the next keep-alive PINGREQ,
    /// or the end of the wait for a PINGRESP.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let keep_alive = self.keep_alive.filter(|_| self.state == State::Connected)?;
        match self.ping_sent {
            Some(sent) => Some(sent + keep_alive),
            // MQTT 5 §3.1.2.10: something must be sent within the keep-alive
            // interval; pinging after half of it leaves the other half for
            // a slow network.
            None => self.last_sent.map(|at| at + keep_alive / 2),
        }
    }

    /// Sends a keep-alive PINGREQ when one is due.
    ///
    /// # Errors
    /// [`Error::KeepAliveTimeout`] when a PINGREQ went unanswered for the
    /// keep-alive interval; the connection is [`State::Closed`].
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), Error> {
        let Some(at) = self.poll_timeout() else {
            return Ok(());
        };
        if now < at {
            return Ok(());
        }
        if self.ping_sent.is_some() {
            let keep_alive_secs = self.keep_alive.map_or(0, |d| d.as_secs() as u16);
            return Err(self.fail(Error::KeepAliveTimeout { keep_alive_secs }));
        }
        self.ping(now)
    }

    fn on_connack(&mut self, now: Instant, connack: Connack) -> Result<(), Error> {
        if connack.reason_code.is_error() {
            self.state = State::Closed;
            self.events.push_back(Event::Connected(connack));
            return Ok(());
        }
        self.state = State::Connected;
        let props = &connack.properties;
        let v5 = self.protocol().is_v5();
        let receive_maximum = props.receive_maximum.filter(|_| v5).unwrap_or(u16::MAX);
        self.window = self.options.inflight_max.get().min(receive_maximum);
        self.peer_packet_size_max = props.maximum_packet_size.unwrap_or(PACKET_SIZE_MAX);
        // MQTT 5 §3.2.2.3.14: the broker's Server Keep Alive replaces ours.
        let keep_alive = props
            .server_keep_alive
            .filter(|_| v5)
            .unwrap_or(self.options.connect.keep_alive);
        self.keep_alive = (keep_alive > 0).then(|| Duration::from_secs(u64::from(keep_alive)));
        let resume = connack.session_present && self.options.resend_on_reconnect;
        if !connack.session_present {
            // MQTT 5 §3.2.2.1.1: without a session on the broker, ours goes too.
            self.received_qos2.clear();
        }
        self.events.push_back(Event::Connected(connack));
        self.resume_or_abandon(now, resume)
    }

    /// MQTT 5 §4.4: on a resumed session, resend unacknowledged PUBLISHes
    /// with DUP set and PUBRELs, in their original order and identifiers.
    fn resume_or_abandon(&mut self, now: Instant, resume: bool) -> Result<(), Error> {
        if !resume {
            for (id, _) in self.ids.drain() {
                self.events.push_back(Event::Abandoned(id));
            }
            self.inflight = 0;
            return Ok(());
        }
        let mut abandoned = Vec::new();
        let mut resend = Vec::new();
        for (id, pending) in self.ids.iter() {
            match pending {
                Pending::Puback(Some(m)) | Pending::Pubrec(Some(m)) => {
                    let mut m = Publish::clone(m);
                    m.dup = true;
                    resend.push(Packet::Publish(m));
                }
                Pending::Pubcomp => resend.push(Packet::Pubrel(PubAck::new(id))),
                _ => abandoned.push(id),
            }
        }
        for id in abandoned {
            self.ids.remove(id);
            self.inflight -= 1;
            self.events.push_back(Event::Abandoned(id));
        }
        for packet in &resend {
            self.queue(now, packet)?;
        }
        Ok(())
    }

    /// Handles a packet on an accepted connection; returns its event, if it has one.
    fn on_packet(&mut self, now: Instant, packet: Packet) -> Result<Option<Event>, Error> {
        let manual = self.options.acks == Acks::Manual;
        match packet {
            Packet::Publish(publish) => self.on_publish(now, publish),
            Packet::Puback(ack) => self.on_ack(now, PacketType::Puback, ack),
            Packet::Pubrec(ack) => self.on_ack(now, PacketType::Pubrec, ack),
            Packet::Pubcomp(ack) => self.on_ack(now, PacketType::Pubcomp, ack),
            Packet::Pubrel(rel) if manual => Ok(Some(Event::Ack(Packet::Pubrel(rel)))),
            Packet::Pubrel(rel) => {
                let mut comp = PubAck::new(rel.packet_id);
                if !self.received_qos2.remove(&rel.packet_id) && self.protocol().is_v5() {
                    // MQTT 5 §3.7.2.1: still answered, with this reason.
                    comp.reason_code = ReasonCode::PacketIdentifierNotFound;
                }
                self.queue(now, &Packet::Pubcomp(comp))?;
                Ok(None)
            }
            Packet::Suback(suback) => {
                if !self.answered(suback.packet_id, |p| matches!(p, Pending::Suback)) && !manual {
                    return Err(unknown_id(PacketType::Suback, suback.packet_id));
                }
                Ok(Some(Event::Subscribed(suback)))
            }
            Packet::Unsuback(unsuback) => {
                let id = unsuback.packet_id;
                if !self.answered(id, |p| matches!(p, Pending::Unsuback)) && !manual {
                    return Err(unknown_id(PacketType::Unsuback, id));
                }
                Ok(Some(Event::Unsubscribed(unsuback)))
            }
            Packet::Pingresp => {
                self.ping_sent = None;
                Ok(Some(Event::Pong))
            }
            Packet::Disconnect(disconnect) => {
                self.state = State::Closed;
                Ok(Some(Event::Disconnected(disconnect)))
            }
            Packet::Auth(auth) => Ok(Some(Event::Auth(auth))),
            other @ (Packet::Connect(_)
            | Packet::Connack(_)
            | Packet::Subscribe(_)
            | Packet::Unsubscribe(_)
            | Packet::Pingreq) => Err(unexpected(&other, "connected")),
        }
    }

    fn on_publish(&mut self, now: Instant, publish: Publish) -> Result<Option<Event>, Error> {
        Ok(self
            .acknowledge_publish(now, &publish)?
            .then_some(Event::Message(publish)))
    }

    fn on_ack(
        &mut self,
        now: Instant,
        packet_type: PacketType,
        ack: PubAck,
    ) -> Result<Option<Event>, Error> {
        match self.step_exchange(now, packet_type, &ack)? {
            Some(Step::Ended(reason_code)) => Ok(Some(Event::Published {
                packet_id: ack.packet_id,
                reason_code,
            })),
            Some(Step::Continued) => Ok(None),
            None => self.stray(packet_type, ack),
        }
    }

    /// The PUBACK, PUBREC or PUBCOMP half of [`Self::handle_packet`], for
    /// a caller that decodes itself (the load tool: a [`Packet`] and an
    /// [`Event`] are 400 bytes each, and not moving them saved a third of
    /// the publishing path). Returns the reason code when `ack` ends one of
    /// our exchanges, which `handle_packet` would report as
    /// [`Event::Published`]; `None` when it advances one (a PUBREC: the
    /// PUBREL is queued) or, with [`Acks::Manual`], belongs to none (then
    /// queued as [`Event::Ack`]).
    ///
    /// # Panics
    /// If `packet_type` is not PUBACK, PUBREC or PUBCOMP.
    pub fn handle_ack(
        &mut self,
        now: Instant,
        packet_type: PacketType,
        ack: &PubAck,
    ) -> Result<Option<ReasonCode>, Error> {
        assert!(
            matches!(
                packet_type,
                PacketType::Puback | PacketType::Pubrec | PacketType::Pubcomp
            ),
            "handle_ack takes PUBACK, PUBREC or PUBCOMP, not {packet_type:?}"
        );
        match self.state {
            State::Connected => {}
            State::Closed => return Ok(None),
            State::Idle | State::Connecting => {
                return Err(self.fail(Error::Unexpected {
                    packet_type,
                    state: "not connected",
                }))
            }
        }
        let step = self.step_exchange(now, packet_type, ack);
        match step.map_err(|e| self.fail(e))? {
            Some(Step::Ended(reason_code)) => Ok(Some(reason_code)),
            Some(Step::Continued) => Ok(None),
            None => {
                let event = self
                    .stray(packet_type, ack.clone())
                    .map_err(|e| self.fail(e))?;
                self.events.extend(event);
                Ok(None)
            }
        }
    }

    /// Moves our exchange of `ack.packet_id` on, or `None` if no exchange
    /// of ours awaits this acknowledgement.
    #[inline]
    fn step_exchange(
        &mut self,
        now: Instant,
        packet_type: PacketType,
        ack: &PubAck,
    ) -> Result<Option<Step>, Error> {
        let id = ack.packet_id;
        let ended = match (packet_type, self.ids.get_mut(id)) {
            (PacketType::Puback, Some(Pending::Puback(_))) => true,
            // MQTT 5 §4.3.3: a failing PUBREC ends the exchange, no PUBREL.
            (PacketType::Pubrec, Some(Pending::Pubrec(_))) if ack.reason_code.is_error() => true,
            // A repeated PUBREC (after our DUP resend) is answered again.
            (PacketType::Pubrec, Some(slot @ (Pending::Pubrec(_) | Pending::Pubcomp))) => {
                // The message is not resent after PUBREC, only the PUBREL.
                *slot = Pending::Pubcomp;
                self.queue(now, &Packet::Pubrel(PubAck::new(id)))?;
                false
            }
            (PacketType::Pubcomp, Some(Pending::Pubcomp)) => true,
            _ => return Ok(None),
        };
        if !ended {
            return Ok(Some(Step::Continued));
        }
        self.ids.remove(id);
        self.inflight -= 1;
        Ok(Some(Step::Ended(ack.reason_code)))
    }

    /// An acknowledgement for no exchange of ours: the caller's in manual
    /// mode, a protocol error otherwise.
    fn stray(&mut self, packet_type: PacketType, ack: PubAck) -> Result<Option<Event>, Error> {
        if self.options.acks == Acks::Auto {
            return Err(unknown_id(packet_type, ack.packet_id));
        }
        Ok(Some(Event::Ack(match packet_type {
            PacketType::Puback => Packet::Puback(ack),
            PacketType::Pubrec => Packet::Pubrec(ack),
            _ => Packet::Pubcomp(ack),
        })))
    }

    /// Releases `id` if it awaits what `is` accepts.
    fn answered(&mut self, id: PacketId, is: impl Fn(&Pending) -> bool) -> bool {
        let awaited = self.ids.get_mut(id).is_some_and(|p| is(p));
        if awaited {
            self.ids.remove(id);
        }
        awaited
    }

    /// Checks a PUBLISH of `qos` may go now and picks its identifier.
    fn reserve(&mut self, qos: QoS) -> Result<Option<PacketId>, Error> {
        self.connected()?;
        if qos == QoS::AtMostOnce {
            return Ok(None);
        }
        if self.inflight >= usize::from(self.window) {
            return Err(Error::WindowFull {
                window: self.window,
            });
        }
        self.ids
            .next_id()
            .map(Some)
            .ok_or(Error::PacketIdsExhausted)
    }

    fn track(&mut self, id: PacketId, qos: QoS, message: Option<Box<Publish>>) {
        let pending = match qos {
            QoS::ExactlyOnce => Pending::Pubrec(message),
            _ => Pending::Puback(message),
        };
        let pushed = self.ids.push(pending);
        // `reserve` read this identifier just before, with no change between.
        assert_eq!(pushed, Some(id), "the reserved identifier");
        self.inflight += 1;
        assert!(
            self.inflight <= usize::from(self.window),
            "within the window"
        );
        assert!(
            self.inflight <= self.ids.len(),
            "every PUBLISH in flight holds an identifier"
        );
    }

    fn request(
        &mut self,
        now: Instant,
        pending: Pending,
        packet: impl FnOnce(PacketId) -> Packet,
    ) -> Result<PacketId, Error> {
        self.connected()?;
        let id = self.ids.next_id().ok_or(Error::PacketIdsExhausted)?;
        self.queue(now, &packet(id))?;
        let pushed = self.ids.push(pending);
        assert_eq!(pushed, Some(id), "the identifier read just before");
        Ok(id)
    }

    fn connected(&self) -> Result<(), Error> {
        match self.state {
            State::Connected => Ok(()),
            _ => Err(Error::NotConnected),
        }
    }

    fn queue(&mut self, now: Instant, packet: &Packet) -> Result<(), Error> {
        encode(
            packet,
            self.protocol(),
            self.peer_packet_size_max,
            &mut self.out,
        )
        .map_err(encode_error(packet.packet_type()))?;
        self.last_sent = Some(now);
        Ok(())
    }

    fn fail(&mut self, e: Error) -> Error {
        self.state = State::Closed;
        e
    }
}

fn unexpected(packet: &Packet, state: &'static str) -> Error {
    Error::Unexpected {
        packet_type: packet.packet_type(),
        state,
    }
}

fn unknown_id(packet_type: PacketType, packet_id: PacketId) -> Error {
    Error::UnknownPacketId {
        packet_type,
        packet_id,
    }
}

fn encode_error(packet_type: PacketType) -> impl FnOnce(starling_codec::Error) -> Error {
    move |source| Error::Encode {
        packet_type,
        source,
    }
}
