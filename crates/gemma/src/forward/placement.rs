//! Where a forward pass computes: the device, and whether our kernels run.

use mlx_core::device::{default_device, Device};
use mlx_core::fast::RopeOffset;
use mlx_core::Array;

use crate::cpu::norms::{self as cpu_norms, RopeRows};
use crate::cuda::{self, gemv, gguf_dequantize, gguf_row, Rotary};
use crate::linear::{mlx_matmul, BlockProducts, Products};

/// Where a forward pass computes, decided once per pass.
#[derive(Debug, Clone, Copy)]
pub(super) struct Placement {
    /// On the GPU.
    pub(super) gpu: bool,
    /// With our GPU kernels ([`crate::cuda`]).
    pub(super) kernels: bool,
    /// On the CPU with every block's projections on our CPU kernels: a
    /// prompt chunk's norms and RoPE run as operations of ours too
    /// ([`crate::cpu::norms`]), with the arithmetic of one token's block.
    pub(super) cpu_rows: bool,
}

impl Placement {
    /// On the default device, with our kernels if asked for and on the GPU.
    pub(super) fn current(gpu_kernels: bool) -> mlx_core::Result<Placement> {
        let gpu = default_device()? == Device::Gpu;
        Ok(Placement {
            gpu,
            kernels: gpu && gpu_kernels,
            cpu_rows: false,
        })
    }

    /// How products run: dense weights through our GEMV kernel for one row
    /// on the GPU with our kernels, MLX's matmul otherwise; GGUF blocks as
    /// stored through our GPU kernels on the GPU, our CPU kernels on the
    /// CPU.
    pub(super) fn products(self) -> Products {
        Products {
            dense: if self.kernels { gemv } else { mlx_matmul },
            blocks: self.gpu.then_some(BlockProducts {
                row: gguf_row,
                dequantize: gguf_dequantize,
            }),
        }
    }

    /// The residual step `h = x + rms_norm(r, w_post)` and `rms_norm(h,
    /// w_next)`: our GPU kernel with our kernels on, our CPU operation for
    /// [`Placement::cpu_rows`], MLX's operations otherwise.
    pub(super) fn residual_norms(
        self,
        x: &Array,
        r: &Array,
        (w_post, w_next): (&Array, &Array),
        eps: f32,
    ) -> mlx_core::Result<(Array, Array)> {
        if self.cpu_rows {
            if let Some(out) = cpu_norms::residual_norms(x, r, w_post, w_next, eps)? {
                return Ok(out);
            }
        }
        cuda::residual_norms(x, r, w_post, w_next, eps, self.kernels)
    }

    /// Queries `[B, L, Hq·D]` and keys `[B, L, Hkv·D]` RMS-normed per head
    /// and rotated, as `[B, Hq, L, D]` and `[B, Hkv, L, D]`: our GPU kernel
    /// with our kernels on, our CPU operation for [`Placement::cpu_rows`]
    /// at a known position, MLX's operations otherwise.
    pub(super) fn qk_norm_rope(
        self,
        (q, k): (&Array, &Array),
        norms: (&Array, &Array),
        (hq, hkv, d): (i32, i32, i32),
        rotary: Rotary<'_>,
        eps: f32,
    ) -> mlx_core::Result<(Array, Array)> {
        if let (true, RopeOffset::Fixed(start)) = (self.cpu_rows, &rotary.offset) {
            let rope = RopeRows {
                start: *start,
                rows: q.dim(1)?.max(0) as usize,
                base: rotary.base,
                scale: rotary.scale,
                dim: d.max(0) as usize,
            };
            if let Some(out) = cpu_norms::qk_norm_rope(q, k, norms, (hq, hkv), rope, eps)? {
                return Ok(out);
            }
        }
        cuda::qk_norm_rope(q, k, norms, (hq, hkv, d), rotary, eps, self.kernels)
    }
}
