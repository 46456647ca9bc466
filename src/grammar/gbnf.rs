//! Writing GBNF, llama.cpp's grammar format (which SGLang's `ebnf` and vLLM's `grammar`, both
//! through xgrammar, read too): named rules, quoted literals, and the JSON rules every schema
//! builds on.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// JSON's own rules, added to every grammar that needs one of them.
const JSON_RULES: &[(&str, &str)] = &[
    // Written as an optional group: xgrammar (SGLang's and vLLM's) refuses an empty
    // alternative, which llama.cpp allows. Indentation is bounded: with `[ \t]*` a model
    // that drifts into whitespace (seen with a real vLLM) fills its whole budget with it and
    // never writes the call.
    ("ws", r#"( " " | "\n" [ \t]{0,20} )?"#),
    (
        "value",
        r#"object | array | string | number | "true" | "false" | "null""#,
    ),
    (
        "object",
        r#""{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* )? ws "}""#,
    ),
    ("array", r#""[" ws ( value ( ws "," ws value )* )? ws "]""#),
    ("string", r#""\"" char* "\"""#),
    (
        "char",
        r#"[^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" hex hex hex hex )"#,
    ),
    ("hex", "[0-9a-fA-F]"),
    (
        "number",
        r#""-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?"#,
    ),
    ("integer", r#""-"? ( "0" | [1-9] [0-9]* )"#),
    ("boolean", r#""true" | "false""#),
    ("null", r#""null""#),
];

/// The largest grammar written, in bytes of rules: a schema that needs more is refused (a
/// backend compiles the grammar before it samples a token).
pub const MAX_GRAMMAR_BYTES: usize = 1 << 20;

/// A grammar under construction: `root` and the rules it names.
#[derive(Debug, Default)]
pub struct Grammar {
    rules: Vec<(String, String)>,
    taken: HashSet<String>,
    /// Per base name, the next suffix to try: names are found in time linear in the rules,
    /// however many hints share a base (every non-ASCII name has the same one).
    next_suffix: HashMap<String, usize>,
    /// Bytes of the rules so far.
    bytes: usize,
}

impl Grammar {
    /// Adds a rule named after `hint` (made unique); returns its name.
    pub fn rule(&mut self, hint: &str, body: String) -> String {
        let base: String = hint
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect::<String>()
            .to_ascii_lowercase();
        let base = match base.trim_matches('-') {
            "" => "r".to_string(),
            trimmed => trimmed.to_string(),
        };
        let free = |name: &str, taken: &HashSet<String>| {
            !taken.contains(name) && JSON_RULES.iter().all(|(json, _)| *json != name)
        };
        let name = match free(&base, &self.taken) {
            true => base,
            false => {
                let next = self.next_suffix.entry(base.clone()).or_insert(1);
                loop {
                    let name = format!("{base}-{next}");
                    *next += 1;
                    if free(&name, &self.taken) {
                        break name;
                    }
                }
            }
        };
        self.add(name.clone(), body);
        name
    }

    /// Adds the rule `name` unless it is there already (a rule several others share).
    pub fn shared(&mut self, name: &str, body: &str) {
        if !self.taken.contains(name) {
            self.add(name.to_string(), body.to_string());
        }
    }

    fn add(&mut self, name: String, body: String) {
        self.bytes += name.len() + body.len() + 6;
        self.taken.insert(name.clone());
        self.rules.push((name, body));
    }

    /// Whether the rules have outgrown [`MAX_GRAMMAR_BYTES`]: what is still to be written is
    /// left out, and the grammar will be refused.
    pub fn is_full(&self) -> bool {
        self.bytes > MAX_GRAMMAR_BYTES
    }

    /// The grammar's text, `root` first, then its rules and the JSON rules.
    pub fn finish(self, root: &str) -> String {
        let mut out = format!("root ::= {root}\n");
        for (name, body) in &self.rules {
            let _ = writeln!(out, "{name} ::= {body}");
        }
        for (name, body) in JSON_RULES {
            let _ = writeln!(out, "{name} ::= {body}");
        }
        out
    }
}

/// `text` as a quoted GBNF literal.
pub fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_escaped_and_rule_names_unique() {
        assert_eq!(literal("a\"b\\c\nd"), r#""a\"b\\c\nd""#);
        let mut grammar = Grammar::default();
        assert_eq!(grammar.rule("get_weather", "\"x\"".into()), "get-weather");
        assert_eq!(grammar.rule("get_weather", "\"y\"".into()), "get-weather-1");
        assert_eq!(grammar.rule("string", "\"z\"".into()), "string-1");
        // A hint that takes a name a suffix would give is skipped over, and every non-ASCII
        // name shares one base.
        assert_eq!(
            grammar.rule("get_weather-2", "\"w\"".into()),
            "get-weather-2"
        );
        assert_eq!(grammar.rule("get_weather", "\"v\"".into()), "get-weather-3");
        let names: HashSet<String> = (0..5000)
            .map(|_| grammar.rule("ñ", "\"n\"".into()))
            .collect();
        assert_eq!(names.len(), 5000);
        assert!(names.contains("r") && names.contains("r-4999"));
        let text = grammar.finish("get-weather");
        assert!(text.starts_with("root ::= get-weather\nget-weather ::= \"x\"\n"));
        assert!(text.contains("\nws ::= "));
    }
}
