//! Starling's built-in authentication and ACL: an argon2id password file, ordered topic rules, and the CONNECT decision.
//!
//! Sans-IO apart from the explicit file functions ([`PasswordFile::load`], [`Acl::load`] and
//! the `starling passwd` helpers): checks are pure functions of their inputs, so the broker
//! can call them from any actor and the simulator from any seed.

mod acl;
mod authenticator;
mod error;
mod limiter;
mod password;
mod topic;

pub use acl::{Acl, Action, ClientInfo, Decision, Scope};
pub use authenticator::{AuthResult, Authenticator};
pub use error::{AclProblem, AuthError, PasswordLineProblem};
pub use limiter::{Admission, FailureLimits, LoginGuard, Recorded};
pub use password::{add_or_update, delete, hash_password, validate_username, PasswordFile};
pub use topic::{filter_is_subset, filter_matches_topic, filters_overlap, validate_filter};
