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
//!
//! # Saving and moving a session
//! [`Session::snapshot`]`(now, wall)` returns the session's state as a
//! [`SessionState`], a serde value with no format of its own (see [`state`]), and
//! [`Session::restore`]`(state, limits, now, wall)` builds a detached session from one,
//! on another node or after a restart, or says with a [`RestoreError`] why it cannot.
//! The state holds what a session keeps between connections: subscriptions, deliveries
//! in flight with their packet identifiers and QoS 2 phases, the queue, inbound QoS 2
//! packet identifiers awaiting PUBREL, unanswered SUBSCRIBEs and UNSUBSCRIBEs, the will
//! and its deadline, the session expiry and its deadline, the next packet identifier;
//! not the connection's (keep alive, aliases, the client's limits). Deadlines are
//! wall-clock times in the state: `wall` is the wall-clock time of `now`, passed in like
//! `now`, and the session converts between the two, so that it still reads no clock.
//! ```
//! # use std::{sync::Arc, time::{Duration, Instant, SystemTime}};
//! # use starling_session::{Session, SessionLimits};
//! # #[allow(clippy::disallowed_methods)]
//! # let (now, wall) = (Instant::now(), SystemTime::UNIX_EPOCH + Duration::from_secs(1 << 31));
//! let session = Session::new(Arc::from("client-1"), SessionLimits::default());
//! let state = session.snapshot(now, wall); // store it, or send it to another node
//! let restored = Session::restore(state, SessionLimits::default(), now, wall)?;
//! assert!(restored.is_ended()); // never attached: nothing to keep
//! # Ok::<(), starling_session::RestoreError>(())
//! ```

mod effect;
mod error;
mod limits;
mod message;
mod session;
pub mod state;
mod subscriptions;
#[cfg(test)]
mod tests;

pub use effect::{DropReason, Effect, OutgoingPublish, StoreChange, SubscribeRequest};
pub use error::{PacketIdList, RestoreError, SessionError};
pub use limits::{check_connect, refusal, ClientIdentity, QueueFullPolicy, SessionLimits};
pub use message::{DeliveryOptions, Expiry, Message, SharedHeaders, StoreKey, SubscriptionIds};
pub use session::{AllowAll, Attached, DetachReason, Gate, Session, WallClock};
pub use state::SessionState;
pub use subscriptions::{Subscription, Subscriptions};

/// The monotonic instant every input takes, a plain value: the broker passes its runtime's
/// `now` (`starling_rt::time::now()`, virtual under the simulator); the session depends on
/// no runtime.
pub use std::time::Instant;
