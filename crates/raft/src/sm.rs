//! The application's state machine, and the layer under it that makes retried proposals
//! take effect once.

use std::collections::BTreeMap;
use std::future::Future;

use crate::error::{Error, RequestError, Result};

/// The replicated application state.
///
/// `apply` must be deterministic: the same commands in the same order give the same state
/// and outputs on every replica. So: no clock, no randomness, no timeouts, no I/O whose
/// outcome can differ between replicas, and it never refuses or skips a command (an
/// application-level error is an output like any other).
pub trait StateMachine: Send + 'static {
    /// Applies the committed command at log `index` and returns its output.
    fn apply(&mut self, index: u64, command: &[u8]) -> Vec<u8>;

    /// Answers a read against the current state. Async so that a state machine may read
    /// from its own storage; it must not change the state.
    fn query(&self, query: &[u8]) -> impl Future<Output = Vec<u8>> + Send;

    /// Serializes the whole state.
    fn snapshot(&self) -> Vec<u8>;

    /// Replaces the whole state with one produced by `snapshot`.
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String>;
}

/// Identity of a proposal: a client and its sequence number. A client has at most one
/// request outstanding and numbers them upwards; retrying keeps the same id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId {
    pub client_id: u64,
    pub seq: u64,
}

const COMMAND_V1: u8 = 1;

/// Encodes a proposal's entry data: `[1][client_id][seq][command]`.
pub(crate) fn encode_command(id: RequestId, command: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(17 + command.len());
    out.push(COMMAND_V1);
    out.extend_from_slice(&id.client_id.to_le_bytes());
    out.extend_from_slice(&id.seq.to_le_bytes());
    out.extend_from_slice(command);
    out
}

pub(crate) fn decode_command(data: &[u8]) -> Result<(RequestId, &[u8])> {
    if data.len() < 17 || data[0] != COMMAND_V1 {
        return Err(Error::Malformed { what: "command" });
    }
    let client_id = u64::from_le_bytes(data[1..9].try_into().expect("8 bytes"));
    let seq = u64::from_le_bytes(data[9..17].try_into().expect("8 bytes"));
    Ok((RequestId { client_id, seq }, &data[17..]))
}

/// The last request applied for each client and its output, so that a retry returns the
/// first answer instead of applying again. Part of every snapshot, so it is replicated state.
///
/// Bounded: past [`DEDUP_CLIENTS_MAX`] clients, the one whose last request is oldest (by log
/// index) is forgotten. Every replica applies the same entries in the same order, so every
/// replica forgets the same client. A forgotten client's late retry would apply again; it
/// would have to stay silent while that many other clients proposed, and clients retry
/// within seconds.
#[derive(Default, Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dedup {
    /// client → (last seq, its output, log index it was applied at)
    last: BTreeMap<u64, (u64, Vec<u8>, u64)>,
    /// log index → client, to find the least recently active client
    by_index: BTreeMap<u64, u64>,
}

/// Clients remembered for deduplication.
pub(crate) const DEDUP_CLIENTS_MAX: usize = 65_536;

impl Dedup {
    /// Applies `command` once per request id, through `sm`.
    pub(crate) fn apply<S: StateMachine>(
        &mut self,
        sm: &mut S,
        index: u64,
        id: RequestId,
        command: &[u8],
    ) -> Result<Vec<u8>, RequestError> {
        match self.last.get(&id.client_id) {
            Some((seq, out, _)) if *seq == id.seq => return Ok(out.clone()),
            Some((seq, _, _)) if *seq > id.seq => {
                return Err(RequestError::Superseded {
                    client_id: id.client_id,
                    seq: id.seq,
                })
            }
            _ => {}
        }
        let out = sm.apply(index, command);
        self.remember(id.client_id, id.seq, out.clone(), index);
        Ok(out)
    }

    fn remember(&mut self, client: u64, seq: u64, out: Vec<u8>, index: u64) {
        if let Some((_, _, old_index)) = self.last.insert(client, (seq, out, index)) {
            self.by_index.remove(&old_index);
        }
        self.by_index.insert(index, client);
        while self.last.len() > DEDUP_CLIENTS_MAX {
            let Some((_, oldest)) = self.by_index.pop_first() else {
                break;
            };
            self.last.remove(&oldest);
        }
        debug_assert_eq!(self.last.len(), self.by_index.len());
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.last.len()
    }

    /// `[clients u64][client u64, seq u64, index u64, len u32, output]*` followed by the state machine's
    /// own snapshot.
    pub(crate) fn encode_snapshot(&self, sm_snapshot: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(self.last.len() as u64).to_le_bytes());
        for (c, (seq, o, index)) in &self.last {
            out.extend_from_slice(&c.to_le_bytes());
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&index.to_le_bytes());
            out.extend_from_slice(&(o.len() as u32).to_le_bytes());
            out.extend_from_slice(o);
        }
        out.extend_from_slice(sm_snapshot);
        out
    }

    /// Splits a snapshot into the table and the state machine's part.
    pub(crate) fn decode_snapshot(data: &[u8]) -> Result<(Dedup, &[u8])> {
        let bad = || Error::Malformed { what: "snapshot" };
        let mut at = 0usize;
        let mut take = |n: usize| -> Result<&[u8]> {
            let s = data.get(at..at + n).ok_or_else(bad)?;
            at += n;
            Ok(s)
        };
        let u64_of = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let n = u64_of(take(8)?);
        let mut d = Dedup::default();
        for _ in 0..n {
            let c = u64_of(take(8)?);
            let seq = u64_of(take(8)?);
            let index = u64_of(take(8)?);
            let len = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
            let o = take(len)?.to_vec();
            d.remember(c, seq, o, index);
        }
        Ok((d, &data[at..]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Counter(u64);

    impl StateMachine for Counter {
        fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
            self.0 += u64::from(command[0]);
            self.0.to_le_bytes().to_vec()
        }
        async fn query(&self, _q: &[u8]) -> Vec<u8> {
            self.0.to_le_bytes().to_vec()
        }
        fn snapshot(&self) -> Vec<u8> {
            self.0.to_le_bytes().to_vec()
        }
        fn restore(&mut self, s: &[u8]) -> Result<(), String> {
            self.0 = u64::from_le_bytes(s.try_into().map_err(|_| "size".to_string())?);
            Ok(())
        }
    }

    #[test]
    fn dedup_table_forgets_the_least_recently_active_client_past_its_cap() {
        let mut sm = Counter::default();
        let mut d = Dedup::default();
        for c in 0..(DEDUP_CLIENTS_MAX as u64 + 10) {
            let id = RequestId {
                client_id: c,
                seq: 1,
            };
            // Log indices are unique: two per round.
            d.apply(&mut sm, 2 * c + 1, id, &[1]).unwrap();
            if c == 100 {
                // Client 0 proposes again: it is now recent and must survive the evictions.
                d.apply(
                    &mut sm,
                    2 * c + 2,
                    RequestId {
                        client_id: 0,
                        seq: 2,
                    },
                    &[1],
                )
                .unwrap();
            }
        }
        assert_eq!(d.len(), DEDUP_CLIENTS_MAX);
        assert!(d.last.contains_key(&0), "recently active client kept");
        assert!(
            !d.last.contains_key(&1),
            "least recently active client forgotten"
        );
        let snapshot = d.encode_snapshot(b"sm");
        let (back, rest) = Dedup::decode_snapshot(&snapshot).unwrap();
        assert_eq!(back, d);
        assert_eq!(rest, b"sm");
    }

    #[test]
    fn retried_request_is_applied_once_and_answers_the_same() {
        let mut sm = Counter::default();
        let mut d = Dedup::default();
        let id = RequestId {
            client_id: 7,
            seq: 1,
        };
        let a = d.apply(&mut sm, 1, id, &[5]).unwrap();
        let b = d.apply(&mut sm, 2, id, &[5]).unwrap();
        assert_eq!(a, b);
        assert_eq!(sm.0, 5);
        let next = RequestId { seq: 2, ..id };
        d.apply(&mut sm, 3, next, &[1]).unwrap();
        assert!(matches!(
            d.apply(&mut sm, 4, id, &[5]),
            Err(RequestError::Superseded { .. })
        ));
        assert_eq!(sm.0, 6);
    }

    #[test]
    fn dedup_table_round_trips_through_snapshot() {
        let mut sm = Counter::default();
        let mut d = Dedup::default();
        for c in 0..3 {
            let id = RequestId {
                client_id: c,
                seq: 4,
            };
            d.apply(&mut sm, c + 1, id, &[1]).unwrap();
        }
        let bytes = d.encode_snapshot(&sm.snapshot());
        let (d2, rest) = Dedup::decode_snapshot(&bytes).unwrap();
        assert_eq!(d, d2);
        assert_eq!(rest, sm.snapshot());
        assert!(Dedup::decode_snapshot(&bytes[..5]).is_err());
    }

    #[test]
    fn command_encoding_round_trips() {
        let id = RequestId {
            client_id: 1,
            seq: 2,
        };
        let e = encode_command(id, b"xyz");
        assert_eq!(decode_command(&e).unwrap(), (id, &b"xyz"[..]));
        assert!(decode_command(&e[..10]).is_err());
    }
}
