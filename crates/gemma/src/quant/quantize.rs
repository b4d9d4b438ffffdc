//! ggml's reference quantizers for its 32-value block formats, the types
//! llama.cpp offers for KV caches (`q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1`,
//! `iq4_nl`).
//!
//! The linear formats follow the `gguf` Python package's `quantize_blocks`
//! (ggml's `quantize_row_*_ref`) operation for operation, so the bytes are
//! the package's: f32 arithmetic throughout, except that `q4_0` and `q5_0`
//! take `x · id + offset` in f64 and round the sum once to f32, as the
//! package does to stand for a fused multiply-add. (ggml built for x86-64
//! without `-march` rounds `x · id` first; the two part only where the sum
//! lands within an f32 step of a whole number: never on random or real
//! rows, often on rows placed on half steps, see `docs/kv-formats.md`.) Rust
//! never fuses a multiply and an add on its own, so nothing else rounds
//! differently. One thing is ggml's C rather than the package's: in a block
//! of zeros the sign of a zero scale or minimum follows the C reference's
//! strict comparisons (NumPy's reductions pick one by the order of their
//! SIMD lanes); either decodes to the same zeros.
//!
//! `iq4_nl` is not in the package; it follows ggml's
//! `quantize_row_iq4_nl_ref` (what a KV cache store calls) in f32 with no
//! fused operations, as ggml's base library is built for x86-64.

use half::f16;
use rayon::prelude::*;

use super::blocks::IQ4_NL_LEVELS;
use super::dtype::GgufDtype;

/// Values per block of every type here.
pub const BLOCK_VALUES: usize = 32;

/// Blocks handed to one rayon task at least.
const MIN_BLOCKS_PER_TASK: usize = 256;

/// Why values could not be quantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantizeError {
    /// The type has no quantizer here.
    #[error(
        "type {0} has no quantizer here (accepted: {accepted})",
        accepted = QUANTIZABLE.map(|t| t.to_string()).join(", ")
    )]
    Unsupported(GgufDtype),
    /// The values do not fill whole blocks, or the output is not their size.
    #[error("{values} values do not fill {bytes} bytes of {dtype} blocks of {BLOCK_VALUES}")]
    Size {
        /// The type.
        dtype: GgufDtype,
        /// Values given.
        values: usize,
        /// Output bytes given.
        bytes: usize,
    },
}

/// The types [`quantize_into`] writes.
pub const QUANTIZABLE: [GgufDtype; 6] = [
    GgufDtype::Q8_0,
    GgufDtype::Q4_0,
    GgufDtype::Q4_1,
    GgufDtype::Q5_0,
    GgufDtype::Q5_1,
    GgufDtype::IQ4_NL,
];

/// Quantizes `values` (whole blocks of [`BLOCK_VALUES`]) into `out`, which
/// must hold exactly their blocks of `dtype`.
pub fn quantize_into(
    dtype: GgufDtype,
    values: &[f32],
    out: &mut [u8],
) -> Result<(), QuantizeError> {
    if !QUANTIZABLE.contains(&dtype) {
        return Err(QuantizeError::Unsupported(dtype));
    }
    let block_bytes = dtype.type_size() as usize;
    let blocks = values.len() / BLOCK_VALUES;
    if !values.len().is_multiple_of(BLOCK_VALUES) || out.len() != blocks * block_bytes {
        return Err(QuantizeError::Size {
            dtype,
            values: values.len(),
            bytes: out.len(),
        });
    }
    let quantize_block: fn(&[f32; BLOCK_VALUES], &mut [u8]) = match dtype {
        GgufDtype::Q8_0 => q8_0,
        GgufDtype::Q4_0 => q4_0,
        GgufDtype::Q4_1 => q4_1,
        GgufDtype::Q5_0 => q5_0,
        GgufDtype::Q5_1 => q5_1,
        _ => iq4_nl,
    };
    values
        .par_chunks_exact(BLOCK_VALUES)
        .zip(out.par_chunks_exact_mut(block_bytes))
        .with_min_len(MIN_BLOCKS_PER_TASK)
        .for_each(|(x, block)| {
            // The conversion succeeds: the chunks have exactly BLOCK_VALUES values.
            if let Ok(x) = x.try_into() {
                quantize_block(x, block);
            }
        });
    Ok(())
}

/// `1 / d`, or 0 where `d` is 0.
fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// The value of largest magnitude, the first of equals; +0 for a block of
/// zeros (ggml's `amax < fabsf(v)` from 0).
fn signed_max(x: &[f32; BLOCK_VALUES]) -> f32 {
    x.iter()
        .fold(0f32, |best, &v| if v.abs() > best.abs() { v } else { best })
}

/// The largest and smallest values, each the first of equals (ggml's strict
/// comparisons).
fn max_min(x: &[f32; BLOCK_VALUES]) -> (f32, f32) {
    x.iter().skip(1).fold((x[0], x[0]), |(hi, lo), &v| {
        (if v > hi { v } else { hi }, if v < lo { v } else { lo })
    })
}

/// Writes `v` as a little-endian f16 (rounded to nearest, ties to even).
fn put_f16(out: &mut [u8], v: f32) {
    out.copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// `trunc(f32(x · id + offset))` with the product and sum in f64, as an
/// unsigned level at most `top`.
fn level_fma(x: f32, id: f32, offset: f64, top: u8) -> u8 {
    let sum = f64::from(x) * f64::from(id) + offset;
    ((sum as f32).trunc() as u8).min(top)
}

/// `trunc((x − min) · id + 0.5)` in f32, as an unsigned level at most `top`.
fn level_from_min(x: f32, min: f32, id: f32, top: u8) -> u8 {
    ((((x - min) * id) + 0.5).trunc() as u8).min(top)
}

/// Levels 0..32 as ggml packs them: value j's low nibble in byte j % 16
/// (the high nibble for j ≥ 16).
fn put_nibbles(out: &mut [u8], q: &[u8; BLOCK_VALUES]) {
    for (j, byte) in out.iter_mut().enumerate().take(BLOCK_VALUES / 2) {
        *byte = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
    }
}

/// Bit 4 of every level, value j at bit j of a little-endian u32.
fn put_high_bits(out: &mut [u8], q: &[u8; BLOCK_VALUES]) {
    let bits = q
        .iter()
        .enumerate()
        .fold(0u32, |acc, (j, &v)| acc | (u32::from(v >> 4) << j));
    out.copy_from_slice(&bits.to_le_bytes());
}

/// Q8_0: `d = max|x| / 127`, `q = round(x / d)` (halves away from zero).
fn q8_0(x: &[f32; BLOCK_VALUES], out: &mut [u8]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    put_f16(&mut out[..2], d);
    for (byte, &v) in out[2..].iter_mut().zip(x) {
        *byte = (v * id).round() as i8 as u8;
    }
}

/// Q4_0: `d = max / −8` (the value of largest magnitude), levels
/// `trunc(x / d + 8.5)` clipped to 15.
fn q4_0(x: &[f32; BLOCK_VALUES], out: &mut [u8]) {
    let d = signed_max(x) / -8.0;
    let id = inverse(d);
    let q = x.map(|v| level_fma(v, id, 8.5, 15));
    put_f16(&mut out[..2], d);
    put_nibbles(&mut out[2..18], &q);
}

/// Q4_1: `d = (max − min) / 15`, `m = min`, levels `trunc((x − m) / d + 0.5)`.
fn q4_1(x: &[f32; BLOCK_VALUES], out: &mut [u8]) {
    let (max, min) = max_min(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    let q = x.map(|v| level_from_min(v, min, id, 15));
    put_f16(&mut out[..2], d);
    put_f16(&mut out[2..4], min);
    put_nibbles(&mut out[4..20], &q);
}

/// Q5_0: `d = max / −16`, levels `trunc(x / d + 16.5)` clipped to 31.
fn q5_0(x: &[f32; BLOCK_VALUES], out: &mut [u8]) {
    let d = signed_max(x) / -16.0;
    let id = inverse(d);
    let q = x.map(|v| level_fma(v, id, 16.5, 31));
    put_f16(&mut out[..2], d);
    put_high_bits(&mut out[2..6], &q);
    put_nibbles(&mut out[6..22], &q);
}

/// Q5_1: `d = (max − min) / 31`, `m = min`, levels `trunc((x − m) / d + 0.5)`.
fn q5_1(x: &[f32; BLOCK_VALUES], out: &mut [u8]) {
    let (max, min) = max_min(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    let q = x.map(|v| level_from_min(v, min, id, 31));
    put_f16(&mut out[..2], d);
    put_f16(&mut out[2..4], min);
    put_high_bits(&mut out[4..8], &q);
    put_nibbles(&mut out[8..24], &q);
}

/// Below this largest magnitude a block is stored as zeros (ggml's
/// `GROUP_MAX_EPS`).
const IQ4_NL_MIN_MAX: f32 = 1e-15;

/// IQ4_NL as ggml's KV cache stores it (`quantize_row_iq4_nl_ref`, which
/// tries no further scales): each value's nearest level for
/// `d = max / −127`, then `d` refitted to those levels by least squares
/// weighted by x². A block whose largest magnitude is below 1e-15 gets
/// `d = 0` and levels 0 (ggml leaves there whatever its previous block's
/// levels were; any of them decodes to zeros).
fn iq4_nl(x: &[f32; BLOCK_VALUES], out: &mut [u8]) {
    let max = signed_max(x);
    let mut levels = [0u8; BLOCK_VALUES];
    let mut d = 0f32;
    if max.abs() >= IQ4_NL_MIN_MAX {
        let id = 1.0 / (max / f32::from(IQ4_NL_LEVELS[0]));
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for (level, &v) in levels.iter_mut().zip(x) {
            *level = nearest_iq4_nl_level(id * v);
            let q = f32::from(IQ4_NL_LEVELS[usize::from(*level)]);
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        if sumq2 > 0.0 {
            d = sumqx / sumq2;
        }
    }
    put_f16(&mut out[..2], d);
    put_nibbles(&mut out[2..18], &levels);
}

/// The index of the IQ4_NL level nearest `x`, the upper one on a tie
/// (ggml's `best_index_int8`: a bisection, then the closer neighbour).
fn nearest_iq4_nl_level(x: f32) -> u8 {
    let level = |i: usize| f32::from(IQ4_NL_LEVELS[i]);
    let top = IQ4_NL_LEVELS.len() - 1;
    if x <= level(0) {
        return 0;
    }
    if x >= level(top) {
        return top as u8;
    }
    let (mut low, mut high) = (0, top);
    while high - low > 1 {
        let middle = (low + high) / 2;
        if x < level(middle) {
            high = middle;
        } else {
            low = middle;
        }
    }
    let nearest = if x - level(high - 1) < level(high) - x {
        high - 1
    } else {
        high
    };
    nearest as u8
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize;

    fn quantized(dtype: GgufDtype, x: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; x.len() / BLOCK_VALUES * dtype.type_size() as usize];
        quantize_into(dtype, x, &mut out).unwrap();
        out
    }

    #[test]
    fn q8_0_of_a_hand_computed_block() {
        // max |x| = 127 · 0.5, so d = 0.5 and q = x / 0.5 rounded half away.
        let mut x = [0f32; 32];
        x[0] = 63.5;
        x[1] = -0.25;
        x[2] = 0.75;
        x[3] = -1.25;
        let b = quantized(GgufDtype::Q8_0, &x);
        assert_eq!(&b[..2], &f16::from_f32(0.5).to_le_bytes());
        assert_eq!(b[2] as i8, 127);
        assert_eq!(b[3] as i8, -1, "-0.5 rounds away from zero");
        assert_eq!(b[4] as i8, 2, "1.5 rounds away from zero");
        assert_eq!(b[5] as i8, -3, "-2.5 rounds away from zero");
    }

    #[test]
    fn q4_0_takes_the_signed_maximum_and_clips_the_top() {
        // max = -8 → d = 1, id = 1; q = trunc(x + 8.5) clipped to 15.
        let mut x = [0f32; 32];
        x[0] = -8.0;
        x[1] = 7.9;
        x[16] = 8.0;
        x[17] = -0.6;
        let b = quantized(GgufDtype::Q4_0, &x);
        assert_eq!(&b[..2], &f16::from_f32(1.0).to_le_bytes());
        let q = |j: usize| (b[2 + j % 16] >> (4 * (j / 16))) & 0x0F;
        assert_eq!([q(0), q(1), q(2), q(16), q(17)], [0, 15, 8, 15, 7]);
    }

    #[test]
    fn q5_1_keeps_the_minimum_and_the_fifth_bit() {
        let x: [f32; 32] = std::array::from_fn(|j| j as f32 - 1.0);
        let b = quantized(GgufDtype::Q5_1, &x);
        assert_eq!(&b[2..4], &f16::from_f32(-1.0).to_le_bytes());
        // d = 31 / 31 = 1: level j is j, bit 4 set from value 16 on.
        assert_eq!(u32::from_le_bytes([b[4], b[5], b[6], b[7]]), 0xFFFF_0000);
        assert_eq!(dequantize(GgufDtype::Q5_1, &b).unwrap(), x.to_vec());
    }

    #[test]
    fn iq4_nl_of_a_hand_computed_block() {
        // max = −63.5 → d = 0.5 and x / d = −127, 13, 1 and 0 (nearest
        // level 1, since 1 − 0 < 0 − (−10)); the refit keeps d = 0.5, as
        // every value sits on its level.
        let mut x = [0f32; 32];
        x[0] = -63.5;
        x[1] = 6.5;
        x[16] = 0.5;
        let b = quantized(GgufDtype::IQ4_NL, &x);
        assert_eq!(&b[..2], &f16::from_f32(0.5).to_le_bytes());
        let level = |j: usize| (b[2 + j % 16] >> (4 * (j / 16))) & 0x0F;
        assert_eq!([level(0), level(1), level(2), level(16)], [0, 9, 8, 8]);
        let y = dequantize(GgufDtype::IQ4_NL, &b).unwrap();
        assert_eq!([y[0], y[1], y[2], y[16]], [-63.5, 6.5, 0.5, 0.5]);
    }

    #[test]
    fn iq4_nl_levels_are_the_nearest_upper_on_ties() {
        assert_eq!(nearest_iq4_nl_level(-200.0), 0);
        assert_eq!(nearest_iq4_nl_level(-115.6), 0);
        assert_eq!(nearest_iq4_nl_level(-115.5), 1, "tie of −127 and −104");
        assert_eq!(nearest_iq4_nl_level(-4.5), 8, "tie of −10 and 1");
        assert_eq!(nearest_iq4_nl_level(100.9), 14);
        assert_eq!(nearest_iq4_nl_level(101.0), 15, "tie of 89 and 113");
        assert_eq!(nearest_iq4_nl_level(500.0), 15);
    }

    #[test]
    fn zero_signs_in_a_block_of_zeros_follow_ggml_c() {
        let mut x = [0f32; 32];
        x[0] = -0.0;
        // ggml: max stays +0, so d = +0 / −8 = −0 (f16 0x8000).
        assert_eq!(&quantized(GgufDtype::Q4_0, &x)[..2], &[0x00, 0x80]);
        // ggml: min = max = the first zero (−0), d = (−0 − −0) / 15 = +0.
        let b = quantized(GgufDtype::Q4_1, &x);
        assert_eq!(&b[..4], &[0x00, 0x00, 0x00, 0x80]);
    }

    #[test]
    fn an_all_zero_block_decodes_to_zeros() {
        for dtype in QUANTIZABLE {
            let b = quantized(dtype, &[0.0; 64]);
            assert_eq!(dequantize(dtype, &b).unwrap(), vec![0.0; 64], "{dtype}");
        }
    }

    #[test]
    fn decoding_is_within_a_step_of_each_value() {
        // Half a step where the levels span the block, a whole step on the
        // side a symmetric format clips (levels −8..7 · d with d = max / −8
        // reach only 7/8 of the largest magnitude on the other side); plus
        // the rounding of the scale and minimum to f16.
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        for (dtype, levels, slack) in [
            (GgufDtype::Q8_0, 254.0, 0.5),
            (GgufDtype::Q4_0, 16.0, 1.0),
            (GgufDtype::Q4_1, 15.0, 0.5),
            (GgufDtype::Q5_0, 32.0, 1.0),
            (GgufDtype::Q5_1, 31.0, 0.5),
            (GgufDtype::IQ4_NL, 10.0, 1.0),
        ] {
            let y = dequantize(dtype, &quantized(dtype, &x)).unwrap();
            for (block, (xs, ys)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
                let (hi, lo) = xs
                    .iter()
                    .fold((f32::MIN, f32::MAX), |(h, l), &v| (h.max(v), l.min(v)));
                let amax = hi.abs().max(lo.abs());
                let span = if matches!(dtype, GgufDtype::Q4_1 | GgufDtype::Q5_1) {
                    hi - lo
                } else {
                    2.0 * amax
                };
                let bound = slack * span / levels + amax / 512.0;
                for (a, b) in xs.iter().zip(ys) {
                    assert!((a - b).abs() <= bound, "{dtype} block {block}: {a} → {b}");
                }
            }
        }
    }

    #[test]
    fn other_types_and_partial_blocks_are_refused() {
        let mut out = [0u8; 34];
        assert_eq!(
            quantize_into(GgufDtype::Q6_K, &[0.0; 32], &mut out),
            Err(QuantizeError::Unsupported(GgufDtype::Q6_K))
        );
        assert!(matches!(
            quantize_into(GgufDtype::Q8_0, &[0.0; 31], &mut out),
            Err(QuantizeError::Size { .. })
        ));
    }
}
