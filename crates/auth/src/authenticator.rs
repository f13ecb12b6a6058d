//! The CONNECT decision: anonymous access (a listener option) and the password file.

use crate::password::PasswordFile;

/// The outcome of authenticating a CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthResult {
    /// The client may connect.
    Allowed,
    /// A username was given and the password is missing or wrong (or the username is
    /// unknown), or a password came without a username.
    BadCredentials,
    /// No credentials were given and this listener refuses anonymous clients, or
    /// credentials were given but there is no password file to check them against and
    /// anonymous access is off.
    NotAuthorized,
}

impl AuthResult {
    /// The MQTT 5 CONNACK reason code: 0x00 Success, 0x86 Bad User Name or Password,
    /// 0x87 Not authorized (MQTT 5 §3.2.2.2).
    pub fn connack_v5(self) -> u8 {
        match self {
            Self::Allowed => 0x00,
            Self::BadCredentials => 0x86,
            Self::NotAuthorized => 0x87,
        }
    }

    /// The MQTT 3.1/3.1.1 CONNACK return code: 0x00 accepted, 0x04 bad user name or
    /// password, 0x05 not authorized (MQTT 3.1.1 §3.2.2.3).
    pub fn connack_v3(self) -> u8 {
        match self {
            Self::Allowed => 0x00,
            Self::BadCredentials => 0x04,
            Self::NotAuthorized => 0x05,
        }
    }
}

/// Authenticates CONNECTs for one listener.
///
/// | credentials            | password file           | no password file        |
/// |------------------------|-------------------------|-------------------------|
/// | none                   | anonymous ? Allowed : NotAuthorized (both columns) ||
/// | username (+ password)  | verified: Allowed or BadCredentials | anonymous ? Allowed : NotAuthorized |
/// | password, no username  | BadCredentials (both columns) ||
///
/// Without a password file a username is an unverified label (as in Mosquitto), which is
/// only acceptable where anonymous access is.
#[derive(Debug, Clone)]
pub struct Authenticator {
    allow_anonymous: bool,
    passwords: Option<PasswordFile>,
}

impl Authenticator {
    /// An authenticator for a listener with the given anonymous policy and optional
    /// password file.
    pub fn new(allow_anonymous: bool, passwords: Option<PasswordFile>) -> Self {
        Self {
            allow_anonymous,
            passwords,
        }
    }

    /// Whether clients without a username are accepted.
    pub fn allows_anonymous(&self) -> bool {
        self.allow_anonymous
    }

    /// Decides a CONNECT from its username and password fields (absent = `None`).
    ///
    /// Costs one argon2id verification when a username is given and a password file is
    /// configured (tens of milliseconds: call it off the connection's hot path).
    pub fn authenticate(&self, username: Option<&str>, password: Option<&[u8]>) -> AuthResult {
        match (username, password) {
            (None, Some(_)) => AuthResult::BadCredentials,
            (None, None) => self.anonymous(),
            (Some(user), password) => match &self.passwords {
                Some(file) => match password {
                    Some(pw) if file.verify(user, pw) => AuthResult::Allowed,
                    _ => AuthResult::BadCredentials,
                },
                None => self.anonymous(),
            },
        }
    }

    /// Whether [`Authenticator::authenticate`] would run a password verification for these
    /// fields (a username and a password, and a password file): the costly case, to be run
    /// off the connection's threads. Every other case is decided at once.
    pub fn needs_verification(&self, username: Option<&str>, password: Option<&[u8]>) -> bool {
        username.is_some() && password.is_some() && self.passwords.is_some()
    }

    fn anonymous(&self) -> AuthResult {
        if self.allow_anonymous {
            AuthResult::Allowed
        } else {
            AuthResult::NotAuthorized
        }
    }
}
