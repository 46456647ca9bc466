//! Reasoning in a reply: the model's thinking is returned apart from its answer
//! (`reasoning_content`, streamed as `delta.reasoning_content`; Anthropic thinking blocks;
//! Responses reasoning items). The node keeps the raw tokens whatever is shown.
//!
//! Two syntaxes: `<think>…</think>` blocks ([`think`]), split when the session asks for it, and
//! gpt-oss's Harmony channels ([`harmony`]), always split, since channel markup is never text
//! for the user.

pub(crate) mod harmony;
mod think;

pub use think::{closed_by, opened_by};

/// How a reply marks its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningSyntax {
    /// A `<think>` block at the start of the reply; `opened`: the prompt already opened it
    /// (templates such as DeepSeek-R1's put `<think>` in the generation prompt).
    Think {
        /// The prompt ends inside an open block.
        opened: bool,
    },
    /// Harmony channels: `analysis` is reasoning; `final` and commentary without a recipient
    /// are content; a message to a tool stays markup, for the tool parser.
    Harmony,
}

impl ReasoningSyntax {
    /// Special tokens the reply's text must keep for the split to see its structure.
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            Self::Think { .. } => &[],
            Self::Harmony => harmony::MARKERS,
        }
    }
}

/// Which part of the reply a streamed piece belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Reasoning text.
    Reasoning(String),
    /// Everything else: the answer, and tool-call markup the tool parser reads.
    Content(String),
}

/// Splits a whole reply into its reasoning (if any) and the rest.
pub fn split(text: &str, syntax: ReasoningSyntax) -> (Option<String>, String) {
    match syntax {
        ReasoningSyntax::Think { opened } => think::split(text, opened),
        ReasoningSyntax::Harmony => {
            let mut stream = harmony::ChannelStream::default();
            let mut parts = stream.push(text);
            parts.extend(stream.finish());
            join(parts)
        }
    }
}

/// Parts joined into the reasoning (if any) and the rest.
fn join(parts: Vec<Part>) -> (Option<String>, String) {
    let (mut reasoning, mut content) = (None::<String>, String::new());
    for part in parts {
        match part {
            Part::Reasoning(text) => reasoning.get_or_insert_default().push_str(&text),
            Part::Content(text) => content.push_str(&text),
        }
    }
    (reasoning, content)
}

/// [`split`] for a stream: text is routed as soon as its part is known.
#[derive(Debug)]
pub enum ReasoningStream {
    /// `<think>` blocks.
    Think(think::ThinkStream),
    /// Harmony channels.
    Harmony(harmony::ChannelStream),
}

impl ReasoningStream {
    /// A splitter for a reply in `syntax`.
    pub fn new(syntax: ReasoningSyntax) -> Self {
        match syntax {
            ReasoningSyntax::Think { opened } => Self::Think(think::ThinkStream::new(opened)),
            ReasoningSyntax::Harmony => Self::Harmony(Default::default()),
        }
    }

    /// The parts that `text` (the next streamed piece) completes.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        match self {
            Self::Think(stream) => stream.push(text),
            Self::Harmony(stream) => stream.push(text),
        }
    }

    /// The end of the reply: whatever is still held.
    pub fn finish(&mut self) -> Vec<Part> {
        match self {
            Self::Think(stream) => stream.finish(),
            Self::Harmony(stream) => stream.finish(),
        }
    }

    /// Whether the reply has reasoning even where none of its text is (an empty `<think>`
    /// block): [`split`] reports it as empty reasoning rather than none.
    pub fn has_empty_block(&self) -> bool {
        match self {
            Self::Think(stream) => stream.has_block(),
            Self::Harmony(_) => false,
        }
    }
}

fn non_empty(part: Part) -> Vec<Part> {
    match &part {
        Part::Reasoning(t) | Part::Content(t) if t.is_empty() => Vec::new(),
        _ => vec![part],
    }
}

/// `text` streamed to a [`ReasoningStream`] in pieces of `size` characters, the parts joined.
#[cfg(test)]
fn streamed(syntax: ReasoningSyntax, text: &str, size: usize) -> (Option<String>, String) {
    let mut stream = ReasoningStream::new(syntax);
    let chars: Vec<char> = text.chars().collect();
    let mut parts: Vec<Part> = chars
        .chunks(size)
        .flat_map(|chunk| stream.push(&chunk.iter().collect::<String>()))
        .collect();
    parts.extend(stream.finish());
    let (mut reasoning, content) = join(parts);
    if stream.has_empty_block() {
        reasoning.get_or_insert_default();
    }
    (reasoning, content)
}
