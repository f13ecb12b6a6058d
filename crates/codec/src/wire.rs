//! Wire primitives (MQTT 5 §1.5): integers, variable byte integers, strings,
//! binary data, and the topic name / topic filter rules (MQTT 5 §4.7).

use bytes::{BufMut, Bytes, BytesMut};

use crate::Error;

/// The largest value a variable byte integer can carry (MQTT 5 §1.5.5).
pub const VAR_INT_MAX: u32 = 268_435_455;

/// Strings and binary data carry a two-byte length (MQTT 5 §1.5.4, §1.5.6).
const FIELD_LEN_MAX: usize = u16::MAX as usize;

/// Outcome of reading a variable byte integer from a possibly partial buffer.
pub(crate) enum VarInt {
    /// The value and how many bytes encode it.
    Complete(u32, usize),
    /// The buffer ends inside the integer.
    Incomplete,
}

/// Reads a variable byte integer from the start of `buf` (MQTT 5 §1.5.5).
///
/// Refuses a fifth byte and non-minimal encodings: the spec requires the
/// minimum number of bytes, and a sender using more is either broken or
/// probing parsers, so we treat it as malformed.
pub(crate) fn read_var_int(buf: &[u8]) -> Result<VarInt, Error> {
    let mut value: u32 = 0;
    for i in 0..4 {
        let Some(&byte) = buf.get(i) else {
            return Ok(VarInt::Incomplete);
        };
        value |= u32::from(byte & 0x7F) << (7 * i);
        if byte & 0x80 == 0 {
            // A last byte of zero after a continuation byte adds nothing: the
            // same value fits in fewer bytes.
            if i > 0 && byte == 0 {
                return Err(Error::VarIntNonMinimal);
            }
            return Ok(VarInt::Complete(value, i + 1));
        }
    }
    Err(Error::VarIntTooLong)
}

/// How many bytes the variable byte integer encoding of `value` takes.
pub(crate) fn var_int_len(value: u32) -> usize {
    match value {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// Writes `value` as a minimal variable byte integer.
pub(crate) fn put_var_int(dst: &mut BytesMut, value: u32) -> Result<(), Error> {
    if value > VAR_INT_MAX {
        return Err(Error::VarIntOutOfRange { value });
    }
    let mut v = value;
    loop {
        let mut byte = (v & 0x7F) as u8;
        v >>= 7;
        if v > 0 {
            byte |= 0x80;
        }
        dst.put_u8(byte);
        if v == 0 {
            return Ok(());
        }
    }
}

/// Writes into `dst` whatever `body` writes, preceded by its length as a
/// variable byte integer; `extra` bytes that the caller appends afterwards
/// (a payload) count in the length. On error `dst` is restored.
///
/// One code path both measures and writes, so a length can never disagree
/// with what follows it. The cost is one `copy_within` of the body (never of
/// a payload) when the length takes fewer than four bytes.
pub(crate) fn put_with_len<F>(dst: &mut BytesMut, extra: usize, body: F) -> Result<usize, Error>
where
    F: FnOnce(&mut BytesMut) -> Result<(), Error>,
{
    let start = dst.len();
    dst.put_slice(&[0; 4]);
    let body_start = dst.len();
    if let Err(e) = body(dst) {
        dst.truncate(start);
        return Err(e);
    }
    let body_len = dst.len() - body_start;
    let total = body_len as u64 + extra as u64;
    let Ok(total) = u32::try_from(total) else {
        dst.truncate(start);
        return Err(Error::VarIntOutOfRange { value: u32::MAX });
    };
    if total > VAR_INT_MAX {
        dst.truncate(start);
        return Err(Error::VarIntOutOfRange { value: total });
    }
    let n = var_int_len(total);
    // Written in place over the placeholder; `total` <= VAR_INT_MAX was checked.
    let mut v = total;
    for slot in &mut dst[start..start + n] {
        *slot = (v & 0x7F) as u8 | if v > 0x7F { 0x80 } else { 0 };
        v >>= 7;
    }
    dst.copy_within(body_start..body_start + body_len, start + n);
    dst.truncate(start + n + body_len);
    Ok(n + body_len)
}

/// Writes a two-byte-length-prefixed UTF-8 string after checking it.
pub(crate) fn put_str(dst: &mut BytesMut, s: &str) -> Result<(), Error> {
    check_str(s)?;
    put_binary(dst, s.as_bytes())
}

/// Writes two-byte-length-prefixed binary data.
pub(crate) fn put_binary(dst: &mut BytesMut, b: &[u8]) -> Result<(), Error> {
    let len = u16::try_from(b.len()).map_err(|_| Error::FieldTooLong { len: b.len() })?;
    dst.put_u16(len);
    dst.put_slice(b);
    Ok(())
}

/// Checks the code points of an MQTT UTF-8 string (MQTT 5 §1.5.4).
///
/// U+0000 MUST NOT appear; control characters (U+0001–U+001F,
/// U+007F–U+009F) and non-characters SHOULD NOT, and a receiver MAY treat
/// them as malformed. We refuse all of them, as mosquitto does, so nothing
/// downstream (logs, topic trie, bridges) ever sees them. Surrogates cannot
/// occur in a Rust `str`, and `from_utf8` refuses their encodings.
pub(crate) fn check_str(s: &str) -> Result<(), Error> {
    if s.len() > FIELD_LEN_MAX {
        return Err(Error::FieldTooLong { len: s.len() });
    }
    // Fast path: printable ASCII is the overwhelming majority of topics.
    if s.bytes().all(|b| (0x20..0x7F).contains(&b)) {
        return Ok(());
    }
    match s.chars().find(|&c| is_disallowed(c)) {
        Some(c) => Err(Error::DisallowedCodePoint {
            code_point: u32::from(c),
        }),
        None => Ok(()),
    }
}

fn is_disallowed(c: char) -> bool {
    let cp = u32::from(c);
    cp <= 0x1F
        || (0x7F..=0x9F).contains(&cp)
        || (0xFDD0..=0xFDEF).contains(&cp)
        || (cp & 0xFFFE) == 0xFFFE
}

/// A topic name: not empty unless `empty_ok` (a 5.0 PUBLISH with a Topic
/// Alias, MQTT 5 §3.3.2.1), and no wildcards (MQTT 5 §3.3.2.1, §4.7.1).
pub(crate) fn check_topic_name(topic: &str, empty_ok: bool) -> Result<(), Error> {
    // Fast path, one pass: printable ASCII without wildcards (every PUBLISH header a broker
    // encodes, once per subscriber, comes through here).
    if topic.len() <= FIELD_LEN_MAX
        && !topic.is_empty()
        && topic
            .bytes()
            .all(|b| (0x20..0x7F).contains(&b) && b != b'+' && b != b'#')
    {
        return Ok(());
    }
    check_str(topic)?;
    if topic.is_empty() && !empty_ok {
        return Err(Error::TopicNameEmpty);
    }
    if topic.contains(['+', '#']) {
        return Err(Error::TopicNameWildcard);
    }
    Ok(())
}

/// A topic filter (MQTT 5 §4.7): not empty, `#` only as a whole last level,
/// `+` only as a whole level; a shared subscription `$share/{name}/{filter}`
/// needs a non-empty name without wildcards or `/` and a valid filter
/// (MQTT 5 §4.8.2). Returns whether the filter is a shared subscription.
pub(crate) fn check_topic_filter(filter: &str) -> Result<bool, Error> {
    check_str(filter)?;
    if filter.is_empty() {
        return Err(Error::TopicFilterEmpty);
    }
    let (shared, inner) = match filter.strip_prefix("$share/") {
        Some(rest) => {
            let (name, inner) = rest
                .split_once('/')
                .ok_or(Error::SharedSubscriptionInvalid)?;
            if name.is_empty() || name.contains(['+', '#']) || inner.is_empty() {
                return Err(Error::SharedSubscriptionInvalid);
            }
            (true, inner)
        }
        None => (false, filter),
    };
    let mut levels = inner.split('/').peekable();
    while let Some(level) = levels.next() {
        let last = levels.peek().is_none();
        match level {
            "#" if last => {}
            "+" => {}
            _ if level.contains(['+', '#']) => return Err(Error::TopicFilterWildcardMisplaced),
            _ => {}
        }
    }
    Ok(shared)
}

/// A cursor over one complete packet body. Every read checks bounds and
/// fails with [`Error::UnexpectedEndOfPacket`]; binary reads slice the
/// shared frame without copying.
pub(crate) struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    pub(crate) fn new(buf: Bytes) -> Reader {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// Fails with `TrailingBytes` unless everything was read (the declared
    /// remaining length must match the fields exactly, MQTT 5 §2.1.4).
    pub(crate) fn finish(&self) -> Result<(), Error> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(Error::TrailingBytes { count }),
        }
    }

    pub(crate) fn u8(&mut self) -> Result<u8, Error> {
        let b = *self.buf.get(self.pos).ok_or(Error::UnexpectedEndOfPacket)?;
        self.pos += 1;
        Ok(b)
    }

    pub(crate) fn u16(&mut self) -> Result<u16, Error> {
        let hi = self.u8()?;
        let lo = self.u8()?;
        Ok(u16::from_be_bytes([hi, lo]))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, Error> {
        let b = self.take(4)?;
        let mut a = [0u8; 4];
        a.copy_from_slice(&b);
        Ok(u32::from_be_bytes(a))
    }

    pub(crate) fn var_int(&mut self) -> Result<u32, Error> {
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        match read_var_int(rest)? {
            VarInt::Complete(v, n) => {
                self.pos += n;
                Ok(v)
            }
            VarInt::Incomplete => Err(Error::UnexpectedEndOfPacket),
        }
    }

    /// The next `n` bytes, shared with the frame.
    pub(crate) fn take(&mut self, n: usize) -> Result<Bytes, Error> {
        if n > self.remaining() {
            return Err(Error::UnexpectedEndOfPacket);
        }
        let b = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(b)
    }

    /// Everything not read yet.
    pub(crate) fn rest(&mut self) -> Bytes {
        let b = self.buf.slice(self.pos..);
        self.pos = self.buf.len();
        b
    }

    /// Two-byte-length-prefixed binary data (MQTT 5 §1.5.6).
    pub(crate) fn binary(&mut self) -> Result<Bytes, Error> {
        let len = self.u16()?;
        self.take(usize::from(len))
    }

    /// A checked UTF-8 string (MQTT 5 §1.5.4).
    pub(crate) fn string(&mut self) -> Result<String, Error> {
        let b = self.binary()?;
        let s = std::str::from_utf8(&b).map_err(|_| Error::InvalidUtf8)?;
        check_str(s)?;
        Ok(s.to_owned())
    }

    /// A view of `n` bytes as its own reader (property lists).
    pub(crate) fn sub(&mut self, n: usize) -> Result<Reader, Error> {
        Ok(Reader::new(self.take(n)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var_int_bytes(v: u32) -> Vec<u8> {
        let mut b = BytesMut::new();
        put_var_int(&mut b, v).expect("in range");
        b.to_vec()
    }

    #[test]
    fn var_int_boundaries_encode_minimally() {
        for (v, n) in [
            (0, 1),
            (127, 1),
            (128, 2),
            (16_383, 2),
            (16_384, 3),
            (2_097_151, 3),
            (2_097_152, 4),
            (VAR_INT_MAX, 4),
        ] {
            let b = var_int_bytes(v);
            assert_eq!(b.len(), n, "{v}");
            assert_eq!(var_int_len(v), n);
            match read_var_int(&b) {
                Ok(VarInt::Complete(got, len)) => assert_eq!((got, len), (v, n)),
                _ => panic!("{v} did not decode"),
            }
        }
    }

    #[test]
    fn var_int_over_four_bytes_is_rejected() {
        assert!(matches!(
            read_var_int(&[0xFF, 0xFF, 0xFF, 0xFF, 0x7F]),
            Err(Error::VarIntTooLong)
        ));
    }

    #[test]
    fn var_int_non_minimal_encoding_is_rejected() {
        assert!(matches!(
            read_var_int(&[0x80, 0x00]),
            Err(Error::VarIntNonMinimal)
        ));
        assert!(matches!(
            read_var_int(&[0xFF, 0x80, 0x00]),
            Err(Error::VarIntNonMinimal)
        ));
    }

    #[test]
    fn var_int_above_maximum_is_not_encoded() {
        let mut b = BytesMut::new();
        assert!(put_var_int(&mut b, VAR_INT_MAX + 1).is_err());
    }

    #[test]
    fn topic_filter_rules() {
        for ok in [
            "a",
            "#",
            "+",
            "a/#",
            "a/+/b",
            "+/+",
            "/",
            "$share/g/a/#",
            "$share/g/#",
            "$sharex/#",
        ] {
            assert!(check_topic_filter(ok).is_ok(), "{ok}");
        }
        for bad in ["a#", "a/#/b", "#/a", "a+", "a/b+/c", "+a"] {
            assert_eq!(
                check_topic_filter(bad),
                Err(Error::TopicFilterWildcardMisplaced),
                "{bad}"
            );
        }
        for bad in [
            "$share/",
            "$share//a",
            "$share/g",
            "$share/g/",
            "$share/g+/a",
        ] {
            assert_eq!(
                check_topic_filter(bad),
                Err(Error::SharedSubscriptionInvalid),
                "{bad}"
            );
        }
        assert_eq!(check_topic_filter(""), Err(Error::TopicFilterEmpty));
    }

    #[test]
    fn disallowed_code_points_are_refused() {
        for bad in [
            "a\0b",
            "\u{1}",
            "\u{7F}",
            "\u{9F}",
            "\u{FDD0}",
            "\u{FFFF}",
            "\u{1FFFE}",
        ] {
            assert!(
                matches!(check_str(bad), Err(Error::DisallowedCodePoint { .. })),
                "{bad:?}"
            );
        }
        assert!(check_str("héllo/wörld/€/😀").is_ok());
    }
}
