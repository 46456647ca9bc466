//! The proxy's tokenizer (with its fast road for ASCII and mixed text) against the Hugging Face
//! library's own pipeline, on arbitrary text: the ids must be identical. Needs the fixtures
//! (`scripts/fetch-fixtures.sh`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;

struct Pair {
    ours: rollout_proxy::tokenizer::Tokenizer,
    library: tokenizers::Tokenizer,
}

fn pairs() -> &'static [Pair] {
    static PAIRS: OnceLock<Vec<Pair>> = OnceLock::new();
    PAIRS.get_or_init(|| {
        ["qwen3", "llama3_1"]
            .iter()
            .map(|model| {
                let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("../fixtures/cache")
                    .join(model)
                    .join("tokenizer.json");
                Pair {
                    ours: rollout_proxy::tokenizer::Tokenizer::from_path(&file)
                        .expect("run scripts/fetch-fixtures.sh"),
                    library: tokenizers::Tokenizer::from_file(&file).unwrap(),
                }
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for pair in pairs() {
        let expected = pair.library.encode_fast(text.as_ref(), false).unwrap();
        assert_eq!(
            pair.ours.encode(&text).unwrap(),
            expected.get_ids(),
            "{text:?}"
        );
    }
});
