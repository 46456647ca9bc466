//! Text ↔ token ids with a model's Hugging Face `tokenizer.json`, or with a GGUF model's own
//! vocabulary when the model runs in-process.
//!
//! Rendered prompts contain special tokens as text (`<|im_start|>`); they are encoded as the
//! special tokens themselves and no BOS/EOS is added, exactly like
//! `tokenizer.encode(text, add_special_tokens=False)` in transformers.

mod byte_level;
mod fast;
#[cfg(feature = "engine")]
mod gguf;
pub mod harmony;
mod word_cache;

#[cfg(feature = "engine")]
pub use gguf::GgufVocab;

use byte_level::ByteLevelDecoder;
use fast::FastEncoder;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Errors from loading a tokenizer or encoding text.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The tokenizer cannot be loaded.
    #[error("cannot load tokenizer from {path}: {reason}")]
    Load {
        /// The file or folder.
        path: PathBuf,
        /// Why it cannot be loaded.
        reason: String,
    },
    /// Text could not be encoded.
    #[error("tokenization failed: {0}")]
    Encode(String),
}

/// A loaded tokenizer. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Tokenizer {
    vocab: Vocab,
    /// Special tokens by id (the Hugging Face library rebuilds its map on every query).
    special: std::collections::HashMap<u32, String>,
    /// The fast road, when the tokenizer's pipeline is one it handles.
    fast: Option<FastEncoder>,
    /// Otherwise, the same `tokenizer.json` without its normalizer when that is a Unicode
    /// normal form: ASCII text is already in every normal form, and normalizing with offset
    /// tracking is about half the cost of encoding it.
    without_normalizer: Option<Box<tokenizers::Tokenizer>>,
    /// Token bytes by id, for a byte-level vocabulary; built beside start-up (the library
    /// decodes until it is there).
    byte_level: Arc<OnceLock<ByteLevelDecoder>>,
    /// The same `tokenizer.json` reading special-token text as plain text, made on first use
    /// (formats that encode message content apart from their markup, as Harmony does).
    ordinary: OnceLock<Box<tokenizers::Tokenizer>>,
}

/// Where the vocabulary comes from.
enum Vocab {
    /// A Hugging Face `tokenizer.json`.
    HuggingFace(Arc<tokenizers::Tokenizer>),
    /// A GGUF model's own vocabulary, through llama.cpp.
    #[cfg(feature = "engine")]
    Gguf(GgufVocab),
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.vocab {
            Vocab::HuggingFace(_) => "tokenizer.json",
            #[cfg(feature = "engine")]
            Vocab::Gguf(_) => "gguf",
        };
        f.debug_struct("Tokenizer")
            .field("kind", &kind)
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` from a file, or from a model folder that holds one.
    pub fn from_path(path: &Path) -> Result<Self, TokenizerError> {
        let file = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        };
        let inner = tokenizers::Tokenizer::from_file(&file).map_err(|e| TokenizerError::Load {
            path: file.clone(),
            reason: e.to_string(),
        })?;
        Ok(Self::from_tokenizer(inner))
    }

    /// Wraps an already built tokenizer.
    pub fn from_tokenizer(inner: tokenizers::Tokenizer) -> Self {
        use tokenizers::normalizers::NormalizerWrapper as N;
        let special = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, token)| (id, token.content))
            .collect();
        let fast = FastEncoder::for_tokenizer(&inner);
        let without_normalizer = match inner.get_normalizer() {
            Some(N::NFC(_) | N::NFD(_) | N::NFKC(_) | N::NFKD(_)) if fast.is_none() => {
                let mut plain = inner.clone();
                let removed = plain.with_normalizer(None::<N>).is_ok();
                removed.then(|| Box::new(plain))
            }
            _ => None,
        };
        let inner = Arc::new(inner);
        let byte_level = Arc::new(OnceLock::new());
        // Reading the whole vocabulary through the library takes tens of milliseconds.
        let (vocabulary, table) = (inner.clone(), byte_level.clone());
        std::thread::spawn(move || {
            if let Some(decoder) = ByteLevelDecoder::for_tokenizer(&vocabulary) {
                let _ = table.set(decoder);
            }
        });
        Self {
            vocab: Vocab::HuggingFace(inner),
            special,
            without_normalizer,
            fast,
            byte_level,
            ordinary: OnceLock::new(),
        }
    }

    /// A GGUF model's vocabulary; its control tokens are the special tokens.
    #[cfg(feature = "engine")]
    pub fn from_gguf(vocab: GgufVocab) -> Self {
        Self {
            special: vocab.control_tokens(),
            vocab: Vocab::Gguf(vocab),
            without_normalizer: None,
            fast: None,
            byte_level: Default::default(),
            ordinary: OnceLock::new(),
        }
    }

    /// Token ids of `text`, special-token text included as special tokens, nothing added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        let error = |e: tokenizers::Error| TokenizerError::Encode(e.to_string());
        match (&self.vocab, &self.fast) {
            (Vocab::HuggingFace(inner), Some(fast)) => {
                let mut ids = Vec::with_capacity(text.len() / 3);
                fast.encode(inner, text, &mut ids).map_err(error)?;
                Ok(ids)
            }
            (Vocab::HuggingFace(inner), None) => self
                .without_normalizer
                .as_deref()
                .filter(|_| text.is_ascii())
                .unwrap_or(inner)
                .encode_fast(text, false)
                .map(|encoding| encoding.get_ids().to_vec())
                .map_err(error),
            #[cfg(feature = "engine")]
            (Vocab::Gguf(vocab), _) => Ok(vocab.encode(text)),
        }
    }

    /// Token ids of `text` with special-token text read as plain text (`<|end|>` written in a
    /// message is the characters, not the token), nothing added.
    pub fn encode_ordinary(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let error = |e: tokenizers::Error| TokenizerError::Encode(e.to_string());
        match &self.vocab {
            Vocab::HuggingFace(inner) => {
                let plain = self.ordinary.get_or_init(|| {
                    let mut plain = (**inner).clone();
                    plain.set_encode_special_tokens(true);
                    Box::new(plain)
                });
                plain
                    .encode_fast(text, false)
                    .map(|encoding| encoding.get_ids().to_vec())
                    .map_err(error)
            }
            #[cfg(feature = "engine")]
            Vocab::Gguf(vocab) => Ok(vocab.encode_ordinary(text)),
        }
    }

    /// Number of token ids, added tokens included: every valid id is below it.
    pub fn vocab_size(&self) -> usize {
        match &self.vocab {
            Vocab::HuggingFace(inner) => inner.get_vocab_size(true),
            #[cfg(feature = "engine")]
            Vocab::Gguf(vocab) => vocab.vocab_size(),
        }
    }

    /// The text of `ids`, special tokens kept.
    pub fn decode(&self, ids: &[u32]) -> String {
        if let Some(table) = self.byte_level.get() {
            return table.decode(ids.iter().copied());
        }
        match &self.vocab {
            Vocab::HuggingFace(inner) => inner.decode(ids, false).unwrap_or_default(),
            #[cfg(feature = "engine")]
            Vocab::Gguf(vocab) => String::from_utf8_lossy(&vocab.decode_bytes(ids)).into_owned(),
        }
    }

    /// The text of `ids` as a reply shows it: special tokens (EOS, `<|im_end|>`) left out,
    /// except those in `shown` (see [`Tokenizer::special_ids`]).
    pub fn decode_visible(&self, ids: &[u32], shown: &[u32]) -> String {
        if let Some(table) = self.byte_level.get() {
            return table.decode(ids.iter().copied().filter(|id| self.is_shown(*id, shown)));
        }
        if let (Vocab::HuggingFace(inner), true) = (&self.vocab, shown.is_empty()) {
            return inner.decode(ids, true).unwrap_or_default();
        }
        let kept: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|id| self.is_shown(*id, shown))
            .collect();
        self.decode(&kept)
    }

    fn is_shown(&self, id: u32, shown: &[u32]) -> bool {
        !self.is_special(id) || shown.contains(&id)
    }

    /// The ids of those `texts` that are special tokens of this vocabulary: markup such as
    /// `<|python_tag|>` that a reply must show for its tool calls to be read.
    pub fn special_ids(&self, texts: &[&str]) -> Vec<u32> {
        texts
            .iter()
            .filter_map(|text| self.token_id(text))
            .filter(|id| self.is_special(*id))
            .collect()
    }

    /// An incremental decoder of visible text (as [`Tokenizer::decode_visible`]) for
    /// streaming: each [`TextStream::push`] returns the text the new ids complete, holding back
    /// an incomplete UTF-8 sequence until its last byte arrives.
    pub fn text_stream(&self, shown: Vec<u32>) -> TextStream<'_> {
        let decoder = match (&self.vocab, self.byte_level.get()) {
            (_, Some(table)) => Decoder::ByteLevel {
                table,
                pending: Vec::new(),
            },
            (Vocab::HuggingFace(inner), None) => Decoder::HuggingFace(inner.decode_stream(false)),
            #[cfg(feature = "engine")]
            (Vocab::Gguf(vocab), None) => Decoder::Gguf {
                vocab,
                pending: Vec::new(),
            },
        };
        TextStream {
            decoder,
            tokenizer: self,
            shown,
            all_shown: false,
        }
    }

    /// Each id's share of the text of `ids` (special tokens kept), in order: the pieces join
    /// to the decoded text. An id that ends inside a UTF-8 sequence has an empty piece, and
    /// the id that completes the sequence carries it (the token viewer shows one box per id).
    pub fn pieces(&self, ids: &[u32]) -> Vec<String> {
        let mut stream = self.text_stream(Vec::new());
        stream.all_shown = true;
        ids.iter().map(|&id| stream.push(&[id])).collect()
    }

    /// The id of a token given by its exact text (e.g. `<|im_end|>`), if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        match &self.vocab {
            Vocab::HuggingFace(inner) => inner.token_to_id(token),
            #[cfg(feature = "engine")]
            Vocab::Gguf(vocab) => vocab.token_id(token),
        }
    }

    /// True when `id` is an added special token such as `<|im_end|>` or `<|eot_id|>`.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains_key(&id)
    }

    /// The text a special token stands for (its content), if `id` is one.
    pub fn special_token_text(&self, id: u32) -> Option<&str> {
        self.special.get(&id).map(String::as_str)
    }
}

/// See [`Tokenizer::text_stream`].
pub struct TextStream<'a> {
    decoder: Decoder<'a>,
    tokenizer: &'a Tokenizer,
    /// Special tokens shown; every other special token is left out.
    shown: Vec<u32>,
    /// Every special token is shown (`Tokenizer::pieces`).
    all_shown: bool,
}

enum Decoder<'a> {
    /// A byte-level vocabulary's table: token bytes not yet a complete UTF-8 sequence.
    ByteLevel {
        table: &'a ByteLevelDecoder,
        pending: Vec<u8>,
    },
    HuggingFace(
        tokenizers::DecodeStream<
            'a,
            tokenizers::ModelWrapper,
            tokenizers::NormalizerWrapper,
            tokenizers::PreTokenizerWrapper,
            tokenizers::PostProcessorWrapper,
            tokenizers::DecoderWrapper,
        >,
    ),
    /// Token bytes not yet a complete UTF-8 sequence.
    #[cfg(feature = "engine")]
    Gguf {
        vocab: &'a GgufVocab,
        pending: Vec<u8>,
    },
}

impl TextStream<'_> {
    /// The text completed by `ids`.
    pub fn push(&mut self, ids: &[u32]) -> String {
        let mut text = String::new();
        let (tokenizer, shown, all_shown) = (self.tokenizer, &self.shown, self.all_shown);
        let kept = ids
            .iter()
            .copied()
            .filter(|&id| all_shown || tokenizer.is_shown(id, shown));
        match &mut self.decoder {
            Decoder::ByteLevel { table, pending } => {
                table.extend_bytes(kept, pending);
                take_complete_utf8(pending, &mut text);
            }
            Decoder::HuggingFace(decoder) => {
                for id in kept {
                    if let Ok(Some(piece)) = decoder.step(id) {
                        text.push_str(&piece);
                    }
                }
            }
            #[cfg(feature = "engine")]
            Decoder::Gguf { vocab, pending } => {
                kept.for_each(|id| pending.extend(vocab.piece_bytes(id)));
                take_complete_utf8(pending, &mut text);
            }
        }
        text
    }
}

/// Moves the complete UTF-8 prefix of `pending` to `text` (invalid bytes become U+FFFD; an
/// incomplete sequence at the end waits for its last bytes).
fn take_complete_utf8(pending: &mut Vec<u8>, text: &mut String) {
    if let Ok(whole) = std::str::from_utf8(pending) {
        text.push_str(whole);
        pending.clear();
        return;
    }
    let complete = match std::str::from_utf8(pending) {
        Ok(_) => pending.len(),
        Err(error) if error.error_len().is_none() => error.valid_up_to(),
        Err(_) => pending.len(),
    };
    text.push_str(&String::from_utf8_lossy(&pending[..complete]));
    pending.drain(..complete);
}

/// A fetched fixture's `tokenizer.json` (`scripts/fetch-fixtures.sh`).
#[cfg(test)]
pub(crate) fn fixture_tokenizer(model: &str) -> tokenizers::Tokenizer {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/cache")
        .join(model)
        .join("tokenizer.json");
    tokenizers::Tokenizer::from_file(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run scripts/fetch-fixtures.sh", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;

    /// A whitespace-split word-level tokenizer over `words` (ids in order) and `<unk>`.
    fn word_level(words: &[&str]) -> tokenizers::Tokenizer {
        let vocab = words
            .iter()
            .chain(&["<unk>"])
            .enumerate()
            .map(|(id, w)| (w.to_string(), id as u32))
            .collect();
        let model = WordLevel::builder()
            .vocab(vocab)
            .unk_token("<unk>".into())
            .build()
            .unwrap();
        let mut inner = tokenizers::Tokenizer::new(model);
        inner.with_pre_tokenizer(Some(Whitespace {}));
        inner
    }

    /// Words `a`, `b`, and the special tokens `<tag>` (a tool marker) and `<end>`.
    fn tokenizer() -> Tokenizer {
        let mut inner = word_level(&["a", "b"]);
        inner
            .add_special_tokens([
                tokenizers::AddedToken::from("<tag>", true),
                tokenizers::AddedToken::from("<end>", true),
            ])
            .unwrap();
        Tokenizer::from_tokenizer(inner)
    }

    #[test]
    fn ascii_text_skips_only_a_normalizer_that_cannot_change_it() {
        let mut inner = word_level(&["a", "\u{e9}"]);
        inner
            .with_normalizer(Some(tokenizers::normalizers::unicode::NFC))
            .unwrap();
        let tokenizer = Tokenizer::from_tokenizer(inner);
        assert!(tokenizer.without_normalizer.is_some());
        assert_eq!(tokenizer.encode("a a").unwrap(), vec![0, 0]);
        // A decomposed é is still composed before lookup.
        assert_eq!(tokenizer.encode("a e\u{301}").unwrap(), vec![0, 1]);
    }

    #[test]
    fn byte_level_vocabularies_get_their_table_beside_start_up() {
        let inner = fixture_tokenizer("qwen3");
        let tokenizer = Tokenizer::from_tokenizer(inner.clone());
        assert!(tokenizer.fast.is_some() && tokenizer.without_normalizer.is_none());
        let text = "<|im_start|>user\nZ\u{fc}rich?<|im_end|>\n";
        let ids = tokenizer.encode(text).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while tokenizer.byte_level.get().is_none() {
            assert!(std::time::Instant::now() < deadline, "table never built");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(tokenizer.decode(&ids), text);
        let im_end = tokenizer.token_id("<|im_end|>").unwrap();
        assert_eq!(
            tokenizer.decode_visible(&ids, &[]),
            inner.decode(&ids, true).unwrap()
        );
        assert_eq!(
            tokenizer.decode_visible(&ids, &[im_end]),
            "user\nZ\u{fc}rich?<|im_end|>\n"
        );
        // The stream reads the table too: token by token (an emoji's bytes held until its
        // last token) or in one piece, it gives what decoding the ids gives.
        let text = "Z\u{fc}rich \u{1f600} \u{4e2d}\u{6587} \u{2000b}\u{10348}<|im_end|>";
        let ids = tokenizer.encode(text).unwrap();
        let mut stream = tokenizer.text_stream(vec![im_end]);
        assert!(matches!(stream.decoder, Decoder::ByteLevel { .. }));
        let pieces: Vec<String> = ids.iter().map(|&id| stream.push(&[id])).collect();
        assert_eq!(pieces.concat(), tokenizer.decode_visible(&ids, &[im_end]));
        assert!(
            pieces.iter().any(String::is_empty),
            "a split character waits"
        );
        let mut whole = tokenizer.text_stream(Vec::new());
        assert_eq!(whole.push(&ids), inner.decode(&ids, true).unwrap());
    }

    #[test]
    fn replies_show_only_the_special_tokens_asked_for() {
        let tokenizer = tokenizer();
        let ids = tokenizer.encode("a <tag> b <end>").unwrap();
        assert_eq!(tokenizer.decode_visible(&ids, &[]), "a b");
        let shown = tokenizer.special_ids(&["<tag>", "b", "<missing>"]);
        assert_eq!(shown, vec![3]);
        assert_eq!(tokenizer.decode_visible(&ids, &shown), "a <tag> b");
        let mut stream = tokenizer.text_stream(shown);
        let streamed: Vec<String> = ids.iter().map(|id| stream.push(&[*id])).collect();
        assert_eq!(
            streamed.concat().split_whitespace().collect::<Vec<_>>(),
            ["a", "<tag>", "b"]
        );
    }

    #[test]
    fn ordinary_encoding_reads_special_token_text_as_text() {
        let tokenizer = Tokenizer::from_tokenizer(fixture_tokenizer("qwen3"));
        let im_end = tokenizer.token_id("<|im_end|>").unwrap();
        assert_eq!(tokenizer.encode("<|im_end|>").unwrap(), [im_end]);
        let plain = tokenizer.encode_ordinary("a <|im_end|>").unwrap();
        assert!(!plain.contains(&im_end));
        assert_eq!(tokenizer.decode(&plain), "a <|im_end|>");
    }

    #[test]
    fn pieces_join_to_the_text_with_special_tokens_and_whole_characters() {
        let tokenizer = Tokenizer::from_tokenizer(fixture_tokenizer("qwen3"));
        let text = "<|im_start|>user\nZ\u{fc}rich \u{1f600}?<|im_end|>\n";
        let ids = tokenizer.encode(text).unwrap();
        let pieces = tokenizer.pieces(&ids);
        assert_eq!(pieces.len(), ids.len());
        assert_eq!(pieces.concat(), text);
        assert_eq!(pieces[0], "<|im_start|>");
        // The emoji's bytes span several ids: one of them carries it whole, the others nothing.
        assert!(pieces.iter().any(|p| p.contains('\u{1f600}')));
    }
}
