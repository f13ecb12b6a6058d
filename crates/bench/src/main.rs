//! starling-bench: the MQTT load generator's command line.

use std::process::ExitCode;

use clap::Parser;
use starling_bench::{run::run, sys, Cli};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cfg = match cli.command.validate(sys::open_file_limit()) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("starling-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("starling-bench: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = runtime.block_on(run(&cfg));
    // The summary goes to stderr and the JSON line alone to stdout, so that
    // scripts read stdout without parsing prose.
    eprint!("{}", report.human_summary());
    println!("{}", report.to_json_line());
    if report.connect.ok == 0 {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
