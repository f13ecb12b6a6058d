//! One MQTT client's session state machine (QoS flows, inflight window, queue, will, expiry, aliases), sans-IO.
//!
//! A [`Session`] is driven like quinn-proto's `Connection`: the broker feeds
//! it the client's packets ([`Session::handle_packet`]), routed messages
//! ([`Session::deliver`]), the router's answers ([`Session::subscribed`],
//! [`Session::unsubscribed`]), connection changes ([`Session::attach`],
//! [`Session::detach`]) and timer expiries ([`Session::handle_timeout`]),
//! each with the current time; after every call it drains
//! [`Session::poll_effect`] and re-arms its timer with
//! [`Session::poll_timeout`]. The session never reads a clock, draws a random
//! number or touches a socket.
//!
//! One session serves MQTT 3.1, 3.1.1 and 5.0 connections; it answers each in
//! its own protocol's terms (reason codes and properties only for 5.0).

mod effect;
mod error;
mod limits;
mod message;
mod session;
pub mod state;
#[cfg(test)]
mod tests;

pub use effect::{DropReason, Effect, OutgoingPublish, SubscribeRequest};
pub use error::{PacketIdList, RestoreError, SessionError};
pub use limits::{check_connect, refusal, ClientIdentity, QueueFullPolicy, SessionLimits};
pub use message::{DeliveryOptions, Expiry, Message, SharedHeaders};
pub use session::{AllowAll, Attached, DetachReason, Gate, Session};
pub use state::SessionState;

/// The monotonic instant every input takes, a plain value: the broker passes its runtime's
/// `now` (`starling_rt::time::now()`, virtual under the simulator); the session depends on
/// no runtime.
pub use std::time::Instant;
