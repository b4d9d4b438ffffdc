//! Where a forward pass computes: the device, and whether our kernels run.

use mlx_core::device::{default_device, Device};

use crate::cuda::gemv;
use crate::linear::{mlx_matmul, DenseProduct};

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

    /// How a product with dense weights runs: our GEMV kernel for one row
    /// on the GPU with our kernels, MLX's matmul otherwise.
    pub(super) fn dense(self) -> DenseProduct {
        if self.kernels {
            gemv
        } else {
            mlx_matmul
        }
    }
}
