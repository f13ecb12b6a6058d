//! Fuzz the session core with input sequences: the fuzzer's bytes choose connects,
//! packets (well-formed ones and raw bytes through the codec), deliveries, timeouts,
//! router answers and detaches; every step must keep the session's invariants (see the
//! interpreter's own docs).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/sequence/mod.rs"]
mod sequence;

fuzz_target!(|data: &[u8]| sequence::run(data));
