//! The streaming splitters on arbitrary text cut into arbitrary chunks: never panic, never lose
//! or reorder text when nothing is promoted, and reasoning splits the same streamed or whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rollout_proxy::reasoning::{Part, ReasoningStream, ReasoningSyntax, split};
use rollout_proxy::tools::registry::PARSERS;
use rollout_proxy::tools::streaming::{CallStream, Piece};
use rollout_proxy::tools::{DeclaredTools, Promoter};
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest).into_owned();
    let size = usize::from(cut % 7) + 1;
    let chars: Vec<char> = text.chars().collect();
    let chunks: Vec<String> = chars.chunks(size).map(|c| c.iter().collect()).collect();

    let tools = serde_json::json!([{"type": "function", "function": {"name": "search"}}]);
    let tools = DeclaredTools::new(serde_json::from_value(tools).unwrap())
        .unwrap()
        .map(Arc::new);
    let promoter = Promoter::new(tools.as_ref(), &["search".to_string()], cut % 2 == 0);
    for entry in PARSERS {
        let mut stream = CallStream::new(entry.build(), promoter.clone(), vec!["###".to_string()]);
        let mut pieces: Vec<Piece> = chunks.iter().flat_map(|c| stream.push(c)).collect();
        pieces.extend(stream.finish(None));
        let calls = pieces
            .iter()
            .filter(|p| matches!(p, Piece::Call(_)))
            .count();
        if calls == 0 {
            let streamed: String = pieces
                .iter()
                .map(|p| match p {
                    Piece::Text(t) => t.as_str(),
                    Piece::Call(_) => "",
                })
                .collect();
            assert_eq!(streamed, text, "{}", entry.name);
        }
    }

    for syntax in [
        ReasoningSyntax::Think { opened: false },
        ReasoningSyntax::Think { opened: true },
        ReasoningSyntax::Harmony,
    ] {
        let mut stream = ReasoningStream::new(syntax);
        let mut parts: Vec<Part> = chunks.iter().flat_map(|c| stream.push(c)).collect();
        parts.extend(stream.finish());
        let (mut reasoning, mut content) = (String::new(), String::new());
        for part in parts {
            match part {
                Part::Reasoning(t) => reasoning.push_str(&t),
                Part::Content(t) => content.push_str(&t),
            }
        }
        let (whole_reasoning, whole_content) = split(&text, syntax);
        assert_eq!(
            (reasoning, content),
            (whole_reasoning.unwrap_or_default(), whole_content),
            "{syntax:?}"
        );
    }
});
