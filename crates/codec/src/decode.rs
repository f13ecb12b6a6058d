//! Streaming decoder: bytes in a growing buffer to packets.

use bytes::{Bytes, BytesMut};

use crate::properties::{read_properties, PropertyPlace};
use crate::wire::{self, read_var_int, Reader, VarInt};
use crate::*;

/// Decodes the next packet of a connection whose protocol is known.
///
/// Consumes the bytes of one whole packet and returns it, or returns
/// `Ok(None)` without consuming anything when `buf` does not yet hold a
/// whole packet: append more bytes and call again. Call repeatedly until
/// `Ok(None)`, as one read may bring several packets.
///
/// `max_packet_size` bounds the whole packet, fixed header included (MQTT 5
/// §3.1.2.11.4, §3.2.2.3.6). It is checked as soon as the remaining length is
/// readable, so a peer that declares a huge packet is refused before its body
/// is buffered; this function never allocates and never reserves space in
/// `buf` (reserving is the caller's business, bounded by the same limit).
///
/// # Errors
/// Any [`Error`]: the peer broke the protocol and the connection must be
/// closed (in 5.0 after a DISCONNECT with [`Error::reason_code`]). A whole
/// offending packet is consumed from `buf`; a packet refused from its fixed
/// header alone (reserved type or flags, too large, bad length) is not.
/// The PUBLISH payload and binary fields share `buf`'s memory; nothing is copied.
pub fn decode(
    buf: &mut BytesMut,
    protocol: Protocol,
    max_packet_size: u32,
) -> Result<Option<Packet>, Error> {
    let Some(first) = buf.first().copied() else {
        return Ok(None);
    };
    let packet_type = check_first_byte(first, protocol)?;
    let Some(body) = split_frame(buf, max_packet_size)? else {
        return Ok(None);
    };
    let mut r = Reader::new(body);
    let packet = decode_body(&mut r, first, packet_type, protocol)?;
    r.finish()?;
    Ok(Some(packet))
}

/// Decodes the first packet of a connection, which must be a CONNECT, and
/// learns the protocol version from it (MQTT 5 §3.1.2.1–§3.1.2.2). Decode
/// the packets that follow with [`decode`] and `connect.protocol`.
///
/// Same buffering and size contract as [`decode`].
///
/// # Errors
/// [`Error::FirstPacketNotConnect`] for any other packet type;
/// [`Error::InvalidProtocolName`] and [`Error::UnsupportedProtocolVersion`]
/// (reason code 0x84) when the version is unknown. For those two the broker
/// cannot know the client's version; MQTT 5 §3.1.2.2 suggests answering
/// with a CONNACK 0x84 (3.x: return code 0x01, `20 02 00 01`). For other
/// errors [`peek_protocol`] tells which CONNACK format the client reads.
pub fn decode_connect(buf: &mut BytesMut, max_packet_size: u32) -> Result<Option<Connect>, Error> {
    let Some(first) = buf.first().copied() else {
        return Ok(None);
    };
    check_connect_first_byte(first)?;
    let Some(body) = split_frame(buf, max_packet_size)? else {
        return Ok(None);
    };
    let mut r = Reader::new(body);
    let connect = decode_connect_body(&mut r)?;
    r.finish()?;
    Ok(Some(connect))
}

/// Reads the protocol version of the CONNECT at the start of `buf` without
/// consuming anything, as soon as the bytes up to its protocol level are
/// there. `Ok(None)` means more bytes are needed. Useful to choose the
/// CONNACK format when [`decode_connect`] fails later in the packet.
pub fn peek_protocol(buf: &[u8]) -> Result<Option<Protocol>, Error> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    check_connect_first_byte(first)?;
    let rest = buf.get(1..).unwrap_or_default();
    let header_len = match read_var_int(rest)? {
        VarInt::Complete(_, n) => 1 + n,
        VarInt::Incomplete => return Ok(None),
    };
    let rest = buf.get(header_len..).unwrap_or_default();
    let &[hi, lo, ..] = rest else {
        return Ok(None);
    };
    let name_len = usize::from(u16::from_be_bytes([hi, lo]));
    let Some(name) = rest.get(2..2 + name_len) else {
        return Ok(None);
    };
    let Some(&level) = rest.get(2 + name_len) else {
        return Ok(None);
    };
    protocol_of(name, level).map(Some)
}

fn check_connect_first_byte(first: u8) -> Result<(), Error> {
    let packet_type = first >> 4;
    if packet_type != PacketType::Connect as u8 {
        return Err(Error::FirstPacketNotConnect { packet_type });
    }
    if first & 0x0F != 0 {
        return Err(Error::InvalidFixedHeaderFlags {
            packet_type: PacketType::Connect,
            flags: first & 0x0F,
        });
    }
    Ok(())
}

/// The packet type of a first byte, with its flags checked (MQTT 5 §2.1.3):
/// PUBLISH has DUP/QoS/RETAIN, PUBREL, SUBSCRIBE and UNSUBSCRIBE have 0b0010,
/// every other type 0b0000. Done before buffering the body, so garbage is
/// refused at its first byte.
fn check_first_byte(first: u8, protocol: Protocol) -> Result<PacketType, Error> {
    let nibble = first >> 4;
    let flags = first & 0x0F;
    let packet_type = match PacketType::from_u8(nibble) {
        Some(PacketType::Auth) if !protocol.is_v5() => None,
        t => t,
    }
    .ok_or(Error::ReservedPacketType {
        packet_type: nibble,
        protocol,
    })?;
    let expected = match packet_type {
        PacketType::Publish => {
            let qos = QoS::from_u8((flags >> 1) & 0b11).ok_or(Error::InvalidQoS)?;
            // MQTT 5 §3.3.1.1: "The DUP flag MUST be set to 0 for all QoS 0 messages".
            if qos == QoS::AtMostOnce && flags & 0b1000 != 0 {
                return Err(Error::DupWithQoS0);
            }
            return Ok(packet_type);
        }
        PacketType::Pubrel | PacketType::Subscribe | PacketType::Unsubscribe => 0b0010,
        _ => 0,
    };
    // MQTT 3.1 §3.6 (and §3.8, §3.10): PUBREL, SUBSCRIBE and UNSUBSCRIBE travel at QoS 1
    // and are retried like a QoS 1 PUBLISH, with DUP set. 3.1.1 and 5.0 fixed the flags at
    // 0b0010, so the DUP bit is tolerated for 3.1 only.
    let checked = if protocol == Protocol::V3_1 && expected == 0b0010 {
        flags & !0b1000
    } else {
        flags
    };
    if checked != expected {
        return Err(Error::InvalidFixedHeaderFlags { packet_type, flags });
    }
    Ok(packet_type)
}

/// Splits one whole packet off `buf` and returns its body (after the fixed
/// header), or `None` when it is not all there yet.
fn split_frame(buf: &mut BytesMut, max_packet_size: u32) -> Result<Option<Bytes>, Error> {
    let rest = buf.get(1..).unwrap_or_default();
    let (remaining, len_bytes) = match read_var_int(rest)? {
        VarInt::Complete(v, n) => (v as usize, n),
        VarInt::Incomplete => return Ok(None),
    };
    let header_len = 1 + len_bytes;
    let size = (header_len + remaining) as u64;
    if size > u64::from(max_packet_size) {
        return Err(Error::PacketTooLarge {
            size,
            max: max_packet_size,
        });
    }
    if buf.len() < header_len + remaining {
        return Ok(None);
    }
    let mut frame = buf.split_to(header_len + remaining).freeze();
    Ok(Some(frame.split_off(header_len)))
}

fn protocol_of(name: &[u8], level: u8) -> Result<Protocol, Error> {
    match (name, level) {
        (b"MQIsdp", 3) => Ok(Protocol::V3_1),
        (b"MQTT", 4) => Ok(Protocol::V3_1_1),
        (b"MQTT", 5) => Ok(Protocol::V5),
        (b"MQTT" | b"MQIsdp", level) => Err(Error::UnsupportedProtocolVersion { level }),
        _ => Err(Error::InvalidProtocolName),
    }
}

fn packet_id(r: &mut Reader) -> Result<PacketId, Error> {
    PacketId::new(r.u16()?).ok_or(Error::PacketIdZero)
}

fn reason(code: u8, packet_type: PacketType) -> Result<ReasonCode, Error> {
    ReasonCode::from_u8(code)
        .filter(|c| c.allowed_in(packet_type))
        .ok_or(Error::ReasonCodeNotAllowed { packet_type, code })
}

fn props(r: &mut Reader, protocol: Protocol, packet_type: PacketType) -> Result<Properties, Error> {
    if protocol.is_v5() {
        read_properties(r, PropertyPlace::Packet(packet_type))
    } else {
        Ok(Properties::default())
    }
}

fn decode_body(
    r: &mut Reader,
    first: u8,
    packet_type: PacketType,
    protocol: Protocol,
) -> Result<Packet, Error> {
    let v5 = protocol.is_v5();
    Ok(match packet_type {
        PacketType::Connect => {
            // A second CONNECT is a Protocol Error (MQTT 5 §3.1), but that is
            // session state; decode it so the session can say so.
            Packet::Connect(Box::new(decode_connect_body(r)?))
        }
        PacketType::Connack => Packet::Connack(decode_connack(r, protocol)?),
        PacketType::Publish => Packet::Publish(decode_publish(r, first, protocol)?),
        PacketType::Puback | PacketType::Pubrec | PacketType::Pubrel | PacketType::Pubcomp => {
            let ack = decode_pub_ack(r, packet_type, protocol)?;
            match packet_type {
                PacketType::Puback => Packet::Puback(ack),
                PacketType::Pubrec => Packet::Pubrec(ack),
                PacketType::Pubrel => Packet::Pubrel(ack),
                _ => Packet::Pubcomp(ack),
            }
        }
        PacketType::Subscribe => Packet::Subscribe(decode_subscribe(r, protocol)?),
        PacketType::Suback => {
            let packet_id = packet_id(r)?;
            let properties = props(r, protocol, packet_type)?;
            let mut reason_codes = Vec::with_capacity(r.remaining());
            while !r.is_empty() {
                let code = r.u8()?;
                reason_codes.push(if v5 {
                    reason(code, packet_type)?
                } else {
                    // MQTT 3.1.1 §3.9.3: 0x00, 0x01, 0x02 or 0x80 only.
                    match code {
                        0x00 => ReasonCode::Success,
                        0x01 => ReasonCode::GrantedQoS1,
                        0x02 => ReasonCode::GrantedQoS2,
                        0x80 => ReasonCode::UnspecifiedError,
                        _ => return Err(Error::ReasonCodeNotAllowed { packet_type, code }),
                    }
                });
            }
            if reason_codes.is_empty() {
                return Err(Error::EmptyPayload { packet_type });
            }
            Packet::Suback(Suback {
                packet_id,
                reason_codes,
                properties,
            })
        }
        PacketType::Unsubscribe => {
            let packet_id = packet_id(r)?;
            let properties = props(r, protocol, packet_type)?;
            let mut filters = Vec::new();
            while !r.is_empty() {
                let filter = r.string()?;
                wire::check_topic_filter(&filter)?;
                filters.push(filter);
            }
            // MQTT 5 §3.10.3: "An UNSUBSCRIBE packet with no Payload is a Protocol Error".
            if filters.is_empty() {
                return Err(Error::EmptyPayload { packet_type });
            }
            Packet::Unsubscribe(Unsubscribe {
                packet_id,
                filters,
                properties,
            })
        }
        PacketType::Unsuback => {
            let packet_id = packet_id(r)?;
            let properties = props(r, protocol, packet_type)?;
            let mut reason_codes = Vec::new();
            if v5 {
                while !r.is_empty() {
                    reason_codes.push(reason(r.u8()?, packet_type)?);
                }
                // One code per filter of the UNSUBSCRIBE, which has at least one.
                if reason_codes.is_empty() {
                    return Err(Error::EmptyPayload { packet_type });
                }
            }
            Packet::Unsuback(Unsuback {
                packet_id,
                reason_codes,
                properties,
            })
        }
        PacketType::Pingreq => Packet::Pingreq,
        PacketType::Pingresp => Packet::Pingresp,
        PacketType::Disconnect => {
            let mut d = Disconnect::default();
            // MQTT 5 §3.14.2.1: a Remaining Length of 0 means Normal
            // disconnection; §3.14.2.2.1: below 2, no properties.
            if v5 && !r.is_empty() {
                d.reason_code = reason(r.u8()?, packet_type)?;
                if !r.is_empty() {
                    d.properties = read_properties(r, PropertyPlace::Packet(packet_type))?;
                }
            }
            Packet::Disconnect(d)
        }
        PacketType::Auth => {
            let mut a = Auth::default();
            // MQTT 5 §3.15.2.1: reason and properties may both be omitted
            // (Remaining Length 0), not the properties alone.
            if !r.is_empty() {
                a.reason_code = reason(r.u8()?, packet_type)?;
                a.properties = read_properties(r, PropertyPlace::Packet(packet_type))?;
            }
            Packet::Auth(a)
        }
    })
}

fn decode_connect_body(r: &mut Reader) -> Result<Connect, Error> {
    let name = r.binary()?;
    let level = r.u8()?;
    let protocol = protocol_of(&name, level)?;
    let v5 = protocol.is_v5();
    let flags = r.u8()?;
    // MQTT 5 §3.1.2.3 and MQTT 3.1.1 §3.1.2.3 [MQTT-3.1.2-3]: the reserved flag must be 0,
    // else Malformed Packet. MQTT 3.1 leaves bit 0 unused and says nothing of its value,
    // and some 3.1 clients send it set: ignored there.
    if flags & 0x01 != 0 && protocol != Protocol::V3_1 {
        return Err(Error::ConnectReservedFlag);
    }
    let clean_start = flags & 0x02 != 0;
    let will_flag = flags & 0x04 != 0;
    let will_qos_bits = (flags >> 3) & 0b11;
    let will_retain = flags & 0x20 != 0;
    let password_flag = flags & 0x40 != 0;
    let username_flag = flags & 0x80 != 0;
    // MQTT 5 §3.1.2.6–§3.1.2.7: without a will, Will QoS and Will Retain are 0.
    if !will_flag && (will_qos_bits != 0 || will_retain) {
        return Err(Error::WillFlagsWithoutWill);
    }
    let will_qos = QoS::from_u8(will_qos_bits).ok_or(Error::InvalidQoS)?;
    // MQTT 3.1.1 §3.1.2.9 (and 3.1): no password without a user name; 5.0 lifts this.
    if password_flag && !username_flag && !v5 {
        return Err(Error::PasswordWithoutUsername);
    }
    let keep_alive = r.u16()?;
    let properties = props(r, protocol, PacketType::Connect)?;
    check_auth_data(&properties)?;
    let client_id = r.string()?;
    let will = if will_flag {
        let properties = if v5 {
            read_properties(r, PropertyPlace::Will)?
        } else {
            Properties::default()
        };
        let topic = r.string()?;
        wire::check_topic_name(&topic, false)?;
        let payload = r.binary()?;
        Some(LastWill {
            topic,
            payload,
            qos: will_qos,
            retain: will_retain,
            properties,
        })
    } else {
        None
    };
    let username = if username_flag {
        Some(r.string()?)
    } else {
        None
    };
    // MQTT 5 §3.1.3.5: the password is Binary Data, not a UTF-8 string.
    let password = if password_flag {
        Some(r.binary()?)
    } else {
        None
    };
    Ok(Connect {
        protocol,
        clean_start,
        keep_alive,
        client_id,
        will,
        username,
        password,
        properties,
    })
}

/// MQTT 5 §3.1.2.11.10: "It is a Protocol Error to include Authentication
/// Data if there is no Authentication Method".
pub(crate) fn check_auth_data(p: &Properties) -> Result<(), Error> {
    if p.authentication_data.is_some() && p.authentication_method.is_none() {
        return Err(Error::AuthDataWithoutMethod);
    }
    Ok(())
}

fn decode_connack(r: &mut Reader, protocol: Protocol) -> Result<Connack, Error> {
    let flags = r.u8()?;
    // MQTT 5 §3.2.2.1: bits 7–1 reserved. 3.1 has no Session Present flag,
    // so its whole byte is reserved.
    let reserved = if protocol == Protocol::V3_1 {
        0xFF
    } else {
        0xFE
    };
    if flags & reserved != 0 {
        return Err(Error::ConnackReservedFlags);
    }
    let session_present = flags & 0x01 != 0;
    let code = r.u8()?;
    let reason_code = if protocol.is_v5() {
        reason(code, PacketType::Connack)?
    } else {
        ReasonCode::from_connack_v3(code).ok_or(Error::ReasonCodeNotAllowed {
            packet_type: PacketType::Connack,
            code,
        })?
    };
    // MQTT 5 §3.2.2.1.1, MQTT 3.1.1 §3.2.2.2: Session Present is 0 on refusal.
    if session_present && reason_code.is_error() {
        return Err(Error::SessionPresentWithError);
    }
    let properties = props(r, protocol, PacketType::Connack)?;
    check_auth_data(&properties)?;
    Ok(Connack {
        session_present,
        reason_code,
        properties,
    })
}

fn decode_publish(r: &mut Reader, first: u8, protocol: Protocol) -> Result<Publish, Error> {
    let dup = first & 0b1000 != 0;
    let retain = first & 0b0001 != 0;
    // check_first_byte() already refused QoS 3.
    let qos = QoS::from_u8((first >> 1) & 0b11).ok_or(Error::InvalidQoS)?;
    let topic = r.string()?;
    let packet_id = match qos {
        QoS::AtMostOnce => None,
        _ => Some(packet_id(r)?),
    };
    let properties = props(r, protocol, PacketType::Publish)?;
    // MQTT 5 §3.3.2.1 / §3.3.4: an empty topic needs a Topic Alias.
    wire::check_topic_name(&topic, properties.topic_alias.is_some())?;
    let payload = r.rest();
    Ok(Publish {
        dup,
        qos,
        retain,
        topic,
        packet_id,
        properties,
        payload,
    })
}

fn decode_pub_ack(
    r: &mut Reader,
    packet_type: PacketType,
    protocol: Protocol,
) -> Result<PubAck, Error> {
    let packet_id = packet_id(r)?;
    let mut ack = PubAck::new(packet_id);
    // MQTT 5 §3.4.2.1: Remaining Length 2 means Success and no properties;
    // §3.4.2.2.1: below 4, no properties.
    if protocol.is_v5() && !r.is_empty() {
        ack.reason_code = reason(r.u8()?, packet_type)?;
        if !r.is_empty() {
            ack.properties = read_properties(r, PropertyPlace::Packet(packet_type))?;
        }
    }
    Ok(ack)
}

fn decode_subscribe(r: &mut Reader, protocol: Protocol) -> Result<Subscribe, Error> {
    let packet_id = packet_id(r)?;
    let properties = props(r, protocol, PacketType::Subscribe)?;
    let mut filters = Vec::new();
    while !r.is_empty() {
        let filter = r.string()?;
        let shared = wire::check_topic_filter(&filter)?;
        let options = decode_options(r.u8()?, protocol)?;
        // MQTT 5 §3.8.3.1: "It is a Protocol Error to set the No Local bit
        // to 1 on a Shared Subscription".
        if shared && options.no_local {
            return Err(Error::NoLocalOnSharedSubscription);
        }
        filters.push(SubscribeFilter { filter, options });
    }
    // MQTT 5 §3.8.3: "A SUBSCRIBE packet with no Payload is a Protocol Error".
    if filters.is_empty() {
        return Err(Error::EmptyPayload {
            packet_type: PacketType::Subscribe,
        });
    }
    Ok(Subscribe {
        packet_id,
        filters,
        properties,
    })
}

fn decode_options(byte: u8, protocol: Protocol) -> Result<SubscriptionOptions, Error> {
    // MQTT 3.1.1 §3.8.3.1: bits 7–2 reserved (MQTT 5 reserves 7–6 only, checked next).
    if !protocol.is_v5() && byte & 0xFC != 0 {
        return Err(Error::SubscriptionOptionsReserved);
    }
    SubscriptionOptions::from_byte(byte)
}
