//! MQTT 5 reason codes (MQTT 5 §2.4) and the MQTT 3.x CONNACK return codes.

use crate::PacketType;

/// An MQTT 5 reason code (MQTT 5 §2.4).
///
/// One variant per byte value. Several names share a value in the spec
/// (0x00 is Success, Normal Disconnection and Granted QoS 0); the aliases are
/// associated constants ([`ReasonCode::NORMAL_DISCONNECTION`], [`ReasonCode::GRANTED_QOS_0`]).
/// Values below 0x80 mean success, 0x80 and above mean failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(u8)]
pub enum ReasonCode {
    /// 0x00 Success; also Normal Disconnection and Granted QoS 0.
    #[default]
    Success = 0x00,
    /// 0x01 Granted QoS 1 (SUBACK).
    GrantedQoS1 = 0x01,
    /// 0x02 Granted QoS 2 (SUBACK).
    GrantedQoS2 = 0x02,
    /// 0x04 Disconnect with Will Message (DISCONNECT from a client).
    DisconnectWithWillMessage = 0x04,
    /// 0x10 No matching subscribers (PUBACK, PUBREC).
    NoMatchingSubscribers = 0x10,
    /// 0x11 No subscription existed (UNSUBACK).
    NoSubscriptionExisted = 0x11,
    /// 0x18 Continue authentication (AUTH).
    ContinueAuthentication = 0x18,
    /// 0x19 Re-authenticate (AUTH).
    ReAuthenticate = 0x19,
    /// 0x80 Unspecified error.
    UnspecifiedError = 0x80,
    /// 0x81 Malformed Packet.
    MalformedPacket = 0x81,
    /// 0x82 Protocol Error.
    ProtocolError = 0x82,
    /// 0x83 Implementation specific error.
    ImplementationSpecificError = 0x83,
    /// 0x84 Unsupported Protocol Version (CONNACK).
    UnsupportedProtocolVersion = 0x84,
    /// 0x85 Client Identifier not valid (CONNACK).
    ClientIdentifierNotValid = 0x85,
    /// 0x86 Bad User Name or Password (CONNACK).
    BadUserNameOrPassword = 0x86,
    /// 0x87 Not authorized.
    NotAuthorized = 0x87,
    /// 0x88 Server unavailable (CONNACK).
    ServerUnavailable = 0x88,
    /// 0x89 Server busy.
    ServerBusy = 0x89,
    /// 0x8A Banned (CONNACK).
    Banned = 0x8A,
    /// 0x8B Server shutting down (DISCONNECT).
    ServerShuttingDown = 0x8B,
    /// 0x8C Bad authentication method.
    BadAuthenticationMethod = 0x8C,
    /// 0x8D Keep Alive timeout (DISCONNECT).
    KeepAliveTimeout = 0x8D,
    /// 0x8E Session taken over (DISCONNECT).
    SessionTakenOver = 0x8E,
    /// 0x8F Topic Filter invalid.
    TopicFilterInvalid = 0x8F,
    /// 0x90 Topic Name invalid.
    TopicNameInvalid = 0x90,
    /// 0x91 Packet Identifier in use.
    PacketIdentifierInUse = 0x91,
    /// 0x92 Packet Identifier not found.
    PacketIdentifierNotFound = 0x92,
    /// 0x93 Receive Maximum exceeded (DISCONNECT).
    ReceiveMaximumExceeded = 0x93,
    /// 0x94 Topic Alias invalid (DISCONNECT).
    TopicAliasInvalid = 0x94,
    /// 0x95 Packet too large.
    PacketTooLarge = 0x95,
    /// 0x96 Message rate too high (DISCONNECT).
    MessageRateTooHigh = 0x96,
    /// 0x97 Quota exceeded.
    QuotaExceeded = 0x97,
    /// 0x98 Administrative action (DISCONNECT).
    AdministrativeAction = 0x98,
    /// 0x99 Payload format invalid.
    PayloadFormatInvalid = 0x99,
    /// 0x9A Retain not supported.
    RetainNotSupported = 0x9A,
    /// 0x9B QoS not supported.
    QoSNotSupported = 0x9B,
    /// 0x9C Use another server.
    UseAnotherServer = 0x9C,
    /// 0x9D Server moved.
    ServerMoved = 0x9D,
    /// 0x9E Shared Subscriptions not supported.
    SharedSubscriptionsNotSupported = 0x9E,
    /// 0x9F Connection rate exceeded.
    ConnectionRateExceeded = 0x9F,
    /// 0xA0 Maximum connect time (DISCONNECT).
    MaximumConnectTime = 0xA0,
    /// 0xA1 Subscription Identifiers not supported.
    SubscriptionIdentifiersNotSupported = 0xA1,
    /// 0xA2 Wildcard Subscriptions not supported.
    WildcardSubscriptionsNotSupported = 0xA2,
}

/// Every reason code, in byte order (useful for tests and tables).
pub const ALL_REASON_CODES: [ReasonCode; 43] = {
    use ReasonCode::*;
    [
        Success,
        GrantedQoS1,
        GrantedQoS2,
        DisconnectWithWillMessage,
        NoMatchingSubscribers,
        NoSubscriptionExisted,
        ContinueAuthentication,
        ReAuthenticate,
        UnspecifiedError,
        MalformedPacket,
        ProtocolError,
        ImplementationSpecificError,
        UnsupportedProtocolVersion,
        ClientIdentifierNotValid,
        BadUserNameOrPassword,
        NotAuthorized,
        ServerUnavailable,
        ServerBusy,
        Banned,
        ServerShuttingDown,
        BadAuthenticationMethod,
        KeepAliveTimeout,
        SessionTakenOver,
        TopicFilterInvalid,
        TopicNameInvalid,
        PacketIdentifierInUse,
        PacketIdentifierNotFound,
        ReceiveMaximumExceeded,
        TopicAliasInvalid,
        PacketTooLarge,
        MessageRateTooHigh,
        QuotaExceeded,
        AdministrativeAction,
        PayloadFormatInvalid,
        RetainNotSupported,
        QoSNotSupported,
        UseAnotherServer,
        ServerMoved,
        SharedSubscriptionsNotSupported,
        ConnectionRateExceeded,
        MaximumConnectTime,
        SubscriptionIdentifiersNotSupported,
        WildcardSubscriptionsNotSupported,
    ]
};

impl ReasonCode {
    /// 0x00 in DISCONNECT.
    pub const NORMAL_DISCONNECTION: ReasonCode = ReasonCode::Success;
    /// 0x00 in SUBACK.
    pub const GRANTED_QOS_0: ReasonCode = ReasonCode::Success;

    /// The byte on the wire.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// The reason code with this byte value, if MQTT 5 defines one.
    pub fn from_u8(value: u8) -> Option<ReasonCode> {
        ALL_REASON_CODES
            .iter()
            .copied()
            .find(|c| c.as_u8() == value)
    }

    /// True for failure codes (0x80 and above, MQTT 5 §2.4).
    pub fn is_error(self) -> bool {
        self.as_u8() >= 0x80
    }

    /// Whether MQTT 5 allows this code in a packet of this type (the table of
    /// MQTT 5 §2.4). Packets without a reason code allow none.
    pub fn allowed_in(self, packet: PacketType) -> bool {
        use ReasonCode::*;
        match packet {
            PacketType::Connack => matches!(
                self,
                Success
                    | UnspecifiedError
                    | MalformedPacket
                    | ProtocolError
                    | ImplementationSpecificError
                    | UnsupportedProtocolVersion
                    | ClientIdentifierNotValid
                    | BadUserNameOrPassword
                    | NotAuthorized
                    | ServerUnavailable
                    | ServerBusy
                    | Banned
                    | BadAuthenticationMethod
                    | TopicNameInvalid
                    | PacketTooLarge
                    | QuotaExceeded
                    | PayloadFormatInvalid
                    | RetainNotSupported
                    | QoSNotSupported
                    | UseAnotherServer
                    | ServerMoved
                    | ConnectionRateExceeded
            ),
            PacketType::Puback | PacketType::Pubrec => matches!(
                self,
                Success
                    | NoMatchingSubscribers
                    | UnspecifiedError
                    | ImplementationSpecificError
                    | NotAuthorized
                    | TopicNameInvalid
                    | PacketIdentifierInUse
                    | QuotaExceeded
                    | PayloadFormatInvalid
            ),
            PacketType::Pubrel | PacketType::Pubcomp => {
                matches!(self, Success | PacketIdentifierNotFound)
            }
            PacketType::Suback => matches!(
                self,
                Success
                    | GrantedQoS1
                    | GrantedQoS2
                    | UnspecifiedError
                    | ImplementationSpecificError
                    | NotAuthorized
                    | TopicFilterInvalid
                    | PacketIdentifierInUse
                    | QuotaExceeded
                    | SharedSubscriptionsNotSupported
                    | SubscriptionIdentifiersNotSupported
                    | WildcardSubscriptionsNotSupported
            ),
            PacketType::Unsuback => matches!(
                self,
                Success
                    | NoSubscriptionExisted
                    | UnspecifiedError
                    | ImplementationSpecificError
                    | NotAuthorized
                    | TopicFilterInvalid
                    | PacketIdentifierInUse
            ),
            PacketType::Disconnect => matches!(
                self,
                Success
                    | DisconnectWithWillMessage
                    | UnspecifiedError
                    | MalformedPacket
                    | ProtocolError
                    | ImplementationSpecificError
                    | NotAuthorized
                    | ServerBusy
                    | ServerShuttingDown
                    | KeepAliveTimeout
                    | SessionTakenOver
                    | TopicFilterInvalid
                    | TopicNameInvalid
                    | ReceiveMaximumExceeded
                    | TopicAliasInvalid
                    | PacketTooLarge
                    | MessageRateTooHigh
                    | QuotaExceeded
                    | AdministrativeAction
                    | PayloadFormatInvalid
                    | RetainNotSupported
                    | QoSNotSupported
                    | UseAnotherServer
                    | ServerMoved
                    | SharedSubscriptionsNotSupported
                    | ConnectionRateExceeded
                    | MaximumConnectTime
                    | SubscriptionIdentifiersNotSupported
                    | WildcardSubscriptionsNotSupported
            ),
            PacketType::Auth => matches!(self, Success | ContinueAuthentication | ReAuthenticate),
            _ => false,
        }
    }

    /// The MQTT 3.x CONNACK return code for this reason (MQTT 3.1.1 §3.2.2.3).
    ///
    /// 3.x has six return codes; MQTT 5 codes without an equivalent map to the
    /// nearest one (MQTT 5 §3.2.2.2 lists the v5 meaning of each v3 code):
    /// authentication failures to 0x04 or 0x05, everything else to 0x03
    /// Server unavailable, which tells a 3.x client to retry later.
    pub fn to_connack_v3(self) -> u8 {
        use ReasonCode::*;
        match self {
            Success => 0x00,
            UnsupportedProtocolVersion => 0x01,
            ClientIdentifierNotValid => 0x02,
            BadUserNameOrPassword | BadAuthenticationMethod => 0x04,
            NotAuthorized | Banned => 0x05,
            _ => 0x03,
        }
    }

    /// The MQTT 5 reason code for an MQTT 3.x CONNACK return code, or `None`
    /// for the reserved values 6–255 (MQTT 3.1.1 §3.2.2.3).
    pub fn from_connack_v3(code: u8) -> Option<ReasonCode> {
        use ReasonCode::*;
        Some(match code {
            0x00 => Success,
            0x01 => UnsupportedProtocolVersion,
            0x02 => ClientIdentifierNotValid,
            0x03 => ServerUnavailable,
            0x04 => BadUserNameOrPassword,
            0x05 => NotAuthorized,
            _ => return None,
        })
    }
}

impl From<ReasonCode> for u8 {
    fn from(code: ReasonCode) -> u8 {
        code.as_u8()
    }
}

impl TryFrom<u8> for ReasonCode {
    type Error = u8;
    /// Fails with the byte itself when MQTT 5 defines no code for it.
    fn try_from(value: u8) -> Result<Self, u8> {
        ReasonCode::from_u8(value).ok_or(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_code_round_trips_through_its_byte() {
        for code in ALL_REASON_CODES {
            assert_eq!(ReasonCode::from_u8(code.as_u8()), Some(code));
        }
        assert_eq!(ReasonCode::from_u8(0x03), None);
        assert_eq!(ReasonCode::from_u8(0xFF), None);
    }

    #[test]
    fn reason_codes_are_listed_in_byte_order() {
        assert!(ALL_REASON_CODES.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn v3_connack_return_codes_map_both_ways() {
        for v3 in 0u8..=5 {
            let code = ReasonCode::from_connack_v3(v3).expect("0..=5 are defined");
            assert_eq!(code.to_connack_v3(), v3);
        }
        assert_eq!(ReasonCode::from_connack_v3(6), None);
        assert_eq!(ReasonCode::QuotaExceeded.to_connack_v3(), 0x03);
    }
}
