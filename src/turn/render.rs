//! Rendering a turn's conversation. A turn needs two texts: the prompt (with the generation
//! prompt) and the history (without it), which the next turn checks its render against. The
//! second is almost always the first minus the template's generation prompt, so that suffix is
//! learnt from the first turn that renders both ways and later turns render once.

use crate::chat::ChatRequest;
use crate::template::{ChatTemplate, RenderRequest, TemplateError, TemplateValue};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Distinct `chat_template_kwargs` whose generation prompt is remembered; more are rendered
/// twice rather than grow the map without bound.
const MAX_REMEMBERED: usize = 256;

/// The generation prompt a template appends, per `chat_template_kwargs` (it may depend on them,
/// e.g. Qwen3's `enable_thinking`).
#[derive(Debug, Default)]
pub struct GenerationPrompts(RwLock<HashMap<String, Arc<str>>>);

impl GenerationPrompts {
    fn get(&self, key: &str) -> Option<Arc<str>> {
        self.0.read().ok()?.get(key).cloned()
    }

    fn learn(&self, key: String, generation_prompt: &str) {
        if let Ok(mut known) = self.0.write()
            && known.len() < MAX_REMEMBERED
        {
            known.insert(key, Arc::from(generation_prompt));
        }
    }
}

/// Where the history text is.
#[derive(Debug, Clone)]
pub enum History {
    /// The prompt without its last `usize` bytes (the generation prompt).
    PromptWithout(usize),
    /// The template rendered it differently, or its generation prompt was not known yet.
    Separate(String),
}

/// A turn's rendered conversation.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub prompt: String,
    pub history: History,
}

/// Renders `messages` (already in template form) for `request`; `known` holds the generation
/// prompts learnt so far.
///
/// A remembered generation prompt is trusted only when the prompt ends with it. Should a
/// template ever render history differently in a way this misses, the recorded check simply
/// fails on the next turn and a new node starts; the prompt sent is always the real render.
pub fn render_turn(
    template: &ChatTemplate,
    known: &GenerationPrompts,
    messages: &TemplateValue,
    request: &ChatRequest,
) -> Result<Rendered, TemplateError> {
    let render = |add_generation_prompt| {
        template.render(RenderRequest {
            messages,
            tools: request.tools.as_ref().map(|tools| tools.json()),
            add_generation_prompt,
            kwargs: Some(&request.template_kwargs),
        })
    };
    let prompt = render(request.add_generation_prompt)?;
    if !request.add_generation_prompt {
        return Ok(Rendered {
            prompt,
            history: History::PromptWithout(0),
        });
    }
    let key = serde_json::to_string(&request.template_kwargs).unwrap_or_default();
    if let Some(generation_prompt) = known.get(&key)
        && prompt.ends_with(&*generation_prompt)
    {
        return Ok(Rendered {
            prompt,
            history: History::PromptWithout(generation_prompt.len()),
        });
    }
    let history = render(false)?;
    if let Some(generation_prompt) = prompt.strip_prefix(history.as_str()) {
        known.learn(key, generation_prompt);
    }
    Ok(Rendered {
        prompt,
        history: History::Separate(history),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `<B>` is the generation prompt after one message, `<A>` after more.
    const TEMPLATE: &str = "{% for m in messages %}[{{ m.content }}]{% endfor %}\
        {% if add_generation_prompt %}{% if messages|length > 1 %}<A>{% else %}<B>{% endif %}{% endif %}";

    fn request(contents: &[&str]) -> (TemplateValue, ChatRequest) {
        let messages: Vec<_> = contents
            .iter()
            .map(|c| json!({"role": "user", "content": c}))
            .collect();
        let body: crate::http::openai::request::ChatCompletionBody =
            serde_json::from_value(json!({"messages": messages})).unwrap();
        let request = body.validate(None).unwrap().turn;
        let values = request.messages.iter().map(|m| m.to_template_value(false));
        (TemplateValue::from(values.collect::<Vec<_>>()), request)
    }

    fn history_text(rendered: &Rendered) -> &str {
        match &rendered.history {
            History::PromptWithout(n) => &rendered.prompt[..rendered.prompt.len() - n],
            History::Separate(text) => text,
        }
    }

    #[test]
    fn renders_once_when_the_generation_prompt_is_known() {
        let template = ChatTemplate::new("t", TEMPLATE.into(), Default::default()).unwrap();
        let known = GenerationPrompts::default();
        let (messages, first) = request(&["x"]);
        let rendered = render_turn(&template, &known, &messages, &first).unwrap();
        assert!(matches!(rendered.history, History::Separate(_)));
        assert_eq!(
            (rendered.prompt.as_str(), history_text(&rendered)),
            ("[x]<B>", "[x]")
        );

        let (messages, again) = request(&["y"]);
        let rendered = render_turn(&template, &known, &messages, &again).unwrap();
        assert!(matches!(rendered.history, History::PromptWithout(3)));
        assert_eq!(history_text(&rendered), "[y]");

        // A different generation prompt is not mistaken for the learnt one.
        let (messages, longer) = request(&["x", "y"]);
        let rendered = render_turn(&template, &known, &messages, &longer).unwrap();
        assert!(matches!(rendered.history, History::Separate(_)));
        assert_eq!(
            (rendered.prompt.as_str(), history_text(&rendered)),
            ("[x][y]<A>", "[x][y]")
        );
    }
}
