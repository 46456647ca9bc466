//! Gemma 4 format: `<|tool_call>call:NAME{key:value,…}<tool_call|>`.
//!
//! Arguments are not JSON: keys are bare, strings are delimited by `<|"|>`, and other values are
//! JSON when they parse as JSON and text otherwise. A comma ends a bare value only when a
//! `key:` follows it, so `{city:Paris, FR,days:3}` is `{"city":"Paris, FR","days":3}`.

use super::scan::Cursor;
use super::{FoundCall, ToolParser};
use serde_json::{Map, Value};

const OPEN: &str = "<|tool_call>";
const CLOSE: &str = "<tool_call|>";
const CALL: &str = "call:";
/// Gemma 4's string delimiter.
const QUOTE: &str = "<|\"|>";

/// Parser for Gemma 4 `<|tool_call>` calls.
#[derive(Debug, Default, Clone, Copy)]
pub struct Gemma4Parser;

impl ToolParser for Gemma4Parser {
    fn name(&self) -> &'static str {
        "gemma4"
    }

    fn signals(&self) -> &'static [&'static str] {
        &[OPEN]
    }

    fn markers(&self) -> &'static [&'static str] {
        &[OPEN, CLOSE, QUOTE]
    }

    fn block_len(&self, held: &str) -> Option<usize> {
        match read_call(held, 0) {
            // A closer inside a string value is data: the call ends after its arguments.
            Ok(call) => {
                let rest = &held[call.args_end..];
                let close = rest.trim_start().strip_prefix(CLOSE)?;
                Some(held.len() - close.len())
            }
            Err(Incomplete::Yes) => None,
            Err(Incomplete::No) => held.find(CLOSE).map(|at| at + CLOSE.len()),
        }
    }

    fn find_calls(&self, text: &str, heal: bool) -> Vec<FoundCall> {
        let mut found = Vec::new();
        let mut from = 0;
        while let Some(open) = text[from..].find(OPEN).map(|at| from + at) {
            let Ok(call) = read_call(text, open) else {
                from = open + OPEN.len();
                continue;
            };
            let rest = &text[call.args_end..];
            let end = match rest.trim_start().strip_prefix(CLOSE) {
                Some(after) => text.len() - after.len(),
                None if heal && rest.trim().is_empty() => text.len(),
                None => {
                    from = call.args_end;
                    continue;
                }
            };
            found.push(FoundCall {
                span: open..end,
                name: call.name,
                arguments: call.arguments.to_string(),
            });
            from = end;
        }
        found
    }

    fn write_calls(&self, calls: &[(&str, &Value)]) -> String {
        calls
            .iter()
            .map(|(name, arguments)| format!("{OPEN}{CALL}{name}{}{CLOSE}", write_value(arguments)))
            .collect()
    }
}

/// Why arguments could not be read.
#[derive(Debug, PartialEq)]
enum Incomplete {
    /// The text ended first: more may come.
    Yes,
    /// The text is not a call.
    No,
}

struct Call {
    name: String,
    arguments: Value,
    args_end: usize,
}

/// Reads `<|tool_call>call:NAME{…}` at `open`.
fn read_call(text: &str, open: usize) -> Result<Call, Incomplete> {
    let after = &text[open + OPEN.len()..];
    let head = after.strip_prefix(CALL).unwrap_or(after);
    let Some(brace) = head.find('{') else {
        return Err(if head.len() < 256 && !head.contains(CLOSE) {
            Incomplete::Yes
        } else {
            Incomplete::No
        });
    };
    let name = head[..brace].trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(Incomplete::No);
    }
    let start = text.len() - head.len() + brace;
    let mut reader = Reader::new(text, start);
    let arguments = reader.object()?;
    Ok(Call {
        name: name.to_string(),
        arguments,
        args_end: reader.pos,
    })
}

/// The shared cursor, reading this format's syntax.
struct Gemma4Syntax;
type Reader<'a> = Cursor<'a, Gemma4Syntax>;

impl Reader<'_> {
    /// Consumes `token` if the text continues with it.
    fn eat(&mut self, token: &str) -> Result<bool, Incomplete> {
        self.skip_space();
        if self.rest().starts_with(token) {
            self.pos += token.len();
            Ok(true)
        } else if token.starts_with(self.rest()) {
            Err(Incomplete::Yes)
        } else {
            Ok(false)
        }
    }

    fn object(&mut self) -> Result<Value, Incomplete> {
        if !self.eat("{")? {
            return Err(Incomplete::No);
        }
        let mut object = Map::new();
        if self.eat("}")? {
            return Ok(Value::Object(object));
        }
        loop {
            let key = self.key()?;
            let value = self.value(b'}')?;
            object.insert(key, value);
            if self.eat(",")? {
                continue;
            }
            if self.eat("}")? {
                return Ok(Value::Object(object));
            }
            return Err(Incomplete::No);
        }
    }

    fn array(&mut self) -> Result<Value, Incomplete> {
        self.eat("[")?;
        let mut items = Vec::new();
        if self.eat("]")? {
            return Ok(Value::Array(items));
        }
        loop {
            items.push(self.value(b']')?);
            if self.eat(",")? {
                continue;
            }
            if self.eat("]")? {
                return Ok(Value::Array(items));
            }
            return Err(Incomplete::No);
        }
    }

    fn key(&mut self) -> Result<String, Incomplete> {
        self.skip_space();
        let key = if self.rest().starts_with(QUOTE) || self.rest().starts_with('"') {
            match self.value(b'}')? {
                Value::String(key) => key,
                _ => return Err(Incomplete::No),
            }
        } else {
            let len = self.rest().find(':').ok_or(Incomplete::Yes)?;
            let key = self.rest()[..len].trim().to_string();
            self.pos += len;
            key
        };
        if key.is_empty() || !self.eat(":")? {
            return Err(Incomplete::No);
        }
        Ok(key)
    }

    /// A value inside an object (`closer` `}`) or an array (`]`).
    fn value(&mut self, closer: u8) -> Result<Value, Incomplete> {
        self.skip_space();
        let rest = self.rest();
        if let Some(body) = rest.strip_prefix(QUOTE) {
            let len = body.find(QUOTE).ok_or(Incomplete::Yes)?;
            self.pos += QUOTE.len() + len + QUOTE.len();
            return Ok(Value::String(body[..len].to_string()));
        }
        if QUOTE.starts_with(rest) && !rest.is_empty() {
            return Err(Incomplete::Yes);
        }
        match rest.as_bytes().first() {
            None => Err(Incomplete::Yes),
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => {
                let len = super::scan::balanced_string(rest).ok_or(Incomplete::Yes)?;
                self.pos += len;
                serde_json::from_str(&rest[..len]).map_err(|_| Incomplete::No)
            }
            Some(_) => {
                let len = bare_len(rest, closer).ok_or(Incomplete::Yes)?;
                self.pos += len;
                let bare = rest[..len].trim();
                Ok(serde_json::from_str::<Value>(bare)
                    .ok()
                    .filter(|v| !v.is_object() && !v.is_array())
                    .unwrap_or_else(|| Value::String(bare.to_string())))
            }
        }
    }
}

/// Length of a bare value: up to the closer, or a comma followed by `key:` (in an object) or
/// any comma (in an array).
fn bare_len(text: &str, closer: u8) -> Option<usize> {
    let bytes = text.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == closer {
            return Some(i);
        }
        if b == b',' && (closer == b']' || starts_with_key(&text[i + 1..])) {
            return Some(i);
        }
    }
    None
}

fn starts_with_key(text: &str) -> bool {
    let text = text.trim_start();
    if text.starts_with(QUOTE) {
        return true;
    }
    let len = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-' || c == '.'))
        .unwrap_or(text.len());
    len > 0 && text[len..].starts_with(':')
}

/// Arguments written the way Gemma 4 writes them.
fn write_value(value: &Value) -> String {
    match value {
        Value::String(text) => format!("{QUOTE}{text}{QUOTE}"),
        Value::Object(object) => {
            let fields: Vec<String> = object
                .iter()
                .map(|(k, v)| format!("{k}:{}", write_value(v)))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(write_value).collect();
            format!("[{}]", items.join(","))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_support::promoter;

    #[test]
    fn strings_bare_values_and_nesting() {
        let p = promoter(&["weather"]);
        let text = "Let me check. <|tool_call>call:weather{city:<|\"|>Paris, FR<|\"|>,days:3,units:metric, maybe,opts:{deep:[1,<|\"|>a<|\"|>]}}<tool_call|> ok";
        let out = Gemma4Parser.parse(text, &p);
        assert_eq!(out.content.as_deref(), Some("Let me check.  ok"));
        assert_eq!(
            out.calls[0].arguments,
            r#"{"city":"Paris, FR","days":3,"units":"metric, maybe","opts":{"deep":[1,"a"]}}"#
        );
    }

    #[test]
    fn a_closer_inside_a_string_is_data() {
        let text = "<|tool_call>call:weather{note:<|\"|>see <tool_call|> here<|\"|>}<tool_call|>";
        assert_eq!(Gemma4Parser.block_len(text), Some(text.len()));
        let out = Gemma4Parser.parse(text, &promoter(&["weather"]));
        assert_eq!(
            out.calls[0].arguments,
            r#"{"note":"see <tool_call|> here"}"#
        );
    }

    #[test]
    fn unclosed_calls_need_healing_and_garbage_stays_text() {
        let text = "<|tool_call>call:weather{days:3}";
        assert!(Gemma4Parser.find_calls(text, false).is_empty());
        assert_eq!(Gemma4Parser.find_calls(text, true).len(), 1);
        assert_eq!(
            Gemma4Parser.block_len("<|tool_call>call:weather{days:"),
            None
        );
        let garbage = "<|tool_call>not a call<tool_call|> after";
        assert_eq!(Gemma4Parser.block_len(garbage), Some(garbage.len() - 6));
        assert!(Gemma4Parser.find_calls(garbage, true).is_empty());
    }

    #[test]
    fn written_calls_read_back() {
        let args = serde_json::json!({"city": "Paris, FR", "days": 3, "tags": ["a", true]});
        let text = Gemma4Parser.write_calls(&[("weather", &args)]);
        let found = Gemma4Parser.find_calls(&text, false);
        assert_eq!(found[0].span, 0..text.len());
        assert_eq!(
            serde_json::from_str::<Value>(&found[0].arguments).unwrap(),
            args
        );
    }
}
