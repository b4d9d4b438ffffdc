//! TurboQuant storage of key or value vectors (Zandieh et al., "TurboQuant:
//! Online Vector Quantization with Near-optimal Distortion Rate", ICLR 2026),
//! as the llama.cpp TurboQuant fork stores it.
//!
//! Each group of [`TURBO_GROUP`] values of a vector `x` is encoded on its own:
//! its length `g = ‖x‖₂`, the unit vector `u = x / g` rotated by
//! `y = D(s2)·(H/√128)·D(s1)·u` ([`rotate`]; `H` the Walsh–Hadamard matrix,
//! `D(s)` fixed ±1 signs), each `y_j` replaced by the index of its codebook
//! centroid (the count of midpoints at or below it), and one float16 norm
//! `g / ‖c[idx]‖₂` so that the decoded group keeps the length of `x`.
//!
//! Decoding gives `c[idx]·norm` in the rotated domain: attention rotates its
//! queries the same way when keys are stored so (the rotation is orthogonal,
//! so the scores do not change) and rotates its output back ([`unrotate`])
//! when values are.

use mlx_core::{concatenate, where_, Array, Dtype};

use super::error::CacheError;

/// Values per independently encoded group.
pub const TURBO_GROUP: i32 = 128;

/// The signs `s1` applied before the Hadamard transform: byte k, bit j is
/// element 8k + j, a set bit means −1 (numpy's
/// `default_rng(42).choice([-1., 1.], 128)`, first draw).
pub const SIGNS_BEFORE: [u8; 16] = [
    0x59, 0x03, 0x6a, 0xe4, 0x49, 0x59, 0xf8, 0x42, 0xbb, 0x3b, 0xc6, 0xa4, 0xa9, 0x50, 0xf2, 0x49,
];

/// The signs `s2` applied after the Hadamard transform (second draw).
pub const SIGNS_AFTER: [u8; 16] = [
    0x90, 0xee, 0xac, 0x16, 0xdc, 0x8f, 0x62, 0x3f, 0x7a, 0x35, 0xa5, 0xb7, 0x62, 0x65, 0xa5, 0xbe,
];

/// The positive half of each codebook (the negative half mirrors it).
fn half_codebook(bits: i32) -> &'static [f32] {
    match bits {
        2 => &[0.039994, 0.133462],
        3 => &[0.021460, 0.065717, 0.117832, 0.190685],
        _ => &[
            0.006938, 0.020989, 0.035597, 0.051262, 0.068756, 0.089527, 0.117195, 0.173926,
        ],
    }
}

/// The positive midpoints between centroids (0 and the mirrored ones join them).
fn half_midpoints(bits: i32) -> &'static [f32] {
    match bits {
        2 => &[0.086728],
        3 => &[0.043589, 0.091775, 0.154259],
        _ => &[
            0.013963, 0.028293, 0.043430, 0.060009, 0.079142, 0.103361, 0.145560,
        ],
    }
}

/// The `2^bits` centroids, ascending (index 0 the most negative).
pub fn codebook(bits: i32) -> Vec<f32> {
    let half = half_codebook(bits);
    half.iter()
        .rev()
        .map(|c| -c)
        .chain(half.iter().copied())
        .collect()
}

/// The `2^bits − 1` midpoints, ascending.
pub fn midpoints(bits: i32) -> Vec<f32> {
    let half = half_midpoints(bits);
    half.iter()
        .rev()
        .map(|m| -m)
        .chain(std::iter::once(0.0))
        .chain(half.iter().copied())
        .collect()
}

/// Packed bytes of one group's indices: 32 (2-bit), 48 (3-bit: 32 bytes of
/// low bits, 16 of high bits) or 64 (4-bit).
pub fn packed_group_bytes(bits: i32) -> i32 {
    TURBO_GROUP * bits / 8
}

/// Checks that TurboQuant can store vectors of `dim` values in `bits`.
pub fn validate(bits: i32, dim: i32) -> Result<(), CacheError> {
    if ![2, 3, 4].contains(&bits) {
        return Err(CacheError::Format(format!(
            "turbo{bits} is not a TurboQuant format (accepted: turbo2, turbo3, turbo4)"
        )));
    }
    if dim % TURBO_GROUP != 0 {
        return Err(CacheError::Format(format!(
            "head dimension {dim} is not a multiple of {TURBO_GROUP}, the TurboQuant group \
             (turbo{bits} encodes whole groups of {TURBO_GROUP} values and pads nothing)"
        )));
    }
    Ok(())
}

/// Vectors stored in TurboQuant: packed centroid indices and one norm per
/// group, with the leading axes of the vectors they stand for.
#[derive(Debug, Clone)]
pub struct TurboArray {
    /// uint8 `[..., groups · packed_group_bytes(bits)]`.
    pub packed: Array,
    /// float16 `[..., groups]`.
    pub norms: Array,
    /// 2, 3 or 4.
    pub bits: i32,
}

impl TurboArray {
    /// Encodes the last axis of `x` (a multiple of [`TURBO_GROUP`] values).
    pub fn encode(x: &Array, bits: i32) -> Result<TurboArray, CacheError> {
        let shape = x.shape();
        let dim = shape.last().copied().unwrap_or(0);
        validate(bits, dim)?;
        let groups = grouped(x.astype(Dtype::Float32)?)?;
        let length = groups.square()?.sum(&[-1], true)?.sqrt()?;
        let unit = divide_if_positive(&groups, &length, &Array::scalar(0.0, Dtype::Float32)?)?;
        let rotated = rotate_groups(&unit)?;
        let indices = centroid_indices(&rotated, bits)?;
        let centroids = codebook_array(bits)?.take(&indices, 0)?;
        let centroid_length = centroids.square()?.sum(&[-1], true)?.sqrt()?;
        let norms = divide_if_positive(&length, &centroid_length, &length)?
            .squeeze(&[-1])?
            .astype(Dtype::Float16)?;
        let mut packed_shape = shape;
        if let Some(last) = packed_shape.last_mut() {
            *last = dim / TURBO_GROUP * packed_group_bytes(bits);
        }
        let packed = pack(&indices, bits)?.reshape(&packed_shape)?;
        Ok(TurboArray {
            packed,
            norms,
            bits,
        })
    }

    /// The centroid indices, uint8 `[..., groups, 128]`.
    pub fn indices(&self) -> Result<Array, CacheError> {
        let mut shape = self.packed.shape();
        let groups = self.norms.dim(-1)?;
        shape.pop();
        shape.extend([groups, packed_group_bytes(self.bits)]);
        unpack(&self.packed.reshape(&shape)?, self.bits)
    }

    /// The vectors as stored, in the rotated domain: `c[idx]·norm`, in
    /// `dtype`, `[..., groups · 128]`.
    pub fn decode_rotated(&self, dtype: Dtype) -> Result<Array, CacheError> {
        let indices = self.indices()?;
        let values = codebook_array(self.bits)?
            .take(&indices, 0)?
            .multiply(&self.norms.astype(Dtype::Float32)?.expand_dims(&[-1])?)?;
        Ok(values.flatten(-2, -1)?.astype(dtype)?)
    }

    /// The vectors as stored, rotated back to the original domain.
    pub fn decode(&self, dtype: Dtype) -> Result<Array, CacheError> {
        unrotate(&self.decode_rotated(Dtype::Float32)?)?
            .astype(dtype)
            .map_err(CacheError::from)
    }

    /// Bytes held: the packed indices and the norms.
    pub fn nbytes(&self) -> usize {
        self.packed.nbytes() + self.norms.nbytes()
    }
}

/// `y = D(s2)·(H/√128)·D(s1)·x` on each 128-value group of the last axis,
/// computed in float32 and returned in `x`'s dtype.
pub fn rotate(x: &Array) -> Result<Array, CacheError> {
    regroup(x, rotate_groups)
}

/// The inverse of [`rotate`]: `x = D(s1)·(H/√128)·D(s2)·y`.
pub fn unrotate(y: &Array) -> Result<Array, CacheError> {
    regroup(y, |g| {
        Ok(g.multiply(&signs(&SIGNS_AFTER)?)?
            .hadamard_transform(hadamard_scale())?
            .multiply(&signs(&SIGNS_BEFORE)?)?)
    })
}

/// Applies `f` to `x`'s last axis cut into 128-value groups, in float32.
fn regroup(
    x: &Array,
    f: impl Fn(&Array) -> Result<Array, CacheError>,
) -> Result<Array, CacheError> {
    let dim = x.dim(-1)?;
    if dim % TURBO_GROUP != 0 {
        return Err(CacheError::Format(format!(
            "cannot rotate vectors of {dim} values in groups of {TURBO_GROUP}"
        )));
    }
    let out = f(&grouped(x.astype(Dtype::Float32)?)?)?;
    Ok(out.flatten(-2, -1)?.astype(x.dtype())?)
}

/// The forward rotation of float32 groups `[..., 128]`.
fn rotate_groups(groups: &Array) -> Result<Array, CacheError> {
    Ok(groups
        .multiply(&signs(&SIGNS_BEFORE)?)?
        .hadamard_transform(hadamard_scale())?
        .multiply(&signs(&SIGNS_AFTER)?)?)
}

/// The centroid index of each rotated value: how many midpoints lie at or
/// below it (a value on a midpoint goes up), int32.
fn centroid_indices(rotated: &Array, bits: i32) -> Result<Array, CacheError> {
    let mids = Array::from_slice(&midpoints(bits), &[(1 << bits) - 1])?;
    Ok(rotated
        .expand_dims(&[-1])?
        .greater_equal(&mids)?
        .sum(&[-1], false)?
        .astype(Dtype::Int32)?)
}

/// 1/√128 in float32, the scale that makes the transform orthogonal.
pub(crate) fn hadamard_scale() -> f32 {
    1.0 / (TURBO_GROUP as f32).sqrt()
}

/// The ±1 signs of a bit table as a float32 `[128]` array.
fn signs(table: &[u8; 16]) -> Result<Array, CacheError> {
    let values: Vec<f32> = (0..TURBO_GROUP as usize)
        .map(|i| {
            if table[i / 8] >> (i % 8) & 1 == 1 {
                -1.0
            } else {
                1.0
            }
        })
        .collect();
    Ok(Array::from_slice(&values, &[TURBO_GROUP])?)
}

fn codebook_array(bits: i32) -> Result<Array, CacheError> {
    Ok(Array::from_slice(&codebook(bits), &[1 << bits])?)
}

/// `x`'s last axis split into `[groups, 128]`.
fn grouped(x: Array) -> Result<Array, CacheError> {
    let mut shape = x.shape();
    let dim = shape.pop().unwrap_or(0);
    shape.extend([dim / TURBO_GROUP, TURBO_GROUP]);
    Ok(x.reshape(&shape)?)
}

/// `a / b` where `b > 1e-10`, `otherwise` elsewhere (the format's guard
/// against zero lengths).
fn divide_if_positive(a: &Array, b: &Array, otherwise: &Array) -> Result<Array, CacheError> {
    let positive = b.greater(&Array::scalar(1e-10, Dtype::Float32)?)?;
    let safe = where_(&positive, b, &Array::scalar(1.0, Dtype::Float32)?)?;
    Ok(where_(&positive, &a.divide(&safe)?, otherwise)?)
}

/// Packs int32 indices `[..., 128]` of `bits` bits into uint8
/// `[..., packed_group_bytes(bits)]`: 2-bit indices four to a byte (element
/// 4k + j in bits 2j of byte k), 4-bit two to a byte, 3-bit as the 2-bit
/// packing of the low bits followed by the high bits eight to a byte.
fn pack(indices: &Array, bits: i32) -> Result<Array, CacheError> {
    Ok(match bits {
        3 => {
            let four = Array::scalar(4.0, Dtype::Int32)?;
            let low = pack_fields(&indices.remainder(&four)?, 2)?;
            let high = pack_fields(&indices.floor_divide(&four)?, 1)?;
            concatenate(&[&low, &high], -1)?
        }
        _ => pack_fields(indices, bits)?,
    })
}

/// Packs fields of `width` bits, `8 / width` to a byte, the first in the
/// lowest bits.
fn pack_fields(fields: &Array, width: i32) -> Result<Array, CacheError> {
    let per_byte = 8 / width;
    let weights: Vec<i32> = (0..per_byte).map(|j| 1 << (width * j)).collect();
    let mut shape = fields.shape();
    let n = shape.pop().unwrap_or(0);
    shape.extend([n / per_byte, per_byte]);
    Ok(fields
        .reshape(&shape)?
        .multiply(&Array::from_slice(&weights, &[per_byte])?)?
        .sum(&[-1], false)?
        .astype(Dtype::Uint8)?)
}

/// The inverse of [`pack`]: uint8 `[..., packed_group_bytes(bits)]` to
/// uint8 indices `[..., 128]`.
fn unpack(packed: &Array, bits: i32) -> Result<Array, CacheError> {
    Ok(match bits {
        3 => {
            let low = unpack_fields(&last_axis(packed, 0, 32)?, 2)?;
            let high = unpack_fields(&last_axis(packed, 32, 48)?, 1)?;
            low.add(&high.multiply(&Array::scalar(4.0, Dtype::Uint8)?)?)?
        }
        _ => unpack_fields(packed, bits)?,
    })
}

/// Fields of `width` bits out of bytes `[..., n]`: `[..., n · 8 / width]`.
fn unpack_fields(bytes: &Array, width: i32) -> Result<Array, CacheError> {
    let per_byte = 8 / width;
    let divisors: Vec<u8> = (0..per_byte).map(|j| 1u8 << (width * j)).collect();
    let modulus = Array::scalar(f64::from(1u32 << width), Dtype::Uint8)?;
    Ok(bytes
        .expand_dims(&[-1])?
        .floor_divide(&Array::from_slice(&divisors, &[per_byte])?)?
        .remainder(&modulus)?
        .flatten(-2, -1)?)
}

/// `x[..., start:stop]`.
fn last_axis(x: &Array, start: i32, stop: i32) -> Result<Array, CacheError> {
    let shape = x.shape();
    let n = shape.len();
    let mut begin = vec![0; n];
    let mut end = shape.clone();
    begin[n - 1] = start;
    end[n - 1] = stop;
    Ok(x.slice(&begin, &end, &vec![1; n])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode_one(x: &[f32], bits: i32) -> (Vec<u8>, f32) {
        let t =
            TurboArray::encode(&Array::from_slice(x, &[1, x.len() as i32]).unwrap(), bits).unwrap();
        let idx = t.indices().unwrap().to_vec::<u8>().unwrap();
        let norm = t
            .norms
            .astype(Dtype::Float32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()[0];
        (idx, norm)
    }

    #[test]
    fn codebooks_and_midpoints_are_ascending_and_interleaved() {
        for bits in [2, 3, 4] {
            let (c, m) = (codebook(bits), midpoints(bits));
            assert_eq!((c.len(), m.len()), (1 << bits, (1 << bits) - 1));
            for (j, mid) in m.iter().enumerate() {
                assert!(c[j] < *mid && *mid < c[j + 1], "turbo{bits} midpoint {j}");
            }
        }
    }

    #[test]
    fn the_sign_tables_have_the_published_first_bytes() {
        // s1 = 59 03 …: element 0 is −1 (bit 0 of 0x59), element 1 is +1.
        let s1 = signs(&SIGNS_BEFORE).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(&s1[..8], &[-1.0, 1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 1.0]);
        let s2 = signs(&SIGNS_AFTER).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(&s2[..8], &[1.0, 1.0, 1.0, 1.0, -1.0, 1.0, 1.0, -1.0]);
    }

    #[test]
    fn a_vector_along_one_axis_rotates_to_equal_magnitudes() {
        // x = 3·e0: every rotated value is ±1/√128 = ±0.0884, above the
        // 2-bit midpoint 0.086728 in magnitude: indices 0 or 3 only, with
        // the sign of s2[j]·s1[0] (s1[0] = −1).
        let mut x = vec![0.0f32; 128];
        x[0] = 3.0;
        let (idx, norm) = encode_one(&x, 2);
        let s2 = signs(&SIGNS_AFTER).unwrap().to_vec::<f32>().unwrap();
        for (j, &i) in idx.iter().enumerate() {
            assert_eq!(i, if -s2[j] > 0.0 { 3 } else { 0 }, "element {j}");
        }
        // ‖c[idx]‖ = 0.133462·√128, so norm = 3 / 1.509906 = 1.98688 → fp16.
        let expected = half::f16::from_f32(3.0 / (0.133462f32 * 128f32.sqrt())).to_f32();
        assert_eq!(norm, expected);
    }

    #[test]
    fn a_zero_vector_sits_on_the_zero_midpoint_and_keeps_norm_zero() {
        // y = 0 everywhere: the midpoint 0 counts (a value on a midpoint
        // goes up), so the index is the first positive centroid.
        for bits in [2, 3, 4] {
            let (idx, norm) = encode_one(&[0.0; 128], bits);
            assert!(
                idx.iter().all(|&i| i as i32 == 1 << (bits - 1)),
                "turbo{bits}"
            );
            assert_eq!(norm, 0.0);
        }
    }

    #[test]
    fn values_on_a_midpoint_go_up() {
        for bits in [2, 3, 4] {
            let m = midpoints(bits);
            let y = Array::from_slice(&m, &[1, m.len() as i32]).unwrap();
            let idx = centroid_indices(&y, bits).unwrap().to_vec::<i32>().unwrap();
            let expected: Vec<i32> = (1..=m.len() as i32).collect();
            assert_eq!(idx, expected, "turbo{bits}");
        }
    }

    #[test]
    fn decoding_keeps_each_groups_length() {
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let xa = Array::from_slice(&x, &[1, 256]).unwrap();
        for bits in [2, 3, 4] {
            let decoded = TurboArray::encode(&xa, bits)
                .unwrap()
                .decode(Dtype::Float32)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            for g in 0..2 {
                let part = |v: &[f32]| {
                    v[g * 128..(g + 1) * 128]
                        .iter()
                        .map(|a| a * a)
                        .sum::<f32>()
                        .sqrt()
                };
                let (a, b) = (part(&x), part(&decoded));
                assert!(
                    (a - b).abs() / a < 1e-3,
                    "turbo{bits} group {g}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn packing_round_trips_every_index() {
        for bits in [2, 3, 4] {
            let values: Vec<i32> = (0..256).map(|i| (i * 7 + i / 3) % (1 << bits)).collect();
            let idx = Array::from_slice(&values, &[2, 128]).unwrap();
            let packed = pack(&idx, bits).unwrap();
            assert_eq!(packed.shape(), vec![2, packed_group_bytes(bits)]);
            let back = unpack(&packed, bits).unwrap().to_vec::<u8>().unwrap();
            let back: Vec<i32> = back.into_iter().map(i32::from).collect();
            assert_eq!(back, values, "turbo{bits}");
        }
    }

    #[test]
    fn rotation_is_orthogonal_and_unrotate_inverts_it() {
        let x: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin()).collect();
        let xa = Array::from_slice(&x, &[2, 128]).unwrap();
        let y = rotate(&xa).unwrap();
        let back = unrotate(&y).unwrap().to_vec::<f32>().unwrap();
        for (a, b) in x.iter().zip(&back) {
            assert!((a - b).abs() < 1e-5);
        }
        let y = y.to_vec::<f32>().unwrap();
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((norm(&x[..128]) - norm(&y[..128])).abs() < 1e-3);
    }

    #[test]
    fn rejects_other_widths_and_head_sizes() {
        assert!(validate(5, 256).unwrap_err().to_string().contains("turbo5"));
        let e = validate(3, 96).unwrap_err().to_string();
        assert!(e.contains("96") && e.contains("128"), "{e}");
    }
}
