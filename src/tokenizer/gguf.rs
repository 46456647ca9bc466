//! A GGUF model's own vocabulary through llama.cpp: for a model served in-process, the proxy
//! tokenizes exactly as the engine does, whatever the model's tokenizer type.

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use std::collections::HashMap;
use std::sync::Arc;

/// The vocabulary of a loaded GGUF model.
pub struct GgufVocab {
    model: Arc<LlamaModel>,
    /// Ids at or above this are not tokens (llama.cpp must never see them).
    n_tokens: u32,
    /// Token text (as the vocabulary stores it) → id.
    by_text: HashMap<String, u32>,
}

impl GgufVocab {
    /// The vocabulary of `model`.
    pub fn new(model: Arc<LlamaModel>) -> Self {
        let vocab = model.vocab();
        let by_text = vocab
            .tokens()
            .filter_map(|token| {
                let text = vocab.text(token)?.to_str().ok()?;
                Some((text.to_string(), token.0 as u32))
            })
            .collect();
        let n_tokens = vocab.n_tokens().max(0) as u32;
        Self {
            model,
            n_tokens,
            by_text,
        }
    }

    /// Control tokens (`<|im_end|>`, EOS…) with their text: what Hugging Face calls special.
    pub fn control_tokens(&self) -> HashMap<u32, String> {
        let vocab = self.model.vocab();
        vocab
            .tokens()
            .filter(|token| vocab.is_control(*token))
            .map(|token| (token.0 as u32, self.piece(token.0 as u32)))
            .collect()
    }

    /// Ids of `text`, special-token text parsed as the special tokens, no BOS added.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.tokenize(text, true)
    }

    /// Ids of `text`, special-token text read as plain text, no BOS added.
    pub fn encode_ordinary(&self, text: &str) -> Vec<u32> {
        self.tokenize(text, false)
    }

    fn tokenize(&self, text: &str, parse_special: bool) -> Vec<u32> {
        self.model
            .vocab()
            .tokenize(text.as_bytes(), false, parse_special)
            .into_iter()
            .map(|t| t.0 as u32)
            .collect()
    }

    /// The bytes of `ids`, special tokens written out; ids outside the vocabulary are skipped.
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let tokens: Vec<LlamaToken> = ids
            .iter()
            .filter(|&&id| id < self.n_tokens)
            .map(|&id| LlamaToken::new(id as i32))
            .collect();
        if tokens.is_empty() {
            return Vec::new();
        }
        self.model.vocab().detokenize(&tokens, false, true)
    }

    /// The bytes one token stands for (special tokens written out; nothing for an id outside
    /// the vocabulary).
    pub fn piece_bytes(&self, id: u32) -> Vec<u8> {
        if id >= self.n_tokens {
            return Vec::new();
        }
        self.model
            .vocab()
            .token_to_piece(LlamaToken::new(id as i32), true, None)
    }

    fn piece(&self, id: u32) -> String {
        String::from_utf8_lossy(&self.piece_bytes(id)).into_owned()
    }

    /// The id of a token given by its exact vocabulary text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.by_text.get(text).copied()
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.by_text.len()
    }
}
