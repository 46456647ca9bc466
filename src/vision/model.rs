//! A vision-language model's image processor, read from its folder's
//! `preprocessor_config.json` as transformers reads it.

use super::{PatchGrid, VisionError};
use serde_json::Value;
use std::path::Path;

/// What the proxy needs of a model to place its images: how its processor cuts an image, and
/// the id of the placeholder token one image's run repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisionModel {
    /// The processor's patch grid.
    pub grid: PatchGrid,
    /// The id of `<|image_pad|>`.
    pub image_pad: u32,
}

/// The placeholder token of the Qwen-VL family.
pub const IMAGE_PAD: &str = "<|image_pad|>";

impl VisionModel {
    /// The model in `dir`, when it has an image processor (`preprocessor_config.json`) and its
    /// vocabulary the placeholder (`image_pad`, the id of [`IMAGE_PAD`]); `None` for a model
    /// without images.
    pub fn from_dir(dir: &Path, image_pad: Option<u32>) -> Result<Option<Self>, VisionError> {
        let path = dir.join("preprocessor_config.json");
        let (Ok(text), Some(image_pad)) = (std::fs::read_to_string(&path), image_pad) else {
            return Ok(None);
        };
        let config: Value = serde_json::from_str(&text)
            .map_err(|e| VisionError::Config(format!("{}: {e}", path.display())))?;
        let grid = patch_grid(&config)
            .map_err(|e| VisionError::Config(format!("{}: {e}", path.display())))?;
        Ok(Some(Self { grid, image_pad }))
    }
}

/// The patch grid a processor config describes. Pixel bounds in either spelling:
/// `min_pixels`/`max_pixels` (Qwen2-VL, Qwen2.5-VL; they win, as in transformers) or
/// `size.shortest_edge`/`size.longest_edge` (Qwen3-VL); else transformers' defaults.
pub fn patch_grid(config: &Value) -> Result<PatchGrid, String> {
    let number = |value: Option<&Value>, name: &str| -> Result<Option<u64>, String> {
        match value {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0)
                .map(Some)
                .ok_or_else(|| format!("'{name}' must be a positive integer")),
        }
    };
    let size = config.get("size");
    let side = |name: &str, default: u32| -> Result<u32, String> {
        let n = number(config.get(name), name)?.unwrap_or(u64::from(default));
        u32::try_from(n)
            .ok()
            .filter(|&n| n <= 1024)
            .ok_or_else(|| format!("'{name}' is out of range"))
    };
    let bound = |flat: &str, nested: &str, default: u64| -> Result<u64, String> {
        Ok(number(config.get(flat), flat)?
            .or(number(size.and_then(|s| s.get(nested)), nested)?)
            .or(number(size.and_then(|s| s.get(flat)), flat)?)
            .unwrap_or(default))
    };
    let grid = PatchGrid {
        patch_size: side("patch_size", 14)?,
        merge_size: side("merge_size", 2)?,
        temporal_patch_size: side("temporal_patch_size", 2)?,
        min_pixels: bound("min_pixels", "shortest_edge", 56 * 56)?,
        max_pixels: bound("max_pixels", "longest_edge", 28 * 28 * 1280)?,
    };
    if grid.min_pixels > grid.max_pixels {
        return Err("'min_pixels' is over 'max_pixels'".into());
    }
    Ok(grid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_both_spellings() {
        let qwen2 = json!({"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14,
            "merge_size": 2, "temporal_patch_size": 2, "size": {"shortest_edge": 1, "longest_edge": 2}});
        assert_eq!(patch_grid(&qwen2).unwrap(), PatchGrid::QWEN2_VL);
        let qwen3 = json!({"size": {"shortest_edge": 65536, "longest_edge": 16777216},
            "patch_size": 16, "merge_size": 2, "temporal_patch_size": 2});
        let grid = patch_grid(&qwen3).unwrap();
        assert_eq!(
            (grid.patch_size, grid.min_pixels, grid.max_pixels),
            (16, 65536, 16777216)
        );
        let old = json!({"size": {"min_pixels": 3136, "max_pixels": 12845056}});
        assert_eq!(patch_grid(&old).unwrap(), PatchGrid::QWEN2_VL);
        let defaults = patch_grid(&json!({})).unwrap();
        assert_eq!((defaults.min_pixels, defaults.max_pixels), (3136, 1003520));
    }

    #[test]
    fn refuses_nonsense() {
        for config in [
            json!({"patch_size": 0}),
            json!({"patch_size": "14"}),
            json!({"merge_size": 100000}),
            json!({"min_pixels": 10, "max_pixels": 5}),
        ] {
            assert!(patch_grid(&config).is_err(), "{config}");
        }
    }
}
