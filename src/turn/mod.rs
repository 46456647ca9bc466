//! One turn of a rollout, whichever API it came in by: the request's messages → a prompt that
//! extends the session's node → the backend samples → the reply is shaped → the node records
//! what was sampled.
//!
//! Each API's adapter (in `http/`) parses its wire request into a [`ChatRequest`] (or a
//! [`TextRequest`]), asks the [`Pipeline`] for the turn, and writes the turn's output in its
//! wire format: [`Pipeline::run`] returns a [`TurnOutput`], [`Pipeline::stream`] a
//! [`TurnStream`] of [`TurnEvent`]s, [`Pipeline::render`] the prompt a real call would send.
//! The adapters never touch the backends, the tool parsers or the node. The order of a turn
//! is written once, in [`driver`], for both reply modes:
//!
//! 1. [`plan`] ([`Planner::prepare`]): render and tokenize the conversation into prompt ids that extend a node
//!    (pure: it reads the session, writes nothing);
//! 2. the gate ([`gate`]) lets the turn through to the backend pool, which samples, on the
//!    session's backend when it can: whole for a whole reply, streamed for a streamed one;
//! 3. a [`ChoiceStream`] per choice turns the sampled ids into visible text, reasoning and
//!    tool calls ([`reply`]), fed token by token or in one piece;
//! 4. [`commit`]: the turn becomes a [`crate::session::CommitRecord`] (the prompt, the
//!    sampled ids, the fingerprints ([`matching`]) by which the next turn recognises the reply),
//!    kept by the session's log when there is one, then applied to the node.
//!
//! A turn holds its session's lock from planning to commit, so turns on one session never
//! interleave, and a turn that fails (or whose client hangs up) changes nothing. A retry of a
//! keyed turn that was already recorded replays the record in place of step 2 and skips
//! step 4 ([`replay`]). The nudge ([`nudge`]) is a second run of the sequence under the same
//! lock.

mod choice_stream;
mod commit;
mod driver;
mod events;
pub(crate) mod gate;
mod images;
mod matching;
mod nudge;
mod pipeline;
pub(crate) mod plan;
mod planned;
mod render;
mod replay;
pub mod reply;
mod request;
pub(crate) mod segments;
mod stream;
mod tail;
mod template_history;
mod text_prompt;

pub use choice_stream::{ChoiceStream, Delta};
pub use events::{SampledTokens, TurnEvent, TurnStream};
pub use pipeline::{Pipeline, RenderedTurn};
pub use plan::TailRender;
pub use planned::{Base, Plan, Planner, RenderedPrompt};
pub use render::GenerationPrompts;
pub use reply::{CallIds, Finish, Reply, ReplyPart, ReturnedCall};
pub use request::{TextRequest, TurnRequest};
pub use text_prompt::{TextPrompt, prepare_text};

use crate::backend::BackendError;
use crate::chat::ChatRequest;
use crate::generation::{Generation, SamplingParams};
use crate::reasoning::ReasoningSyntax;
use crate::template::{ChatTemplate, TemplateError};
use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::tools::ToolFormat;
use segments::Placeholders;
use std::sync::Arc;

/// Why a turn failed. Nothing was recorded.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    /// The chat template failed.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The tokenizer failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// No backend sampled the turn.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The session was deleted, expired or exported while the turn waited for it.
    #[error("the session was removed (deleted, expired or exported) while this turn waited for it")]
    SessionClosed,
    /// The proxy is paused in `reject` mode (`POST /pause`).
    #[error("the proxy is paused{}; retry after it resumes", reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default())]
    Paused {
        /// Why, as the operator said.
        reason: Option<String>,
    },
    /// The session's turn was aborted (`POST /{uuid}/abort`); nothing was recorded.
    #[error("the turn was aborted (POST /{{uuid}}/abort); nothing was recorded")]
    Aborted,
    /// What the request requires of the reply cannot be enforced.
    #[error(transparent)]
    Constraint(#[from] crate::grammar::GrammarError),
    /// The conversation's images cannot be placed in the prompt ([`images`]).
    #[error("{0}")]
    Images(String),
    /// An image the conversation names by URL could not be fetched ([`crate::fetch`]).
    #[error("the image at {url} could not be fetched: {error}")]
    Fetch {
        /// The URL (its start, when long).
        url: String,
        /// Why.
        error: crate::fetch::FetchError,
    },
    /// A text completion's prompt is empty.
    #[error("'prompt' must not be empty")]
    EmptyPrompt,
    /// The turn could not be kept (journal or store); nothing was recorded.
    #[error("the turn could not be kept: {0}")]
    Journal(String),
    /// A prompt sent as ids holds one the model does not have.
    #[error("'prompt' holds token id {id}, outside the vocabulary (ids are below {vocab_size})")]
    UnknownToken {
        /// The id.
        id: u32,
        /// The vocabulary's size.
        vocab_size: usize,
    },
    /// The prompt leaves no room under the session's token limit.
    #[error(
        "the session's node would grow past its limit of {limit} tokens (--max-session-tokens): \
         the prompt alone holds {prompt}"
    )]
    SessionFull {
        /// Prompt tokens.
        prompt: usize,
        /// The limit.
        limit: usize,
    },
    /// The prompt leaves no room in the model's context.
    #[error(
        "the prompt ({prompt} tokens) fills the model's context ({context} tokens); a longer \
         one needs a larger context (--engine-context for the in-process engine, \
         --context-length for a server's)"
    )]
    PromptTooLong {
        /// Prompt tokens.
        prompt: usize,
        /// The context window.
        context: usize,
    },
}

impl TurnError {
    /// A short name of the cause, for metrics.
    pub fn cause(&self) -> &'static str {
        match self {
            Self::Template(_) => "template",
            Self::Tokenizer(_) => "tokenizer",
            Self::Backend(_) => "backend",
            Self::SessionClosed => "session_closed",
            Self::Paused { .. } => "paused",
            Self::Aborted => "aborted",
            Self::EmptyPrompt | Self::UnknownToken { .. } => "bad_prompt",
            Self::Constraint(_) => "constraint",
            Self::Images(_) => "images",
            Self::Fetch { .. } => "image_fetch",
            Self::Journal(_) => "journal",
            Self::SessionFull { .. } => "session_full",
            Self::PromptTooLong { .. } => "prompt_too_long",
        }
    }
}

/// The model-side pieces every turn needs.
#[derive(Debug, Clone)]
pub struct TurnContext {
    /// The model's chat template.
    pub template: Arc<ChatTemplate>,
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Stand-ins for sampled turns while rendering.
    pub placeholders: Placeholders,
    /// Learnt generation prompts, so a turn renders its conversation once.
    pub generation_prompts: Arc<GenerationPrompts>,
    /// The vocabulary is Harmony's (gpt-oss): prompts are encoded with message content apart
    /// from markup, replies are split by channel, calls are read as Harmony writes them.
    pub harmony: bool,
    /// The tool-call format of a session created without one: Harmony's on a Harmony
    /// vocabulary, else the one the template writes ([`crate::tools::detect`]), else the
    /// registry's default.
    pub default_tool_format: ToolFormat,
    /// What the template writes between a think block and a call, which a forced call's
    /// grammar allows ([`crate::tools::detect::think_separator`]).
    pub think_separator: Option<String>,
    /// Whether turns may render only the end of their conversation ([`tail`]): undecided
    /// until whoever builds the context decides (the server turns it on when the template's
    /// text after a sampled turn proved the same on `check-template`'s shapes at start-up,
    /// off with `--full-render`). Turned off for good when a check against a full render
    /// disagrees.
    tail_renders: Arc<std::sync::atomic::AtomicU8>,
    /// How the model takes images, when it does ([`crate::vision`]): a conversation with an
    /// image is refused for a model without.
    pub vision: Option<crate::vision::VisionModel>,
}

/// [`TurnContext::tail_renders`]'s states.
const TAIL_UNDECIDED: u8 = 0;
const TAIL_ON: u8 = 1;
const TAIL_OFF: u8 = 2;

impl TurnContext {
    /// The pieces for a model with this template and tokenizer.
    pub fn new(template: Arc<ChatTemplate>, tokenizer: Arc<Tokenizer>) -> Self {
        let harmony = crate::tokenizer::harmony::speaks(&tokenizer);
        let written = match harmony {
            true => Ok(Some("harmony")),
            false => crate::tools::detect::written_format(&template),
        };
        let default_tool_format = match written {
            Ok(Some(name)) => ToolFormat::named(name).unwrap_or_default(),
            Ok(None) => ToolFormat::default(),
            Err(error) => {
                tracing::warn!(%error, "the chat template cannot render a tool call");
                ToolFormat::default()
            }
        };
        tracing::info!(
            tool_parser = default_tool_format.name(),
            "default tool-call format"
        );
        let think_separator = crate::tools::detect::think_separator(&template);
        Self {
            harmony,
            default_tool_format,
            think_separator,
            template,
            tokenizer,
            placeholders: Placeholders::new(),
            generation_prompts: Default::default(),
            tail_renders: Arc::new(TAIL_UNDECIDED.into()),
            vision: None,
        }
    }

    /// The same pieces for a model that takes images as `vision` says.
    pub fn with_vision(self, vision: Option<crate::vision::VisionModel>) -> Self {
        Self { vision, ..self }
    }

    /// Whether turns may render only the end of their conversation.
    pub fn tail_renders(&self) -> bool {
        self.tail_renders.load(std::sync::atomic::Ordering::Relaxed) == TAIL_ON
    }

    /// Whether tail-only renders are off for good (so turns need not remember what their
    /// conversation was for a later one): `false` while undecided.
    pub fn tail_renders_ruled_out(&self) -> bool {
        self.tail_renders.load(std::sync::atomic::Ordering::Relaxed) == TAIL_OFF
    }

    /// Allows or stops tail-only renders.
    pub fn set_tail_renders(&self, on: bool) {
        let state = if on { TAIL_ON } else { TAIL_OFF };
        self.tail_renders
            .store(state, std::sync::atomic::Ordering::Relaxed);
    }

    /// The ids of rendered prompt text (or a piece of it that starts at a message boundary).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        match self.harmony {
            true => crate::tokenizer::harmony::encode(&self.tokenizer, text),
            false => self.tokenizer.encode(text),
        }
    }

    /// `request`'s sampling parameters for a session whose tool-call format is `format`, with
    /// the constraint its `tool_choice` or `response_format` asks for, after `prompt`.
    pub fn sampling(
        &self,
        request: &ChatRequest,
        format: &str,
        prompt: &[u32],
    ) -> Result<SamplingParams, TurnError> {
        Ok(SamplingParams {
            constraint: crate::grammar::for_request(
                request,
                format,
                self.reasoning_at(prompt),
                self.think_separator.as_deref(),
            )?,
            ..request.params.clone()
        })
    }

    /// Whether a reply after `prompt` may open a `<think>` block, must close one the prompt
    /// opened, or has none (the model has no such block, or the prompt closed it).
    fn reasoning_at(&self, prompt: &[u32]) -> crate::grammar::Reasoning {
        use crate::grammar::Reasoning;
        if self.tokenizer.token_id("<think>").is_none() {
            return Reasoning::None;
        }
        let tail = self
            .tokenizer
            .decode(&prompt[prompt.len().saturating_sub(4)..]);
        if crate::reasoning::opened_by(&tail) {
            Reasoning::Open
        } else if crate::reasoning::closed_by(&tail) {
            Reasoning::None
        } else {
            Reasoning::MayOpen
        }
    }

    /// How the reply after `prompt` marks its reasoning, when it is returned apart: Harmony's
    /// channels always; a `<think>` block when the session asks for it (`reasoning`).
    pub fn reasoning_syntax(&self, reasoning: bool, prompt: &[u32]) -> Option<ReasoningSyntax> {
        if self.harmony {
            return Some(ReasoningSyntax::Harmony);
        }
        reasoning.then(|| {
            let tail = &prompt[prompt.len().saturating_sub(4)..];
            ReasoningSyntax::Think {
                opened: crate::reasoning::opened_by(&self.tokenizer.decode(tail)),
            }
        })
    }
}

/// One sampled choice of a finished turn.
#[derive(Debug, Clone)]
pub struct ChoiceOutput {
    /// What the client is shown.
    pub reply: Reply,
    /// The sample exactly as the backend produced it (ids, logprobs, stop, cached tokens).
    pub generation: Generation,
    /// The backend that sampled it.
    pub backend: Arc<str>,
}

/// A finished, recorded turn.
#[derive(Debug)]
pub struct TurnOutput {
    plan: Plan,
    /// One per choice asked for, in order.
    pub choices: Vec<ChoiceOutput>,
}

impl TurnOutput {
    /// The ids of the prompt that was sent.
    pub fn prompt_ids(&self) -> &[u32] {
        &self.plan.prompt_ids
    }

    /// Token counts of the turn.
    pub fn usage(&self) -> Usage {
        Usage::of(&self.plan, &self.choices)
    }
}

/// Token counts of a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Length of the prompt sent.
    pub prompt_tokens: usize,
    /// Sampled tokens of every choice together.
    pub completion_tokens: usize,
    /// Prompt tokens the backend served from its prefix cache, when it says.
    pub cached_tokens: Option<u32>,
}

impl Usage {
    fn of(plan: &Plan, choices: &[ChoiceOutput]) -> Self {
        Self {
            prompt_tokens: plan.prompt_ids.len(),
            completion_tokens: choices.iter().map(|c| c.generation.token_ids.len()).sum(),
            cached_tokens: choices.first().and_then(|c| c.generation.cached_tokens),
        }
    }
}
