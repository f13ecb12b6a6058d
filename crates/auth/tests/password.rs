//! Password file behaviour: verification, parse errors naming file and line, the
//! `starling passwd` add/update/delete round trip, and the CONNECT decision.

use std::path::PathBuf;

use starling_auth::{
    add_or_update, delete, hash_password, AuthError, AuthResult, Authenticator, PasswordFile,
    PasswordLineProblem,
};

/// A fresh directory per test, removed on success.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("starling-auth-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }
    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn correct_password_verifies_and_wrong_one_does_not() {
    let text = format!("alice:{}\n", hash_password(b"wonderland").expect("hash"));
    let file = PasswordFile::parse(&text).expect("parses");
    assert!(file.verify("alice", b"wonderland"));
    assert!(!file.verify("alice", b"Wonderland"));
    assert!(!file.verify("alice", b""));
    assert!(!file.verify("bob", b"wonderland"));
}

#[test]
fn hashes_are_salted_argon2id_phc_strings() {
    let a = hash_password(b"same").expect("hash");
    let b = hash_password(b"same").expect("hash");
    assert!(a.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{a}");
    assert_ne!(a, b, "a fresh salt per hash");
}

#[test]
fn comments_blank_lines_and_crlf_are_accepted() {
    let hash = hash_password(b"pw").expect("hash");
    let text = format!("# users\n\nalice:{hash}\r\n  \n");
    let file = PasswordFile::parse(&text).expect("parses");
    assert_eq!(file.len(), 1);
    assert!(file.verify("alice", b"pw"));
}

/// Password file text, the line expected in the error, and a check of the problem.
type ParseCase = (String, usize, fn(&PasswordLineProblem) -> bool);

#[test]
fn parse_errors_name_the_line_and_problem() {
    let hash = hash_password(b"pw").expect("hash");
    let cases: [ParseCase; 5] = [
        (format!("alice:{hash}\nbob\n"), 2, |p| *p == PasswordLineProblem::MissingColon),
        (format!(":{hash}\n"), 1, |p| *p == PasswordLineProblem::EmptyUsername),
        ("alice:plaintext\n".to_owned(), 1, |p| matches!(p, PasswordLineProblem::BadHash(_))),
        (
            "alice:$argon2i$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$3ol8MyVv2QIs3C2E1HpUrbqbxaDk0qSmlMlE2s0fDok\n".to_owned(),
            1,
            |p| matches!(p, PasswordLineProblem::WrongAlgorithm { found } if found == "argon2i"),
        ),
        (
            format!("alice:{hash}\n# c\nalice:{hash}\n"),
            3,
            |p| *p == PasswordLineProblem::DuplicateUser { username: "alice".into(), first_line: 1 },
        ),
    ];
    for (text, want_line, check) in cases {
        let (line, problem) = PasswordFile::parse(&text).expect_err("malformed");
        assert_eq!(line, want_line, "{text:?}");
        assert!(check(&problem), "{text:?}: {problem:?}");
    }
}

#[test]
fn load_error_names_the_file_and_line() {
    let dir = TempDir::new("load");
    let path = dir.file("passwd");
    std::fs::write(&path, "# header\nno-colon-here\n").expect("write");
    let err = PasswordFile::load(&path).expect_err("malformed");
    let msg = err.to_string();
    assert!(msg.contains("passwd:2:"), "{msg}");
    assert!(matches!(err, AuthError::PasswordLine { line: 2, .. }));
    assert!(matches!(
        PasswordFile::load(dir.file("absent")),
        Err(AuthError::Io { .. })
    ));
}

#[test]
fn passwd_add_update_delete_round_trip() {
    let dir = TempDir::new("roundtrip");
    let path = dir.file("passwd");
    // Creating the file.
    assert!(add_or_update(&path, "alice", b"one").expect("add alice"));
    assert!(add_or_update(&path, "bob", b"two").expect("add bob"));
    let file = PasswordFile::load(&path).expect("load");
    assert!(file.verify("alice", b"one") && file.verify("bob", b"two"));

    // Updating keeps the other user and the order.
    assert!(!add_or_update(&path, "alice", b"three").expect("update alice"));
    let text = std::fs::read_to_string(&path).expect("read");
    assert!(text.starts_with("alice:"), "{text}");
    let file = PasswordFile::load(&path).expect("load");
    assert!(!file.verify("alice", b"one"));
    assert!(file.verify("alice", b"three") && file.verify("bob", b"two"));

    // Deleting.
    assert!(delete(&path, "alice").expect("delete"));
    assert!(!delete(&path, "alice").expect("delete again"));
    let file = PasswordFile::load(&path).expect("load");
    assert!(!file.contains("alice") && file.verify("bob", b"two"));
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(&dir.0)
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["passwd"]);
}

#[test]
fn passwd_keeps_comments() {
    let dir = TempDir::new("comments");
    let path = dir.file("passwd");
    std::fs::write(&path, "# managed by starling passwd\n").expect("write");
    add_or_update(&path, "alice", b"pw").expect("add");
    let text = std::fs::read_to_string(&path).expect("read");
    assert!(
        text.starts_with("# managed by starling passwd\nalice:"),
        "{text}"
    );
}

#[test]
fn passwd_refuses_usernames_that_break_the_format() {
    let dir = TempDir::new("names");
    let path = dir.file("passwd");
    for bad in ["", "a:b", "a\nb", "a\rb", "#admin"] {
        assert!(
            matches!(
                add_or_update(&path, bad, b"pw"),
                Err(AuthError::InvalidUsername { .. })
            ),
            "{bad:?}"
        );
    }
    assert!(!path.exists(), "nothing written for a refused username");
}

#[test]
fn passwd_refuses_to_rewrite_a_malformed_file() {
    let dir = TempDir::new("malformed");
    let path = dir.file("passwd");
    std::fs::write(&path, "garbage\n").expect("write");
    assert!(matches!(
        add_or_update(&path, "alice", b"pw"),
        Err(AuthError::PasswordLine { line: 1, .. })
    ));
    assert_eq!(std::fs::read_to_string(&path).expect("read"), "garbage\n");
}

fn file_with_alice() -> PasswordFile {
    let text = format!("alice:{}\n", hash_password(b"pw").expect("hash"));
    PasswordFile::parse(&text).expect("parses")
}

#[test]
fn authenticator_with_password_file_verifies_usernames() {
    for anonymous in [true, false] {
        let auth = Authenticator::new(anonymous, Some(file_with_alice()));
        assert_eq!(
            auth.authenticate(Some("alice"), Some(b"pw")),
            AuthResult::Allowed
        );
        assert_eq!(
            auth.authenticate(Some("alice"), Some(b"no")),
            AuthResult::BadCredentials
        );
        assert_eq!(
            auth.authenticate(Some("alice"), None),
            AuthResult::BadCredentials
        );
        assert_eq!(
            auth.authenticate(Some("eve"), Some(b"pw")),
            AuthResult::BadCredentials
        );
        assert_eq!(
            auth.authenticate(None, Some(b"pw")),
            AuthResult::BadCredentials
        );
    }
}

#[test]
fn anonymous_clients_follow_the_listener_option() {
    let open = Authenticator::new(true, Some(file_with_alice()));
    let closed = Authenticator::new(false, Some(file_with_alice()));
    assert_eq!(open.authenticate(None, None), AuthResult::Allowed);
    assert_eq!(closed.authenticate(None, None), AuthResult::NotAuthorized);
}

#[test]
fn without_password_file_usernames_are_unverified_labels() {
    let open = Authenticator::new(true, None);
    let closed = Authenticator::new(false, None);
    assert_eq!(
        open.authenticate(Some("anyone"), Some(b"x")),
        AuthResult::Allowed
    );
    assert_eq!(
        closed.authenticate(Some("anyone"), Some(b"x")),
        AuthResult::NotAuthorized
    );
}

#[test]
fn auth_results_map_to_connack_codes() {
    assert_eq!(AuthResult::Allowed.connack_v5(), 0x00);
    assert_eq!(AuthResult::BadCredentials.connack_v5(), 0x86);
    assert_eq!(AuthResult::NotAuthorized.connack_v5(), 0x87);
    assert_eq!(AuthResult::Allowed.connack_v3(), 0x00);
    assert_eq!(AuthResult::BadCredentials.connack_v3(), 0x04);
    assert_eq!(AuthResult::NotAuthorized.connack_v3(), 0x05);
}
