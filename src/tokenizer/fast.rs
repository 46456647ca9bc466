//! A faster road through byte-level BPE tokenizers that split words with the GPT-4-style
//! pattern (Qwen2/Qwen3, Llama 3).
//!
//! The Hugging Face pipeline keeps an offset alignment per byte through normalization,
//! pre-tokenization and byte-level mapping, and runs the split pattern through a general regex
//! engine: for a turn's new text that was most of the proxy's work. ASCII text needs none of
//! it: it is in every Unicode normal form, its letter/digit/space classes are fixed, and the
//! pattern's alternatives reduce to a short scanner. The pieces then go to the tokenizer's own
//! BPE model, so merges and their cache are the library's.
//!
//! Text with other characters is cut where the pattern always splits: after a newline, or
//! before a space that follows a non-space, when an ASCII character other than a space comes
//! next (no alternative runs from a newline into such a character, none takes a space after
//! a non-space, and normalization cannot join across either cut). ASCII chunks take the fast
//! road, the others the library's. A tokenizer whose pipeline is anything else (another
//! pattern or normalizer, added tokens with strip or word options, BPE dropout) keeps the
//! library's road, and one is only given this road after both agree on a probe text. The ids
//! of pieces seen before are kept ([`WordCache`]), so the model is asked only about new ones;
//! so are those of short non-ASCII chunks, so the library sees each only once.

use super::byte_level::byte_char;
use super::word_cache::WordCache;
use tokenizers::Model;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;

/// The split pattern of Qwen2 and Qwen3 (one digit per piece).
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The split pattern of Llama 3 (up to three digits per piece).
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Text that exercises every alternative of the pattern and every added token; a tokenizer
/// takes the fast road only if it encodes this exactly as the library does.
const PROBE: &str = "Z\u{fc}rich: 9\u{b0}C \u{2014} na\u{ef}ve\ncaf\u{e9}\nx \u{65e5}\u{672c}\n\u{1f642} end\n\
    e\u{301}\nHello, world! It's 2024-05-01; we'LL see 1234567 items.\n\n  \tIndented\r\n\
    x  \n y   z\t\tend(arg='v') \"q\" ?!  \n\n\n  trailing   ";

/// Longest chunk with non-ASCII characters whose ids are kept (longer ones rarely recur).
const LONGEST_KEPT_CHUNK: usize = 64;

/// Encodes text for one tokenizer, the same ids as `encode_fast(text, false)`.
#[derive(Debug)]
pub(super) struct FastEncoder {
    /// Longest digit run in one piece.
    max_digits: usize,
    /// Added tokens, by first byte, longest first (all are ASCII).
    added_by_first_byte: Vec<Vec<(Box<[u8]>, u32)>>,
    /// Ids of pieces already run through the model.
    words: WordCache,
}

impl FastEncoder {
    /// The encoder for `tokenizer`, if its pipeline is one this handles exactly.
    pub fn for_tokenizer(tokenizer: &tokenizers::Tokenizer) -> Option<Self> {
        use tokenizers::normalizers::NormalizerWrapper as N;
        let max_digits = split_pattern_digits(tokenizer.get_pre_tokenizer()?)?;
        // BPE dropout samples the merges: a piece has no one tokenization to keep.
        if let tokenizers::models::ModelWrapper::BPE(bpe) = tokenizer.get_model()
            && bpe.dropout.is_some_and(|p| p > 0.0)
        {
            return None;
        }
        // Forms that leave ASCII as it is and cannot compose across an ASCII character.
        if !matches!(
            tokenizer.get_normalizer(),
            None | Some(N::NFC(_) | N::NFD(_) | N::NFKC(_) | N::NFKD(_))
        ) {
            return None;
        }
        let mut added_by_first_byte: Vec<Vec<(Box<[u8]>, u32)>> = vec![Vec::new(); 128];
        for (id, token) in tokenizer.get_added_tokens_decoder() {
            if token.single_word || token.lstrip || token.rstrip || token.normalized {
                return None;
            }
            let bytes = token.content.as_bytes();
            if !bytes.is_ascii() {
                return None;
            }
            if let Some(&first) = bytes.first() {
                added_by_first_byte[first as usize].push((Box::from(bytes), id));
            }
        }
        for candidates in &mut added_by_first_byte {
            candidates.sort_by_key(|(bytes, _)| std::cmp::Reverse(bytes.len()));
        }
        let encoder = Self {
            max_digits,
            added_by_first_byte,
            words: WordCache::default(),
        };
        let mut probe = PROBE.to_string();
        for candidates in &encoder.added_by_first_byte {
            for (bytes, _) in candidates {
                probe.push_str(std::str::from_utf8(bytes).ok()?);
                probe.push_str(" a1 ");
            }
        }
        let expected = tokenizer.encode_fast(probe.as_str(), false).ok()?;
        let mut ids = Vec::new();
        encoder.encode(tokenizer, &probe, &mut ids).ok()?;
        (ids == expected.get_ids()).then_some(encoder)
    }

    /// Appends the ids of `text` to `ids`.
    pub fn encode(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        text: &str,
        ids: &mut Vec<u32>,
    ) -> tokenizers::Result<()> {
        let bytes = text.as_bytes();
        let mut word = String::new();
        let mut start = 0;
        let mut at = 0;
        while at < bytes.len() {
            let Some((len, id)) = self.added_token_at(&bytes[at..]) else {
                at += 1;
                continue;
            };
            self.encode_between_added(tokenizer, &text[start..at], &mut word, ids)?;
            ids.push(id);
            at += len;
            start = at;
        }
        self.encode_between_added(tokenizer, &text[start..], &mut word, ids)
    }

    /// Text without added tokens: ASCII chunks here, the others through the library.
    fn encode_between_added(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        text: &str,
        word: &mut String,
        ids: &mut Vec<u32>,
    ) -> tokenizers::Result<()> {
        let model = tokenizer.get_model();
        if text.is_ascii() {
            return self.encode_words(model, text.as_bytes(), word, ids);
        }
        for chunk in split_chunks(text) {
            if chunk.is_ascii() {
                self.encode_words(model, chunk.as_bytes(), word, ids)?;
            } else {
                self.encode_other_chunk(tokenizer, chunk, ids)?;
            }
        }
        Ok(())
    }

    /// A chunk with other characters, through the library. Short ones are kept whole with
    /// their ids: a word such as `Zürich:` or `22°C` comes back turn after turn, and the
    /// library's road costs several times the fast one.
    fn encode_other_chunk(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        chunk: &str,
        ids: &mut Vec<u32>,
    ) -> tokenizers::Result<()> {
        if let Some(known) = self.words.known().get(chunk.as_bytes()) {
            ids.extend_from_slice(known);
            return Ok(());
        }
        let first = ids.len();
        ids.extend_from_slice(tokenizer.encode_fast(chunk, false)?.get_ids());
        if chunk.len() <= LONGEST_KEPT_CHUNK {
            let kept = (Box::from(chunk.as_bytes()), Box::from(&ids[first..]));
            self.words.remember(vec![kept]);
        }
        Ok(())
    }

    /// The longest added token that `rest` starts with.
    fn added_token_at(&self, rest: &[u8]) -> Option<(usize, u32)> {
        self.added_by_first_byte
            .get(rest[0] as usize)?
            .iter()
            .find(|(token, _)| rest.starts_with(token))
            .map(|(token, id)| (token.len(), *id))
    }

    /// Splits `text` (no added tokens in it) into pieces and runs each through the model.
    fn encode_words(
        &self,
        model: &impl Model,
        text: &[u8],
        word: &mut String,
        ids: &mut Vec<u32>,
    ) -> tokenizers::Result<()> {
        let known = self.words.known();
        let mut new = Vec::new();
        let mut start = 0;
        while start < text.len() {
            let end = piece_end(text, start, self.max_digits);
            let piece = &text[start..end];
            if let Some(piece_ids) = known.get(piece) {
                ids.extend_from_slice(piece_ids);
            } else {
                word.clear();
                word.extend(piece.iter().map(|&b| byte_char(b)));
                let first = ids.len();
                ids.extend(model.tokenize(word)?.iter().map(|token| token.id));
                new.push((Box::from(piece), Box::from(&ids[first..])));
            }
            start = end;
        }
        drop(known);
        if !new.is_empty() {
            self.words.remember(new);
        }
        Ok(())
    }
}

/// `text` cut where the pattern always splits and normalization cannot join: after a newline
/// or before a space that follows a non-space, when an ASCII character other than a space
/// comes next.
fn split_chunks(text: &str) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut start = 0;
    let cuts = (1..bytes.len().saturating_sub(1))
        .filter(|&i| match bytes[i] {
            b' ' => !is_space(bytes[i - 1]) && bytes[i + 1].is_ascii() && !is_space(bytes[i + 1]),
            _ => bytes[i - 1] == b'\n' && bytes[i].is_ascii() && !is_space(bytes[i]),
        })
        .chain([bytes.len()]);
    cuts.map(move |end| {
        let chunk = &text[start..end];
        start = end;
        chunk
    })
}

/// The longest digit run of a `Sequence[Split(pattern, Isolated), ByteLevel(no prefix space,
/// no regex)]` pre-tokenizer with a known pattern; `None` for any other pre-tokenizer.
fn split_pattern_digits(pre_tokenizer: &PreTokenizerWrapper) -> Option<usize> {
    let config = serde_json::to_value(pre_tokenizer).ok()?;
    let steps = config.get("pretokenizers")?.as_array()?;
    let [split, byte_level] = steps.as_slice() else {
        return None;
    };
    let byte_level_plain = byte_level["type"] == "ByteLevel"
        && byte_level["add_prefix_space"] == false
        && byte_level["use_regex"] == false;
    let split_isolated =
        split["type"] == "Split" && split["behavior"] == "Isolated" && split["invert"] == false;
    if !(byte_level_plain && split_isolated) {
        return None;
    }
    match split["pattern"]["Regex"].as_str()? {
        QWEN2_PATTERN => Some(1),
        LLAMA3_PATTERN => Some(3),
        _ => None,
    }
}

fn is_space(byte: u8) -> bool {
    matches!(byte, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ')
}

fn is_newline(byte: u8) -> bool {
    matches!(byte, b'\r' | b'\n')
}

/// Neither space, letter nor digit.
fn is_other(byte: u8) -> bool {
    !is_space(byte) && !byte.is_ascii_alphanumeric()
}

fn run_end(text: &[u8], from: usize, class: impl Fn(u8) -> bool) -> usize {
    text[from..]
        .iter()
        .position(|&b| !class(b))
        .map_or(text.len(), |n| from + n)
}

/// Where the pattern's match at `start` ends; its alternatives are tried in order, as the
/// regex engine does.
fn piece_end(text: &[u8], start: usize, max_digits: usize) -> usize {
    let at = |i: usize| text.get(i).copied();
    let first = text[start];
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if first == b'\'' {
        let lower = |i| at(i).map(|b: u8| b.to_ascii_lowercase());
        match (lower(start + 1), lower(start + 2)) {
            (Some(b's' | b't' | b'm' | b'd'), _) => return start + 2,
            (Some(b'r' | b'v'), Some(b'e')) | (Some(b'l'), Some(b'l')) => return start + 3,
            _ => {}
        }
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if first.is_ascii_alphabetic() {
        return run_end(text, start, |b| b.is_ascii_alphabetic());
    }
    if !is_newline(first)
        && !first.is_ascii_digit()
        && at(start + 1).is_some_and(|b| b.is_ascii_alphabetic())
    {
        return run_end(text, start + 1, |b| b.is_ascii_alphabetic());
    }
    // \p{N} or \p{N}{1,3}
    if first.is_ascii_digit() {
        return run_end(text, start, |b| b.is_ascii_digit()).min(start + max_digits);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let others = if first == b' ' { start + 1 } else { start };
    if at(others).is_some_and(is_other) {
        let end = run_end(text, others, is_other);
        return run_end(text, end, is_newline);
    }
    // Only a space run is left: `\s*[\r\n]+`, then `\s+(?!\S)`, then `\s+`.
    let spaces_end = run_end(text, start, is_space);
    if let Some(last_newline) = (start..spaces_end).rev().find(|&i| is_newline(text[i])) {
        return last_newline + 1;
    }
    if spaces_end < text.len() && spaces_end - start >= 2 {
        return spaces_end - 1;
    }
    spaces_end
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::fixture_tokenizer;

    /// Deterministic text from the pieces the pattern distinguishes; ASCII only for even seeds.
    fn random_text(seed: u64, len: usize) -> String {
        const PARTS: &[&str] = &[
            "a",
            "Z",
            "word",
            " the",
            "'s",
            "'T",
            "'re",
            "'LL",
            "'d",
            "'x",
            "7",
            "12345",
            " 9",
            " ",
            "  ",
            "\t",
            "\n",
            "\r\n",
            " \n ",
            "\n\n",
            ".",
            ",",
            "!?",
            " (",
            ")",
            "\"",
            "'",
            "{\"k\": 1}",
            "<",
            ">",
            "|",
            "_",
            "-",
            "\x0b",
            "\x0c",
            "\x01",
            "\x7f",
            "<|im_start|>",
            "<|im_end|>",
            "<tool_call>",
            "</tool_call>",
            "<think>",
            "<|eot_id|>",
            "<|start_header_id|>",
            "<|im_st",
            "\u{e9}",
            "e\u{301}",
            "Z\u{fc}rich",
            " S\u{e3}o",
            "\u{65e5}\u{672c}",
            "\u{1f642}",
            "\u{a0}",
            "\u{2028}",
            "\n\u{fc}",
            "\u{3000}x",
            "\u{301}",
            " \u{308}a",
            "\u{b0}C",
        ];
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut text = String::new();
        for _ in 0..len {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let part = PARTS[(state % PARTS.len() as u64) as usize];
            if seed % 2 == 1 || part.is_ascii() {
                text.push_str(part);
            }
        }
        text
    }

    #[test]
    fn matches_the_library_on_qwen3_and_llama3() {
        for model in ["qwen3", "llama3_1"] {
            let tokenizer = fixture_tokenizer(model);
            let encoder = FastEncoder::for_tokenizer(&tokenizer).expect("pattern recognised");
            for seed in 0..4000 {
                let text = random_text(seed, 1 + (seed as usize % 40));
                let expected = tokenizer.encode_fast(text.as_str(), false).unwrap();
                let mut ids = Vec::new();
                encoder.encode(&tokenizer, &text, &mut ids).unwrap();
                assert_eq!(ids, expected.get_ids(), "{model}, text {text:?}");
            }
        }
    }

    #[test]
    fn other_pipelines_keep_the_library_road() {
        for model in ["smollm2", "gemma3", "deepseek_v3"] {
            let tokenizer = fixture_tokenizer(model);
            assert!(FastEncoder::for_tokenizer(&tokenizer).is_none(), "{model}");
        }
        // Qwen3's pipeline with BPE dropout: its pieces have no one tokenization to keep.
        let mut tokenizer = fixture_tokenizer("qwen3");
        if let tokenizers::models::ModelWrapper::BPE(bpe) = tokenizer.get_model() {
            let mut bpe = bpe.clone();
            bpe.dropout = Some(0.1);
            tokenizer.with_model(bpe);
        }
        assert!(FastEncoder::for_tokenizer(&tokenizer).is_none());
    }

    #[test]
    fn known_pieces_skip_the_model() {
        let tokenizer = fixture_tokenizer("qwen3");
        let encoder = FastEncoder::for_tokenizer(&tokenizer).unwrap();
        let text = "<|im_start|>user\nWhat's the weather in Paris? 42<|im_end|>";
        let expected = tokenizer.encode_fast(text, false).unwrap();
        for _ in 0..2 {
            let mut ids = Vec::new();
            encoder.encode(&tokenizer, text, &mut ids).unwrap();
            assert_eq!(ids, expected.get_ids());
        }
        let known = encoder.words.known();
        let paris = tokenizer.encode_fast(" Paris", false).unwrap();
        assert_eq!(
            known.get(b" Paris".as_slice()).map(|ids| &ids[..]),
            Some(paris.get_ids())
        );
        assert!(
            known.contains_key(b"weather".as_slice()) || known.contains_key(b" weather".as_slice())
        );
        drop(known);

        // Chunks with other characters are kept whole, and give the library's ids again.
        let text =
            "Z\u{fc}rich: 9\u{b0}C and drizzle \u{2014} fine.\n\u{1f327}\u{fe0f} S\u{e3}o Paulo";
        let expected = tokenizer.encode_fast(text, false).unwrap();
        for _ in 0..2 {
            let mut ids = Vec::new();
            encoder.encode(&tokenizer, text, &mut ids).unwrap();
            assert_eq!(ids, expected.get_ids());
        }
        let zurich = tokenizer.encode_fast("Z\u{fc}rich:", false).unwrap();
        assert_eq!(
            encoder
                .words
                .known()
                .get("Z\u{fc}rich:".as_bytes())
                .map(|ids| &ids[..]),
            Some(zurich.get_ids())
        );
    }

    #[test]
    fn the_scanner_follows_the_alternatives_in_order() {
        fn pieces(text: &str, digits: usize) -> Vec<&str> {
            let mut out = Vec::new();
            let mut start = 0;
            while start < text.len() {
                let end = piece_end(text.as_bytes(), start, digits);
                out.push(&text[start..end]);
                start = end;
            }
            out
        }
        assert_eq!(
            pieces("it's 'sam 12345 a  b\n\n c  ", 1),
            [
                "it", "'s", " '", "sam", " ", "1", "2", "3", "4", "5", " a", " ", " b", "\n\n",
                " c", "  "
            ]
        );
        assert_eq!(pieces("x 12345;\n", 3), ["x", " ", "123", "45", ";\n"]);
    }
}
