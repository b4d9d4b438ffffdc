//! One projection of a CPU decode block (`crate::cpu::layer`) applied to
//! one row of activations from its arrays' bytes: GGUF blocks as stored and
//! MLX affine groups, stacked along the output rows. Where every piece has
//! one of `mlx-c`'s kernels with 8-bit activations, the row is quantized
//! once and all pieces' rows go to rayon's pool as one list of tasks (one
//! fork and join per projection, not one per piece); otherwise each piece
//! runs through its own product.

use mlx_core::block_dot::block_rows_dot_available;
use mlx_core::Array;

use super::affine;
use super::tasks::{affine_rows_times, push_tasks, run_tasks, Piece};
use super::Linear;
use crate::quant::{can_multiply, rows_times, Activations};

/// A projection as a CPU decode block reads it: its pieces stacked along
/// the output rows.
#[derive(Debug, Clone)]
pub(crate) struct Projection {
    pieces: Vec<Piece>,
}

/// A piece with its arrays' bytes and its output rows.
type PieceIo<'b, 'o> = (Piece, &'b [&'b [u8]], &'o mut [f32]);

impl Projection {
    /// The projection of `linear`, pushing the arrays it reads onto
    /// `arrays`; `None` where some part is not in a format of our CPU
    /// kernels.
    pub(crate) fn of<'a>(
        linear: &'a Linear,
        arrays: &mut Vec<&'a Array>,
    ) -> mlx_core::Result<Option<Projection>> {
        let mut pieces = Vec::new();
        if !Self::collect(linear, arrays, &mut pieces)? {
            return Ok(None);
        }
        Ok(Some(Projection { pieces }))
    }

    fn collect<'a>(
        linear: &'a Linear,
        arrays: &mut Vec<&'a Array>,
        pieces: &mut Vec<Piece>,
    ) -> mlx_core::Result<bool> {
        match linear {
            Linear::Gguf(g) if can_multiply(g.dtype) => {
                let arithmetic = g.arithmetic;
                pieces.push(Piece::Gguf {
                    dtype: g.dtype,
                    rows: g.rows()? as usize,
                    cols: g.cols as usize,
                    arithmetic,
                    native: arithmetic.activations == Activations::Int8
                        && block_rows_dot_available(arithmetic.kernels, g.dtype.id())?,
                });
                arrays.push(&g.bytes);
            }
            Linear::QuantizedCpu(q, kernels) if affine::takes(q, *kernels)? => {
                pieces.push(Piece::Affine {
                    rows: q.packed.dim(0)? as usize,
                    bits: q.bits,
                    group_size: q.group_size,
                    kernels: *kernels,
                });
                arrays.extend([&q.packed, &q.scales, &q.biases]);
            }
            Linear::Parts(parts) => {
                for part in parts {
                    if !Self::collect(part, arrays, pieces)? {
                        return Ok(false);
                    }
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Output rows.
    pub(crate) fn rows(&self) -> usize {
        self.pieces.iter().map(Piece::rows).sum()
    }

    /// Arrays read.
    pub(crate) fn arrays(&self) -> usize {
        self.pieces.iter().map(Piece::arrays).sum()
    }

    /// `out = W · x` from the projection's arrays' bytes.
    pub(crate) fn apply(&self, arrays: &[&[u8]], x: &[f32], out: &mut [f32]) -> Result<(), String> {
        if out.len() != self.rows() || arrays.len() != self.arrays() {
            return Err(format!(
                "a projection of {} rows from {} arrays handed {} outputs and {} arrays",
                self.rows(),
                self.arrays(),
                out.len(),
                arrays.len()
            ));
        }
        if !self.pieces.iter().all(Piece::native) {
            return self.apply_by_piece(arrays, x, out);
        }
        let mut tasks = Vec::new();
        for (piece, bytes, y) in self.split(arrays, out) {
            push_tasks(piece, bytes, y, &mut tasks)?;
        }
        run_tasks(tasks, x)
    }

    /// [`Projection::apply`] one piece after another, each through its own
    /// product (float32 activations, or types without an `mlx-c` kernel).
    fn apply_by_piece(&self, arrays: &[&[u8]], x: &[f32], out: &mut [f32]) -> Result<(), String> {
        for (piece, bytes, y) in self.split(arrays, out) {
            match (piece, bytes) {
                (
                    Piece::Gguf {
                        dtype,
                        cols,
                        arithmetic,
                        ..
                    },
                    [w],
                ) => rows_times(dtype, w, cols, x, y, arithmetic).map_err(|e| e.to_string())?,
                (
                    Piece::Affine {
                        bits,
                        group_size,
                        kernels,
                        ..
                    },
                    [packed, scales, biases],
                ) => affine_rows_times(kernels, packed, scales, biases, (bits, group_size), x, y)?,
                _ => return Err("a projection was handed the wrong arrays".into()),
            }
        }
        Ok(())
    }

    /// Each piece with its arrays and its output rows (the sizes checked by
    /// the caller).
    fn split<'b, 'o>(&self, arrays: &'b [&'b [u8]], out: &'o mut [f32]) -> Vec<PieceIo<'b, 'o>> {
        let (mut arrays, mut out) = (arrays, out);
        let mut parts = Vec::with_capacity(self.pieces.len());
        for piece in &self.pieces {
            let (bytes, rest) = arrays.split_at(piece.arrays().min(arrays.len()));
            let rows = piece.rows().min(out.len());
            let (y, more) = std::mem::take(&mut out).split_at_mut(rows);
            (arrays, out) = (rest, more);
            parts.push((*piece, bytes, y));
        }
        parts
    }
}
