//! Where a forward pass computes: the device, and whether our kernels run.

use mlx_core::device::{default_device, Device};

use crate::cuda::{gemv, gguf_dequantize, gguf_row};
use crate::linear::{mlx_matmul, BlockProducts, Products};

/// Where a forward pass computes, decided once per pass.
#[derive(Debug, Clone, Copy)]
pub(super) struct Placement {
    /// On the GPU.
    pub(super) gpu: bool,
    /// With our GPU kernels ([`crate::cuda`]).
    pub(super) kernels: bool,
}

impl Placement {
    /// On the default device, with our kernels if asked for and on the GPU.
    pub(super) fn current(gpu_kernels: bool) -> mlx_core::Result<Placement> {
        let gpu = default_device()? == Device::Gpu;
        Ok(Placement {
            gpu,
            kernels: gpu && gpu_kernels,
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
}
