//! A Messages body's conversation as sent, read straight into the fields the reader uses:
//! no JSON tree is built for a message or a content block (building and searching one cost a
//! Messages turn about 3% more than a chat turn). A field of an unexpected type reads as absent
//! or as [`Content::Other`], never as an error, so the reader can still name what is wrong.

use crate::json_shape::{FromShape, deserialize_by_shape};
use serde::Deserialize;
use serde::de::value::SeqAccessDeserializer;
use serde::de::{IgnoredAny, MapAccess, SeqAccess};
use serde_json::Value;

/// `messages`: a list of messages, or anything else.
#[derive(Debug)]
pub enum Turns {
    /// A list.
    List(Vec<Turn>),
    /// Not a list.
    Other,
}

/// One element of `messages`; anything but an object reads as one without fields.
#[derive(Debug, Default)]
pub struct Turn {
    /// `role`, when it is a string.
    pub role: Option<String>,
    /// `content`, when present.
    pub content: Option<Content>,
}

/// A message's (or a tool result's, or `system`'s) content.
#[derive(Debug)]
pub enum Content {
    /// A string: one text block.
    Text(String),
    /// A list of content blocks.
    Blocks(Vec<Block>),
    /// `null`.
    Null,
    /// Anything else.
    Other,
}

/// A content block; anything but an object reads as one without fields. Each field is `None`
/// when absent; the string and boolean ones also when of another type.
#[derive(Debug, Default)]
pub struct Block {
    /// `type`.
    pub kind: Option<String>,
    /// `text` (a text block).
    pub text: Option<String>,
    /// `thinking` (a thinking block).
    pub thinking: Option<String>,
    /// `id` (a tool use), present with a string or not.
    pub id: Option<Option<String>>,
    /// `name` (a tool use), present with a string or not.
    pub name: Option<Option<String>>,
    /// `input` (a tool use), whatever it is.
    pub input: Option<Value>,
    /// `tool_use_id` (a tool result).
    pub tool_use_id: Option<String>,
    /// `content` (a tool result).
    pub content: Option<Content>,
    /// `is_error` (a tool result).
    pub is_error: Option<bool>,
    /// `source` (an image).
    pub source: Option<Value>,
}

deserialize_by_shape!(Turns, Turn, Content, Block, Scalar, TurnKey, BlockKey);

/// A string or a boolean, or anything else.
enum Scalar {
    Str(String),
    Bool(bool),
    Other,
}

impl Scalar {
    fn string(self) -> Option<String> {
        match self {
            Scalar::Str(s) => Some(s),
            _ => None,
        }
    }
}

impl FromShape for Scalar {
    fn other() -> Self {
        Scalar::Other
    }
    fn from_str(v: &str) -> Self {
        Scalar::Str(v.to_string())
    }
    fn from_bool(v: bool) -> Self {
        Scalar::Bool(v)
    }
}

impl FromShape for Turns {
    fn other() -> Self {
        Turns::Other
    }
    fn from_seq<'de, A: SeqAccess<'de>>(seq: A) -> Result<Self, A::Error> {
        Ok(Turns::List(Vec::deserialize(SeqAccessDeserializer::new(
            seq,
        ))?))
    }
}

enum TurnKey {
    Role,
    Content,
    Other,
}

impl FromShape for TurnKey {
    fn other() -> Self {
        TurnKey::Other
    }
    fn from_str(v: &str) -> Self {
        match v {
            "role" => TurnKey::Role,
            "content" => TurnKey::Content,
            _ => TurnKey::Other,
        }
    }
}

impl FromShape for Turn {
    fn other() -> Self {
        Turn::default()
    }
    fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut turn = Turn::default();
        while let Some(key) = map.next_key::<TurnKey>()? {
            match key {
                TurnKey::Role => turn.role = map.next_value::<Scalar>()?.string(),
                TurnKey::Content => turn.content = Some(map.next_value()?),
                TurnKey::Other => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(turn)
    }
}

impl FromShape for Content {
    fn other() -> Self {
        Content::Other
    }
    fn from_str(v: &str) -> Self {
        Content::Text(v.to_string())
    }
    fn from_null() -> Self {
        Content::Null
    }
    fn from_seq<'de, A: SeqAccess<'de>>(seq: A) -> Result<Self, A::Error> {
        Ok(Content::Blocks(Vec::deserialize(
            SeqAccessDeserializer::new(seq),
        )?))
    }
}

enum BlockKey {
    Type,
    Text,
    Thinking,
    Id,
    Name,
    Input,
    ToolUseId,
    Content,
    IsError,
    Source,
    Other,
}

impl FromShape for BlockKey {
    fn other() -> Self {
        BlockKey::Other
    }
    fn from_str(v: &str) -> Self {
        match v {
            "type" => BlockKey::Type,
            "text" => BlockKey::Text,
            "thinking" => BlockKey::Thinking,
            "id" => BlockKey::Id,
            "name" => BlockKey::Name,
            "input" => BlockKey::Input,
            "tool_use_id" => BlockKey::ToolUseId,
            "content" => BlockKey::Content,
            "is_error" => BlockKey::IsError,
            "source" => BlockKey::Source,
            _ => BlockKey::Other,
        }
    }
}

impl FromShape for Block {
    fn other() -> Self {
        Block::default()
    }
    fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut block = Block::default();
        while let Some(key) = map.next_key::<BlockKey>()? {
            let string = |value: Scalar| value.string();
            match key {
                BlockKey::Type => block.kind = string(map.next_value()?),
                BlockKey::Text => block.text = string(map.next_value()?),
                BlockKey::Thinking => block.thinking = string(map.next_value()?),
                BlockKey::Id => block.id = Some(string(map.next_value()?)),
                BlockKey::Name => block.name = Some(string(map.next_value()?)),
                BlockKey::Input => block.input = Some(map.next_value()?),
                BlockKey::ToolUseId => block.tool_use_id = string(map.next_value()?),
                BlockKey::Content => block.content = Some(map.next_value()?),
                BlockKey::IsError => {
                    block.is_error = match map.next_value()? {
                        Scalar::Bool(b) => Some(b),
                        _ => None,
                    }
                }
                BlockKey::Source => block.source = Some(map.next_value()?),
                BlockKey::Other => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(block)
    }
}
