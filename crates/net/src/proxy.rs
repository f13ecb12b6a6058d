//! PROXY protocol v1 (text) and v2 (binary) headers: a sans-IO parser and the async reader
//! that applies it to a freshly accepted byte stream.
//!
//! A load balancer in front of a listener prepends one header to each connection, naming the
//! real client. The parser never asks for a byte past the header: [`parse`] returns how many
//! more bytes it needs at least, and reading exactly that many can never consume the first
//! byte of the MQTT or TLS data that follows. So no read-ahead buffer has to be handed on to
//! the next layer.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::NetError;

/// The 12-byte signature that opens every v2 header (PROXY protocol spec §2.2).
const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// v2: signature, version/command, family/protocol, 2-byte length.
const V2_FIXED_LEN: usize = 16;
/// The shortest v1 header, `PROXY UNKNOWN\r\n`; also fewer bytes than any v2 header, so a
/// first read of this many bytes never overshoots either version.
const V1_MIN_LEN: usize = 15;
/// The longest v1 header including CRLF (spec §2.1: "107 characters").
pub const V1_MAX_LEN: usize = 107;

/// Why a PROXY header was refused. Each is the peer's (or its proxy's) fault and ends only
/// that connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The first bytes are neither `PROXY ` nor the v2 signature.
    #[error("not a PROXY protocol header")]
    NotProxy,
    /// A v1 line has no CRLF within 107 bytes, or a v2 header is longer than allowed.
    #[error("PROXY header longer than {max} bytes")]
    TooLong {
        /// The cap that was exceeded.
        max: usize,
    },
    /// A v1 line is malformed (unknown protocol, bad address or port, wrong field count).
    #[error("malformed PROXY v1 header: {what}")]
    V1 {
        /// Which part was wrong.
        what: &'static str,
    },
    /// A v2 header has an unknown version or command, or an address block shorter than its
    /// family requires.
    #[error("malformed PROXY v2 header: {what}")]
    V2 {
        /// Which part was wrong.
        what: &'static str,
    },
}

/// What a PROXY header says about the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyHeader {
    /// Protocol version, 1 or 2.
    pub version: u8,
    /// The real client's address; `None` for v1 `UNKNOWN`, a v2 `LOCAL` command (a health
    /// check by the proxy itself) or an address family without IP addresses (AF_UNIX,
    /// AF_UNSPEC). Callers then use the socket's own peer address.
    pub source: Option<SocketAddr>,
    /// The address the client connected to at the proxy, when known.
    pub destination: Option<SocketAddr>,
}

/// The outcome of [`parse`] on the bytes received so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyParse {
    /// More bytes are needed: read up to `needed` more (at least 1) and call again with all
    /// bytes so far. Reading that many never goes past the end of the header.
    Incomplete {
        /// How many more bytes to read.
        needed: usize,
    },
    /// A complete header occupying the first `len` bytes of the input.
    Complete {
        /// The parsed header.
        header: ProxyHeader,
        /// Its length in bytes, CRLF or TLVs included.
        len: usize,
    },
}

/// Parses a PROXY v1 or v2 header at the start of `buf`.
///
/// `v2_len_max` caps the whole v2 header (16 fixed bytes, addresses and TLVs); it must be
/// at least 16 + 216 to admit every address family. v1 is capped by the spec at 107 bytes.
/// TLVs are skipped, not interpreted.
///
/// # Errors
/// A [`ProxyError`] as soon as the bytes seen cannot start a valid header: garbage is refused
/// on its first bytes rather than after a timeout.
pub fn parse(buf: &[u8], v2_len_max: usize) -> Result<ProxyParse, ProxyError> {
    let n = buf.len();
    if n == 0 {
        return Ok(ProxyParse::Incomplete { needed: V1_MIN_LEN });
    }
    // The first byte already tells the versions apart ('P' against '\r').
    if buf[..n.min(6)] == b"PROXY "[..n.min(6)] {
        if n < V1_MIN_LEN {
            return Ok(ProxyParse::Incomplete {
                needed: V1_MIN_LEN - n,
            });
        }
        return parse_v1(buf);
    }
    if buf[..n.min(12)] == V2_SIGNATURE[..n.min(12)] {
        return parse_v2(buf, v2_len_max);
    }
    Err(ProxyError::NotProxy)
}

fn parse_v1(buf: &[u8]) -> Result<ProxyParse, ProxyError> {
    let window = &buf[..buf.len().min(V1_MAX_LEN)];
    let Some(cr) = window.windows(2).position(|w| w == b"\r\n") else {
        if buf.len() >= V1_MAX_LEN {
            return Err(ProxyError::TooLong { max: V1_MAX_LEN });
        }
        // The line ends with CRLF: after a trailing CR one byte may finish it, otherwise at
        // least two are still to come. Never more, so we never read past the header.
        let needed = if buf.last() == Some(&b'\r') { 1 } else { 2 };
        return Ok(ProxyParse::Incomplete {
            needed: needed.min(V1_MAX_LEN - buf.len()),
        });
    };
    let line = std::str::from_utf8(&buf[..cr]).map_err(|_| ProxyError::V1 { what: "not ASCII" })?;
    let len = cr + 2;
    let mut fields = line.split(' ');
    // `parse` dispatched here on the "PROXY " prefix.
    let _proxy = fields.next();
    let family = fields.next().ok_or(ProxyError::V1 { what: "protocol" })?;
    let want_v6 = match family {
        "TCP4" => false,
        "TCP6" => true,
        // Spec §2.1: after UNKNOWN the rest of the line is ignored.
        "UNKNOWN" => {
            return Ok(ProxyParse::Complete {
                header: ProxyHeader {
                    version: 1,
                    source: None,
                    destination: None,
                },
                len,
            })
        }
        _ => return Err(ProxyError::V1 { what: "protocol" }),
    };
    let mut next = |what| fields.next().ok_or(ProxyError::V1 { what });
    let src_ip = v1_ip(next("source address")?, want_v6)?;
    let dst_ip = v1_ip(next("destination address")?, want_v6)?;
    let src_port = v1_port(next("source port")?)?;
    let dst_port = v1_port(next("destination port")?)?;
    if fields.next().is_some() {
        return Err(ProxyError::V1 {
            what: "trailing fields",
        });
    }
    Ok(ProxyParse::Complete {
        header: ProxyHeader {
            version: 1,
            source: Some(SocketAddr::new(src_ip, src_port)),
            destination: Some(SocketAddr::new(dst_ip, dst_port)),
        },
        len,
    })
}

fn v1_ip(text: &str, want_v6: bool) -> Result<IpAddr, ProxyError> {
    let bad = ProxyError::V1 { what: "address" };
    if want_v6 {
        text.parse::<Ipv6Addr>().map(IpAddr::V6).map_err(|_| bad)
    } else {
        text.parse::<Ipv4Addr>().map(IpAddr::V4).map_err(|_| bad)
    }
}

fn v1_port(text: &str) -> Result<u16, ProxyError> {
    // u16::from_str would accept a leading '+'; the spec allows digits only.
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ProxyError::V1 { what: "port" });
    }
    text.parse().map_err(|_| ProxyError::V1 { what: "port" })
}

fn parse_v2(buf: &[u8], v2_len_max: usize) -> Result<ProxyParse, ProxyError> {
    if buf.len() < V2_FIXED_LEN {
        return Ok(ProxyParse::Incomplete {
            needed: V2_FIXED_LEN - buf.len(),
        });
    }
    let ver_cmd = buf[12];
    let fam = buf[13];
    let body_len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    let total = V2_FIXED_LEN + body_len;
    if ver_cmd >> 4 != 2 {
        return Err(ProxyError::V2 { what: "version" });
    }
    let local = match ver_cmd & 0x0f {
        0 => true,
        1 => false,
        _ => return Err(ProxyError::V2 { what: "command" }),
    };
    if total > v2_len_max {
        return Err(ProxyError::TooLong { max: v2_len_max });
    }
    if buf.len() < total {
        return Ok(ProxyParse::Incomplete {
            needed: total - buf.len(),
        });
    }
    let body = &buf[V2_FIXED_LEN..total];
    // High nibble: address family; low nibble: transport (1 stream, 2 datagram).
    let (source, destination) = match (local, fam >> 4) {
        // LOCAL: the proxy's own connection; the address block, if any, is ignored (§2.2).
        (true, _) | (false, 0) => (None, None),
        (false, 1) => {
            let a = body.get(..12).ok_or(ProxyError::V2 {
                what: "IPv4 address block too short",
            })?;
            let ip = |o: usize| IpAddr::V4(Ipv4Addr::new(a[o], a[o + 1], a[o + 2], a[o + 3]));
            let port = |o: usize| u16::from_be_bytes([a[o], a[o + 1]]);
            (
                Some(SocketAddr::new(ip(0), port(8))),
                Some(SocketAddr::new(ip(4), port(10))),
            )
        }
        (false, 2) => {
            let a = body.get(..36).ok_or(ProxyError::V2 {
                what: "IPv6 address block too short",
            })?;
            let ip = |o: usize| {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&a[o..o + 16]);
                IpAddr::V6(Ipv6Addr::from(octets))
            };
            let port = |o: usize| u16::from_be_bytes([a[o], a[o + 1]]);
            (
                Some(SocketAddr::new(ip(0), port(32))),
                Some(SocketAddr::new(ip(16), port(34))),
            )
        }
        (false, 3) => {
            if body.len() < 216 {
                return Err(ProxyError::V2 {
                    what: "unix address block too short",
                });
            }
            (None, None)
        }
        (false, _) => return Err(ProxyError::V2 { what: "family" }),
    };
    Ok(ProxyParse::Complete {
        header: ProxyHeader {
            version: 2,
            source,
            destination,
        },
        len: total,
    })
}

/// Per-listener PROXY protocol settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyProtocol {
    /// Cap on a v2 header, TLVs included (v1 is capped at 107 bytes by the spec).
    pub v2_len_max: usize,
    /// The whole header must arrive within this time (it also counts against the listener's
    /// handshake timeout).
    pub timeout: Duration,
}

impl Default for ProxyProtocol {
    fn default() -> Self {
        Self {
            // Addresses (at most 216 bytes, AF_UNIX) plus room for the usual TLVs (ALPN,
            // authority, unique id, SSL info); a proxy sending more is misconfigured.
            v2_len_max: 1024,
            // A proxy writes the header with the first segment; seconds mean something is wrong.
            timeout: Duration::from_secs(5),
        }
    }
}

/// Reads one PROXY header from the start of `io`, consuming exactly its bytes.
///
/// `peer` names the connection in errors.
///
/// # Errors
/// [`NetError::ProxyHeader`] for a malformed or oversized header, [`NetError::ProxyIo`] if
/// the stream fails or ends first, [`NetError::HandshakeTimeout`] after `settings.timeout`.
pub(crate) async fn read_header<S: AsyncRead + Unpin>(
    io: &mut S,
    settings: &ProxyProtocol,
    peer: SocketAddr,
) -> Result<ProxyHeader, NetError> {
    let read = async {
        let mut buf = Vec::with_capacity(V1_MIN_LEN);
        loop {
            match parse(&buf, settings.v2_len_max) {
                Ok(ProxyParse::Complete { header, len }) => {
                    debug_assert_eq!(len, buf.len(), "parse asked for bytes past the header");
                    return Ok(header);
                }
                Ok(ProxyParse::Incomplete { needed }) => {
                    // Take whatever has arrived, up to `needed`: garbage shorter than a
                    // header is refused on its first bytes instead of waiting for more.
                    let at = buf.len();
                    buf.resize(at + needed, 0);
                    let n = io
                        .read(&mut buf[at..])
                        .await
                        .map_err(|source| NetError::ProxyIo { peer, source })?;
                    if n == 0 {
                        return Err(NetError::ProxyIo {
                            peer,
                            source: std::io::ErrorKind::UnexpectedEof.into(),
                        });
                    }
                    buf.truncate(at + n);
                }
                Err(source) => return Err(NetError::ProxyHeader { peer, source }),
            }
        }
    };
    tokio::time::timeout(settings.timeout, read)
        .await
        .map_err(|_| NetError::HandshakeTimeout {
            peer,
            after: settings.timeout,
        })?
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: usize = 1024;

    /// Encodes a v2 PROXY header for TCP over IPv4 or IPv6 with `tlv_len` bytes of TLVs.
    pub(crate) fn v2_header(src: SocketAddr, dst: SocketAddr, tlv_len: usize) -> Vec<u8> {
        let mut out = V2_SIGNATURE.to_vec();
        out.push(0x21); // version 2, PROXY
        let mut body = Vec::new();
        match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                out.push(0x11);
                body.extend_from_slice(&s.octets());
                body.extend_from_slice(&d.octets());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                out.push(0x21);
                body.extend_from_slice(&s.octets());
                body.extend_from_slice(&d.octets());
            }
            _ => panic!("mixed families"),
        }
        body.extend_from_slice(&src.port().to_be_bytes());
        body.extend_from_slice(&dst.port().to_be_bytes());
        body.resize(body.len() + tlv_len, 0);
        out.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Drives `parse` as the async reader does, from `stream`; returns the header and how
    /// many bytes of `stream` were consumed.
    fn feed(stream: &[u8]) -> Result<(ProxyHeader, usize), ProxyError> {
        feed_in_chunks(stream, usize::MAX)
    }

    /// As `feed`, with reads returning at most `chunk` bytes (short reads).
    fn feed_in_chunks(stream: &[u8], chunk: usize) -> Result<(ProxyHeader, usize), ProxyError> {
        let mut seen = 0usize;
        loop {
            match parse(&stream[..seen], MAX)? {
                ProxyParse::Complete { header, len } => {
                    assert_eq!(len, seen);
                    return Ok((header, len));
                }
                ProxyParse::Incomplete { needed } => {
                    assert!(needed >= 1);
                    assert!(seen + needed <= stream.len(), "ran out of input");
                    seen += needed.min(chunk);
                }
            }
        }
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn v1_tcp4_header_gives_source_and_destination() {
        let mut stream = b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 1883\r\n".to_vec();
        let header_len = stream.len();
        stream.extend_from_slice(b"\x10\x0c\x00\x04MQTT");
        let (h, len) = feed(&stream).unwrap();
        assert_eq!(len, header_len);
        assert_eq!(h.version, 1);
        assert_eq!(h.source, Some(sa("192.0.2.7:56324")));
        assert_eq!(h.destination, Some(sa("198.51.100.1:1883")));
    }

    #[test]
    fn v1_tcp6_and_unknown_headers_parse() {
        let (h, _) = feed(b"PROXY TCP6 2001:db8::1 2001:db8::2 4000 8883\r\n").unwrap();
        assert_eq!(h.source, Some(sa("[2001:db8::1]:4000")));
        let (h, len) = feed(b"PROXY UNKNOWN\r\nMQTT").unwrap();
        assert_eq!((h.source, len), (None, 15));
        let (h, _) = feed(b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n").unwrap();
        assert_eq!(h.source, None);
    }

    #[test]
    fn v1_malformed_lines_are_refused() {
        for bad in [
            &b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n"[..],
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 1 99999\r\n",
            b"PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n",
            b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n",
            b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n",
        ] {
            assert!(
                matches!(feed(bad), Err(ProxyError::V1 { .. })),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn v1_line_without_crlf_is_refused_at_107_bytes() {
        let mut line = b"PROXY TCP4 ".to_vec();
        line.resize(200, b'1');
        assert_eq!(feed(&line), Err(ProxyError::TooLong { max: V1_MAX_LEN }));
    }

    #[test]
    fn v2_ipv4_and_ipv6_headers_with_tlvs_give_the_source() {
        let h4 = v2_header(sa("203.0.113.9:40000"), sa("10.0.0.1:8883"), 7);
        let (h, len) = feed(&[&h4[..], b"\x16\x03\x01"].concat()).unwrap();
        assert_eq!(len, h4.len());
        assert_eq!(h.version, 2);
        assert_eq!(h.source, Some(sa("203.0.113.9:40000")));
        assert_eq!(h.destination, Some(sa("10.0.0.1:8883")));
        let h6 = v2_header(sa("[2001:db8::9]:1"), sa("[2001:db8::1]:2"), 0);
        assert_eq!(feed(&h6).unwrap().0.source, Some(sa("[2001:db8::9]:1")));
    }

    #[test]
    fn v2_local_command_has_no_source() {
        let mut h = v2_header(sa("1.2.3.4:5"), sa("6.7.8.9:10"), 0);
        h[12] = 0x20;
        assert_eq!(feed(&h).unwrap().0.source, None);
    }

    #[test]
    fn v2_bad_version_command_family_or_length_are_refused() {
        let good = v2_header(sa("1.2.3.4:5"), sa("6.7.8.9:10"), 0);
        let mut bad = good.clone();
        bad[12] = 0x11;
        assert_eq!(feed(&bad), Err(ProxyError::V2 { what: "version" }));
        let mut bad = good.clone();
        bad[12] = 0x22;
        assert_eq!(feed(&bad), Err(ProxyError::V2 { what: "command" }));
        let mut bad = good.clone();
        bad[13] = 0x41;
        assert_eq!(feed(&bad), Err(ProxyError::V2 { what: "family" }));
        let mut bad = good.clone();
        bad[15] = 4; // 4-byte body: too short for IPv4 addresses
        bad.truncate(20);
        assert!(matches!(feed(&bad), Err(ProxyError::V2 { .. })));
        let long = v2_header(sa("1.2.3.4:5"), sa("6.7.8.9:10"), MAX);
        assert_eq!(feed(&long), Err(ProxyError::TooLong { max: MAX }));
    }

    #[test]
    fn garbage_is_refused_on_its_first_byte() {
        assert_eq!(parse(b"\x10", MAX), Err(ProxyError::NotProxy));
        assert_eq!(parse(b"GET / HTTP/1.1", MAX), Err(ProxyError::NotProxy));
        assert_eq!(
            parse(b"", MAX),
            Ok(ProxyParse::Incomplete { needed: V1_MIN_LEN })
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_and_never_ask_past_the_cap(
            bytes in proptest::collection::vec(any::<u8>(), 0..300),
            v1 in any::<bool>(),
            v2 in any::<bool>(),
        ) {
            // Steer a share of the inputs past the signature checks.
            let mut input = bytes;
            if v1 { input.splice(0..0, b"PROXY ".iter().copied()); }
            else if v2 { input.splice(0..0, V2_SIGNATURE.iter().copied()); }
            for end in 0..=input.len() {
                match parse(&input[..end], MAX) {
                    Ok(ProxyParse::Incomplete { needed }) => {
                        prop_assert!(needed >= 1);
                        prop_assert!(end + needed <= MAX.max(V1_MAX_LEN));
                    }
                    Ok(ProxyParse::Complete { len, .. }) => prop_assert!(len <= end),
                    Err(_) => {}
                }
            }
        }

        #[test]
        fn encoded_v2_headers_consume_exactly_their_bytes(
            a in any::<[u8; 4]>(), b in any::<[u8; 4]>(), p in any::<u16>(), q in any::<u16>(),
            tlv in 0usize..200, tail in proptest::collection::vec(any::<u8>(), 0..50),
            chunk in 1usize..40,
        ) {
            let src = SocketAddr::new(IpAddr::from(a), p);
            let dst = SocketAddr::new(IpAddr::from(b), q);
            let header = v2_header(src, dst, tlv);
            let (h, len) = feed_in_chunks(&[&header[..], &tail[..]].concat(), chunk).unwrap();
            prop_assert_eq!(len, header.len());
            prop_assert_eq!(h.source, Some(src));
        }

        #[test]
        fn formatted_v1_headers_consume_exactly_their_bytes(
            a in any::<[u8; 4]>(), b in any::<[u8; 4]>(), p in any::<u16>(), q in any::<u16>(),
            tail in proptest::collection::vec(any::<u8>(), 0..50),
            chunk in 1usize..40,
        ) {
            let (sa, sb) = (Ipv4Addr::from(a), Ipv4Addr::from(b));
            let header = format!("PROXY TCP4 {sa} {sb} {p} {q}\r\n").into_bytes();
            let (h, len) = feed_in_chunks(&[&header[..], &tail[..]].concat(), chunk).unwrap();
            prop_assert_eq!(len, header.len());
            prop_assert_eq!(h.source, Some(SocketAddr::new(IpAddr::V4(sa), p)));
        }
    }
}
