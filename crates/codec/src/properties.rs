//! MQTT 5 properties (MQTT 5 §2.2.2): one typed struct for every packet, and
//! the table of which packet may carry which property.

use bytes::{BufMut, Bytes, BytesMut};

use crate::wire::{self, Reader, VAR_INT_MAX};
use crate::{Error, PacketType, QoS};

/// Property identifiers (MQTT 5 §2.2.2.2).
pub mod id {
    /// Payload Format Indicator, byte.
    pub const PAYLOAD_FORMAT_INDICATOR: u8 = 0x01;
    /// Message Expiry Interval, four-byte integer.
    pub const MESSAGE_EXPIRY_INTERVAL: u8 = 0x02;
    /// Content Type, string.
    pub const CONTENT_TYPE: u8 = 0x03;
    /// Response Topic, string.
    pub const RESPONSE_TOPIC: u8 = 0x08;
    /// Correlation Data, binary.
    pub const CORRELATION_DATA: u8 = 0x09;
    /// Subscription Identifier, variable byte integer.
    pub const SUBSCRIPTION_IDENTIFIER: u8 = 0x0B;
    /// Session Expiry Interval, four-byte integer.
    pub const SESSION_EXPIRY_INTERVAL: u8 = 0x11;
    /// Assigned Client Identifier, string.
    pub const ASSIGNED_CLIENT_IDENTIFIER: u8 = 0x12;
    /// Server Keep Alive, two-byte integer.
    pub const SERVER_KEEP_ALIVE: u8 = 0x13;
    /// Authentication Method, string.
    pub const AUTHENTICATION_METHOD: u8 = 0x15;
    /// Authentication Data, binary.
    pub const AUTHENTICATION_DATA: u8 = 0x16;
    /// Request Problem Information, byte.
    pub const REQUEST_PROBLEM_INFORMATION: u8 = 0x17;
    /// Will Delay Interval, four-byte integer.
    pub const WILL_DELAY_INTERVAL: u8 = 0x18;
    /// Request Response Information, byte.
    pub const REQUEST_RESPONSE_INFORMATION: u8 = 0x19;
    /// Response Information, string.
    pub const RESPONSE_INFORMATION: u8 = 0x1A;
    /// Server Reference, string.
    pub const SERVER_REFERENCE: u8 = 0x1C;
    /// Reason String, string.
    pub const REASON_STRING: u8 = 0x1F;
    /// Receive Maximum, two-byte integer.
    pub const RECEIVE_MAXIMUM: u8 = 0x21;
    /// Topic Alias Maximum, two-byte integer.
    pub const TOPIC_ALIAS_MAXIMUM: u8 = 0x22;
    /// Topic Alias, two-byte integer.
    pub const TOPIC_ALIAS: u8 = 0x23;
    /// Maximum QoS, byte.
    pub const MAXIMUM_QOS: u8 = 0x24;
    /// Retain Available, byte.
    pub const RETAIN_AVAILABLE: u8 = 0x25;
    /// User Property, string pair.
    pub const USER_PROPERTY: u8 = 0x26;
    /// Maximum Packet Size, four-byte integer.
    pub const MAXIMUM_PACKET_SIZE: u8 = 0x27;
    /// Wildcard Subscription Available, byte.
    pub const WILDCARD_SUBSCRIPTION_AVAILABLE: u8 = 0x28;
    /// Subscription Identifier Available, byte.
    pub const SUBSCRIPTION_IDENTIFIER_AVAILABLE: u8 = 0x29;
    /// Shared Subscription Available, byte.
    pub const SHARED_SUBSCRIPTION_AVAILABLE: u8 = 0x2A;
}

/// Where a property list sits; decides which properties are allowed (the table of MQTT 5
/// §2.2.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropertyPlace {
    /// A packet's own property list.
    Packet(PacketType),
    /// The will properties inside CONNECT.
    Will,
}

impl PropertyPlace {
    fn packet_type(self) -> PacketType {
        match self {
            PropertyPlace::Packet(t) => t,
            PropertyPlace::Will => PacketType::Connect,
        }
    }
}

const fn bit(id: u8) -> u64 {
    1 << id
}

/// Which properties `place` may carry: the table of MQTT 5 §2.2.2.2.
fn allowed(place: PropertyPlace) -> u64 {
    use id::*;
    let user = bit(USER_PROPERTY);
    let reason = bit(REASON_STRING);
    match place {
        PropertyPlace::Will => {
            user | bit(PAYLOAD_FORMAT_INDICATOR)
                | bit(MESSAGE_EXPIRY_INTERVAL)
                | bit(CONTENT_TYPE)
                | bit(RESPONSE_TOPIC)
                | bit(CORRELATION_DATA)
                | bit(WILL_DELAY_INTERVAL)
        }
        PropertyPlace::Packet(t) => match t {
            PacketType::Connect => {
                user | bit(SESSION_EXPIRY_INTERVAL)
                    | bit(AUTHENTICATION_METHOD)
                    | bit(AUTHENTICATION_DATA)
                    | bit(REQUEST_PROBLEM_INFORMATION)
                    | bit(REQUEST_RESPONSE_INFORMATION)
                    | bit(RECEIVE_MAXIMUM)
                    | bit(TOPIC_ALIAS_MAXIMUM)
                    | bit(MAXIMUM_PACKET_SIZE)
            }
            PacketType::Connack => {
                user | reason
                    | bit(SESSION_EXPIRY_INTERVAL)
                    | bit(ASSIGNED_CLIENT_IDENTIFIER)
                    | bit(SERVER_KEEP_ALIVE)
                    | bit(AUTHENTICATION_METHOD)
                    | bit(AUTHENTICATION_DATA)
                    | bit(RESPONSE_INFORMATION)
                    | bit(SERVER_REFERENCE)
                    | bit(RECEIVE_MAXIMUM)
                    | bit(TOPIC_ALIAS_MAXIMUM)
                    | bit(MAXIMUM_QOS)
                    | bit(RETAIN_AVAILABLE)
                    | bit(MAXIMUM_PACKET_SIZE)
                    | bit(WILDCARD_SUBSCRIPTION_AVAILABLE)
                    | bit(SUBSCRIPTION_IDENTIFIER_AVAILABLE)
                    | bit(SHARED_SUBSCRIPTION_AVAILABLE)
            }
            PacketType::Publish => {
                user | bit(PAYLOAD_FORMAT_INDICATOR)
                    | bit(MESSAGE_EXPIRY_INTERVAL)
                    | bit(CONTENT_TYPE)
                    | bit(RESPONSE_TOPIC)
                    | bit(CORRELATION_DATA)
                    | bit(SUBSCRIPTION_IDENTIFIER)
                    | bit(TOPIC_ALIAS)
            }
            PacketType::Puback
            | PacketType::Pubrec
            | PacketType::Pubrel
            | PacketType::Pubcomp
            | PacketType::Suback
            | PacketType::Unsuback => user | reason,
            PacketType::Subscribe => user | bit(SUBSCRIPTION_IDENTIFIER),
            PacketType::Unsubscribe => user,
            PacketType::Disconnect => {
                user | reason | bit(SESSION_EXPIRY_INTERVAL) | bit(SERVER_REFERENCE)
            }
            PacketType::Auth => {
                user | reason | bit(AUTHENTICATION_METHOD) | bit(AUTHENTICATION_DATA)
            }
            PacketType::Pingreq | PacketType::Pingresp => 0,
        },
    }
}

/// Payload Format Indicator values (MQTT 5 §3.3.2.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadFormat {
    /// 0: unspecified bytes.
    Unspecified = 0,
    /// 1: UTF-8 encoded character data.
    Utf8 = 1,
}

/// The MQTT 5 properties of a packet, all typed, `None`/empty when absent.
///
/// One struct serves every packet; the codec refuses, both ways, a property
/// that the packet may not carry (MQTT 5 §2.2.2.2). In 3.x packets it is
/// always empty when decoded and ignored when encoded. Properties are
/// written in identifier order; user properties and subscription
/// identifiers keep their order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Properties {
    /// 0x01 Payload Format Indicator (PUBLISH, will).
    pub payload_format_indicator: Option<PayloadFormat>,
    /// 0x02 Message Expiry Interval in seconds (PUBLISH, will).
    pub message_expiry_interval: Option<u32>,
    /// 0x03 Content Type (PUBLISH, will).
    pub content_type: Option<String>,
    /// 0x08 Response Topic, a topic name without wildcards (PUBLISH, will).
    pub response_topic: Option<String>,
    /// 0x09 Correlation Data (PUBLISH, will).
    pub correlation_data: Option<Bytes>,
    /// 0x0B Subscription Identifiers, 1..=268,435,455. Several in a PUBLISH
    /// to a client, at most one in SUBSCRIBE (MQTT 5 §3.8.2.1.2). A client's
    /// PUBLISH must carry none (MQTT 5 §3.3.4); the codec does not know the
    /// direction, so that check belongs to the session.
    pub subscription_identifiers: Vec<u32>,
    /// 0x11 Session Expiry Interval in seconds (CONNECT, CONNACK, DISCONNECT).
    pub session_expiry_interval: Option<u32>,
    /// 0x12 Assigned Client Identifier (CONNACK).
    pub assigned_client_identifier: Option<String>,
    /// 0x13 Server Keep Alive in seconds (CONNACK).
    pub server_keep_alive: Option<u16>,
    /// 0x15 Authentication Method (CONNECT, CONNACK, AUTH).
    pub authentication_method: Option<String>,
    /// 0x16 Authentication Data (CONNECT, CONNACK, AUTH).
    pub authentication_data: Option<Bytes>,
    /// 0x17 Request Problem Information (CONNECT).
    pub request_problem_information: Option<bool>,
    /// 0x18 Will Delay Interval in seconds (will).
    pub will_delay_interval: Option<u32>,
    /// 0x19 Request Response Information (CONNECT).
    pub request_response_information: Option<bool>,
    /// 0x1A Response Information (CONNACK).
    pub response_information: Option<String>,
    /// 0x1C Server Reference (CONNACK, DISCONNECT).
    pub server_reference: Option<String>,
    /// 0x1F Reason String (acks, CONNACK, DISCONNECT, AUTH).
    pub reason_string: Option<String>,
    /// 0x21 Receive Maximum, not 0 (CONNECT, CONNACK).
    pub receive_maximum: Option<u16>,
    /// 0x22 Topic Alias Maximum (CONNECT, CONNACK).
    pub topic_alias_maximum: Option<u16>,
    /// 0x23 Topic Alias, not 0 (PUBLISH).
    pub topic_alias: Option<u16>,
    /// 0x24 Maximum QoS, 0 or 1 (CONNACK; absent means 2).
    pub maximum_qos: Option<QoS>,
    /// 0x25 Retain Available (CONNACK).
    pub retain_available: Option<bool>,
    /// 0x26 User Properties, in order, duplicates allowed (MQTT 5 §3.3.2.3.7).
    pub user_properties: Vec<(String, String)>,
    /// 0x27 Maximum Packet Size, not 0 (CONNECT, CONNACK).
    pub maximum_packet_size: Option<u32>,
    /// 0x28 Wildcard Subscription Available (CONNACK).
    pub wildcard_subscription_available: Option<bool>,
    /// 0x29 Subscription Identifier Available (CONNACK).
    pub subscription_identifier_available: Option<bool>,
    /// 0x2A Shared Subscription Available (CONNACK).
    pub shared_subscription_available: Option<bool>,
}

impl Properties {
    /// True when no property is set.
    pub fn is_empty(&self) -> bool {
        self.present() == 0
    }

    /// Bit set of the identifiers present.
    fn present(&self) -> u64 {
        use id::*;
        let mut m = 0;
        let mut set = |on: bool, id: u8| {
            if on {
                m |= bit(id);
            }
        };
        set(
            self.payload_format_indicator.is_some(),
            PAYLOAD_FORMAT_INDICATOR,
        );
        set(
            self.message_expiry_interval.is_some(),
            MESSAGE_EXPIRY_INTERVAL,
        );
        set(self.content_type.is_some(), CONTENT_TYPE);
        set(self.response_topic.is_some(), RESPONSE_TOPIC);
        set(self.correlation_data.is_some(), CORRELATION_DATA);
        set(
            !self.subscription_identifiers.is_empty(),
            SUBSCRIPTION_IDENTIFIER,
        );
        set(
            self.session_expiry_interval.is_some(),
            SESSION_EXPIRY_INTERVAL,
        );
        set(
            self.assigned_client_identifier.is_some(),
            ASSIGNED_CLIENT_IDENTIFIER,
        );
        set(self.server_keep_alive.is_some(), SERVER_KEEP_ALIVE);
        set(self.authentication_method.is_some(), AUTHENTICATION_METHOD);
        set(self.authentication_data.is_some(), AUTHENTICATION_DATA);
        set(
            self.request_problem_information.is_some(),
            REQUEST_PROBLEM_INFORMATION,
        );
        set(self.will_delay_interval.is_some(), WILL_DELAY_INTERVAL);
        set(
            self.request_response_information.is_some(),
            REQUEST_RESPONSE_INFORMATION,
        );
        set(self.response_information.is_some(), RESPONSE_INFORMATION);
        set(self.server_reference.is_some(), SERVER_REFERENCE);
        set(self.reason_string.is_some(), REASON_STRING);
        set(self.receive_maximum.is_some(), RECEIVE_MAXIMUM);
        set(self.topic_alias_maximum.is_some(), TOPIC_ALIAS_MAXIMUM);
        set(self.topic_alias.is_some(), TOPIC_ALIAS);
        set(self.maximum_qos.is_some(), MAXIMUM_QOS);
        set(self.retain_available.is_some(), RETAIN_AVAILABLE);
        set(!self.user_properties.is_empty(), USER_PROPERTY);
        set(self.maximum_packet_size.is_some(), MAXIMUM_PACKET_SIZE);
        set(
            self.wildcard_subscription_available.is_some(),
            WILDCARD_SUBSCRIPTION_AVAILABLE,
        );
        set(
            self.subscription_identifier_available.is_some(),
            SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        );
        set(
            self.shared_subscription_available.is_some(),
            SHARED_SUBSCRIPTION_AVAILABLE,
        );
        m
    }
}

fn read_flag(r: &mut Reader, pid: u8) -> Result<bool, Error> {
    // "It is a Protocol Error to include a value other than 0 or 1"
    // (MQTT 5 §3.1.2.11.6, §3.1.2.11.7, §3.2.2.3.5, §3.2.2.3.11-13).
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Error::InvalidPropertyValue { id: pid }),
    }
}

fn nonzero<T: PartialEq + Default>(v: T, pid: u8) -> Result<T, Error> {
    if v == T::default() {
        Err(Error::PropertyValueZero { id: pid })
    } else {
        Ok(v)
    }
}

fn set_once<T>(slot: &mut Option<T>, v: T, pid: u8) -> Result<(), Error> {
    if slot.is_some() {
        return Err(Error::DuplicateProperty { id: pid });
    }
    *slot = Some(v);
    Ok(())
}

/// Reads a property length and the property list that follows it.
pub(crate) fn read_properties(r: &mut Reader, place: PropertyPlace) -> Result<Properties, Error> {
    use id::*;
    let len = r.var_int()?;
    let mut r = r.sub(len as usize)?;
    let mut p = Properties::default();
    let allowed = allowed(place);
    while !r.is_empty() {
        // The identifier is a variable byte integer (MQTT 5 §2.2.2.2), though
        // every defined one fits in a single byte.
        let raw = r.var_int()?;
        let pid = u8::try_from(raw).map_err(|_| Error::UnknownProperty { id: raw })?;
        if !is_defined(pid) {
            return Err(Error::UnknownProperty { id: raw });
        }
        if allowed & bit(pid) == 0 {
            return Err(Error::PropertyNotAllowed {
                id: pid,
                packet_type: place.packet_type(),
            });
        }
        match pid {
            PAYLOAD_FORMAT_INDICATOR => {
                let v = match r.u8()? {
                    0 => PayloadFormat::Unspecified,
                    1 => PayloadFormat::Utf8,
                    _ => return Err(Error::InvalidPropertyValue { id: pid }),
                };
                set_once(&mut p.payload_format_indicator, v, pid)?;
            }
            MESSAGE_EXPIRY_INTERVAL => set_once(&mut p.message_expiry_interval, r.u32()?, pid)?,
            CONTENT_TYPE => set_once(&mut p.content_type, r.string()?, pid)?,
            RESPONSE_TOPIC => {
                let t = r.string()?;
                // MQTT 5 §3.3.2.3.5: a topic name; wildcards are a Protocol Error.
                check_response_topic(&t)?;
                set_once(&mut p.response_topic, t, pid)?;
            }
            CORRELATION_DATA => set_once(&mut p.correlation_data, r.binary()?, pid)?,
            SUBSCRIPTION_IDENTIFIER => {
                let v = nonzero(r.var_int()?, pid)?;
                // In SUBSCRIBE "It is a Protocol Error to include the
                // Subscription Identifier more than once" (MQTT 5 §3.8.2.1.2);
                // a PUBLISH may carry several (MQTT 5 §3.3.2.3.8).
                if place != PropertyPlace::Packet(PacketType::Publish)
                    && !p.subscription_identifiers.is_empty()
                {
                    return Err(Error::DuplicateProperty { id: pid });
                }
                p.subscription_identifiers.push(v);
            }
            SESSION_EXPIRY_INTERVAL => set_once(&mut p.session_expiry_interval, r.u32()?, pid)?,
            ASSIGNED_CLIENT_IDENTIFIER => {
                set_once(&mut p.assigned_client_identifier, r.string()?, pid)?
            }
            SERVER_KEEP_ALIVE => set_once(&mut p.server_keep_alive, r.u16()?, pid)?,
            AUTHENTICATION_METHOD => set_once(&mut p.authentication_method, r.string()?, pid)?,
            AUTHENTICATION_DATA => set_once(&mut p.authentication_data, r.binary()?, pid)?,
            REQUEST_PROBLEM_INFORMATION => {
                let v = read_flag(&mut r, pid)?;
                set_once(&mut p.request_problem_information, v, pid)?
            }
            WILL_DELAY_INTERVAL => set_once(&mut p.will_delay_interval, r.u32()?, pid)?,
            REQUEST_RESPONSE_INFORMATION => {
                let v = read_flag(&mut r, pid)?;
                set_once(&mut p.request_response_information, v, pid)?
            }
            RESPONSE_INFORMATION => set_once(&mut p.response_information, r.string()?, pid)?,
            SERVER_REFERENCE => set_once(&mut p.server_reference, r.string()?, pid)?,
            REASON_STRING => set_once(&mut p.reason_string, r.string()?, pid)?,
            RECEIVE_MAXIMUM => {
                let v = nonzero(r.u16()?, pid)?;
                set_once(&mut p.receive_maximum, v, pid)?
            }
            TOPIC_ALIAS_MAXIMUM => set_once(&mut p.topic_alias_maximum, r.u16()?, pid)?,
            TOPIC_ALIAS => {
                let v = nonzero(r.u16()?, pid)?;
                set_once(&mut p.topic_alias, v, pid)?
            }
            MAXIMUM_QOS => {
                let v = match r.u8()? {
                    0 => QoS::AtMostOnce,
                    1 => QoS::AtLeastOnce,
                    _ => return Err(Error::InvalidPropertyValue { id: pid }),
                };
                set_once(&mut p.maximum_qos, v, pid)?
            }
            RETAIN_AVAILABLE => {
                let v = read_flag(&mut r, pid)?;
                set_once(&mut p.retain_available, v, pid)?
            }
            USER_PROPERTY => {
                let k = r.string()?;
                let v = r.string()?;
                p.user_properties.push((k, v));
            }
            MAXIMUM_PACKET_SIZE => {
                let v = nonzero(r.u32()?, pid)?;
                set_once(&mut p.maximum_packet_size, v, pid)?
            }
            WILDCARD_SUBSCRIPTION_AVAILABLE => {
                let v = read_flag(&mut r, pid)?;
                set_once(&mut p.wildcard_subscription_available, v, pid)?
            }
            SUBSCRIPTION_IDENTIFIER_AVAILABLE => {
                let v = read_flag(&mut r, pid)?;
                set_once(&mut p.subscription_identifier_available, v, pid)?
            }
            SHARED_SUBSCRIPTION_AVAILABLE => {
                let v = read_flag(&mut r, pid)?;
                set_once(&mut p.shared_subscription_available, v, pid)?
            }
            // is_defined() above lists exactly the arms of this match.
            _ => return Err(Error::UnknownProperty { id: raw }),
        }
    }
    Ok(p)
}

fn is_defined(pid: u8) -> bool {
    matches!(
        pid,
        0x01..=0x03 | 0x08 | 0x09 | 0x0B | 0x11..=0x13 | 0x15..=0x1A | 0x1C | 0x1F | 0x21..=0x2A
    )
}

fn check_response_topic(t: &str) -> Result<(), Error> {
    wire::check_topic_name(t, false).map_err(|e| match e {
        Error::TopicNameEmpty | Error::TopicNameWildcard => Error::InvalidPropertyValue {
            id: id::RESPONSE_TOPIC,
        },
        other => other,
    })
}

/// Writes `p` as the property list `place` carries: its length (a variable byte integer),
/// then the properties in identifier order (MQTT 5 §2.2.2), checked as in a packet, so
/// that [`decode_properties`] reads them back. For keeping properties outside a packet in
/// the spec's own encoding (a session snapshot).
///
/// # Errors
/// A property `place` may not carry ([`Error::PropertyNotAllowed`]), a value out of range
/// (a zero that must not be, a string MQTT does not allow, a field too long).
pub fn encode_properties(
    p: &Properties,
    place: PropertyPlace,
    dst: &mut BytesMut,
) -> Result<(), Error> {
    put_properties(dst, p, place)
}

/// Reads a property list as [`encode_properties`] writes it for the same `place`, as
/// strictly as in a packet, with nothing after it.
///
/// # Errors
/// What decoding the property list of a packet fails with (a truncated list, an unknown,
/// duplicate or misplaced property, a value out of range), or [`Error::TrailingBytes`].
pub fn decode_properties(src: Bytes, place: PropertyPlace) -> Result<Properties, Error> {
    let mut r = Reader::new(src);
    let p = read_properties(&mut r, place)?;
    r.finish()?;
    Ok(p)
}

/// Writes the property length and the properties, checking that `place`
/// may carry each one and that each value is in range, so that whatever the
/// encoder writes, the decoder accepts.
pub(crate) fn put_properties(
    dst: &mut BytesMut,
    p: &Properties,
    place: PropertyPlace,
) -> Result<(), Error> {
    let present = p.present();
    let extra = present & !allowed(place);
    if extra != 0 {
        return Err(Error::PropertyNotAllowed {
            // The lowest offending identifier; `extra` < 2^64 so it fits a u8.
            id: extra.trailing_zeros() as u8,
            packet_type: place.packet_type(),
        });
    }
    wire::put_with_len(dst, 0, |dst| put_property_list(dst, p, place))?;
    Ok(())
}

fn put_property_list(
    dst: &mut BytesMut,
    p: &Properties,
    place: PropertyPlace,
) -> Result<(), Error> {
    use id::*;
    let flag = |dst: &mut BytesMut, pid: u8, v: Option<bool>| {
        if let Some(v) = v {
            dst.put_u8(pid);
            dst.put_u8(u8::from(v));
        }
    };
    let u16p = |dst: &mut BytesMut, pid: u8, v: Option<u16>, zero_ok: bool| {
        match v {
            Some(0) if !zero_ok => return Err(Error::PropertyValueZero { id: pid }),
            Some(v) => {
                dst.put_u8(pid);
                dst.put_u16(v);
            }
            None => {}
        }
        Ok(())
    };
    let u32p = |dst: &mut BytesMut, pid: u8, v: Option<u32>, zero_ok: bool| {
        match v {
            Some(0) if !zero_ok => return Err(Error::PropertyValueZero { id: pid }),
            Some(v) => {
                dst.put_u8(pid);
                dst.put_u32(v);
            }
            None => {}
        }
        Ok(())
    };
    let strp = |dst: &mut BytesMut, pid: u8, v: &Option<String>| {
        if let Some(v) = v {
            dst.put_u8(pid);
            wire::put_str(dst, v)?;
        }
        Ok::<(), Error>(())
    };
    let binp = |dst: &mut BytesMut, pid: u8, v: &Option<Bytes>| {
        if let Some(v) = v {
            dst.put_u8(pid);
            wire::put_binary(dst, v)?;
        }
        Ok::<(), Error>(())
    };

    if let Some(f) = p.payload_format_indicator {
        dst.put_u8(PAYLOAD_FORMAT_INDICATOR);
        dst.put_u8(f as u8);
    }
    u32p(
        dst,
        MESSAGE_EXPIRY_INTERVAL,
        p.message_expiry_interval,
        true,
    )?;
    strp(dst, CONTENT_TYPE, &p.content_type)?;
    if let Some(t) = &p.response_topic {
        check_response_topic(t)?;
    }
    strp(dst, RESPONSE_TOPIC, &p.response_topic)?;
    binp(dst, CORRELATION_DATA, &p.correlation_data)?;
    if place != PropertyPlace::Packet(PacketType::Publish) && p.subscription_identifiers.len() > 1 {
        return Err(Error::DuplicateProperty {
            id: SUBSCRIPTION_IDENTIFIER,
        });
    }
    for &s in &p.subscription_identifiers {
        if s == 0 {
            return Err(Error::PropertyValueZero {
                id: SUBSCRIPTION_IDENTIFIER,
            });
        }
        if s > VAR_INT_MAX {
            return Err(Error::InvalidPropertyValue {
                id: SUBSCRIPTION_IDENTIFIER,
            });
        }
        dst.put_u8(SUBSCRIPTION_IDENTIFIER);
        wire::put_var_int(dst, s)?;
    }
    u32p(
        dst,
        SESSION_EXPIRY_INTERVAL,
        p.session_expiry_interval,
        true,
    )?;
    strp(
        dst,
        ASSIGNED_CLIENT_IDENTIFIER,
        &p.assigned_client_identifier,
    )?;
    u16p(dst, SERVER_KEEP_ALIVE, p.server_keep_alive, true)?;
    strp(dst, AUTHENTICATION_METHOD, &p.authentication_method)?;
    binp(dst, AUTHENTICATION_DATA, &p.authentication_data)?;
    flag(
        dst,
        REQUEST_PROBLEM_INFORMATION,
        p.request_problem_information,
    );
    u32p(dst, WILL_DELAY_INTERVAL, p.will_delay_interval, true)?;
    flag(
        dst,
        REQUEST_RESPONSE_INFORMATION,
        p.request_response_information,
    );
    strp(dst, RESPONSE_INFORMATION, &p.response_information)?;
    strp(dst, SERVER_REFERENCE, &p.server_reference)?;
    strp(dst, REASON_STRING, &p.reason_string)?;
    u16p(dst, RECEIVE_MAXIMUM, p.receive_maximum, false)?;
    u16p(dst, TOPIC_ALIAS_MAXIMUM, p.topic_alias_maximum, true)?;
    u16p(dst, TOPIC_ALIAS, p.topic_alias, false)?;
    match p.maximum_qos {
        Some(QoS::ExactlyOnce) => return Err(Error::InvalidPropertyValue { id: MAXIMUM_QOS }),
        Some(q) => {
            dst.put_u8(MAXIMUM_QOS);
            dst.put_u8(q.as_u8());
        }
        None => {}
    }
    flag(dst, RETAIN_AVAILABLE, p.retain_available);
    for (k, v) in &p.user_properties {
        dst.put_u8(USER_PROPERTY);
        wire::put_str(dst, k)?;
        wire::put_str(dst, v)?;
    }
    u32p(dst, MAXIMUM_PACKET_SIZE, p.maximum_packet_size, false)?;
    flag(
        dst,
        WILDCARD_SUBSCRIPTION_AVAILABLE,
        p.wildcard_subscription_available,
    );
    flag(
        dst,
        SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        p.subscription_identifier_available,
    );
    flag(
        dst,
        SHARED_SUBSCRIPTION_AVAILABLE,
        p.shared_subscription_available,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_table_only_names_defined_properties() {
        let all = [
            PropertyPlace::Will,
            PropertyPlace::Packet(PacketType::Connect),
            PropertyPlace::Packet(PacketType::Connack),
            PropertyPlace::Packet(PacketType::Publish),
            PropertyPlace::Packet(PacketType::Puback),
            PropertyPlace::Packet(PacketType::Subscribe),
            PropertyPlace::Packet(PacketType::Suback),
            PropertyPlace::Packet(PacketType::Unsubscribe),
            PropertyPlace::Packet(PacketType::Unsuback),
            PropertyPlace::Packet(PacketType::Disconnect),
            PropertyPlace::Packet(PacketType::Auth),
        ];
        for place in all {
            let mask = allowed(place);
            for pid in 0..64u8 {
                if mask & bit(pid) != 0 {
                    assert!(is_defined(pid), "{place:?} allows undefined {pid:#x}");
                }
            }
        }
    }

    #[test]
    fn property_lists_round_trip_outside_a_packet_and_are_checked_both_ways() {
        let will = Properties {
            payload_format_indicator: Some(PayloadFormat::Utf8),
            message_expiry_interval: Some(60),
            content_type: Some("text/plain".into()),
            response_topic: Some("r/1".into()),
            correlation_data: Some(Bytes::from_static(b"\x00\x01")),
            will_delay_interval: Some(5),
            user_properties: vec![("k".into(), "v".into()), ("k".into(), "w".into())],
            ..Properties::default()
        };
        let mut buf = BytesMut::new();
        encode_properties(&will, PropertyPlace::Will, &mut buf).unwrap();
        let bytes = buf.split().freeze();
        assert_eq!(
            decode_properties(bytes.clone(), PropertyPlace::Will).unwrap(),
            will
        );
        // A PUBLISH carries no Will Delay Interval: refused both ways.
        assert!(matches!(
            decode_properties(bytes.clone(), PropertyPlace::Packet(PacketType::Publish)),
            Err(Error::PropertyNotAllowed { .. })
        ));
        assert!(matches!(
            encode_properties(&will, PropertyPlace::Packet(PacketType::Publish), &mut buf),
            Err(Error::PropertyNotAllowed { .. })
        ));
        let mut trailing = BytesMut::from(&bytes[..]);
        trailing.extend_from_slice(b"x");
        assert!(matches!(
            decode_properties(trailing.freeze(), PropertyPlace::Will),
            Err(Error::TrailingBytes { count: 1 })
        ));
        let mut empty = BytesMut::new();
        encode_properties(&Properties::default(), PropertyPlace::Will, &mut empty).unwrap();
        assert_eq!(&empty[..], b"\x00");
    }
}
