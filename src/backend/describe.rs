//! What a server says about itself, asked instead of the user: the model it serves (the name
//! its requests must carry), its context window, and how it tokenizes a probe text — a server
//! whose tokenizer differs from the proxy's would sample from a prompt the trainer never sees,
//! so such a server is refused.

use super::BackendError;
use super::http::JsonClient;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::OnceCell;

/// A server's own account of itself; each field when it says.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ServerInfo {
    /// The model it serves, as requests must name it.
    pub model: Option<String>,
    /// Its context window in tokens (prompt and sample together).
    pub context_length: Option<u32>,
}

/// A text every backend tokenizes at start: chat-template markers, digits, whitespace runs,
/// punctuation, accents, CJK and an emoji, where tokenizers of one family still differ.
pub const PROBE_TEXT: &str = "<|im_start|>user\nHello, world! 12345 6789\n\n\tnaïve café — \
     東京 🙂 x=[1, 2]; <tool_call>\n{\"a\": 1}\n</tool_call><|im_end|>";

/// The probe and the ids the proxy's own tokenizer gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The ids the proxy writes for [`PROBE_TEXT`].
    pub expected: Vec<u32>,
    /// What the proxy's tokenizer is called in messages (its folder or file).
    pub tokenizer: String,
}

impl Probe {
    /// Why a server whose tokenizer gives `got` for the probe must not serve, if it must not.
    pub fn mismatch(&self, server: &str, got: &[u32]) -> Option<String> {
        if got == self.expected {
            return None;
        }
        let at = got
            .iter()
            .zip(&self.expected)
            .take_while(|(a, b)| a == b)
            .count();
        Some(format!(
            "the tokenizer of {server} differs from the proxy's ({}): the probe text gives \
             {} ids there and {} here, first differing at position {at} ({:?} there, {:?} here); \
             serve the same tokenizer on both sides",
            self.tokenizer,
            got.len(),
            self.expected.len(),
            got.get(at),
            self.expected.get(at),
        ))
    }
}

/// The model an OpenAI-style server's requests name: the one configured, else the one the
/// server says it serves (asked once it answers), else `fallback` (the proxy's own name).
#[derive(Debug)]
pub(super) struct ServedModel {
    given: Option<String>,
    fallback: String,
    asked: OnceCell<ServerInfo>,
}

impl ServedModel {
    pub fn new(given: Option<&str>, fallback: &str) -> Self {
        Self {
            given: given.map(str::to_string),
            fallback: fallback.to_string(),
            asked: OnceCell::new(),
        }
    }

    /// What `GET /v1/models` says about the model requests name (asked until it answers).
    pub async fn describe(
        &self,
        http: &JsonClient,
        root: &str,
    ) -> Result<ServerInfo, BackendError> {
        let asked = self
            .asked
            .get_or_try_init(|| async {
                let mut info = openai_models(http, root, self.given.as_deref()).await?;
                if let Some(given) = &self.given {
                    info.model = Some(given.clone());
                }
                Ok::<_, BackendError>(info)
            })
            .await?;
        Ok(asked.clone())
    }

    /// The name requests carry.
    pub async fn name(&self, http: &JsonClient, root: &str) -> String {
        if let Some(given) = &self.given {
            return given.clone();
        }
        match self.describe(http, root).await {
            Ok(ServerInfo {
                model: Some(model), ..
            }) => model,
            _ => self.fallback.clone(),
        }
    }
}

/// The base model and its context from an OpenAI-style `GET /v1/models` (vLLM: `id`,
/// `max_model_len`; LoRA adapters are listed too, with a `parent`). `wanted` picks an entry by
/// id; without it the first base model.
pub(super) async fn openai_models(
    http: &JsonClient,
    root: &str,
    wanted: Option<&str>,
) -> Result<ServerInfo, BackendError> {
    let reply = http.get_json(root, "/v1/models").await?;
    let models = reply["data"]
        .as_array()
        .ok_or_else(|| http.protocol("GET /v1/models has no data list"))?;
    let entry = match wanted {
        Some(id) => models.iter().find(|m| m["id"] == id),
        None => models
            .iter()
            .find(|m| m["parent"].is_null())
            .or(models.first()),
    };
    Ok(ServerInfo {
        model: entry.and_then(|m| m["id"].as_str()).map(str::to_string),
        context_length: entry.and_then(|m| context(&m["max_model_len"])),
    })
}

/// The ids `POST /tokenize` gives `text` (special-token text parsed, none added), as vLLM and
/// SGLang both serve it (`{"prompt", "add_special_tokens"}` → `{"tokens", "count", ...}`);
/// `model` names the served model where the server wants it.
pub(super) async fn tokenize(
    http: &JsonClient,
    root: &str,
    model: Option<&str>,
    text: &str,
) -> Result<Option<Vec<u32>>, BackendError> {
    let mut body = serde_json::json!({"prompt": text, "add_special_tokens": false});
    if let Some(model) = model {
        body["model"] = model.into();
    }
    let reply: Value = http.post(root, "/tokenize", &body, None).await?;
    token_ids(http, &reply, "tokens").map(Some)
}

/// A context length as servers write it (a positive integer), if it is one.
pub(super) fn context(value: &Value) -> Option<u32> {
    value
        .as_u64()
        .filter(|&n| n > 0)
        .and_then(|n| u32::try_from(n).ok())
}

/// Token ids a server's tokenize route returned under `key`, checked to be ids.
pub(super) fn token_ids(
    http: &JsonClient,
    reply: &Value,
    key: &str,
) -> Result<Vec<u32>, BackendError> {
    serde_json::from_value(reply[key].clone())
        .map_err(|e| http.protocol(format!("tokenize reply's {key}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mismatch_names_both_sides_and_where_they_part() {
        let probe = Probe {
            expected: vec![1, 2, 3],
            tokenizer: "fixtures/qwen3".into(),
        };
        assert_eq!(probe.mismatch("http://h:8000", &[1, 2, 3]), None);
        let message = probe.mismatch("http://h:8000", &[1, 9, 3, 4]).unwrap();
        assert!(message.contains("http://h:8000"), "{message}");
        assert!(message.contains("fixtures/qwen3"), "{message}");
        assert!(
            message.contains("position 1 (Some(9) there, Some(2) here)"),
            "{message}"
        );
    }

    #[test]
    fn only_positive_integers_are_context_lengths() {
        assert_eq!(context(&serde_json::json!(4096)), Some(4096));
        for bad in [
            serde_json::json!(0),
            serde_json::json!(-1),
            serde_json::json!("4096"),
            serde_json::json!(1e20),
        ] {
            assert_eq!(context(&bad), None, "{bad}");
        }
    }
}
