//! What the GPU tests share: the GPU as the default device, and arrays read
//! back as float32.

use mlx_core::device::{is_available, set_default_device};
use mlx_core::{Array, Device, Dtype};

/// Makes the GPU the default device; false, saying so, where this MLX build
/// has none (the tests then return).
pub fn on_gpu() -> bool {
    if !is_available(Device::Gpu).unwrap() {
        eprintln!("no GPU in this MLX build: this test runs on the GPU machine");
        return false;
    }
    set_default_device(Device::Gpu).unwrap();
    true
}

/// `a`'s values as float32.
pub fn floats(a: &Array) -> Vec<f32> {
    a.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap()
}
