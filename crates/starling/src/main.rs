//! The `starling` daemon: parses the command line and runs the broker on the production runtime.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use starling_broker::Broker;
use starling_config::{Config, Warning};

mod alloc;
mod cluster_cli;
mod ctl;

#[derive(Parser, Debug)]
#[command(
    name = "starling",
    version,
    about = "Starling: a clustered MQTT broker"
)]
struct Cli {
    /// Configuration file (TOML); without it the embedded defaults apply (tcp 0.0.0.0:1883).
    #[arg(long, short = 'c', global = true)]
    config: Option<PathBuf>,
    /// Worker threads (actix arbiters); default: one per core.
    #[arg(long)]
    workers: Option<usize>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Adds or updates a user in a password file (the password is read from stdin, or
    /// prompted for on a terminal), or deletes one with --delete.
    Passwd {
        /// The password file (created if missing).
        file: PathBuf,
        /// The user name.
        user: String,
        /// Remove the user instead.
        #[arg(long)]
        delete: bool,
    },
    /// Certificates for TLS, WSS and QUIC listeners.
    Cert {
        #[command(subcommand)]
        command: CertCommand,
    },
    /// The HTTP API of the node `--config` names (its `[http]` bind and bearer token).
    Ctl {
        #[command(subcommand)]
        command: ctl::CtlCommand,
    },
    /// The cluster, as the node `--config` names sees it (through its HTTP API).
    Cluster {
        #[command(subcommand)]
        command: cluster_cli::ClusterCommand,
    },
    /// The durable store (`{node.data_dir}/store.redb`).
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
}

#[derive(Subcommand, Debug)]
enum StoreCommand {
    /// Verifies a store offline (the broker must not be running on it): every page's
    /// checksum, every record decoded, every delivery matched to its session. Prints what
    /// it holds; exits non-zero, naming the file and the problem, when it is damaged.
    Check {
        /// The store file; default: the one of `--config` (or of the default config).
        file: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum CertCommand {
    /// Writes a self-signed development CA (`ca.pem`, `ca.key`) and a server certificate
    /// signed by it (`server.pem`, `server.key`) for localhost, 127.0.0.1 and ::1 into DIR,
    /// then prints the listener configuration that uses them. Never overwrites a file.
    Dev {
        /// The directory to write to (created if missing).
        dir: PathBuf,
        /// More names the server certificate is valid for (DNS names or IP addresses).
        #[arg(long = "name")]
        names: Vec<String>,
    },
    /// Writes the cluster CA (`ca.pem`, `ca.key`, once; reused when present) and a
    /// certificate per node (`node-<id>.pem`, `node-<id>.key`) into DIR: what
    /// `cluster.certs_dir` names. Keep `ca.key` off the nodes.
    Cluster {
        /// The directory to write to (created if missing).
        dir: PathBuf,
        /// The node ids to issue certificates for, e.g. `1,2,3`.
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<u64>,
        /// More names (DNS names or IP addresses) each node certificate is valid for.
        #[arg(long = "name")]
        names: Vec<String>,
    },
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line naming the file, the key and the problem; no backtrace for a user's
            // mistake.
            eprintln!("starling: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn store_check(config: Option<&Path>, file: Option<&Path>) -> anyhow::Result<()> {
    let path = match file {
        Some(f) => f.to_path_buf(),
        None => {
            let config = match config {
                Some(path) => Config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?.0,
                None => Config::default(),
            };
            starling_broker::store_path(&config)
        }
    };
    let report = starling_store::check(&path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let u = report.usage;
    println!(
        "{}: ok (format {}): {} sessions, {} deliveries, {} inbound QoS 2 ids, {} retained, {} delayed, {} bytes",
        report.path.display(),
        report.format_version,
        u.sessions,
        u.deliveries,
        u.inbound,
        u.retained,
        u.delayed,
        u.bytes
    );
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match &cli.command {
        Some(Command::Passwd { file, user, delete }) => return passwd(file, user, *delete),
        Some(Command::Cert {
            command: CertCommand::Dev { dir, names },
        }) => return cert_dev(dir, names),
        Some(Command::Cert {
            command: CertCommand::Cluster { dir, nodes, names },
        }) => return cert_cluster(dir, nodes, names),
        Some(Command::Cluster { command }) => {
            let config = match &cli.config {
                Some(path) => Config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?.0,
                None => Config::default(),
            };
            return cluster_cli::run(&config, command);
        }
        Some(Command::Store {
            command: StoreCommand::Check { file },
        }) => return store_check(cli.config.as_deref(), file.as_deref()),
        Some(Command::Ctl { command }) => {
            let config = match &cli.config {
                Some(path) => Config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?.0,
                None => Config::default(),
            };
            return ctl::run(&config.http, command);
        }
        None => {}
    }
    let (config, warnings) = match &cli.config {
        Some(path) => Config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?,
        None => (Config::default(), Vec::new()),
    };
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| config.log.level.clone());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&filter)
                .with_context(|| format!("log.level: invalid directives {filter:?}"))?,
        )
        .init();
    let mut needs_certificate = false;
    for w in &warnings {
        needs_certificate |= matches!(w, Warning::ListenerNeedsCertificate { .. });
        tracing::warn!("{w}");
    }
    if needs_certificate {
        tracing::warn!(
            "TLS listeners need a certificate: `starling cert dev DIR` writes a development \
             one and prints the [listeners.tls] settings to use it"
        );
    }
    let rt = match cli.workers {
        Some(n) => starling_rt::Runtime::new(n),
        None => starling_rt::Runtime::per_core(),
    };
    rt.block_on(async move {
        let signals = Signals::register();
        let http = config.http.clone();
        let broker = Broker::start(config).await?;
        let api = if http.enabled {
            Some(starling_http::HttpApi::start(&http, broker.admin())?)
        } else {
            None
        };
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            backend = starling_rt::BACKEND,
            "starling started"
        );
        tokio::select! {
            () = signals.serve(&broker) => {}
            () = broker.left() => tracing::info!("this node left its cluster"),
        }
        tracing::info!("starling stopping");
        if let Some(api) = api {
            api.stop().await;
        }
        broker.shutdown().await;
        anyhow::Ok(())
    })?;
    Ok(())
}

/// The signals the daemon acts on, registered before the broker starts so that one sent as
/// soon as "starling started" is logged is never met with the default action (SIGHUP's
/// would end the process).
struct Signals {
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    hangup: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn register() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let terminate = signal(SignalKind::terminate())
                .map_err(|e| tracing::warn!(error = %e, "no SIGTERM handler: stop with Ctrl-C"))
                .ok();
            let hangup = signal(SignalKind::hangup())
                .map_err(|e| {
                    tracing::warn!(error = %e, "no SIGHUP handler: certificates will not reload")
                })
                .ok();
            Signals { terminate, hangup }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// Waits for Ctrl-C or SIGTERM, reloading TLS certificates on each SIGHUP meanwhile.
    async fn serve(mut self, broker: &Broker) {
        #[cfg(unix)]
        loop {
            let terminate = async {
                match &mut self.terminate {
                    Some(s) => s.recv().await,
                    None => std::future::pending().await,
                }
            };
            let hangup = async {
                match &mut self.hangup {
                    Some(s) => s.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = tokio::signal::ctrl_c() => return,
                _ = terminate => return,
                Some(()) = hangup => reload_certificates(broker),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = broker;
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// SIGHUP: every TLS-bearing listener re-reads its files; the broker logs each outcome.
#[cfg(unix)]
fn reload_certificates(broker: &Broker) {
    tracing::info!("SIGHUP: reloading certificates");
    match broker.reload_tls() {
        Ok(n) => tracing::info!(listeners = n, "certificates reloaded"),
        Err(e) => tracing::error!("certificate reload incomplete: {e}"),
    }
}

fn cert_dev(dir: &Path, names: &[String]) -> anyhow::Result<()> {
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let files = starling_net::write_dev_certificates(dir, &names)?;
    // Absolute paths in the snippet: it works wherever the config file lives.
    let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    let (ca, cert, key) = (
        abs(&files.ca_cert),
        abs(&files.server_cert),
        abs(&files.server_key),
    );
    eprintln!(
        "wrote {}, {}, {}, {}",
        ca.display(),
        abs(&files.ca_key).display(),
        cert.display(),
        key.display()
    );
    println!(
        "# Development certificates: for testing only, clients must trust {ca}.
[[listeners]]
kind = \"tls\"            # or \"wss\" or \"quic\", each with the same [listeners.tls]
bind = \"0.0.0.0:8883\"

[listeners.tls]
cert_file = \"{cert}\"
key_file = \"{key}\"
# Client certificates: ca_file = \"{ca}\", verify_client = true, cn_as_username = true

# Try it: mosquitto_sub -h localhost -p 8883 --cafile {ca} -t '#' -v",
        ca = ca.display(),
        cert = cert.display(),
        key = key.display(),
    );
    Ok(())
}

fn cert_cluster(dir: &Path, nodes: &[u64], names: &[String]) -> anyhow::Result<()> {
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    for &id in nodes {
        if id == 0 {
            bail!("--nodes: 0 is not a node id (node.id starts at 1)");
        }
        let cert = starling_raft::certs::issue_node(dir, id, &names)
            .with_context(|| format!("the certificate of node {id} in {}", dir.display()))?;
        eprintln!("wrote {}", cert.display());
    }
    Ok(())
}

fn passwd(file: &PathBuf, user: &str, delete: bool) -> anyhow::Result<()> {
    if delete {
        if starling_auth::delete(file, user)? {
            eprintln!("deleted {user}");
            return Ok(());
        }
        bail!("no user {user} in {}", file.display());
    }
    let stdin = std::io::stdin();
    let password = if stdin.is_terminal() {
        let a = prompt("Password: ")?;
        let b = prompt("Again: ")?;
        if a != b {
            bail!("the passwords differ");
        }
        a
    } else {
        let mut line = String::new();
        stdin.lock().read_line(&mut line)?;
        line.trim_end_matches(['\r', '\n']).to_owned()
    };
    if password.is_empty() {
        bail!("empty password");
    }
    let added = starling_auth::add_or_update(file, user, password.as_bytes())?;
    eprintln!("{} {user}", if added { "added" } else { "updated" });
    Ok(())
}

/// Reads one line from the terminal. The password is echoed: we carry no terminal crate;
/// pipe it on stdin to keep it off the screen.
fn prompt(label: &str) -> anyhow::Result<String> {
    eprint!("{label}");
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}
