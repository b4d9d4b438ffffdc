//! Queries treated as llama.cpp's CPU flash attention treats them (see
//! [`QueryRounding::LlamaCpu`]), so that our KLD of a KV format can be
//! measured with its arithmetic as well as with ours.

use mlx_core::{Array, Dtype};

use crate::cache::{Attend, KvFormat, QueryRounding};
use crate::model::ModelError;
use crate::quant::{GgufDtype, BLOCK_VALUES};

/// The queries `[B, Hq, L, D]` that attend to `attend`, treated as its
/// [`QueryRounding`] says.
pub(super) fn rounded_queries(q: &Array, attend: &Attend) -> Result<Array, ModelError> {
    if attend.queries == QueryRounding::Exact {
        return Ok(q.clone());
    }
    let (keys, values) = (attend.keys.format(), attend.values.format());
    let float = |f: KvFormat| match f {
        KvFormat::Float(Some(d)) => Some(d),
        _ => None,
    };
    // llama.cpp casts f32 keys and values to f16 before its flash attention.
    let as_llama = |d: Dtype| {
        if d == Dtype::Float32 {
            Dtype::Float16
        } else {
            d
        }
    };
    let (k_float, v_float) = (float(keys).map(as_llama), float(values).map(as_llama));
    // f16 keys with f16 values take its tiled f32 path.
    if k_float == Some(Dtype::Float16) && v_float == Some(Dtype::Float16) {
        return Ok(q.clone());
    }
    Ok(match keys {
        KvFormat::Float(Some(d)) => q.astype(as_llama(d))?.astype(q.dtype())?,
        KvFormat::Block(
            GgufDtype::Q8_0
            | GgufDtype::Q4_0
            | GgufDtype::Q5_0
            | GgufDtype::Q4_1
            | GgufDtype::Q5_1
            | GgufDtype::IQ4_NL,
        ) => q8_blocks(q)?,
        _ => q.clone(),
    })
}

/// `x` through ggml's CPU `quantize_row_q8_0` (and `q8_1`, whose values are
/// the same) and back: per 32 values, `d = max|x| / 127` stored as f16,
/// `q = round(x · 127 / max|x|)` with ties to even, read back as `q · d`.
fn q8_blocks(x: &Array) -> Result<Array, ModelError> {
    let shape = x.shape();
    let dim = shape.last().copied().unwrap_or(0);
    let mut grouped = shape.clone();
    grouped.pop();
    grouped.extend([dim / BLOCK_VALUES as i32, BLOCK_VALUES as i32]);
    let g = x.astype(Dtype::Float32)?.reshape(&grouped)?;
    let amax = g.abs()?.max(&[-1], true)?;
    let zero = Array::scalar(0.0, Dtype::Float32)?;
    let top = Array::scalar(127.0, Dtype::Float32)?;
    let nonzero = amax.greater(&zero)?;
    let safe = mlx_core::where_(&nonzero, &amax, &top)?;
    let id = mlx_core::where_(&nonzero, &top.divide(&safe)?, &zero)?;
    let d = amax
        .divide(&top)?
        .astype(Dtype::Float16)?
        .astype(Dtype::Float32)?;
    let levels = g.multiply(&id)?.round()?;
    Ok(levels.multiply(&d)?.reshape(&shape)?.astype(x.dtype())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{KeyMask, KvStore};

    fn attend(keys: KvFormat, values: KvFormat, queries: QueryRounding) -> Attend {
        let x = mlx_core::zeros(&[1, 1, 2, 128], Dtype::Float32).unwrap();
        Attend {
            keys: KvStore::encode(&x, keys).unwrap(),
            values: KvStore::encode(&x, values).unwrap(),
            mask: KeyMask::All,
            queries,
            rotation: crate::cache::Rotation::NONE,
        }
    }

    #[test]
    fn queries_take_the_keys_dot_product_type_as_llama_cpp_cpu_gives_it() {
        let v: Vec<f32> = (0..128)
            .map(|i| (i as f32 * 0.7311).sin() * 3.0 + 0.001)
            .collect();
        let q = Array::from_slice(&v, &[1, 1, 1, 128]).unwrap();
        let values = |a: Array| a.to_vec::<f32>().unwrap();
        let f16 = KvFormat::Float(Some(Dtype::Float16));
        let bf16 = KvFormat::Float(Some(Dtype::Bfloat16));
        let q8 = KvFormat::Block(GgufDtype::Q8_0);
        let llama = QueryRounding::LlamaCpu;
        let round = |k, v, r| values(rounded_queries(&q, &attend(k, v, r)).unwrap());
        let as_dtype = |d: Dtype| values(q.astype(d).unwrap().astype(Dtype::Float32).unwrap());
        // f16 keys with f16 values: the tiled f32 path, queries as they are.
        assert_eq!(round(f16, f16, llama), v);
        // f16 keys beside other values: rounded to f16; bf16 keys: to bf16.
        assert_eq!(round(f16, q8, llama), as_dtype(Dtype::Float16));
        assert_eq!(round(bf16, bf16, llama), as_dtype(Dtype::Bfloat16));
        // Block keys: 8-bit blocks of 32.
        assert_eq!(round(q8, f16, llama), values(q8_blocks(&q).unwrap()));
        assert_ne!(round(q8, f16, llama), v);
        // TurboQuant keys take f32 queries; exact rounding changes nothing.
        assert_eq!(round(KvFormat::Turbo { bits: 4 }, f16, llama), v);
        assert_eq!(round(q8, q8, QueryRounding::Exact), v);
    }

    #[test]
    fn q8_blocks_round_halves_to_even_and_scale_by_the_f16_step() {
        // max 127 · 0.5: d = 0.5, id = 2; 0.25 → 0.5 → 0 (tie to even),
        // 0.75 → 1.5 → 2, −1.25 → −2.5 → −2.
        let mut v = vec![0f32; 32];
        v[0] = 63.5;
        v[1] = 0.25;
        v[2] = 0.75;
        v[3] = -1.25;
        let x = Array::from_slice(&v, &[1, 32]).unwrap();
        let y = q8_blocks(&x).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(&y[..4], &[63.5, 0.0, 1.0, -1.0]);
        assert!(y[4..].iter().all(|&v| v == 0.0));
        let zeros = Array::from_slice(&[0f32; 32], &[1, 32]).unwrap();
        assert!(q8_blocks(&zeros)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|&v| v == 0.0));
    }
}
