//! Routed experts (mixture-of-experts routing replay) as servers report them, read into
//! [`RoutedExperts`]: vLLM writes a base64 `.npy` of shape (rows, layers, top-k), `uint8` or
//! `uint16`; SGLang the base64 of raw little-endian `int32`s, rows of layers × top-k. Both
//! cover the positions from the start the request asked for through the sample's last fed one.

use crate::generation::RoutedExperts;
use base64::Engine;
use ndarray::ArrayD;
use ndarray_npy::ReadNpyExt;
use serde_json::Value;

/// Most expert ids one row may hold (layers × top-k; the largest MoE models have under 1,000).
const MAX_WIDTH: usize = 1 << 16;

/// How a server encodes the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Encoding {
    /// A `.npy` array (vLLM).
    Npy,
    /// Raw little-endian `int32` (SGLang).
    Int32,
}

/// The routed experts `reported` (the server's field) for a request that asked for them from
/// position `from` (`None`: it did not ask), whose prompt and sample hold `tokens` ids. A
/// malformed field, or one of another length than those positions need, is left out with a
/// warning: the turn's ids and logprobs stand, and the node then keeps no rows rather than
/// misaligned ones.
pub(super) fn reported(
    reported: &Value,
    from: Option<u32>,
    tokens: usize,
    encoding: Encoding,
) -> Option<RoutedExperts> {
    let (Some(from), Some(text)) = (from, reported.as_str()) else {
        return None;
    };
    // The last sampled token was never fed, so it has no row.
    let rows = tokens.saturating_sub(1).saturating_sub(from as usize);
    read(text, from, rows, encoding)
        .inspect_err(|reason| tracing::warn!(%reason, "routed experts left out"))
        .ok()
}

fn read(text: &str, from: u32, rows: usize, encoding: Encoding) -> Result<RoutedExperts, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("not base64: {e}"))?;
    let (ids, layers) = match encoding {
        Encoding::Npy => npy(&bytes)?,
        Encoding::Int32 => (int32(&bytes)?, None),
    };
    let width = match rows {
        0 => return Err("no position to cover".into()),
        rows if ids.len() % rows == 0 => ids.len() / rows,
        _ => return Err(format!("{} ids do not make {rows} rows", ids.len())),
    };
    if width == 0 || width > MAX_WIDTH || layers.is_some_and(|l| width % l as usize != 0) {
        return Err(format!("rows of {width} ids"));
    }
    Ok(RoutedExperts {
        from,
        width: width as u32,
        layers,
        ids,
    })
}

/// A `.npy` of expert ids (`uint8` or `uint16`, as vLLM writes them), flat, and its layers
/// (the second dimension).
fn npy(bytes: &[u8]) -> Result<(Vec<u16>, Option<u32>), String> {
    let (flat, shape): (Vec<u16>, Vec<usize>) = match ArrayD::<u16>::read_npy(bytes) {
        Ok(array) => (array.iter().copied().collect(), array.shape().to_vec()),
        Err(_) => {
            let array = ArrayD::<u8>::read_npy(bytes).map_err(|e| format!("not a .npy: {e}"))?;
            let shape = array.shape().to_vec();
            (array.iter().map(|&id| u16::from(id)).collect(), shape)
        }
    };
    let layers = shape.get(1).map(|&l| l as u32).filter(|_| shape.len() == 3);
    Ok((flat, layers))
}

/// Raw little-endian `int32` expert ids, each a valid id (0 to 65,535).
fn int32(bytes: &[u8]) -> Result<Vec<u16>, String> {
    if !bytes.len().is_multiple_of(4) {
        return Err(format!("{} bytes are not int32s", bytes.len()));
    }
    bytes
        .chunks_exact(4)
        .map(|b| {
            let id = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            u16::try_from(id).map_err(|_| format!("expert id {id}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array3;
    use ndarray_npy::WriteNpyExt;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn reads_vllm_npy_rows_with_their_layers() {
        // 3 rows, 2 layers, top-2, uint8 (as vLLM writes for 256 experts or fewer).
        let array = Array3::from_shape_vec((3, 2, 2), (0u8..12).collect()).unwrap();
        let mut npy = Vec::new();
        array.write_npy(&mut npy).unwrap();
        let experts = read(&b64(&npy), 4, 3, Encoding::Npy).unwrap();
        assert_eq!(
            (experts.from, experts.width, experts.layers),
            (4, 4, Some(2))
        );
        assert_eq!(experts.ids, (0u16..12).collect::<Vec<_>>());
        assert!(
            read(&b64(&npy), 4, 5, Encoding::Npy).is_err(),
            "rows must match"
        );
    }

    #[test]
    fn reads_sglang_int32_rows() {
        let ids: Vec<u8> = [7i32, 300, 1, 2]
            .iter()
            .flat_map(|i| i.to_le_bytes())
            .collect();
        let experts = read(&b64(&ids), 0, 2, Encoding::Int32).unwrap();
        assert_eq!((experts.width, experts.layers), (2, None));
        assert_eq!(experts.ids, vec![7, 300, 1, 2]);
        let negative: Vec<u8> = (-1i32).to_le_bytes().to_vec();
        assert!(read(&b64(&negative), 0, 1, Encoding::Int32).is_err());
        assert!(read("not base64!", 0, 1, Encoding::Int32).is_err());
    }
}
