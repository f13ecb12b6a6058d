//! MQTT load generator: drives a broker with connection, publish, subscribe, fan-in, fan-out and pairs scenarios and reports throughput, loss and end-to-end latency.
//!
//! Use from the command line (`starling-bench --help`) or in-process:
//! validate a [`cli::Command`] into a [`cli::RunConfig`], then [`run::run`] it
//! on a tokio runtime and print [`report::Report::to_json_line`].

// A load generator measures real time on real sockets with real tasks: it
// reads `Instant::now` and spawns on tokio directly. It never runs under the
// simulator, so the runtime seam (`starling-rt`) has nothing to give it.
#![allow(clippy::disallowed_methods)]

pub mod cli;
pub mod client;
pub mod error;
pub mod payload;
pub mod report;
pub mod run;
pub mod sys;

pub use cli::{Cli, RunConfig};
pub use error::{ArgError, ClientError};
pub use report::Report;
