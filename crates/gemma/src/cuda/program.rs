//! Building our CUDA kernels from their source (once per distinct set of
//! constants in a process, once per machine on disk through
//! [`mlx_core::kernel::CudaKernel`]) and reading their outputs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use mlx_core::kernel::CudaKernel;
use mlx_core::Array;

/// Device functions every kernel here may use: a block-wide float sum
/// (every thread gets the total) and a warp's dot product.
pub(super) const HEADER: &str = r#"
__device__ __forceinline__ float gemma_block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

// One warp's dot products of `R` weight rows `w[r]` with a row `x`, all `K`
// values of `U` in 16-byte loads (the rows' loads interleaved, so that `R`
// times as many are in flight), each summed in float in the same order;
// every lane gets them.
template <int R, typename U>
__device__ __forceinline__ void gemma_dots(const U* const* w, const U* x, int K, int lane, float* acc) {
  constexpr int V = 16 / sizeof(U);
  const uint4* x4 = reinterpret_cast<const uint4*>(x);
  #pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  #pragma unroll 4
  for (int i = lane; i < K / V; i += 32) {
    uint4 wv[R];
    #pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = __ldg(reinterpret_cast<const uint4*>(w[r]) + i);
    const uint4 xv = x4[i];
    const U* xp = reinterpret_cast<const U*>(&xv);
    #pragma unroll
    for (int r = 0; r < R; ++r) {
      const U* wp = reinterpret_cast<const U*>(&wv[r]);
      #pragma unroll
      for (int j = 0; j < V; ++j) acc[r] += static_cast<float>(wp[j]) * static_cast<float>(xp[j]);
    }
  }
  #pragma unroll
  for (int r = 0; r < R; ++r) {
    for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
  }
}

// `gemma_dots` of a single row.
template <typename U>
__device__ __forceinline__ float gemma_dot(const U* w, const U* x, int K, int lane) {
  float acc;
  gemma_dots<1>(&w, x, K, lane, &acc);
  return acc;
}
"#;

/// A kernel from `body` with float constants compiled in, built once per
/// distinct set of constants.
pub(super) fn kernel_with_constants(
    name: &str,
    inputs: &[&str],
    outputs: &[&str],
    body: &str,
    constants: &[(&str, f32)],
) -> mlx_core::Result<Arc<CudaKernel>> {
    kernel_with_header(name, (inputs, outputs), body, HEADER, constants)
}

/// [`kernel_with_constants`] with `header` (device functions) before the
/// kernel in place of [`HEADER`].
pub(super) fn kernel_with_header(
    name: &str,
    (inputs, outputs): (&[&str], &[&str]),
    body: &str,
    header: &str,
    constants: &[(&str, f32)],
) -> mlx_core::Result<Arc<CudaKernel>> {
    static KERNELS: OnceLock<Mutex<HashMap<String, Arc<CudaKernel>>>> = OnceLock::new();
    let mut full_name = name.to_string();
    for (_, value) in constants {
        full_name.push_str(&format!("_{:08x}", value.to_bits()));
    }
    let mut kernels = KERNELS
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| mlx_core::Error::Host("the kernel cache lock is poisoned".into()))?;
    if let Some(k) = kernels.get(&full_name) {
        return Ok(k.clone());
    }
    let mut source = String::new();
    for (constant, value) in constants {
        source.push_str(&format!("  constexpr float {constant} = {value:e}f;\n"));
    }
    source.push_str(body);
    let kernel = Arc::new(CudaKernel::new(
        &full_name, inputs, outputs, &source, header,
    )?);
    kernels.insert(full_name, kernel.clone());
    Ok(kernel)
}

/// The last output of a kernel call.
pub(super) fn one(mut out: Vec<Array>, kernel: &str) -> mlx_core::Result<Array> {
    out.pop()
        .ok_or_else(|| mlx_core::Error::Host(format!("the {kernel} kernel returned nothing")))
}

/// The last two outputs of a kernel call, in order.
pub(super) fn two(mut out: Vec<Array>, kernel: &str) -> mlx_core::Result<(Array, Array)> {
    match (out.pop(), out.pop()) {
        (Some(second), Some(first)) => Ok((first, second)),
        _ => Err(mlx_core::Error::Host(format!(
            "the {kernel} kernel returned too few outputs"
        ))),
    }
}
