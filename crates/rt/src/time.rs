//! The clock: monotonic time for deadlines, wall time for expiry and timestamps.
//!
//! Under `--cfg madsim` both clocks are the simulator's virtual clocks, so nothing outside
//! this module (and the transport seam) may read a clock directly.

use std::time::{Duration, SystemTime};

/// The monotonic instant of every deadline: `std::time::Instant`, so that a core that takes
/// time as a plain value (the session) needs no runtime crate to name it. It is read through
/// the runtime's clock: under madsim, whose clock backs std's, it is virtual; on tokio it
/// follows tokio's clock (a paused test clock included).
pub use std::time::Instant;

/// Monotonic now.
pub fn now() -> Instant {
    #[cfg(madsim)]
    {
        // madsim's `tokio::time::Instant` is std's, read from the virtual clock.
        tokio::time::Instant::now()
    }
    #[cfg(not(madsim))]
    {
        tokio::time::Instant::now().into_std()
    }
}

/// Wall-clock now (message expiry, timestamps shown to people).
pub fn wall() -> SystemTime {
    SystemTime::now()
}

/// Seconds since the Unix epoch of the wall clock (0 if the clock is before 1970).
pub fn unix_secs() -> u64 {
    wall()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Sleeps for `d` on the runtime's clock.
pub async fn sleep(d: Duration) {
    tokio::time::sleep(d).await
}

/// Sleeps until `deadline` on the runtime's clock. Not an `async fn`: the runtime's own
/// sleep future is returned as it is, without a wrapper state around it (every idle actor
/// with a timer holds one).
pub fn sleep_until(deadline: Instant) -> impl std::future::Future<Output = ()> {
    #[cfg(madsim)]
    {
        tokio::time::sleep_until(deadline)
    }
    #[cfg(not(madsim))]
    {
        tokio::time::sleep_until(tokio::time::Instant::from_std(deadline))
    }
}

/// Runs `f` with a deadline; `None` if it did not finish in time.
pub async fn timeout<F: std::future::Future>(d: Duration, f: F) -> Option<F::Output> {
    tokio::time::timeout(d, f).await.ok()
}
