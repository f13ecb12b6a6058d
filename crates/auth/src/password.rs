//! The password file: one `username:$argon2id$...` line per user, and the atomic rewrites
//! behind `starling passwd`.
//!
//! Hashes are argon2id PHC strings with a random 16-byte salt and the `argon2` crate's
//! default parameters (version 0x13, m = 19456 KiB, t = 2, p = 1: the OWASP minimum for
//! argon2id). Verification reads the parameters from each PHC string, so raising them later
//! only affects passwords set after the change.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use argon2::{Argon2, PasswordHasher, PasswordVerifier};
use password_hash::{PasswordHash, PasswordHashString, SaltString};

use crate::error::{AuthError, PasswordLineProblem};

/// Verified against when the username is unknown, so that an unknown user costs as much
/// time as a wrong password and response times do not reveal which users exist.
/// The hash of a random password; default parameters, like every stored hash.
const DUMMY_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c3RhcmxpbmdkdW1teXNhbHQ$\
Xyy2AYWp0gjO1JAl5EY5YR3yh1W32W7ULr9K2w3YtSo";

/// The users and argon2id hashes of a password file, loaded once; verification is
/// read-only.
#[derive(Debug, Clone)]
pub struct PasswordFile {
    users: BTreeMap<String, PasswordHashString>,
}

impl PasswordFile {
    /// Reads and parses the file at `path`.
    ///
    /// Empty lines and lines starting with `#` are skipped. Errors name the file and the
    /// line (from 1): a line without `:`, an empty username, a duplicate user, or a hash
    /// that is not an argon2id PHC string.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, AuthError> {
        let path = path.as_ref();
        let text = read(path)?;
        Self::parse(&text).map_err(|(line, problem)| AuthError::PasswordLine {
            path: path.to_path_buf(),
            line,
            problem,
        })
    }

    /// Parses the text of a password file; on error returns the line number (from 1) and
    /// the problem.
    pub fn parse(text: &str) -> Result<Self, (usize, PasswordLineProblem)> {
        let mut users = BTreeMap::new();
        let mut first_lines = BTreeMap::new();
        for (idx, raw) in text.lines().enumerate() {
            let line_no = idx + 1;
            let (username, hash) = match parse_line(raw) {
                None => continue,
                Some(Ok(entry)) => entry,
                Some(Err(problem)) => return Err((line_no, problem)),
            };
            if let Some(&first_line) = first_lines.get(username) {
                return Err((
                    line_no,
                    PasswordLineProblem::DuplicateUser {
                        username: username.to_owned(),
                        first_line,
                    },
                ));
            }
            first_lines.insert(username.to_owned(), line_no);
            users.insert(username.to_owned(), hash);
        }
        Ok(Self { users })
    }

    /// Whether `password` is the password of `username`.
    ///
    /// The comparison of hash outputs is constant-time (the `password-hash` crate's
    /// `Output` equality), and an unknown user is verified against a dummy hash so that it
    /// takes as long as a wrong password.
    pub fn verify(&self, username: &str, password: &[u8]) -> bool {
        match self.users.get(username) {
            Some(hash) => verify_hash(&hash.password_hash(), password),
            None => {
                // The constant parses; if it ever did not, refusing is still correct.
                if let Ok(dummy) = PasswordHash::new(DUMMY_HASH) {
                    let _ = verify_hash(&dummy, password);
                }
                false
            }
        }
    }

    /// Whether the file defines `username`.
    pub fn contains(&self, username: &str) -> bool {
        self.users.contains_key(username)
    }

    /// The number of users.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// Whether the file defines no user.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

fn verify_hash(hash: &PasswordHash<'_>, password: &[u8]) -> bool {
    Argon2::default().verify_password(password, hash).is_ok()
}

/// `None` for lines to skip (blank, comment); otherwise the username and parsed hash.
fn parse_line(raw: &str) -> Option<Result<(&str, PasswordHashString), PasswordLineProblem>> {
    // `lines()` leaves a `\r` from CRLF files; usernames cannot contain it anyway.
    let line = raw.strip_suffix('\r').unwrap_or(raw);
    if line.trim().is_empty() || line.starts_with('#') {
        return None;
    }
    let Some((username, hash)) = line.split_once(':') else {
        return Some(Err(PasswordLineProblem::MissingColon));
    };
    if username.is_empty() {
        return Some(Err(PasswordLineProblem::EmptyUsername));
    }
    Some(parse_hash(hash.trim_end()).map(|h| (username, h)))
}

fn parse_hash(hash: &str) -> Result<PasswordHashString, PasswordLineProblem> {
    let parsed = PasswordHashString::new(hash).map_err(PasswordLineProblem::BadHash)?;
    let algorithm = parsed.algorithm();
    if algorithm != argon2::Algorithm::Argon2id.ident() {
        return Err(PasswordLineProblem::WrongAlgorithm {
            found: algorithm.to_string(),
        });
    }
    Ok(parsed)
}

/// Hashes `password` with argon2id, a fresh random salt and the default parameters (see
/// the module docs), returning the PHC string stored after `username:`.
pub fn hash_password(password: &[u8]) -> Result<String, AuthError> {
    // The salt must be unpredictable, so it comes from the OS, not the runtime's seeded
    // rng; hashing only happens in the `starling passwd` command, never in simulated code.
    let salt = SaltString::generate(&mut password_hash::rand_core::OsRng);
    let hash = Argon2::default()
        .hash_password(password, &salt)
        .map_err(AuthError::Hash)?;
    Ok(hash.to_string())
}

/// Checks that `username` can be stored in a password file: not empty, no `:` (the
/// separator), no line break, and not starting with `#` (a comment line).
pub fn validate_username(username: &str) -> Result<(), AuthError> {
    let reason = if username.is_empty() {
        "must not be empty"
    } else if username.contains(':') {
        "must not contain ':'"
    } else if username.contains(['\n', '\r']) {
        "must not contain a line break"
    } else if username.starts_with('#') {
        "must not start with '#' (a comment line)"
    } else {
        return Ok(());
    };
    Err(AuthError::InvalidUsername {
        username: username.to_owned(),
        reason,
    })
}

/// Sets the password of `username` in the file at `path`, adding the user if absent and
/// creating the file if it does not exist. Returns `true` if the user was added, `false`
/// if an existing password was replaced.
///
/// Other lines (users, comments) are kept in order. The file is rewritten atomically: a
/// temporary file in the same directory is written, synced and renamed over `path`, so a
/// crash leaves either the old or the new file. A malformed existing file is refused
/// rather than rewritten.
pub fn add_or_update(
    path: impl AsRef<Path>,
    username: &str,
    password: &[u8],
) -> Result<bool, AuthError> {
    let path = path.as_ref();
    validate_username(username)?;
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(AuthError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    check_parses(path, &text)?;
    let entry = format!("{username}:{}", hash_password(password)?);
    let mut added = true;
    let mut lines: Vec<String> = Vec::new();
    for line in text.lines() {
        if line_user(line) == Some(username) {
            lines.push(entry.clone());
            added = false;
        } else {
            lines.push(line.to_owned());
        }
    }
    if added {
        lines.push(entry);
    }
    write_atomically(path, &lines)?;
    Ok(added)
}

/// Removes `username` from the file at `path`, atomically as [`add_or_update`] does.
/// Returns `false` (and leaves the file untouched) if the user was not there.
pub fn delete(path: impl AsRef<Path>, username: &str) -> Result<bool, AuthError> {
    let path = path.as_ref();
    let text = read(path)?;
    check_parses(path, &text)?;
    let before = text.lines().count();
    let lines: Vec<String> = text
        .lines()
        .filter(|l| line_user(l) != Some(username))
        .map(str::to_owned)
        .collect();
    if lines.len() == before {
        return Ok(false);
    }
    write_atomically(path, &lines)?;
    Ok(true)
}

fn check_parses(path: &Path, text: &str) -> Result<(), AuthError> {
    PasswordFile::parse(text)
        .map(|_| ())
        .map_err(|(line, problem)| AuthError::PasswordLine {
            path: path.to_path_buf(),
            line,
            problem,
        })
}

/// The username of a user line, `None` for blank and comment lines.
fn line_user(line: &str) -> Option<&str> {
    if line.trim().is_empty() || line.starts_with('#') {
        return None;
    }
    line.split_once(':').map(|(u, _)| u)
}

fn read(path: &Path) -> Result<String, AuthError> {
    fs::read_to_string(path).map_err(|source| AuthError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn write_atomically(path: &Path, lines: &[String]) -> Result<(), AuthError> {
    let io_err = |p: &Path| {
        let p = p.to_path_buf();
        move |source| AuthError::Io { path: p, source }
    };
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp: PathBuf = path.with_file_name(format!(
        ".{}.tmp",
        file_name.unwrap_or_else(|| "passwd".to_owned())
    ));
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        // Hashes are not secrets in the way passwords are, but there is no reason to let
        // other local users run offline guessing against them.
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&tmp).map_err(io_err(&tmp))?;
    let mut body = lines.join("\n");
    body.push('\n');
    file.write_all(body.as_bytes()).map_err(io_err(&tmp))?;
    file.sync_all().map_err(io_err(&tmp))?;
    drop(file);
    fs::rename(&tmp, path).map_err(io_err(path))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dummy_hash_is_a_valid_argon2id_phc_string() {
        let parsed = parse_hash(DUMMY_HASH).expect("valid");
        assert_eq!(parsed.algorithm(), argon2::Algorithm::Argon2id.ident());
    }

    #[test]
    fn unknown_user_is_refused() {
        let file = PasswordFile::parse("").expect("empty file parses");
        assert!(!file.verify("nobody", b"secret"));
    }
}
