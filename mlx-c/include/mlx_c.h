/*
 * mlx_c.h: this project's C API over MLX's C++ API.
 *
 * One calling pattern for everything that can fail:
 *   - the function returns an int status: 0 on success, non-zero on failure;
 *   - results go out through pointers given first (`out`);
 *   - inputs are opaque handles (`mlx_array`, `mlx_stream`, ...) or plain C values;
 *   - a stream, when the operation takes one, comes last; NULL means the
 *     default stream of the default device;
 *   - on failure the message of the C++ exception is kept per thread and read
 *     with `mlx_last_error()`; no C++ exception ever crosses this boundary and
 *     nothing here calls exit or abort.
 *
 * Every handle a function writes to `out` is new and owned by the caller, who
 * frees it with the matching `*_free`. Freeing NULL is a no-op. An `out`
 * handle is written only on success.
 *
 * Optional array arguments are marked "nullable": pass NULL for "none".
 * Shapes and axes are given as a pointer and a length.
 */
#ifndef MLX_C_H
#define MLX_C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- handles ----------------------------------------------------------- */

/** An MLX array (shares its data with copies made by mlx_array_clone). */
typedef struct mlx_array_s* mlx_array;
/** A growable list of arrays (outputs of compiled functions). */
typedef struct mlx_vector_array_s* mlx_vector_array;
/** A device: CPU or GPU, with an index. */
typedef struct mlx_device_s* mlx_device;
/** A stream of work on one device. */
typedef struct mlx_stream_s* mlx_stream;
/** A function of arrays to arrays, possibly compiled. */
typedef struct mlx_closure_s* mlx_closure;
/** A compiled CUDA program (a cubin; see mlx_cuda_compile). */
typedef struct mlx_cuda_binary_s* mlx_cuda_binary;
/** A group of processes that compute together (MLX's distributed group). */
typedef struct mlx_distributed_group_s* mlx_distributed_group;

/* ---- enums ------------------------------------------------------------- */

/** Element types, in MLX's order. */
typedef enum {
  MLX_BOOL = 0,
  MLX_UINT8 = 1,
  MLX_UINT16 = 2,
  MLX_UINT32 = 3,
  MLX_UINT64 = 4,
  MLX_INT8 = 5,
  MLX_INT16 = 6,
  MLX_INT32 = 7,
  MLX_INT64 = 8,
  MLX_FLOAT16 = 9,
  MLX_FLOAT32 = 10,
  MLX_FLOAT64 = 11,
  MLX_BFLOAT16 = 12,
  MLX_COMPLEX64 = 13,
} mlx_dtype;

/** Kinds of device. */
typedef enum {
  MLX_DEVICE_CPU = 0,
  MLX_DEVICE_GPU = 1,
} mlx_device_type;

/** Elementwise operations of one array. */
typedef enum {
  MLX_UNARY_ABS = 0,
  MLX_UNARY_NEGATIVE,
  MLX_UNARY_SIGN,
  MLX_UNARY_SQUARE,
  MLX_UNARY_SQRT,
  MLX_UNARY_RSQRT,
  MLX_UNARY_RECIPROCAL,
  MLX_UNARY_EXP,
  MLX_UNARY_LOG,
  MLX_UNARY_LOG1P,
  MLX_UNARY_SIN,
  MLX_UNARY_COS,
  MLX_UNARY_TANH,
  MLX_UNARY_SIGMOID,
  MLX_UNARY_ERF,
  MLX_UNARY_FLOOR,
  MLX_UNARY_CEIL,
  MLX_UNARY_ROUND,
  MLX_UNARY_ISFINITE,
  MLX_UNARY_ISNAN,
  MLX_UNARY_ISINF,
  MLX_UNARY_LOGICAL_NOT,
  MLX_UNARY_STOP_GRADIENT,
  MLX_UNARY_COPY,
} mlx_unary_op;

/** Elementwise operations of two arrays (with broadcasting). */
typedef enum {
  MLX_BINARY_ADD = 0,
  MLX_BINARY_SUBTRACT,
  MLX_BINARY_MULTIPLY,
  MLX_BINARY_DIVIDE,
  MLX_BINARY_FLOOR_DIVIDE,
  MLX_BINARY_REMAINDER,
  MLX_BINARY_POWER,
  MLX_BINARY_MAXIMUM,
  MLX_BINARY_MINIMUM,
  MLX_BINARY_EQUAL,
  MLX_BINARY_NOT_EQUAL,
  MLX_BINARY_LESS,
  MLX_BINARY_LESS_EQUAL,
  MLX_BINARY_GREATER,
  MLX_BINARY_GREATER_EQUAL,
  MLX_BINARY_LOGICAL_AND,
  MLX_BINARY_LOGICAL_OR,
} mlx_binary_op;

/** Reductions over a set of axes. */
typedef enum {
  MLX_REDUCE_SUM = 0,
  MLX_REDUCE_MEAN,
  MLX_REDUCE_PROD,
  MLX_REDUCE_MAX,
  MLX_REDUCE_MIN,
  MLX_REDUCE_ALL,
  MLX_REDUCE_ANY,
  MLX_REDUCE_LOGSUMEXP,
} mlx_reduce_op;

/** Reductions to an index along one axis. */
typedef enum {
  MLX_ARG_REDUCE_ARGMAX = 0,
  MLX_ARG_REDUCE_ARGMIN,
} mlx_arg_reduce_op;

/** Scans along one axis. */
typedef enum {
  MLX_SCAN_CUMSUM = 0,
  MLX_SCAN_CUMPROD,
  MLX_SCAN_CUMMAX,
  MLX_SCAN_CUMMIN,
  MLX_SCAN_LOGCUMSUMEXP,
} mlx_scan_op;

/* ---- errors and version -------------------------------------------------- */

/** The message of the last failure on this thread ("" if none). Valid until
 * the next failing call on this thread. */
const char* mlx_last_error(void);

/** MLX's version string, e.g. "0.32.4". */
const char* mlx_version(void);

/* ---- devices and streams -------------------------------------------------- */

int mlx_device_new(mlx_device* out, mlx_device_type type, int index);
void mlx_device_free(mlx_device dev);
int mlx_device_get_type(mlx_device_type* out, mlx_device dev);
int mlx_device_get_index(int* out, mlx_device dev);
/** Whether the backend MLX was built with can run on this device. */
int mlx_device_is_available(bool* out, mlx_device dev);
/** What mlx_cuda_device_attribute asks (the CUDA driver's numbers). */
typedef enum {
  MLX_CUDA_MULTIPROCESSOR_COUNT = 16,
  MLX_CUDA_COMPUTE_CAPABILITY_MAJOR = 75,
  MLX_CUDA_COMPUTE_CAPABILITY_MINOR = 76,
} mlx_cuda_attribute;
/** An attribute of CUDA GPU `index`, asked of the CUDA driver that MLX's CUDA
 * backend loaded (an error without one). */
int mlx_cuda_device_attribute(int* out, int index, mlx_cuda_attribute attribute);
int mlx_get_default_device(mlx_device* out);
int mlx_set_default_device(mlx_device dev);

/** A new stream on a device. */
int mlx_stream_new(mlx_stream* out, mlx_device dev);
/** The default stream of a device. */
int mlx_stream_default(mlx_stream* out, mlx_device dev);
void mlx_stream_free(mlx_stream s);
int mlx_stream_get_device(mlx_device* out, mlx_stream s);
/** Waits for all work queued on the stream (NULL: on every stream). */
int mlx_synchronize(mlx_stream s);

/* ---- distributed ------------------------------------------------------------ */

/** The group of every process the launcher started, through `backend` ("any",
 * "ring", "mpi", "nccl" or "jaccl"), configured from the environment MLX's
 * launcher (`mlx.launch`) sets. Without one: a group of this process alone,
 * or, when `strict`, an error. */
int mlx_distributed_init(mlx_distributed_group* out, bool strict,
                         const char* backend);
void mlx_distributed_group_free(mlx_distributed_group g);
/** This process's rank in the group (0 … size − 1). */
int mlx_distributed_group_rank(int* out, mlx_distributed_group g);
int mlx_distributed_group_size(int* out, mlx_distributed_group g);
/** The sum of every rank's `x` (same shape and dtype on every rank). */
int mlx_distributed_all_sum(mlx_array* out, mlx_array x,
                            mlx_distributed_group g, mlx_stream s);
/** Every rank's `x`, in rank order, joined along the first axis. */
int mlx_distributed_all_gather(mlx_array* out, mlx_array x,
                               mlx_distributed_group g, mlx_stream s);

/* ---- memory ---------------------------------------------------------------- */

int mlx_memory_active(size_t* out);
int mlx_memory_peak(size_t* out);
int mlx_memory_cache(size_t* out);
int mlx_memory_reset_peak(void);
int mlx_memory_limit(size_t* out);
/** Sets the memory limit; writes the previous one to `previous`. */
int mlx_memory_set_limit(size_t* previous, size_t limit);
/** Sets the buffer cache limit; writes the previous one to `previous`. */
int mlx_memory_set_cache_limit(size_t* previous, size_t limit);
int mlx_memory_clear_cache(void);

/* ---- arrays ------------------------------------------------------------------ */

void mlx_array_free(mlx_array a);
/** A new handle sharing `a`'s data and graph. */
int mlx_array_clone(mlx_array* out, mlx_array a);
/** Copies `data` (row-major, `dtype` elements) into a new array. */
int mlx_array_from_data(mlx_array* out, const void* data, const int* shape,
                        size_t ndim, mlx_dtype dtype);
/** A new array of `shape` and `dtype` with uninitialised data, whose bytes
 * the caller fills through `*data` before handing the array to any operation
 * (`*data` is NULL for an empty array). */
int mlx_array_alloc(mlx_array* out, void** data, const int* shape,
                    size_t ndim, mlx_dtype dtype);
/** Wraps caller-owned row-major memory without copying where the device
 * allows it; `release(ctx)` is called once when MLX no longer needs it
 * (also when this call fails). */
int mlx_array_from_buffer(mlx_array* out, void* data, const int* shape,
                          size_t ndim, mlx_dtype dtype,
                          void (*release)(void* ctx), void* ctx);
/** A 0-d array holding `value` converted to `dtype`. */
int mlx_array_scalar(mlx_array* out, double value, mlx_dtype dtype);
int mlx_array_ndim(size_t* out, mlx_array a);
/** Writes a pointer to `a`'s shape (ndim ints), valid while `a` lives. */
int mlx_array_shape(const int** out, mlx_array a);
int mlx_array_dtype(mlx_dtype* out, mlx_array a);
int mlx_array_size(size_t* out, mlx_array a);
int mlx_array_nbytes(size_t* out, mlx_array a);
/** Whether `a` holds its data (it was evaluated, or made from data), rather
 * than only the graph that computes it. */
int mlx_array_is_available(bool* out, mlx_array a);
int mlx_dtype_size(size_t* out, mlx_dtype dtype);
/** Evaluates `a` and copies its elements, row-major, to `dst`, which holds
 * `dst_bytes` bytes: exactly nbytes(a). */
int mlx_array_read(mlx_array a, void* dst, size_t dst_bytes);

int mlx_eval(const mlx_array* arrays, size_t n);
int mlx_async_eval(const mlx_array* arrays, size_t n);

/* ---- vectors of arrays ----------------------------------------------------------- */

int mlx_vector_array_new(mlx_vector_array* out);
void mlx_vector_array_free(mlx_vector_array v);
int mlx_vector_array_size(size_t* out, mlx_vector_array v);
int mlx_vector_array_get(mlx_array* out, mlx_vector_array v, size_t index);
int mlx_vector_array_push(mlx_vector_array v, mlx_array a);

/* ---- closures and compile --------------------------------------------------------- */

/** A function of arrays: reads `n` inputs, pushes its outputs into `outputs`,
 * returns 0, or non-zero with a message written to `error` (at most
 * `error_len` bytes including the terminating NUL). */
typedef int (*mlx_closure_fn)(void* ctx, const mlx_array* inputs, size_t n,
                              mlx_vector_array outputs, char* error,
                              size_t error_len);

/** Wraps `fn`; `ctx_free(ctx)` (nullable) runs when the last copy (compiled
 * ones included) is gone, or at once when this call fails. */
int mlx_closure_new(mlx_closure* out, mlx_closure_fn fn, void* ctx,
                    void (*ctx_free)(void* ctx));
void mlx_closure_free(mlx_closure c);
/** A compiled version of `c` (traced once per input shape unless shapeless). */
int mlx_compile(mlx_closure* out, mlx_closure c, bool shapeless);
int mlx_closure_apply(mlx_vector_array* out, mlx_closure c,
                      const mlx_array* inputs, size_t n);

/* ---- creation --------------------------------------------------------------------- */

int mlx_arange(mlx_array* out, double start, double stop, double step,
               mlx_dtype dtype, mlx_stream s);
int mlx_full(mlx_array* out, const int* shape, size_t ndim, mlx_array value,
             mlx_dtype dtype, mlx_stream s);
int mlx_zeros(mlx_array* out, const int* shape, size_t ndim, mlx_dtype dtype,
              mlx_stream s);
int mlx_ones(mlx_array* out, const int* shape, size_t ndim, mlx_dtype dtype,
             mlx_stream s);
/** n x m matrix with ones at and below diagonal k. */
int mlx_tri(mlx_array* out, int n, int m, int k, mlx_dtype dtype, mlx_stream s);
int mlx_tril(mlx_array* out, mlx_array a, int k, mlx_stream s);
int mlx_triu(mlx_array* out, mlx_array a, int k, mlx_stream s);

/* ---- elementwise and reductions ------------------------------------------------------ */

int mlx_unary(mlx_array* out, mlx_unary_op op, mlx_array a, mlx_stream s);
int mlx_binary(mlx_array* out, mlx_binary_op op, mlx_array a, mlx_array b,
               mlx_stream s);
/** Reduces over `axes` (NULL: all axes). */
int mlx_reduce(mlx_array* out, mlx_reduce_op op, mlx_array a, const int* axes,
               size_t naxes, bool keepdims, mlx_stream s);
int mlx_arg_reduce(mlx_array* out, mlx_arg_reduce_op op, mlx_array a, int axis,
                   bool keepdims, mlx_stream s);
int mlx_scan(mlx_array* out, mlx_scan_op op, mlx_array a, int axis,
             bool reverse, bool inclusive, mlx_stream s);
/** Softmax over `axes` (NULL: all axes); `precise` computes in float32. */
int mlx_softmax(mlx_array* out, mlx_array a, const int* axes, size_t naxes,
                bool precise, mlx_stream s);
int mlx_where(mlx_array* out, mlx_array condition, mlx_array x, mlx_array y,
              mlx_stream s);
/** Clips to [lo, hi]; either bound is nullable. */
int mlx_clip(mlx_array* out, mlx_array a, mlx_array lo, mlx_array hi,
             mlx_stream s);
int mlx_astype(mlx_array* out, mlx_array a, mlx_dtype dtype, mlx_stream s);

/* ---- linear algebra -------------------------------------------------------------------- */

int mlx_matmul(mlx_array* out, mlx_array a, mlx_array b, mlx_stream s);
/** The Walsh–Hadamard transform over the last axis (its size a power of two,
 * possibly times 12, 20 or 28), times `scale`. */
int mlx_hadamard_transform(mlx_array* out, mlx_array a, float scale,
                           mlx_stream s);
/** x @ wᵀ for w [N, K]. On the CPU, a single float32 row takes a
 * matrix-vector path (cblas_sgemv) instead of MLX's sgemm, which repacks w
 * on every call. */
int mlx_linear(mlx_array* out, mlx_array x, mlx_array w, mlx_stream s);
/** A kernel of the caller's for `mlx_cpu_kernel`: fills `out` (`out_bytes`
 * bytes) from the `n` inputs' row-contiguous data (`in_bytes[i]` bytes each);
 * returns 0, or non-zero with a message written to `error` (at most
 * `error_len` bytes including the terminating NUL). An input that was
 * row-contiguous when evaluated arrives as its own buffer, not a copy, so a
 * kernel may write into one that nothing else reads (a buffer handed over to
 * the operation). */
typedef int (*mlx_cpu_kernel_fn)(void* ctx, void* const* inputs,
                                 const size_t* in_bytes, size_t n, void* out,
                                 size_t out_bytes, char* error,
                                 size_t error_len);
/** An array of `shape` and `dtype` that `fn` computes on the CPU from
 * `inputs` when it is evaluated (on a CPU stream only). `ctx_free(ctx)`
 * (nullable) runs when the last operation holding it is gone, or at once when
 * this call fails. A kernel that fails cannot raise an error from MLX's
 * stream thread: its message goes to stderr and a float32 output is filled
 * with NaN (other dtypes with 0xff bytes). */
int mlx_cpu_kernel(mlx_array* out, mlx_cpu_kernel_fn fn, void* ctx,
                   void (*ctx_free)(void* ctx), const mlx_array* inputs,
                   size_t n, const int* shape, size_t ndim, mlx_dtype dtype,
                   mlx_stream s);
/** Families of the CPU kernels below, chosen per call. */
typedef enum {
  /** None of these kernels: the caller's portable path runs. */
  MLX_CPU_KERNELS_PORTABLE = 0,
  /** x86-64 with AVX2, FMA and F16C: 256-bit kernels. */
  MLX_CPU_KERNELS_AVX2 = 1,
  /** AVX2 plus AVX-512 F, BW, VL, DQ and VNNI: 512-bit kernels where a
   * format has one (Q4_0, Q5_0, Q8_0, Q4_K, Q6_K, one row of activations),
   * the 256-bit ones elsewhere. */
  MLX_CPU_KERNELS_AVX512 = 2,
} mlx_cpu_kernels;
/** Whether this CPU runs the kernels of `family` (always, for
 * `MLX_CPU_KERNELS_PORTABLE`). The calls below fail for a family it does
 * not run. */
int mlx_cpu_kernels_supported(bool* out, mlx_cpu_kernels family);
/** Whether `mlx_block_rows_dot` has a kernel for ggml block type `ggml_type`
 * in `family` (an x86 family: types Q4_0, Q5_0, Q8_0, Q4_K, Q5_K and
 * Q6_K). */
int mlx_block_rows_dot_available(bool* out, mlx_cpu_kernels family,
                                 uint32_t ggml_type);
/** `out[m · rows + r] = Σ_j w[r, j] · x[m, j]` for `rows` rows of `cols`
 * values of ggml type `ggml_type`, stored one after another as whole blocks
 * (`row_bytes` bytes a row), against each of `n` rows of activations
 * quantized to 8 bits per 16 values: `x[m, j] ≈ x_scales[m · cols / 16 + j /
 * 16] · x[m · cols + j]` with the integers in [-127, 127], and `x_sums` each
 * group's sum of its approximations, by the kernels of `family`. Several
 * rows decode each tile of weights once for all of them. Fails for a type
 * without a kernel in `family`, a family this CPU lacks, or a row size that
 * does not match the type. */
int mlx_block_rows_dot(float* out, mlx_cpu_kernels family, uint32_t ggml_type,
                       const uint8_t* w, size_t rows, size_t row_bytes,
                       size_t cols, size_t n, const int8_t* x,
                       const float* x_scales, const float* x_sums);
/** Whether `mlx_affine_rows_dot` has a kernel for MLX's affine quantization
 * with `bits` bits in groups of `group_size` in `family` (an x86 family: 4
 * or 8 bits, groups of 32, 64 or 128, by a 256-bit kernel in both). */
int mlx_affine_rows_dot_available(bool* out, mlx_cpu_kernels family,
                                  int bits, int group_size);
/** `out[r] = Σ_j w[r, j] · x_j` for `rows` rows of `cols` values of MLX's
 * affine quantization (`w` the packed rows' bytes, `cols · bits / 8` a row;
 * `scales` and `biases` float32, `cols / group_size` a row), against 8-bit
 * activations as for `mlx_block_rows_dot`. Fails where
 * `mlx_affine_rows_dot_available` says no or `cols` is not whole groups. */
int mlx_affine_rows_dot(float* out, mlx_cpu_kernels family, int bits,
                        int group_size, const uint8_t* w, const float* scales,
                        const float* biases, size_t rows, size_t cols,
                        const int8_t* x, const float* x_scales,
                        const float* x_sums);
/** alpha * (a @ b) + beta * c */
int mlx_addmm(mlx_array* out, mlx_array c, mlx_array a, mlx_array b,
              float alpha, float beta, mlx_stream s);

/* ---- shapes and indexing ------------------------------------------------------------------ */

int mlx_reshape(mlx_array* out, mlx_array a, const int* shape, size_t ndim,
                mlx_stream s);
/** Permutes axes (NULL: reverse them). */
int mlx_transpose(mlx_array* out, mlx_array a, const int* axes, size_t naxes,
                  mlx_stream s);
int mlx_swapaxes(mlx_array* out, mlx_array a, int axis1, int axis2,
                 mlx_stream s);
int mlx_expand_dims(mlx_array* out, mlx_array a, const int* axes,
                    size_t naxes, mlx_stream s);
/** Removes the given size-1 axes (NULL: all of them). */
int mlx_squeeze(mlx_array* out, mlx_array a, const int* axes, size_t naxes,
                mlx_stream s);
int mlx_broadcast_to(mlx_array* out, mlx_array a, const int* shape,
                     size_t ndim, mlx_stream s);
int mlx_flatten(mlx_array* out, mlx_array a, int start_axis, int end_axis,
                mlx_stream s);
/** A row-contiguous copy if `a` is not already row-contiguous. */
int mlx_contiguous(mlx_array* out, mlx_array a, mlx_stream s);
/** The slice of a from start to stop (exclusive) by strides, one entry per axis. */
int mlx_slice(mlx_array* out, mlx_array a, const int* start, const int* stop,
              const int* strides, size_t ndim, mlx_stream s);
/** Slice of `slice_size` along `axes`, starting at the values of the integer
 * array `start` (one per axis): the start is data, not part of the graph's
 * shape, so a compiled graph does not retrace when it moves. */
int mlx_slice_dynamic(mlx_array* out, mlx_array a, mlx_array start,
                      const int* axes, size_t naxes, const int* slice_size,
                      size_t nsize, mlx_stream s);
/** src with its slice from start to stop by strides replaced by update. */
int mlx_slice_update(mlx_array* out, mlx_array src, mlx_array update,
                     const int* start, const int* stop, const int* strides,
                     size_t ndim, mlx_stream s);
/** src with the block at `start` (integer array, one per axis) replaced. */
int mlx_slice_update_dynamic(mlx_array* out, mlx_array src, mlx_array update,
                             mlx_array start, const int* axes, size_t naxes,
                             mlx_stream s);
int mlx_concatenate(mlx_array* out, const mlx_array* arrays, size_t n,
                    int axis, mlx_stream s);
int mlx_stack(mlx_array* out, const mlx_array* arrays, size_t n, int axis,
              mlx_stream s);
int mlx_take(mlx_array* out, mlx_array a, mlx_array indices, int axis,
             mlx_stream s);
int mlx_take_along_axis(mlx_array* out, mlx_array a, mlx_array indices,
                        int axis, mlx_stream s);
int mlx_put_along_axis(mlx_array* out, mlx_array a, mlx_array indices,
                       mlx_array values, int axis, mlx_stream s);

/* ---- sorting and selection ----------------------------------------------------------------- */

int mlx_sort(mlx_array* out, mlx_array a, int axis, mlx_stream s);
int mlx_argsort(mlx_array* out, mlx_array a, int axis, mlx_stream s);
/** Indices that partition `a` along `axis` around its kth element. */
int mlx_argpartition(mlx_array* out, mlx_array a, int kth, int axis,
                     mlx_stream s);
/** The k largest values along `axis` (unordered). */
int mlx_topk(mlx_array* out, mlx_array a, int k, int axis, mlx_stream s);

/* ---- quantization ------------------------------------------------------------------------- */

/** MLX affine quantization of the last axis of `w`. */
int mlx_quantize(mlx_array* out_w, mlx_array* out_scales,
                 mlx_array* out_biases, mlx_array w, int group_size, int bits,
                 mlx_stream s);
int mlx_dequantize(mlx_array* out, mlx_array w, mlx_array scales,
                   mlx_array biases, int group_size, int bits, mlx_stream s);
/** x @ dequantize(w).T (transpose) or x @ dequantize(w). */
int mlx_quantized_matmul(mlx_array* out, mlx_array x, mlx_array w,
                         mlx_array scales, mlx_array biases, bool transpose,
                         int group_size, int bits, mlx_stream s);

/* ---- fused kernels ------------------------------------------------------------------------ */

/** x / rms(x) * weight over the last axis; weight nullable. */
int mlx_fast_rms_norm(mlx_array* out, mlx_array x, mlx_array weight, float eps,
                      mlx_stream s);
/** Rotary embedding of the first `dims` features of the last axis, positions
 * starting at `offset`. `freqs` (nullable) replaces `base` when given. */
int mlx_fast_rope(mlx_array* out, mlx_array x, int dims, bool traditional,
                  float base, float scale, int offset, mlx_array freqs,
                  mlx_stream s);
/** As mlx_fast_rope with the offset given as an integer array. */
int mlx_fast_rope_dynamic(mlx_array* out, mlx_array x, int dims,
                          bool traditional, float base, float scale,
                          mlx_array offset, mlx_array freqs, mlx_stream s);
/** softmax(q @ k.T * scale + mask) @ v. `mask_mode` is "" (none or the
 * array `mask`), or "causal"; `mask` (nullable) is boolean (true keeps) or
 * additive; `sinks` nullable. */
int mlx_fast_scaled_dot_product_attention(mlx_array* out, mlx_array q,
                                          mlx_array k, mlx_array v,
                                          float scale, const char* mask_mode,
                                          mlx_array mask, mlx_array sinks,
                                          mlx_stream s);

/* ---- custom CUDA kernels ------------------------------------------------------------------ */

/** The version of the NVRTC library MLX's CUDA backend loaded (an error
 * without one). */
int mlx_cuda_compiler_version(int* major, int* minor);
/** Compiles the complete CUDA program `source` (named `program_name` in
 * messages) with that NVRTC and `options`, to a cubin; a compile error
 * carries NVRTC's log. */
int mlx_cuda_compile(mlx_cuda_binary* out, const char* source,
                     const char* program_name, const char* const* options,
                     size_t n_options);
/** A compiled program from its bytes (a cubin read back from a cache). */
int mlx_cuda_binary_from_bytes(mlx_cuda_binary* out, const uint8_t* data,
                               size_t size);
/** The bytes of `binary`, valid while it lives. */
int mlx_cuda_binary_bytes(const uint8_t** data, size_t* size,
                          mlx_cuda_binary binary);
void mlx_cuda_binary_free(mlx_cuda_binary binary);
/** Runs the `extern "C"` kernel `kernel_name` of `binary` (MLX's
 * fast::precompiled_cuda_kernel; the name also keys MLX's module cache, so it
 * must be unique to the binary). Its parameters are the row-contiguous
 * `inputs`, then the outputs, then `scalars` as ints. Output i has
 * `output_ndims[i]` dimensions, taken in turn from `output_shapes`, and dtype
 * `output_dtypes[i]`. `grid` counts threads (rounded up to whole blocks of
 * `block` threads); each block has `shared_memory` bytes of dynamic shared
 * memory (`extern __shared__`; MLX raises the kernel's limit for more than
 * 48,000). */
int mlx_cuda_binary_apply(mlx_vector_array* out, mlx_cuda_binary binary,
                          const char* kernel_name, const mlx_array* inputs,
                          size_t n_inputs, const int* output_shapes,
                          const size_t* output_ndims,
                          const mlx_dtype* output_dtypes, size_t n_outputs,
                          const int* scalars, size_t n_scalars,
                          const int* grid, const int* block,
                          int shared_memory, mlx_stream s);

/* ---- random ------------------------------------------------------------------------------- */

int mlx_random_key(mlx_array* out, uint64_t seed);
int mlx_random_split(mlx_array* out_a, mlx_array* out_b, mlx_array key,
                     mlx_stream s);
/** Uniform in [low, high); key nullable (global generator). */
int mlx_random_uniform(mlx_array* out, float low, float high,
                       const int* shape, size_t ndim, mlx_dtype dtype,
                       mlx_array key, mlx_stream s);
/** Normal with mean `loc` and standard deviation `scale`; key nullable. */
int mlx_random_normal(mlx_array* out, const int* shape, size_t ndim,
                      mlx_dtype dtype, float loc, float scale, mlx_array key,
                      mlx_stream s);
/** One sample per row of unnormalized log-probabilities along `axis`. */
int mlx_random_categorical(mlx_array* out, mlx_array logits, int axis,
                           mlx_array key, mlx_stream s);

#ifdef __cplusplus
}
#endif

#endif /* MLX_C_H */
