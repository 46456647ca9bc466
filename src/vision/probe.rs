//! What the proxy reads of an image itself: its format, its size and its EXIF orientation,
//! all from the header. The pixels are the inference server's to decode.

use super::{ImageFacts, VisionError};
use image::ImageDecoder;
use image::metadata::Orientation;
use sha2::{Digest, Sha256};
use std::io::Cursor;

/// The formats read here, with the media type each is recorded under. vLLM decodes more
/// (it uses Pillow); these are the ones agents send.
const FORMATS: [(image::ImageFormat, &str); 5] = [
    (image::ImageFormat::Png, "image/png"),
    (image::ImageFormat::Jpeg, "image/jpeg"),
    (image::ImageFormat::WebP, "image/webp"),
    (image::ImageFormat::Gif, "image/gif"),
    (image::ImageFormat::Bmp, "image/bmp"),
];

/// Reads `bytes`' header: refused when it is no image, a format not read here, or more than
/// `max_pixels` pixels (vLLM's `VLLM_MAX_IMAGE_PIXELS`, checked before any pixel is decoded).
pub fn probe(bytes: &[u8], max_pixels: u64) -> Result<ImageFacts, VisionError> {
    let reader = image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| VisionError::Undecodable(e.to_string()))?;
    let Some(format) = reader.format() else {
        return Err(VisionError::Undecodable(
            "its bytes are not a known image format".into(),
        ));
    };
    let Some(&(_, media_type)) = FORMATS.iter().find(|(f, _)| *f == format) else {
        return Err(VisionError::Unsupported(format!("{format:?}")));
    };
    let mut reader = reader;
    // Nothing is decoded: the limits that guard a decode's buffers do not apply.
    reader.no_limits();
    let mut decoder = reader
        .into_decoder()
        .map_err(|e| VisionError::Undecodable(e.to_string()))?;
    let (width, height) = decoder.dimensions();
    let pixels = u64::from(width) * u64::from(height);
    if pixels > max_pixels {
        return Err(VisionError::TooLarge {
            width,
            height,
            limit: max_pixels,
        });
    }
    let orientation = decoder
        .orientation()
        .map_err(|e| VisionError::Undecodable(e.to_string()))?;
    let turned = matches!(
        orientation,
        Orientation::Rotate90
            | Orientation::Rotate270
            | Orientation::Rotate90FlipH
            | Orientation::Rotate270FlipH
    );
    let (width, height) = if turned {
        (height, width)
    } else {
        (width, height)
    };
    Ok(ImageFacts {
        sha256: hex(&Sha256::digest(bytes)),
        media_type,
        width,
        height,
    })
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(width: u32, height: u32) -> Vec<u8> {
        let mut out = Vec::new();
        image::RgbImage::new(width, height)
            .write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png)
            .unwrap();
        out
    }

    #[test]
    fn reads_size_and_hash() {
        let bytes = png(100, 60);
        let facts = probe(&bytes, u64::MAX).unwrap();
        assert_eq!((facts.width, facts.height), (100, 60));
        assert_eq!(facts.media_type, "image/png");
        assert_eq!(facts.sha256, hex(&Sha256::digest(&bytes)));
        assert_eq!(facts.sha256.len(), 64);
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert!(matches!(
            probe(b"hello", u64::MAX),
            Err(VisionError::Undecodable(_))
        ));
        assert!(matches!(
            probe(b"II*\0\x08\0\0\0", u64::MAX),
            Err(VisionError::Unsupported(name)) if name == "Tiff"
        ));
        let truncated = &png(10, 10)[..20];
        assert!(probe(truncated, u64::MAX).is_err());
        assert!(matches!(
            probe(&png(100, 60), 5999),
            Err(VisionError::TooLarge { limit: 5999, .. })
        ));
    }
}
