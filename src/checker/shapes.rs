//! The conversation shapes a template is checked on. Each is a whole conversation; its
//! assistant messages are what the model writes (the checker samples them as the template
//! renders them), the rest what the client sends.

use crate::tools::detect::probe_tools;
use serde_json::{Value, json};

/// A conversation to check.
#[derive(Debug, Clone)]
pub struct Shape {
    /// Short name, as reports show it.
    pub name: &'static str,
    /// What it exercises.
    pub description: &'static str,
    /// Tools declared (the probe's `get_weather`).
    pub tools: Option<Value>,
    /// `chat_template_kwargs`.
    pub kwargs: Value,
    /// The messages, in OpenAI chat form.
    pub messages: Vec<Value>,
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn answer(text: &str) -> Value {
    json!({"role": "assistant", "content": text})
}

fn reasoned(reasoning: &str, text: &str) -> Value {
    json!({"role": "assistant", "content": text, "reasoning_content": reasoning})
}

fn calls(reasoning: Option<&str>, cities: &[&str]) -> Value {
    let calls: Vec<Value> = cities
        .iter()
        .enumerate()
        .map(|(i, city)| {
            json!({"id": format!("shape_call_{i}"), "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": city}}})
        })
        .collect();
    let mut message = json!({"role": "assistant", "content": "", "tool_calls": calls});
    if let Some(reasoning) = reasoning {
        message["reasoning_content"] = json!(reasoning);
    }
    message
}

fn result(index: usize, text: &str) -> Value {
    json!({"role": "tool", "tool_call_id": format!("shape_call_{index}"), "content": text})
}

/// Every built-in shape, in report order.
pub fn all() -> Vec<Shape> {
    let shape = |name, description, tools: bool, kwargs: Value, messages: Vec<Value>| Shape {
        name,
        description,
        tools: tools.then(probe_tools),
        kwargs,
        messages,
    };
    vec![
        shape(
            "single_turn",
            "one question, one answer",
            false,
            json!({}),
            vec![user("What is 2 + 2?"), answer("2 + 2 = 4.")],
        ),
        shape(
            "system_multi_turn",
            "a system prompt and two turns",
            false,
            json!({}),
            vec![
                json!({"role": "system", "content": "You are a concise assistant."}),
                user("Name a prime number."),
                answer("7."),
                user("Another one?"),
                answer("11."),
            ],
        ),
        shape(
            "tool_call",
            "a tool call, its result, the answer",
            true,
            json!({}),
            vec![
                user("What is the weather in Paris?"),
                calls(None, &["Paris"]),
                result(0, "sunny, 22 C"),
                answer("It is sunny and 22 C in Paris."),
            ],
        ),
        shape(
            "parallel_calls",
            "two calls in one turn, two results",
            true,
            json!({}),
            vec![
                user("Weather in Paris and in Rome?"),
                calls(None, &["Paris", "Rome"]),
                result(0, "sunny"),
                result(1, "cloudy"),
                answer("Paris is sunny; Rome is cloudy."),
            ],
        ),
        shape(
            "reasoning",
            "reasoning on, two turns",
            false,
            json!({"enable_thinking": true}),
            vec![
                user("What is 17 * 3?"),
                reasoned("17 * 3 = 51.", "51."),
                user("And 17 * 4?"),
                reasoned("17 * 4 = 68.", "68."),
            ],
        ),
        shape(
            "reasoning_off",
            "reasoning off (enable_thinking false), two turns",
            false,
            json!({"enable_thinking": false}),
            vec![
                user("What is 17 * 3?"),
                answer("51."),
                user("And 17 * 4?"),
                answer("68."),
            ],
        ),
        shape(
            "tool_call_with_reasoning",
            "reasoning before a call and before the answer",
            true,
            json!({"enable_thinking": true}),
            vec![
                user("What is the weather in Paris?"),
                calls(Some("I should look it up."), &["Paris"]),
                result(0, "sunny, 22 C"),
                reasoned("The tool says sunny.", "Sunny, 22 C."),
            ],
        ),
    ]
}
