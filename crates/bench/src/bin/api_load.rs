//! starling-api-load: GET requests at a fixed rate over one keep-alive HTTP/1.1
//! connection, paths in turn, plus one request held open that never finishes its head; for
//! `scripts/api-load-bench.sh`, which asks whether the HTTP API slows MQTT traffic.
//!
//! It shares a core with the MQTT load tool, so it has to cost little itself: one thread,
//! blocking sockets, no runtime, and each response read by its `Content-Length`.

// As the bench's library: real time on real sockets, never under the simulator.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "GET requests at a fixed rate to a local HTTP server, paths in turn")]
struct Args {
    /// Port on 127.0.0.1.
    #[arg(long)]
    port: u16,
    /// Requests per second.
    #[arg(long, default_value_t = 200)]
    rate: u32,
    /// How long to send, seconds.
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    /// Comma-separated paths, requested in turn.
    #[arg(long, default_value = "/api/v1/clients,/api/v1/metrics/prometheus")]
    paths: String,
}

/// Reads one response: its status, and its body by `Content-Length` (into `body`, reused).
fn response(r: &mut BufReader<TcpStream>, body: &mut Vec<u8>) -> std::io::Result<u16> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP status line: {line:?}")))?;
    let mut length = None;
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse::<usize>().ok();
            }
        }
    }
    let n = length.ok_or_else(|| std::io::Error::other("a response without Content-Length"))?;
    body.resize(n, 0);
    r.read_exact(body)?;
    Ok(status)
}

fn run(a: &Args) -> std::io::Result<(u64, Duration)> {
    let addr = ("127.0.0.1", a.port);
    // Held open for the whole run: its head never ends.
    let mut held = TcpStream::connect(addr)?;
    held.write_all(b"GET /api/v1/clients HTTP/1.1\r\nHost: x\r\n")?;
    let conn = TcpStream::connect(addr)?;
    conn.set_nodelay(true)?;
    let mut w = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    let paths: Vec<&str> = a.paths.split(',').collect();
    let every = Duration::from_secs_f64(1.0 / f64::from(a.rate.max(1)));
    let (start, mut n, mut slowest) = (Instant::now(), 0u64, Duration::ZERO);
    let mut body = Vec::new();
    while start.elapsed().as_secs_f64() < a.secs {
        let path = paths[(n as usize) % paths.len()];
        let t = Instant::now();
        write!(w, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")?;
        let status = response(&mut r, &mut body)?;
        if status != 200 {
            return Err(std::io::Error::other(format!("{path}: status {status}")));
        }
        slowest = slowest.max(t.elapsed());
        n += 1;
        let next = start + every * u32::try_from(n).unwrap_or(u32::MAX);
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    drop(held);
    Ok((n, slowest))
}

fn main() -> ExitCode {
    let a = Args::parse();
    let start = Instant::now();
    match run(&a) {
        Ok((n, slowest)) => {
            let secs = start.elapsed().as_secs_f64();
            println!(
                "{n} requests, {:.0}/s, slowest {:.1} ms",
                n as f64 / secs,
                slowest.as_secs_f64() * 1e3
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("starling-api-load: {e}");
            ExitCode::FAILURE
        }
    }
}
