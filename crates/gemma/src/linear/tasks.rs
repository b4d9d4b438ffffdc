//! Products of CPU projections as tasks on rayon's pool: the pieces a
//! projection is made of (GGUF blocks as stored, MLX affine groups), each
//! cut into tasks of rows that `mlx-c`'s kernels multiply with one row of
//! 8-bit activations quantized once for all of them.

use mlx_core::block_dot::{
    affine_rows_dot, block_rows_dot, AffineRows, CpuKernels, Int8Activations,
};
use mlx_core::cpu_kernel::floats;
use rayon::prelude::*;

use crate::quant::{Arithmetic, GgufDtype, Int8Row, MIN_BYTES_PER_TASK};

/// One piece of a projection, some of its output rows in one format.
#[derive(Debug, Clone, Copy)]
pub(super) enum Piece {
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
    pub(super) fn arrays(&self) -> usize {
        match self {
            Piece::Gguf { .. } => 1,
            Piece::Affine { .. } => 3,
        }
    }

    /// Output rows.
    pub(super) fn rows(&self) -> usize {
        match *self {
            Piece::Gguf { rows, .. } | Piece::Affine { rows, .. } => rows,
        }
    }

    /// Whether the piece runs on `mlx-c`'s kernels with 8-bit activations.
    pub(super) fn native(&self) -> bool {
        match *self {
            Piece::Gguf { native, .. } => native,
            Piece::Affine { .. } => true,
        }
    }
}

/// Some rows of one piece for one task.
pub(super) enum Task<'a> {
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

/// `y[r] = Σ_j w[r, j] · x_j` for the `y.len()` rows of MLX affine groups
/// (`bits` and `group_size`) held as bytes (the packed values, float32
/// scales and biases), rows in parallel on the kernel of `kernels`, `x`
/// entering as 8-bit activations.
pub(super) fn affine_rows_times(
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
pub(super) fn push_tasks<'a>(
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
pub(super) fn run_tasks(tasks: Vec<Task<'_>>, x: &[f32]) -> Result<(), String> {
    let row = Int8Row::new(x);
    let x = row.as_activations();
    tasks
        .into_par_iter()
        .try_for_each(|task| task.run(x))
        .map_err(|e| e.to_string())
}
