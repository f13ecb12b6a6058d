//! The daemon's memory allocator: jemalloc, with its purging done by background threads.
//!
//! Why not glibc's malloc: a broker's allocations are many small, short-lived objects
//! made on one thread and freed on another (messages, delivery batches, buffers), where
//! glibc's per-thread arenas fragment and its throughput was bimodal run to run in the
//! fan-out benchmark (docs/benchmarks.md). jemalloc's size-class slabs keep an idle
//! connection's state dense.
//!
//! Why these options: jemalloc returns freed pages to the OS only as it runs, so a
//! thread that goes idle after a burst (a connection storm) would keep the burst's
//! pages. Background threads purge them after `dirty_decay_ms` whatever the workers do;
//! half a second keeps a storm's residue short-lived without purging on every turn of a
//! busy broker. `_RJEM_MALLOC_CONF` in the environment overrides these at start.

use std::ffi::c_char;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A C string pointer jemalloc reads once, before `main`.
#[repr(transparent)]
pub(crate) struct Conf(*const c_char);

// The pointer is to a static, immutable C string literal.
#[allow(unsafe_code)]
unsafe impl Sync for Conf {}

/// jemalloc's `malloc_conf` (prefixed `_rjem_` by tikv-jemalloc-sys): a weak symbol in
/// jemalloc that an application defines to set its options.
#[allow(unsafe_code)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub(crate) static MALLOC_CONF: Conf =
    Conf(c"background_thread:true,dirty_decay_ms:500,muzzy_decay_ms:0".as_ptr());

#[cfg(test)]
mod tests {
    /// The options above reach jemalloc: the symbol's name or type going wrong would leave
    /// its defaults (no background thread, a 10 s decay) silently.
    #[test]
    #[allow(unsafe_code)]
    fn jemalloc_runs_with_the_options_set_here() {
        assert!(tikv_jemalloc_ctl::opt::background_thread::read().unwrap());
        // SAFETY: `opt.dirty_decay_ms` is an `ssize_t` (jemalloc's mallctl documentation).
        let decay: isize =
            unsafe { tikv_jemalloc_ctl::raw::read(b"opt.dirty_decay_ms\0") }.unwrap();
        assert_eq!(decay, 500);
        // And the allocator in use is this one: a block's usable size is jemalloc's
        // size class (glibc's would be 24 for a request of 17).
        let b = std::hint::black_box(Box::new([0u8; 17]));
        // SAFETY: a live allocation of the global allocator.
        let usable = unsafe { tikv_jemallocator::usable_size(&*b as *const [u8; 17]) };
        assert_eq!(usable, 32);
    }
}
