//! Which tool-call format a chat template writes: a conversation whose assistant calls a
//! function is rendered, and each registered format is asked to read the assistant's part back.
//! Sessions created without a `tool_parser` take the format found (`check-template` reports it).

use super::registry::PARSERS;
use crate::template::{ChatTemplate, RenderRequest, TemplateError, common_prefix_len, json_value};
use serde_json::{Value, json};
use std::sync::Arc;

/// The function the probe conversation calls, and its arguments.
const PROBE_NAME: &str = "get_weather";

fn probe_arguments() -> Value {
    json!({"city": "Paris"})
}

/// The tools the probe conversation declares.
pub fn probe_tools() -> Value {
    json!([{"type": "function", "function": {"name": PROBE_NAME,
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}}}])
}

/// The name of the registered format that reads the call `template` writes for an assistant
/// message, or `None` when no format reads it back exactly (or the template cannot render a
/// call). Templates differ in what a call message must look like (DeepSeek's writes calls only
/// for `content: null` and string arguments; Qwen3's needs a string content), so the message is
/// tried in each form; an error is returned only when no form renders.
pub fn written_format(template: &ChatTemplate) -> Result<Option<&'static str>, TemplateError> {
    let tools = Arc::new(probe_tools());
    let user = json!({"role": "user", "content": "What is the weather in Paris?"});
    let call = json!({"role": "assistant", "content": "", "tool_calls": [{"id": "call_0",
        "type": "function", "function": {"name": PROBE_NAME, "arguments": probe_arguments()}}]});
    let render = |messages: Value, add_generation_prompt| {
        template.render(RenderRequest {
            messages: &json_value(&messages),
            tools: Some(&tools),
            add_generation_prompt,
            kwargs: None,
        })
    };
    let prompt = render(json!([user]), true)?;
    let mut first_error = None;
    let mut rendered = false;
    for call in call_message_forms(&call) {
        match render(json!([user, call]), false) {
            Ok(history) => {
                rendered = true;
                let written = &history[common_prefix_len(&prompt, &history)..];
                if let Some(format) = format_reading(written) {
                    return Ok(Some(format));
                }
            }
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    match first_error {
        Some(error) if !rendered => Err(error),
        _ => Ok(None),
    }
}

/// What `template` writes between an assistant's think block and its call (Qwen3: `"\n\n"`),
/// when it renders reasoning beside a call and writes only whitespace there; `None` otherwise.
/// A grammar that forces a call after reasoning must allow it: it is often one token.
pub fn think_separator(template: &ChatTemplate) -> Option<String> {
    let tools = Arc::new(probe_tools());
    let user = json!({"role": "user", "content": "What is the weather in Paris?"});
    let call = json!({"role": "assistant", "content": "", "reasoning_content": "Look it up.",
        "tool_calls": [{"id": "call_0", "type": "function",
            "function": {"name": PROBE_NAME, "arguments": probe_arguments()}}]});
    call_message_forms(&call).into_iter().find_map(|call| {
        let history = template
            .render(RenderRequest {
                messages: &json_value(&json!([user, call])),
                tools: Some(&tools),
                add_generation_prompt: false,
                kwargs: None,
            })
            .ok()?;
        let (_, after) = history
            .split_once("Look it up.")?
            .1
            .split_once("</think>")?;
        let separator: String = after.chars().take_while(|c| c.is_whitespace()).collect();
        let rest = &after[separator.len()..];
        (!separator.is_empty() && format_reading(rest).is_some()).then_some(separator)
    })
}

/// An assistant message with calls in each form templates write calls for: as given (with
/// the arguments as a mapping), with `content: null`, and with `content: null` and the
/// arguments as JSON text.
pub fn call_message_forms(message: &Value) -> Vec<Value> {
    let mut null_content = message.clone();
    null_content["content"] = Value::Null;
    let mut text_arguments = null_content.clone();
    if let Some(calls) = text_arguments["tool_calls"].as_array_mut() {
        for call in calls {
            let arguments = &mut call["function"]["arguments"];
            if !arguments.is_string() {
                *arguments = json!(arguments.to_string());
            }
        }
    }
    vec![message.clone(), null_content, text_arguments]
}

/// The first registered format (`auto` aside) that reads exactly the probe call in `text`.
pub fn format_reading(text: &str) -> Option<&'static str> {
    PARSERS
        .iter()
        .filter(|entry| entry.name != "auto")
        .find(|entry| {
            entry.build().find_calls(text, false).iter().any(|call| {
                call.name == PROBE_NAME
                    && serde_json::from_str::<Value>(&call.arguments).ok()
                        == Some(probe_arguments())
            })
        })
        .map(|entry| entry.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format_of(source: &str) -> Option<&'static str> {
        let template = ChatTemplate::new("t", source.into(), Default::default()).unwrap();
        written_format(&template).unwrap()
    }

    #[test]
    fn the_format_a_template_writes_is_read_back() {
        let hermes = "{% for m in messages %}{% for c in m.tool_calls or [] %}<tool_call>\n\
            {{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n\
            </tool_call>{% endfor %}{% endfor %}";
        assert_eq!(format_of(hermes), Some("hermes"));
        let coder = "{% for m in messages %}{% for c in m.tool_calls or [] %}<tool_call>\n\
            <function={{ c.function.name }}>\n{% for k, v in c.function.arguments | items %}\
            <parameter={{ k }}>\n{{ v }}\n</parameter>\n{% endfor %}</function>\n</tool_call>\
            {% endfor %}{% endfor %}";
        assert_eq!(format_of(coder), Some("qwen3_coder"));
        assert_eq!(
            format_of("{% for m in messages %}{{ m.content }}{% endfor %}"),
            None
        );
    }
}
