//! Calls handed back: what a client may change in a tool call it sends back on the next turn
//! while the call stays the one the model made.
//!
//! Clients re-serialise arguments (key order, spacing, `\u` escapes, `1.0` written as `1`)
//! and fill in what a tool's schema declares as default (Claude Code adds
//! `"replace_all": false` to its `Edit` calls). [`canonical`] reads arguments so that none of
//! that counts: numbers by value, keys in order, and every key whose value is its declared
//! default left out, naming those keys, so the change can be recorded.

use serde_json::{Map, Value};
use std::hash::{Hash, Hasher};

/// A call's arguments read so that re-serialising and filling in declared defaults change
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canonical {
    /// Hash of the name and the arguments without their default-valued keys.
    pub hash: u64,
    /// The keys at their declared default (paths: `opts.verbose`, `items[].flag`), in order.
    pub default_keys: Vec<String>,
}

/// The canonical form of a call to `name` with `arguments`, under the function's parameter
/// `schema` (none: no key has a default).
pub fn canonical(name: &str, arguments: &Value, schema: Option<&Value>) -> Canonical {
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    name.hash(&mut hasher);
    let mut default_keys = Vec::new();
    walk(arguments, schema, "", &mut hasher, &mut default_keys);
    Canonical {
        hash: hasher.finish(),
        default_keys,
    }
}

/// Hashes `value` as its schema reads it, noting the keys at their default under `path`.
fn walk(
    value: &Value,
    schema: Option<&Value>,
    path: &str,
    hasher: &mut impl Hasher,
    defaults: &mut Vec<String>,
) {
    match value {
        Value::Null => 0u8.hash(hasher),
        Value::Bool(b) => (1u8, b).hash(hasher),
        Value::Number(n) => number(n, hasher),
        Value::String(s) => (3u8, s).hash(hasher),
        Value::Array(items) => {
            (4u8, items.len()).hash(hasher);
            let item_schema = schema.and_then(|s| s.get("items"));
            let item_path = format!("{path}[]");
            for item in items {
                walk(item, item_schema, &item_path, hasher, defaults);
            }
        }
        Value::Object(map) => object(map, schema, path, hasher, defaults),
    }
}

fn object(
    map: &Map<String, Value>,
    schema: Option<&Value>,
    path: &str,
    hasher: &mut impl Hasher,
    defaults: &mut Vec<String>,
) {
    let properties = schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object);
    let property = |key: &str| properties.and_then(|p| p.get(key));
    let mut kept: Vec<(&String, &Value)> = Vec::with_capacity(map.len());
    for (key, value) in map {
        let at = match path {
            "" => key.clone(),
            _ => format!("{path}.{key}"),
        };
        let default = property(key).and_then(|p| p.get("default"));
        if default.is_some_and(|default| same(value, default)) {
            defaults.push(at);
        } else {
            kept.push((key, value));
        }
    }
    kept.sort_by(|a, b| a.0.cmp(b.0));
    (5u8, kept.len()).hash(hasher);
    for (key, value) in kept {
        key.hash(hasher);
        let at = match path {
            "" => key.clone(),
            _ => format!("{path}.{key}"),
        };
        walk(value, property(key), &at, hasher, defaults);
    }
}

/// A number by its value: `1`, `1.0` and `1e0` hash alike.
fn number(n: &serde_json::Number, hasher: &mut impl Hasher) {
    let integer = n.as_i64().map(i128::from).or(n.as_u64().map(i128::from));
    let integer = integer.or_else(|| {
        let f = n.as_f64()?;
        (f.fract() == 0.0 && f.abs() < 9.2e18).then_some(f as i128)
    });
    match integer {
        Some(i) => (2u8, i).hash(hasher),
        None => (6u8, n.as_f64().unwrap_or(f64::NAN).to_bits()).hash(hasher),
    }
}

/// Whether two JSON values are the same value (numbers compared by value).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn edit_schema() -> Value {
        json!({"type": "object", "properties": {
            "file_path": {"type": "string"},
            "replace_all": {"type": "boolean", "default": false},
            "opts": {"type": "object", "properties": {"verbose": {"type": "boolean", "default": false}}}
        }})
    }

    #[test]
    fn defaults_filled_in_and_reserialised_numbers_read_the_same() {
        let schema = edit_schema();
        let issued = canonical("Edit", &json!({"file_path": "/a", "n": 1.0}), Some(&schema));
        let echoed = canonical(
            "Edit",
            &json!({"n": 1, "replace_all": false, "file_path": "/a", "opts": {"verbose": false}}),
            Some(&schema),
        );
        assert_ne!(issued.hash, echoed.hash, "an empty object is still a value");
        let echoed = canonical(
            "Edit",
            &json!({"n": 1, "replace_all": false, "file_path": "/a"}),
            Some(&schema),
        );
        assert_eq!(issued.hash, echoed.hash);
        assert_eq!(echoed.default_keys, ["replace_all"]);
        let nested = canonical(
            "Edit",
            &json!({"file_path": "/a", "n": 1, "opts": {"verbose": false}}),
            Some(&schema),
        );
        assert_eq!(nested.default_keys, ["opts.verbose"]);
    }

    #[test]
    fn a_real_change_is_a_different_call() {
        let schema = edit_schema();
        let issued = canonical("Edit", &json!({"file_path": "/a"}), Some(&schema));
        for other in [
            canonical("Edit", &json!({"file_path": "/b"}), Some(&schema)),
            canonical(
                "Edit",
                &json!({"file_path": "/a", "replace_all": true}),
                Some(&schema),
            ),
            canonical(
                "Edit",
                &json!({"file_path": "/a", "extra": false}),
                Some(&schema),
            ),
            canonical("Write", &json!({"file_path": "/a"}), Some(&schema)),
            canonical(
                "Edit",
                &json!({"file_path": "/a", "replace_all": false}),
                None,
            ),
            canonical("Edit", &json!({"file_path": "/a", "n": 1.5}), Some(&schema)),
        ] {
            assert_ne!(issued.hash, other.hash, "{other:?}");
        }
    }
}
