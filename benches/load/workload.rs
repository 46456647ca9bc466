//! The reference workload of the shared perf harness (its `load.py` and `mock_upstream.py`),
//! restated in Rust so that both load generators send the same conversations: the same system
//! prompt, questions and three tool schemas; tool results of the same shapes; and an upstream
//! answering from the same pool of replies (a Hermes tool call unless the prompt ends with a
//! tool response, then a text reply; which one of the pool by a hash of the prompt ids).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rollout_proxy::template::json_value;
use rollout_proxy::template::pyjson::{DumpOptions, dumps};
use rollout_proxy::tokenizer::Tokenizer;
use serde_json::{Value, json};

pub const SYSTEM: &str =
    "You are a helpful assistant. Use the tools when they help. Answer concisely.";

pub const QUESTIONS: &[&str] = &[
    "What's the weather like in Paris right now?",
    "Is it raining in Tokyo? I need to decide about an umbrella.",
    "How many people live in Lisbon?",
    "Compare the weather in Berlin and Madrid for a walk this afternoon.",
    "What is (17 * 23) + 4 / 2?",
    "Which metro lines run in São Paulo and when do they open?",
    "Should I bring a jacket to Reykjavik tonight?",
    "Quick one: Zürich weather, please.",
];

/// The upstream's tool-call replies (some with prose first, one with two calls).
pub const TOOL_REPLIES: &[&str] = &[
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\", \"unit\": \"celsius\"}}\n</tool_call>",
    "I'll check the current conditions first.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Reykjavik\", \"unit\": \"fahrenheit\"}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"search_web\", \"arguments\": {\"query\": \"population of Lisbon 2024\", \"max_results\": 3}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Berlin\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Madrid\"}}\n</tool_call>",
    "Let me compute that for you.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"(17 * 23) + 4 / 2\"}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"search_web\", \"arguments\": {\"query\": \"\\\"São Paulo\\\" metro lines, opening hours\", \"max_results\": 5}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"unit\": \"celsius\"}}\n</tool_call>",
];

/// The upstream's text replies.
pub const TEXT_REPLIES: &[&str] = &[
    "It is currently sunny in Paris with a temperature of 22°C and a light breeze from the west.",
    "The weather in Tokyo is mild today: 18°C, partly cloudy, with a 10% chance of rain this evening.",
    "Reykjavik is cold right now, about 35°F with strong winds, so a warm jacket is a good idea.",
    "According to the search results, Lisbon had roughly 545,000 residents in 2024, while the wider metropolitan area is home to about 2.9 million people. The city has grown slowly over the past decade, mostly because of international arrivals.",
    "Berlin is overcast at 14°C and Madrid is hot and dry at 31°C. If you are choosing between the two for a walk this afternoon, Berlin will be more comfortable.",
    "The result is 393. I multiplied 17 by 23 to get 391, then added 4 divided by 2, which is 2.",
    "São Paulo's metro has six lines. Most stations open at 4:40 and close at midnight, with longer hours on Saturdays.\n\n- Line 1 (Blue): Tucuruvi - Jabaquara\n- Line 2 (Green): Vila Madalena - Vila Prudente\n- Line 3 (Red): Palmeiras-Barra Funda - Corinthians-Itaquera",
    "Zürich: 9°C and drizzle. Nothing dramatic — an umbrella should be enough. 🌧️",
    "Done. Anything else you would like me to look up?",
    "Here is a short summary:\n1. The temperature is moderate.\n2. No severe weather warnings are in effect.\n3. Tomorrow looks similar, with slightly more clouds in the afternoon.",
];

const WORDS: &[&str] = &[
    "river", "market", "window", "silver", "garden", "engine", "quiet", "morning", "harbor",
    "signal", "paper", "orange", "valley", "thunder", "copper", "lantern", "meadow", "circuit",
    "velvet", "canyon", "tunnel", "glacier", "whisper", "mosaic", "anchor", "prism", "falcon",
    "cobalt", "ember", "quartz", "saddle", "timber", "violet", "walnut", "zephyr", "basalt",
    "cedar", "dune", "fjord", "grove", "heron", "isle", "juniper", "kelp", "lagoon", "marble",
    "nectar", "opal",
];

/// The three tool schemas every request declares.
pub fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather", "description": "Get the current weather for a city.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
        {"type": "function", "function": {
            "name": "search_web", "description": "Search the web and return the top results.",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string"},
                "max_results": {"type": "integer", "minimum": 1, "maximum": 10}},
            "required": ["query"]}}},
        {"type": "function", "function": {
            "name": "calculator", "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
            "required": ["expression"]}}}
    ])
}

/// The upstream's replies, as ids (each ending with `<|im_end|>`), and the reply to a prompt.
pub struct ReplyPool {
    tool: Vec<Vec<u32>>,
    text: Vec<Vec<u32>>,
    tool_response_end: u32,
}

impl ReplyPool {
    /// The pools of [`TOOL_REPLIES`] and [`TEXT_REPLIES`] in Qwen3's ids.
    pub fn new(tokenizer: &Tokenizer) -> Self {
        let encode = |replies: &[&str]| -> Vec<Vec<u32>> {
            replies
                .iter()
                .map(|reply| tokenizer.encode(&format!("{reply}<|im_end|>")).unwrap())
                .collect()
        };
        Self {
            tool: encode(TOOL_REPLIES),
            text: encode(TEXT_REPLIES),
            tool_response_end: tokenizer
                .token_id("</tool_response>")
                .expect("a Qwen3 token"),
        }
    }

    /// The reply to `prompt` ([`reply_for`]).
    pub fn reply(&self, prompt: &[u32]) -> &[u32] {
        reply_for::<Vec<u32>>(prompt, self.tool_response_end, &self.tool, &self.text)
    }
}

/// The reply for a prompt: from the text pool when one of its last 8 ids ends a tool
/// response, else from the tool-call pool.
fn reply_for<'a, T>(prompt: &[u32], tool_response_end: u32, tool: &'a [T], text: &'a [T]) -> &'a T {
    let tail = &prompt[prompt.len().saturating_sub(8)..];
    let pool = if tail.contains(&tool_response_end) {
        text
    } else {
        tool
    };
    let bytes: Vec<u8> = prompt.iter().flat_map(|id| id.to_le_bytes()).collect();
    let hash = xxhash_rust::xxh3::xxh3_64(&bytes);
    &pool[(hash % pool.len() as u64) as usize]
}

/// A rollout's source of randomness (tool results), seeded by its index.
pub fn rollout_rng(index: usize) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(index as u64)
}

/// `n` filler words.
pub fn filler(rng: &mut impl Rng, n: usize) -> String {
    (0..n)
        .map(|_| WORDS[rng.random_range(0..WORDS.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

/// The environment's answer to one tool call, in the harness's shapes (Python's `json.dumps`
/// spacing).
pub fn tool_result(call: &Value, rng: &mut impl Rng) -> String {
    let function = &call["function"];
    let arguments: Value = function["arguments"]
        .as_str()
        .and_then(|a| serde_json::from_str(a).ok())
        .unwrap_or_default();
    let text = |key: &str| arguments[key].as_str().unwrap_or("?").to_string();
    const CONDITIONS: [&str; 5] = ["sunny", "cloudy", "rain", "drizzle", "windy"];
    let result = match function["name"].as_str() {
        Some("get_weather") => json!({
            "city": text("city"),
            "temp_c": rng.random_range(-5..=35),
            "conditions": CONDITIONS[rng.random_range(0..CONDITIONS.len())],
            "humidity": rng.random_range(20..=95),
        }),
        Some("search_web") => {
            let query = text("query");
            let count = arguments["max_results"].as_u64().unwrap_or(2);
            let results: Vec<Value> = (0..count)
                .map(|i| {
                    json!({"title": format!("Result {i} for {query}"),
                        "url": format!("https://example.org/{i}"), "snippet": filler(rng, 12)})
                })
                .collect();
            json!({ "results": results })
        }
        Some("calculator") => json!({"expression": text("expression"), "value": 393}),
        _ => json!({"ok": true}),
    };
    // As the harness writes it: Python's `json.dumps(..., ensure_ascii=False)`.
    dumps(&json_value(&result), &DumpOptions::default()).expect("a tool result is JSON")
}
