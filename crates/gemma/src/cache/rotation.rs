//! Hadamard rotation of keys and values before they are stored, as upstream
//! llama.cpp does for quantized caches (`LLAMA_ATTN_ROT_*`,
//! `src/llama-kv-cache.cpp` at 0c1e570): keys and queries are multiplied by
//! the orthonormal Walsh–Hadamard matrix of the largest power of two (at
//! least 64) that divides the head, in runs of that many values; values by
//! the one of order 64, and the attention output by it again (the matrix is
//! symmetric and its own inverse). Scores and outputs are those of the
//! unrotated vectors; only what quantization loses changes, because a
//! rotation spreads outliers across the run.
//!
//! The matrices are Sylvester's, `H[i][j] = (−1)^popcount(i & j) / √n`,
//! ggml's `ggml_gen_hadamard`: no random signs, so that our rotated formats
//! are llama.cpp's.

use mlx_core::{Array, Dtype};

use super::error::CacheError;

/// Which sides of a cache are rotated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rotation {
    /// Keys (and the queries that meet them).
    pub keys: bool,
    /// Values (and the attention output).
    pub values: bool,
}

/// The order of the values' rotation.
pub const VALUE_ORDER: i32 = 64;

impl Rotation {
    /// Neither side.
    pub const NONE: Rotation = Rotation {
        keys: false,
        values: false,
    };

    /// Whether either side is rotated.
    pub fn any(&self) -> bool {
        self.keys || self.values
    }

    /// Checks that heads of `dim` values split into the rotations' runs.
    pub fn validate(&self, dim: i32) -> Result<(), CacheError> {
        if self.any() && dim % VALUE_ORDER != 0 {
            return Err(CacheError::Format(format!(
                "rot= needs heads of a multiple of {VALUE_ORDER} values; these have {dim}"
            )));
        }
        Ok(())
    }

    /// Keys or queries `[..., dim]`, rotated when keys are.
    pub fn keys_side(&self, x: &Array) -> Result<Array, CacheError> {
        if !self.keys {
            return Ok(x.clone());
        }
        let dim = last_dim(x)?;
        hadamard_runs(x, key_order(dim))
    }

    /// Values or attention outputs `[..., dim]`, rotated when values are.
    pub fn values_side(&self, x: &Array) -> Result<Array, CacheError> {
        if !self.values {
            return Ok(x.clone());
        }
        hadamard_runs(x, VALUE_ORDER)
    }
}

/// The order of the keys' rotation for heads of `dim` values: the largest
/// power of two that divides `dim`, at least 64.
pub fn key_order(dim: i32) -> i32 {
    let mut order = VALUE_ORDER;
    while dim % (order * 2) == 0 {
        order *= 2;
    }
    order
}

fn last_dim(x: &Array) -> Result<i32, CacheError> {
    Ok(x.dim(-1)?)
}

/// The orthonormal Walsh–Hadamard matrix of order `n` (a power of two).
pub fn hadamard_matrix(n: i32) -> Result<Array, CacheError> {
    let scale = 1.0 / (n as f32).sqrt();
    let values: Vec<f32> = (0..n * n)
        .map(|k| {
            let (i, j) = (k / n, k % n);
            if (i & j).count_ones() % 2 == 0 {
                scale
            } else {
                -scale
            }
        })
        .collect();
    Ok(Array::from_slice(&values, &[n, n])?)
}

/// `x` `[..., dim]` with each run of `n` values multiplied by the order-`n`
/// matrix, in float32, returned in `x`'s dtype.
fn hadamard_runs(x: &Array, n: i32) -> Result<Array, CacheError> {
    let shape = x.shape();
    let dim = last_dim(x)?;
    if dim % n != 0 {
        return Err(CacheError::Format(format!(
            "a rotation of order {n} does not split heads of {dim} values"
        )));
    }
    let mut runs = shape.clone();
    if let Some(last) = runs.last_mut() {
        *last = dim / n;
    }
    runs.push(n);
    let rotated = x
        .astype(Dtype::Float32)?
        .reshape(&runs)?
        .matmul(&hadamard_matrix(n)?)?
        .reshape(&shape)?;
    Ok(if x.dtype() == Dtype::Float32 {
        rotated
    } else {
        rotated.astype(x.dtype())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_4_matrix_is_sylvesters() {
        let h = hadamard_matrix(4).unwrap().to_vec::<f32>().unwrap();
        let expected = [
            1, 1, 1, 1, //
            1, -1, 1, -1, //
            1, 1, -1, -1, //
            1, -1, -1, 1,
        ];
        for (got, sign) in h.iter().zip(expected) {
            assert_eq!(*got, 0.5 * sign as f32);
        }
    }

    #[test]
    fn keys_take_the_largest_power_of_two_of_the_head() {
        assert_eq!(key_order(256), 256);
        assert_eq!(key_order(128), 128);
        assert_eq!(key_order(192), 64);
        assert_eq!(key_order(64), 64);
    }

    #[test]
    fn rotating_twice_gives_the_vectors_back() {
        let x: Vec<f32> = (0..2 * 256)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let a = Array::from_slice(&x, &[1, 2, 256]).unwrap();
        let both = Rotation {
            keys: true,
            values: true,
        };
        let max_err = |got: &Array| {
            let got = got.to_vec::<f32>().unwrap();
            got.iter()
                .zip(&x)
                .map(|(g, v)| (g - v).abs())
                .fold(0.0, f32::max)
        };
        let keys = both.keys_side(&a).unwrap();
        let values = both.values_side(&a).unwrap();
        assert!(max_err(&keys) > 1.0 && max_err(&values) > 1.0);
        assert!(max_err(&both.keys_side(&keys).unwrap()) < 1e-4);
        assert!(max_err(&both.values_side(&values).unwrap()) < 1e-4);
        assert_eq!(max_err(&Rotation::NONE.keys_side(&a).unwrap()), 0.0);
    }
}
