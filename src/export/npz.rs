//! Padded NumPy arrays in one `.npz` (a zip of `.npy` files, as `numpy.savez` writes it), one
//! row per node: `tokens`, `masked_tokens` and `attention_mask` (int32), `logprobs` and
//! `rewards` (float32), `lengths` (int32), and `nodes.json` (each row's session, node index,
//! reward, metadata and turns; `numpy.load(...)["nodes.json"]` returns its bytes).

use super::{ExportError, SessionExport};
use ndarray::{Array1, Array2};
use ndarray_npy::WriteNpyExt;
use serde_json::json;
use std::io::Cursor;
use zip::write::SimpleFileOptions;

/// How rows are padded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Padding {
    /// Row width; the longest node's length when `None`.
    pub pad_to: Option<usize>,
    /// The id `tokens` is padded with (`masked_tokens` with -100, `logprobs` with 1.0).
    pub pad_id: i32,
}

/// The arrays of every node of `exports`, as `.npz` bytes.
pub fn write(exports: &[SessionExport], padding: Padding) -> Result<Vec<u8>, ExportError> {
    let rows: Vec<_> = exports
        .iter()
        .flat_map(|e| {
            e.nodes
                .iter()
                .enumerate()
                .map(move |(i, node)| (e, i, node))
        })
        .collect();
    let longest = rows
        .iter()
        .map(|(_, _, node)| node.len())
        .max()
        .unwrap_or(0);
    let width = padding.pad_to.unwrap_or(longest);
    if longest > width {
        return Err(ExportError::TooLong {
            len: longest,
            pad_to: width,
        });
    }
    let shape = (rows.len(), width);
    let mut tokens = Array2::<i32>::from_elem(shape, padding.pad_id);
    let mut masked = Array2::<i32>::from_elem(shape, -100);
    let mut logprobs = Array2::<f32>::from_elem(shape, 1.0);
    let mut attention = Array2::<i32>::zeros(shape);
    let mut lengths = Array1::<i32>::zeros(rows.len());
    let mut rewards = Array1::<f32>::from_elem(rows.len(), f32::NAN);
    let mut described = Vec::with_capacity(rows.len());
    let mut ids = Vec::new();
    for (row, (export, index, node)) in rows.iter().enumerate() {
        ids.clear();
        node.copy_tokens_into(&mut ids);
        let n = ids.len();
        // Rows are contiguous (standard layout): filled slice by slice.
        for (cell, &id) in row_of(&mut tokens, row)[..n].iter_mut().zip(&ids) {
            *cell = id as i32;
        }
        row_of(&mut attention, row)[..n].fill(1);
        let masked_row = row_of(&mut masked, row);
        let logprobs_row = row_of(&mut logprobs, row);
        for (range, sampled) in node.runs() {
            if let Some(sampled) = sampled {
                for ((cell, &id), (lp_cell, &logprob)) in masked_row[range.clone()]
                    .iter_mut()
                    .zip(&ids[range.clone()])
                    .zip(logprobs_row[range].iter_mut().zip(sampled))
                {
                    *cell = id as i32;
                    *lp_cell = logprob;
                }
            }
        }
        lengths[row] = ids.len() as i32;
        let reward = export.reward.as_ref();
        if let Some(reward) = reward {
            rewards[row] = reward.reward as f32;
        }
        described.push(json!({
            "session_id": export.session.id,
            "node_index": index,
            "reward": reward.map(|r| r.reward),
            "metadata": reward.map(|r| &r.metadata),
            "turns": node.turns,
        }));
    }
    let mut zip = Zip::new(Cursor::new(Vec::new()));
    add(&mut zip, "tokens.npy", |out| tokens.write_npy(out))?;
    add(&mut zip, "masked_tokens.npy", |out| masked.write_npy(out))?;
    add(&mut zip, "logprobs.npy", |out| logprobs.write_npy(out))?;
    add(&mut zip, "attention_mask.npy", |out| {
        attention.write_npy(out)
    })?;
    add(&mut zip, "lengths.npy", |out| lengths.write_npy(out))?;
    add(&mut zip, "rewards.npy", |out| rewards.write_npy(out))?;
    add(&mut zip, "nodes.json", |out| {
        serde_json::to_writer(out, &described)
    })?;
    let bytes = zip.finish().map_err(failed)?;
    Ok(bytes.into_inner())
}

/// Row `row` of a standard-layout (so contiguous) array, as a slice.
fn row_of<A>(array: &mut Array2<A>, row: usize) -> &mut [A] {
    array
        .row_mut(row)
        .into_slice()
        .expect("rows of a standard-layout array are contiguous")
}

type Zip = zip::ZipWriter<Cursor<Vec<u8>>>;

/// Adds the member `name`, written by `write`, stored uncompressed (as `numpy.savez` does).
fn add<E: std::fmt::Display>(
    zip: &mut Zip,
    name: &str,
    write: impl FnOnce(&mut Zip) -> Result<(), E>,
) -> Result<(), ExportError> {
    let stored = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .large_file(true);
    zip.start_file(name, stored).map_err(failed)?;
    write(zip).map_err(failed)
}

fn failed(error: impl std::fmt::Display) -> ExportError {
    ExportError::Write(error.to_string())
}
