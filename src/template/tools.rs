//! Tool schemas as template values, kept between renders.
//!
//! An environment declares the same tools on every turn of every rollout. Converting them to
//! template values and printing each with `tojson` (as most templates do) cost as much as
//! rendering the six messages of a short tool conversation, so the last few tool lists are kept
//! converted, each tool with its `tojson` text made once.

use super::FieldMap;
use super::pyjson::{DumpOptions, dumps};
use minijinja::value::{Serde, Value};
use std::sync::{Arc, RwLock};

/// Distinct tool lists kept; a new one replaces the oldest.
const KEPT: usize = 8;

/// The tool lists rendered most recently, as template values.
#[derive(Debug, Default)]
pub(super) struct ToolsCache(RwLock<Kept>);

#[derive(Debug, Default)]
struct Kept {
    lists: Vec<(Arc<serde_json::Value>, Value)>,
    /// Where the next new list goes once `KEPT` are held.
    next: usize,
}

impl ToolsCache {
    /// `tools` as the template gets them. A list is found by identity first: requests that
    /// send the same text share one list (see `DeclaredTools`), and comparing JSON trees cost
    /// more than the rest of the lookup.
    pub(super) fn value_of(&self, tools: &Arc<serde_json::Value>) -> Value {
        if let Ok(kept) = self.0.read() {
            let mut lists = kept.lists.iter();
            let found = lists
                .clone()
                .find(|(json, _)| Arc::ptr_eq(json, tools))
                .or_else(|| lists.find(|(json, _)| json == tools));
            if let Some((_, value)) = found {
                return value.clone();
            }
        }
        let value = match &**tools {
            serde_json::Value::Array(list) => list.iter().map(tool_value).collect(),
            other => Value::from(Serde(other)),
        };
        if let Ok(mut kept) = self.0.write() {
            let entry = (tools.clone(), value.clone());
            if kept.lists.len() < KEPT {
                kept.lists.push(entry);
            } else {
                let next = kept.next;
                kept.lists[next] = entry;
                kept.next = (next + 1) % KEPT;
            }
        }
        value
    }
}

/// One tool: its fields as any JSON object reaches the template, plus its `tojson` text.
fn tool_value(tool: &serde_json::Value) -> Value {
    let serde_json::Value::Object(object) = tool else {
        return Value::from(Serde(tool));
    };
    let tojson = dumps(&Value::from(Serde(tool)), &DumpOptions::default())
        .ok()
        .map(Value::from);
    let fields = object
        .iter()
        .map(|(k, v)| (Value::from(k.as_str()), Value::from(Serde(v))))
        .collect();
    Value::from_object(FieldMap { fields, tojson })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::{ChatTemplate, RenderRequest};
    use serde_json::json;

    fn render(template: &ChatTemplate, tools: &serde_json::Value) -> String {
        template
            .render(RenderRequest {
                messages: &Value::from(Vec::<Value>::new()),
                tools: Some(&Arc::new(tools.clone())),
                add_generation_prompt: false,
                kwargs: None,
            })
            .unwrap()
    }

    #[test]
    fn kept_tools_render_like_fresh_ones() {
        let source = "{% for t in tools %}{{ t|tojson }}|{{ t|tojson(indent=1) }}|\
            {% if t is mapping %}{{ t.function.name }}|{{ t|length }}|{{ t }}|\
            {% for k, v in t.items() %}{{ k }};{% endfor %}{% endif %}#{% endfor %}{{ tools|tojson }}";
        let template = ChatTemplate::new("t", source.into(), Default::default()).unwrap();
        let tools = json!([
            {"type": "function", "function": {"name": "get_weather", "description": "Wetter für \"Städte\"",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
            "not an object",
        ]);
        let fresh = template
            .env
            .get_template(crate::template::TEMPLATE_NAME)
            .unwrap()
            .render(minijinja::context! { tools => Value::from(Serde(&tools)) })
            .unwrap();
        assert!(fresh.starts_with(
            "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \
            \"description\": \"Wetter für \\\"Städte\\\"\", \"parameters\": {\"type\": \"object\", \
            \"properties\": {\"city\": {\"type\": \"string\"}}}}}|{\n \"type\": \"function\",\n"
        ));
        assert_eq!(render(&template, &tools), fresh);
        let kept = template
            .tools
            .value_of(&Arc::new(tools.clone()))
            .get_item_by_index(0)
            .unwrap();
        let kept = kept.downcast_object_ref::<FieldMap>().unwrap();
        assert!(
            kept.tojson
                .as_ref()
                .unwrap()
                .as_str()
                .unwrap()
                .starts_with("{\"type\"")
        );
        // From the cache, and after other lists pushed it out and brought it back.
        assert_eq!(render(&template, &tools), fresh);
        for i in 0..=KEPT {
            render(
                &template,
                &json!([{"type": "function", "function": {"name": format!("f{i}")}}]),
            );
        }
        assert_eq!(render(&template, &tools), fresh);
    }
}
