//! Which calls found in the text become structured `tool_calls`, and with which arguments.
//!
//! Only declared tools that `tool_choice` allows are promoted; anything else keeps its markup
//! as text. Arguments that are a JSON object are kept byte for byte. With healing on (the
//! default; `auto_heal_tool_calls: false` opts out), a JSON string holding an object is used,
//! and a bare string goes to the schema's single required string property.

use super::declared::DeclaredTools;
use serde_json::Value;
use std::sync::Arc;

/// The promotion rules of one request.
#[derive(Debug, Clone, Default)]
pub struct Promoter {
    tools: Option<Arc<DeclaredTools>>,
    /// Indices of the declared functions that may be called.
    callable: Vec<usize>,
    heal: bool,
}

impl Promoter {
    /// Rules for the `tools` declared in a request, of which `callable` may be called.
    pub fn new(tools: Option<&Arc<DeclaredTools>>, callable: &[String], heal: bool) -> Self {
        let indices = tools
            .into_iter()
            .flat_map(|tools| tools.names().enumerate())
            .filter(|(_, name)| callable.iter().any(|c| c == name))
            .map(|(i, _)| i)
            .collect();
        Self {
            tools: tools.cloned(),
            callable: indices,
            heal,
        }
    }

    /// Whether any call can be promoted at all.
    pub fn is_active(&self) -> bool {
        !self.callable.is_empty()
    }

    /// Whether incomplete or loosely formed calls are healed.
    pub fn heals(&self) -> bool {
        self.heal
    }

    /// The arguments (JSON object text) for a call to `name` written with `raw` arguments, or
    /// `None` to leave the call as text.
    pub fn arguments(&self, name: &str, raw: &str) -> Option<String> {
        let functions = self.tools.as_ref()?.functions();
        let function = self
            .callable
            .iter()
            .map(|&i| &functions[i])
            .find(|f| f.name == name)?;
        let raw = raw.trim();
        if raw.starts_with('{') {
            return serde_json::from_str::<serde_json::Map<String, Value>>(raw)
                .ok()
                .map(|_| raw.to_string());
        }
        if !self.heal {
            return None;
        }
        let Ok(Value::String(text)) = serde_json::from_str::<Value>(raw) else {
            return None;
        };
        if let Ok(Value::Object(object)) = serde_json::from_str::<Value>(&text) {
            return Some(Value::Object(object).to_string());
        }
        let key = function.string_key.as_deref()?;
        Some(serde_json::json!({ key: text }).to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Arc<DeclaredTools> {
        crate::tools::test_support::declared(json!([
            {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object",
                "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
            {"type": "function", "function": {"name": "Read", "parameters": {}}},
        ]))
    }

    fn all() -> Vec<String> {
        vec!["Bash".into(), "Read".into()]
    }

    #[test]
    fn objects_are_kept_byte_for_byte() {
        let p = Promoter::new(Some(&tools()), &all(), true);
        assert_eq!(
            p.arguments("Read", r#"{"b": true, "a": 1.50}"#).as_deref(),
            Some(r#"{"b": true, "a": 1.50}"#)
        );
        assert_eq!(p.arguments("Nuke", "{}"), None, "undeclared");
        assert_eq!(p.arguments("Read", "[1]"), None);
    }

    #[test]
    fn bare_strings_map_to_the_single_required_string_key() {
        let p = Promoter::new(Some(&tools()), &all(), true);
        assert_eq!(
            p.arguments("Bash", r#""echo hi""#).as_deref(),
            Some(r#"{"command":"echo hi"}"#)
        );
        assert_eq!(p.arguments("Read", r#""x""#), None, "ambiguous schema");
        assert_eq!(
            p.arguments("Bash", r#""{\"command\": \"ls\"}""#).as_deref(),
            Some(r#"{"command":"ls"}"#)
        );
        let strict = Promoter::new(Some(&tools()), &all(), false);
        assert_eq!(
            strict.arguments("Bash", r#""echo hi""#),
            None,
            "healing opted out"
        );
    }

    #[test]
    fn only_callable_tools_are_promoted() {
        let p = Promoter::new(Some(&tools()), &["Bash".to_string()], true);
        assert!(p.arguments("Read", "{}").is_none());
        assert!(p.arguments("Bash", "{}").is_some());
        assert!(!Promoter::new(Some(&tools()), &[], true).is_active());
    }
}
