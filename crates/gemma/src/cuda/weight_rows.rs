//! Weight rows as the GPU kernels read them, in any of the formats a model
//! holds its projections in: dense floats of the compute dtype, ggml's
//! blocks as a GGUF file stores them, or MLX's affine quantization. The
//! CUDA device functions here decode a lane's share of a row in registers
//! (never written out): 32 values at a time for every quantized format, 8
//! for dense rows. [`WeightRows`] is one projection
//! part as a kernel's inputs and template arguments. Test `cuda_host`
//! compiles the device functions for the host and checks every format
//! against the crate's dequantizer, on machines without a GPU too.
//!
//! Formats (the kernels' `WF` template arguments): 0 dense floats of `T`;
//! 1 Q4_0, 2 Q5_0, 3 Q8_0, 4 Q4_K, 5 Q5_K, 6 Q6_K (ggml's blocks, values
//! exactly as `crate::quant` decodes them); 7 MLX affine (`WB`-bit codes
//! packed least significant bit first in 32-bit words, one scale and bias
//! of `T` per `WG` values).

use std::sync::OnceLock;

use mlx_core::kernel::{Launch, OutputSpec, TemplateArg};
use mlx_core::{Array, Dtype};

use super::mma_rows;
use super::program::{kernel_with_header, one};
use crate::linear::{GgufMatrix, Linear};
use crate::quant::GgufDtype;

/// Warps per block of the standalone kernels here.
const WARPS: i32 = 8;

/// Bytes of activations [`rows_gemv`] holds in shared memory at most.
const MAX_SHARED_ACTIVATIONS: i32 = 48 * 1024;

/// Values a lane reads at once, and the warp's step: 32 lanes of 8.
pub(super) const LANE_VALUES: i32 = 8;

/// The CUDA format number of a ggml block type with a decoder here.
fn block_format(dtype: GgufDtype) -> Option<i32> {
    Some(match dtype {
        GgufDtype::Q4_0 => 1,
        GgufDtype::Q5_0 => 2,
        GgufDtype::Q8_0 => 3,
        GgufDtype::Q4_K => 4,
        GgufDtype::Q5_K => 5,
        GgufDtype::Q6_K => 6,
        _ => return None,
    })
}

/// Whether the GPU kernels read rows of `dtype` as stored.
pub fn reads_blocks(dtype: GgufDtype) -> bool {
    block_format(dtype).is_some()
}

/// One part of a projection as a kernel reads it: its rows' data and, for
/// MLX affine rows, their scales and biases.
#[derive(Debug, Clone, Copy)]
pub struct WeightRows<'a> {
    /// The rows: `T` `[rows, K]`, uint8 blocks `[rows, row_bytes]`, or
    /// uint32 packed codes `[rows, K·bits/32]`.
    pub data: &'a Array,
    /// Affine scales `[rows, K / group]` (affine rows only).
    pub scales: Option<&'a Array>,
    /// Affine biases, as the scales.
    pub biases: Option<&'a Array>,
    /// The CUDA format number (see the module documentation).
    pub format: i32,
    /// Affine bits (0 for other formats).
    pub bits: i32,
    /// Affine group size (0 for other formats).
    pub group: i32,
    /// Rows.
    pub rows: i32,
    /// Values per row.
    pub cols: i32,
}

impl<'a> WeightRows<'a> {
    /// The rows of `linear` where a kernel reads them as held: dense
    /// (`dtype` floats), GGUF blocks of a type with a decoder here, or MLX
    /// affine rows of 4 or 8 bits in groups of 32, 64 or 128 with `dtype`
    /// scales and biases; `None` for anything else (stacked parts of other
    /// types included: [`WeightRows::parts`] takes those).
    pub fn of(linear: &'a Linear, dtype: Dtype) -> mlx_core::Result<Option<WeightRows<'a>>> {
        Ok(match linear {
            Linear::Dense(w) if w.dtype() == dtype && w.ndim() == 2 => Some(WeightRows {
                data: w,
                scales: None,
                biases: None,
                format: 0,
                bits: 0,
                group: 0,
                rows: w.dim(0)?,
                cols: w.dim(1)?,
            }),
            Linear::Gguf(g) => Self::blocks(g)?,
            Linear::Quantized(q) | Linear::QuantizedCpu(q, _)
                if matches!(q.bits, 4 | 8)
                    && matches!(q.group_size, 32 | 64 | 128)
                    && q.scales.dtype() == dtype
                    && q.biases.dtype() == dtype
                    && q.packed.ndim() == 2 =>
            {
                Some(WeightRows {
                    data: &q.packed,
                    scales: Some(&q.scales),
                    biases: Some(&q.biases),
                    format: 7,
                    bits: q.bits,
                    group: q.group_size,
                    rows: q.packed.dim(0)?,
                    cols: q.packed.dim(1)? * 32 / q.bits,
                })
            }
            _ => None,
        })
    }

    /// The rows of a GGUF matrix, where its type has a decoder here.
    pub fn blocks(g: &'a GgufMatrix) -> mlx_core::Result<Option<WeightRows<'a>>> {
        let Some(format) = block_format(g.dtype) else {
            return Ok(None);
        };
        Ok(Some(WeightRows {
            data: &g.bytes,
            scales: None,
            biases: None,
            format,
            bits: 0,
            group: 0,
            rows: g.rows()?,
            cols: g.cols,
        }))
    }

    /// The parts of `linear` split at `sizes` output rows, each as a kernel
    /// reads it: one matrix's row ranges (its rows from the part's first,
    /// read through the same array with a row offset), or the stacked
    /// parts of a [`Linear::Parts`] whose boundaries fall at `sizes`.
    /// `None` where some part is not in a format of [`WeightRows::of`].
    pub fn parts(
        linear: &'a Linear,
        sizes: &[i32],
        dtype: Dtype,
    ) -> mlx_core::Result<Option<Vec<(WeightRows<'a>, i32)>>> {
        if let Some(whole) = Self::of(linear, dtype)? {
            let mut first = 0;
            let mut out = Vec::with_capacity(sizes.len());
            for &size in sizes {
                out.push((whole, first));
                first += size;
            }
            return Ok((first == whole.rows).then_some(out));
        }
        let Linear::Parts(parts) = linear else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(sizes.len());
        for (part, &size) in parts.iter().zip(sizes) {
            match Self::of(part, dtype)? {
                Some(rows) if rows.rows == size => out.push((rows, 0)),
                _ => return Ok(None),
            }
        }
        Ok((out.len() == sizes.len() && parts.len() == sizes.len()).then_some(out))
    }

    /// Whether a kernel computing in `dtype` can read these rows: their
    /// data of the format's dtype, rows of whole steps of 8 values, and
    /// affine rows of 4 or 8 bits in whole groups of 32, 64 or 128 (the
    /// readers' template arguments).
    pub fn suits(&self, dtype: Dtype) -> bool {
        let data_dtype = match self.format {
            0 => dtype,
            7 => Dtype::Uint32,
            _ => Dtype::Uint8,
        };
        self.data.dtype() == data_dtype
            && self.cols % LANE_VALUES == 0
            && (self.format != 7
                || (matches!(self.bits, 4 | 8)
                    && matches!(self.group, 32 | 64 | 128)
                    && self.cols % self.group == 0))
    }

    /// The kernel inputs: data, scales, biases (`unused` standing in for
    /// the affine arrays of other formats).
    pub fn inputs(&self, unused: &'a Array) -> [&'a Array; 3] {
        [
            self.data,
            self.scales.unwrap_or(unused),
            self.biases.unwrap_or(unused),
        ]
    }

    /// The template arguments under `names` (format, bits, group).
    pub fn template_args(&self, names: [&'static str; 3]) -> [(&'static str, TemplateArg); 3] {
        [
            (names[0], TemplateArg::Int(self.format)),
            (names[1], TemplateArg::Int(self.bits.max(1))),
            (names[2], TemplateArg::Int(self.group.max(1))),
        ]
    }
}

/// `x @ Wᵀ` for a single row of activations `x` (`[..., K]`, one row, of
/// the compute dtype) against rows `w` in any format, as one kernel (a warp
/// per row, the activations in shared memory); the output rounded to `x`'s
/// dtype as MLX's matmul rounds it.
pub fn rows_gemv(x: &Array, w: &WeightRows<'_>) -> mlx_core::Result<Array> {
    let dtype = x.dtype();
    if x.size() as i32 != w.cols
        || !w.suits(dtype)
        || w.cols * dtype.size_bytes() as i32 > MAX_SHARED_ACTIVATIONS
    {
        return Err(mlx_core::Error::Host(format!(
            "a GEMV of {} activations over rows of {} values (format {})",
            x.size(),
            w.cols,
            w.format
        )));
    }
    let unused = mlx_core::zeros(&[1], dtype)?;
    let [data, scales, biases] = w.inputs(&unused);
    // 16 rows a warp on the tensor cores (ggml blocks or affine rows,
    // 2-byte activations).
    let mma = mma_rows::reads_on_tensor_cores(w.format, w.cols)
        && dtype.size_bytes() == 2
        && w.rows % 16 == 0
        && w.cols * 2 + w.cols / 16 * 4 + 128 <= MAX_SHARED_ACTIVATIONS;
    let (name, body, header, rows_per_warp) = if mma {
        ("gemma_rows_gemv_mma", GEMV_MMA, mma_gemv_header(), 16)
    } else {
        ("gemma_rows_gemv", GEMV, HEADER, 1)
    };
    let kernel = kernel_with_header(
        name,
        (&["x", "w", "w_scales", "w_biases"], &["y"]),
        body,
        header,
        &[],
    )?;
    let mut shape = x.shape();
    if let Some(last) = shape.last_mut() {
        *last = w.rows;
    }
    let out = kernel.apply(
        &[x, data, scales, biases],
        &[OutputSpec { shape, dtype }],
        Launch {
            grid: [
                (w.rows / rows_per_warp + WARPS - 1) / WARPS * WARPS * 32,
                1,
                1,
            ],
            block: [WARPS * 32, 1, 1],
            shared_bytes: 0,
        },
        &[
            ("T", TemplateArg::Dtype(dtype)),
            ("K", TemplateArg::Int(w.cols)),
            ("N", TemplateArg::Int(w.rows)),
            ("WARPS", TemplateArg::Int(WARPS)),
        ]
        .into_iter()
        .chain(w.template_args(["WF", "WB", "WG"]))
        .collect::<Vec<_>>(),
    )?;
    one(out, "rows GEMV")
}

/// Rows `w` as `dtype` floats `[rows, K]`: each value `scale · q (+
/// offset)` in float32 with the rounding of `crate::quant::dequantize` (so
/// GGUF blocks give ggml's values bit for bit), then rounded once to
/// `dtype`.
pub fn dequantize_rows(w: &WeightRows<'_>, dtype: Dtype) -> mlx_core::Result<Array> {
    if w.format == 0 || !w.suits(dtype) {
        return Err(mlx_core::Error::Host(format!(
            "dequantizing rows of format {} and {} values",
            w.format, w.cols
        )));
    }
    let unused = mlx_core::zeros(&[1], dtype)?;
    let [data, scales, biases] = w.inputs(&unused);
    let kernel = kernel_with_header(
        "gemma_rows_dequantize",
        (&["w", "w_scales", "w_biases"], &["out"]),
        DEQUANTIZE,
        HEADER,
        &[],
    )?;
    let eighths = w.rows * (w.cols / LANE_VALUES);
    let out = kernel.apply(
        &[data, scales, biases],
        &[OutputSpec {
            shape: vec![w.rows, w.cols],
            dtype,
        }],
        Launch {
            grid: [(eighths + 255) / 256 * 256, 1, 1],
            block: [256, 1, 1],
            shared_bytes: 0,
        },
        &[
            ("T", TemplateArg::Dtype(dtype)),
            (
                "S",
                TemplateArg::Dtype(w.scales.map_or(dtype, Array::dtype)),
            ),
            ("K", TemplateArg::Int(w.cols)),
            ("N", TemplateArg::Int(w.rows)),
        ]
        .into_iter()
        .chain(w.template_args(["WF", "WB", "WG"]))
        .collect::<Vec<_>>(),
    )?;
    one(out, "rows dequantize")
}

/// One row of activations times GGUF blocks, by [`rows_gemv`] where the
/// activations fit its shared memory, else by MLX's matmul over the
/// dequantized matrix (types without a decoder here are an error: the
/// loader dequantizes those).
pub fn gguf_row(x: &Array, g: &GgufMatrix) -> mlx_core::Result<Array> {
    if g.cols * x.dtype().size_bytes() as i32 > MAX_SHARED_ACTIVATIONS {
        return x.linear(&gguf_dequantize(g, x.dtype())?);
    }
    rows_gemv(x, &gguf_rows(g)?)
}

/// GGUF blocks as `dtype` floats, by [`dequantize_rows`].
pub fn gguf_dequantize(g: &GgufMatrix, dtype: Dtype) -> mlx_core::Result<Array> {
    dequantize_rows(&gguf_rows(g)?, dtype)
}

fn gguf_rows(g: &GgufMatrix) -> mlx_core::Result<WeightRows<'_>> {
    WeightRows::blocks(g)?.ok_or_else(|| {
        mlx_core::Error::Host(format!("no GPU kernel reads {} blocks as stored", g.dtype))
    })
}

/// The CUDA device functions that read weight rows (the kernels'
/// `gemma_wdot_lane`, `gemma_w8` and `gemma_w32`), for tests that compile
/// them for the host with stand-ins for CUDA's intrinsics.
pub fn weight_rows_source() -> &'static str {
    HEADER
}

/// [`rows_gemv`]'s body: the activations into shared memory, then a warp
/// per row.
const GEMV: &str = r#"
  __shared__ __align__(16) T xs[K];
  for (int i = threadIdx.x; i < K; i += blockDim.x) xs[i] = x[i];
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * WARPS + (threadIdx.x >> 5);
  if (row >= N) return;
  const float acc = gemma_rows_sum(gemma_wdot_lane<WF, WB, WG, T>(w, w_scales, w_biases, row, K, xs, lane));
  if (lane == 0) y[row] = static_cast<T>(acc);
"#;

/// The device functions of [`GEMV_MMA`]: these and the tensor-core readers.
fn mma_gemv_header() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| format!("{HEADER}{}", mma_rows::HEADER))
}

/// [`rows_gemv`]'s body on the tensor cores (`mma_rows`): the activations
/// into shared memory as float16 operands, then a warp per 16 rows.
const GEMV_MMA: &str = r#"
  __shared__ __align__(16) T xs[K];
  __shared__ __align__(16) float xsum[K / 16];
  __shared__ float red[32];
  for (int i = threadIdx.x; i < K; i += blockDim.x) xs[i] = x[i];
  __syncthreads();
  const float down = gemma_mma_activations(xs, K, xsum, red);
  const int lane = threadIdx.x & 31;
  const int tile = blockIdx.x * WARPS + (threadIdx.x >> 5);
  if (16 * tile >= N) return;
  float acc[2] = {0.0f, 0.0f};
  gemma_mma_tile<WF, WB, WG>(w, w_scales, w_biases, static_cast<size_t>(16 * tile), K, 0, 1,
                             reinterpret_cast<const unsigned short*>(xs), xsum, lane, acc);
  if ((lane & 3) == 0) {
    y[16 * tile + (lane >> 2)] = static_cast<T>(acc[0] * down);
    y[16 * tile + (lane >> 2) + 8] = static_cast<T>(acc[1] * down);
  }
"#;

/// [`dequantize_rows`]'s body: a thread per 8 values.
const DEQUANTIZE: &str = r#"
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N * (K / 8)) return;
  const int row = t / (K / 8);
  const int v = (t % (K / 8)) * 8;
  gemma_w8<WF, WB, WG, S> values;
  values.load(w, w_scales, w_biases, row, K, v);
  int q[8];
  float scale, offset;
  values.decode(q, scale, offset);
  constexpr bool OFFSET = WF == 4 || WF == 5 || WF == 7;
  #pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float scaled = __fmul_rn(scale, gemma_int_float(q[k]));
    out[static_cast<size_t>(row) * K + v + k] = static_cast<T>(OFFSET ? __fadd_rn(scaled, offset) : scaled);
  }
"#;

/// The device functions; see the module documentation. `gemma_w8<WF, WB,
/// WG, T>` holds a lane's 8 values `v … v + 7` of a row (`load` fetches
/// their bytes; `decode` gives them as `scale · q[k] + offset`, the values
/// of `crate::quant` bit for bit: the prompt path's dequantization, and the
/// dense rows' products); `gemma_w32<WF, WB, WG, T>` a lane's 32 values of
/// a quantized row (a 32-value block, a quarter of a K-quant block, or 32
/// affine codes), dotted with the activations without a conversion
/// instruction (the small integers enter a float's mantissa by a byte
/// permutation), each scale decoded once; `gemma_wdot_lane` dots a row with
/// a vector in shared memory, a warp per row, with several steps' loads in
/// flight at once (memory latency, not bandwidth, bounded a lane reading
/// one step at a time, 12B Q4_K_M on the H200 decoding at 64 tok/s, 0.47
/// TB/s; 8 values a lane with an integer-to-float conversion each, 75
/// tok/s).
pub(super) const HEADER: &str = r#"
__device__ __forceinline__ float gemma_f16_bits(unsigned short bits) {
  return __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ unsigned short gemma_u16(const uint8_t* p) {
  return *reinterpret_cast<const unsigned short*>(p);
}

// 8 bytes at `p`, aligned to 2.
__device__ __forceinline__ unsigned long long gemma_bytes8_a2(const uint8_t* p) {
  const unsigned short* s = reinterpret_cast<const unsigned short*>(p);
  return static_cast<unsigned long long>(s[0]) | (static_cast<unsigned long long>(s[1]) << 16) |
         (static_cast<unsigned long long>(s[2]) << 32) | (static_cast<unsigned long long>(s[3]) << 48);
}

template <int WF> struct gemma_wblock;
template <> struct gemma_wblock<1> { static constexpr int VALUES = 32; static constexpr int BYTES = 18; };
template <> struct gemma_wblock<2> { static constexpr int VALUES = 32; static constexpr int BYTES = 22; };
template <> struct gemma_wblock<3> { static constexpr int VALUES = 32; static constexpr int BYTES = 34; };
template <> struct gemma_wblock<4> { static constexpr int VALUES = 256; static constexpr int BYTES = 144; };
template <> struct gemma_wblock<5> { static constexpr int VALUES = 256; static constexpr int BYTES = 176; };
template <> struct gemma_wblock<6> { static constexpr int VALUES = 256; static constexpr int BYTES = 210; };

// The start of the block of a row of blocks holding value v, and v's place in it.
template <int WF>
__device__ __forceinline__ const uint8_t* gemma_block_at(const void* data, size_t row, int K, int v, int& i) {
  constexpr int VALUES = gemma_wblock<WF>::VALUES;
  const size_t row_bytes = static_cast<size_t>(K / VALUES) * gemma_wblock<WF>::BYTES;
  i = v % VALUES;
  return reinterpret_cast<const uint8_t*>(data) + row * row_bytes + static_cast<size_t>(v / VALUES) * gemma_wblock<WF>::BYTES;
}

// Word `i` (0-3) of a uint4.
__device__ __forceinline__ unsigned int gemma_word(const uint4& v, int i) {
  return i < 2 ? (i == 0 ? v.x : v.y) : (i == 2 ? v.z : v.w);
}

// Byte `j` of a 16-byte header held in a uint4.
__device__ __forceinline__ int gemma_hbyte(const uint4& h, int j) {
  const unsigned int w = j < 4 ? h.x : j < 8 ? h.y : j < 12 ? h.z : h.w;
  return static_cast<int>((w >> (8 * (j & 3))) & 255);
}

// Whether U is bfloat16 (whose bits widen to a float's by a shift).
template <typename U> struct gemma_is_bf16 { static constexpr bool value = false; };
template <> struct gemma_is_bf16<__nv_bfloat16> { static constexpr bool value = true; };

template <int WF, int WB, int WG, typename T> struct gemma_w8;

// Dense values of T.
template <int WB, int WG, typename T> struct gemma_w8<0, WB, WG, T> {
  static constexpr int CHUNKS = static_cast<int>(8 * sizeof(T)) / 16;
  uint4 w[CHUNKS];
  __device__ __forceinline__ void load(const void* data, const T*, const T*, size_t row, int K, int v) {
    const uint4* p = reinterpret_cast<const uint4*>(reinterpret_cast<const T*>(data) + row * K + v);
    #pragma unroll
    for (int c = 0; c < CHUNKS; ++c) w[c] = p[c];
  }
  __device__ __forceinline__ float dot(const float x[8]) const {
    const T* t = reinterpret_cast<const T*>(w);
    float a = 0.0f;
    #pragma unroll
    for (int k = 0; k < 8; ++k) a = fmaf(static_cast<float>(t[k]), x[k], a);
    return a;
  }
};

// Q4_0: f16 d, 16 bytes of nibbles (values 0-15 low, 16-31 high); d·(q − 8).
template <int WB, int WG, typename T> struct gemma_w8<1, WB, WG, T> {
  unsigned short d;
  unsigned long long n;
  int shift;
  __device__ __forceinline__ void load(const void* data, const T*, const T*, size_t row, int K, int v) {
    int i;
    const uint8_t* b = gemma_block_at<1>(data, row, K, v, i);
    d = gemma_u16(b);
    n = gemma_bytes8_a2(b + 2 + (i & 15));
    shift = i < 16 ? 0 : 4;
  }
  __device__ __forceinline__ void decode(int q[8], float& scale, float& offset) const {
    scale = gemma_f16_bits(d);
    offset = 0.0f;
    #pragma unroll
    for (int k = 0; k < 8; ++k) q[k] = static_cast<int>((n >> (8 * k + shift)) & 15) - 8;
  }
};

// Q5_0: f16 d, 32 high bits, 16 bytes of low nibbles; d·(q − 16).
template <int WB, int WG, typename T> struct gemma_w8<2, WB, WG, T> {
  unsigned short d;
  unsigned int high;
  unsigned long long n;
  int i;
  __device__ __forceinline__ void load(const void* data, const T*, const T*, size_t row, int K, int v) {
    const uint8_t* b = gemma_block_at<2>(data, row, K, v, i);
    d = gemma_u16(b);
    high = static_cast<unsigned int>(gemma_u16(b + 2)) | (static_cast<unsigned int>(gemma_u16(b + 4)) << 16);
    n = gemma_bytes8_a2(b + 6 + (i & 15));
  }
  __device__ __forceinline__ void decode(int q[8], float& scale, float& offset) const {
    scale = gemma_f16_bits(d);
    offset = 0.0f;
    const int shift = i < 16 ? 0 : 4;
    #pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int low = static_cast<int>((n >> (8 * k + shift)) & 15);
      q[k] = (low | static_cast<int>(((high >> (i + k)) & 1) << 4)) - 16;
    }
  }
};

// Q8_0: f16 d, 32 signed bytes; d·q.
template <int WB, int WG, typename T> struct gemma_w8<3, WB, WG, T> {
  unsigned short d;
  unsigned long long n;
  __device__ __forceinline__ void load(const void* data, const T*, const T*, size_t row, int K, int v) {
    int i;
    const uint8_t* b = gemma_block_at<3>(data, row, K, v, i);
    d = gemma_u16(b);
    n = gemma_bytes8_a2(b + 2 + i);
  }
  __device__ __forceinline__ void decode(int q[8], float& scale, float& offset) const {
    scale = gemma_f16_bits(d);
    offset = 0.0f;
    #pragma unroll
    for (int k = 0; k < 8; ++k) q[k] = static_cast<int>(static_cast<signed char>((n >> (8 * k)) & 255));
  }
};

// 6-bit scale and minimum of sub-block `sb` (0-7) of a Q4_K/Q5_K block
// whose first 16 bytes are `h`.
__device__ __forceinline__ void gemma_k_scale_min(const uint4& h, int sb, int& sc, int& m) {
  if (sb < 4) {
    sc = gemma_hbyte(h, 4 + sb) & 63;
    m = gemma_hbyte(h, 8 + sb) & 63;
  } else {
    sc = (gemma_hbyte(h, 8 + sb) & 15) | ((gemma_hbyte(h, sb) >> 6) << 4);
    m = (gemma_hbyte(h, 8 + sb) >> 4) | ((gemma_hbyte(h, 4 + sb) >> 6) << 4);
  }
}

// Q4_K and Q5_K: f16 d and dmin, 12 bytes of 6-bit scales and minimums
// (one pair per 32 values), [32 bytes of fifth bits,] 128 bytes of nibbles;
// (d·scale)·q − dmin·min.
template <int WF, int WB, int WG, typename T> struct gemma_wk {
  uint4 head;
  unsigned long long n;
  unsigned long long h;
  int i;
  __device__ __forceinline__ void load(const void* data, const T*, const T*, size_t row, int K, int v) {
    const uint8_t* b = gemma_block_at<WF>(data, row, K, v, i);
    head = *reinterpret_cast<const uint4*>(b);
    const int sb = i / 32;
    n = *reinterpret_cast<const unsigned long long*>(b + (WF == 4 ? 16 : 48) + 32 * (sb / 2) + i % 32);
    if constexpr (WF == 5) h = *reinterpret_cast<const unsigned long long*>(b + 16 + i % 32);
  }
  __device__ __forceinline__ void decode(int q[8], float& scale, float& offset) const {
    const int sb = i / 32;
    int sc, m;
    gemma_k_scale_min(head, sb, sc, m);
    scale = __fmul_rn(gemma_f16_bits(static_cast<unsigned short>(head.x & 0xffff)), static_cast<float>(sc));
    offset = -__fmul_rn(gemma_f16_bits(static_cast<unsigned short>(head.x >> 16)), static_cast<float>(m));
    const int shift = 4 * (sb % 2);
    #pragma unroll
    for (int k = 0; k < 8; ++k) {
      q[k] = static_cast<int>((n >> (8 * k + shift)) & 15);
      if constexpr (WF == 5) q[k] |= static_cast<int>(((h >> (8 * k + sb)) & 1) << 4);
    }
  }
};
template <int WB, int WG, typename T> struct gemma_w8<4, WB, WG, T> : gemma_wk<4, WB, WG, T> {};
template <int WB, int WG, typename T> struct gemma_w8<5, WB, WG, T> : gemma_wk<5, WB, WG, T> {};

// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 signed
// scales (one per 16 values), f16 d; (d·scale)·(q − 32).
template <int WB, int WG, typename T> struct gemma_w8<6, WB, WG, T> {
  unsigned long long low;
  unsigned long long high;
  unsigned short d;
  signed char sc;
  int i;
  __device__ __forceinline__ void load(const void* data, const T*, const T*, size_t row, int K, int v) {
    const uint8_t* b = gemma_block_at<6>(data, row, K, v, i);
    const int sb = i / 32, l = i % 32;
    low = gemma_bytes8_a2(b + 64 * (sb / 4) + 32 * (sb % 2) + l);
    high = gemma_bytes8_a2(b + 128 + 32 * (sb / 4) + l);
    sc = static_cast<signed char>(b[192 + 2 * sb + l / 16]);
    d = gemma_u16(b + 208);
  }
  __device__ __forceinline__ void decode(int q[8], float& scale, float& offset) const {
    const int s = (i / 32) % 4;
    scale = __fmul_rn(gemma_f16_bits(d), static_cast<float>(sc));
    offset = 0.0f;
    #pragma unroll
    for (int k = 0; k < 8; ++k) {
      q[k] = (static_cast<int>((low >> (8 * k + 4 * (s / 2))) & 15) |
              (static_cast<int>((high >> (8 * k + 2 * s)) & 3) << 4)) - 32;
    }
  }
};

// MLX affine: WB-bit codes, one scale and bias of T per WG values; scale·q + bias.
template <int WB, int WG, typename T> struct gemma_w8<7, WB, WG, T> {
  unsigned int w[WB / 4];
  T sc;
  T bi;
  __device__ __forceinline__ void load(const void* data, const T* scales, const T* biases, size_t row, int K, int v) {
    const unsigned int* words = reinterpret_cast<const unsigned int*>(data) + row * (K * WB / 32) + v * WB / 32;
    #pragma unroll
    for (int c = 0; c < WB / 4; ++c) w[c] = words[c];
    const size_t g = row * (K / WG) + v / WG;
    sc = scales[g];
    bi = biases[g];
  }
  __device__ __forceinline__ void decode(int q[8], float& scale, float& offset) const {
    scale = static_cast<float>(sc);
    offset = static_cast<float>(bi);
    #pragma unroll
    for (int k = 0; k < 8; ++k) q[k] = static_cast<int>((w[k * WB / 32] >> ((k * WB) % 32)) & ((1u << WB) - 1u));
  }
};

// Values v … v + 7 of `xs` (aligned to 16 bytes, `v` a multiple of 8) in
// 16-byte loads. Bfloat16 values widen by a shift or a mask each (the
// generic conversion takes two instructions for every odd one).
template <typename U>
__device__ __forceinline__ void gemma_x8(const U* xs, int v, float out[8]) {
  constexpr int CHUNKS = static_cast<int>(8 * sizeof(U)) / 16;
  uint4 raw[CHUNKS];
  #pragma unroll
  for (int c = 0; c < CHUNKS; ++c) raw[c] = reinterpret_cast<const uint4*>(xs + v)[c];
  if constexpr (gemma_is_bf16<U>::value) {
    #pragma unroll
    for (int k = 0; k < 4; ++k) {
      const unsigned int w = gemma_word(raw[0], k);
      out[2 * k] = __uint_as_float(w << 16);
      out[2 * k + 1] = __uint_as_float(w & 0xFFFF0000u);
    }
  } else {
    const U* u = reinterpret_cast<const U*>(raw);
    #pragma unroll
    for (int k = 0; k < 8; ++k) out[k] = static_cast<float>(u[k]);
  }
}

// A lane's 32 activations of a chunk as the 32-value readers take them:
// step i's 8 values (from the reader's `piece(c, i)`) and their sum.
struct gemma_x32 {
  float v[4][8];
  float sum[4];
};

// `q` (|q| < 2^22) as a float, by integer and float additions: the
// conversion instruction runs at an eighth of the rate of a multiply-add.
__device__ __forceinline__ float gemma_int_float(int q) {
  return __int_as_float(0x4B400000 + q) - 12582912.0f;
}

// Steps in flight of the 8-value lanes (dense rows).
constexpr int GEMMA_W8_STEPS = 8;

// 8 bytes at `p` (aligned to 2) from aligned 4-byte loads, reading no byte
// outside the 8.
__device__ __forceinline__ uint2 gemma_bytes8_a2w(const uint8_t* p) {
  const size_t at = reinterpret_cast<size_t>(p);
  const unsigned int* w = reinterpret_cast<const unsigned int*>(at & ~static_cast<size_t>(3));
  if ((at & 2) == 0) return make_uint2(w[0], w[1]);
  const unsigned int w0 = w[0], w1 = w[1], w2 = w[2];
  return make_uint2(__funnelshift_r(w0, w1, 16), __funnelshift_r(w1, w2, 16));
}

// Byte k of `q` (at most 127) as the float 0.5 + q / 256, exactly: the byte
// placed in the top of a float's mantissa.
template <int k>
__device__ __forceinline__ float gemma_half_plus(unsigned int q) {
  return __uint_as_float(__byte_perm(q, 0x3F000000u, 0x7054 | (k << 8)));
}

// Byte k of `q` as the float 2^23 + q, exactly.
template <int k>
__device__ __forceinline__ float gemma_two23_plus(unsigned int q) {
  return __uint_as_float(__byte_perm(q, 0x4B000000u, 0x7540 | k));
}

// The two 8-byte halves of `v`, the second one first where `swap`.
__device__ __forceinline__ void gemma_halves(const uint4& v, bool swap, unsigned int (&first)[2],
                                             unsigned int (&second)[2]) {
  first[0] = swap ? v.z : v.x;
  first[1] = swap ? v.w : v.y;
  second[0] = swap ? v.x : v.z;
  second[1] = swap ? v.y : v.w;
}

// The block of K-quant row `row` (of `K` values) holding chunk c (values
// 32c … 32c + 31).
template <int WF>
__device__ __forceinline__ const uint8_t* gemma_chunk_block(const void* data, size_t row, int K, int c) {
  constexpr int BYTES = gemma_wblock<WF>::BYTES;
  return reinterpret_cast<const uint8_t*>(data) + (row * static_cast<size_t>(K / 256) + (c >> 3)) * BYTES;
}

// 32 values of a K-quant row a lane reads at once (chunk c: block c / 8,
// piece c % 8 of it). Q4_K and Q5_K: the 16 bytes of nibbles at 16·(c % 8),
// whose low nibbles are values 16·h … 16·h + 15 of sub-block 2g and whose
// high nibbles the same of sub-block 2g + 1 (c % 8 = 2g + h), with the
// block's header (and for Q5_K the 16 bytes of fifth bits of those
// values). Each value enters as 0.5 + q/256 (one byte permutation), so
// that Σ q·x = 256·Σ f·x − 128·Σ x.
template <int WF> struct gemma_wk32 {
  uint4 head;
  uint4 qs;
  uint4 qh;
  template <typename T>
  __device__ __forceinline__ void load(const void* data, const T*, const T*, size_t row, int K, int c) {
    const uint8_t* b = gemma_chunk_block<WF>(data, row, K, c);
    const int r = c & 7;
    head = *reinterpret_cast<const uint4*>(b);
    qs = *reinterpret_cast<const uint4*>(b + (WF == 4 ? 16 : 48) + 16 * r);
    if constexpr (WF == 5) qh = *reinterpret_cast<const uint4*>(b + 16 + 16 * (r & 1));
  }
  // Where step i's 8 activations start: bytes 8·half … of the 16, low
  // nibbles (sub-block 2g) or high (2g + 1) as `hi`, with half = (i + g) % 2
  // and hi = (i / 2 + g / 2) % 2, so that the 8 lanes of a block read
  // activations from 8 different banks at every step, and steps 0-1 and
  // 2-3 each cover one sub-block.
  static __device__ __forceinline__ int piece(int c, int i) {
    const int r = c & 7, g = r >> 1;
    const int half = (i + g) & 1, hi = ((i >> 1) + (g >> 1)) & 1;
    return (c >> 3) * 256 + 64 * g + 16 * (r & 1) + 8 * half + 32 * hi;
  }
  __device__ __forceinline__ float dot(const gemma_x32& xv, int c, float acc) const {
    const int g = (c & 7) >> 1;
    // The 6-bit scales and minimums of sub-blocks 2g and 2g + 1, a byte
    // each in the low half of `sc` and `mn` (ggml's get_scale_min_k4 for
    // both at once; the header's words y, z, w hold scale bytes 0-11).
    const int shift = 16 * (g & 1);
    const unsigned int a = head.y >> shift, b = head.z >> shift, e = head.w >> shift;
    const bool upper = g >= 2;
    const unsigned int sc = upper ? (e & 0x0F0Fu) | ((a >> 2) & 0x3030u) : a & 0x3F3Fu;
    const unsigned int mn = upper ? ((e >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u) : b & 0x3F3Fu;
    const float d = gemma_f16_bits(static_cast<unsigned short>(head.x & 0xffff));
    const float dmin = gemma_f16_bits(static_cast<unsigned short>(head.x >> 16));
    const float scale[2] = {__fmul_rn(d, gemma_two23_plus<0>(sc) - 8388608.0f),
                            __fmul_rn(d, gemma_two23_plus<1>(sc) - 8388608.0f)};
    const float minimum[2] = {__fmul_rn(dmin, gemma_two23_plus<0>(mn) - 8388608.0f),
                              __fmul_rn(dmin, gemma_two23_plus<1>(mn) - 8388608.0f)};
    // Even steps take bytes 8·(g % 2) …, odd ones the other 8.
    unsigned int first[2], second[2], fifth_first[2] = {0u, 0u}, fifth_second[2] = {0u, 0u};
    gemma_halves(qs, g & 1, first, second);
    if constexpr (WF == 5) gemma_halves(qh, g & 1, fifth_first, fifth_second);
    #pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      const int hi = (pair + (g >> 1)) & 1;
      float f = 0.0f;
      #pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int i = 2 * pair + k;
        const float* x = xv.v[i];
        const unsigned int* words = k ? second : first;
        unsigned int q[2] = {(words[0] >> (4 * hi)) & 0x0F0F0F0Fu, (words[1] >> (4 * hi)) & 0x0F0F0F0Fu};
        if constexpr (WF == 5) {
          const unsigned int* fifth = k ? fifth_second : fifth_first;
          q[0] |= ((fifth[0] >> (2 * g + hi)) & 0x01010101u) << 4;
          q[1] |= ((fifth[1] >> (2 * g + hi)) & 0x01010101u) << 4;
        }
        #pragma unroll
        for (int j = 0; j < 2; ++j) {
          f = fmaf(gemma_half_plus<0>(q[j]), x[4 * j], f);
          f = fmaf(gemma_half_plus<1>(q[j]), x[4 * j + 1], f);
          f = fmaf(gemma_half_plus<2>(q[j]), x[4 * j + 2], f);
          f = fmaf(gemma_half_plus<3>(q[j]), x[4 * j + 3], f);
        }
      }
      // The sub-block's 16 values: Σ q·x = 256·Σ f·x − 128·Σ x.
      const float xsum = xv.sum[2 * pair] + xv.sum[2 * pair + 1];
      acc = fmaf(hi ? scale[1] : scale[0], fmaf(256.0f, f, -128.0f * xsum), acc);
      acc = fmaf(-(hi ? minimum[1] : minimum[0]), xsum, acc);
    }
    return acc;
  }
};

// Q6_K's 32 values of a lane (chunk c: block c / 8, half p = (c % 8) / 4 of
// it, m = c % 4): positions l = 8m … 8m + 7 of the half's four groups of 32
// (group t: low nibbles of bytes l of the half's first 32 bytes for t = 0,
// of its second 32 for t = 1, their high nibbles for t = 2, 3; two high
// bits each from bits 2t of the half's 32 bytes of high bits), each group
// with its signed scale. Each value enters exactly as 2^23 + q.
struct gemma_w6k32 {
  uint2 la;
  uint2 lb;
  uint2 hb;
  uint2 sc;
  unsigned short d;
  template <typename T>
  __device__ __forceinline__ void load(const void* data, const T*, const T*, size_t row, int K, int c) {
    const uint8_t* b = gemma_chunk_block<6>(data, row, K, c);
    const int p = (c >> 2) & 1, l = 8 * (c & 3);
    la = gemma_bytes8_a2w(b + 64 * p + l);
    lb = gemma_bytes8_a2w(b + 64 * p + 32 + l);
    hb = gemma_bytes8_a2w(b + 128 + 32 * p + l);
    sc = gemma_bytes8_a2w(b + 192 + 8 * p);
    d = gemma_u16(b + 208);
  }
  // Where step i's 8 activations start: group (i + p) % 4 (below).
  static __device__ __forceinline__ int piece(int c, int i) {
    const int p = (c >> 2) & 1;
    return (c >> 3) * 256 + 128 * p + 8 * (c & 3) + 32 * ((i + p) & 3);
  }
  __device__ __forceinline__ float dot(const gemma_x32& xv, int c, float acc) const {
    const int p = (c >> 2) & 1, m = c & 3;
    const float dd = gemma_f16_bits(d);
    // Group t = (i + p) % 4 at step i: the two halves' lanes of a block
    // read activations from different banks.
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int t = (i + p) & 3;
      const float* x = xv.v[i];
      const unsigned int low[2] = {(t & 1) ? lb.x : la.x, (t & 1) ? lb.y : la.y};
      const unsigned int high[2] = {hb.x, hb.y};
      float s = 0.0f;
      #pragma unroll
      for (int w = 0; w < 2; ++w) {
        const unsigned int q = ((low[w] >> (4 * (t >> 1))) & 0x0F0F0F0Fu) |
                               (((high[w] >> (2 * t)) & 0x03030303u) << 4);
        const float* a = x + 4 * w;
        s = fmaf(gemma_two23_plus<0>(q) - 8388640.0f, a[0], s);
        s = fmaf(gemma_two23_plus<1>(q) - 8388640.0f, a[1], s);
        s = fmaf(gemma_two23_plus<2>(q) - 8388640.0f, a[2], s);
        s = fmaf(gemma_two23_plus<3>(q) - 8388640.0f, a[3], s);
      }
      const int k = (m >> 1) + 2 * t;
      const unsigned int byte = ((k < 4 ? sc.x : sc.y) >> (8 * (k & 3))) & 255u;
      const float scale = gemma_int_float(static_cast<int>(byte ^ 128u) - 128);
      acc = fmaf(__fmul_rn(dd, scale), s, acc);
    }
    return acc;
  }
};

// Which 8 values of a lane's 32 (chunk c, values 32c … 32c + 31) the
// affine and 32-value block readers take at step i: piece (i + c / 2) % 4,
// so that the 8 lanes of a shared-memory phase read 8 different groups of
// banks; and where those values start.
__device__ __forceinline__ int gemma_block32_order(int c, int i) { return (i + (c >> 1)) & 3; }
__device__ __forceinline__ int gemma_block32_piece(int c, int i) { return 32 * c + 8 * gemma_block32_order(c, i); }

// MLX affine rows, 32 values a lane (chunk c: values 32c … 32c + 31, in
// one group): WB-bit codes (4 bits: one 16-byte load, value 8i + k in bits
// 4k of word i; 8 bits: two) with the group's scale and bias. 4-bit codes
// enter as 0.5 + q/256, 8-bit ones exactly as 2^23 + q.
template <int WB, int WG, typename T> struct gemma_wa32 {
  uint4 w[WB / 4];
  T sc;
  T bi;
  __device__ __forceinline__ void load(const void* data, const T* scales, const T* biases, size_t row, int K, int c) {
    const uint4* words = reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned int*>(data) + row * (K * WB / 32)) +
                         c * (WB / 4);
    #pragma unroll
    for (int i = 0; i < WB / 4; ++i) w[i] = words[i];
    const size_t g = row * (K / WG) + c * 32 / WG;
    sc = scales[g];
    bi = biases[g];
  }
  static __device__ __forceinline__ int piece(int c, int step) { return gemma_block32_piece(c, step); }
  __device__ __forceinline__ float dot(const gemma_x32& xv, int c, float acc) const {
    float f = 0.0f, xsum = 0.0f;
    #pragma unroll
    for (int step = 0; step < 4; ++step) {
      const int i = gemma_block32_order(c, step);
      const float* x = xv.v[step];
      if constexpr (WB == 4) {
        const unsigned int word = gemma_word(w[0], i);
        const unsigned int lo = word & 0x0F0F0F0Fu, hi = (word >> 4) & 0x0F0F0F0Fu;
        f = fmaf(gemma_half_plus<0>(lo), x[0], f);
        f = fmaf(gemma_half_plus<0>(hi), x[1], f);
        f = fmaf(gemma_half_plus<1>(lo), x[2], f);
        f = fmaf(gemma_half_plus<1>(hi), x[3], f);
        f = fmaf(gemma_half_plus<2>(lo), x[4], f);
        f = fmaf(gemma_half_plus<2>(hi), x[5], f);
        f = fmaf(gemma_half_plus<3>(lo), x[6], f);
        f = fmaf(gemma_half_plus<3>(hi), x[7], f);
      } else {
        #pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int k = 2 * (i & 1) + j;
          const unsigned int q = (i >> 1) ? gemma_word(w[WB / 4 - 1], k) : gemma_word(w[0], k);
          f = fmaf(gemma_two23_plus<0>(q) - 8388608.0f, x[4 * j], f);
          f = fmaf(gemma_two23_plus<1>(q) - 8388608.0f, x[4 * j + 1], f);
          f = fmaf(gemma_two23_plus<2>(q) - 8388608.0f, x[4 * j + 2], f);
          f = fmaf(gemma_two23_plus<3>(q) - 8388608.0f, x[4 * j + 3], f);
        }
      }
      xsum += xv.sum[step];
    }
    const float q = WB == 4 ? fmaf(256.0f, f, -128.0f * xsum) : f;
    return fmaf(static_cast<float>(sc), q, fmaf(static_cast<float>(bi), xsum, acc));
  }
};

// The block of a 32-value block type (18, 22 or 34 bytes, 2-aligned) as
// little-endian words from aligned 4-byte loads: word i holds bytes 4i …
// 4i + 3, the last word its two bytes. No byte outside the block is read.
template <int BYTES>
__device__ __forceinline__ void gemma_block_words(const uint8_t* p, unsigned int (&w)[(BYTES + 2) / 4]) {
  constexpr int N = (BYTES + 2) / 4;
  const size_t at = reinterpret_cast<size_t>(p);
  const unsigned int* a = reinterpret_cast<const unsigned int*>(at & ~static_cast<size_t>(3));
  const unsigned int shift = (at & 2) ? 16u : 0u;
  unsigned int raw[N];
  #pragma unroll
  for (int i = 0; i < N - 1; ++i) raw[i] = a[i];
  raw[N - 1] = shift ? a[N - 1] : static_cast<unsigned int>(*reinterpret_cast<const unsigned short*>(p + BYTES - 2));
  #pragma unroll
  for (int i = 0; i < N - 1; ++i) w[i] = __funnelshift_r(raw[i], raw[i + 1], shift);
  w[N - 1] = raw[N - 1] >> shift;
}

// Bits k … k + 3 of `bits` spread to bit 0 of bytes 0 … 3.
__device__ __forceinline__ unsigned int gemma_spread4(unsigned int bits, int k) {
  return (((bits >> k) & 15u) * 0x00204081u) & 0x01010101u;
}

// Q4_0, Q5_0 and Q8_0, a lane a block (chunk c: values 32c … 32c + 31),
// each value exactly as 2^23 + q. Pieces of 8 values at step i: piece
// (i + c / 2) % 4, so that the 8 lanes of a shared-memory phase read 8
// different groups of banks (a lane's 64 bytes of activations start on
// bank 0 or 16).
template <int WF> struct gemma_wb32 {
  static constexpr int BYTES = gemma_wblock<WF>::BYTES;
  static constexpr int N = (BYTES + 2) / 4;
  unsigned int w[N];
  template <typename T>
  __device__ __forceinline__ void load(const void* data, const T*, const T*, size_t row, int K, int c) {
    const uint8_t* b = reinterpret_cast<const uint8_t*>(data) + (row * static_cast<size_t>(K / 32) + c) * BYTES;
    gemma_block_words<BYTES>(b, w);
  }
  static __device__ __forceinline__ int piece(int c, int i) { return gemma_block32_piece(c, i); }
  __device__ __forceinline__ float dot(const gemma_x32& xv, int c, float acc) const {
    // The codes start at byte 6 (Q5_0) or 2: word j of them is the high
    // half of block word AT + j and the low half of the next.
    constexpr int AT = WF == 2 ? 1 : 0;
    constexpr int WORDS = WF == 3 ? 8 : 4;
    unsigned int code[WORDS];
    #pragma unroll
    for (int j = 0; j < WORDS; ++j) code[j] = __funnelshift_r(w[AT + j], w[AT + j + 1], 16);
    const float d = gemma_f16_bits(static_cast<unsigned short>(w[0] & 0xffff));
    const unsigned int high = WF == 2 ? __funnelshift_r(w[0], w[1], 16) : 0u;
    constexpr float ZERO = WF == 3 ? 8388736.0f : (WF == 2 ? 8388624.0f : 8388616.0f);
    float s = 0.0f;
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int p = gemma_block32_order(c, i);
      const float* x = xv.v[i];
      #pragma unroll
      for (int h = 0; h < 2; ++h) {
        unsigned int q;
        if constexpr (WF == 3) {
          const unsigned int lo = p & 1 ? code[2 + h] : code[h];
          const unsigned int hi = p & 1 ? code[6 + h] : code[4 + h];
          q = (p & 2 ? hi : lo) ^ 0x80808080u;
        } else {
          q = (((p & 1) ? code[2 + h] : code[h]) >> (4 * (p >> 1))) & 0x0F0F0F0Fu;
          if constexpr (WF == 2) q |= gemma_spread4(high, 8 * p + 4 * h) << 4;
        }
        const float* a = x + 4 * h;
        s = fmaf(gemma_two23_plus<0>(q) - ZERO, a[0], s);
        s = fmaf(gemma_two23_plus<1>(q) - ZERO, a[1], s);
        s = fmaf(gemma_two23_plus<2>(q) - ZERO, a[2], s);
        s = fmaf(gemma_two23_plus<3>(q) - ZERO, a[3], s);
      }
    }
    return fmaf(d, s, acc);
  }
};

template <int WF, int WB, int WG, typename T> struct gemma_w32;
template <int WB, int WG, typename T> struct gemma_w32<4, WB, WG, T> : gemma_wk32<4> {};
template <int WB, int WG, typename T> struct gemma_w32<5, WB, WG, T> : gemma_wk32<5> {};
template <int WB, int WG, typename T> struct gemma_w32<6, WB, WG, T> : gemma_w6k32 {};
template <int WB, int WG, typename T> struct gemma_w32<7, WB, WG, T> : gemma_wa32<WB, WG, T> {};
template <int WB, int WG, typename T> struct gemma_w32<1, WB, WG, T> : gemma_wb32<1> {};
template <int WB, int WG, typename T> struct gemma_w32<2, WB, WG, T> : gemma_wb32<2> {};
template <int WB, int WG, typename T> struct gemma_w32<3, WB, WG, T> : gemma_wb32<3> {};

// Steps of 32-value chunks in flight.
constexpr int GEMMA_W32_STEPS = 4;

// Row `row` (of `K` values, format WF) dotted with `xs` (`K` values of `U`
// in shared memory): this lane's share, to be summed over the warp. Rows
// of blocks and MLX affine rows go 32 values a lane and 1,024 a warp at a
// time, each chunk's activations widened and summed in pieces of 8 before
// its reader takes them; dense rows 8 and 256. The loads of several steps
// are issued before any is used.
template <int WF, int WB, int WG, typename T, typename U>
__device__ __forceinline__ float gemma_wdot_lane(const void* data, const T* scales, const T* biases,
                                                 size_t row, int K, const U* xs, int lane) {
  float acc = 0.0f;
  if constexpr (WF != 0) {
    using W = gemma_w32<WF, WB, WG, T>;
    constexpr int STEPS = GEMMA_W32_STEPS;
    const int chunks = K / 32;
    for (int c0 = lane; c0 < chunks; c0 += 32 * STEPS) {
      W w[STEPS];
      #pragma unroll
      for (int u = 0; u < STEPS; ++u) {
        if (c0 + 32 * u < chunks) w[u].load(data, scales, biases, row, K, c0 + 32 * u);
      }
      #pragma unroll
      for (int u = 0; u < STEPS; ++u) {
        const int c = c0 + 32 * u;
        if (c < chunks) {
          gemma_x32 x;
          #pragma unroll
          for (int i = 0; i < 4; ++i) {
            gemma_x8(xs, W::piece(c, i), x.v[i]);
            const float* v = x.v[i];
            x.sum[i] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
          }
          acc = w[u].dot(x, c, acc);
        }
      }
    }
  } else {
    constexpr int STEPS = GEMMA_W8_STEPS;
    for (int v0 = 8 * lane; v0 < K; v0 += 256 * STEPS) {
      gemma_w8<WF, WB, WG, T> w[STEPS];
      #pragma unroll
      for (int u = 0; u < STEPS; ++u) {
        if (v0 + 256 * u < K) w[u].load(data, scales, biases, row, K, v0 + 256 * u);
      }
      #pragma unroll
      for (int u = 0; u < STEPS; ++u) {
        if (v0 + 256 * u < K) {
          float x[8];
          gemma_x8(xs, v0 + 256 * u, x);
          acc += w[u].dot(x);
        }
      }
    }
  }
  return acc;
}

__device__ __forceinline__ float gemma_rows_sum(float v) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
"#;
