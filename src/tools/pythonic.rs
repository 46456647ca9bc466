//! Pythonic format (Llama 3.2 / Llama 4): a Python list of calls with keyword arguments,
//! `[get_weather(city="Paris", days=3), now()]`, optionally inside
//! `<|python_start|>…<|python_end|>`. Argument values are Python literals (strings, numbers,
//! True/False/None, lists, tuples, dicts) and become JSON. Element spans tile the list, so an
//! undeclared call in the middle stays text while its neighbours are promoted.

use super::scan::Cursor;
use super::scan::{balanced_quoted, leading_space};
use super::{FoundCall, ToolParser};
use serde_json::{Map, Value};

const START: &str = "<|python_start|>";
const END: &str = "<|python_end|>";
const QUOTES: &[char] = &['"', '\''];

/// Parser for pythonic call lists.
#[derive(Debug, Default, Clone, Copy)]
pub struct PythonicParser;

impl ToolParser for PythonicParser {
    fn name(&self) -> &'static str {
        "pythonic"
    }

    fn signals(&self) -> &'static [&'static str] {
        &["[", START]
    }

    fn markers(&self) -> &'static [&'static str] {
        &[START, END]
    }

    fn block_len(&self, held: &str) -> Option<usize> {
        match held.strip_prefix(START) {
            Some(_) => held.find(END).map(|at| at + END.len()),
            None => balanced_quoted(held, 0, QUOTES),
        }
    }

    fn find_calls(&self, text: &str, heal: bool) -> Vec<FoundCall> {
        let mut found = Vec::new();
        let mut from = 0;
        while let Some(at) = ["[", START]
            .iter()
            .filter_map(|s| text[from..].find(s))
            .min()
            .map(|at| from + at)
        {
            let (list_start, wrapped) = match text[at..].strip_prefix(START) {
                Some(body) => (text.len() - body.len() + leading_space(body), true),
                None => (at, false),
            };
            let Some(list_end) = text[list_start..]
                .starts_with('[')
                .then(|| balanced_quoted(text, list_start, QUOTES))
                .flatten()
            else {
                from = list_start.max(at + 1);
                continue;
            };
            let mut end = list_end;
            if wrapped {
                let rest = &text[list_end..];
                match rest.trim_start().strip_prefix(END) {
                    Some(after) => end = text.len() - after.len(),
                    None if heal && rest.trim().is_empty() => end = text.len(),
                    None => {
                        from = list_end;
                        continue;
                    }
                }
            }
            found.extend(list_calls(text, at, list_start, list_end, end));
            from = end;
        }
        found
    }

    fn write_calls(&self, calls: &[(&str, &Value)]) -> String {
        let calls: Vec<String> = calls
            .iter()
            .map(|(name, arguments)| {
                let keywords: Vec<String> = arguments
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| format!("{k}={}", python_literal(v)))
                    .collect();
                format!("{name}({})", keywords.join(", "))
            })
            .collect();
        format!("[{}]", calls.join(", "))
    }
}

/// The calls of the list `text[list_start..list_end]`; none unless every element is a call.
fn list_calls(
    text: &str,
    span_start: usize,
    list_start: usize,
    list_end: usize,
    span_end: usize,
) -> Vec<FoundCall> {
    let mut reader = Reader::new(&text[..list_end - 1], list_start + 1);
    let mut elements = Vec::new();
    loop {
        reader.skip_space();
        if reader.pos == reader.text.len() {
            break;
        }
        let element_start = reader.pos;
        let Some((name, arguments)) = reader.call() else {
            return Vec::new();
        };
        elements.push((element_start, name, arguments));
        reader.skip_space();
        if !reader.eat(',') {
            reader.skip_space();
            if reader.pos != reader.text.len() {
                return Vec::new();
            }
            break;
        }
    }
    let starts: Vec<usize> = elements.iter().map(|e| e.0).skip(1).collect();
    elements
        .into_iter()
        .enumerate()
        .map(|(i, (start, name, arguments))| FoundCall {
            span: if i == 0 { span_start } else { start }
                ..starts.get(i).copied().unwrap_or(span_end),
            name,
            arguments: Value::Object(arguments).to_string(),
        })
        .collect()
}

/// The shared cursor, reading this format's syntax.
struct PythonSyntax;
type Reader<'a> = Cursor<'a, PythonSyntax>;

impl Reader<'_> {
    fn eat(&mut self, c: char) -> bool {
        self.skip_space();
        let eaten = self.rest().starts_with(c);
        if eaten {
            self.pos += c.len_utf8();
        }
        eaten
    }

    fn identifier(&mut self) -> Option<String> {
        self.skip_space();
        let rest = self.rest();
        let len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
            .unwrap_or(rest.len());
        let name = &rest[..len];
        if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        self.pos += len;
        Some(name.to_string())
    }

    /// `name(key=value, …)`.
    fn call(&mut self) -> Option<(String, Map<String, Value>)> {
        let name = self.identifier()?;
        if !self.eat('(') {
            return None;
        }
        let mut arguments = Map::new();
        while !self.eat(')') {
            let key = self.identifier()?;
            if !self.eat('=') {
                return None;
            }
            arguments.insert(key, self.value()?);
            if !self.eat(',') && !self.rest().trim_start().starts_with(')') {
                return None;
            }
        }
        Some((name, arguments))
    }

    fn value(&mut self) -> Option<Value> {
        self.skip_space();
        let first = self.rest().chars().next()?;
        match first {
            '"' | '\'' => self.string(first).map(Value::String),
            '[' => self.sequence(']'),
            '(' => self.sequence(')'),
            '{' => self.dict(),
            _ => {
                let rest = self.rest();
                let len = rest
                    .find(|c: char| matches!(c, ',' | ')' | ']' | '}' | ':') || c.is_whitespace())
                    .unwrap_or(rest.len());
                let word = &rest[..len];
                self.pos += len;
                match word {
                    "True" => Some(Value::Bool(true)),
                    "False" => Some(Value::Bool(false)),
                    "None" => Some(Value::Null),
                    number => serde_json::from_str::<serde_json::Number>(number)
                        .ok()
                        .map(Value::Number),
                }
            }
        }
    }

    fn sequence(&mut self, close: char) -> Option<Value> {
        self.pos += 1;
        let mut items = Vec::new();
        while !self.eat(close) {
            items.push(self.value()?);
            if !self.eat(',') && !self.rest().trim_start().starts_with(close) {
                return None;
            }
        }
        Some(Value::Array(items))
    }

    fn dict(&mut self) -> Option<Value> {
        self.pos += 1;
        let mut object = Map::new();
        while !self.eat('}') {
            let key = match self.value()? {
                Value::String(key) => key,
                other => other.to_string(),
            };
            if !self.eat(':') {
                return None;
            }
            object.insert(key, self.value()?);
            if !self.eat(',') && !self.rest().trim_start().starts_with('}') {
                return None;
            }
        }
        Some(Value::Object(object))
    }

    /// A quoted string with Python's common escapes.
    fn string(&mut self, quote: char) -> Option<String> {
        let mut out = String::new();
        let mut chars = self.rest().char_indices().skip(1);
        while let Some((i, c)) = chars.next() {
            match c {
                c if c == quote => {
                    self.pos += i + 1;
                    return Some(out);
                }
                '\\' => {
                    let (_, escaped) = chars.next()?;
                    match escaped {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        'u' => {
                            let hex: String =
                                (0..4).filter_map(|_| chars.next()).map(|c| c.1).collect();
                            out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                        }
                        other => out.push(other),
                    }
                }
                c => out.push(c),
            }
        }
        None
    }
}

/// A JSON value as a Python literal.
fn python_literal(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(python_literal).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(object) => {
            let fields: Vec<String> = object
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), python_literal(v)))
                .collect();
            format!("{{{}}}", fields.join(", "))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_support::promoter;

    #[test]
    fn python_literals_become_json() {
        let p = promoter(&["weather", "now"]);
        let text = r#"Checking. [weather(city='Paris, "FR"', days=3, hourly=True, tags=("a", None), opts={'x': -1.5}), now()]"#;
        let out = PythonicParser.parse(text, &p);
        assert_eq!(out.content.as_deref(), Some("Checking. "));
        assert_eq!(
            out.calls[0].arguments,
            r#"{"city":"Paris, \"FR\"","days":3,"hourly":true,"tags":["a",null],"opts":{"x":-1.5}}"#
        );
        assert_eq!(
            (out.calls[1].name.as_str(), out.calls[1].arguments.as_str()),
            ("now", "{}")
        );
    }

    #[test]
    fn lists_that_are_not_calls_stay_text() {
        let p = promoter(&["weather"]);
        for text in [
            "see [1] and [weather]",
            "[weather(1)]",
            "[weather(city=)]",
            "[weather(city='x'",
        ] {
            let out = PythonicParser.parse(text, &p);
            assert!(out.calls.is_empty(), "{text}");
            assert_eq!(out.content.as_deref(), Some(text));
        }
        assert_eq!(PythonicParser.block_len("[1] more"), Some(3));
        assert_eq!(PythonicParser.block_len("[f(a=']')"), None);
    }

    #[test]
    fn wrapped_lists_and_undeclared_elements() {
        let p = promoter(&["a", "c"]);
        let text = "<|python_start|>[a(x=1), b(), c()]<|python_end|>";
        let out = PythonicParser.parse(text, &p);
        let names: Vec<&str> = out.calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["a", "c"]);
        assert_eq!(out.content.as_deref(), Some("b(), "));
    }

    #[test]
    fn written_calls_read_back() {
        let args = serde_json::json!({"s": "it's \"q\"\n", "n": [1, true, null], "o": {"k": 2.5}});
        let text = PythonicParser.write_calls(&[("f", &args), ("g", &serde_json::json!({}))]);
        let found = PythonicParser.find_calls(&text, false);
        assert_eq!(found.len(), 2);
        assert_eq!(
            serde_json::from_str::<Value>(&found[0].arguments).unwrap(),
            args
        );
    }
}
