//! Padded NumPy arrays in one `.npz` (a zip of `.npy` files, as `numpy.savez` writes it), one
//! row per node: `tokens`, `masked_tokens` and `attention_mask` (int32), `logprobs` and
//! `rewards` (float32), `lengths` (int32), and `nodes.json` (each row's session, node index,
//! reward, metadata, turns and images; `numpy.load(...)["nodes.json"]` returns its bytes). Nodes of
//! sessions that record routed experts add `routed_experts` (uint16, nodes × positions ×
//! layers·top-k; 65535 where a position has no row).
//!
//! The file is written as it is sent, never whole in memory: each array is a zip entry with a
//! data descriptor (as streamed zips are written; numpy reads them), its `.npy` header first,
//! then its rows, a node at a time (its padding written from one small block).

use super::{ExportError, SessionExport};
use crate::session::Node;
use ndarray::Array2;
use ndarray_npy::WritableElement;
use ndarray_npy::npy::header::{Header, Layout};
use serde_json::json;
use std::io::Write;
use zip::write::{SimpleFileOptions, StreamWriter};

/// Cells of padding written at a time.
const PAD_BLOCK: usize = 16 * 1024;

/// The widest row `pad_to` may ask for: 16,777,216 ids, above every model's context window.
pub const MAX_PAD_TO: usize = 1 << 24;

/// How rows are padded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Padding {
    /// Row width; the longest node's length when `None`.
    pub pad_to: Option<usize>,
    /// The id `tokens` is padded with (`masked_tokens` with -100, `logprobs` with 1.0).
    pub pad_id: i32,
}

/// The arrays' shape: one row per node, each `width` wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Nodes.
    pub rows: usize,
    /// Ids per row.
    pub width: usize,
}

/// The shape of the arrays of `exports`, or why they cannot be written.
pub fn shape(exports: &[SessionExport], padding: Padding) -> Result<Shape, ExportError> {
    let nodes = || exports.iter().flat_map(|e| e.nodes);
    let longest = nodes().map(Node::len).max().unwrap_or(0);
    let width = padding.pad_to.unwrap_or(longest);
    if width > MAX_PAD_TO {
        return Err(ExportError::Query(format!(
            "'pad_to' may be at most {MAX_PAD_TO}, not {width}"
        )));
    }
    if longest > width {
        return Err(ExportError::TooLong {
            len: longest,
            pad_to: width,
        });
    }
    Ok(Shape {
        rows: nodes().count(),
        width,
    })
}

/// Writes the `.npz` of every node of `exports` to `out`, as it goes.
pub fn write(
    exports: &[SessionExport],
    padding: Padding,
    out: impl Write,
) -> Result<(), ExportError> {
    let shape = shape(exports, padding)?;
    let mut zip = zip::ZipWriter::new_stream(out);
    let mut arrays = Arrays {
        exports,
        shape,
        per_position: 1,
        ids: Vec::new(),
    };
    let experts = experts_width(exports)?;
    arrays.write(&mut zip, "tokens.npy", padding.pad_id, |_, ids, row| {
        for (cell, &id) in row.iter_mut().zip(ids) {
            *cell = id as i32;
        }
    })?;
    arrays.write(&mut zip, "masked_tokens.npy", -100i32, |node, ids, row| {
        for (range, sampled) in node.runs() {
            if sampled.is_some() {
                for (cell, &id) in row[range.clone()].iter_mut().zip(&ids[range]) {
                    *cell = id as i32;
                }
            }
        }
    })?;
    arrays.write(&mut zip, "logprobs.npy", 1.0f32, |node, _, row| {
        for (range, sampled) in node.runs() {
            if let Some(sampled) = sampled {
                row[range].copy_from_slice(sampled);
            }
        }
    })?;
    arrays.write(&mut zip, "attention_mask.npy", 0i32, |_, ids, row| {
        row[..ids.len()].fill(1);
    })?;
    if let Some(width) = experts {
        arrays.per_position = width;
        arrays.write(&mut zip, "routed_experts.npy", u16::MAX, |node, _, row| {
            if let Some(experts) = node.routed_experts() {
                let cells = experts.ids.len().min(row.len());
                row[..cells].copy_from_slice(&experts.ids[..cells]);
            }
        })?;
        arrays.per_position = 1;
    }
    arrays.write_column(&mut zip, "lengths.npy", 0i32, |_, node| node.len() as i32)?;
    arrays.write_column(&mut zip, "rewards.npy", f32::NAN, |export, _| {
        export.reward.as_ref().map_or(f32::NAN, |r| r.reward as f32)
    })?;
    start(&mut zip, "nodes.json")?;
    let described: Vec<_> = exports
        .iter()
        .flat_map(|export| {
            let reward = export.reward.as_ref();
            export.nodes.iter().enumerate().map(move |(index, node)| {
                json!({
                    "session_id": export.session.id,
                    "node_index": index,
                    "reward": reward.map(|r| r.reward),
                    "metadata": reward.map(|r| &r.metadata),
                    "turns": node.turns,
                    "images": node.images(),
                })
            })
        })
        .collect();
    serde_json::to_writer(&mut zip, &described).map_err(failed)?;
    zip.finish().map_err(failed)?.flush().map_err(failed)
}

type Zip<W> = zip::ZipWriter<StreamWriter<W>>;

/// Writes the arrays, a session's nodes at a time.
struct Arrays<'e, 'a> {
    exports: &'e [SessionExport<'a>],
    shape: Shape,
    /// Cells per position: 1, or the expert ids of a routed-experts row (a third dimension).
    per_position: usize,
    /// The ids of the node being written.
    ids: Vec<u32>,
}

impl Arrays<'_, '_> {
    /// The array `name`: `pad` everywhere but where `fill` writes each node's row (given the
    /// node and its ids; `per_position` cells for each id).
    fn write<A: WritableElement + Clone>(
        &mut self,
        zip: &mut Zip<impl Write>,
        name: &str,
        pad: A,
        fill: impl Fn(&Node, &[u32], &mut [A]),
    ) -> Result<(), ExportError> {
        start(zip, name)?;
        let per = self.per_position;
        let mut shape = vec![self.shape.rows, self.shape.width];
        if per > 1 {
            shape.push(per);
        }
        header::<A>(&mut *zip, shape)?;
        // A row is its node's cells, then padding written from one block of at most
        // `PAD_BLOCK` cells: memory follows the nodes, never the width asked for.
        let padding = vec![pad.clone(); (self.shape.width * per).min(PAD_BLOCK)];
        let mut row = Vec::new();
        for node in self.exports.iter().flat_map(|export| export.nodes) {
            self.ids.clear();
            node.copy_tokens_into(&mut self.ids);
            row.clear();
            row.resize(self.ids.len() * per, pad.clone());
            fill(node, &self.ids, &mut row);
            A::write_slice(&row, &mut *zip).map_err(failed)?;
            let mut left = self.shape.width * per - row.len();
            while left > 0 {
                let cells = left.min(padding.len());
                A::write_slice(&padding[..cells], &mut *zip).map_err(failed)?;
                left -= cells;
            }
        }
        Ok(())
    }

    /// The one-dimensional array `name`: `value` of each node.
    fn write_column<A: WritableElement + Clone>(
        &self,
        zip: &mut Zip<impl Write>,
        name: &str,
        pad: A,
        value: impl Fn(&SessionExport, &Node) -> A,
    ) -> Result<(), ExportError> {
        start(zip, name)?;
        header::<A>(&mut *zip, vec![self.shape.rows])?;
        for export in self.exports {
            let mut block = Array2::from_elem((export.nodes.len(), 1), pad.clone());
            for (cell, node) in block.iter_mut().zip(export.nodes) {
                *cell = value(export, node);
            }
            rows(&mut *zip, &block)?;
        }
        Ok(())
    }
}

/// The width of the routed-experts rows of the nodes of `exports`, if any holds some; an
/// error when two differ (nodes of different models cannot share one array).
fn experts_width(exports: &[SessionExport]) -> Result<Option<usize>, ExportError> {
    let mut widths = exports
        .iter()
        .flat_map(|e| e.nodes)
        .filter_map(|node| Some(node.routed_experts()?.width as usize));
    let Some(first) = widths.next() else {
        return Ok(None);
    };
    match widths.find(|&w| w != first) {
        Some(other) => Err(ExportError::Query(format!(
            "nodes with routed-experts rows of {first} and of {other} ids cannot share one \
             array: export their sessions apart"
        ))),
        None => Ok(Some(first)),
    }
}

/// Starts the member `name`, stored uncompressed (as `numpy.savez` does).
fn start(zip: &mut Zip<impl Write>, name: &str) -> Result<(), ExportError> {
    let stored = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .large_file(true);
    zip.start_file(name, stored).map_err(failed)
}

/// An `.npy` header for a standard-layout array of `A` with `shape`.
fn header<A: WritableElement>(out: impl Write, shape: Vec<usize>) -> Result<(), ExportError> {
    let header = Header {
        type_descriptor: A::type_descriptor(),
        layout: Layout::Standard,
        shape,
    };
    header.write(out).map_err(failed)
}

/// The rows of `block`, in order.
fn rows<A: WritableElement>(out: impl Write, block: &Array2<A>) -> Result<(), ExportError> {
    let cells = block
        .as_slice()
        .expect("a standard-layout array is contiguous");
    A::write_slice(cells, out).map_err(failed)
}

fn failed(error: impl std::fmt::Display) -> ExportError {
    ExportError::Write(error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{SessionOptions, SessionStore};
    use ndarray::Array1;
    use ndarray_npy::ReadNpyExt;
    use std::io::{Cursor, Read};

    /// The member `name` of the `.npz` in `bytes`.
    fn member(bytes: &[u8], name: &str) -> Vec<u8> {
        let mut archive = zip::ZipArchive::new(Cursor::new(bytes)).unwrap();
        let mut content = Vec::new();
        archive
            .by_name(name)
            .unwrap()
            .read_to_end(&mut content)
            .unwrap();
        content
    }

    #[test]
    fn rows_are_padded_nodes_and_an_empty_export_is_a_valid_file() {
        let store = SessionStore::default();
        let session = store.create(SessionOptions::default()).unwrap();
        let mut long = Node::default();
        long.push_prompt(&[5, 6, 7]);
        long.push_sampled(&[8], &[-0.5]);
        let mut short = Node::default();
        short.push_prompt(&[9]);
        let nodes = [long, short];
        let export = SessionExport {
            session: &session,
            nodes: &nodes,
            completions: &[],
            reward: None,
        };
        let padding = Padding {
            pad_to: None,
            pad_id: -1,
        };
        let mut bytes = Vec::new();
        write(&[export], padding, &mut bytes).unwrap();
        let tokens = Array2::<i32>::read_npy(&member(&bytes, "tokens.npy")[..]).unwrap();
        assert_eq!(tokens, ndarray::arr2(&[[5, 6, 7, 8], [9, -1, -1, -1]]));
        let masked = Array2::<i32>::read_npy(&member(&bytes, "masked_tokens.npy")[..]).unwrap();
        assert_eq!(masked.row(0).to_vec(), [-100, -100, -100, 8]);
        let lengths = Array1::<i32>::read_npy(&member(&bytes, "lengths.npy")[..]).unwrap();
        assert_eq!(lengths.to_vec(), [4, 1]);

        let mut empty = Vec::new();
        write(&[], padding, &mut empty).unwrap();
        let tokens = Array2::<i32>::read_npy(&member(&empty, "tokens.npy")[..]).unwrap();
        assert_eq!(tokens.dim(), (0, 0));
        assert_eq!(member(&empty, "nodes.json"), b"[]");
    }
}
