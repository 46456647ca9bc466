//! How many placeholder tokens an image takes: the Qwen-VL processors resize every image to a
//! grid of patches (`smart_resize`), and each `merge × merge` block of patches is one
//! `<|image_pad|>` in the prompt.
//!
//! The arithmetic follows transformers' `smart_resize` exactly, floats included: Python's
//! `round` rounds halves to even (`f64::round` would give another count for about one size in a
//! hundred), `math.floor`/`math.ceil` act on `f64`.

use super::VisionError;
use serde::{Deserialize, Serialize};

/// The widest aspect ratio the processors take (transformers refuses wider images).
pub const MAX_ASPECT_RATIO: f64 = 200.0;

/// How a model's image processor cuts images into patches (its `preprocessor_config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PatchGrid {
    /// Side of one patch in pixels (14 for Qwen2-VL and Qwen2.5-VL, 16 for Qwen3-VL).
    pub patch_size: u32,
    /// Patches merged into one token along each side (2).
    pub merge_size: u32,
    /// Frames per temporal patch (2; a still image is one temporal patch).
    pub temporal_patch_size: u32,
    /// The fewest pixels an image is resized to.
    pub min_pixels: u64,
    /// The most pixels an image is resized to.
    pub max_pixels: u64,
}

/// An image's patch grid: `[t, h, w]` as transformers and vLLM write `image_grid_thw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GridThw(pub [u32; 3]);

impl GridThw {
    /// Placeholder tokens the image takes in the prompt.
    pub fn tokens(&self, merge_size: u32) -> usize {
        let [t, h, w] = self.0;
        (t as usize * h as usize * w as usize) / (merge_size as usize * merge_size as usize)
    }
}

impl PatchGrid {
    /// Qwen2-VL's and Qwen2.5-VL's processor as the released checkpoints configure it.
    pub const QWEN2_VL: Self = Self {
        patch_size: 14,
        merge_size: 2,
        temporal_patch_size: 2,
        min_pixels: 56 * 56,
        max_pixels: 28 * 28 * 16384,
    };

    /// The side every resized dimension is a multiple of.
    pub fn factor(&self) -> u32 {
        self.patch_size * self.merge_size
    }

    /// The grid of an image `width × height` pixels (after its EXIF orientation).
    pub fn grid(&self, width: u32, height: u32) -> Result<GridThw, VisionError> {
        let (resized_height, resized_width) = self.smart_resize(height, width)?;
        Ok(GridThw([
            1,
            resized_height / self.patch_size,
            resized_width / self.patch_size,
        ]))
    }

    /// Placeholder tokens an image `width × height` takes.
    pub fn tokens(&self, width: u32, height: u32) -> Result<usize, VisionError> {
        Ok(self.grid(width, height)?.tokens(self.merge_size))
    }

    /// transformers' `smart_resize(height, width, factor, min_pixels, max_pixels)`: the size
    /// the image is resized to, `(height, width)`, each a multiple of [`PatchGrid::factor`].
    pub fn smart_resize(&self, height: u32, width: u32) -> Result<(u32, u32), VisionError> {
        if height == 0 || width == 0 {
            return Err(VisionError::Empty { width, height });
        }
        let (h, w) = (f64::from(height), f64::from(width));
        let ratio = h.max(w) / h.min(w);
        if ratio > MAX_ASPECT_RATIO {
            return Err(VisionError::AspectRatio {
                width,
                height,
                ratio,
            });
        }
        let factor = f64::from(self.factor());
        let mut h_bar = (h / factor).round_ties_even() * factor;
        let mut w_bar = (w / factor).round_ties_even() * factor;
        let (min_pixels, max_pixels) = (self.min_pixels as f64, self.max_pixels as f64);
        if h_bar * w_bar > max_pixels {
            let beta = (h * w / max_pixels).sqrt();
            h_bar = factor.max((h / beta / factor).floor() * factor);
            w_bar = factor.max((w / beta / factor).floor() * factor);
        } else if h_bar * w_bar < min_pixels {
            let beta = (min_pixels / (h * w)).sqrt();
            h_bar = (h * beta / factor).ceil() * factor;
            w_bar = (w * beta / factor).ceil() * factor;
        }
        let side = |v: f64| -> Option<u32> {
            (v >= factor && v <= f64::from(u32::MAX)).then_some(v as u32)
        };
        match (side(h_bar), side(w_bar)) {
            (Some(h_bar), Some(w_bar)) => Ok((h_bar, w_bar)),
            _ => Err(VisionError::Empty { width, height }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3_VL: PatchGrid = PatchGrid {
        patch_size: 16,
        merge_size: 2,
        temporal_patch_size: 2,
        min_pixels: 65536,
        max_pixels: 16777216,
    };

    #[test]
    fn sizes_round_to_the_factor() {
        let grid = PatchGrid::QWEN2_VL;
        assert_eq!(grid.smart_resize(100, 60).unwrap(), (112, 56));
        assert_eq!(grid.grid(60, 100).unwrap(), GridThw([1, 8, 4]));
        assert_eq!(grid.tokens(60, 100).unwrap(), 8);
        // A small image grows to min_pixels.
        assert_eq!(grid.smart_resize(10, 10).unwrap(), (56, 56));
        assert_eq!(QWEN3_VL.smart_resize(100, 60).unwrap(), (352, 224));
    }

    #[test]
    fn halves_round_to_even_as_python_does() {
        // 42 / 28 = 1.5 rounds to 2, 70 / 28 = 2.5 rounds to 2 (f64::round gives 3).
        let grid = PatchGrid {
            min_pixels: 1,
            ..PatchGrid::QWEN2_VL
        };
        assert_eq!(grid.smart_resize(42, 70).unwrap(), (56, 56));
    }

    #[test]
    fn large_images_shrink_under_max_pixels() {
        let grid = PatchGrid {
            max_pixels: 28 * 28 * 64,
            ..PatchGrid::QWEN2_VL
        };
        let (h, w) = grid.smart_resize(4000, 3000).unwrap();
        assert!(u64::from(h) * u64::from(w) <= grid.max_pixels);
        assert_eq!((h % 28, w % 28), (0, 0));
    }

    #[test]
    fn refuses_what_transformers_refuses() {
        let grid = PatchGrid::QWEN2_VL;
        assert!(matches!(
            grid.smart_resize(1, 201),
            Err(VisionError::AspectRatio { .. })
        ));
        assert!(grid.smart_resize(1, 200).is_ok());
        assert!(matches!(
            grid.smart_resize(0, 5),
            Err(VisionError::Empty { .. })
        ));
    }
}
