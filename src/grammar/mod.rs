//! Constrained decoding: what a request requires of the reply, as the backend enforces it.
//!
//! `tool_choice: "required"` or a named function (Anthropic's `any` / `tool`, Responses'
//! `required`) becomes a grammar for a call in the session's tool-call format ([`calls`]), its
//! arguments held to the tool's parameter schema ([`schema`]); `response_format`
//! `json_schema` / `json_object` becomes the schema. The backends enforce it: llama.cpp's
//! `grammar` / `json_schema` (llama-server, the in-process engine), SGLang's `ebnf` /
//! `json_schema`, vLLM's `structured_outputs`; a backend without constrained decoding refuses
//! the turn, naming the option. The node records what was sampled, as always.

mod calls;
mod gbnf;
mod schema;

use crate::chat::{ChatRequest, ResponseFormat, ToolChoice};
pub use crate::generation::Constraint;
use gbnf::Grammar;
use serde_json::{Value, json};

/// `constraint` as a GBNF grammar (a schema converted), for backends that take grammars only.
pub fn gbnf(constraint: &Constraint) -> String {
    match constraint {
        Constraint::Grammar(grammar) => grammar.clone(),
        Constraint::JsonSchema(json_schema) => {
            let mut grammar = Grammar::default();
            let root = schema::expression(&mut grammar, json_schema, "answer");
            grammar.finish(&root)
        }
    }
}

/// Why a request's constraint cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// The session's tool-call format has no call grammar.
    #[error(
        "tool_choice requires a tool call, but this session's tool_parser '{format}' has no call \
         grammar to enforce it with (its call markers are special tokens, which a grammar cannot \
         match); enforceable formats: {available}"
    )]
    NoCallGrammar {
        /// The session's format.
        format: String,
        /// Formats with a call grammar.
        available: String,
    },
    /// The grammar the request's schemas need is larger than a backend is given.
    #[error(
        "{option}: the grammar its schema needs exceeds {max} bytes; declare fewer or smaller \
         parameters"
    )]
    TooLarge {
        /// The option that asked for it.
        option: &'static str,
        /// The largest grammar written.
        max: usize,
    },
}

/// The longest text a template may write between a think block and a call that the grammar
/// takes as is (a longer one is not a separator).
const MAX_SEPARATOR: usize = 16;

/// Where a reply stands toward a `<think>` block when sampling starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reasoning {
    /// No block: the model has none, or the prompt already closed it (Qwen3 with thinking
    /// off writes `<think>\n\n</think>\n\n` itself).
    None,
    /// The model may open a block before its answer.
    MayOpen,
    /// The prompt opened the block: the reply reasons, closes it, then answers.
    Open,
}

/// The constraint `request` asks for in a session whose tool-call format is `format`, if any;
/// `reasoning` says whether a forced call may or must follow a `<think>` block, and
/// `separator` what the template writes between that block and a call (Qwen3: `"\n\n"`, one
/// token), allowed besides the usual whitespace.
pub fn for_request(
    request: &ChatRequest,
    format: &str,
    reasoning: Reasoning,
    separator: Option<&str>,
) -> Result<Option<Constraint>, GrammarError> {
    let forced = matches!(
        request.tool_choice,
        ToolChoice::Required | ToolChoice::Function(_)
    );
    let callable = request.callable_tools();
    if forced && !callable.is_empty() {
        return forced_call(request, &callable, format, (reasoning, separator)).map(Some);
    }
    for_response_format(&request.response_format)
}

/// The constraint a `response_format` asks for, if any.
pub fn for_response_format(format: &ResponseFormat) -> Result<Option<Constraint>, GrammarError> {
    let constraint = match format {
        ResponseFormat::Text => return Ok(None),
        ResponseFormat::JsonObject => Constraint::JsonSchema(json!({"type": "object"})),
        ResponseFormat::JsonSchema(schema) => Constraint::JsonSchema(schema.clone()),
    };
    // Backends without JSON-schema support get the schema as a grammar (see `gbnf`).
    if let Constraint::JsonSchema(json_schema) = &constraint {
        let mut grammar = Grammar::default();
        schema::expression(&mut grammar, json_schema, "answer");
        fits(&grammar, "response_format")?;
    }
    Ok(Some(constraint))
}

/// Refuses a grammar that outgrew [`gbnf::MAX_GRAMMAR_BYTES`].
fn fits(grammar: &Grammar, option: &'static str) -> Result<(), GrammarError> {
    match grammar.is_full() {
        true => Err(GrammarError::TooLarge {
            option,
            max: gbnf::MAX_GRAMMAR_BYTES,
        }),
        false => Ok(()),
    }
}

fn forced_call(
    request: &ChatRequest,
    callable: &[String],
    format: &str,
    (reasoning, separator): (Reasoning, Option<&str>),
) -> Result<Constraint, GrammarError> {
    let declared = request.tools.as_ref().map(|tools| tools.json().clone());
    let functions: Vec<calls::Callable> = declared
        .as_deref()
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|tool| tool.get("function").unwrap_or(tool))
        .filter_map(|function| {
            let name = function.get("name")?.as_str()?;
            callable
                .iter()
                .any(|c| c == name)
                .then_some(calls::Callable {
                    name,
                    parameters: function.get("parameters"),
                })
        })
        .collect();
    let several = request.calls.parallel && matches!(request.tool_choice, ToolChoice::Required);
    let mut grammar = Grammar::default();
    let calls = calls::calls(&mut grammar, format, &functions, several).ok_or_else(|| {
        GrammarError::NoCallGrammar {
            format: format.to_string(),
            available: calls::FORMATS.join(", "),
        }
    })?;
    fits(&grammar, "tool_choice")?;
    if reasoning != Reasoning::None {
        grammar.shared("think-text", r#"( [^<] | "<" [^/] | "</" [^t] )*"#);
        let written = separator.filter(|s| !s.is_empty() && s.len() <= MAX_SEPARATOR);
        let end = match written {
            Some(separator) => format!(r#"( {} | ws )"#, gbnf::literal(separator)),
            None => "ws".to_string(),
        };
        grammar.shared("think-end", &format!(r#""</think>" {end}"#));
    }
    let root = match reasoning {
        Reasoning::None => calls,
        Reasoning::MayOpen => format!(r#"( "<think>" think-text think-end )? {calls}"#),
        Reasoning::Open => format!(r#"think-text think-end {calls}"#),
    };
    Ok(Constraint::Grammar(grammar.finish(&root)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::openai::request::ChatCompletionBody;

    fn request(extra: Value) -> ChatRequest {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}}},
                {"type": "function", "function": {"name": "noop"}}]});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        let body: ChatCompletionBody = serde_json::from_value(body).unwrap();
        body.validate(None).unwrap().turn
    }

    #[test]
    fn a_named_function_is_the_only_call_the_grammar_allows() {
        let named = request(json!({"tool_choice": {"type": "function",
            "function": {"name": "get_weather"}}}));
        let Some(Constraint::Grammar(grammar)) =
            for_request(&named, "hermes", Reasoning::None, None).unwrap()
        else {
            panic!("no grammar");
        };
        assert!(grammar.starts_with("root ::= call\n"), "{grammar}");
        assert!(grammar.contains(r#""\"get_weather\"""#), "{grammar}");
        assert!(!grammar.contains("noop"), "{grammar}");
        assert!(grammar.contains(r#""<tool_call>\n""#));
    }

    #[test]
    fn a_block_the_prompt_opened_must_close_before_the_call() {
        let required = request(json!({"tool_choice": "required"}));
        let grammar = gbnf(
            &for_request(&required, "hermes", Reasoning::Open, None)
                .unwrap()
                .unwrap(),
        );
        assert!(
            grammar.starts_with(r#"root ::= think-text think-end call"#),
            "{grammar}"
        );
    }

    #[test]
    fn required_allows_any_callable_tool_and_several_calls() {
        let required = request(json!({"tool_choice": "required"}));
        let grammar = gbnf(
            &for_request(&required, "hermes", Reasoning::MayOpen, None)
                .unwrap()
                .unwrap(),
        );
        assert!(
            grammar.contains("noop") && grammar.contains("get_weather"),
            "{grammar}"
        );
        assert!(
            grammar
                .starts_with(r#"root ::= ( "<think>" think-text think-end )? call ( "\n" call )*"#),
            "{grammar}"
        );
        let error = for_request(&required, "mistral", Reasoning::None, None)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("'mistral'") && error.contains("hermes"),
            "{error}"
        );
        assert_eq!(
            for_request(&request(json!({})), "mistral", Reasoning::None, None).unwrap(),
            None
        );
    }

    #[test]
    fn response_format_is_the_schema() {
        let schema = json!({"type": "object", "properties": {"answer": {"type": "integer"}}});
        let asked = request(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "a", "schema": schema}}}));
        let constraint = for_request(&asked, "hermes", Reasoning::None, None)
            .unwrap()
            .unwrap();
        assert_eq!(constraint, Constraint::JsonSchema(schema));
        assert_eq!(constraint.option(), "response_format");
        assert!(gbnf(&constraint).contains(r#""\"answer\"" ws ":" ws integer"#));
        let object = request(json!({"response_format": {"type": "json_object"}}));
        assert_eq!(
            for_request(&object, "hermes", Reasoning::None, None).unwrap(),
            Some(Constraint::JsonSchema(json!({"type": "object"})))
        );
    }

    /// A property name of CJK characters only: every one sanitises to the same rule name.
    fn cjk_name(i: u32) -> String {
        let char = |n: u32| char::from_u32(0x4E00 + n).expect("a CJK ideograph");
        format!("{}{}", char(i % 20_000), char(i / 20_000))
    }

    #[test]
    fn a_grammar_past_its_limit_is_refused_naming_the_option() {
        // Non-ASCII names all sanitise to one base; each still gets its own rule.
        let properties: serde_json::Map<String, Value> = (0..24_000)
            .map(|i| (cjk_name(i), json!({"type": "string"})))
            .collect();
        let schema = json!({"type": "object", "properties": properties});
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
            "tool_choice": "required"});
        let forced: ChatCompletionBody = serde_json::from_value(body.clone()).unwrap();
        let error = for_request(
            &forced.validate(None).unwrap().turn,
            "hermes",
            Reasoning::None,
            None,
        )
        .unwrap_err();
        assert!(error.to_string().starts_with("tool_choice: "), "{error}");
        body["tool_choice"] = json!("auto");
        body["response_format"] = json!({"type": "json_schema",
            "json_schema": {"name": "a", "schema": schema}});
        let formatted: ChatCompletionBody = serde_json::from_value(body).unwrap();
        let error = for_request(
            &formatted.validate(None).unwrap().turn,
            "hermes",
            Reasoning::None,
            None,
        )
        .unwrap_err();
        assert!(
            error.to_string().starts_with("response_format: "),
            "{error}"
        );
    }
}
