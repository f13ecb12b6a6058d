//! A broker node's store on a simulated disk, crashed with the node: what a kill leaves of
//! the writes not yet synced, drawn from the seed.

use madsim::rand::{thread_rng, Rng};
use starling_store::{SimDisk, TornWrite};

/// `disk` as a kill leaves it: every write since the last sync lost, or all but a torn
/// part of the last one, or some of them in order and a torn one after (one in three each).
pub fn crash(disk: &SimDisk) -> SimDisk {
    let mut r = thread_rng();
    let torn = match r.gen_range(0..3) {
        0 => TornWrite::None,
        1 => TornWrite::Last {
            bytes: r.gen_range(0..4096),
        },
        _ => TornWrite::InOrder {
            writes: r.gen_range(0..4),
            bytes: r.gen_range(0..4096),
        },
    };
    disk.crash(torn)
}
