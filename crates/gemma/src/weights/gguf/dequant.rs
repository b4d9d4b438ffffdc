//! Dequantization of ggml blocks to f32, in parallel over blocks.
//!
//! Each decoder follows ggml's reference `dequantize_row_*` (and the `gguf`
//! Python package, which our tests compare against bit for bit): the same
//! f32 operations in the same order, with no fused multiply-adds, so the
//! results are identical, not merely close.

use half::f16;
use rayon::prelude::*;

use super::dtype::GgufDtype;

/// Why raw bytes could not be dequantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DequantError {
    /// The type has no decoder here.
    #[error("type {0} cannot be dequantized by this reader")]
    Unsupported(GgufDtype),
    /// The bytes do not split into whole blocks.
    #[error("{len} bytes are not a whole number of {dtype} blocks of {type_size} bytes")]
    PartialBlock {
        /// The type.
        dtype: GgufDtype,
        /// Bytes given.
        len: usize,
        /// Bytes per block of that type.
        type_size: u64,
    },
}

/// Blocks handed to one rayon task at least, so that tiny blocks do not drown in scheduling.
const MIN_BLOCKS_PER_TASK: usize = 512;

/// Converts `bytes`, a whole number of `dtype` blocks, to f32 values in storage order.
pub fn dequantize(dtype: GgufDtype, bytes: &[u8]) -> Result<Vec<f32>, DequantError> {
    use GgufDtype::*;
    let type_size = dtype.type_size();
    if !(bytes.len() as u64).is_multiple_of(type_size) {
        return Err(DequantError::PartialBlock {
            dtype,
            len: bytes.len(),
            type_size,
        });
    }
    let n_blocks = bytes.len() / type_size as usize;
    let mut out = vec![0f32; n_blocks * dtype.block_size() as usize];
    match dtype {
        F32 => run(bytes, &mut out, |b: &[u8; 4], o: &mut [f32; 1]| {
            o[0] = f32::from_le_bytes(*b)
        }),
        F16 => run(bytes, &mut out, |b: &[u8; 2], o: &mut [f32; 1]| {
            o[0] = f16_at(b, 0)
        }),
        BF16 => run(bytes, &mut out, |b: &[u8; 2], o: &mut [f32; 1]| {
            o[0] = f32::from_bits(u32::from(u16::from_le_bytes(*b)) << 16)
        }),
        Q4_0 => run(bytes, &mut out, q4_0),
        Q4_1 => run(bytes, &mut out, q4_1),
        Q5_0 => run(bytes, &mut out, q5_0),
        Q5_1 => run(bytes, &mut out, q5_1),
        Q8_0 => run(bytes, &mut out, q8_0),
        Q2_K => run(bytes, &mut out, q2_k),
        Q3_K => run(bytes, &mut out, q3_k),
        Q4_K => run(bytes, &mut out, q4_k),
        Q5_K => run(bytes, &mut out, q5_k),
        Q6_K => run(bytes, &mut out, q6_k),
        other => return Err(DequantError::Unsupported(other)),
    }
    Ok(out)
}

/// Applies a block decoder to every block, in parallel. `bytes` holds whole
/// blocks of `N` bytes and `out` room for `B` values per block.
fn run<const N: usize, const B: usize>(
    bytes: &[u8],
    out: &mut [f32],
    decode: impl Fn(&[u8; N], &mut [f32; B]) + Sync,
) {
    bytes
        .par_chunks_exact(N)
        .zip(out.par_chunks_exact_mut(B))
        .with_min_len(MIN_BLOCKS_PER_TASK)
        .for_each(|(block, values)| {
            // Both conversions succeed: the chunks have exactly N and B elements.
            if let (Ok(block), Ok(values)) = (block.try_into(), values.try_into()) {
                decode(block, values);
            }
        });
}

/// The little-endian f16 at byte `at` of a block, widened to f32.
#[inline(always)]
fn f16_at<const N: usize>(block: &[u8; N], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([block[at], block[at + 1]])).to_f32()
}

/// Q4_0: f16 scale `d`, then 16 bytes of nibbles; value = d * (q - 8).
/// Low nibbles are elements 0..16, high nibbles 16..32.
#[inline(always)]
pub(super) fn q4_0(b: &[u8; 18], out: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        out[j] = d * (i32::from(q & 0x0F) - 8) as f32;
        out[j + 16] = d * (i32::from(q >> 4) - 8) as f32;
    }
}

/// Q4_1: f16 scale `d` and minimum `m`, then nibbles as in Q4_0; value = d * q + m.
#[inline(always)]
pub(super) fn q4_1(b: &[u8; 20], out: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    for j in 0..16 {
        let q = b[4 + j];
        out[j] = d * f32::from(q & 0x0F) + m;
        out[j + 16] = d * f32::from(q >> 4) + m;
    }
}

/// Q5_0: f16 scale, 32 high bits (u32, bit j for element j), 16 bytes of low nibbles;
/// value = d * (q - 16).
#[inline(always)]
fn q5_0(b: &[u8; 22], out: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for j in 0..16 {
        let q = b[6 + j];
        let lo = u32::from(q & 0x0F) | ((qh >> j) & 1) << 4;
        let hi = u32::from(q >> 4) | ((qh >> (j + 16)) & 1) << 4;
        out[j] = d * (lo as i32 - 16) as f32;
        out[j + 16] = d * (hi as i32 - 16) as f32;
    }
}

/// Q5_1: f16 scale and minimum, high bits and low nibbles as in Q5_0; value = d * q + m.
#[inline(always)]
pub(super) fn q5_1(b: &[u8; 24], out: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for j in 0..16 {
        let q = b[8 + j];
        let lo = u32::from(q & 0x0F) | ((qh >> j) & 1) << 4;
        let hi = u32::from(q >> 4) | ((qh >> (j + 16)) & 1) << 4;
        out[j] = d * lo as f32 + m;
        out[j + 16] = d * hi as f32 + m;
    }
}

/// Q8_0: f16 scale, 32 signed bytes; value = q * d.
#[inline(always)]
fn q8_0(b: &[u8; 34], out: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..]) {
        *o = f32::from(q as i8) * d;
    }
}

/// Q2_K: 16 scale bytes (low nibble scale, high nibble minimum, one per 16
/// elements), 64 bytes of 2-bit values, f16 `d`, f16 `dmin`.
/// Element `128 h + 32 s + l` is bits `2s..2s+2` of byte `32 h + l`;
/// value = (d * scale) * q - (dmin * min).
#[inline(always)]
pub(super) fn q2_k(b: &[u8; 84], out: &mut [f32; 256]) {
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    for (i, o) in out.iter_mut().enumerate() {
        let (h, s, l) = (i / 128, (i / 32) % 4, i % 32);
        let sc = b[i / 16];
        let dl = d * f32::from(sc & 0x0F);
        let ml = dmin * f32::from(sc >> 4);
        let q = (b[16 + 32 * h + l] >> (2 * s)) & 3;
        *o = dl * f32::from(q) - ml;
    }
}

/// Q3_K: 32 bytes of high-bit masks, 64 bytes of 2-bit values, 12 bytes of
/// 6-bit scales (one per 16 elements, stored minus 32), f16 `d`.
/// Element `128 h + 32 s + l` takes bits `2s..2s+2` of byte `32 h + l` and
/// high bit `4h + s` of mask byte `l`; a clear high bit subtracts 4.
/// value = (d * scale) * q.
#[inline(always)]
pub(super) fn q3_k(b: &[u8; 110], out: &mut [f32; 256]) {
    let d = f16_at(b, 108);
    let scales: &[u8] = &b[96..108];
    let mut dl = [0f32; 16];
    for (i, dl) in dl.iter_mut().enumerate() {
        let low = (scales[i % 8] >> (4 * (i / 8))) & 0x0F;
        let high = (scales[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        *dl = d * f32::from(((low | high << 4) as i8) - 32);
    }
    for (i, o) in out.iter_mut().enumerate() {
        let (h, s, l) = (i / 128, (i / 32) % 4, i % 32);
        let low = (b[32 + 32 * h + l] >> (2 * s)) & 3;
        let high_set = (b[l] >> (4 * h + s)) & 1 == 1;
        let q = low as i8 - if high_set { 0 } else { 4 };
        *o = dl[i / 16] * f32::from(q);
    }
}

/// The eight 6-bit (scale, min) pairs of a Q4_K/Q5_K super-block, from its 12 scale bytes.
#[inline(always)]
fn k_scales_mins(s: &[u8]) -> [(f32, f32); 8] {
    let mut pairs = [(0f32, 0f32); 8];
    for (j, pair) in pairs.iter_mut().enumerate() {
        let (sc, m) = if j < 4 {
            (s[j] & 0x3F, s[j + 4] & 0x3F)
        } else {
            (
                (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30),
                (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30),
            )
        };
        *pair = (f32::from(sc), f32::from(m));
    }
    pairs
}

/// Q4_K: f16 `d`, f16 `dmin`, 12 scale bytes, 128 bytes of nibbles. Sub-block
/// `2c + k` (32 elements) takes nibble `k` of bytes `32c..32c+32`;
/// value = (d * scale) * q - (dmin * min).
#[inline(always)]
pub(super) fn q4_k(b: &[u8; 144], out: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let pairs = k_scales_mins(&b[4..16]);
    for (sb, (values, &(sc, m))) in out.chunks_exact_mut(32).zip(&pairs).enumerate() {
        let (c, k) = (sb / 2, sb % 2);
        let (dl, ml) = (d * sc, dmin * m);
        for (o, &q) in values.iter_mut().zip(&b[16 + 32 * c..16 + 32 * c + 32]) {
            *o = dl * f32::from((q >> (4 * k)) & 0x0F) - ml;
        }
    }
}

/// Q5_K: as Q4_K with 32 bytes of high bits before the nibbles: sub-block `sb`
/// takes bit `sb` of high-bit byte `l` for its element `l`.
#[inline(always)]
pub(super) fn q5_k(b: &[u8; 176], out: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let pairs = k_scales_mins(&b[4..16]);
    let qh: &[u8] = &b[16..48];
    for (sb, (values, &(sc, m))) in out.chunks_exact_mut(32).zip(&pairs).enumerate() {
        let (c, k) = (sb / 2, sb % 2);
        let (dl, ml) = (d * sc, dmin * m);
        let low = &b[48 + 32 * c..48 + 32 * c + 32];
        for ((o, &ql), &h) in values.iter_mut().zip(low).zip(qh) {
            let q = ((ql >> (4 * k)) & 0x0F) | ((h >> sb) & 1) << 4;
            *o = dl * f32::from(q) - ml;
        }
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 signed scales
/// (one per 16 elements), f16 `d`. Element `128 h + 32 s + l` (s in 0..4) takes
/// nibble `s / 2` of low byte `64 h + 32 (s % 2) + l` and bits `2s..2s+2` of
/// high byte `32 h + l`; value = (d * scale) * (q - 32).
#[inline(always)]
pub(super) fn q6_k(b: &[u8; 210], out: &mut [f32; 256]) {
    let d = f16_at(b, 208);
    // Sixteen elements at a time share a scale: (h, s, half) name them.
    for h in 0..2 {
        for s in 0..4 {
            for half in 0..2 {
                let first = 128 * h + 32 * s + 16 * half;
                let scale = d * f32::from(b[192 + first / 16] as i8);
                let low = &b[64 * h + 32 * (s % 2) + 16 * half..][..16];
                let high = &b[128 + 32 * h + 16 * half..][..16];
                for ((o, &ql), &qh) in out[first..first + 16].iter_mut().zip(low).zip(high) {
                    let ql = (ql >> (4 * (s / 2))) & 0x0F;
                    let qh = (qh >> (2 * s)) & 0x03;
                    let q = (ql | qh << 4) as i8 - 32;
                    *o = scale * f32::from(q);
                }
            }
        }
    }
}
