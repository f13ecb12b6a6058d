//! The seam between the broker and its providers: CONNECT authentication, PUBLISH/SUBSCRIBE/read authorization and lifecycle events go through one [`Chain`] fixed at start-up.
//!
//! A provider implements one of three traits:
//! - [`AuthnProvider`]: decides a CONNECT (allow with an [`Identity`], deny with a reason
//!   code, or ignore: pass it to the next provider);
//! - [`AuthzProvider`]: decides a publish, a subscribe or a delivery (read) of a topic
//!   (allow, deny, ignore); when every provider ignores, the chain's default decides;
//! - [`EventProvider`]: observes [`Event`]s, fire and forget.
//!
//! A decision is a [`Verdict`]: ready now, or later (a boxed `Send` future) for providers
//! that ask a remote service. A chain of providers that answer at once costs the caller no
//! allocation and no future: the walk is a loop over the providers returning
//! [`Verdict::Now`]. Only a provider that answers [`Verdict::Later`] makes the walk a
//! future, and the rest of the chain runs inside it after that provider's answer.
//!
//! The crate knows nothing of actors or sockets (no runtime dependency): the broker decides
//! where a later verdict is awaited (the CONNECT handshake task; the client actor, which
//! holds the client's input back in order meanwhile) and with which deadline.
//!
//! An embedder adds providers with [`Hooks`] and starts the broker with them
//! (`starling_broker::Broker::start_with`); the broker puts its built-in providers (the
//! password file, the ACL, the `$SYS` client events) first, then the embedder's, in the
//! order they were added.

mod about;
mod authn;
mod authz;
mod chain;
mod event;
mod verdict;

pub use about::{About, HookKind};
pub use authn::{AuthnAnswer, AuthnProvider, ConnectRequest, Identity, Refusal};
pub use authz::{Action, Answer, AuthzProvider, AuthzRequest, ClientRef, OwnedAuthzRequest};
pub use chain::{AuthnPolicy, Chain, Hooks};
pub use event::{
    DisconnectReason, DropReason, Event, EventKind, EventMask, EventProvider, Subject, What,
};
pub use verdict::{Later, Verdict};
