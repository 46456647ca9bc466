//! A Messages body's conversation as sent, read straight into the fields the reader uses:
//! no JSON tree is built for a message or a content block (building and searching one cost a
//! Messages turn about 3% more than a chat turn). A field of an unexpected type reads as absent
//! or as [`Content::Other`], never as an error, so the reader can still name what is wrong.

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::marker::PhantomData;

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
}

/// A type read from whichever JSON value comes: each kind of value it does not read is read
/// past and gives [`FromShape::other`].
trait FromShape: Sized {
    fn other() -> Self;
    fn from_str(_: &str) -> Self {
        Self::other()
    }
    fn from_bool(_: bool) -> Self {
        Self::other()
    }
    fn from_null() -> Self {
        Self::other()
    }
    fn from_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Self::other())
    }
    fn from_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Self::other())
    }
}

struct Shaped<T>(PhantomData<T>);

impl<'de, T: FromShape> Visitor<'de> for Shaped<T> {
    type Value = T;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<T, E> {
        Ok(T::from_bool(v))
    }
    fn visit_i64<E>(self, _: i64) -> Result<T, E> {
        Ok(T::other())
    }
    fn visit_u64<E>(self, _: u64) -> Result<T, E> {
        Ok(T::other())
    }
    fn visit_f64<E>(self, _: f64) -> Result<T, E> {
        Ok(T::other())
    }
    fn visit_str<E>(self, v: &str) -> Result<T, E> {
        Ok(T::from_str(v))
    }
    fn visit_unit<E>(self) -> Result<T, E> {
        Ok(T::from_null())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        T::from_seq(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::from_map(map)
    }
}

/// Implements `Deserialize` through [`FromShape`].
macro_rules! deserialize_by_shape {
    ($($name:ty),*) => {$(
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_any(Shaped(PhantomData))
            }
        }
    )*};
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
    fn from_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut turns = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(turn) = seq.next_element()? {
            turns.push(turn);
        }
        Ok(Turns::List(turns))
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
    fn from_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut blocks = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(block) = seq.next_element()? {
            blocks.push(block);
        }
        Ok(Content::Blocks(blocks))
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
                BlockKey::Other => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(block)
    }
}
