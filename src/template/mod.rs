//! Chat templates: Jinja templates rendered with Hugging Face `transformers` semantics.
//!
//! [`ChatTemplate`] turns messages (already normalised to the shape transformers passes to a
//! template) into prompt text. [`source`] finds a template: bundled by name, a file, or a model
//! folder's `tokenizer_config.json` / `chat_template.jinja` / `chat_template.json`.

mod environment;
pub mod pyjson;
pub(crate) mod source;
mod tools;

use minijinja::Environment;
use minijinja::value::{Enumerator, Object, Serde, Value};
use std::collections::BTreeMap;
use std::error::Error as _;
use std::sync::Arc;

pub use minijinja::Value as TemplateValue;
pub use source::{TemplateSpec, load_template, template_with_source};

/// Errors from compiling or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template called `raise_exception(message)`: the conversation is invalid for it.
    #[error("{0}")]
    Raised(String),
    /// The template failed while rendering (undefined attribute, bad operation, ...).
    #[error("chat template failed to render: {0}")]
    Render(String),
    /// The template text does not compile.
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template could not be found or read.
    #[error("cannot load chat template: {0}")]
    Load(String),
}

/// A compiled chat template plus the special-token variables it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    name: String,
    /// `bos_token`, `eos_token`, ... as strings, passed to every render.
    special_tokens: BTreeMap<String, String>,
    /// The Jinja source, as loaded.
    source: Arc<str>,
    renders_tool_calls: bool,
    /// Reads a message's content as a list of parts ([`ChatTemplate::reads_content_parts`]).
    reads_content_parts: bool,
    /// Tool lists already converted for the template.
    tools: tools::ToolsCache,
}

const TEMPLATE_NAME: &str = "chat_template";

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("name", &self.name)
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

/// What one render needs besides the template: the inputs of `apply_chat_template`.
#[derive(Debug, Clone, Copy)]
pub struct RenderRequest<'a> {
    /// Messages as transformers hands them to the template: a list of maps. A turn converts
    /// them once and may render them twice (see [`json_value`] for JSON input).
    pub messages: &'a Value,
    /// Tool schemas; `None` renders `tools` as none. Shared, so that a list the template has
    /// converted before is known by identity.
    pub tools: Option<&'a Arc<serde_json::Value>>,
    /// End with the assistant's header.
    pub add_generation_prompt: bool,
    /// Extra template variables (`chat_template_kwargs`); they override everything else.
    pub kwargs: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

impl ChatTemplate {
    /// Compiles `source`; `name` is only used in logs and errors.
    pub fn new(
        name: impl Into<String>,
        source: String,
        special_tokens: BTreeMap<String, String>,
    ) -> Result<Self, TemplateError> {
        let mut env = environment::hf_environment();
        let renders_tool_calls = source.contains("tool_calls");
        let kept: Arc<str> = Arc::from(source.as_str());
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        let mut template = Self {
            env,
            name: name.into(),
            special_tokens,
            source: kept,
            renders_tool_calls,
            reads_content_parts: false,
            tools: Default::default(),
        };
        template.reads_content_parts = template.renders_parts();
        Ok(template)
    }

    /// Whether the template writes the text of a message whose content is a list of parts
    /// (`[{"type": "text", "text": ...}, ...]`) as text: the vision-language templates iterate
    /// over the parts, the others read a string (and write a list as its repr, or nothing, or
    /// fail). vLLM decides the same from the template's syntax tree ("openai" or "string"
    /// content format) and hands the one kind parts, the other the texts joined by newlines;
    /// here the template is asked, by one render at load.
    pub fn reads_content_parts(&self) -> bool {
        self.reads_content_parts
    }

    fn renders_parts(&self) -> bool {
        let part =
            |text: &str| template_map([("type", Value::from("text")), ("text", Value::from(text))]);
        let parts = Value::from(vec![part("\u{1}part-one"), part("\u{1}part-two")]);
        let message = template_map([("role", Value::from("user")), ("content", parts)]);
        let rendered = self.render(RenderRequest {
            messages: &Value::from(vec![message]),
            tools: None,
            add_generation_prompt: true,
            kwargs: None,
        });
        rendered.is_ok_and(|text| {
            let as_repr = text.contains("'text'") || text.contains("\"text\"");
            text.contains("\u{1}part-one") && text.contains("\u{1}part-two") && !as_repr
        })
    }

    /// Whether the template renders assistant messages' `tool_calls` (else it would drop them).
    pub fn renders_tool_calls(&self) -> bool {
        self.renders_tool_calls
    }

    /// The template's name (bundled name, file path or model folder).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Every special-token variable (`bos_token`, `eos_token`, ...) the template is given.
    pub fn special_tokens(&self) -> &BTreeMap<String, String> {
        &self.special_tokens
    }

    /// A special-token variable such as `eos_token`, if the model defines it.
    pub fn special_token(&self, key: &str) -> Option<&str> {
        self.special_tokens.get(key).map(String::as_str)
    }

    /// Renders the template like `tokenizer.apply_chat_template(..., tokenize=False)`.
    pub fn render(&self, request: RenderRequest<'_>) -> Result<String, TemplateError> {
        let special_tokens = self
            .special_tokens
            .iter()
            .map(|(k, v)| (k.as_str(), Value::from(v.as_str())));
        let tools = match request.tools {
            Some(tools) => self.tools.value_of(tools),
            None => Value::from(()),
        };
        let inputs = [
            ("messages", request.messages.clone()),
            ("tools", tools),
            ("documents", Value::from(())),
            (
                "add_generation_prompt",
                Value::from(request.add_generation_prompt),
            ),
        ];
        let kwargs = request
            .kwargs
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), Value::from(Serde(v))));
        // Later variables override earlier ones, as transformers lets kwargs override all.
        let context = template_map(special_tokens.chain(inputs).chain(kwargs));
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TemplateError::Syntax(describe(&e)))?;
        template.render(context).map_err(|e| classify(&e))
    }
}

/// A map for the template (a message), keys in the given order as a JSON object keeps them (a
/// repeated key keeps its first place and takes the last value).
pub fn template_map<'a>(fields: impl IntoIterator<Item = (&'a str, Value)>) -> Value {
    let mut entries: Vec<(Value, Value)> = Vec::new();
    for (key, value) in fields {
        match entries.iter_mut().find(|(k, _)| k.as_str() == Some(key)) {
            Some(entry) => entry.1 = value,
            None => entries.push((Value::from(key), value)),
        }
    }
    Value::from_object(FieldMap {
        fields: entries,
        tojson: None,
    })
}

/// A small map found by a scan (a message's fields, a render's variables, a tool's fields): it
/// has a handful of keys, and a turn builds one per message of the conversation, where a hash
/// map's hashing cost more than its lookups saved.
#[derive(Debug)]
struct FieldMap {
    fields: Vec<(Value, Value)>,
    /// The map's `tojson` text (default options), when it was made in advance: tool schemas
    /// are printed this way by most templates, every turn.
    tojson: Option<Value>,
}

impl Object for FieldMap {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn get_value_by_str(self: &Arc<Self>, key: &str) -> Option<Value> {
        self.fields
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.fields.iter().map(|(k, _)| k.clone()).collect())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.fields.len())
    }
}

/// The length of the longest common prefix of two renders, at a character boundary.
pub fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or(a.len().min(b.len()), |((at, _), _)| at)
}

/// A JSON value as the template engine holds it.
pub fn json_value(value: &serde_json::Value) -> Value {
    Value::from(Serde(value))
}

fn classify(error: &minijinja::Error) -> TemplateError {
    let mut source = error.source();
    let mut cause: &minijinja::Error = error;
    loop {
        if cause
            .source()
            .is_some_and(|s| s.is::<environment::RaisedByTemplate>())
        {
            return TemplateError::Raised(cause.detail().unwrap_or_default().to_string());
        }
        match source.and_then(|s| s.downcast_ref::<minijinja::Error>()) {
            Some(inner) => {
                cause = inner;
                source = inner.source();
            }
            None => return TemplateError::Render(describe(error)),
        }
    }
}

fn describe(error: &minijinja::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_maps_act_as_ordered_maps_in_templates() {
        let message = template_map([
            ("role", Value::from("tool")),
            ("content", Value::from("x")),
            ("role", Value::from("user")),
            ("name", Value::from(())),
        ]);
        let template = ChatTemplate::new(
            "t",
            "{% for k in m %}{{ k }},{% endfor %}|{{ m.role }}|{{ m['content'] }}|\
             {{ m|length }}|{{ 'name' in m }}|{{ m.missing is defined }}|{{ m|tojson }}|\
             {% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}"
                .into(),
            Default::default(),
        )
        .unwrap();
        let rendered = template
            .env
            .get_template(TEMPLATE_NAME)
            .unwrap()
            .render(minijinja::context! { m => message })
            .unwrap();
        assert_eq!(
            rendered,
            "role,content,name,|user|x|3|True|False|\
             {\"role\": \"user\", \"content\": \"x\", \"name\": null}|\
             role=user;content=x;name=None;"
        );
    }
}
