//! Encoder: packets to bytes, with the same rules as the decoder.

use bytes::{BufMut, BytesMut};

use crate::decode::check_auth_data;
use crate::properties::{put_properties, PropertyPlace};
use crate::wire::{self, put_with_len};
use crate::*;

/// Appends `packet`, encoded for `protocol`, to `dst` and returns the number
/// of bytes written.
///
/// The packet is checked against the rules the decoder enforces, so what
/// this writes, [`decode`] accepts. Fields that `protocol` cannot carry are
/// left out rather than refused, so a broker can forward one message to
/// clients of every version: properties, subscription options other than
/// QoS, and reason codes are dropped for 3.x (CONNACK codes are mapped with
/// [`ReasonCode::to_connack_v3`], failing SUBACK codes become 0x80), and
/// Session Present for 3.1.
///
/// `max_packet_size` is the peer's Maximum Packet Size (MQTT 5 §3.1.2.11.4),
/// counted over the whole packet.
///
/// # Errors
/// [`Error::PacketTooLarge`] when the packet would exceed `max_packet_size`
/// (MQTT 5 §4.13: the sender must not send it; a PUBLISH may be dropped
/// instead), any rule violation, and [`Error::PacketNotInProtocol`] for AUTH
/// before 5.0. On error `dst` is left as it was.
pub fn encode(
    packet: &Packet,
    protocol: Protocol,
    max_packet_size: u32,
    dst: &mut BytesMut,
) -> Result<usize, Error> {
    let v5 = protocol.is_v5();
    let packet_type = packet.packet_type();
    let first = (packet_type as u8) << 4;
    match packet {
        Packet::Connect(c) => {
            if c.protocol != protocol {
                return Err(Error::ConnectProtocolMismatch {
                    connect: c.protocol,
                    requested: protocol,
                });
            }
            frame(dst, first, 0, max_packet_size, |dst| put_connect(dst, c))
        }
        Packet::Connack(c) => frame(dst, first, 0, max_packet_size, |dst| {
            put_connack(dst, c, protocol)
        }),
        Packet::Publish(p) => {
            let n = encode_publish_header(
                &p.header(),
                p.payload.len(),
                protocol,
                max_packet_size,
                dst,
            )?;
            dst.put_slice(&p.payload);
            Ok(n + p.payload.len())
        }
        Packet::Puback(a) | Packet::Pubrec(a) | Packet::Pubcomp(a) => {
            frame(dst, first, 0, max_packet_size, |dst| {
                put_pub_ack(dst, a, packet_type, v5)
            })
        }
        // MQTT 5 §3.6.1: PUBREL flags are 0b0010.
        Packet::Pubrel(a) => frame(dst, first | 0b0010, 0, max_packet_size, |dst| {
            put_pub_ack(dst, a, packet_type, v5)
        }),
        Packet::Subscribe(s) => frame(dst, first | 0b0010, 0, max_packet_size, |dst| {
            put_subscribe(dst, s, protocol)
        }),
        Packet::Suback(s) => frame(dst, first, 0, max_packet_size, |dst| {
            put_suback(dst, s, protocol)
        }),
        Packet::Unsubscribe(u) => frame(dst, first | 0b0010, 0, max_packet_size, |dst| {
            if u.filters.is_empty() {
                return Err(Error::EmptyPayload { packet_type });
            }
            dst.put_u16(u.packet_id.get());
            if v5 {
                put_properties(dst, &u.properties, PropertyPlace::Packet(packet_type))?;
            }
            for f in &u.filters {
                wire::check_topic_filter(f)?;
                wire::put_str(dst, f)?;
            }
            Ok(())
        }),
        Packet::Unsuback(u) => frame(dst, first, 0, max_packet_size, |dst| {
            dst.put_u16(u.packet_id.get());
            if v5 {
                if u.reason_codes.is_empty() {
                    return Err(Error::EmptyPayload { packet_type });
                }
                put_properties(dst, &u.properties, PropertyPlace::Packet(packet_type))?;
                for &c in &u.reason_codes {
                    put_reason(dst, c, packet_type)?;
                }
            }
            Ok(())
        }),
        Packet::Pingreq | Packet::Pingresp => frame(dst, first, 0, max_packet_size, |_| Ok(())),
        Packet::Disconnect(d) => frame(dst, first, 0, max_packet_size, |dst| {
            // 3.x DISCONNECT has no variable header. 5.0: shortest form
            // (MQTT 5 §3.14.2.1, §3.14.2.2.1).
            if v5 && (d.reason_code != ReasonCode::Success || !d.properties.is_empty()) {
                put_reason(dst, d.reason_code, packet_type)?;
                if !d.properties.is_empty() {
                    put_properties(dst, &d.properties, PropertyPlace::Packet(packet_type))?;
                }
            }
            Ok(())
        }),
        Packet::Auth(a) => {
            if !v5 {
                return Err(Error::PacketNotInProtocol {
                    packet_type,
                    protocol,
                });
            }
            frame(dst, first, 0, max_packet_size, |dst| {
                // MQTT 5 §3.15.2.1: both omitted only together.
                if a.reason_code != ReasonCode::Success || !a.properties.is_empty() {
                    put_reason(dst, a.reason_code, packet_type)?;
                    put_properties(dst, &a.properties, PropertyPlace::Packet(packet_type))?;
                }
                Ok(())
            })
        }
    }
}

/// Appends the fixed header, topic, packet id and properties of a PUBLISH
/// whose payload is `payload_len` bytes, and returns the bytes written. The
/// caller sends the payload right after, e.g. with a vectored write of
/// `[dst, payload]` or `dst.chain(payload)`, so one shared `Bytes` payload
/// serves every subscriber without a copy.
///
/// Same checks and `max_packet_size` contract as [`encode`] (the payload
/// counts towards the size); on error `dst` is left as it was.
pub fn encode_publish_header(
    header: &PublishHeader<'_>,
    payload_len: usize,
    protocol: Protocol,
    max_packet_size: u32,
    dst: &mut BytesMut,
) -> Result<usize, Error> {
    // MQTT 5 §3.3.1.1.
    if header.qos == QoS::AtMostOnce && header.dup {
        return Err(Error::DupWithQoS0);
    }
    // MQTT 5 §2.2.1: a packet id exactly when QoS > 0.
    if (header.qos == QoS::AtMostOnce) != header.packet_id.is_none() {
        return Err(Error::PacketIdMismatch { qos: header.qos });
    }
    let v5 = protocol.is_v5();
    let alias = v5 && header.properties.topic_alias.is_some();
    wire::check_topic_name(header.topic, alias)?;
    let first = (PacketType::Publish as u8) << 4
        | u8::from(header.dup) << 3
        | header.qos.as_u8() << 1
        | u8::from(header.retain);
    frame(dst, first, payload_len, max_packet_size, |dst| {
        // Checked just above: once per header is enough (this runs once per subscriber).
        wire::put_binary(dst, header.topic.as_bytes())?;
        if let Some(id) = header.packet_id {
            dst.put_u16(id.get());
        }
        if v5 {
            put_properties(
                dst,
                header.properties,
                PropertyPlace::Packet(PacketType::Publish),
            )?;
        }
        Ok(())
    })
}

/// Writes a fixed header and body; `extra` payload bytes follow later. Checks
/// the whole size against `max` and restores `dst` on any error.
fn frame<F>(dst: &mut BytesMut, first: u8, extra: usize, max: u32, body: F) -> Result<usize, Error>
where
    F: FnOnce(&mut BytesMut) -> Result<(), Error>,
{
    let start = dst.len();
    dst.put_u8(first);
    let n = match put_with_len(dst, extra, body) {
        Ok(n) => n,
        Err(e) => {
            dst.truncate(start);
            return Err(e);
        }
    };
    let size = (1 + n) as u64 + extra as u64;
    if size > u64::from(max) {
        dst.truncate(start);
        return Err(Error::PacketTooLarge { size, max });
    }
    Ok(1 + n)
}

fn put_reason(dst: &mut BytesMut, code: ReasonCode, packet_type: PacketType) -> Result<(), Error> {
    if !code.allowed_in(packet_type) {
        return Err(Error::ReasonCodeNotAllowed {
            packet_type,
            code: code.as_u8(),
        });
    }
    dst.put_u8(code.as_u8());
    Ok(())
}

fn put_connect(dst: &mut BytesMut, c: &Connect) -> Result<(), Error> {
    let v5 = c.protocol.is_v5();
    if !v5 && c.password.is_some() && c.username.is_none() {
        return Err(Error::PasswordWithoutUsername);
    }
    wire::put_str(dst, c.protocol.name())?;
    dst.put_u8(c.protocol.level());
    let mut flags = 0u8;
    if c.clean_start {
        flags |= 0x02;
    }
    if let Some(w) = &c.will {
        flags |= 0x04 | w.qos.as_u8() << 3;
        if w.retain {
            flags |= 0x20;
        }
    }
    if c.password.is_some() {
        flags |= 0x40;
    }
    if c.username.is_some() {
        flags |= 0x80;
    }
    dst.put_u8(flags);
    dst.put_u16(c.keep_alive);
    if v5 {
        check_auth_data(&c.properties)?;
        put_properties(
            dst,
            &c.properties,
            PropertyPlace::Packet(PacketType::Connect),
        )?;
    }
    wire::put_str(dst, &c.client_id)?;
    if let Some(w) = &c.will {
        if v5 {
            put_properties(dst, &w.properties, PropertyPlace::Will)?;
        }
        wire::check_topic_name(&w.topic, false)?;
        wire::put_str(dst, &w.topic)?;
        wire::put_binary(dst, &w.payload)?;
    }
    if let Some(u) = &c.username {
        wire::put_str(dst, u)?;
    }
    if let Some(p) = &c.password {
        wire::put_binary(dst, p)?;
    }
    Ok(())
}

fn put_connack(dst: &mut BytesMut, c: &Connack, protocol: Protocol) -> Result<(), Error> {
    if !c.reason_code.allowed_in(PacketType::Connack) {
        return Err(Error::ReasonCodeNotAllowed {
            packet_type: PacketType::Connack,
            code: c.reason_code.as_u8(),
        });
    }
    if c.session_present && c.reason_code.is_error() {
        return Err(Error::SessionPresentWithError);
    }
    // 3.1 has no Session Present flag.
    dst.put_u8(u8::from(c.session_present && protocol != Protocol::V3_1));
    if protocol.is_v5() {
        dst.put_u8(c.reason_code.as_u8());
        check_auth_data(&c.properties)?;
        // Always written, even when empty: MQTT 5 §3.2.2.3 has no short form.
        put_properties(
            dst,
            &c.properties,
            PropertyPlace::Packet(PacketType::Connack),
        )?;
    } else {
        dst.put_u8(c.reason_code.to_connack_v3());
    }
    Ok(())
}

fn put_pub_ack(
    dst: &mut BytesMut,
    a: &PubAck,
    packet_type: PacketType,
    v5: bool,
) -> Result<(), Error> {
    dst.put_u16(a.packet_id.get());
    // Shortest form (MQTT 5 §3.4.2.1, §3.4.2.2.1).
    if v5 && (a.reason_code != ReasonCode::Success || !a.properties.is_empty()) {
        put_reason(dst, a.reason_code, packet_type)?;
        if !a.properties.is_empty() {
            put_properties(dst, &a.properties, PropertyPlace::Packet(packet_type))?;
        }
    }
    Ok(())
}

fn put_subscribe(dst: &mut BytesMut, s: &Subscribe, protocol: Protocol) -> Result<(), Error> {
    let v5 = protocol.is_v5();
    if s.filters.is_empty() {
        return Err(Error::EmptyPayload {
            packet_type: PacketType::Subscribe,
        });
    }
    dst.put_u16(s.packet_id.get());
    if v5 {
        put_properties(
            dst,
            &s.properties,
            PropertyPlace::Packet(PacketType::Subscribe),
        )?;
    }
    for f in &s.filters {
        let shared = wire::check_topic_filter(&f.filter)?;
        wire::put_str(dst, &f.filter)?;
        let o = f.options;
        let byte = if v5 {
            if shared && o.no_local {
                return Err(Error::NoLocalOnSharedSubscription);
            }
            o.to_byte()
        } else {
            o.qos.as_u8()
        };
        dst.put_u8(byte);
    }
    Ok(())
}

fn put_suback(dst: &mut BytesMut, s: &Suback, protocol: Protocol) -> Result<(), Error> {
    let packet_type = PacketType::Suback;
    if s.reason_codes.is_empty() {
        return Err(Error::EmptyPayload { packet_type });
    }
    dst.put_u16(s.packet_id.get());
    if protocol.is_v5() {
        put_properties(dst, &s.properties, PropertyPlace::Packet(packet_type))?;
    }
    for &c in &s.reason_codes {
        if !c.allowed_in(packet_type) {
            return Err(Error::ReasonCodeNotAllowed {
                packet_type,
                code: c.as_u8(),
            });
        }
        // 3.x knows only granted QoS 0–2 and 0x80 failure (MQTT 3.1.1 §3.9.3).
        let byte = if protocol.is_v5() || !c.is_error() {
            c.as_u8()
        } else {
            0x80
        };
        dst.put_u8(byte);
    }
    Ok(())
}
