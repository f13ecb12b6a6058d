//! `starling ctl`: the common HTTP API calls from the command line (clients, kick, publish,
//! stats, plugins), against the node that `--config` names (its `[http]` bind and bearer token), so
//! that an operator does not need curl. One HTTP/1.1 request per call over a plain TCP
//! connection: the API is served on loopback or a trusted network, and a client crate
//! for four calls would outweigh them.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Subcommand;
use starling_config::HttpConfig;

#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// Lists clients (`GET /api/v1/clients`), one JSON object per line.
    Clients {
        /// Only client ids containing this.
        #[arg(long)]
        like: Option<String>,
        /// Only connected (true) or offline (false) ones.
        #[arg(long)]
        connected: Option<bool>,
        /// At most this many.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Kicks a client and discards its session (`DELETE /api/v1/clients/{id}`).
    Kick { client_id: String },
    /// Publishes a message (`POST /api/v1/mqtt/publish`).
    Publish {
        topic: String,
        payload: String,
        #[arg(long, default_value_t = 0)]
        qos: u8,
        #[arg(long)]
        retain: bool,
    },
    /// Prints the node's stats and metrics (`GET /api/v1/stats`, `/metrics`).
    Stats,
    /// Lists the hook chain's providers (`GET /api/v1/plugins`), one JSON object per line
    /// with its settings under `config` (`.../{plugin}/config`).
    Plugins,
}

/// Where the API of the configured node is: its bind, with an unspecified address read as
/// loopback.
fn target(http: &HttpConfig) -> SocketAddr {
    let ip = match http.bind.ip() {
        IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, http.bind.port())
}

/// Percent-encodes a path segment or query value.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A GET of `path` answered with a success, as JSON.
pub(crate) fn get_json(http: &HttpConfig, path: &str) -> anyhow::Result<serde_json::Value> {
    let (st, body) = request(http, "GET", path, None)?;
    serde_json::from_str(&ok(st, body)?).with_context(|| format!("the answer to GET /api/v1{path}"))
}

/// One request; the status and body of the answer.
pub(crate) fn request(
    http: &HttpConfig,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    // A join waits for the new node to catch up (up to 30 s on the leader).
    request_within(http, method, path, body, Duration::from_secs(60))
}

/// As [`request`], waiting up to `wait` for the answer.
pub(crate) fn request_within(
    http: &HttpConfig,
    method: &str,
    path: &str,
    body: Option<&str>,
    wait: Duration,
) -> anyhow::Result<(u16, String)> {
    let addr = target(http);
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("the HTTP API at {addr} (http.bind; is http.enabled on?)"))?;
    s.set_read_timeout(Some(wait))?;
    let mut req =
        format!("{method} /api/v1{path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(t) = &http.bearer_token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .context("an HTTP answer without headers")?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("an HTTP answer without a status")?;
    let chunked = head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.contains("chunked"));
    let body = if chunked {
        dechunk(rest)?
    } else {
        rest.to_owned()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").context("a bad chunk")?;
        let n = usize::from_str_radix(size.trim(), 16).context("a bad chunk size")?;
        if n == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..n).context("a short chunk")?);
        s = rest.get(n + 2..).unwrap_or("");
    }
}

/// Fails with the API's message for a status that is not a success.
pub(crate) fn ok(status: u16, body: String) -> anyhow::Result<String> {
    if (200..300).contains(&status) {
        return Ok(body);
    }
    let msg = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_owned))
        .unwrap_or(body);
    bail!("HTTP {status}: {msg}")
}

pub fn run(http: &HttpConfig, command: &CtlCommand) -> anyhow::Result<()> {
    match command {
        CtlCommand::Clients {
            like,
            connected,
            limit,
        } => {
            let mut q = Vec::new();
            if let Some(l) = like {
                q.push(format!("_like_clientid={}", encode(l)));
            }
            if let Some(c) = connected {
                q.push(format!("connected={c}"));
            }
            if let Some(n) = limit {
                q.push(format!("_limit={n}"));
            }
            let (st, body) = request(http, "GET", &format!("/clients?{}", q.join("&")), None)?;
            let list: Vec<serde_json::Value> =
                serde_json::from_str(&ok(st, body)?).context("the clients list")?;
            for c in list {
                println!("{c}");
            }
        }
        CtlCommand::Kick { client_id } => {
            let (st, body) = request(
                http,
                "DELETE",
                &format!("/clients/{}", encode(client_id)),
                None,
            )?;
            ok(st, body)?;
            println!("kicked {client_id}");
        }
        CtlCommand::Publish {
            topic,
            payload,
            qos,
            retain,
        } => {
            let body = serde_json::json!({
                "topic": topic, "payload": payload, "qos": qos, "retain": retain,
            })
            .to_string();
            let (st, b) = request(http, "POST", "/mqtt/publish", Some(&body))?;
            ok(st, b)?;
            println!("published to {topic}");
        }
        CtlCommand::Stats => {
            for path in ["/stats", "/metrics"] {
                let (st, body) = request(http, "GET", path, None)?;
                println!("{}", ok(st, body)?);
            }
        }
        CtlCommand::Plugins => {
            for node in get_json(http, "/plugins")?.as_array().into_iter().flatten() {
                let id = &node["node"];
                for p in node["plugins"].as_array().into_iter().flatten() {
                    let name = p["name"].as_str().context("a plugin without a name")?;
                    let config = get_json(http, &format!("/plugins/{id}/{}/config", encode(name)))?;
                    let mut line = p.clone();
                    line["node"] = id.clone();
                    line["config"] = config;
                    println!("{line}");
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn values_are_percent_encoded_and_chunks_joined() {
        assert_eq!(super::encode("a/b c+#"), "a%2Fb%20c%2B%23");
        assert_eq!(
            super::dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap(),
            "abcde"
        );
    }
}
