//! Images in conversations: what the proxy needs of an image to record it token-exactly.
//!
//! A vision-language model's prompt holds one run of `<|image_pad|>` per image, as long as the
//! model's processor makes it. The proxy writes those runs itself, so the node holds the ids
//! the model saw: it reads each image's size and EXIF orientation from its header
//! ([`probe`]), and turns that size into the processor's patch grid ([`PatchGrid`], the
//! `smart_resize` of the Qwen-VL processors).

mod model;
mod probe;
mod resize;

pub use model::{IMAGE_PAD, VisionModel, patch_grid};
pub use probe::probe;
pub use resize::{GridThw, MAX_ASPECT_RATIO, PatchGrid};

/// vLLM's default `VLLM_MAX_IMAGE_PIXELS`: it refuses larger images (Pillow's decompression
/// bomb limit).
pub const VLLM_MAX_IMAGE_PIXELS: u64 = 178_956_970;

/// What the proxy read of one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFacts {
    /// The image's bytes' SHA-256, in lowercase hex: its name in the blob store and the
    /// `uuid` vLLM caches it under.
    pub sha256: String,
    /// The media type of the format found in the bytes (`image/png`, ...).
    pub media_type: &'static str,
    /// Width after the EXIF orientation is applied (as Pillow's `exif_transpose` does).
    pub width: u32,
    /// Height after the EXIF orientation is applied.
    pub height: u32,
}

/// An image that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    /// The bytes are no image this proxy can read.
    #[error("the image cannot be decoded: {0}")]
    Undecodable(String),
    /// An image format the proxy does not read.
    #[error("the image format {0} is not supported (use PNG, JPEG, WebP, GIF or BMP)")]
    Unsupported(String),
    /// More pixels than the inference server takes.
    #[error("the image is {width}x{height}, over the limit of {limit} pixels")]
    TooLarge {
        /// Width as stored.
        width: u32,
        /// Height as stored.
        height: u32,
        /// The limit.
        limit: u64,
    },
    /// Wider (or taller) than the processors take.
    #[error(
        "the image is {width}x{height}: its aspect ratio {ratio:.1} is over {MAX_ASPECT_RATIO}"
    )]
    AspectRatio {
        /// Width.
        width: u32,
        /// Height.
        height: u32,
        /// Long side over short side.
        ratio: f64,
    },
    /// A model's `preprocessor_config.json` that cannot be used.
    #[error("the image processor's config is invalid: {0}")]
    Config(String),
    /// An image with no pixels, or one no grid fits.
    #[error("the image is {width}x{height}: no patch grid fits it")]
    Empty {
        /// Width.
        width: u32,
        /// Height.
        height: u32,
    },
}
