//! The token viewer: a page served by the proxy (`GET /ui`, its assets compiled into the
//! binary, [`assets`]) that shows what the model saw and sampled, and the data it draws
//! (`GET /{uuid}/view`, built here): each node's ids with their text, the logprob of each
//! sampled id, the turns, the messages the ids were rendered from, the tool calls the model
//! wrote (and whether healing was needed to read them), and where the session's rollouts
//! diverged.

pub(crate) mod assets;

use crate::export::messages::{self, MessageSpan};
use crate::session::divergences::DivergenceReport;
use crate::session::{Divergence, Node, Reward, Session, TurnRecord};
use crate::tokenizer::Tokenizer;
use crate::tools::ToolParser;
use serde::Serialize;

/// A session as the viewer shows it.
#[derive(Debug, Serialize)]
pub struct SessionView {
    /// The session's id.
    pub session: uuid::Uuid,
    /// When it was created (seconds since the epoch).
    pub created_at: f64,
    /// When it was last used.
    pub last_accessed: f64,
    /// The tool-call format its replies are read in.
    pub tool_parser: String,
    /// Its reward, when one was posted.
    pub reward: Option<Reward>,
    /// Its nodes.
    pub nodes: Vec<NodeView>,
    /// Why its later nodes split from earlier ones, newest last.
    pub divergences: Vec<DivergenceReport>,
}

/// One node, token by token.
#[derive(Debug, Serialize)]
pub struct NodeView {
    /// Its index in the session.
    pub index: usize,
    /// The node it branched from, when the session tracks a tree.
    pub parent: Option<usize>,
    /// Why it was started instead of extending an earlier node.
    pub divergence: Option<Divergence>,
    /// Its ids.
    pub tokens: Vec<u32>,
    /// Each id's text (see [`Tokenizer::pieces`]).
    pub pieces: Vec<String>,
    /// Each id's logprob where the model sampled it; `null` on prompt positions.
    pub logprobs: Vec<Option<f32>>,
    /// Positions holding special tokens (template markup such as `<|im_start|>`).
    pub special: Vec<usize>,
    /// The turns that made it.
    pub turns: Vec<TurnRecord>,
    /// The messages its ids were rendered from.
    pub messages: Vec<MessageSpan>,
    /// The tool calls the model wrote in its sampled turns.
    pub calls: Vec<CallSpan>,
    /// The images of its prompts, each with its run of placeholders (drawn as a thumbnail
    /// from `GET /{uuid}/blobs/{sha256}`).
    pub images: Vec<crate::generation::ImageSpan>,
}

/// A tool call the model wrote, as positions in its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CallSpan {
    /// First position of its markup.
    pub start: usize,
    /// One past its last position.
    pub end: usize,
    /// The turn that sampled it.
    pub turn: usize,
    /// The function called.
    pub name: String,
    /// Only healing reads it: its closing markup never came, or it is written in another
    /// format than the session's.
    pub healed: bool,
    /// The format it is written in, when not the session's.
    pub healed_from: Option<&'static str>,
}

/// The view of `session` whose nodes and divergence reports are given (read under its lock).
pub fn session_view(
    session: &Session,
    nodes: &[Node],
    divergences: Vec<DivergenceReport>,
    tokenizer: &Tokenizer,
) -> SessionView {
    let parser = session.options.tool_parser.parser();
    SessionView {
        session: session.id,
        created_at: session.created_at,
        last_accessed: session.last_accessed(),
        tool_parser: session.options.tool_parser.name().to_string(),
        reward: session.reward(),
        nodes: nodes
            .iter()
            .enumerate()
            .map(|(index, node)| node_view(index, node, tokenizer, parser.as_ref()))
            .collect(),
        divergences,
    }
}

fn node_view(
    index: usize,
    node: &Node,
    tokenizer: &Tokenizer,
    parser: &dyn ToolParser,
) -> NodeView {
    let tokens = node.tokens();
    let pieces = tokenizer.pieces(&tokens);
    let mut logprobs = Vec::with_capacity(tokens.len());
    for (range, sampled) in node.runs() {
        match sampled {
            Some(sampled) => logprobs.extend(sampled.iter().map(|&lp| Some(lp))),
            None => logprobs.extend(std::iter::repeat_n(None, range.len())),
        }
    }
    let special = (0..tokens.len())
        .filter(|&at| tokenizer.is_special(tokens[at]))
        .collect();
    let shown = tokenizer.special_ids(parser.markers());
    let visible = |at: usize| !tokenizer.is_special(tokens[at]) || shown.contains(&tokens[at]);
    let calls = node
        .turns
        .iter()
        .enumerate()
        .flat_map(|(turn, record)| {
            let sampled =
                record.completion_start..record.completion_start + record.completion_tokens;
            calls_in(sampled, &pieces, &visible, parser)
                .into_iter()
                .map(move |call| CallSpan { turn, ..call })
        })
        .collect();
    NodeView {
        index,
        parent: node.parent,
        divergence: node.divergence.clone(),
        messages: messages::segment(node, &tokens, tokenizer),
        tokens,
        pieces,
        logprobs,
        special,
        turns: node.turns.clone(),
        calls,
        images: node.images().to_vec(),
    }
}

/// The calls `parser` finds in the visible text of the positions `sampled`, as positions.
fn calls_in(
    sampled: std::ops::Range<usize>,
    pieces: &[String],
    visible: &dyn Fn(usize) -> bool,
    parser: &dyn ToolParser,
) -> Vec<CallSpan> {
    // Where each position's text starts in the turn's visible text (hidden ones add nothing).
    let mut text = String::new();
    let mut starts = Vec::with_capacity(sampled.len());
    for at in sampled.clone() {
        starts.push(text.len());
        if visible(at) {
            text.push_str(pieces.get(at).map_or("", String::as_str));
        }
    }
    let strict = parser.find_calls(&text, false);
    let position = |byte: usize| sampled.start + starts.partition_point(|&start| start < byte);
    crate::tools::calls_in_any_format(parser, &text, true)
        .into_iter()
        .map(|(call, healed_from)| CallSpan {
            // The position whose text holds the call's first byte.
            start: position(call.span.start + 1)
                .saturating_sub(1)
                .max(sampled.start),
            end: position(call.span.end),
            turn: 0,
            healed: healed_from.is_some() || !strict.iter().any(|found| found.span == call.span),
            healed_from,
            name: call.name,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::SessionOptions;
    use crate::tokenizer::fixture_tokenizer;

    #[test]
    fn a_sampled_call_is_located_and_an_unclosed_one_is_healed() {
        let tokenizer = Tokenizer::from_tokenizer(fixture_tokenizer("qwen3"));
        let ids = |text: &str| tokenizer.encode(text).unwrap();
        let mut node = Node::default();
        node.push_prompt(&ids(
            "<|im_start|>user\nGo<|im_end|>\n<|im_start|>assistant\n",
        ));
        let call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
        let sample = ids(&format!("Sure.{call}<|im_end|>"));
        let span = node.push_sampled(&sample, &vec![-0.25; sample.len()]);
        node.turns.push(turn_record(0, span));
        node.push_prompt(&ids("\n<|im_start|>assistant\n"));
        let unclosed = ids("<tool_call>\n{\"name\": \"g\", \"arguments\": {}}");
        let span = node.push_sampled(&unclosed, &vec![-1.0; unclosed.len()]);
        node.turns.push(turn_record(span.start as usize, span));
        node.push_prompt(&ids("<|im_end|>\n<|im_start|>assistant\n"));
        let foreign = ids("<function=h><parameter=x>1</parameter></function><|im_end|>");
        let span = node.push_sampled(&foreign, &vec![-0.5; foreign.len()]);
        node.turns.push(turn_record(span.start as usize, span));
        let session = crate::session::SessionStore::default()
            .create(SessionOptions::default())
            .unwrap();
        let view = session_view(&session, &[node], Vec::new(), &tokenizer);
        let node = &view.nodes[0];
        assert_eq!(node.pieces.concat(), tokenizer.decode(&node.tokens));
        let calls = &node.calls;
        assert_eq!(calls.len(), 3, "{calls:?}");
        assert_eq!(
            (
                calls[2].name.as_str(),
                calls[2].healed,
                calls[2].healed_from
            ),
            ("h", true, Some("qwen3_coder"))
        );
        assert_eq!(calls[1].healed_from, None);
        let text = |c: &CallSpan| node.pieces[c.start..c.end].concat();
        assert_eq!((text(&calls[0]).as_str(), calls[0].healed), (call, false));
        assert_eq!(
            (calls[1].name.as_str(), calls[1].healed, calls[1].turn),
            ("g", true, 1)
        );
        assert!(text(&calls[1]).starts_with("<tool_call>"));
        assert_eq!(
            node.logprobs.iter().flatten().count(),
            sample.len() + unclosed.len() + foreign.len()
        );
        assert_eq!(
            node.tokens[node.special[0]],
            tokenizer.token_id("<|im_start|>").unwrap()
        );
        let roles: Vec<_> = node.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, ["user", "assistant", "assistant", "assistant"]);
    }

    fn turn_record(prompt_start: usize, span: crate::session::Span) -> TurnRecord {
        TurnRecord {
            prompt_start,
            completion_start: span.start as usize,
            completion_tokens: (span.end - span.start) as usize,
            finish_reason: "stop",
            stop: None,
            weight_version: None,
            weight_versions: Vec::new(),
            adapter: None,
            backend: "http://b".into(),
            cached_tokens: None,
            approximate: false,
            nudge: None,
            api: crate::session::Api::ChatCompletions,
            tools_left_out: Vec::new(),
            healed_calls: Vec::new(),
            echoed_calls: Vec::new(),
        }
    }
}
