//! Custom CUDA kernels: a clear error where there is no CUDA, and on a CUDA
//! build (the GPU machine) the same values as plain ops.

mod common;

use common::{f32s, read_f32};
use mlx_core::device::{is_available, set_default_device};
use mlx_core::kernel::{CudaKernel, Launch, OutputSpec, TemplateArg};
use mlx_core::{Array, Device, Dtype};

/// Rounds as MLX's two operations do: the product to `T`, then the sum to
/// `T` (`__fmul_rn` / `__fadd_rn` keep the compiler from fusing them).
const AXPY: &str = "size_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
      const T product = static_cast<T>(__fmul_rn(static_cast<float>(a[i]), static_cast<float>(SCALE)));
      out[i] = static_cast<T>(__fadd_rn(static_cast<float>(product), static_cast<float>(b[i])));
    }";

/// `out = a · SCALE + b`, elementwise, in the inputs' type `T`.
fn axpy() -> mlx_core::Result<CudaKernel> {
    CudaKernel::new("test_axpy", &["a", "b"], &["out"], AXPY, "")
}

fn run(kernel: &CudaKernel, a: &Array, b: &Array, n: i32) -> mlx_core::Result<Vec<Array>> {
    kernel.apply(
        &[a, b],
        &[OutputSpec {
            shape: vec![n],
            dtype: a.dtype(),
        }],
        Launch {
            grid: [n, 1, 1],
            block: [128, 1, 1],
            shared_bytes: 0,
        },
        &[
            ("T", TemplateArg::Dtype(a.dtype())),
            ("N", TemplateArg::Int(n)),
            ("SCALE", TemplateArg::Int(3)),
        ],
    )
}

#[test]
fn a_kernel_without_cuda_is_an_error_not_a_crash() {
    if is_available(Device::Gpu).unwrap() {
        return;
    }
    let a = f32s(&[1.0, 2.0], &[2]);
    let err = run(&axpy().unwrap(), &a, &a, 2).unwrap_err().to_string();
    assert!(err.contains("CUDA"), "{err}");
}

#[test]
fn names_that_are_not_c_identifiers_are_refused() {
    for (name, input, what) in [
        ("bad\0name", "a", "kernel name"),
        ("2fast", "a", "kernel name"),
        ("", "a", "kernel name"),
        ("fine", "a-b", "input name"),
    ] {
        let err = CudaKernel::new(name, &[input], &["out"], "", "")
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains(&format!("{what} is not a C identifier")),
            "{err}"
        );
    }
    let err = CudaKernel::new("fine", &["a"], &["out put"], "", "")
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("output name is not a C identifier"), "{err}");
}

#[test]
fn on_the_gpu_a_kernel_computes_what_plain_ops_do() {
    if !is_available(Device::Gpu).unwrap() {
        eprintln!("no GPU in this MLX build: the CUDA half of this test runs on the GPU machine");
        return;
    }
    set_default_device(Device::Gpu).unwrap();
    let n = 1000;
    let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.37 - 50.0).collect();
    let other: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    for dtype in [Dtype::Float32, Dtype::Bfloat16] {
        let a = f32s(&values, &[n]).astype(dtype).unwrap();
        let b = f32s(&other, &[n]).astype(dtype).unwrap();
        let out = run(&axpy().unwrap(), &a, &b, n).unwrap().remove(0);
        let three = Array::scalar(3.0, dtype).unwrap();
        let expected = a.multiply(&three).unwrap().add(&b).unwrap();
        assert_eq!(
            read_f32(&out.astype(Dtype::Float32).unwrap()),
            read_f32(&expected.astype(Dtype::Float32).unwrap()),
            "{dtype:?}"
        );
    }
}
