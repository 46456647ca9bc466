//! The prompt of a text completion (`/v1/completions`): text or ids the client wrote itself.
//!
//! Like ManagedServer's `completion`, the prompt extends the longest node whose ids (for an id
//! prompt) or text (for a text prompt) it starts with: the node's ids are reused and only the
//! rest of the prompt is tokenized.

use super::segments::generation_check;
use super::{Base, Plan, TurnContext, TurnError};
use crate::session::SessionState;
use std::sync::Arc;

/// A completion prompt as text or as token ids.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(untagged)]
pub enum TextPrompt {
    /// Text, tokenized by the proxy.
    Text(String),
    /// Token ids, sent as they are.
    Ids(Vec<u32>),
}

/// Extends the longest node the prompt starts with; otherwise the prompt starts a new node.
pub fn prepare_text(
    ctx: &TurnContext,
    session: &SessionState,
    prompt: &TextPrompt,
) -> Result<Plan, TurnError> {
    let tokenizer = &ctx.tokenizer;
    if let TextPrompt::Ids(ids) = prompt
        && let Some(&id) = ids
            .iter()
            .find(|&&id| id as usize >= tokenizer.vocab_size())
    {
        return Err(TurnError::UnknownToken {
            id,
            vocab_size: tokenizer.vocab_size(),
        });
    }
    let mut best: Option<(usize, Vec<u32>)> = None;
    for (index, node) in session.nodes.iter().enumerate() {
        if best
            .as_ref()
            .is_some_and(|(b, _)| session.nodes[*b].len() >= node.len())
        {
            continue;
        }
        let node_ids = node.tokens();
        let rest = match prompt {
            TextPrompt::Ids(ids) => ids.strip_prefix(node_ids.as_slice()).map(<[u32]>::to_vec),
            TextPrompt::Text(text) => {
                match text.strip_prefix(tokenizer.decode(&node_ids).as_str()) {
                    Some(rest) => Some(ctx.encode_prompt(rest)?),
                    None => None,
                }
            }
        };
        if let Some(rest) = rest {
            best = Some((index, rest));
        }
    }
    let (base, base_len, prompt_ids, history) = match best {
        Some((node, rest)) => {
            let base_node = &session.nodes[node];
            let mut ids = base_node.tokens();
            ids.extend(rest);
            (
                Base::Extend { node },
                base_node.len(),
                ids,
                base_node.history.clone(),
            )
        }
        None => {
            let ids = match prompt {
                TextPrompt::Ids(ids) => ids.clone(),
                TextPrompt::Text(text) => ctx.encode_prompt(text)?,
            };
            (Base::New { divergence: None }, 0, ids, Vec::new())
        }
    };
    if prompt_ids.is_empty() {
        return Err(TurnError::EmptyPrompt);
    }
    Ok(Plan {
        prompt_ids: Arc::new(prompt_ids),
        base,
        base_len,
        history,
        // A raw-text prompt has no chat structure to check on a later chat turn.
        next_check: generation_check("", ""),
        rendered: None,
        conversation: None,
        echoed_calls: Vec::new(),
        tail_render_disagreed: false,
        images: Default::default(),
    })
}
