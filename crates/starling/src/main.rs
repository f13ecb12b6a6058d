//! The `starling` daemon: parses the command line and runs the broker on the production runtime.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use starling_config::Config;

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

fn run(cli: Cli) -> anyhow::Result<()> {
    if let Some(Command::Passwd { file, user, delete }) = &cli.command {
        return passwd(file, user, *delete);
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
    for w in warnings {
        tracing::warn!("{w}");
    }
    let rt = match cli.workers {
        Some(n) => starling_rt::Runtime::new(n),
        None => starling_rt::Runtime::per_core(),
    };
    rt.block_on(async move {
        let broker = starling_broker::Broker::start(config).await?;
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            backend = starling_rt::BACKEND,
            "starling started"
        );
        shutdown_signal().await;
        tracing::info!("starling stopping");
        broker.shutdown().await;
        anyhow::Ok(())
    })?;
    Ok(())
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    biased;
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
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
