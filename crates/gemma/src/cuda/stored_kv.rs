//! Keys and values as the GPU kernels read and write them in every cache
//! format: the CUDA device functions that decode a lane's share of a stored
//! row in registers and encode a new row exactly as the eager path does,
//! and [`StoredSide`], one side of a store as a kernel's inputs and
//! template arguments.
//!
//! Formats (the kernels' `F` template argument): 0 floats of the compute
//! dtype; 1 MLX's affine quantization ([`mlx_core::quantize`]: `BITS`-bit
//! codes packed least significant bit first, one scale and bias per `GS`
//! values, `value = scale·code + bias`); 2 TurboQuant
//! ([`crate::cache::turbo`]), decoded in its rotated domain; 3 ggml's
//! 32-value blocks (`BITS` the block type of [`KV_BLOCKS_CUDA`]), encoded
//! a thread per block and decoded value by value as the CPU does.

use mlx_core::kernel::TemplateArg;
use mlx_core::{Array, Dtype};

use crate::cache::{turbo, KvStore};
use crate::quant::{kv_block_type, KV_BLOCKS_CUDA};

/// Device functions shared by the decode attention and layer kernels; see
/// the module documentation.
pub(super) fn header() -> String {
    let mut header = String::new();
    for bits in [2, 3, 4] {
        header.push_str(&float_table(
            &format!("GEMMA_TURBO_CODEBOOK{bits}"),
            &turbo::codebook(bits),
        ));
        header.push_str(&float_table(
            &format!("GEMMA_TURBO_MIDPOINTS{bits}"),
            &turbo::midpoints(bits),
        ));
    }
    for (name, table) in [
        ("GEMMA_TURBO_SIGNS_BEFORE", &turbo::SIGNS_BEFORE),
        ("GEMMA_TURBO_SIGNS_AFTER", &turbo::SIGNS_AFTER),
    ] {
        let bytes: Vec<String> = table.iter().map(|b| format!("{b:#04x}")).collect();
        header.push_str(&format!(
            "__device__ const unsigned char {name}[16] = {{{}}};\n",
            bytes.join(", ")
        ));
    }
    header.push_str(&format!(
        "constexpr float GEMMA_TURBO_SCALE = {:e}f;\n",
        turbo::hadamard_scale()
    ));
    header.push_str(KV_BLOCKS_CUDA);
    header.push_str(DEVICE_FUNCTIONS);
    header
}

/// A `__device__` float array of `values`.
fn float_table(name: &str, values: &[f32]) -> String {
    let values: Vec<String> = values.iter().map(|c| format!("{c:e}f")).collect();
    format!(
        "__device__ const float {name}[{}] = {{{}}};\n",
        values.len(),
        values.join(", ")
    )
}

/// See [`header`]. TurboQuant's index layout is
/// [`crate::cache::turbo::TurboArray`]'s: per 128-value group, 2-bit and
/// 4-bit indices as one stream, 3-bit ones as the stream of their low two
/// bits (32 bytes) then the stream of their high bits (16 bytes). The
/// encoders are block-wide (every thread of the block calls them) and end
/// with the block synchronised.
const DEVICE_FUNCTIONS: &str = r#"
template <int F, typename T> struct gemma_kv_elem { using type = float; };
template <typename T> struct gemma_kv_elem<0, T> { using type = T; };

template <int BITS>
__device__ __forceinline__ float gemma_turbo_centroid(const uint8_t* group, int i) {
  if (BITS == 4) return GEMMA_TURBO_CODEBOOK4[(group[i >> 1] >> ((i & 1) * 4)) & 15];
  const int low = (group[i >> 2] >> ((i & 3) * 2)) & 3;
  if (BITS == 2) return GEMMA_TURBO_CODEBOOK2[low];
  return GEMMA_TURBO_CODEBOOK3[low | (((group[32 + (i >> 3)] >> (i & 7)) & 1) << 2)];
}

// Codes of values first … first + E − 1 of a row packed least significant
// bit first, BITS bits each: whole 32-bit words where a lane's share is
// made of them, bytes otherwise.
template <int BITS, int E>
__device__ __forceinline__ void gemma_unpack_codes(const uint8_t* row, int first, unsigned int* codes) {
  constexpr unsigned int MASK = (1u << BITS) - 1u;
  if constexpr ((E * BITS) % 32 == 0) {
    constexpr int WORDS = E * BITS / 32;
    const unsigned int* src = reinterpret_cast<const unsigned int*>(row + first * BITS / 8);
    unsigned int w[WORDS + 1];
    #pragma unroll
    for (int c = 0; c < WORDS; ++c) w[c] = src[c];
    w[WORDS] = 0u;
    #pragma unroll
    for (int e = 0; e < E; ++e) {
      const int i = e * BITS / 32;
      const int s = e * BITS % 32;
      unsigned int v = w[i] >> s;
      if (s + BITS > 32) v |= w[i + 1] << (32 - s);
      codes[e] = v & MASK;
    }
  } else {
    #pragma unroll
    for (int e = 0; e < E; ++e) {
      const int bit = (first + e) * BITS;
      const int s = bit & 7;
      unsigned int v = static_cast<unsigned int>(row[bit >> 3]) >> s;
      if (s + BITS > 8) v |= static_cast<unsigned int>(row[(bit >> 3) + 1]) << (8 - s);
      codes[e] = v & MASK;
    }
  }
}

// Values lane·E … lane·E + E − 1 of row `row` (of D values) of a stored
// side of format F (the module's formats; TurboQuant's norms in `scales`).
template <int F, int BITS, int GS, int D, int E, typename T, typename S, typename B>
__device__ __forceinline__ void gemma_kv_row(
    const void* data, const S* scales, const B* biases, size_t row, int lane,
    typename gemma_kv_elem<F, T>::type* out) {
  const int first = lane * E;
  if constexpr (F == 0) {
    const T* r = reinterpret_cast<const T*>(data) + row * D + first;
    #pragma unroll
    for (int e = 0; e < E; ++e) out[e] = r[e];
  } else if constexpr (F == 1) {
    unsigned int codes[E];
    gemma_unpack_codes<BITS, E>(reinterpret_cast<const uint8_t*>(data) + row * (D * BITS / 8), first, codes);
    const size_t g = row * (D / GS) + first / GS;
    const float scale = static_cast<float>(scales[g]);
    const float bias = static_cast<float>(biases[g]);
    #pragma unroll
    for (int e = 0; e < E; ++e) out[e] = scale * static_cast<float>(codes[e]) + bias;
  } else if constexpr (F == 3) {
    constexpr int BYTES = gemma_kv_type<BITS>::BYTES;
    const unsigned char* block =
        reinterpret_cast<const unsigned char*>(data) + row * (D / 32 * BYTES) + (first / 32) * BYTES;
    #pragma unroll
    for (int e = 0; e < E; ++e) out[e] = gemma_kv_value<BITS>(block, first % 32 + e);
  } else {
    constexpr int P = 16 * BITS;
    const int g = first / 128;
    const uint8_t* group = reinterpret_cast<const uint8_t*>(data) + row * (D / 128 * P) + g * P;
    const float norm = static_cast<float>(scales[row * (D / 128) + g]);
    #pragma unroll
    for (int e = 0; e < E; ++e) out[e] = gemma_turbo_centroid<BITS>(group, first % 128 + e) * norm;
  }
}

// Byte k of the stream of fields (codes[i] >> SHIFT) & (2^WIDTH − 1), least
// significant bit first.
template <int WIDTH, int SHIFT>
__device__ __forceinline__ uint8_t gemma_stream_byte(const unsigned char* codes, int k) {
  unsigned int byte = 0u;
  #pragma unroll
  for (int b = 0; b < 8; ++b) {
    const int bit = k * 8 + b;
    byte |= ((static_cast<unsigned int>(codes[bit / WIDTH]) >> (SHIFT + bit % WIDTH)) & 1u) << b;
  }
  return static_cast<uint8_t>(byte);
}

// x ← D(second)·(H/√128)·D(first)·x on each 128-value group of x[0, n), in
// shared memory (H the Walsh–Hadamard matrix, D(s) the signs of bit table
// s, a set bit −1).
__device__ __forceinline__ void gemma_turbo_rotate(
    float* x, int n, const unsigned char* first, const unsigned char* second) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if ((first[(i & 127) >> 3] >> (i & 7)) & 1) x[i] = -x[i];
  }
  __syncthreads();
  for (int h = 1; h < 128; h <<= 1) {
    for (int p = threadIdx.x; p < n / 2; p += blockDim.x) {
      const int k = p & 63;
      const int lo = (p >> 6) * 128 + (k / h) * 2 * h + k % h;
      const float a = x[lo];
      const float b = x[lo + h];
      x[lo] = a + b;
      x[lo + h] = a - b;
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float y = x[i] * GEMMA_TURBO_SCALE;
    x[i] = (second[(i & 127) >> 3] >> (i & 7)) & 1 ? -y : y;
  }
  __syncthreads();
}

// Sum over the 32 lanes of a warp; every lane gets it.
__device__ __forceinline__ float gemma_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Encodes the row `v` (D floats of T's values, in shared memory) in format
// F as the eager path does (MLX's affine quantization; TurboQuant's
// encoder), leaves in `v` the values attention reads back (TurboQuant's in
// the rotated domain), and with `write` stores the row at `row` of the
// side. `codes` (D bytes) and `par` (D / 32 floats) are shared scratch.
template <int F, int BITS, int GS, int D, typename T, typename S, typename B>
__device__ __forceinline__ void gemma_kv_encode(
    float* v, unsigned char* codes, float* par, bool write,
    const void* data, const S* scales, const B* biases, size_t row) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  if constexpr (F == 1) {
    constexpr int PER = GS / 32;
    constexpr float N_BINS = static_cast<float>((1 << BITS) - 1);
    for (int g = warp; g < D / GS; g += warps) {
      float w[PER];
      float lo = 3.402823466e38f;
      float hi = 0.0f;
      #pragma unroll
      for (int p = 0; p < PER; ++p) {
        w[p] = v[g * GS + lane * PER + p];
        lo = fminf(lo, w[p]);
        hi = fmaxf(hi, w[p]);
      }
      for (int o = 16; o > 0; o >>= 1) {
        lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
      }
      float scale = fmaxf((hi - lo) / N_BINS, 1e-7f);
      const bool side = fabsf(lo) > fabsf(hi);
      scale = side ? scale : -scale;
      const float edge = side ? lo : hi;
      const float q0 = roundf(edge / scale);
      const bool at_zero = q0 == 0.0f;
      scale = at_zero ? scale : edge / q0;
      const float bias = at_zero ? 0.0f : edge;
      const float scale_t = static_cast<float>(static_cast<S>(scale));
      const float bias_t = static_cast<float>(static_cast<B>(bias));
      #pragma unroll
      for (int p = 0; p < PER; ++p) {
        const float q = fmaxf(fminf(roundf((w[p] - bias) / scale), N_BINS), 0.0f);
        codes[g * GS + lane * PER + p] = static_cast<unsigned char>(q);
        v[g * GS + lane * PER + p] = scale_t * q + bias_t;
      }
      if (lane == 0) {
        par[2 * g] = scale_t;
        par[2 * g + 1] = bias_t;
      }
    }
    __syncthreads();
    if (write) {
      uint8_t* out = reinterpret_cast<uint8_t*>(const_cast<void*>(data)) + row * (D * BITS / 8);
      for (int k = threadIdx.x; k < D * BITS / 8; k += blockDim.x) {
        out[k] = gemma_stream_byte<BITS, 0>(codes, k);
      }
      for (int g = threadIdx.x; g < D / GS; g += blockDim.x) {
        const_cast<S*>(scales)[row * (D / GS) + g] = static_cast<S>(par[2 * g]);
        const_cast<B*>(biases)[row * (D / GS) + g] = static_cast<B>(par[2 * g + 1]);
      }
    }
  } else if constexpr (F == 2) {
    constexpr int G = D / 128;
    for (int g = warp; g < G; g += warps) {
      float ss = 0.0f;
      for (int i = lane; i < 128; i += 32) ss += v[g * 128 + i] * v[g * 128 + i];
      ss = gemma_warp_sum(ss);
      if (lane == 0) par[g] = sqrtf(ss);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
      const float length = par[i / 128];
      v[i] = length > 1e-10f ? v[i] / length : 0.0f;
    }
    __syncthreads();
    gemma_turbo_rotate(v, D, GEMMA_TURBO_SIGNS_BEFORE, GEMMA_TURBO_SIGNS_AFTER);
    const float* mids = BITS == 2 ? GEMMA_TURBO_MIDPOINTS2 : (BITS == 3 ? GEMMA_TURBO_MIDPOINTS3 : GEMMA_TURBO_MIDPOINTS4);
    const float* book = BITS == 2 ? GEMMA_TURBO_CODEBOOK2 : (BITS == 3 ? GEMMA_TURBO_CODEBOOK3 : GEMMA_TURBO_CODEBOOK4);
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
      int idx = 0;
      #pragma unroll
      for (int m = 0; m < (1 << BITS) - 1; ++m) idx += v[i] >= mids[m] ? 1 : 0;
      codes[i] = static_cast<unsigned char>(idx);
      v[i] = book[idx];
    }
    __syncthreads();
    for (int g = warp; g < G; g += warps) {
      float cc = 0.0f;
      for (int i = lane; i < 128; i += 32) cc += v[g * 128 + i] * v[g * 128 + i];
      cc = sqrtf(gemma_warp_sum(cc));
      if (lane == 0) {
        const float length = par[g];
        par[G + g] = static_cast<float>(static_cast<S>(cc > 1e-10f ? length / cc : length));
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < D; i += blockDim.x) v[i] *= par[G + i / 128];
    if (write) {
      constexpr int P = 16 * BITS;
      uint8_t* out = reinterpret_cast<uint8_t*>(const_cast<void*>(data)) + row * (G * P);
      for (int k = threadIdx.x; k < G * P; k += blockDim.x) {
        const unsigned char* group = codes + (k / P) * 128;
        const int b = k % P;
        uint8_t byte;
        if constexpr (BITS != 3) byte = gemma_stream_byte<BITS, 0>(group, b);
        else byte = b < 32 ? gemma_stream_byte<2, 0>(group, b) : gemma_stream_byte<1, 2>(group, b - 32);
        out[k] = byte;
      }
      for (int g = threadIdx.x; g < G; g += blockDim.x) {
        const_cast<S*>(scales)[row * G + g] = static_cast<S>(par[G + g]);
      }
    }
    __syncthreads();
  } else if constexpr (F == 3) {
    constexpr int BYTES = gemma_kv_type<BITS>::BYTES;
    for (int b = threadIdx.x; b < D / 32; b += blockDim.x) {
      float x[32];
      for (int j = 0; j < 32; ++j) x[j] = v[32 * b + j];
      unsigned char block[BYTES];
      gemma_kv_quantize<BITS>(x, block);
      if (write) {
        unsigned char* out = reinterpret_cast<unsigned char*>(const_cast<void*>(data)) + row * (D / 32 * BYTES) + b * BYTES;
        for (int k = 0; k < BYTES; ++k) out[k] = block[k];
      }
      for (int j = 0; j < 32; ++j) v[32 * b + j] = gemma_kv_value<BITS>(block, j);
    }
    __syncthreads();
  }
}
"#;

/// The format number of ggml blocks.
const BLOCKS: i32 = 3;

/// Bytes of a block of each ggml type number (`gemma_kv_type<Q>::BYTES`).
const BLOCK_BYTES: [i32; 6] = [34, 18, 20, 22, 24, 18];

/// One side (keys or values) of a store as the kernels read it: its arrays
/// and its format's template arguments (`F`, `BITS`, `GS`).
pub(super) struct StoredSide {
    /// The floats, the packed codes, or the packed TurboQuant indices.
    pub data: Array,
    /// Affine scales or TurboQuant norms.
    scales: Option<Array>,
    /// Affine biases.
    biases: Option<Array>,
    /// The format (0 float, 1 affine, 2 TurboQuant, [`BLOCKS`] ggml blocks).
    format: i32,
    /// Bits per value of a compressed format (ggml blocks: the block type,
    /// `Q` of [`KV_BLOCKS_CUDA`]).
    bits: i32,
    /// Values per affine group.
    group: i32,
}

impl StoredSide {
    /// The side of a store.
    pub fn of(store: &KvStore) -> StoredSide {
        match store {
            KvStore::Float(a) => StoredSide {
                data: a.clone(),
                scales: None,
                biases: None,
                format: 0,
                bits: 0,
                group: 0,
            },
            KvStore::Quantized(q) => StoredSide {
                data: q.packed.clone(),
                scales: Some(q.scales.clone()),
                biases: Some(q.biases.clone()),
                format: 1,
                bits: q.bits,
                group: q.group_size,
            },
            KvStore::Turbo(t) => StoredSide {
                data: t.packed.clone(),
                scales: Some(t.norms.clone()),
                biases: None,
                format: 2,
                bits: t.bits,
                group: 0,
            },
            KvStore::Block(b) => StoredSide {
                data: b.bytes.clone(),
                scales: None,
                biases: None,
                format: BLOCKS,
                bits: kv_block_type(b.dtype).unwrap_or(-1),
                group: 0,
            },
        }
    }

    /// Whether the kernels take this side for heads of `d` values computed
    /// in `dtype`: floats of that dtype, affine codes of 2 to 8 bits in
    /// groups of 32, 64 or 128 that divide `d` into at most `max_groups`
    /// groups, TurboQuant groups, or ggml blocks; the data's last axis as
    /// the format lays out `d` values.
    pub fn suits(&self, dtype: Dtype, d: i32, max_groups: i32) -> bool {
        let width = self.data.dim(-1).ok();
        match self.format {
            0 => self.data.dtype() == dtype && width == Some(d),
            1 => {
                [2, 3, 4, 5, 6, 8].contains(&self.bits)
                    && [32, 64, 128].contains(&self.group)
                    && d % self.group == 0
                    && d / self.group <= max_groups
                    && width == Some(d * self.bits / 32)
            }
            2 => {
                d % turbo::TURBO_GROUP == 0
                    && width == Some(d / turbo::TURBO_GROUP * turbo::packed_group_bytes(self.bits))
            }
            BLOCKS => {
                let bytes = usize::try_from(self.bits)
                    .ok()
                    .and_then(|q| BLOCK_BYTES.get(q).copied());
                let held = self.data.dtype().size_bytes() as i32;
                match (bytes, width) {
                    (Some(bytes), Some(width)) => {
                        d % 32 == 0
                            && matches!(self.data.dtype(), Dtype::Int8 | Dtype::Int16)
                            && width * held == d / 32 * bytes
                    }
                    _ => false,
                }
            }
            _ => false,
        }
    }

    /// The side's three kernel inputs (data, scales, biases), `unused`
    /// standing in for arrays the format lacks.
    pub fn inputs<'a>(&'a self, unused: &'a Array) -> [&'a Array; 3] {
        [
            &self.data,
            self.scales.as_ref().unwrap_or(unused),
            self.biases.as_ref().unwrap_or(unused),
        ]
    }

    /// The side's template arguments under `names` (format, bits, group).
    pub fn template_args(&self, names: [&'static str; 3]) -> [(&'static str, TemplateArg); 3] {
        let [f, b, g] = names;
        [
            (f, TemplateArg::Int(self.format)),
            (b, TemplateArg::Int(self.bits)),
            (g, TemplateArg::Int(self.group)),
        ]
    }
}
