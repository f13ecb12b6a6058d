//! The `starling` daemon: parses the command line and runs the broker on the production runtime.

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "starling",
    version,
    about = "Starling: a clustered MQTT broker"
)]
struct Cli {
    /// Worker threads (actix arbiters); default: one per core.
    #[arg(long)]
    workers: Option<usize>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let rt = match cli.workers {
        Some(n) => starling_rt::Runtime::new(n),
        None => starling_rt::Runtime::per_core(),
    };
    rt.block_on(async {
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            backend = starling_rt::BACKEND,
            "starling started"
        );
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("starling stopping");
    });
    Ok(())
}
