//! Unknown-key detection with suggestions, from the field lists serde derives.
//!
//! serde's own `deny_unknown_fields` error lists every expected field but suggests
//! nothing, so the raw TOML table is walked first against the field names of each section
//! type, which serde hands to `deserialize_struct` (captured by [`fields_of`]): the list
//! can never drift from the structs.

use serde::de::{self, Deserialize, Deserializer, Visitor};

use crate::error::ConfigError;
use crate::model::{
    AuthConfig, HttpConfig, LogConfig, MqttConfig, NodeConfig, RawCluster, RawConfig, RawListener,
    RawTls, RouterSettings, StorageConfig,
};

/// The field names that `T`'s derived `Deserialize` accepts.
fn fields_of<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    let mut fields: &'static [&'static str] = &[];
    // The introspector always errors after recording the fields; the error is expected.
    let _ = T::deserialize(Introspect {
        fields: &mut fields,
    });
    fields
}

struct Introspect<'a> {
    fields: &'a mut &'static [&'static str],
}

impl<'de> Deserializer<'de> for Introspect<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("field introspection"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        *self.fields = fields;
        Err(de::Error::custom("field introspection"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// The sections and their field lists: (name in the file, fields).
fn sections() -> [(&'static str, &'static [&'static str]); 8] {
    [
        ("node", fields_of::<NodeConfig>()),
        ("mqtt", fields_of::<MqttConfig>()),
        ("router", fields_of::<RouterSettings>()),
        ("storage", fields_of::<StorageConfig>()),
        ("auth", fields_of::<AuthConfig>()),
        ("http", fields_of::<HttpConfig>()),
        ("log", fields_of::<LogConfig>()),
        ("cluster", fields_of::<RawCluster>()),
    ]
}

/// Reports the first key that no section defines, with the closest known key if one is
/// near. Values of the wrong type are left to deserialization, which names them.
pub(crate) fn check_unknown_keys(root: &toml::Table) -> Result<(), ConfigError> {
    check_table("", root, fields_of::<RawConfig>())?;
    for (name, fields) in sections() {
        if let Some(toml::Value::Table(t)) = root.get(name) {
            check_table(name, t, fields)?;
        }
    }
    if let Some(toml::Value::Array(listeners)) = root.get("listeners") {
        for (i, l) in listeners.iter().enumerate() {
            let toml::Value::Table(l) = l else { continue };
            let parent = format!("listeners[{i}]");
            check_table(&parent, l, fields_of::<RawListener>())?;
            if let Some(toml::Value::Table(tls)) = l.get("tls") {
                check_table(&format!("{parent}.tls"), tls, fields_of::<RawTls>())?;
            }
        }
    }
    Ok(())
}

fn check_table(parent: &str, table: &toml::Table, known: &[&str]) -> Result<(), ConfigError> {
    match table.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(key) => Err(ConfigError::UnknownKey {
            parent: parent.to_owned(),
            key: key.clone(),
            suggestion: suggest(key, known).map(str::to_owned),
        }),
    }
}

/// The known key closest to `key` by edit distance, if close enough to be a typo: at most
/// a third of the key's length (at least 1, at most 3 edits), or a case-only difference.
fn suggest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    let limit = (key.chars().count() / 3).clamp(1, 3);
    known
        .iter()
        .map(|k| (edit_distance(&key.to_lowercase(), k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = Vec::with_capacity(b.len() + 1);
        cur.push(i + 1);
        for (j, cb) in b.iter().enumerate() {
            let substitute = prev[j] + usize::from(ca != *cb);
            cur.push(substitute.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

pub(crate) fn all_keys() -> Vec<String> {
    let mut keys = Vec::new();
    for (name, fields) in sections() {
        keys.extend(fields.iter().map(|f| format!("{name}.{f}")));
    }
    for f in fields_of::<RawListener>() {
        if *f != "tls" {
            keys.push(format!("listeners[].{f}"));
        }
    }
    keys.extend(
        fields_of::<RawTls>()
            .iter()
            .map(|f| format!("listeners[].tls.{f}")),
    );
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn introspection_sees_every_section_field() {
        assert_eq!(
            fields_of::<RawConfig>(),
            [
                "node",
                "listeners",
                "mqtt",
                "router",
                "storage",
                "auth",
                "http",
                "log",
                "cluster"
            ]
        );
        assert!(fields_of::<MqttConfig>().contains(&"max_packet_size"));
        assert!(fields_of::<RawTls>().contains(&"cn_as_username"));
    }

    #[test]
    fn typos_get_the_closest_key_and_strangers_get_none() {
        let known = ["mqtt", "node", "listeners", "auth", "log"];
        assert_eq!(suggest("mqt", &known), Some("mqtt"));
        assert_eq!(suggest("listener", &known), Some("listeners"));
        assert_eq!(suggest("MQTT", &known), Some("mqtt"));
        assert_eq!(suggest("database", &known), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
