//! Images in messages: the content parts that hold one (OpenAI's `image_url`, and what the
//! other APIs' adapters turn their image blocks into), read and checked as they arrive.

use crate::vision::{self, ImageFacts};
use base64::Engine;
use std::sync::{Arc, OnceLock};

/// Most images one conversation may hold. vLLM caps images per prompt too
/// (`--limit-mm-per-prompt`); a conversation over this is refused before anything is read.
pub const MAX_IMAGES: usize = 64;

/// An image a message holds: its bytes, and what the proxy read of them.
#[derive(Debug, PartialEq, Eq)]
pub struct Image {
    /// Format, size after EXIF orientation, and the bytes' SHA-256.
    pub facts: ImageFacts,
    /// The bytes as sent (the inference server decodes them; the node records their hash).
    pub bytes: Arc<[u8]>,
}

/// An image a message names by an `http(s)` URL. The turn fetches it before it renders
/// ([`crate::fetch`]); a message resent by a later request is the same message, so its image
/// is fetched once, and stays the bytes the model saw.
#[derive(Debug, PartialEq, Eq)]
pub struct ImageLink {
    /// The URL as sent.
    pub url: String,
    fetched: OnceLock<Arc<Image>>,
}

impl ImageLink {
    /// The image, once fetched.
    pub fn image(&self) -> Option<&Arc<Image>> {
        self.fetched.get()
    }

    /// Keeps the fetched image (the first kept stays).
    pub fn keep(&self, image: Arc<Image>) {
        let _ = self.fetched.set(image);
    }
}

/// One piece of a message's content, in order, for a message that holds images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Text.
    Text(String),
    /// An image.
    Image(Arc<Image>),
    /// An image at a URL, fetched before the turn renders.
    Link(Arc<ImageLink>),
}

impl Part {
    /// The part an image URL makes: a `data:` URL's image, read now, or an `http(s)` URL to
    /// fetch. Other URLs are refused.
    pub fn image_url(url: &str) -> Result<Self, String> {
        let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
        if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") {
            return Ok(Self::Link(Arc::new(ImageLink {
                url: url.to_string(),
                fetched: OnceLock::new(),
            })));
        }
        Image::from_data_url(url).map(Self::Image)
    }

    /// Whether the part is an image (fetched or not).
    pub fn is_image(&self) -> bool {
        !matches!(self, Self::Text(_))
    }
}

impl Image {
    /// The image `bytes` hold, checked: a readable format, within vLLM's pixel limit.
    pub fn read(bytes: Vec<u8>) -> Result<Arc<Self>, String> {
        let facts =
            vision::probe(&bytes, vision::VLLM_MAX_IMAGE_PIXELS).map_err(|e| e.to_string())?;
        Ok(Arc::new(Self {
            facts,
            bytes: bytes.into(),
        }))
    }

    /// The image of a `data:` URL (`data:image/png;base64,...`).
    fn from_data_url(url: &str) -> Result<Arc<Self>, String> {
        let Some(rest) = url.strip_prefix("data:") else {
            return Err(
                "an image URL must be a data: URL (data:image/png;base64,...) or an http(s) URL"
                    .into(),
            );
        };
        let Some((header, data)) = rest.split_once(',') else {
            return Err("a data: URL needs a ',' before its data".into());
        };
        if !header.ends_with(";base64") {
            return Err("an image data: URL must be base64 (data:image/png;base64,...)".into());
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| format!("the data: URL's base64 is invalid: {e}"))?;
        Self::read(bytes)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A black PNG, base64.
    pub(crate) fn png_base64(width: u32, height: u32) -> String {
        let mut out = Vec::new();
        image::RgbImage::new(width, height)
            .write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
            .unwrap();
        base64::engine::general_purpose::STANDARD.encode(out)
    }

    /// A black PNG as a data: URL.
    pub(crate) fn png_data_url(width: u32, height: u32) -> String {
        format!("data:image/png;base64,{}", png_base64(width, height))
    }

    #[test]
    fn reads_data_urls_and_keeps_http_urls_to_fetch() {
        let Part::Image(image) = Part::image_url(&png_data_url(30, 20)).unwrap() else {
            panic!("a data: URL is read at once");
        };
        assert_eq!((image.facts.width, image.facts.height), (30, 20));
        for url in ["https://example.test/a.png", "HTTP://example.test/b.png"] {
            let Part::Link(link) = Part::image_url(url).unwrap() else {
                panic!("{url} is fetched later");
            };
            assert_eq!((link.url.as_str(), link.image()), (url, None));
            link.keep(image.clone());
            assert_eq!(link.image(), Some(&image));
        }
        for (url, why) in [
            ("file:///etc/passwd", "must be a data: URL"),
            ("data:image/png,abc", "must be base64"),
            ("data:image/png;base64", "needs a ','"),
            ("data:image/png;base64,@@@", "base64 is invalid"),
            ("data:image/png;base64,aGVsbG8=", "cannot be decoded"),
        ] {
            let error = Part::image_url(url).unwrap_err();
            assert!(error.contains(why), "{url}: {error}");
        }
    }
}
