//! Grammars for a forced tool call, in the session's tool-call format: the reply is one call
//! (or, with parallel calls allowed and no function named, one or more) to the tools
//! `tool_choice` allows, each call's arguments constrained by the tool's parameter schema.
//! Formats whose call markers are special tokens (Mistral's `[TOOL_CALLS]`, DeepSeek's, Gemma
//! 4's, Harmony's) have none: a grammar matches text, and those tokens are not text.

use super::gbnf::{Grammar, literal};
use super::schema;
use serde_json::Value;

/// One callable function: its name and parameter schema.
#[derive(Debug, Clone)]
pub struct Callable<'a> {
    /// The function's name.
    pub name: &'a str,
    /// Its `parameters` schema (`None`: any object).
    pub parameters: Option<&'a Value>,
}

/// The formats a call grammar can be written for.
pub const FORMATS: &[&str] = &["hermes", "qwen3_coder", "llama3_json"];

/// The root expression of a grammar forcing calls in `format` to `callables` (one call unless
/// `several`), rules added to `grammar`; `None` for a format without call grammar.
pub fn calls(
    grammar: &mut Grammar,
    format: &str,
    callables: &[Callable],
    several: bool,
) -> Option<String> {
    let (separator, each): (&str, fn(&mut Grammar, &Callable) -> String) = match format {
        "hermes" => ("\n", hermes),
        "qwen3_coder" => ("\n", qwen_xml),
        "llama3_json" => ("; ", llama3_json),
        _ => return None,
    };
    let options: Vec<String> = callables.iter().map(|c| each(grammar, c)).collect();
    let call = grammar.rule("call", options.join(" | "));
    Some(match several {
        true => format!("{call} ( {} {call} )*", literal(separator)),
        false => call,
    })
}

/// `"name": "NAME", "arguments": ARGS` wrapped in an object, with `key` for the arguments.
fn json_call(grammar: &mut Grammar, callable: &Callable, key: &str) -> String {
    let arguments = arguments(grammar, callable);
    format!(
        r#""{{" ws "\"name\"" ws ":" ws {} ws "," ws {} ws ":" ws {arguments} ws "}}""#,
        literal(&Value::from(callable.name).to_string()),
        literal(&Value::from(key).to_string()),
    )
}

fn arguments(grammar: &mut Grammar, callable: &Callable) -> String {
    match callable.parameters {
        Some(parameters) => {
            schema::expression(grammar, parameters, &format!("{}-arguments", callable.name))
        }
        None => "object".into(),
    }
}

fn hermes(grammar: &mut Grammar, callable: &Callable) -> String {
    let call = json_call(grammar, callable, "arguments");
    format!(r#""<tool_call>\n" {call} "\n</tool_call>""#)
}

fn llama3_json(grammar: &mut Grammar, callable: &Callable) -> String {
    json_call(grammar, callable, "parameters")
}

/// Qwen3-Coder's XML: each parameter's value is text (required ones in declared order, then
/// any optional one).
fn qwen_xml(grammar: &mut Grammar, callable: &Callable) -> String {
    let properties = callable
        .parameters
        .and_then(|p| p.get("properties"))
        .and_then(Value::as_object);
    let required: Vec<&str> = callable
        .parameters
        .and_then(|p| p.get("required"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let parameter = |name: &str| {
        format!(
            r#"{} xml-text "\n</parameter>\n""#,
            literal(&format!("<parameter={name}>\n"))
        )
    };
    let mut parameters: Vec<String> = required.iter().map(|name| parameter(name)).collect();
    parameters.extend(
        properties
            .into_iter()
            .flat_map(|p| p.keys())
            .filter(|name| !required.contains(&name.as_str()))
            .map(|name| format!("( {} )?", parameter(name))),
    );
    grammar.shared("xml-text", r#"( [^<] | "<" [^/] )*"#);
    format!(
        r#"{} {} "</function>\n</tool_call>""#,
        literal(&format!("<tool_call>\n<function={}>\n", callable.name)),
        parameters.join(" ")
    )
}
