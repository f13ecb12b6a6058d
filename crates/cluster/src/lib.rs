//! The cluster's replicated state (members, client-id ownership fenced by epochs, routes per node, retained messages) as a deterministic raft state machine, and the node-side route book.
//!
//! Sans-IO: [`ClusterState`] and [`RouteBook`] are plain data; [`ClusterSm`] adapts the state
//! to starling-raft's `StateMachine` and tells the node's [`Replica`] what each entry changed.

mod book;
mod command;
mod sm;
mod state;

pub use book::RouteBook;
pub use command::{
    decode, encode, Answer, Command, DecodeError, Member, NodeId, Output, Owner, Query,
    RetainedMsg, Summary,
};
pub use sm::{ClusterSm, Replica};
pub use state::{Change, ClusterState};
