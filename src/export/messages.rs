//! Which message each token of a node came from.
//!
//! A node keeps ids, not the messages they were rendered from, so the messages are read back
//! from the ids: chat templates open every message with a special token followed by the
//! role's name (`<|im_start|>user`, `<|start_header_id|>assistant`, `<start_of_turn>model`,
//! `<|start|>functions.NAME` in Harmony) or with a special token that names the role itself
//! (`<｜User｜>`, `[INST]`). A message runs from its opening token to the next one. Positions
//! the model sampled never open a message: they belong to the assistant message whose header
//! the prompt ended with. A user message that holds only a `<tool_response>` block (how
//! Hermes-style templates render tool results) counts as a tool message.

use crate::session::Node;
use crate::tokenizer::Tokenizer;
use serde::Serialize;

/// One message's tokens in a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MessageSpan {
    /// Position of its first token (the header's opening token).
    pub start: usize,
    /// One past its last token.
    pub end: usize,
    /// `system`, `user`, `assistant`, `tool`, or `text` for tokens before the first header
    /// (a BOS token, or a prompt sent as plain text).
    pub role: &'static str,
    /// The turn whose prompt or sample holds its first token.
    pub turn: usize,
}

/// Role names as templates write them after a header's opening token.
const ROLE_WORDS: &[(&str, &str)] = &[
    ("system", "system"),
    ("developer", "system"),
    ("user", "user"),
    ("human", "user"),
    ("assistant", "assistant"),
    ("model", "assistant"),
    ("tool", "tool"),
    ("ipython", "tool"),
    ("function", "tool"),
    ("functions", "tool"),
];

/// Special tokens that name the role themselves (Mistral's).
const ROLE_TOKENS: &[(&str, &str)] = &[
    ("[INST]", "user"),
    ("[/INST]", "assistant"),
    ("[SYSTEM_PROMPT]", "system"),
    ("[TOOL_RESULTS]", "tool"),
];

/// How many ids after an opening token are read for the role and the start of the content.
const LOOKAHEAD: usize = 8;

/// The messages of `node`, whose ids are `tokens`, in order and covering every position.
pub fn segment(node: &Node, tokens: &[u32], tokenizer: &Tokenizer) -> Vec<MessageSpan> {
    let mut sampled = node.sampled_spans().iter().peekable();
    let mut spans: Vec<MessageSpan> = Vec::new();
    let mut at = 0;
    while at < tokens.len() {
        // Skip sampled runs: they continue the message they are in.
        while let Some(span) = sampled.peek() {
            if (span.end as usize) <= at {
                sampled.next();
            } else {
                break;
            }
        }
        if let Some(span) = sampled.peek()
            && span.start as usize <= at
        {
            at = span.end as usize;
            continue;
        }
        if let Some(role) = opens_message(tokens, at, tokenizer) {
            if let Some(last) = spans.last_mut() {
                last.end = at;
            }
            spans.push(MessageSpan {
                start: at,
                end: tokens.len(),
                role,
                turn: turn_at(node, at),
            });
        }
        at += 1;
    }
    let first = spans.first().map_or(tokens.len(), |span| span.start);
    if first > 0 {
        let text = MessageSpan {
            start: 0,
            end: first,
            role: "text",
            turn: 0,
        };
        spans.insert(0, text);
    }
    spans
}

/// The role of the message opened at `at`, if a header starts there.
fn opens_message(tokens: &[u32], at: usize, tokenizer: &Tokenizer) -> Option<&'static str> {
    let text = tokenizer.special_token_text(tokens[at])?;
    if let Some((_, role)) = ROLE_TOKENS.iter().find(|(token, _)| *token == text) {
        return Some(role);
    }
    let named: String = text.chars().filter(|c| c.is_alphanumeric()).collect();
    if let Some(role) = role_named(&named.to_lowercase()) {
        return Some(role);
    }
    let after = &tokens[at + 1..(at + 1 + LOOKAHEAD).min(tokens.len())];
    let after = tokenizer.decode(after);
    let after = after.trim_start();
    let word_len = after
        .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .unwrap_or(after.len());
    let role = role_named(&after[..word_len].to_ascii_lowercase())?;
    let content = after[word_len..].split_once('\n').map_or("", |(_, c)| c);
    let tool_result = role == "user" && content.trim_start().starts_with("<tool_response>");
    Some(if tool_result { "tool" } else { role })
}

/// The text of `message` as its author wrote it, as well as the ids tell: special tokens and
/// the header's role name left out.
pub fn content(message: &MessageSpan, tokens: &[u32], tokenizer: &Tokenizer) -> String {
    let text = tokenizer.decode_visible(&tokens[message.start..message.end], &[]);
    let text = text.trim_start();
    let word_len = text
        .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .unwrap_or(text.len());
    let body = match role_named(&text[..word_len].to_ascii_lowercase()) {
        // The header's own line: `user`, `assistant`, `functions.lookup to=assistant`.
        Some(_) => text.split_once('\n').map_or("", |(_, rest)| rest),
        None => text,
    };
    body.trim().to_string()
}

/// The results in the content of a tool message: each `<tool_response>` block's text (Hermes-
/// style templates put consecutive results in one message), else the whole content.
pub fn tool_results(content: &str) -> Vec<&str> {
    let blocks: Vec<&str> = content
        .split("<tool_response>")
        .skip(1)
        .filter_map(|block| Some(block.split_once("</tool_response>")?.0.trim()))
        .collect();
    match blocks.is_empty() {
        true => vec![content],
        false => blocks,
    }
}

fn role_named(word: &str) -> Option<&'static str> {
    ROLE_WORDS
        .iter()
        .find(|(name, _)| *name == word)
        .map(|(_, role)| *role)
}

/// The index of the turn whose prompt or sample holds position `at`.
fn turn_at(node: &Node, at: usize) -> usize {
    node.turns
        .iter()
        .rposition(|turn| turn.prompt_start <= at)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::fixture_tokenizer;

    fn qwen3() -> Tokenizer {
        Tokenizer::from_tokenizer(fixture_tokenizer("qwen3"))
    }

    #[test]
    fn a_chatml_node_splits_into_its_messages_and_sampled_turns_stay_whole() {
        let tokenizer = qwen3();
        let prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
                      <|im_start|>assistant\n";
        // The sample writes what looks like a header: it is still the assistant's.
        let reply = "Hello <|im_start|>user<|im_end|>";
        let result = "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n\
                      <|im_start|>assistant\n";
        let mut node = Node::default();
        let ids = |text: &str| tokenizer.encode(text).unwrap();
        node.push_prompt(&ids(prompt));
        node.push_sampled(&ids(reply), &vec![-0.5; ids(reply).len()]);
        node.push_prompt(&ids(result));
        let tokens = node.tokens();
        let spans = segment(&node, &tokens, &tokenizer);
        let roles: Vec<_> = spans.iter().map(|s| s.role).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant"]);
        assert_eq!(spans[0].start, 0);
        assert_eq!(spans.last().unwrap().end, tokens.len());
        assert!(spans.windows(2).all(|w| w[0].end == w[1].start));
        let sampled = node.sampled_spans()[0];
        assert!(spans[2].start < sampled.start as usize && spans[2].end > sampled.end as usize);
        let text = |s: &MessageSpan| tokenizer.decode(&tokens[s.start..s.end]);
        assert_eq!(text(&spans[1]), "<|im_start|>user\nHi<|im_end|>\n");
        let contents: Vec<_> = spans
            .iter()
            .map(|s| content(s, &tokens, &tokenizer))
            .collect();
        assert_eq!(contents[..3], ["Be brief.", "Hi", "Hello user"]);
        assert_eq!(tool_results(&contents[3]), ["42"]);
        let two = "<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>";
        assert_eq!(tool_results(two), ["a", "b"]);
        assert_eq!(tool_results("plain"), ["plain"]);
    }

    #[test]
    fn plain_text_is_one_text_span_and_an_empty_node_has_none() {
        let tokenizer = qwen3();
        let mut node = Node::default();
        node.push_prompt(&tokenizer.encode("just text").unwrap());
        let tokens = node.tokens();
        let spans = segment(&node, &tokens, &tokenizer);
        assert_eq!(spans.len(), 1);
        assert_eq!((spans[0].role, spans[0].end), ("text", tokens.len()));
        assert!(segment(&Node::default(), &[], &tokenizer).is_empty());
    }
}
