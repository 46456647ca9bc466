//! The minijinja environment with Hugging Face / jinja2 semantics.
//!
//! transformers renders chat templates in a sandboxed jinja2 environment with `trim_blocks`,
//! `lstrip_blocks`, loop controls, the globals `raise_exception` and `strftime_now`, and its
//! own `tojson`. Templates also lean on Python string methods and Python's idea of
//! whitespace; this module supplies all of that on top of minijinja.

use super::pyjson::{DumpOptions, dumps};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

/// Marks an error raised by the template itself through `raise_exception(msg)`.
#[derive(Debug)]
pub(crate) struct RaisedByTemplate;

impl std::fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("raised by the chat template")
    }
}

impl std::error::Error for RaisedByTemplate {}

/// A fresh environment configured like transformers' jinja2 sandbox.
pub(crate) fn hf_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("default delimiters are valid"),
    );
    env.set_unknown_method_callback(python_method);
    env.add_filter("tojson", tojson);
    env.add_filter("trim", trim);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

/// Python's `str.isspace()`: Unicode White_Space plus the ASCII separators U+001C..U+001F.
pub(crate) fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// jinja2's `trim(value, chars=None)`: the value as Python's `str()` would print it, stripped
/// of Python whitespace (or of `chars`). An undefined value prints as the empty string.
fn trim(value: &Value, chars: Option<&str>) -> String {
    let text = match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".to_string(),
        ValueKind::Bool => if value.is_true() { "True" } else { "False" }.to_string(),
        _ => value.to_string(),
    };
    match chars {
        Some(chars) => text.trim_matches(|c| chars.contains(c)).to_string(),
        None => text.trim_matches(is_python_space).to_string(),
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message).with_source(RaisedByTemplate))
}

fn strftime_now(format: &str) -> Result<Value, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item> = StrftimeItems::new(format).collect();
    if items.iter().any(|item| matches!(item, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("invalid strftime format {format:?}"),
        ));
    }
    let now = chrono::Local::now();
    Ok(Value::from(
        now.format_with_items(items.into_iter()).to_string(),
    ))
}

/// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")?.or(indent) {
        Some(v) if v.is_integer() => Some(" ".repeat(i64::try_from(v)?.max(0) as usize)),
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or("").to_string()),
        _ => None,
    };
    let (item_separator, key_separator) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(pair) if pair.len() == 2 => (Some(pair[0].clone()), Some(pair[1].clone())),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "separators must be a (item_separator, key_separator) pair",
            ));
        }
        None => (None, None),
    };
    let options = DumpOptions {
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        indent,
        item_separator,
        key_separator,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    if options == DumpOptions::default()
        && let Some(text) = value
            .downcast_object_ref::<super::FieldMap>()
            .and_then(|map| map.tojson.clone())
    {
        return Ok(text);
    }
    Ok(Value::from(dumps(value, &options)?))
}

/// Python string methods with Python's whitespace rules; everything else goes to
/// minijinja-contrib's pycompat layer.
fn python_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let (Some(s), true) = (value.as_str(), args.is_empty()) {
        match method {
            "strip" => return Ok(Value::from(s.trim_matches(is_python_space))),
            "lstrip" => return Ok(Value::from(s.trim_start_matches(is_python_space))),
            "rstrip" => return Ok(Value::from(s.trim_end_matches(is_python_space))),
            "split" => {
                return Ok(s
                    .split(is_python_space)
                    .filter(|part| !part.is_empty())
                    .map(Value::from)
                    .collect());
            }
            "isspace" => {
                return Ok(Value::from(!s.is_empty() && s.chars().all(is_python_space)));
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}
