//! What a client is shown for one sampled choice, in no API's vocabulary: the visible text,
//! the reasoning, the tool calls promoted from it, and why it ended. Each API's adapter writes
//! a [`Reply`] in its own wire format.

use crate::generation::{FinishReason, Generation, StopMatch};
use crate::reasoning::ReasoningSyntax;
use crate::tokenizer::Tokenizer;
use crate::tools::{CallOutcomes, ToolParser};

/// Why a reply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The model ended its turn (an end token, a stop token or a stop string).
    Stop,
    /// The token limit (or the context) ran out.
    Length,
    /// The model ended its turn with tool calls.
    ToolCalls,
    /// The backend aborted the request.
    Abort,
}

impl Finish {
    /// The one rule: a sample that stopped after promoted calls finished with tool calls; a
    /// sample cut by the length limit is never reported as a finished call.
    pub fn of(reason: FinishReason, has_calls: bool) -> Self {
        match reason {
            FinishReason::Stop if has_calls => Self::ToolCalls,
            FinishReason::Stop => Self::Stop,
            FinishReason::Length => Self::Length,
            FinishReason::Abort => Self::Abort,
        }
    }

    /// OpenAI's `finish_reason`.
    pub fn as_openai(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::ToolCalls => "tool_calls",
            Self::Abort => "abort",
        }
    }
}

/// A tool call returned to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReturnedCall {
    /// The id the session issued (`call_3`); a later request names the call by it.
    pub id: String,
    /// The function called.
    pub name: String,
    /// The arguments as JSON text, as the model wrote them (or as healing built them).
    pub arguments: String,
    /// The byte offset in the reply's content at which the call stood (the content before it
    /// came before the call).
    pub offset: usize,
    /// The format it was written in when not the session's (cross-format healing).
    pub healed_from: Option<&'static str>,
}

/// What the client is shown for one sampled choice.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// The text outside reasoning and calls (empty when there is none); `None` when the reply
    /// has calls and nothing but whitespace is left.
    pub content: Option<String>,
    /// The reasoning block, when the session returns reasoning separately.
    pub reasoning: Option<String>,
    /// The calls promoted from the text, in order.
    pub tool_calls: Vec<ReturnedCall>,
    /// Why it ended.
    pub finish: Finish,
    /// The visible text before tool parsing (what a client may send back as content).
    pub text: String,
    /// The special token the sample ended on (the template writes it after the content).
    pub end_token_text: Option<String>,
    /// How the call markup in the text fared (promoted, healed, left as text).
    pub tool_outcomes: CallOutcomes,
}

/// A piece of a reply's content, in document order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReplyPart<'a> {
    /// Text between calls (never only whitespace).
    Text(&'a str),
    /// A call.
    Call(&'a ReturnedCall),
}

impl Reply {
    /// The content and calls in the order the model wrote them, whitespace-only text between
    /// them left out: APIs that return a reply as blocks (Anthropic's, Responses' items)
    /// refuse empty text blocks when they are sent back.
    pub fn parts<'a>(&'a self) -> Vec<ReplyPart<'a>> {
        let content = self.content.as_deref().unwrap_or("");
        let mut parts = Vec::with_capacity(1 + 2 * self.tool_calls.len());
        let text = |from: usize, to: usize, parts: &mut Vec<ReplyPart<'a>>| {
            let piece = content.get(from..to).unwrap_or("");
            if !piece.trim().is_empty() {
                parts.push(ReplyPart::Text(piece));
            }
        };
        let mut start = 0;
        for call in &self.tool_calls {
            let at = call.offset.clamp(start, content.len());
            text(start, at, &mut parts);
            start = at;
            parts.push(ReplyPart::Call(call));
        }
        text(start, content.len(), &mut parts);
        parts
    }
}

/// Cuts `text` before a matched stop string: the ids include it, the text the client sees
/// ends before it.
pub fn cut_at_stop(text: &mut String, stop: Option<&StopMatch>) {
    if let Some(StopMatch::Text(stop)) = stop
        && let Some(at) = text.rfind(stop.as_str())
    {
        text.truncate(at);
    }
}

/// The special token `generation` ended on, if it ended on one.
pub fn end_token_text(tokenizer: &Tokenizer, generation: &Generation) -> Option<String> {
    match (generation.finish_reason, generation.token_ids.last()) {
        (FinishReason::Stop, Some(&last)) => tokenizer.special_token_text(last).map(str::to_string),
        _ => None,
    }
}

/// The special tokens a reply's text keeps: the tool format's markers and those the reasoning
/// split reads.
pub fn shown_markers(
    tokenizer: &Tokenizer,
    parser: &dyn ToolParser,
    reasoning: Option<ReasoningSyntax>,
) -> Vec<u32> {
    let mut shown = tokenizer.special_ids(parser.markers());
    if let Some(syntax) = reasoning {
        shown.extend(tokenizer.special_ids(syntax.markers()));
    }
    shown
}

/// Tool-call ids numbered across the session (continuing from the calls it already returned),
/// so an id names one call of the conversation when it comes back.
#[derive(Debug, Clone, Copy)]
pub struct CallIds {
    next: usize,
    prefix: &'static str,
}

impl CallIds {
    /// Ids `{prefix}{n}` for a turn of a session that has returned `issued` calls.
    pub fn after(issued: usize, prefix: &'static str) -> Self {
        Self {
            next: issued,
            prefix,
        }
    }

    /// The next id.
    pub fn issue(&mut self) -> String {
        self.next += 1;
        format!("{}{}", self.prefix, self.next - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_length_cut_is_never_a_finished_call() {
        assert_eq!(Finish::of(FinishReason::Stop, true), Finish::ToolCalls);
        assert_eq!(Finish::of(FinishReason::Length, true), Finish::Length);
        assert_eq!(Finish::of(FinishReason::Stop, false).as_openai(), "stop");
    }

    #[test]
    fn the_text_ends_before_a_matched_stop_string() {
        let mut text = "a ### b ### c".to_string();
        cut_at_stop(&mut text, Some(&StopMatch::Text("###".into())));
        assert_eq!(text, "a ### b ");
        cut_at_stop(&mut text, Some(&StopMatch::Token(3)));
        assert_eq!(text, "a ### b ");
    }

    #[test]
    fn call_ids_continue_across_turns_with_the_api_prefix() {
        let mut ids = CallIds::after(2, "toolu_");
        assert_eq!(ids.issue(), "toolu_2");
        assert_eq!(ids.issue(), "toolu_3");
    }
}
