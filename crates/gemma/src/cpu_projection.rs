//! One projection of a CPU decode block ([`crate::cpu_layer`]) applied to
//! one row of activations from its arrays' bytes: GGUF blocks as stored and
//! MLX affine groups, stacked along the output rows. Where every piece has
//! one of `mlx-c`'s kernels with 8-bit activations, the row is quantized
//! once and all pieces' rows go to rayon's pool as one list of tasks (one
//! fork and join per projection, not one per piece); otherwise each piece
//! runs through its own product.

use mlx_core::block_dot::{
    affine_rows_dot, block_rows_dot, block_rows_dot_available, AffineRows, CpuKernels,
    Int8Activations,
};
use mlx_core::Array;
use rayon::prelude::*;

use crate::affine_linear;
use crate::linear::Linear;
use crate::weights::gguf::MIN_BYTES_PER_TASK;
use crate::weights::gguf::{can_multiply, rows_times, Activations, Arithmetic, GgufDtype, Int8Row};

/// One piece of a projection, some of its output rows in one format.
#[derive(Debug, Clone, Copy)]
enum Piece {
    /// GGUF blocks (one array).
    Gguf {
        dtype: GgufDtype,
        rows: usize,
        cols: usize,
        arithmetic: Arithmetic,
        /// Whether `mlx-c` has a kernel for the type in the family asked for
        /// and the activations are 8-bit.
        native: bool,
    },
    /// MLX affine groups (packed values, scales and biases), always with
    /// 8-bit activations on `mlx-c`'s kernel of `kernels`.
    Affine {
        rows: usize,
        bits: i32,
        group_size: i32,
        kernels: CpuKernels,
    },
}

impl Piece {
    /// Arrays the piece reads.
    fn arrays(&self) -> usize {
        match self {
            Piece::Gguf { .. } => 1,
            Piece::Affine { .. } => 3,
        }
    }

    /// Output rows.
    fn rows(&self) -> usize {
        match *self {
            Piece::Gguf { rows, .. } | Piece::Affine { rows, .. } => rows,
        }
    }

    /// Whether the piece runs on `mlx-c`'s kernels with 8-bit activations.
    fn native(&self) -> bool {
        match *self {
            Piece::Gguf { native, .. } => native,
            Piece::Affine { .. } => true,
        }
    }
}

/// A projection as a CPU decode block reads it: its pieces stacked along
/// the output rows.
#[derive(Debug, Clone)]
pub(crate) struct Projection {
    pieces: Vec<Piece>,
}

/// A piece with its arrays' bytes and its output rows.
type PieceIo<'b, 'o> = (Piece, &'b [&'b [u8]], &'o mut [f32]);

/// Some rows of one piece for one task.
enum Task<'a> {
    Blocks {
        kernels: CpuKernels,
        type_id: u32,
        w: &'a [u8],
        row_bytes: usize,
        out: &'a mut [f32],
    },
    Affine {
        kernels: CpuKernels,
        rows: AffineRows<'a>,
        out: &'a mut [f32],
    },
}

impl Task<'_> {
    fn run(self, x: Int8Activations<'_>) -> mlx_core::Result<()> {
        match self {
            Task::Blocks {
                kernels,
                type_id,
                w,
                row_bytes,
                out,
            } => block_rows_dot(kernels, type_id, w, row_bytes, x, out),
            Task::Affine { kernels, rows, out } => affine_rows_dot(kernels, rows, x, out),
        }
    }
}

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
            Linear::QuantizedCpu(q, kernels) if affine_linear::takes(q, *kernels)? => {
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

/// `y[r] = Σ_j w[r, j] · x_j` for the `y.len()` rows of MLX affine groups
/// (`bits` and `group_size`) held as bytes (the packed values, float32
/// scales and biases), rows in parallel on the kernel of `kernels`, `x`
/// entering as 8-bit activations.
pub(crate) fn affine_rows_times(
    kernels: CpuKernels,
    packed: &[u8],
    scales: &[u8],
    biases: &[u8],
    (bits, group_size): (i32, i32),
    x: &[f32],
    y: &mut [f32],
) -> Result<(), String> {
    let piece = Piece::Affine {
        rows: y.len(),
        bits,
        group_size,
        kernels,
    };
    let mut tasks = Vec::new();
    push_tasks(piece, &[packed, scales, biases], y, &mut tasks)?;
    run_tasks(tasks, x)
}

/// Pushes the tasks of `piece` (on `mlx-c`'s kernels) over its arrays'
/// `bytes` into its output rows `y`: rows of about [`MIN_BYTES_PER_TASK`]
/// bytes each.
fn push_tasks<'a>(
    piece: Piece,
    bytes: &[&'a [u8]],
    y: &'a mut [f32],
    tasks: &mut Vec<Task<'a>>,
) -> Result<(), String> {
    match (piece, bytes) {
        (
            Piece::Gguf {
                dtype,
                cols,
                arithmetic,
                ..
            },
            [w],
        ) => {
            let row_bytes = cols / dtype.block_size().max(1) as usize * dtype.type_size() as usize;
            if w.len() != y.len() * row_bytes {
                return Err(format!(
                    "{} bytes for {} rows of {row_bytes} bytes of {dtype}",
                    w.len(),
                    y.len()
                ));
            }
            let per_task = (MIN_BYTES_PER_TASK / row_bytes.max(1)).max(1);
            for (w, out) in w.chunks(per_task * row_bytes).zip(y.chunks_mut(per_task)) {
                tasks.push(Task::Blocks {
                    kernels: arithmetic.kernels,
                    type_id: dtype.id(),
                    w,
                    row_bytes,
                    out,
                });
            }
        }
        (
            Piece::Affine {
                rows,
                bits,
                group_size,
                kernels,
            },
            [packed, scales, biases],
        ) => {
            let (scales, biases) = (floats(scales)?, floats(biases)?);
            let row_bytes = packed.len() / rows.max(1);
            let groups = scales.len() / rows.max(1);
            let per_task = (MIN_BYTES_PER_TASK / row_bytes.max(1)).max(1);
            let chunks = packed
                .chunks(per_task * row_bytes.max(1))
                .zip(scales.chunks(per_task * groups.max(1)))
                .zip(biases.chunks(per_task * groups.max(1)))
                .zip(y.chunks_mut(per_task));
            for (((packed, scales), biases), out) in chunks {
                let rows = AffineRows {
                    packed,
                    scales,
                    biases,
                    bits,
                    group_size,
                };
                tasks.push(Task::Affine { kernels, rows, out });
            }
        }
        _ => return Err("a projection was handed the wrong arrays".into()),
    }
    Ok(())
}

/// Runs `tasks` on rayon's pool with `x` quantized to 8 bits once.
fn run_tasks(tasks: Vec<Task<'_>>, x: &[f32]) -> Result<(), String> {
    let row = Int8Row::new(x);
    let x = row.as_activations();
    tasks
        .into_par_iter()
        .try_for_each(|task| task.run(x))
        .map_err(|e| e.to_string())
}

/// Float32 values of an input's bytes, in place.
pub(crate) fn floats(bytes: &[u8]) -> Result<&[f32], String> {
    bytemuck::try_cast_slice(bytes).map_err(|e| format!("float32 values: {e}"))
}
