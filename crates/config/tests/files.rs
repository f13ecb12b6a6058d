//! The shipped files: `config/starling.toml` documents every key at its default, and
//! `config/conformance.toml` has what the Paho suites need.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use starling_auth::{Acl, Action, ClientInfo, Decision};
use starling_config::{all_keys, AclDefault, Config, ListenerKind};

fn repo_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../config")
        .join(name)
}

#[test]
fn starling_toml_loads_to_the_defaults() {
    let text = std::fs::read_to_string(repo_file("starling.toml")).expect("read starling.toml");
    let (config, warnings) = Config::from_str(&text).expect("starling.toml is valid");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(config, Config::default());
}

#[test]
fn starling_toml_mentions_every_key() {
    let text = std::fs::read_to_string(repo_file("starling.toml")).expect("read starling.toml");
    let assigned: Vec<String> = text
        .lines()
        .map(|l| l.trim_start_matches([' ', '#']))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim().to_owned()))
        .collect();
    for key in all_keys() {
        let field = key.rsplit('.').next().expect("non-empty key");
        assert!(
            assigned.iter().any(|a| a == field),
            "config/starling.toml does not document {key}"
        );
    }
    for section in [
        "[node]",
        "[[listeners]]",
        "[listeners.tls]",
        "[mqtt]",
        "[auth]",
        "[log]",
    ] {
        assert!(
            text.contains(section),
            "config/starling.toml lacks {section}"
        );
    }
}

#[test]
fn load_resolves_relative_paths_against_the_files_directory() {
    let path = repo_file("conformance.toml");
    let (config, _) = Config::load(&path).expect("conformance.toml is valid");
    let dir = path.parent().expect("has a parent");
    assert_eq!(
        config.auth.acl_file.as_deref(),
        Some(dir.join("conformance-acl.toml").as_path())
    );
    assert_eq!(config.node.data_dir, dir.join("../target/conformance-data"));
}

#[test]
fn conformance_toml_has_what_the_paho_suites_need() {
    let (config, warnings) = Config::load(repo_file("conformance.toml")).expect("valid");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(config.mqtt.keepalive_max_secs, 60);
    assert!(
        config.mqtt.allow_zero_keepalive,
        "paho 3.1.1 connects with keep alive 0"
    );
    let tcp = &config.listeners[0];
    assert_eq!(tcp.kind, ListenerKind::Tcp);
    assert_eq!(tcp.bind, "127.0.0.1:1883".parse().unwrap());
    assert!(config.listeners.iter().all(|l| l.allow_anonymous));
    assert_eq!(config.auth.acl_default, AclDefault::Allow);

    let acl = Acl::load(config.auth.acl_file.expect("an ACL file")).expect("ACL loads");
    let client = ClientInfo {
        username: None,
        client_id: "myclientid",
        addr: IpAddr::from([127, 0, 0, 1]),
    };
    assert_eq!(
        acl.check(&client, Action::Subscribe, "test/nosubscribe"),
        Decision::Deny
    );
    assert_eq!(
        acl.check(&client, Action::Subscribe, "TopicA/#"),
        Decision::Allow
    );
    assert_eq!(
        acl.check(&client, Action::Publish, "test/nosubscribe"),
        Decision::Allow
    );
}

#[test]
fn load_errors_name_the_file_and_the_key() {
    let dir = std::env::temp_dir().join(format!("starling-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("bad.toml");
    std::fs::write(&path, "[mqtt]\nmax_inflight = 0\n").expect("write");
    let err = Config::load(&path).expect_err("invalid");
    assert_eq!(err.key(), Some("mqtt.max_inflight"));
    let msg = err.to_string();
    assert!(
        msg.contains("bad.toml: mqtt.max_inflight: 0 is not allowed"),
        "{msg}"
    );
    std::fs::remove_dir_all(&dir).ok();
    assert!(matches!(
        Config::load(dir.join("absent.toml")),
        Err(starling_config::ConfigError::Io { .. })
    ));
}
