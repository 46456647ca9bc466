//! Tool calls in a token stream: text is passed on as soon as it cannot be the start of a
//! call's markup (or of a stop string); markup is held until its call is complete, then
//! emitted as one call, in document order with the text around it.

use super::{CallOutcomes, ParsedCall, ParsedOutput, Promoter, ToolParser};
use std::sync::Arc;

/// Most bytes of unclosed markup held back before it is let through as text.
const HOLD_LIMIT: usize = 64 * 1024;

/// A piece of streamed output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text to show.
    Text(String),
    /// A complete call.
    Call(ParsedCall),
}

/// Splits streamed text into [`Piece`]s.
#[derive(Debug)]
pub struct CallStream {
    /// `None` when calls are not parsed (no callable tools, or `tool_choice: none`).
    parser: Option<Arc<dyn ToolParser>>,
    promoter: Promoter,
    stops: Vec<String>,
    buffer: String,
    outcomes: CallOutcomes,
}

impl CallStream {
    /// Parses calls with `parser` when the promoter can promote any.
    pub fn new(parser: Arc<dyn ToolParser>, promoter: Promoter, stops: Vec<String>) -> Self {
        Self {
            parser: promoter.is_active().then_some(parser),
            promoter,
            stops,
            buffer: String::new(),
            outcomes: CallOutcomes::default(),
        }
    }

    /// Adds streamed text; returns what can be emitted now.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buffer.push_str(text);
        let mut pieces = Vec::new();
        loop {
            let markup = self.parser.as_ref().and_then(|p| {
                let at = self.signals().filter_map(|s| self.buffer.find(s)).min()?;
                Some((p.clone(), at))
            });
            let Some((parser, at)) = markup else {
                // No markup: keep back only what could still become markup or a stop string.
                let keep = self.possible_prefix_len();
                let emit: String = self.buffer.drain(..self.buffer.len() - keep).collect();
                push_text(&mut pieces, emit);
                return pieces;
            };
            let before: String = self.buffer.drain(..at).collect();
            push_text(&mut pieces, before);
            let end = match self.block_len(parser.as_ref()) {
                Some(end) => end,
                // Markup that never closes is not held forever.
                None if self.buffer.len() > HOLD_LIMIT => self.buffer.len(),
                None => return pieces,
            };
            let block: String = self.buffer.drain(..end).collect();
            let parsed = parser.parse(&block, &self.promoter);
            self.outcomes += parsed.outcomes;
            in_order(parsed, &mut pieces);
        }
    }

    /// Adds text that is only read when the stream ends ([`CallStream::finish`]): a whole
    /// reply, parsed once.
    pub fn hold(&mut self, text: &str) {
        self.buffer.push_str(text);
    }

    /// The texts that open a call: the session format's and, with healing on, every other
    /// tagged format's (cross-format healing).
    fn signals(&self) -> impl Iterator<Item = &'static str> + '_ {
        let parser = self.parser.as_deref();
        let own = parser.into_iter().flat_map(|p| p.signals().iter().copied());
        let foreign = parser
            .filter(|_| self.promoter.heals())
            .into_iter()
            .flat_map(|p| super::foreign::signals(p.name()));
        own.chain(foreign)
    }

    /// The length of the first call in the buffer (which starts with a signal) once its markup
    /// is complete.
    fn block_len(&self, parser: &dyn ToolParser) -> Option<usize> {
        match parser.signals().iter().any(|s| self.buffer.starts_with(s)) {
            true => parser.block_len(&self.buffer),
            false => super::foreign::block_len(parser.name(), &self.buffer),
        }
    }

    /// How the call markup streamed so far fared.
    pub fn outcomes(&self) -> CallOutcomes {
        self.outcomes
    }

    /// Ends the stream: the text before a matched stop string; a call whose markup never
    /// closed is healed when it can be (else it is text).
    pub fn finish(&mut self, stop: Option<&str>) -> Vec<Piece> {
        let mut rest = std::mem::take(&mut self.buffer);
        if let Some(at) = stop.and_then(|s| rest.rfind(s)) {
            rest.truncate(at);
        }
        let mut pieces = Vec::new();
        match &self.parser {
            Some(parser) => {
                let parsed = parser.parse(&rest, &self.promoter);
                self.outcomes += parsed.outcomes;
                in_order(parsed, &mut pieces);
            }
            None => push_text(&mut pieces, rest),
        }
        pieces
    }

    /// Length of the tail of the buffer that cannot be emitted yet: from a complete stop string
    /// on (the backend ends the sample there), or the longest suffix that is a proper prefix of
    /// the call markup or of a stop string.
    fn possible_prefix_len(&self) -> usize {
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.buffer.find(s.as_str()))
            .min()
        {
            return self.buffer.len() - at;
        }
        let stops = self.stops.iter().map(String::as_str);
        self.signals()
            .map(|signal| signal as &str)
            .chain(stops)
            .map(|signal| {
                (1..signal.len().min(self.buffer.len() + 1))
                    .rev()
                    .find(|&n| signal.is_char_boundary(n) && self.buffer.ends_with(&signal[..n]))
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0)
    }
}

/// `parsed`'s text and calls as pieces, in the order the model wrote them.
fn in_order(parsed: ParsedOutput, pieces: &mut Vec<Piece>) {
    let content = parsed.content.unwrap_or_default();
    let mut at = 0;
    for (call, offset) in parsed.calls.into_iter().zip(parsed.call_offsets) {
        let mut offset = offset.clamp(at, content.len());
        while !content.is_char_boundary(offset) {
            offset -= 1;
        }
        push_text(pieces, content[at..offset].to_string());
        pieces.push(Piece::Call(call));
        at = offset;
    }
    push_text(pieces, content[at..].to_string());
}

fn push_text(pieces: &mut Vec<Piece>, text: String) {
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::HermesParser;

    fn promoter(heal: bool) -> Promoter {
        let tools = serde_json::json!([{"type": "function", "function": {"name": "search"}}]);
        Promoter::new(
            Some(&crate::tools::test_support::declared(tools)),
            &["search".to_string()],
            heal,
        )
    }

    fn stream(stops: &[&str]) -> CallStream {
        CallStream::new(
            Arc::new(HermesParser),
            promoter(false),
            stops.iter().map(|s| s.to_string()).collect(),
        )
    }

    fn text(s: &str) -> Piece {
        Piece::Text(s.into())
    }

    #[test]
    fn text_flows_and_markup_is_held_until_closed() {
        let mut s = stream(&[]);
        assert_eq!(s.push("Use the <d"), vec![text("Use the <d")]);
        assert_eq!(s.push("iv> tag <"), vec![text("iv> tag ")]);
        assert_eq!(s.push("tool"), vec![]);
        assert_eq!(
            s.push("_call>{\"name\": \"search\", \"arguments\": {\"q\": 1}}"),
            vec![]
        );
        let out = s.push("</tool_call> done");
        assert_eq!(out.len(), 2);
        assert!(
            matches!(&out[0], Piece::Call(c) if c.name == "search" && c.arguments == "{\"q\": 1}")
        );
        assert_eq!(out[1], text(" done"));
        assert_eq!(s.finish(None), vec![]);
    }

    #[test]
    fn a_held_reply_is_read_once_with_its_text_and_calls_in_order() {
        let mut s = stream(&[]);
        s.hold("Sure. <tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call> Then");
        s.hold(" more.");
        let out = s.finish(None);
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!(out[0], text("Sure. "));
        assert!(matches!(&out[1], Piece::Call(c) if c.name == "search"));
        assert_eq!(out[2], text(" Then more."));
        assert_eq!(s.outcomes().promoted, 1);
    }

    #[test]
    fn undeclared_calls_and_unclosed_markup_stay_text() {
        let mut s = stream(&[]);
        let block = "<tool_call>{\"name\": \"other\", \"arguments\": {}}</tool_call>";
        assert_eq!(s.push(block), vec![text(block)]);
        assert_eq!(s.push("<tool_call>{\"name\": \"sea"), vec![]);
        assert_eq!(s.finish(None), vec![text("<tool_call>{\"name\": \"sea")]);
    }

    #[test]
    fn stop_strings_are_held_and_cut() {
        let mut s = stream(&["###"]);
        assert_eq!(s.push("answer #"), vec![text("answer ")]);
        assert_eq!(s.push("#"), vec![]);
        assert_eq!(s.push("#"), vec![]);
        assert_eq!(s.finish(Some("###")), vec![]);
        let mut s = stream(&["###"]);
        assert_eq!(s.push("a # b"), vec![text("a # b")]);
    }

    #[test]
    fn an_unclosed_call_is_healed_at_the_end() {
        let mut s = CallStream::new(Arc::new(HermesParser), promoter(true), Vec::new());
        assert_eq!(
            s.push("ok <tool_call>{\"name\": \"search\", \"arguments\": {}}"),
            vec![text("ok ")]
        );
        let out = s.finish(None);
        assert!(
            matches!(&out[..], [Piece::Call(c)] if c.name == "search"),
            "{out:?}"
        );
    }

    #[test]
    fn markup_that_never_closes_is_released_past_the_hold_limit() {
        let mut s = stream(&[]);
        assert_eq!(s.push("<tool_call> is the marker"), vec![]);
        let filler = "x".repeat(HOLD_LIMIT);
        let out = s.push(&filler);
        assert_eq!(out.len(), 1);
        assert!(
            matches!(&out[0], Piece::Text(t) if t.starts_with("<tool_call> is the marker") && t.len() > HOLD_LIMIT)
        );
    }

    #[test]
    fn no_callable_tools_means_plain_text() {
        let mut s = CallStream::new(Arc::new(HermesParser), Promoter::default(), Vec::new());
        let raw = "<tool_call>{\"name\": \"search\"}</tool_call>";
        assert_eq!(s.push(raw), vec![text(raw)]);
    }
}
