//! Messages as they arrive. The fields validation looks at are taken out while the JSON is
//! parsed, so no JSON object is built per message: a long rollout resends hundreds of them
//! every turn.

use crate::json_shape::{FromShape, deserialize_by_shape};
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::{Map, Value};

/// One entry of `messages`, as sent.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct WireMessage {
    /// `false` when the entry is not a JSON object (then every field is empty).
    pub is_object: bool,
    /// `role`, as sent.
    pub role: Option<Value>,
    /// `content`, as sent.
    pub content: Option<Value>,
    /// `tool_calls`, as sent.
    pub tool_calls: Option<Value>,
    /// Every other field, in the order sent.
    pub extra: Map<String, Value>,
}

impl WireMessage {
    fn set(&mut self, field: Field, value: Value) {
        match field {
            Field::Role => self.role = Some(value),
            Field::Content => self.content = Some(value),
            Field::ToolCalls => self.tool_calls = Some(value),
            Field::Other(key) => {
                self.extra.insert(key, value);
            }
        }
    }
}

/// A message's key; only the others are allocated.
enum Field {
    Role,
    Content,
    ToolCalls,
    Other(String),
}

impl From<&str> for Field {
    fn from(key: &str) -> Self {
        match key {
            "role" => Self::Role,
            "content" => Self::Content,
            "tool_calls" => Self::ToolCalls,
            other => Self::Other(other.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldVisitor;
        impl Visitor<'_> for FieldVisitor {
            type Value = Field;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E>(self, key: &str) -> Result<Field, E> {
                Ok(Field::from(key))
            }
        }
        deserializer.deserialize_identifier(FieldVisitor)
    }
}

impl From<Value> for WireMessage {
    fn from(value: Value) -> Self {
        let Value::Object(object) = value else {
            return Self::default();
        };
        let mut message = Self {
            is_object: true,
            ..Self::default()
        };
        for (key, value) in object {
            message.set(Field::from(key.as_str()), value);
        }
        message
    }
}

impl FromShape for WireMessage {
    /// Anything but an object is kept as "not an object", for validation to reject with its
    /// index.
    fn other() -> Self {
        WireMessage::default()
    }

    fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<WireMessage, A::Error> {
        let mut message = WireMessage {
            is_object: true,
            ..WireMessage::default()
        };
        while let Some(field) = map.next_key::<Field>()? {
            let value = map.next_value::<Value>()?;
            message.set(field, value);
        }
        Ok(message)
    }
}

deserialize_by_shape!(WireMessage);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parsed_and_converted_messages_agree() {
        let text = r#"[{"role": "tool", "tool_call_id": "c1", "content": "x\"y", "name": "f"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c2"}]},
            "text", 5, [1, [2]], null, {}]"#;
        let parsed: Vec<WireMessage> = serde_json::from_str(text).unwrap();
        let values: Vec<Value> = serde_json::from_str(text).unwrap();
        let converted: Vec<WireMessage> = values.into_iter().map(WireMessage::from).collect();
        assert_eq!(parsed, converted);
        assert_eq!(parsed[0].content, Some(json!("x\"y")));
        assert_eq!(
            parsed[0].extra.keys().collect::<Vec<_>>(),
            ["tool_call_id", "name"]
        );
        assert_eq!(parsed[1].content, Some(Value::Null));
        assert!(parsed[2..6].iter().all(|m| !m.is_object));
        assert!(parsed[6].is_object && parsed[6].role.is_none());
    }
}
