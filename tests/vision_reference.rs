//! The proxy's image arithmetic against transformers' Qwen-VL image processor, run by
//! `tests/vision/reference.py` in vLLM's venv (`scripts/install-vllm.sh`): `smart_resize` on
//! every size up to 330x330 for three processors, and the patch grid of images in every format
//! read here with every EXIF orientation, as vLLM loads them.

mod common;

use rollout_proxy::vision::{PatchGrid, probe};
use serde_json::Value;
use std::collections::BTreeMap;

/// transformers' `smart_resize` of every `(height, width)`, row by row; `None` where it refused.
type Resized = Vec<Vec<Option<(u32, u32)>>>;

struct Reference {
    processors: BTreeMap<String, PatchGrid>,
    side: u32,
    resized: BTreeMap<String, Resized>,
    images: Vec<Value>,
    dir: std::path::PathBuf,
}

fn reference() -> Reference {
    let (python, _) = common::vllm::installed();
    let dir = common::scratch_dir("vision-reference");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vision/reference.py");
    let output = std::process::Command::new(python)
        .arg(script)
        .arg(&dir)
        .env("TRANSFORMERS_VERBOSITY", "error")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut json: Value = serde_json::from_slice(&output.stdout).unwrap();
    let processors = json["processors"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, p)| {
            let n = |key: &str| p[key].as_u64().unwrap();
            let grid = PatchGrid {
                patch_size: n("patch_size") as u32,
                merge_size: n("merge_size") as u32,
                temporal_patch_size: n("temporal_patch_size") as u32,
                min_pixels: n("min_pixels"),
                max_pixels: n("max_pixels"),
            };
            (name.clone(), grid)
        })
        .collect();
    Reference {
        processors,
        side: json["side"].as_u64().unwrap() as u32,
        resized: serde_json::from_value(json["resized"].take()).unwrap(),
        images: serde_json::from_value(json["images"].take()).unwrap(),
        dir,
    }
}

#[test]
fn smart_resize_and_grids_match_transformers() {
    let reference = reference();
    let mut compared = 0;
    for (name, grid) in &reference.processors {
        let rows = &reference.resized[name];
        assert_eq!(rows.len(), reference.side as usize);
        let mut wrong = Vec::new();
        for (h, row) in (1..).zip(rows) {
            for (w, expected) in (1..).zip(row) {
                let ours = grid.smart_resize(h, w).ok();
                if ours != *expected {
                    wrong.push((h, w, ours, *expected));
                }
                compared += 1;
            }
        }
        assert!(
            wrong.is_empty(),
            "{name}: {} sizes differ, first {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(5)]
        );
    }
    assert_eq!(compared, 3 * 330 * 330);

    assert!(reference.images.len() > 150, "{}", reference.images.len());
    for image in &reference.images {
        let file = image["file"].as_str().unwrap();
        let bytes = std::fs::read(reference.dir.join(file)).unwrap();
        let facts = probe(&bytes, u64::MAX).unwrap_or_else(|e| panic!("{file}: {e}"));
        let size = [facts.width, facts.height];
        assert_eq!(
            serde_json::to_value(size).unwrap(),
            image["size"],
            "{file}: the size after its EXIF orientation"
        );
        for (name, grid) in &reference.processors {
            let ours = grid.grid(facts.width, facts.height).ok().map(|g| g.0);
            let expected: Option<[u32; 3]> =
                serde_json::from_value(image["grids"][name].clone()).unwrap();
            assert_eq!(ours, expected, "{file} under {name}");
        }
    }
}
