//! The one description of ggml's block formats: each decoder turns a block's
//! bytes into small integers `q` and, for every 16 consecutive values, a
//! float scale and (for formats with a minimum) an offset, so that value `i`
//! is `scale[i / 16] · q[i] (+ offset[i / 16])`.
//!
//! Dequantization ([`super::dequantize`]) evaluates that expression in f32
//! with the scales and offsets computed as ggml's reference
//! `dequantize_row_*` computes them, so its values are bit for bit ggml's
//! (and the `gguf` Python package's). The products with activations
//! ([`super::rows_times`]) multiply the integers instead.

#![allow(non_camel_case_types)]

use half::f16;

/// Values per group: every format's scales and minimums are shared by
/// multiples of 16 consecutive values.
pub const GROUP: usize = 16;

/// One block decoded to integers: `G` groups of [`GROUP`] values.
#[derive(Debug, Clone, Copy)]
pub struct IntBlock<const G: usize> {
    /// The integer of each value, group by group, in storage order.
    pub q: [[i8; GROUP]; G],
    /// Each group's scale.
    pub scales: [f32; G],
    /// Each group's offset, added after scaling (formats with a minimum).
    pub offsets: Option<[f32; G]>,
}

impl<const G: usize> IntBlock<G> {
    /// Value `i` of group `g` in f32, as ggml computes it.
    #[inline(always)]
    pub fn value(&self, g: usize, i: usize) -> f32 {
        let scaled = self.scales[g] * f32::from(self.q[g][i]);
        match &self.offsets {
            Some(offsets) => scaled + offsets[g],
            None => scaled,
        }
    }
}

/// A block format: blocks of `N` bytes, each decoding to `G` groups. The
/// implementing types are names only; their decoders are inlined where
/// used.
pub trait Format<const N: usize, const G: usize>: Copy + Send + Sync {
    /// The block's integers, scales and offsets.
    fn decode(block: &[u8; N]) -> IntBlock<G>;
}

/// The little-endian f16 at byte `at` of a block, widened to f32.
#[inline(always)]
fn f16_at<const N: usize>(block: &[u8; N], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([block[at], block[at + 1]])).to_f32()
}

/// A block's `G` groups, group `g` from `group(g)` (for decoders that
/// unpack 16 values at once, see [`bytes16`]).
#[inline(always)]
fn groups<const G: usize>(group: impl Fn(usize) -> [i8; GROUP]) -> [[i8; GROUP]; G] {
    let mut out = [[0i8; GROUP]; G];
    for (g, values) in out.iter_mut().enumerate() {
        *values = group(g);
    }
    out
}

/// A block's `G` groups from a function of the value's index in the block
/// (for decoders that index bytes value by value).
#[inline(always)]
fn indexed<const G: usize>(q: impl Fn(usize) -> i8) -> [[i8; GROUP]; G] {
    let mut out = [[0i8; GROUP]; G];
    for (g, group) in out.iter_mut().enumerate() {
        for (i, v) in group.iter_mut().enumerate() {
            *v = q(GROUP * g + i);
        }
    }
    out
}

/// The 16 bytes of `b` from `at`, as one little-endian number: shifting it
/// right by `k` and masking every byte with [`NIBBLES`] or [`TWO_BITS`]
/// takes the field at bit `k` of each byte (k < 8), for 16
/// values at once.
#[inline(always)]
fn bytes16(b: &[u8], at: usize) -> u128 {
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&b[at..at + 16]);
    u128::from_le_bytes(bytes)
}

/// The low nibble of every byte.
const NIBBLES: u128 = 0x0F0F_0F0F_0F0F_0F0F_0F0F_0F0F_0F0F_0F0F;
/// The low two bits of every byte.
const TWO_BITS: u128 = 0x0303_0303_0303_0303_0303_0303_0303_0303;

/// The 16 bytes of `fields` as signed values, `minus` subtracted.
#[inline(always)]
fn signed(fields: u128, minus: i8) -> [i8; GROUP] {
    fields.to_le_bytes().map(|v| (v as i8).wrapping_sub(minus))
}

/// Q4_0: f16 scale `d`, then 16 bytes of nibbles; value = d · (q − 8).
/// Low nibbles are values 0..16, high nibbles 16..32.
#[derive(Debug, Clone, Copy)]
pub struct Q4_0;

impl Format<18, 2> for Q4_0 {
    #[inline(always)]
    fn decode(b: &[u8; 18]) -> IntBlock<2> {
        let d = f16_at(b, 0);
        IntBlock {
            q: indexed(|i| ((b[2 + i % 16] >> (4 * (i / 16))) & 0x0F) as i8 - 8),
            scales: [d; 2],
            offsets: None,
        }
    }
}

/// IQ4_NL's 16 levels (ggml's `kvalues_iq4nl`): a nonlinear grid, denser
/// near zero.
pub const IQ4_NL_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// IQ4_NL: f16 scale `d`, then nibbles as in Q4_0 indexing
/// [`IQ4_NL_LEVELS`]; value = d · level.
#[derive(Debug, Clone, Copy)]
pub struct IQ4_NL;

impl Format<18, 2> for IQ4_NL {
    #[inline(always)]
    fn decode(b: &[u8; 18]) -> IntBlock<2> {
        IntBlock {
            q: indexed(|i| IQ4_NL_LEVELS[usize::from((b[2 + i % 16] >> (4 * (i / 16))) & 0x0F)]),
            scales: [f16_at(b, 0); 2],
            offsets: None,
        }
    }
}

/// Q4_1: f16 scale `d` and minimum `m`, then nibbles as in Q4_0; value =
/// d · q + m.
#[derive(Debug, Clone, Copy)]
pub struct Q4_1;

impl Format<20, 2> for Q4_1 {
    #[inline(always)]
    fn decode(b: &[u8; 20]) -> IntBlock<2> {
        IntBlock {
            q: indexed(|i| ((b[4 + i % 16] >> (4 * (i / 16))) & 0x0F) as i8),
            scales: [f16_at(b, 0); 2],
            offsets: Some([f16_at(b, 2); 2]),
        }
    }
}

/// The five-bit value `i` of a Q5_0/Q5_1 block: its nibble from `low` and
/// bit `i` of `high`.
#[inline(always)]
fn five_bits(low: &[u8], high: u32, i: usize) -> u8 {
    ((low[i % 16] >> (4 * (i / 16))) & 0x0F) | (((high >> i) & 1) << 4) as u8
}

/// Q5_0: f16 scale, 32 high bits (a u32, bit i for value i), 16 bytes of
/// low nibbles; value = d · (q − 16).
#[derive(Debug, Clone, Copy)]
pub struct Q5_0;

impl Format<22, 2> for Q5_0 {
    #[inline(always)]
    fn decode(b: &[u8; 22]) -> IntBlock<2> {
        let high = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        IntBlock {
            q: indexed(|i| five_bits(&b[6..], high, i) as i8 - 16),
            scales: [f16_at(b, 0); 2],
            offsets: None,
        }
    }
}

/// Q5_1: f16 scale and minimum, high bits and low nibbles as in Q5_0;
/// value = d · q + m.
#[derive(Debug, Clone, Copy)]
pub struct Q5_1;

impl Format<24, 2> for Q5_1 {
    #[inline(always)]
    fn decode(b: &[u8; 24]) -> IntBlock<2> {
        let high = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        IntBlock {
            q: indexed(|i| five_bits(&b[8..], high, i) as i8),
            scales: [f16_at(b, 0); 2],
            offsets: Some([f16_at(b, 2); 2]),
        }
    }
}

/// Q8_0: f16 scale, 32 signed bytes; value = q · d.
#[derive(Debug, Clone, Copy)]
pub struct Q8_0;

impl Format<34, 2> for Q8_0 {
    #[inline(always)]
    fn decode(b: &[u8; 34]) -> IntBlock<2> {
        IntBlock {
            q: indexed(|i| b[2 + i] as i8),
            scales: [f16_at(b, 0); 2],
            offsets: None,
        }
    }
}

/// Q2_K: 16 scale bytes (low nibble scale, high nibble minimum, one per
/// group), 64 bytes of 2-bit values, f16 `d`, f16 `dmin`. Value `128 h +
/// 32 s + l` is bits `2s..2s+2` of byte `32 h + l`; value = (d · scale) · q
/// − (dmin · min).
#[derive(Debug, Clone, Copy)]
pub struct Q2_K;

impl Format<84, 16> for Q2_K {
    #[inline(always)]
    fn decode(b: &[u8; 84]) -> IntBlock<16> {
        let d = f16_at(b, 80);
        let dmin = f16_at(b, 82);
        IntBlock {
            q: indexed(|i| {
                let (h, s, l) = (i / 128, (i / 32) % 4, i % 32);
                ((b[16 + 32 * h + l] >> (2 * s)) & 3) as i8
            }),
            scales: std::array::from_fn(|g| d * f32::from(b[g] & 0x0F)),
            offsets: Some(std::array::from_fn(|g| -(dmin * f32::from(b[g] >> 4)))),
        }
    }
}

/// Q3_K: 32 bytes of high-bit masks, 64 bytes of 2-bit values, 12 bytes of
/// 6-bit scales (one per group, stored plus 32), f16 `d`. Value `128 h +
/// 32 s + l` takes bits `2s..2s+2` of byte `32 h + l` and high bit `4h + s`
/// of mask byte `l`; a clear high bit subtracts 4. value = (d · scale) · q.
#[derive(Debug, Clone, Copy)]
pub struct Q3_K;

impl Format<110, 16> for Q3_K {
    #[inline(always)]
    fn decode(b: &[u8; 110]) -> IntBlock<16> {
        let d = f16_at(b, 108);
        let scales: &[u8] = &b[96..108];
        IntBlock {
            q: indexed(|i| {
                let (h, s, l) = (i / 128, (i / 32) % 4, i % 32);
                let low = (b[32 + 32 * h + l] >> (2 * s)) & 3;
                let high_set = (b[l] >> (4 * h + s)) & 1 == 1;
                low as i8 - if high_set { 0 } else { 4 }
            }),
            scales: std::array::from_fn(|g| {
                let low = (scales[g % 8] >> (4 * (g / 8))) & 0x0F;
                let high = (scales[8 + g % 4] >> (2 * (g / 4))) & 0x03;
                d * f32::from(((low | high << 4) as i8) - 32)
            }),
            offsets: None,
        }
    }
}

/// The eight 6-bit (scale, min) pairs of a Q4_K/Q5_K block (one per 32
/// values), from its 12 scale bytes.
#[inline(always)]
fn k_scales_mins(s: &[u8]) -> [(u8, u8); 8] {
    std::array::from_fn(|j| {
        if j < 4 {
            (s[j] & 0x3F, s[j + 4] & 0x3F)
        } else {
            (
                (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30),
                (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30),
            )
        }
    })
}

/// The scales and offsets of a Q4_K/Q5_K block, per group of 16: (d ·
/// scale) and −(dmin · min) of the group's 32-value sub-block.
#[inline(always)]
fn k_groups(b: &[u8], d: f32, dmin: f32) -> ([f32; 16], [f32; 16]) {
    let pairs = k_scales_mins(&b[4..16]);
    (
        std::array::from_fn(|g| d * f32::from(pairs[g / 2].0)),
        std::array::from_fn(|g| -(dmin * f32::from(pairs[g / 2].1))),
    )
}

/// Q4_K: f16 `d`, f16 `dmin`, 12 scale bytes, 128 bytes of nibbles.
/// Sub-block `2c + k` (32 values) takes nibble `k` of bytes `32c..32c+32`;
/// value = (d · scale) · q − (dmin · min).
#[derive(Debug, Clone, Copy)]
pub struct Q4_K;

impl Format<144, 16> for Q4_K {
    #[inline(always)]
    fn decode(b: &[u8; 144]) -> IntBlock<16> {
        let (scales, offsets) = k_groups(b, f16_at(b, 0), f16_at(b, 2));
        IntBlock {
            q: indexed(|i| {
                let (c, k, l) = (i / 64, (i / 32) % 2, i % 32);
                ((b[16 + 32 * c + l] >> (4 * k)) & 0x0F) as i8
            }),
            scales,
            offsets: Some(offsets),
        }
    }
}

/// Q5_K: as Q4_K with 32 bytes of high bits before the nibbles: sub-block
/// `sb` takes bit `sb` of high-bit byte `l` for its value `l`.
#[derive(Debug, Clone, Copy)]
pub struct Q5_K;

impl Format<176, 16> for Q5_K {
    #[inline(always)]
    fn decode(b: &[u8; 176]) -> IntBlock<16> {
        let (scales, offsets) = k_groups(b, f16_at(b, 0), f16_at(b, 2));
        IntBlock {
            q: indexed(|i| {
                let (sb, l) = (i / 32, i % 32);
                let (c, k) = (sb / 2, sb % 2);
                let low = (b[48 + 32 * c + l] >> (4 * k)) & 0x0F;
                (low | ((b[16 + l] >> sb) & 1) << 4) as i8
            }),
            scales,
            offsets: Some(offsets),
        }
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 signed
/// scales (one per group), f16 `d`. Value `128 h + 32 s + l` (s in 0..4)
/// takes nibble `s / 2` of low byte `64 h + 32 (s % 2) + l` and bits
/// `2s..2s+2` of high byte `32 h + l`; value = (d · scale) · (q − 32).
#[derive(Debug, Clone, Copy)]
pub struct Q6_K;

impl Format<210, 16> for Q6_K {
    #[inline(always)]
    fn decode(b: &[u8; 210]) -> IntBlock<16> {
        let d = f16_at(b, 208);
        IntBlock {
            q: groups(|g| {
                let (h, s, half) = (g / 8, (g / 2) % 4, g % 2);
                let low = bytes16(b, 64 * h + 32 * (s % 2) + GROUP * half) >> (4 * (s / 2));
                let high = bytes16(b, 128 + 32 * h + GROUP * half) >> (2 * s);
                signed((low & NIBBLES) | (high & TWO_BITS) << 4, 32)
            }),
            scales: std::array::from_fn(|g| d * f32::from(b[192 + g] as i8)),
            offsets: None,
        }
    }
}
