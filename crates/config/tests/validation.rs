//! One test per validation rule: each error names the key and the problem.

use std::net::SocketAddr;

use starling_config::{Config, ConfigError, ListenerKind, Warning};

fn err(text: &str) -> ConfigError {
    match Config::from_str(text) {
        Ok(c) => panic!("expected an error for {text:?}, got {c:?}"),
        Err(e) => e,
    }
}

fn msg(text: &str) -> String {
    err(text).to_string()
}

fn ok(text: &str) -> (Config, Vec<Warning>) {
    Config::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

#[test]
fn empty_file_gives_the_defaults() {
    let (config, warnings) = ok("");
    assert_eq!(config, Config::default());
    assert!(warnings.is_empty());
    let l = &config.listeners[0];
    assert_eq!(config.listeners.len(), 1);
    assert_eq!(l.kind, ListenerKind::Tcp);
    assert_eq!(l.bind, "0.0.0.0:1883".parse::<SocketAddr>().unwrap());
    assert_eq!(config.mqtt.max_packet_size, 1024 * 1024);
    assert_eq!(config.mqtt.max_inflight, 32);
    assert_eq!(config.mqtt.max_mqueue_len, 1000);
    assert_eq!(config.mqtt.session_expiry_max_secs, 7200);
    assert_eq!(config.node.id, 1);
    assert_eq!(config.log.level, "info");
}

#[test]
fn unknown_top_level_key_suggests_the_closest() {
    assert_eq!(
        msg("[mqt]\n"),
        r#"unknown key "mqt" (did you mean "mqtt"?)"#
    );
}

#[test]
fn unknown_section_key_names_the_section_and_suggests() {
    assert_eq!(
        msg("[mqtt]\nmax_packet_sise = 10\n"),
        r#"mqtt: unknown key "max_packet_sise" (did you mean "max_packet_size"?)"#
    );
}

#[test]
fn unknown_key_without_a_near_match_has_no_suggestion() {
    assert_eq!(msg("database = 1\n"), r#"unknown key "database""#);
}

#[test]
fn unknown_listener_and_tls_keys_name_the_listener() {
    let m = msg("[[listeners]]\nkind = \"tcp\"\n[[listeners]]\nkind = \"tcp\"\nbind = \"0.0.0.0:1\"\nmax_conections = 5\n");
    assert_eq!(
        m,
        r#"listeners[1]: unknown key "max_conections" (did you mean "max_connections"?)"#
    );
    let m = msg("[[listeners]]\nkind = \"tls\"\n[listeners.tls]\ncert = \"a\"\n");
    assert!(
        m.starts_with(r#"listeners[0].tls: unknown key "cert""#),
        "{m}"
    );
}

#[test]
fn max_packet_size_zero_is_out_of_range() {
    let e = err("[mqtt]\nmax_packet_size = 0\n");
    assert_eq!(e.key(), Some("mqtt.max_packet_size"));
    assert_eq!(
        e.to_string(),
        "mqtt.max_packet_size: 0 is not allowed (must be between 2 and 268435455)"
    );
}

#[test]
fn max_packet_size_above_protocol_maximum_is_out_of_range() {
    assert!(msg("[mqtt]\nmax_packet_size = 268435456\n")
        .starts_with("mqtt.max_packet_size: 268435456 is not allowed"));
}

#[test]
fn each_mqtt_limit_refuses_its_out_of_range_value() {
    let cases = [
        ("max_inflight", "0"),
        ("max_mqueue_len", "0"),
        ("backpressure_max_secs", "0"),
        ("backpressure_max_secs", "3601"),
        ("keepalive_max_secs", "0"),
        ("session_expiry_max_secs", "4294967295"),
        ("message_expiry_max_secs", "0"),
        ("retry_interval_secs", "0"),
        ("retry_interval_secs", "86401"),
        ("receive_max", "0"),
        ("client_id_len_max", "22"),
        ("topic_levels_max", "0"),
        ("topic_len_max", "0"),
        ("subscriptions_max", "0"),
        ("retained_max", "0"),
        ("retained_bytes_max", "0"),
        ("max_qos", "3"),
        ("delayed_publish_max", "0"),
        ("delayed_max_secs", "0"),
        ("sys_interval_secs", "0"),
    ];
    for (key, value) in cases {
        let e = err(&format!("[mqtt]\n{key} = {value}\n"));
        let full = format!("mqtt.{key}");
        assert_eq!(e.key(), Some(full.as_str()), "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("{full}: {value} is not allowed")),
            "{e}"
        );
    }
}

#[test]
fn value_too_large_for_its_type_names_the_key() {
    let e = err("[mqtt]\nmax_inflight = 70000\n");
    assert_eq!(e.key(), Some("mqtt.max_inflight"));
    assert_eq!(
        e.to_string(),
        "mqtt.max_inflight: invalid value: integer `70000`, expected an integer from 0 to 65535"
    );
}

#[test]
fn wrong_type_names_the_key() {
    let e = err("[mqtt]\nretain_available = \"yes\"\n");
    assert_eq!(e.key(), Some("mqtt.retain_available"));
    assert!(
        e.to_string()
            .starts_with("mqtt.retain_available: invalid type"),
        "{e}"
    );
}

#[test]
fn unknown_enum_word_names_the_key_and_the_choices() {
    let m = msg("[mqtt]\nshared_strategy = \"fastest\"\n");
    assert!(
        m.starts_with("mqtt.shared_strategy: unknown variant `fastest`"),
        "{m}"
    );
    assert!(m.contains("round_robin"), "{m}");
    let m = msg("[mqtt]\nmqueue_drop_policy = \"drop_old\"\n");
    assert!(m.starts_with("mqtt.mqueue_drop_policy:"), "{m}");
    let m = msg("[auth]\nacl_default = \"maybe\"\n");
    assert!(m.starts_with("auth.acl_default:"), "{m}");
}

#[test]
fn keepalive_min_above_max_is_refused() {
    assert_eq!(
        msg("[mqtt]\nkeepalive_max_secs = 60\nkeepalive_min_secs = 61\n"),
        "mqtt.keepalive_min_secs: 61 is greater than mqtt.keepalive_max_secs (60)"
    );
}

#[test]
fn empty_response_information_is_refused() {
    let e = err("[mqtt]\nresponse_information = \"\"\n");
    assert_eq!(e.key(), Some("mqtt.response_information"));
}

#[test]
fn node_id_zero_and_empty_name_are_refused() {
    assert_eq!(err("[node]\nid = 0\n").key(), Some("node.id"));
    assert_eq!(err("[node]\nname = \"\"\n").key(), Some("node.name"));
    assert_eq!(
        err("[node]\ndata_dir = \"\"\n").key(),
        Some("node.data_dir")
    );
}

#[test]
fn log_level_must_be_a_level_or_directives() {
    assert!(msg("[log]\nlevel = \"verbose\"\n")
        .starts_with("log.level: \"verbose\" is not a log level"));
    ok("[log]\nlevel = \"debug\"\n");
    ok("[log]\nlevel = \"info,starling_net=trace\"\n");
}

#[test]
fn bind_that_is_not_a_socket_address_names_the_listener() {
    let text = "[[listeners]]\nkind = \"tcp\"\n[[listeners]]\nkind = \"ws\"\n[[listeners]]\nkind = \"tcp\"\nbind = \"abc\"\n";
    assert!(msg(text).starts_with(r#"listeners[2].bind: "abc" is not a socket address"#));
}

#[test]
fn listener_kind_is_required_and_checked() {
    let m = msg("[[listeners]]\nbind = \"0.0.0.0:1\"\n");
    assert!(m.starts_with("listeners[0]: missing field `kind`"), "{m}");
    let m = msg("[[listeners]]\nkind = \"udp\"\n");
    assert!(
        m.starts_with("listeners[0].kind: unknown variant `udp`"),
        "{m}"
    );
}

#[test]
fn listener_bind_defaults_to_the_kinds_port() {
    let (config, _) = ok("[[listeners]]\nkind = \"tcp\"\n[[listeners]]\nkind = \"ws\"\n");
    assert_eq!(config.listeners[1].bind.port(), 8080);
    assert_eq!(config.listeners[1].ws.as_ref().unwrap().path, "/mqtt");
}

#[test]
fn duplicate_bind_names_both_listeners() {
    let text = "[[listeners]]\nkind = \"tcp\"\nbind = \"0.0.0.0:1883\"\n[[listeners]]\nkind = \"ws\"\nbind = \"127.0.0.1:1883\"\n";
    assert_eq!(
        msg(text),
        "listeners[1].bind: 127.0.0.1:1883 is already used by listeners[0] (0.0.0.0:1883)"
    );
}

#[test]
fn same_port_on_distinct_addresses_or_transports_is_fine() {
    ok("[[listeners]]\nkind = \"tcp\"\nbind = \"127.0.0.1:1883\"\n[[listeners]]\nkind = \"tcp\"\nbind = \"127.0.0.2:1883\"\n");
    // QUIC is UDP: it may share a port number with a TCP listener.
    let (config, warnings) = ok("[[listeners]]\nkind = \"tcp\"\nbind = \"0.0.0.0:1883\"\n[[listeners]]\nkind = \"quic\"\nbind = \"0.0.0.0:1883\"\n[listeners.tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n");
    assert!(warnings.is_empty());
    assert_eq!(
        config.listeners[1].quic.as_ref().unwrap().idle_timeout_secs,
        30
    );
}

#[test]
fn tls_listener_without_certificate_is_disabled_with_a_warning() {
    let text = "[[listeners]]\nkind = \"tcp\"\n[[listeners]]\nkind = \"tls\"\n";
    let (config, warnings) = ok(text);
    assert_eq!(config.listeners.len(), 1);
    assert_eq!(config.listeners[0].kind, ListenerKind::Tcp);
    assert_eq!(
        warnings,
        [Warning::ListenerNeedsCertificate {
            index: 1,
            kind: ListenerKind::Tls,
            bind: "0.0.0.0:8883".parse().unwrap(),
        }]
    );
    assert!(warnings[0]
        .to_string()
        .starts_with("listeners[1]: tls listener on 0.0.0.0:8883 is disabled"));
}

#[test]
fn no_startable_listener_is_an_error() {
    assert!(matches!(
        err("[[listeners]]\nkind = \"wss\"\n"),
        ConfigError::NoListeners
    ));
    assert!(matches!(err("listeners = []\n"), ConfigError::NoListeners));
}

#[test]
fn cert_without_key_is_an_error_not_a_warning() {
    let e = err("[[listeners]]\nkind = \"tls\"\n[listeners.tls]\ncert_file = \"c.pem\"\n");
    assert_eq!(e.key(), Some("listeners[0].tls.key_file"));
    let e = err("[[listeners]]\nkind = \"tls\"\n[listeners.tls]\nkey_file = \"k.pem\"\n");
    assert_eq!(e.key(), Some("listeners[0].tls.cert_file"));
}

#[test]
fn verify_client_needs_a_ca_and_cn_as_username_needs_verify_client() {
    let base =
        "[[listeners]]\nkind = \"tls\"\n[listeners.tls]\ncert_file = \"c\"\nkey_file = \"k\"\n";
    let e = err(&format!("{base}verify_client = true\n"));
    assert_eq!(e.key(), Some("listeners[0].tls.verify_client"));
    let e = err(&format!("{base}ca_file = \"ca\"\ncn_as_username = true\n"));
    assert_eq!(e.key(), Some("listeners[0].tls.cn_as_username"));
    let (config, _) = ok(&format!(
        "{base}ca_file = \"ca\"\nverify_client = true\ncn_as_username = true\n"
    ));
    let tls = config.listeners[0].tls.as_ref().unwrap();
    assert!(tls.verify_client && tls.cn_as_username);
}

#[test]
fn keys_that_do_not_apply_to_the_kind_are_refused() {
    let cases = [
        ("ws", "proxy_protocol = true", "listeners[0].proxy_protocol"),
        (
            "quic",
            "proxy_protocol = false",
            "listeners[0].proxy_protocol",
        ),
        ("tcp", "ws_path = \"/x\"", "listeners[0].ws_path"),
        (
            "tls",
            "ws_x_forwarded_for = true",
            "listeners[0].ws_x_forwarded_for",
        ),
        (
            "ws",
            "idle_timeout_secs = 5",
            "listeners[0].idle_timeout_secs",
        ),
        (
            "tcp",
            "[listeners.tls]\ncert_file = \"c\"",
            "listeners[0].tls",
        ),
    ];
    for (kind, line, key) in cases {
        let e = err(&format!("[[listeners]]\nkind = \"{kind}\"\n{line}\n"));
        assert_eq!(e.key(), Some(key), "{e}");
        assert!(e.to_string().contains(&format!("not {kind}")), "{e}");
    }
}

#[test]
fn listener_limits_are_range_checked() {
    for (line, key) in [
        ("max_connections = 0", "listeners[0].max_connections"),
        ("max_handshakes = 0", "listeners[0].max_handshakes"),
        (
            "handshake_timeout_secs = 0",
            "listeners[0].handshake_timeout_secs",
        ),
        (
            "handshake_timeout_secs = 3601",
            "listeners[0].handshake_timeout_secs",
        ),
    ] {
        let e = err(&format!("[[listeners]]\nkind = \"tcp\"\n{line}\n"));
        assert_eq!(e.key(), Some(key), "{e}");
    }
    let e = err("[[listeners]]\nkind = \"quic\"\nidle_timeout_secs = 0\n[listeners.tls]\ncert_file = \"c\"\nkey_file = \"k\"\n");
    assert_eq!(e.key(), Some("listeners[0].idle_timeout_secs"));
}

#[test]
fn ws_path_must_start_with_a_slash() {
    let e = err("[[listeners]]\nkind = \"ws\"\nws_path = \"mqtt\"\n");
    assert_eq!(e.key(), Some("listeners[0].ws_path"));
}

#[test]
fn toml_syntax_errors_carry_the_line() {
    let m = msg("[mqtt\n");
    assert!(m.starts_with("TOML syntax:"), "{m}");
    assert!(m.contains("line 1"), "{m}");
}

#[test]
fn relative_paths_stay_as_written_from_str() {
    let (config, _) = ok("[auth]\npassword_file = \"passwd\"\n");
    assert_eq!(
        config.auth.password_file.as_deref(),
        Some(std::path::Path::new("passwd"))
    );
}

#[test]
fn section_of_the_wrong_type_says_table() {
    assert_eq!(
        msg("mqtt = 5\n"),
        "mqtt: invalid type: integer `5`, expected a table"
    );
}

#[test]
fn pre_authentication_limits_are_checked_and_fit_the_packet_size() {
    let tcp = "[[listeners]]\nkind = \"tcp\"\n";
    assert_eq!(
        msg(&format!("{tcp}max_connect_packet_size = 100\n")),
        "listeners[0].max_connect_packet_size: 100 is not allowed (must be between 256 and 268435455)"
    );
    assert_eq!(
        msg(&format!(
            "{tcp}max_connect_packet_size = 65536\n[mqtt]\nmax_packet_size = 4096\n"
        )),
        "listeners[0].max_connect_packet_size: 65536 is greater than mqtt.max_packet_size (4096)"
    );
    assert!(msg(&format!(
        "{tcp}max_connect_packet_size = 8192\nconnect_read_budget_bytes = 4096\n"
    ))
    .starts_with("listeners[0].connect_read_budget_bytes: 4096 is not allowed"));
    // Left out, the defaults shrink to a smaller max_packet_size.
    let (c, _) = ok(&format!("{tcp}[mqtt]\nmax_packet_size = 4096\n"));
    assert_eq!(c.listeners[0].max_connect_packet_size, 4096);
    assert_eq!(c.listeners[0].connect_read_budget_bytes, 16 * 1024 * 1024);
}

#[test]
fn login_limits_are_checked() {
    for (key, bad) in [
        ("verify_threads", 0),
        ("verify_threads", 257),
        ("verify_queue", 0),
        ("failed_logins_max", 0),
        ("failed_logins_window_secs", 0),
        ("failed_login_ban_secs", 86_401),
        ("verdict_timeout_ms", 0),
        ("verdict_timeout_ms", 60_001),
    ] {
        let m = msg(&format!("[auth]\n{key} = {bad}\n"));
        assert!(
            m.starts_with(&format!("auth.{key}: {bad} is not allowed")),
            "{m}"
        );
    }
    let (c, _) = ok("[auth]\nverify_threads = 2\n");
    assert_eq!(c.auth.verify_threads, Some(2));
    assert_eq!(Config::default().auth.verify_queue, 32);
    let (c, _) = ok("[auth]\ntimeout_verdict = \"allow\"\nverdict_timeout_ms = 250\n");
    assert_eq!(
        c.auth.timeout_verdict,
        starling_config::TimeoutVerdict::Allow
    );
    assert_eq!(c.auth.verdict_timeout_ms, 250);
    assert_eq!(
        Config::default().auth.timeout_verdict,
        starling_config::TimeoutVerdict::Deny
    );
}

#[test]
fn router_shards_take_auto_or_a_count_in_range() {
    use starling_config::ShardCount;
    let shards = |v: &str| Config::from_str(&format!("[router]\nshards = {v}\n"));
    assert_eq!(
        shards("\"auto\"").unwrap().0.router.shards,
        ShardCount::Auto
    );
    assert_eq!(shards("4").unwrap().0.router.shards, ShardCount::Fixed(4));
    let e = shards("0").unwrap_err().to_string();
    assert!(e.contains("router.shards"), "{e}");
    let e = shards("\"many\"").unwrap_err().to_string();
    assert!(e.contains("router.shards") && e.contains("auto"), "{e}");
}

#[test]
fn cluster_peers_are_checked_and_name_the_key() {
    let three = "[node]\nid = 2\n[cluster]\nenabled = true\n[cluster.peers]\n1 = \"127.0.0.1:7001\"\n2 = \"127.0.0.1:7002\"\n3 = \"127.0.0.1:7003\"\n";
    let (c, _) = ok(three);
    assert!(c.cluster.enabled);
    assert_eq!(c.cluster.peers.len(), 3);
    assert_eq!(c.cluster.bind, "127.0.0.1:7002".parse().unwrap());
    assert!(c.cluster.bootstrap);

    let m = msg("[cluster]\nenabled = true\n[cluster.peers]\nx = \"127.0.0.1:7001\"\n");
    assert!(
        m.contains("cluster.peers.x") && m.contains("not a node id"),
        "{m}"
    );
    let m = msg("[cluster]\nenabled = true\n[cluster.peers]\n1 = \"nowhere\"\n");
    assert!(
        m.contains("cluster.peers.1") && m.contains("host:port"),
        "{m}"
    );
    let m = msg("[cluster]\nenabled = true\n[cluster.peers]\n1 = \"127.0.0.1:7001\"\n2 = \"127.0.0.1:7001\"\n");
    assert!(m.contains("cluster.peers.2") && m.contains("node 1"), "{m}");
    let m = msg("[cluster]\nenabled = true\n");
    assert!(
        m.contains("cluster.peers") && m.contains("no member"),
        "{m}"
    );
    // This node (id 1 by default) bootstrapping but not listed.
    let m = msg("[cluster]\nenabled = true\n[cluster.peers]\n2 = \"127.0.0.1:7002\"\n");
    assert!(m.contains("cluster.bootstrap"), "{m}");
    let m = msg("[cluster]\ntick_ms = 1\n");
    assert!(m.contains("cluster.tick_ms"), "{m}");
    let m = msg("[cluster]\nforward_window_messages = 1000001\n");
    assert!(
        m.contains("cluster.forward_window_messages") && m.contains("between 0 and 1000000"),
        "{m}"
    );
    let (c, _) = ok("[cluster]\nforward_window_messages = 100\n");
    assert_eq!(c.cluster.forward_window_messages, 100);
    assert_eq!(ok("").0.cluster.forward_window_messages, 0, "automatic");
    let m = msg("[cluster]\nbootstarp = true\n");
    assert!(m.contains("bootstrap"), "{m}");
    // A joining node needs only its own bind.
    let (c, _) = ok("[cluster]\nenabled = true\nbootstrap = false\nbind = \"127.0.0.1:7004\"\n[cluster.peers]\n1 = \"127.0.0.1:7001\"\n");
    assert_eq!(c.cluster.bind, "127.0.0.1:7004".parse().unwrap());
}
