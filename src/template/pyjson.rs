//! Python `json.dumps` for template values, as Hugging Face's chat-template `tojson` filter does it.
//!
//! minijinja's own `tojson` differs from Python's on separators, key order, HTML escaping and float
//! formatting; chat templates put tool schemas and arguments into the prompt with it, so the
//! bytes must match what `transformers` renders.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};
use std::fmt::Write;

/// Options of Python's `json.dumps` that templates pass to `tojson`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DumpOptions {
    /// `ensure_ascii`: escape every non-ASCII character.
    pub ensure_ascii: bool,
    /// `indent`: the indentation of each level (none: one line).
    pub indent: Option<String>,
    /// `separators[0]`, between items (Python's default when unset).
    pub item_separator: Option<String>,
    /// `separators[1]`, between a key and its value (Python's default when unset).
    pub key_separator: Option<String>,
    /// `sort_keys`: write object keys in sorted order.
    pub sort_keys: bool,
}

/// Serialises `value` exactly as `json.dumps(value, **options)` would.
pub fn dumps(value: &Value, options: &DumpOptions) -> Result<String, Error> {
    let item_sep = options
        .item_separator
        .clone()
        .unwrap_or_else(|| if options.indent.is_some() { "," } else { ", " }.to_string());
    let key_sep = options
        .key_separator
        .clone()
        .unwrap_or_else(|| ": ".to_string());
    let mut writer = Writer {
        options,
        item_sep: &item_sep,
        key_sep: &key_sep,
        out: String::new(),
    };
    writer.write_value(value, 0)?;
    Ok(writer.out)
}

struct Writer<'a> {
    options: &'a DumpOptions,
    item_sep: &'a str,
    key_sep: &'a str,
    out: String,
}

impl Writer<'_> {
    fn write_value(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => write_number(&mut self.out, value)?,
            ValueKind::String => write_string(
                &mut self.out,
                value.as_str().unwrap_or(""),
                self.options.ensure_ascii,
            ),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.write_container(['[', ']'], items.len(), depth, |w, i| {
                    w.write_value(&items[i], depth + 1)
                })?;
            }
            ValueKind::Map => {
                let mut entries: Vec<(String, Value)> = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    entries.push((key_to_string(&key)?, item));
                }
                if self.options.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.write_container(['{', '}'], entries.len(), depth, |w, i| {
                    write_string(&mut w.out, &entries[i].0, w.options.ensure_ascii);
                    w.out.push_str(w.key_sep);
                    w.write_value(&entries[i].1, depth + 1)
                })?;
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {kind} is not JSON serializable"),
                ));
            }
        }
        Ok(())
    }

    /// `len` items between `open` and `close`, each written by `write_item`, indented as
    /// Python's `json.dumps` does at `depth`.
    fn write_container(
        &mut self,
        [open, close]: [char; 2],
        len: usize,
        depth: usize,
        mut write_item: impl FnMut(&mut Self, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.out.push(open);
        if len == 0 {
            self.out.push(close);
            return Ok(());
        }
        for i in 0..len {
            if i > 0 {
                self.out.push_str(self.item_sep);
            }
            self.indent(depth + 1);
            write_item(self, i)?;
        }
        self.indent(depth);
        self.out.push(close);
        Ok(())
    }

    /// With `indent`: a new line, indented `depth` times.
    fn indent(&mut self, depth: usize) {
        if let Some(indent) = &self.options.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(indent);
            }
        }
    }
}

/// Python turns non-string keys into strings (`True` → `"true"`, `1` → `"1"`).
fn key_to_string(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or("").to_string()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_string()),
        ValueKind::None => Ok("null".to_string()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key)?;
            Ok(s)
        }
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

fn write_number(out: &mut String, value: &Value) -> Result<(), Error> {
    if value.is_integer() {
        // i128 covers every integer minijinja stores (i64, u64, i128, u128 within range).
        let n = i128::try_from(value.clone())?;
        let _ = write!(out, "{n}");
    } else {
        let f = f64::try_from(value.clone())?;
        out.push_str(&python_float_repr(f));
    }
    Ok(())
}

/// Python's `repr(float)` as `json.dumps` writes it: shortest round-trip digits, scientific
/// notation when the exponent is below -4 or at least 16, and `Infinity`/`NaN` spelled out.
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    // `{:e}` gives the shortest round-trip digits, e.g. "1.5e-5" or "-3e0".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci
        .split_once('e')
        .expect("scientific notation has an exponent");
    let exp: i32 = exp.parse().expect("exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::from(sign);
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            for _ in 0..(-exp - 1) {
                out.push('0');
            }
            out.push_str(&digits);
        } else {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                for _ in digits.len()..int_len {
                    out.push('0');
                }
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::value::Serde;

    fn dump(json: &str) -> String {
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        dumps(&Value::from(Serde(&v)), &DumpOptions::default()).unwrap()
    }

    #[test]
    fn float_repr_matches_python() {
        assert_eq!(python_float_repr(3.0), "3.0");
        assert_eq!(python_float_repr(1.5e-5), "1.5e-05");
        assert_eq!(python_float_repr(0.0001), "0.0001");
        assert_eq!(python_float_repr(1e16), "1e+16");
        assert_eq!(python_float_repr(1234567890123456.0), "1234567890123456.0");
        assert_eq!(python_float_repr(-2.5), "-2.5");
        assert_eq!(python_float_repr(0.1), "0.1");
        assert_eq!(python_float_repr(123.456), "123.456");
        assert_eq!(python_float_repr(1.2345e-7), "1.2345e-07");
        assert_eq!(python_float_repr(f64::INFINITY), "Infinity");
    }

    #[test]
    fn dumps_like_python() {
        assert_eq!(
            dump(r#"{"b": [1, 2.0, true, null], "a": {"x": "<tag> \"q\" é\n"}}"#),
            r#"{"b": [1, 2.0, true, null], "a": {"x": "<tag> \"q\" é\n"}}"#
        );
        assert_eq!(dump("9007199254740993"), "9007199254740993");
        assert_eq!(dump(r#"{"e": {}, "l": []}"#), r#"{"e": {}, "l": []}"#);
    }

    #[test]
    fn indent_sort_and_ascii() {
        let v = Value::from(Serde(serde_json::json!({"b": 1, "a": ["é"]})));
        let opts = DumpOptions {
            ensure_ascii: true,
            indent: Some("  ".into()),
            sort_keys: true,
            ..Default::default()
        };
        assert_eq!(
            dumps(&v, &opts).unwrap(),
            "{\n  \"a\": [\n    \"\\u00e9\"\n  ],\n  \"b\": 1\n}"
        );
    }
}
