//! One JSON line per node: the arrays a trainer feeds on (`tokens`, `masked_tokens`,
//! `logprobs`), the turns that made the node (each a span: where its prompt and its sampled
//! ids lie, the API it came by, the backend and weight version that sampled it), the messages
//! its ids were rendered from (each a span with its role and turn, see [`super::messages`]),
//! and the session's reward and metadata.

use super::SessionExport;
use super::messages::{self, MessageSpan};
use crate::generation::RoutedExperts;
use crate::json_numbers::NumberArray;
use crate::session::{Divergence, Node, TurnRecord};
use crate::tokenizer::Tokenizer;
use base64::Engine;
use serde::Serialize;
use serde_json::{Map, Value};

/// Writes `tokens`, `masked_tokens` (-100 where the model did not sample) and `logprobs`
/// (1.0 there; sampled ones as the f64 nearest the stored f32) as JSON members, each after a
/// comma, straight from the node; and `routed_experts` when the node records them: a base64
/// `.npy` (uint16; rows × layers × top-k, or rows × ids where the server gave no layers), as
/// vLLM writes them, one row per position from the first; and `images` when the prompt holds
/// images: each image's run of placeholders (`offset`, `length`), `sha256` (its bytes at
/// `GET /blobs/{sha256}`), `media_type` and `grid_thw`.
pub fn write_arrays(out: &mut Vec<u8>, node: &Node, tokens: &[u32]) {
    out.extend_from_slice(b",\"tokens\":");
    let mut array = NumberArray::new(out);
    array.ids(tokens);
    array.finish();
    // Run by run: a node is mostly prompt runs, whose mask and logprob are constants.
    out.extend_from_slice(b",\"masked_tokens\":");
    let mut array = NumberArray::new(out);
    for (range, sampled) in node.runs() {
        match sampled {
            Some(_) => array.ids(&tokens[range]),
            None => array.repeat(b"-100", range.len()),
        }
    }
    array.finish();
    out.extend_from_slice(b",\"logprobs\":");
    let mut array = NumberArray::new(out);
    for (range, sampled) in node.runs() {
        match sampled {
            Some(logprobs) => logprobs.iter().for_each(|&lp| array.float(f64::from(lp))),
            None => array.repeat(b"1.0", range.len()),
        }
    }
    array.finish();
    if let Some(experts) = node.routed_experts() {
        out.extend_from_slice(b",\"routed_experts\":\"");
        let npy = experts_npy(experts);
        out.extend_from_slice(
            base64::engine::general_purpose::STANDARD
                .encode(npy)
                .as_bytes(),
        );
        out.push(b'"');
    }
    if !node.images().is_empty() {
        out.extend_from_slice(b",\"images\":");
        // Plain data: serialising it cannot fail.
        let _ = serde_json::to_writer(&mut *out, node.images());
    }
}

/// `experts` as a `.npy`: rows × layers × top-k, or rows × ids when the layers are unknown.
fn experts_npy(experts: &RoutedExperts) -> Vec<u8> {
    use ndarray_npy::WriteNpyExt;
    let width = experts.width as usize;
    let mut shape = vec![experts.rows()];
    match experts
        .layers
        .map(|l| l as usize)
        .filter(|&l| l > 0 && width.is_multiple_of(l))
    {
        Some(layers) => shape.extend([layers, width / layers]),
        None => shape.push(width),
    }
    let cells = shape.iter().product();
    let array = ndarray::ArrayD::from_shape_vec(shape, experts.ids[..cells].to_vec())
        .expect("the shape holds exactly the cells taken");
    let mut npy = Vec::new();
    // Writing into memory cannot fail.
    let _ = array.write_npy(&mut npy);
    npy
}

/// The members of a line after the arrays.
#[derive(Serialize)]
struct LineRest<'a> {
    turns: &'a [TurnRecord],
    messages: Vec<MessageSpan>,
    divergence: Option<&'a Divergence>,
    parent: Option<usize>,
    reward: Option<f64>,
    metadata: Option<&'a Map<String, Value>>,
    session: SessionFacts<'a>,
}

/// What is known of the session a node belongs to.
#[derive(Serialize)]
struct SessionFacts<'a> {
    created_at: f64,
    last_accessed: f64,
    rewarded_at: Option<f64>,
    options: &'a crate::session::SessionOptions,
}

/// Appends one line per node of `export` (`tokenizer` reads the message headers).
pub fn write_session(
    out: &mut Vec<u8>,
    export: &SessionExport,
    tokenizer: &Tokenizer,
) -> serde_json::Result<()> {
    let session = export.session;
    let reward = export.reward.as_ref();
    let mut tokens = Vec::new();
    for (index, node) in export.nodes.iter().enumerate() {
        out.extend_from_slice(b"{\"session_id\":\"");
        out.extend_from_slice(session.id.hyphenated().to_string().as_bytes());
        out.extend_from_slice(b"\",\"node_index\":");
        out.extend_from_slice(index.to_string().as_bytes());
        tokens.clear();
        node.copy_tokens_into(&mut tokens);
        write_arrays(out, node, &tokens);
        let rest = LineRest {
            turns: &node.turns,
            messages: messages::segment(node, &tokens, tokenizer),
            divergence: node.divergence.as_ref(),
            parent: node.parent,
            reward: reward.map(|r| r.reward),
            metadata: reward.map(|r| &r.metadata),
            session: SessionFacts {
                created_at: session.created_at,
                last_accessed: session.last_accessed(),
                rewarded_at: reward.map(|r| r.rewarded_at),
                options: &session.options,
            },
        };
        // The rest's members follow the arrays inside the same object.
        let rest = serde_json::to_vec(&rest)?;
        out.push(b',');
        out.extend_from_slice(&rest[1..]);
        out.push(b'\n');
    }
    Ok(())
}
