//! JSON Schema → GBNF: the subset tool parameters and `response_format` schemas use. Objects
//! keep their properties in declared order, required ones first, each optional one optional;
//! `enum` and `const` are literals; `anyOf` / `oneOf` and type lists are alternatives; `items`
//! types arrays. What the subset does not cover (`$ref`, `pattern`, bounds) is any JSON value
//! of the stated type, so the grammar never forbids a valid answer it cannot describe.

use super::gbnf::{Grammar, literal};
use serde_json::{Map, Value};

/// A GBNF expression for values of `schema`; named rules go into `grammar` (`hint` names them).
pub fn expression(grammar: &mut Grammar, schema: &Value, hint: &str) -> String {
    // A grammar grown too large is refused whole: the rest of the schema is not walked.
    if grammar.is_full() {
        return "value".into();
    }
    let Some(schema) = schema.as_object() else {
        // `true` or no schema: any value.
        return "value".into();
    };
    if let Some(constant) = schema.get("const") {
        return literal(&constant.to_string());
    }
    if let Some(Value::Array(values)) = schema.get("enum") {
        return alternatives(values.iter().map(|v| literal(&v.to_string())));
    }
    if let Some(Value::Array(options)) = schema.get("anyOf").or_else(|| schema.get("oneOf")) {
        let options: Vec<String> = options
            .iter()
            .map(|option| expression(grammar, option, hint))
            .collect();
        return alternatives(options.into_iter());
    }
    match schema.get("type") {
        Some(Value::Array(kinds)) => {
            let options: Vec<String> = kinds
                .iter()
                .filter_map(Value::as_str)
                .map(|kind| typed(grammar, schema, kind, hint))
                .collect();
            alternatives(options.into_iter())
        }
        Some(Value::String(kind)) => typed(grammar, schema, kind, hint),
        _ if schema.contains_key("properties") => typed(grammar, schema, "object", hint),
        _ => "value".into(),
    }
}

fn typed(grammar: &mut Grammar, schema: &Map<String, Value>, kind: &str, hint: &str) -> String {
    match kind {
        "object" => match schema.get("properties").and_then(Value::as_object) {
            Some(properties) if !properties.is_empty() => object(grammar, schema, properties, hint),
            _ => "object".into(),
        },
        "array" => match schema.get("items") {
            Some(items) => {
                let item = expression(grammar, items, &format!("{hint}-item"));
                let body = format!(r#""[" ws ( {item} ( ws "," ws {item} )* )? ws "]""#);
                grammar.rule(&format!("{hint}-array"), body)
            }
            None => "array".into(),
        },
        "string" | "number" | "integer" | "boolean" | "null" => kind.into(),
        _ => "value".into(),
    }
}

/// An object with these properties: required ones in declared order, then any of the optional
/// ones, in declared order.
fn object(
    grammar: &mut Grammar,
    schema: &Map<String, Value>,
    properties: &Map<String, Value>,
    hint: &str,
) -> String {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|name| properties.contains_key(*name))
        .collect();
    let mut member = |name: &str| {
        let value = expression(grammar, &properties[name], &format!("{hint}-{name}"));
        format!(
            r#"{} ws ":" ws {value}"#,
            literal(&Value::from(name).to_string())
        )
    };
    let required_members: Vec<String> = required.iter().map(|name| member(name)).collect();
    let optional_members: Vec<String> = properties
        .keys()
        .filter(|name| !required.contains(&name.as_str()))
        .map(|name| member(name))
        .collect();
    // `optional[i]`: a non-empty, ordered choice among the optional members from `i` on.
    let mut optional_rule: Option<String> = None;
    for (i, member) in optional_members.iter().enumerate().rev() {
        let body = match &optional_rule {
            Some(rest) => format!(r#"{member} ( ws "," ws {rest} )? | {rest}"#),
            None => member.clone(),
        };
        optional_rule = Some(grammar.rule(&format!("{hint}-optional-{i}"), body));
    }
    let body = match (required_members.is_empty(), optional_rule) {
        (true, None) => r#""{" ws "}""#.to_string(),
        (true, Some(optional)) => format!(r#""{{" ws {optional}? ws "}}""#),
        (false, optional) => {
            let required = required_members.join(r#" ws "," ws "#);
            let optional = optional.map_or(String::new(), |o| format!(r#" ( ws "," ws {o} )?"#));
            format!(r#""{{" ws {required}{optional} ws "}}""#)
        }
    };
    grammar.rule(hint, body)
}

fn alternatives(options: impl Iterator<Item = String>) -> String {
    let options: Vec<String> = options.collect();
    match options.len() {
        0 => "value".into(),
        1 => options.into_iter().next().unwrap_or_default(),
        _ => format!("( {} )", options.join(" | ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn grammar_of(schema: Value) -> String {
        let mut grammar = Grammar::default();
        let root = expression(&mut grammar, &schema, "args");
        grammar.finish(&root)
    }

    #[test]
    fn objects_list_required_then_optional_properties() {
        let text = grammar_of(json!({"type": "object", "properties": {
            "unit": {"enum": ["c", "f"]}, "city": {"type": "string"},
            "days": {"type": "integer"}}, "required": ["city"]}));
        assert!(
            text.contains(r#"args ::= "{" ws "\"city\"" ws ":" ws string ( ws "," ws args-optional-0 )? ws "}""#),
            "{text}"
        );
        assert!(
            text.contains(r#"args-optional-1 ::= "\"days\"" ws ":" ws integer"#),
            "{text}"
        );
        assert!(text.contains(r#"( "\"c\"" | "\"f\"" )"#), "{text}");
    }

    #[test]
    fn unknown_shapes_are_any_value_of_their_type() {
        assert_eq!(grammar_of(json!({})).lines().next(), Some("root ::= value"));
        assert_eq!(
            grammar_of(json!({"type": ["string", "null"]}))
                .lines()
                .next(),
            Some("root ::= ( string | null )")
        );
        assert!(
            grammar_of(json!({"type": "array", "items": {"type": "number"}}))
                .contains(r#"args-array ::= "[" ws ( number ( ws "," ws number )* )? ws "]""#)
        );
    }
}
