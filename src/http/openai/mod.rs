//! OpenAI's wire formats: chat completions ([`chat`], streamed in [`chat_stream`]) and text
//! completions ([`completions`]), the chat body read in [`request`]. What they share lives here: the reply envelope and
//! per-token logprobs.

pub(crate) mod chat;
mod chat_stream;
pub(crate) mod completions;
pub mod request;

use crate::generation::Generation;
use crate::tokenizer::Tokenizer;
use crate::turn::{self, ReturnedCall, SampledTokens};
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

/// Sampled ids with their logprobs (and alternatives), of a whole sample or of a streamed
/// piece of one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SampledView<'a> {
    pub token_ids: &'a [u32],
    pub logprobs: &'a [f32],
    pub top_logprobs: Option<&'a [Vec<(u32, f32)>]>,
}

impl<'a> From<&'a Generation> for SampledView<'a> {
    fn from(generation: &'a Generation) -> Self {
        Self {
            token_ids: &generation.token_ids,
            logprobs: &generation.logprobs,
            top_logprobs: generation.top_logprobs.as_deref(),
        }
    }
}

impl<'a> From<&'a SampledTokens> for SampledView<'a> {
    fn from(tokens: &'a SampledTokens) -> Self {
        Self {
            token_ids: &tokens.token_ids,
            logprobs: &tokens.logprobs,
            top_logprobs: tokens.top_logprobs.as_deref(),
        }
    }
}

/// OpenAI chat `logprobs`: `{"content": [...]}`, one entry per sampled token. Serialised
/// straight from the ids: a reply carries one entry per token, which as JSON values cost a map
/// and a number per byte of each token.
#[derive(Debug)]
pub(crate) struct ChatLogprobs<'a> {
    tokenizer: &'a Tokenizer,
    sampled: SampledView<'a>,
}

/// The `logprobs` of a chat choice (or of a streamed chunk).
pub(crate) fn chat_logprobs<'a>(
    tokenizer: &'a Tokenizer,
    sampled: impl Into<SampledView<'a>>,
) -> ChatLogprobs<'a> {
    ChatLogprobs {
        tokenizer,
        sampled: sampled.into(),
    }
}

impl Serialize for ChatLogprobs<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let sampled = self.sampled;
        let entries = sampled
            .token_ids
            .iter()
            .zip(sampled.logprobs)
            .enumerate()
            .map(|(i, (&id, &logprob))| {
                let alternatives = sampled
                    .top_logprobs
                    .and_then(|t| t.get(i))
                    .map_or(&[][..], Vec::as_slice);
                TokenLogprob {
                    tokenizer: self.tokenizer,
                    id,
                    logprob,
                    alternatives: Some(alternatives),
                }
            });
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry("content", &SerializeIter::new(entries))?;
        map.end()
    }
}

/// One `logprobs.content` entry: `token`, `logprob`, `bytes`, and `top_logprobs` (absent in
/// the entries of `top_logprobs` themselves).
struct TokenLogprob<'a> {
    tokenizer: &'a Tokenizer,
    id: u32,
    logprob: f32,
    alternatives: Option<&'a [(u32, f32)]>,
}

impl Serialize for TokenLogprob<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let token = self.tokenizer.decode(&[self.id]);
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("token", &token)?;
        // As f64, the form replies have always had (the float widened, not re-rounded).
        map.serialize_entry("logprob", &f64::from(self.logprob))?;
        map.serialize_entry("bytes", &SerializeIter::new(token.bytes()))?;
        if let Some(alternatives) = self.alternatives {
            let entries = alternatives.iter().map(|&(id, logprob)| TokenLogprob {
                tokenizer: self.tokenizer,
                id,
                logprob,
                alternatives: None,
            });
            map.serialize_entry("top_logprobs", &SerializeIter::new(entries))?;
        }
        map.end()
    }
}

/// An iterator serialised as a JSON array (once).
struct SerializeIter<I>(std::cell::Cell<Option<I>>);

impl<I> SerializeIter<I> {
    fn new(items: I) -> Self {
        Self(std::cell::Cell::new(Some(items)))
    }
}

impl<I: Iterator> Serialize for SerializeIter<I>
where
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0.take() {
            Some(items) => serializer.collect_seq(items),
            None => serializer.collect_seq(std::iter::empty::<I::Item>()),
        }
    }
}

/// The reply around `choices`: id, object, created, model and usage.
#[derive(Debug, Serialize)]
pub(crate) struct Envelope<'a, C> {
    id: String,
    object: &'a str,
    created: u64,
    model: &'a str,
    choices: Vec<C>,
    usage: Usage,
}

/// Token counts of a reply.
#[derive(Debug, Serialize)]
pub(crate) struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
}

/// The reply around `choices`, with a fresh id `{id_prefix}-…`.
pub(crate) fn envelope<'a, C>(
    object: &'a str,
    id_prefix: &str,
    model: &'a str,
    choices: Vec<C>,
    usage: &turn::Usage,
) -> Envelope<'a, C> {
    Envelope {
        id: format!("{id_prefix}-{}", uuid::Uuid::new_v4().simple()),
        object,
        created: crate::session::now_seconds() as u64,
        model,
        choices,
        usage: Usage::from(usage),
    }
}

impl From<&turn::Usage> for Usage {
    fn from(usage: &turn::Usage) -> Self {
        Self {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            total_tokens: usage.prompt_tokens + usage.completion_tokens,
        }
    }
}

/// A returned tool call, OpenAI-shaped.
#[derive(Debug, Serialize)]
pub(crate) struct ToolCallOut<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionOut<'a>,
}

#[derive(Debug, Serialize)]
pub(crate) struct FunctionOut<'a> {
    name: &'a str,
    arguments: &'a str,
}

impl<'a> ToolCallOut<'a> {
    /// The wire form of a returned call.
    pub fn of(call: &'a ReturnedCall) -> Self {
        ToolCallOut {
            id: &call.id,
            kind: "function",
            function: FunctionOut {
                name: &call.name,
                arguments: &call.arguments,
            },
        }
    }
}
