//! The tools a request declares, read once per distinct list.
//!
//! An environment sends the same `tools` on every turn of every rollout. Building them as JSON
//! values, checking them, comparing them with the template's converted lists and looking up
//! each function's name and schema cost about a fifth of a short turn with three tools, so each
//! distinct list is kept read, by its exact JSON text: a turn that sends a known list only
//! compares bytes.

use serde_json::Value;
use serde_json::value::RawValue;
use std::sync::{Arc, PoisonError, RwLock};

/// Distinct lists kept; a new one replaces the oldest.
const KEPT: usize = 8;

/// The shape an API declares its tools in. Each is read into OpenAI's chat shape
/// (`{"type": "function", "function": {"name", "description", "parameters"}}`), the shape chat
/// templates render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolDialect {
    /// OpenAI chat: already the templates' shape.
    OpenAi,
    /// Anthropic Messages: `{"name", "description", "input_schema"}`. Entries without a schema
    /// (Anthropic's server tools, such as `web_search_20250305`) are left out.
    Anthropic,
    /// OpenAI Responses: flat `{"type": "function", "name", "description", "parameters"}`, and
    /// `namespace` tools whose functions are declared as `{namespace}.{name}`. Built-in tools
    /// (`web_search`, `file_search`, custom grammars, ...) are left out.
    Responses,
}

impl ToolDialect {
    /// `list` in OpenAI's chat shape.
    fn convert(self, list: Vec<Value>) -> Vec<Value> {
        match self {
            Self::OpenAi => list,
            Self::Anthropic => list
                .into_iter()
                .filter_map(|tool| {
                    let name = tool.get("name")?.as_str()?;
                    let schema = tool.get("input_schema")?;
                    let mut function = serde_json::Map::new();
                    function.insert("name".into(), name.into());
                    if let Some(description) = tool.get("description") {
                        function.insert("description".into(), description.clone());
                    }
                    function.insert("parameters".into(), schema.clone());
                    Some(serde_json::json!({"type": "function", "function": function}))
                })
                .collect(),
            Self::Responses => list
                .iter()
                .flat_map(|tool| match tool.get("type").and_then(Value::as_str) {
                    Some("function") => responses_function(tool, None).into_iter().collect(),
                    Some("namespace") => {
                        let namespace = tool.get("name").and_then(Value::as_str);
                        let inner = tool.get("tools").and_then(Value::as_array);
                        inner
                            .into_iter()
                            .flatten()
                            .filter(|t| t.get("type").and_then(Value::as_str) == Some("function"))
                            .filter_map(|t| responses_function(t, namespace))
                            .collect()
                    }
                    _ => Vec::new(),
                })
                .collect(),
        }
    }
}

/// A Responses function tool in OpenAI's chat shape; inside a namespace its name is
/// `{namespace}.{name}`.
fn responses_function(tool: &Value, namespace: Option<&str>) -> Option<Value> {
    let name = tool.get("name")?.as_str()?;
    let mut function = serde_json::Map::new();
    let name = match namespace {
        Some(namespace) => format!("{namespace}.{name}"),
        None => name.to_string(),
    };
    function.insert("name".into(), name.into());
    if let Some(description) = tool.get("description") {
        function.insert("description".into(), description.clone());
    }
    let parameters = tool
        .get("parameters")
        .cloned()
        .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
    function.insert("parameters".into(), parameters);
    Some(serde_json::json!({"type": "function", "function": function}))
}

/// Why a `tools` field cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ToolsError {
    /// `tools` is not a list of tool objects.
    #[error("'tools' must be a list of tools: {0}")]
    NotAList(serde_json::Error),
    /// The entry at this index is not a function tool.
    #[error("tools[{0}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")]
    NotAFunction(usize),
}

/// A checked, non-empty list of tool schemas.
#[derive(Debug)]
pub struct DeclaredTools {
    json: Arc<Value>,
    functions: Vec<Function>,
    /// XXH3 of the list's JSON, computed when first asked.
    digest: std::sync::OnceLock<u64>,
}

/// What promotion needs of one declared function.
#[derive(Debug)]
pub(super) struct Function {
    pub name: String,
    /// The key a bare string argument heals to: the schema's single required string
    /// property, if it has one.
    pub string_key: Option<String>,
}

impl DeclaredTools {
    /// Checks a list of tools; an empty list declares none.
    pub fn new(list: Vec<Value>) -> Result<Option<Self>, ToolsError> {
        if list.is_empty() {
            return Ok(None);
        }
        let functions = list
            .iter()
            .enumerate()
            .map(|(i, tool)| {
                let kind = tool
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("function");
                let function = tool.get("function");
                let name = function.and_then(|f| f.get("name")).and_then(Value::as_str);
                match name {
                    Some(name) if kind == "function" => Ok(Function {
                        name: name.to_string(),
                        string_key: function
                            .and_then(|f| f.get("parameters"))
                            .and_then(single_required_string)
                            .map(str::to_string),
                    }),
                    _ => Err(ToolsError::NotAFunction(i)),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Some(Self {
            json: Arc::new(Value::Array(list)),
            functions,
            digest: std::sync::OnceLock::new(),
        }))
    }

    /// The tools of a request's `tools` field (its JSON text), read once per distinct text
    /// while it is among the last few seen.
    pub fn from_raw(raw: &RawValue) -> Result<Option<Arc<Self>>, ToolsError> {
        KNOWN.read(raw, ToolDialect::OpenAi)
    }

    /// Like [`DeclaredTools::from_raw`], for a list declared in another API's shape.
    pub fn from_raw_in(
        raw: &RawValue,
        dialect: ToolDialect,
    ) -> Result<Option<Arc<Self>>, ToolsError> {
        KNOWN.read(raw, dialect)
    }

    /// A digest of the list (XXH3 of its JSON), computed once: a conversation's digest
    /// starts with it.
    pub fn digest(&self) -> u64 {
        *self.digest.get_or_init(|| {
            xxhash_rust::xxh3::xxh3_64(&serde_json::to_vec(&*self.json).unwrap_or_default())
        })
    }

    /// The list as JSON, shared: templates keep their conversions of it by identity.
    pub fn json(&self) -> &Arc<Value> {
        &self.json
    }

    /// The functions' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.functions.iter().map(|f| f.name.as_str())
    }

    /// The parameter schema of the function `name`, if it declares one.
    pub fn parameters(&self, name: &str) -> Option<&Value> {
        let index = self.functions.iter().position(|f| f.name == name)?;
        self.json.get(index)?.get("function")?.get("parameters")
    }

    pub(super) fn functions(&self) -> &[Function] {
        &self.functions
    }
}

/// The lists the server has read most recently.
static KNOWN: KnownTools = KnownTools::new();

/// Lists read recently, by their JSON text.
struct KnownTools(RwLock<Known>);

impl KnownTools {
    const fn new() -> Self {
        Self(RwLock::new(Known {
            lists: Vec::new(),
            next: 0,
        }))
    }

    /// The list `raw` holds: the one read before if its text is known, else read now.
    fn read(
        &self,
        raw: &RawValue,
        dialect: ToolDialect,
    ) -> Result<Option<Arc<DeclaredTools>>, ToolsError> {
        let text = raw.get();
        if let Some(known) = self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .find(text, dialect)
        {
            return Ok(known);
        }
        let list: Vec<Value> = serde_json::from_str(text).map_err(ToolsError::NotAList)?;
        let tools = DeclaredTools::new(dialect.convert(list))?.map(Arc::new);
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .keep(text, dialect, tools.clone());
        Ok(tools)
    }
}

struct Known {
    lists: Vec<(Box<str>, ToolDialect, Option<Arc<DeclaredTools>>)>,
    /// Where the next new list goes once `KEPT` are held.
    next: usize,
}

impl Known {
    fn find(&self, text: &str, dialect: ToolDialect) -> Option<Option<Arc<DeclaredTools>>> {
        self.lists
            .iter()
            .find(|(known, kind, _)| *kind == dialect && **known == *text)
            .map(|(_, _, tools)| tools.clone())
    }

    fn keep(&mut self, text: &str, dialect: ToolDialect, tools: Option<Arc<DeclaredTools>>) {
        let entry = (Box::from(text), dialect, tools);
        if self.lists.len() < KEPT {
            self.lists.push(entry);
        } else {
            self.lists[self.next] = entry;
            self.next = (self.next + 1) % KEPT;
        }
    }
}

/// The only required property of a schema, if it takes a string (typed string, untyped, or a
/// type list including string).
fn single_required_string(schema: &Value) -> Option<&str> {
    let [key] = schema.get("required")?.as_array()?.as_slice() else {
        return None;
    };
    let key = key.as_str()?;
    let property = schema.get("properties")?.get(key)?;
    let takes_string = match property.get("type") {
        None => true,
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(types)) => types.iter().any(|t| t == "string"),
        Some(_) => false,
    };
    takes_string.then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(value: &Value) -> Box<RawValue> {
        RawValue::from_string(value.to_string()).unwrap()
    }

    #[test]
    fn reads_names_and_the_key_a_bare_string_heals_to() {
        let tools = json!([
            {"type": "function", "function": {"name": "Bash", "parameters": {"type": "object",
                "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
            {"function": {"name": "Read", "parameters": {}}},
            {"type": "function", "function": {"name": "Count", "parameters": {
                "properties": {"n": {"type": "integer"}}, "required": ["n"]}}},
        ]);
        let declared = DeclaredTools::new(serde_json::from_value(tools.clone()).unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(
            declared.names().collect::<Vec<_>>(),
            ["Bash", "Read", "Count"]
        );
        let keys: Vec<_> = declared
            .functions()
            .iter()
            .map(|f| f.string_key.as_deref())
            .collect();
        assert_eq!(keys, [Some("command"), None, None]);
        assert_eq!(**declared.json(), tools);
    }

    #[test]
    fn rejects_what_is_not_a_list_of_functions_and_reads_an_empty_list_as_none() {
        assert!(DeclaredTools::new(Vec::new()).unwrap().is_none());
        assert!(DeclaredTools::from_raw(&raw(&json!([]))).unwrap().is_none());
        for (tools, error) in [
            (json!({"name": "f"}), "'tools' must be a list of tools"),
            (
                json!([{"type": "function", "function": {}}]),
                "tools[0] must be",
            ),
            (
                json!([{"type": "function", "function": {"name": "f"}}, {"type": "code"}]),
                "tools[1] must be",
            ),
        ] {
            let message = DeclaredTools::from_raw(&raw(&tools))
                .unwrap_err()
                .to_string();
            assert!(message.starts_with(error), "{message}");
        }
    }

    #[test]
    fn a_list_sent_again_is_the_one_read_before() {
        // Its own cache: other tests read lists into the server's at the same time.
        let known = KnownTools::new();
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let first = known
            .read(&raw(&tools), ToolDialect::OpenAi)
            .unwrap()
            .unwrap();
        let again = known
            .read(&raw(&tools), ToolDialect::OpenAi)
            .unwrap()
            .unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        let spaced = RawValue::from_string(serde_json::to_string_pretty(&tools).unwrap()).unwrap();
        let reread = known.read(&spaced, ToolDialect::OpenAi).unwrap().unwrap();
        assert!(
            !Arc::ptr_eq(&first, &reread),
            "other text is read on its own"
        );
        assert_eq!(reread.json(), first.json());
        // Once KEPT other lists have been read since, it is read anew.
        for i in 0..KEPT {
            let other = json!([{"type": "function", "function": {"name": format!("g{i}")}}]);
            known.read(&raw(&other), ToolDialect::OpenAi).unwrap();
        }
        let later = known
            .read(&raw(&tools), ToolDialect::OpenAi)
            .unwrap()
            .unwrap();
        assert!(!Arc::ptr_eq(&first, &later));
    }

    #[test]
    fn anthropic_tools_are_read_into_the_templates_shape() {
        let known = KnownTools::new();
        let tools = json!([
            {"name": "Read", "description": "Reads a file", "cache_control": {"type": "ephemeral"},
             "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
            {"name": "ToolSearch", "defer_loading": true, "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
        ]);
        let read = known
            .read(&raw(&tools), ToolDialect::Anthropic)
            .unwrap()
            .unwrap();
        assert_eq!(read.names().collect::<Vec<_>>(), ["Read", "ToolSearch"]);
        assert_eq!(
            read.json()[0],
            json!({"type": "function", "function": {"name": "Read", "description": "Reads a file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}})
        );
        assert_eq!(read.functions()[0].string_key.as_deref(), Some("path"));
        // The same text read as OpenAI tools is another list.
        assert!(known.read(&raw(&tools), ToolDialect::OpenAi).is_err());
    }
}
