//! What the bench reads from /proc: its own CPU time, a broker's resident
//! memory and the open-file limit.

use std::fs;

/// Clock ticks per second of /proc/PID/stat times. USER_HZ is 100 on every
/// Linux architecture we run on (it is part of the user-space ABI), which
/// spares a `sysconf` call through unsafe FFI.
const USER_HZ: f64 = 100.0;

/// User and system CPU seconds this process has used, or `None` off Linux.
pub fn cpu_seconds() -> Option<(f64, f64)> {
    parse_cpu_seconds(&fs::read_to_string("/proc/self/stat").ok()?)
}

/// Parses utime and stime (fields 14 and 15) of a /proc/PID/stat line. The
/// command name (field 2) may hold spaces and parentheses, so fields are
/// counted from the last ')'.
pub fn parse_cpu_seconds(stat: &str) -> Option<(f64, f64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11); // field 3 is the first after ')'
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime as f64 / USER_HZ, stime as f64 / USER_HZ))
}

/// VmRSS of process `pid` in KiB, or `None` if it cannot be read.
pub fn rss_kib(pid: u32) -> Option<u64> {
    parse_vm_rss_kib(&fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// Reads the `VmRSS:   1234 kB` line of /proc/PID/status.
pub fn parse_vm_rss_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The soft limit on open files of this process, `None` when unlimited or unreadable.
pub fn open_file_limit() -> Option<u64> {
    let limits = fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_seconds_parse_past_a_command_with_spaces() {
        let stat = "42 (my (odd) cmd) S 1 42 42 0 -1 4194304 100 0 0 0 250 30 0 0 20 0 1 0";
        assert_eq!(parse_cpu_seconds(stat), Some((2.5, 0.3)));
    }

    #[test]
    fn vm_rss_is_read_in_kib() {
        let status = "Name:\tmosquitto\nVmPeak:\t  9000 kB\nVmRSS:\t    7340 kB\n";
        assert_eq!(parse_vm_rss_kib(status), Some(7340));
    }

    #[test]
    fn own_process_is_readable() {
        assert!(cpu_seconds().is_some());
        assert!(rss_kib(std::process::id()).is_some_and(|kib| kib > 0));
    }
}
