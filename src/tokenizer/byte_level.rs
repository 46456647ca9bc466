//! Byte-level vocabularies (GPT-2, Qwen, Llama 3): every token stands for a byte string,
//! spelled with one character per byte. Decoding is then a table lookup per id, which the
//! library does by cloning each token's text and mapping it character by character.

use tokenizers::DecoderWrapper;

/// GPT-2's byte-to-character map: printable Latin-1 bytes stand for themselves, the others
/// take the characters from U+0100 on, in byte order. A table, as the tokenizer's fast road
/// maps every byte of new text through it.
pub(super) fn byte_char(byte: u8) -> char {
    BYTE_CHARS[byte as usize]
}

const BYTE_CHARS: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut next_unprintable = 0x100;
    let mut byte = 0;
    while byte < 256 {
        let printable = matches!(byte, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        table[byte] = if printable {
            byte as u8 as char
        } else {
            next_unprintable += 1;
            match char::from_u32(next_unprintable - 1) {
                Some(c) => c,
                None => '\0',
            }
        };
        byte += 1;
    }
    table
};

/// The byte a byte-level character stands for.
fn char_byte(character: char) -> Option<u8> {
    static TABLE: std::sync::OnceLock<[u16; 0x144]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut table = [u16::MAX; 0x144];
        for byte in 0..=255u8 {
            table[byte_char(byte) as usize] = u16::from(byte);
        }
        table
    });
    let entry = *table.get(character as usize)?;
    u8::try_from(entry).ok()
}

/// Tokens up to this many bytes are copied as one block of it.
const SHORT: usize = 16;

/// Every token's bytes, back to back, then [`SHORT`] bytes of padding.
#[derive(Debug)]
pub(super) struct ByteLevelDecoder {
    /// Token `id`'s bytes are `bytes[ends[id - 1]..ends[id]]`.
    ends: Vec<u32>,
    bytes: Vec<u8>,
}

impl ByteLevelDecoder {
    /// The table for `tokenizer` when its decoder is byte-level and the table decodes a probe
    /// of its vocabulary exactly as the library does.
    pub fn for_tokenizer(tokenizer: &tokenizers::Tokenizer) -> Option<Self> {
        if !matches!(tokenizer.get_decoder(), Some(DecoderWrapper::ByteLevel(_))) {
            return None;
        }
        let size = tokenizer.get_vocab_size(true) as u32;
        let mut ends = Vec::with_capacity(size as usize);
        let mut bytes = Vec::new();
        for id in 0..size {
            if let Some(token) = tokenizer.id_to_token(id) {
                // A character outside the map leaves the token's text as it is (so does the
                // library).
                let mapped: Option<Vec<u8>> = token.chars().map(char_byte).collect();
                bytes.extend(mapped.unwrap_or_else(|| token.into_bytes()));
            }
            ends.push(u32::try_from(bytes.len()).ok()?);
        }
        bytes.extend([0; SHORT]);
        let decoder = Self { ends, bytes };
        let probe: Vec<u32> = (0..size)
            .step_by(97)
            .chain(size.saturating_sub(300)..size)
            .collect();
        let expected = tokenizer.decode(&probe, false).ok()?;
        (decoder.decode(probe.iter().copied()) == expected).then_some(decoder)
    }

    /// The text of `ids`; ids outside the vocabulary are skipped, as the library does.
    pub fn decode(&self, ids: impl IntoIterator<Item = u32>) -> String {
        let ids = ids.into_iter();
        // Room for a typical token's few bytes each: a node's text is decoded whole.
        let mut text = Vec::with_capacity(ids.size_hint().0 * 4);
        self.extend_bytes(ids, &mut text);
        String::from_utf8(text)
            .unwrap_or_else(|invalid| String::from_utf8_lossy(invalid.as_bytes()).into_owned())
    }

    /// Appends the bytes of `ids` to `out` (ids outside the vocabulary are skipped).
    pub fn extend_bytes(&self, ids: impl IntoIterator<Item = u32>, out: &mut Vec<u8>) {
        for id in ids {
            let id = id as usize;
            let Some(&end) = self.ends.get(id) else {
                continue;
            };
            let start = id.checked_sub(1).map_or(0, |previous| self.ends[previous]) as usize;
            let len = end as usize - start;
            // A short token is copied as a fixed-size block (the table is padded past its
            // last token) and the excess cut: one move, where a copy of the exact length is
            // a call per token.
            match self.bytes[start..].first_chunk::<SHORT>() {
                Some(block) if len <= SHORT => {
                    let at = out.len();
                    out.extend_from_slice(block);
                    out.truncate(at + len);
                }
                _ => out.extend_from_slice(&self.bytes[start..start + len]),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::fixture_tokenizer;

    #[test]
    fn the_byte_map_is_gpt2s() {
        assert_eq!(byte_char(b'A'), 'A');
        assert_eq!(byte_char(b' '), '\u{120}');
        assert_eq!(byte_char(b'\n'), '\u{10A}');
        assert_eq!(byte_char(0x7F), '\u{121}');
        assert_eq!(byte_char(0xAD), '\u{143}');
        assert_eq!(byte_char(0xE9), '\u{E9}');
        assert!((0..=255u8).all(|b| char_byte(byte_char(b)) == Some(b)));
    }

    #[test]
    fn decodes_every_token_and_broken_utf8_as_the_library_does() {
        for model in ["qwen3", "llama3_1", "smollm2"] {
            let tokenizer = fixture_tokenizer(model);
            let decoder = ByteLevelDecoder::for_tokenizer(&tokenizer).expect("byte-level");
            let size = tokenizer.get_vocab_size(true) as u32;
            for id in 0..size + 2 {
                assert_eq!(
                    decoder.decode([id]),
                    tokenizer.decode(&[id], false).unwrap(),
                    "{model} id {id}"
                );
            }
            // Runs that split multi-byte characters across tokens, or leave them incomplete.
            let text = "naïve café — 日本語 🙂 <|im_end|> x";
            let ids = tokenizer
                .encode_fast(text, false)
                .unwrap()
                .get_ids()
                .to_vec();
            for end in 0..=ids.len() {
                for start in 0..end.min(3) {
                    let run = &ids[start..end];
                    assert_eq!(
                        decoder.decode(run.iter().copied()),
                        tokenizer.decode(run, false).unwrap()
                    );
                }
            }
        }
    }
}
