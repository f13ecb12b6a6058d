//! `starling cert` for raft clusters: creates the cluster CA (once) and a certificate per node,
//! named `node-<id>` as the QUIC transport expects.
//!
//! ```sh
//! cargo run -p starling-raft --example cert -- --dir certs --nodes 1,2,3 --names 127.0.0.1
//! ```
//!
//! Writes `certs/ca.pem`, `certs/ca.key` (only if missing: later runs reuse the CA, e.g. to
//! add node 4) and `certs/node-<id>.pem` / `.key` (replaced). Give each node `ca.pem` and its
//! own pair; keep `ca.key` off the nodes.

use std::path::PathBuf;

use clap::Parser;
use starling_raft::certs;

#[derive(Parser, Debug)]
#[command(about = "Create the raft cluster CA and node certificates")]
struct Args {
    /// Output directory (created if missing).
    #[arg(long)]
    dir: PathBuf,
    /// Raft ids to issue certificates for.
    #[arg(long, value_delimiter = ',', required = true)]
    nodes: Vec<u64>,
    /// Extra subject names (DNS names or IP addresses) put in every node certificate.
    #[arg(long, value_delimiter = ',')]
    names: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let names: Vec<&str> = args.names.iter().map(String::as_str).collect();
    for id in args.nodes {
        anyhow::ensure!(id != 0, "raft ids start at 1");
        let path = certs::issue_node(&args.dir, id, &names)?;
        println!("{}", path.display());
    }
    println!("{}", args.dir.join("ca.pem").display());
    Ok(())
}
