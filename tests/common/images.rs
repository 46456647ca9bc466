//! Images for the tests: small PNGs and JPEGs, one with an EXIF orientation that turns it.

use base64::Engine;
use std::io::Cursor;

/// A `width × height` PNG of gradient pixels (`seed` shifts them, so images differ).
pub fn png(width: u32, height: u32, seed: u8) -> Vec<u8> {
    encode(width, height, seed, image::ImageFormat::Png)
}

/// A `width × height` PNG of noise, which does not compress: its size is about 3 bytes a
/// pixel (a body that holds it is long).
pub fn noisy_png(width: u32, height: u32, seed: u32) -> Vec<u8> {
    let mut state = seed.wrapping_mul(2_654_435_761).max(1);
    let pixels = image::RgbImage::from_fn(width, height, |_, _| {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let [a, b, c, _] = state.to_le_bytes();
        image::Rgb([a, b, c])
    });
    let mut out = Vec::new();
    pixels
        .write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out
}

/// A `width × height` JPEG whose EXIF orientation (6: turned 90° clockwise) makes it
/// `height × width` once turned, as vLLM and transformers turn it.
pub fn turned_jpeg(width: u32, height: u32, seed: u8) -> Vec<u8> {
    let jpeg = encode(width, height, seed, image::ImageFormat::Jpeg);
    // APP1 "Exif": a big-endian TIFF header and one IFD entry, Orientation (0x0112) = 6.
    let mut exif = b"Exif\0\0MM\0\x2a\0\0\0\x08\0\x01".to_vec();
    exif.extend_from_slice(&[0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0, 0, 0, 0, 0]);
    let mut out = jpeg[..2].to_vec();
    out.extend_from_slice(&[0xff, 0xe1]);
    out.extend_from_slice(&((exif.len() + 2) as u16).to_be_bytes());
    out.extend_from_slice(&exif);
    out.extend_from_slice(&jpeg[2..]);
    out
}

/// `bytes` as a `data:` URL.
pub fn data_url(bytes: &[u8], media_type: &str) -> String {
    format!("data:{media_type};base64,{}", base64(bytes))
}

/// The SHA-256 of `bytes`, in lowercase hex (how nodes name images).
pub fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A user chat message of the image at `url`, then `text`.
pub fn user(text: &str, url: &str) -> serde_json::Value {
    serde_json::json!({"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]})
}

/// One Messages turn whose image block has `source`, and one Responses turn whose
/// `input_image` is `image_url`, each on a new session of `proxy`; each answered 200. The two
/// sessions' nodes.
pub async fn messages_and_responses_nodes(
    proxy: &super::Proxy,
    source: serde_json::Value,
    image_url: &str,
) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    use super::mock_worker::Sample;
    use serde_json::json;
    let mut nodes = Vec::new();
    for (route, body) in [
        (
            "messages",
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "image", "source": source}, {"type": "text", "text": "What is it?"}]}]}),
        ),
        (
            "responses",
            json!({"input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": image_url},
                {"type": "input_text", "text": "What is it?"}]}]}),
        ),
    ] {
        let uuid = proxy.session(json!({})).await;
        proxy.worker.push_sample(Sample::stop(vec![9707, 151645]));
        let (status, reply) = proxy.post(&format!("/{uuid}/v1/{route}"), body).await;
        assert_eq!(status, 200, "{route}: {reply}");
        nodes.push(proxy.nodes(&uuid).await);
    }
    let responses = nodes.pop().unwrap_or_default();
    (nodes.pop().unwrap_or_default(), responses)
}

/// `bytes` in base64.
pub fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn encode(width: u32, height: u32, seed: u8, format: image::ImageFormat) -> Vec<u8> {
    let pixels = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([
            (x as u8).wrapping_mul(3),
            (y as u8).wrapping_add(seed),
            seed,
        ])
    });
    let mut out = Vec::new();
    pixels.write_to(&mut Cursor::new(&mut out), format).unwrap();
    out
}

/// A model folder like the tiny Qwen2-VL's, without weights: the pinned Qwen3 tokenizer (it
/// has the vision tokens), the bundled Qwen2-VL template and Qwen2-VL's processor config.
/// Made once per test process under `target/tmp`; treat it as read-only.
pub fn qwen2_vl_dir() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = super::scratch_dir(&format!("qwen2-vl-{}", std::process::id()));
        let qwen3 = super::fixture_model("qwen3");
        std::fs::copy(qwen3.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
        std::fs::copy(
            qwen3.join("tokenizer_config.json"),
            dir.join("tokenizer_config.json"),
        )
        .unwrap();
        let template = concat!(env!("CARGO_MANIFEST_DIR"), "/templates/qwen2_vl.jinja");
        std::fs::copy(template, dir.join("chat_template.jinja")).unwrap();
        let processor = serde_json::json!({"min_pixels": 3136, "max_pixels": 12845056,
            "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2});
        std::fs::write(dir.join("preprocessor_config.json"), processor.to_string()).unwrap();
        dir
    })
    .clone()
}
