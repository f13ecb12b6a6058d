//! [`ClientCore`]: one MQTT client connection's protocol state, driven by
//! its caller.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use starling_codec::{
    decode, encode, encode_publish_header, Disconnect, Packet, PacketId, PacketType, Properties,
    Protocol, PubAck, Publish, PublishHeader, QoS, ReasonCode, Subscribe, SubscribeFilter,
    Unsubscribe, PACKET_SIZE_MAX,
};

mod receive;

use crate::ids::Ring;
use crate::options::{ClientOptions, State};
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

    /// With [`Acks::Manual`](crate::Acks::Manual): answers a PUBLISH of `qos` (PUBACK for 1,
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

    /// A packet that only an accepted connection may carry, too early.
    fn before_connack(&mut self, packet_type: PacketType) -> Error {
        let state = match self.state {
            State::Idle => "not connected",
            _ => "awaiting CONNACK",
        };
        self.fail(Error::Unexpected { packet_type, state })
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
