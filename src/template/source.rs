//! Where a chat template comes from: a bundled template, a file, or a model folder.

use super::{ChatTemplate, TemplateError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Templates shipped inside the binary, by name.
const BUNDLED: &[(&str, &str)] = &[
    ("chatml", include_str!("../../templates/chatml.jinja")),
    ("hermes", include_str!("../../templates/hermes.jinja")),
    ("gpt_oss", include_str!("../../templates/gpt_oss.jinja")),
    ("qwen2_vl", include_str!("../../templates/qwen2_vl.jinja")),
    ("qwen3_vl", include_str!("../../templates/qwen3_vl.jinja")),
];

/// Special-token keys of `tokenizer_config.json` that templates read as variables.
const SPECIAL_TOKEN_KEYS: &[&str] = &["bos_token", "eos_token", "unk_token", "pad_token"];

/// How the user named a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateSpec {
    /// A bundled template (`chatml`, `hermes`, `gpt_oss`).
    Bundled(String),
    /// A Jinja file, or a model folder whose template is used.
    Path(PathBuf),
}

impl TemplateSpec {
    /// Parses a `--chat-template` value: a bundled name, else a path.
    pub fn parse(value: &str) -> Self {
        if BUNDLED.iter().any(|(name, _)| *name == value) {
            Self::Bundled(value.to_string())
        } else {
            Self::Path(PathBuf::from(value))
        }
    }
}

/// Builds the chat template: `spec` if given, else the model folder's own template. Special
/// tokens (`bos_token`, `eos_token`, ...) always come from the model folder when there is one.
pub fn load_template(
    spec: Option<&TemplateSpec>,
    model_dir: Option<&Path>,
) -> Result<ChatTemplate, TemplateError> {
    let config = match model_dir {
        Some(dir) => read_tokenizer_config(dir)?,
        None => serde_json::Value::Null,
    };
    let special_tokens = special_tokens(&config);
    let (name, source) = match (spec, model_dir) {
        (Some(TemplateSpec::Bundled(name)), _) => (name.clone(), bundled(name)?.to_string()),
        (Some(TemplateSpec::Path(path)), _) if path.is_dir() => (
            path.display().to_string(),
            model_dir_template(path, &read_tokenizer_config(path)?)?,
        ),
        (Some(TemplateSpec::Path(path)), _) => (path.display().to_string(), read(path)?),
        (None, Some(dir)) => (dir.display().to_string(), model_dir_template(dir, &config)?),
        (None, None) => return Err(TemplateError::Load("no chat template given".into())),
    };
    ChatTemplate::new(name, source, special_tokens)
}

/// A template from its text, with the special tokens of `model_dir` (if any).
pub fn template_with_source(
    name: &str,
    source: String,
    model_dir: Option<&Path>,
) -> Result<ChatTemplate, TemplateError> {
    let config = match model_dir {
        Some(dir) => read_tokenizer_config(dir)?,
        None => serde_json::Value::Null,
    };
    ChatTemplate::new(name, source, special_tokens(&config))
}

fn bundled(name: &str) -> Result<&'static str, TemplateError> {
    BUNDLED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, source)| *source)
        .ok_or_else(|| TemplateError::Load(format!("no bundled template named {name:?}")))
}

fn read(path: &Path) -> Result<String, TemplateError> {
    std::fs::read_to_string(path)
        .map_err(|e| TemplateError::Load(format!("{}: {e}", path.display())))
}

fn read_tokenizer_config(dir: &Path) -> Result<serde_json::Value, TemplateError> {
    let path = dir.join("tokenizer_config.json");
    if !path.exists() {
        return Ok(serde_json::Value::Null);
    }
    serde_json::from_str(&read(&path)?)
        .map_err(|e| TemplateError::Load(format!("{}: {e}", path.display())))
}

/// A model folder's template, in the order transformers looks: `chat_template.jinja`,
/// `chat_template.json`, then `tokenizer_config.json`'s `chat_template` (a string, or a list of
/// named templates of which `default` is used).
fn model_dir_template(dir: &Path, config: &serde_json::Value) -> Result<String, TemplateError> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        return read(&jinja);
    }
    let json = dir.join("chat_template.json");
    if json.exists() {
        let value: serde_json::Value = serde_json::from_str(&read(&json)?)
            .map_err(|e| TemplateError::Load(format!("{}: {e}", json.display())))?;
        if let Some(template) = template_field(&value) {
            return Ok(template);
        }
    }
    template_field(config)
        .ok_or_else(|| TemplateError::Load(format!("{} has no chat template", dir.display())))
}

fn template_field(config: &serde_json::Value) -> Option<String> {
    match config.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .or_else(|| named.first())
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    }
}

/// `bos_token` and friends; each may be a plain string or an AddedToken object.
fn special_tokens(config: &serde_json::Value) -> BTreeMap<String, String> {
    SPECIAL_TOKEN_KEYS
        .iter()
        .filter_map(|key| {
            let value = config.get(*key)?;
            let text = value
                .as_str()
                .or_else(|| value.get("content").and_then(|c| c.as_str()))?;
            Some((key.to_string(), text.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn folder(files: &[(&str, String)]) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("rp-template-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        dir
    }

    fn render(template: &ChatTemplate) -> String {
        template
            .render(crate::template::RenderRequest {
                messages: &crate::template::json_value(&json!([{"role": "user", "content": "x"}])),
                tools: None,
                add_generation_prompt: false,
                kwargs: None,
            })
            .unwrap()
    }

    /// The content format vLLM 0.32 reads from each template's syntax tree
    /// (`vllm.renderers.hf._detect_content_format`: "openai" reads parts, "string" a string),
    /// which the proxy's one render at load agrees with: bundled templates and the fetched
    /// fixtures' own.
    #[test]
    fn templates_read_parts_where_vllm_finds_they_do() {
        for (name, reads_parts) in [
            ("chatml", false),
            ("gpt_oss", false),
            ("hermes", false),
            ("qwen2_vl", true),
            ("qwen3_vl", true),
        ] {
            let spec = TemplateSpec::Bundled(name.into());
            let template = load_template(Some(&spec), None).unwrap();
            assert_eq!(template.reads_content_parts(), reads_parts, "{name}");
        }
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/cache");
        for (model, reads_parts) in [
            ("deepseek_v3", false),
            ("gemma3", true),
            ("llama3_1", false),
            ("qwen3", false),
            ("smollm2", false),
        ] {
            let template = load_template(None, Some(&fixtures.join(model))).unwrap();
            assert_eq!(template.reads_content_parts(), reads_parts, "{model}");
        }
    }

    #[test]
    fn model_folder_sources_in_transformers_order() {
        let config =
            json!({"chat_template": "config:{{ bos_token }}", "bos_token": {"content": "<s>"}})
                .to_string();
        let dir = folder(&[("tokenizer_config.json", config.clone())]);
        assert_eq!(
            render(&load_template(None, Some(&dir)).unwrap()),
            "config:<s>"
        );

        let named = json!({"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "default"}]});
        let dir = folder(&[("tokenizer_config.json", named.to_string())]);
        assert_eq!(render(&load_template(None, Some(&dir)).unwrap()), "default");

        let dir = folder(&[
            ("tokenizer_config.json", config.clone()),
            (
                "chat_template.json",
                json!({"chat_template": "json"}).to_string(),
            ),
        ]);
        assert_eq!(render(&load_template(None, Some(&dir)).unwrap()), "json");

        let dir = folder(&[
            ("tokenizer_config.json", config),
            (
                "chat_template.json",
                json!({"chat_template": "json"}).to_string(),
            ),
            ("chat_template.jinja", "jinja".to_string()),
        ]);
        assert_eq!(render(&load_template(None, Some(&dir)).unwrap()), "jinja");
    }

    #[test]
    fn explicit_spec_wins_and_keeps_the_folders_special_tokens() {
        let dir = folder(&[(
            "tokenizer_config.json",
            json!({"chat_template": "own", "eos_token": "<e>"}).to_string(),
        )]);
        let file = dir.join("custom.jinja");
        std::fs::write(&file, "custom{{ eos_token }}").unwrap();
        let spec = TemplateSpec::parse(file.to_str().unwrap());
        assert_eq!(
            render(&load_template(Some(&spec), Some(&dir)).unwrap()),
            "custom<e>"
        );
        let bundled = load_template(Some(&TemplateSpec::parse("chatml")), None).unwrap();
        assert_eq!(render(&bundled), "<|im_start|>user\nx<|im_end|>\n");
        assert!(load_template(Some(&TemplateSpec::parse("/no/such.jinja")), None).is_err());
        assert!(load_template(None, None).is_err());
        let empty = folder(&[]);
        assert!(matches!(
            load_template(None, Some(&empty)),
            Err(TemplateError::Load(_))
        ));
    }
}
