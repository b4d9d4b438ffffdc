// Array operations: creation, elementwise, reductions, shapes, indexing,
// sorting, quantization, fused kernels and random numbers.
#include "internal.h"

using namespace mlxc;

namespace {

mx::array apply_unary(mlx_unary_op op, const mx::array& a,
                      mx::StreamOrDevice s) {
  switch (op) {
    case MLX_UNARY_ABS: return mx::abs(a, s);
    case MLX_UNARY_NEGATIVE: return mx::negative(a, s);
    case MLX_UNARY_SIGN: return mx::sign(a, s);
    case MLX_UNARY_SQUARE: return mx::square(a, s);
    case MLX_UNARY_SQRT: return mx::sqrt(a, s);
    case MLX_UNARY_RSQRT: return mx::rsqrt(a, s);
    case MLX_UNARY_RECIPROCAL: return mx::reciprocal(a, s);
    case MLX_UNARY_EXP: return mx::exp(a, s);
    case MLX_UNARY_LOG: return mx::log(a, s);
    case MLX_UNARY_LOG1P: return mx::log1p(a, s);
    case MLX_UNARY_SIN: return mx::sin(a, s);
    case MLX_UNARY_COS: return mx::cos(a, s);
    case MLX_UNARY_TANH: return mx::tanh(a, s);
    case MLX_UNARY_SIGMOID: return mx::sigmoid(a, s);
    case MLX_UNARY_ERF: return mx::erf(a, s);
    case MLX_UNARY_FLOOR: return mx::floor(a, s);
    case MLX_UNARY_CEIL: return mx::ceil(a, s);
    case MLX_UNARY_ROUND: return mx::round(a, 0, s);
    case MLX_UNARY_ISFINITE: return mx::isfinite(a, s);
    case MLX_UNARY_ISNAN: return mx::isnan(a, s);
    case MLX_UNARY_ISINF: return mx::isinf(a, s);
    case MLX_UNARY_LOGICAL_NOT: return mx::logical_not(a, s);
    case MLX_UNARY_STOP_GRADIENT: return mx::stop_gradient(a, s);
    case MLX_UNARY_COPY: return mx::copy(a, s);
  }
  throw std::invalid_argument("unknown unary op " +
                              std::to_string(static_cast<int>(op)));
}

mx::array apply_binary(mlx_binary_op op, const mx::array& a,
                       const mx::array& b, mx::StreamOrDevice s) {
  switch (op) {
    case MLX_BINARY_ADD: return mx::add(a, b, s);
    case MLX_BINARY_SUBTRACT: return mx::subtract(a, b, s);
    case MLX_BINARY_MULTIPLY: return mx::multiply(a, b, s);
    case MLX_BINARY_DIVIDE: return mx::divide(a, b, s);
    case MLX_BINARY_FLOOR_DIVIDE: return mx::floor_divide(a, b, s);
    case MLX_BINARY_REMAINDER: return mx::remainder(a, b, s);
    case MLX_BINARY_POWER: return mx::power(a, b, s);
    case MLX_BINARY_MAXIMUM: return mx::maximum(a, b, s);
    case MLX_BINARY_MINIMUM: return mx::minimum(a, b, s);
    case MLX_BINARY_EQUAL: return mx::equal(a, b, s);
    case MLX_BINARY_NOT_EQUAL: return mx::not_equal(a, b, s);
    case MLX_BINARY_LESS: return mx::less(a, b, s);
    case MLX_BINARY_LESS_EQUAL: return mx::less_equal(a, b, s);
    case MLX_BINARY_GREATER: return mx::greater(a, b, s);
    case MLX_BINARY_GREATER_EQUAL: return mx::greater_equal(a, b, s);
    case MLX_BINARY_LOGICAL_AND: return mx::logical_and(a, b, s);
    case MLX_BINARY_LOGICAL_OR: return mx::logical_or(a, b, s);
  }
  throw std::invalid_argument("unknown binary op " +
                              std::to_string(static_cast<int>(op)));
}

mx::array apply_reduce(mlx_reduce_op op, const mx::array& a,
                       const std::vector<int>& axes, bool keepdims,
                       mx::StreamOrDevice s) {
  switch (op) {
    case MLX_REDUCE_SUM: return mx::sum(a, axes, keepdims, s);
    case MLX_REDUCE_MEAN: return mx::mean(a, axes, keepdims, s);
    case MLX_REDUCE_PROD: return mx::prod(a, axes, keepdims, s);
    case MLX_REDUCE_MAX: return mx::max(a, axes, keepdims, s);
    case MLX_REDUCE_MIN: return mx::min(a, axes, keepdims, s);
    case MLX_REDUCE_ALL: return mx::all(a, axes, keepdims, s);
    case MLX_REDUCE_ANY: return mx::any(a, axes, keepdims, s);
    case MLX_REDUCE_LOGSUMEXP: return mx::logsumexp(a, axes, keepdims, s);
  }
  throw std::invalid_argument("unknown reduce op " +
                              std::to_string(static_cast<int>(op)));
}

mx::array apply_scan(mlx_scan_op op, const mx::array& a, int axis,
                     bool reverse, bool inclusive, mx::StreamOrDevice s) {
  switch (op) {
    case MLX_SCAN_CUMSUM: return mx::cumsum(a, axis, reverse, inclusive, s);
    case MLX_SCAN_CUMPROD: return mx::cumprod(a, axis, reverse, inclusive, s);
    case MLX_SCAN_CUMMAX: return mx::cummax(a, axis, reverse, inclusive, s);
    case MLX_SCAN_CUMMIN: return mx::cummin(a, axis, reverse, inclusive, s);
    case MLX_SCAN_LOGCUMSUMEXP:
      return mx::logcumsumexp(a, axis, reverse, inclusive, s);
  }
  throw std::invalid_argument("unknown scan op " +
                              std::to_string(static_cast<int>(op)));
}

/// The mask mode string, "" when NULL.
std::string mode(const char* mask_mode) {
  return mask_mode == nullptr ? std::string() : std::string(mask_mode);
}

}  // namespace

extern "C" {

// ---- creation

int mlx_arange(mlx_array* out, double start, double stop, double step,
               mlx_dtype d, mlx_stream s) {
  return guard(
      [&] { put(out, mx::arange(start, stop, step, dtype(d), stream(s))); });
}

int mlx_full(mlx_array* out, const int* dims, size_t ndim, mlx_array value,
             mlx_dtype d, mlx_stream s) {
  return guard([&] {
    put(out, mx::full(shape(dims, ndim), arr(value, "value"), dtype(d),
                      stream(s)));
  });
}

int mlx_zeros(mlx_array* out, const int* dims, size_t ndim, mlx_dtype d,
              mlx_stream s) {
  return guard(
      [&] { put(out, mx::zeros(shape(dims, ndim), dtype(d), stream(s))); });
}

int mlx_ones(mlx_array* out, const int* dims, size_t ndim, mlx_dtype d,
             mlx_stream s) {
  return guard(
      [&] { put(out, mx::ones(shape(dims, ndim), dtype(d), stream(s))); });
}

int mlx_tri(mlx_array* out, int n, int m, int k, mlx_dtype d, mlx_stream s) {
  return guard([&] { put(out, mx::tri(n, m, k, dtype(d), stream(s))); });
}

int mlx_tril(mlx_array* out, mlx_array a, int k, mlx_stream s) {
  return guard([&] { put(out, mx::tril(arr(a, "a"), k, stream(s))); });
}

int mlx_triu(mlx_array* out, mlx_array a, int k, mlx_stream s) {
  return guard([&] { put(out, mx::triu(arr(a, "a"), k, stream(s))); });
}

// ---- elementwise and reductions

int mlx_unary(mlx_array* out, mlx_unary_op op, mlx_array a, mlx_stream s) {
  return guard([&] { put(out, apply_unary(op, arr(a, "a"), stream(s))); });
}

int mlx_binary(mlx_array* out, mlx_binary_op op, mlx_array a, mlx_array b,
               mlx_stream s) {
  return guard([&] {
    put(out, apply_binary(op, arr(a, "a"), arr(b, "b"), stream(s)));
  });
}

int mlx_reduce(mlx_array* out, mlx_reduce_op op, mlx_array a, const int* axes,
               size_t naxes, bool keepdims, mlx_stream s) {
  return guard([&] {
    const auto& x = arr(a, "a");
    put(out,
        apply_reduce(op, x, axes_or_all(x, axes, naxes), keepdims, stream(s)));
  });
}

int mlx_arg_reduce(mlx_array* out, mlx_arg_reduce_op op, mlx_array a, int axis,
                   bool keepdims, mlx_stream s) {
  return guard([&] {
    const auto& x = arr(a, "a");
    switch (op) {
      case MLX_ARG_REDUCE_ARGMAX:
        put(out, mx::argmax(x, axis, keepdims, stream(s)));
        return;
      case MLX_ARG_REDUCE_ARGMIN:
        put(out, mx::argmin(x, axis, keepdims, stream(s)));
        return;
    }
    throw std::invalid_argument("unknown arg-reduce op " +
                                std::to_string(static_cast<int>(op)));
  });
}

int mlx_scan(mlx_array* out, mlx_scan_op op, mlx_array a, int axis,
             bool reverse, bool inclusive, mlx_stream s) {
  return guard([&] {
    put(out, apply_scan(op, arr(a, "a"), axis, reverse, inclusive, stream(s)));
  });
}

int mlx_softmax(mlx_array* out, mlx_array a, const int* axes, size_t naxes,
                bool precise, mlx_stream s) {
  return guard([&] {
    const auto& x = arr(a, "a");
    put(out, mx::softmax(x, axes_or_all(x, axes, naxes), precise, stream(s)));
  });
}

int mlx_where(mlx_array* out, mlx_array condition, mlx_array x, mlx_array y,
              mlx_stream s) {
  return guard([&] {
    put(out, mx::where(arr(condition, "condition"), arr(x, "x"), arr(y, "y"),
                       stream(s)));
  });
}

int mlx_clip(mlx_array* out, mlx_array a, mlx_array lo, mlx_array hi,
             mlx_stream s) {
  return guard(
      [&] { put(out, mx::clip(arr(a, "a"), opt(lo), opt(hi), stream(s))); });
}

int mlx_astype(mlx_array* out, mlx_array a, mlx_dtype d, mlx_stream s) {
  return guard(
      [&] { put(out, mx::astype(arr(a, "a"), dtype(d), stream(s))); });
}

// ---- linear algebra

int mlx_matmul(mlx_array* out, mlx_array a, mlx_array b, mlx_stream s) {
  return guard(
      [&] { put(out, mx::matmul(arr(a, "a"), arr(b, "b"), stream(s))); });
}

int mlx_hadamard_transform(mlx_array* out, mlx_array a, float scale,
                           mlx_stream s) {
  return guard([&] {
    put(out, mx::hadamard_transform(arr(a, "a"), scale, stream(s)));
  });
}

int mlx_addmm(mlx_array* out, mlx_array c, mlx_array a, mlx_array b,
              float alpha, float beta, mlx_stream s) {
  return guard([&] {
    put(out, mx::addmm(arr(c, "c"), arr(a, "a"), arr(b, "b"), alpha, beta,
                       stream(s)));
  });
}

// ---- shapes and indexing

int mlx_reshape(mlx_array* out, mlx_array a, const int* dims, size_t ndim,
                mlx_stream s) {
  return guard([&] {
    // -1 (infer) is allowed here, so the dims are not checked as a shape.
    auto dims_list = ints(dims, ndim);
    mx::Shape shp(dims_list.begin(), dims_list.end());
    put(out, mx::reshape(arr(a, "a"), shp, stream(s)));
  });
}

int mlx_transpose(mlx_array* out, mlx_array a, const int* axes, size_t naxes,
                  mlx_stream s) {
  return guard([&] {
    const auto& x = arr(a, "a");
    if (axes == nullptr) {
      put(out, mx::transpose(x, stream(s)));
    } else {
      put(out, mx::transpose(x, ints(axes, naxes), stream(s)));
    }
  });
}

int mlx_swapaxes(mlx_array* out, mlx_array a, int axis1, int axis2,
                 mlx_stream s) {
  return guard(
      [&] { put(out, mx::swapaxes(arr(a, "a"), axis1, axis2, stream(s))); });
}

int mlx_expand_dims(mlx_array* out, mlx_array a, const int* axes,
                    size_t naxes, mlx_stream s) {
  return guard([&] {
    put(out, mx::expand_dims(arr(a, "a"), ints(axes, naxes), stream(s)));
  });
}

int mlx_squeeze(mlx_array* out, mlx_array a, const int* axes, size_t naxes,
                mlx_stream s) {
  return guard([&] {
    const auto& x = arr(a, "a");
    if (axes == nullptr) {
      put(out, mx::squeeze(x, stream(s)));
    } else {
      put(out, mx::squeeze(x, ints(axes, naxes), stream(s)));
    }
  });
}

int mlx_broadcast_to(mlx_array* out, mlx_array a, const int* dims,
                     size_t ndim, mlx_stream s) {
  return guard([&] {
    put(out, mx::broadcast_to(arr(a, "a"), shape(dims, ndim), stream(s)));
  });
}

int mlx_flatten(mlx_array* out, mlx_array a, int start_axis, int end_axis,
                mlx_stream s) {
  return guard([&] {
    put(out, mx::flatten(arr(a, "a"), start_axis, end_axis, stream(s)));
  });
}

int mlx_contiguous(mlx_array* out, mlx_array a, mlx_stream s) {
  return guard(
      [&] { put(out, mx::contiguous(arr(a, "a"), false, stream(s))); });
}

int mlx_slice(mlx_array* out, mlx_array a, const int* start, const int* stop,
              const int* strides, size_t ndim, mlx_stream s) {
  return guard([&] {
    auto b = ints(start, ndim);
    auto e = ints(stop, ndim);
    auto st = ints(strides, ndim);
    put(out, mx::slice(arr(a, "a"), mx::Shape(b.begin(), b.end()),
                       mx::Shape(e.begin(), e.end()),
                       mx::Shape(st.begin(), st.end()), stream(s)));
  });
}

int mlx_slice_dynamic(mlx_array* out, mlx_array a, mlx_array start,
                      const int* axes, size_t naxes, const int* slice_size,
                      size_t nsize, mlx_stream s) {
  return guard([&] {
    put(out, mx::slice(arr(a, "a"), arr(start, "start"), ints(axes, naxes),
                       shape(slice_size, nsize), stream(s)));
  });
}

int mlx_slice_update(mlx_array* out, mlx_array src, mlx_array update,
                     const int* start, const int* stop, const int* strides,
                     size_t ndim, mlx_stream s) {
  return guard([&] {
    auto b = ints(start, ndim);
    auto e = ints(stop, ndim);
    auto st = ints(strides, ndim);
    put(out, mx::slice_update(arr(src, "src"), arr(update, "update"),
                              mx::Shape(b.begin(), b.end()),
                              mx::Shape(e.begin(), e.end()),
                              mx::Shape(st.begin(), st.end()), stream(s)));
  });
}

int mlx_slice_update_dynamic(mlx_array* out, mlx_array src, mlx_array update,
                             mlx_array start, const int* axes, size_t naxes,
                             mlx_stream s) {
  return guard([&] {
    put(out, mx::slice_update(arr(src, "src"), arr(update, "update"),
                              arr(start, "start"), ints(axes, naxes),
                              stream(s)));
  });
}

int mlx_concatenate(mlx_array* out, const mlx_array* handles, size_t n,
                    int axis, mlx_stream s) {
  return guard([&] {
    put(out, mx::concatenate(arrays(handles, n), axis, stream(s)));
  });
}

int mlx_stack(mlx_array* out, const mlx_array* handles, size_t n, int axis,
              mlx_stream s) {
  return guard(
      [&] { put(out, mx::stack(arrays(handles, n), axis, stream(s))); });
}

int mlx_take(mlx_array* out, mlx_array a, mlx_array indices, int axis,
             mlx_stream s) {
  return guard([&] {
    put(out, mx::take(arr(a, "a"), arr(indices, "indices"), axis, stream(s)));
  });
}

int mlx_take_along_axis(mlx_array* out, mlx_array a, mlx_array indices,
                        int axis, mlx_stream s) {
  return guard([&] {
    put(out, mx::take_along_axis(arr(a, "a"), arr(indices, "indices"), axis,
                                 stream(s)));
  });
}

int mlx_put_along_axis(mlx_array* out, mlx_array a, mlx_array indices,
                       mlx_array values, int axis, mlx_stream s) {
  return guard([&] {
    put(out, mx::put_along_axis(arr(a, "a"), arr(indices, "indices"),
                                arr(values, "values"), axis, stream(s)));
  });
}

// ---- sorting and selection

int mlx_sort(mlx_array* out, mlx_array a, int axis, mlx_stream s) {
  return guard([&] { put(out, mx::sort(arr(a, "a"), axis, stream(s))); });
}

int mlx_argsort(mlx_array* out, mlx_array a, int axis, mlx_stream s) {
  return guard([&] { put(out, mx::argsort(arr(a, "a"), axis, stream(s))); });
}

int mlx_argpartition(mlx_array* out, mlx_array a, int kth, int axis,
                     mlx_stream s) {
  return guard([&] {
    put(out, mx::argpartition(arr(a, "a"), kth, axis, stream(s)));
  });
}

int mlx_topk(mlx_array* out, mlx_array a, int k, int axis, mlx_stream s) {
  return guard([&] { put(out, mx::topk(arr(a, "a"), k, axis, stream(s))); });
}

// ---- quantization

int mlx_quantize(mlx_array* out_w, mlx_array* out_scales,
                 mlx_array* out_biases, mlx_array w, int group_size, int bits,
                 mlx_stream s) {
  return guard([&] {
    need(out_w, "out_w");
    need(out_scales, "out_scales");
    need(out_biases, "out_biases");
    auto parts =
        mx::quantize(arr(w, "w"), group_size, bits, "affine", {}, stream(s));
    if (parts.size() != 3) {
      throw std::runtime_error("affine quantize returned " +
                               std::to_string(parts.size()) +
                               " arrays, expected 3");
    }
    put(out_w, parts[0]);
    put(out_scales, parts[1]);
    put(out_biases, parts[2]);
  });
}

int mlx_dequantize(mlx_array* out, mlx_array w, mlx_array scales,
                   mlx_array biases, int group_size, int bits, mlx_stream s) {
  return guard([&] {
    put(out, mx::dequantize(arr(w, "w"), arr(scales, "scales"),
                            arr(biases, "biases"), group_size, bits, "affine",
                            {}, std::nullopt, stream(s)));
  });
}

int mlx_quantized_matmul(mlx_array* out, mlx_array x, mlx_array w,
                         mlx_array scales, mlx_array biases, bool transpose,
                         int group_size, int bits, mlx_stream s) {
  return guard([&] {
    put(out, mx::quantized_matmul(arr(x, "x"), arr(w, "w"),
                                  arr(scales, "scales"), arr(biases, "biases"),
                                  transpose, group_size, bits, "affine",
                                  stream(s)));
  });
}

// ---- fused kernels

int mlx_fast_rms_norm(mlx_array* out, mlx_array x, mlx_array weight, float eps,
                      mlx_stream s) {
  return guard([&] {
    put(out, mx::fast::rms_norm(arr(x, "x"), opt(weight), eps, stream(s)));
  });
}

int mlx_fast_rope(mlx_array* out, mlx_array x, int dims, bool traditional,
                  float base, float scale, int offset, mlx_array freqs,
                  mlx_stream s) {
  return guard([&] {
    auto f = opt(freqs);
    std::optional<float> b = f ? std::nullopt : std::optional<float>(base);
    put(out, mx::fast::rope(arr(x, "x"), dims, traditional, b, scale, offset,
                            f, stream(s)));
  });
}

int mlx_fast_rope_dynamic(mlx_array* out, mlx_array x, int dims,
                          bool traditional, float base, float scale,
                          mlx_array offset, mlx_array freqs, mlx_stream s) {
  return guard([&] {
    auto f = opt(freqs);
    std::optional<float> b = f ? std::nullopt : std::optional<float>(base);
    put(out, mx::fast::rope(arr(x, "x"), dims, traditional, b, scale,
                            arr(offset, "offset"), f, stream(s)));
  });
}

int mlx_fast_scaled_dot_product_attention(mlx_array* out, mlx_array q,
                                          mlx_array k, mlx_array v,
                                          float scale, const char* mask_mode,
                                          mlx_array mask, mlx_array sinks,
                                          mlx_stream s) {
  return guard([&] {
    put(out, mx::fast::scaled_dot_product_attention(
                 arr(q, "q"), arr(k, "k"), arr(v, "v"), scale, mode(mask_mode),
                 opt(mask), opt(sinks), false, stream(s)));
  });
}

// ---- random

int mlx_random_key(mlx_array* out, uint64_t seed) {
  return guard([&] { put(out, mx::random::key(seed)); });
}

int mlx_random_split(mlx_array* out_a, mlx_array* out_b, mlx_array key,
                     mlx_stream s) {
  return guard([&] {
    need(out_a, "out_a");
    need(out_b, "out_b");
    auto [a, b] = mx::random::split(arr(key, "key"), stream(s));
    put(out_a, a);
    put(out_b, b);
  });
}

int mlx_random_uniform(mlx_array* out, float low, float high,
                       const int* dims, size_t ndim, mlx_dtype d,
                       mlx_array key, mlx_stream s) {
  return guard([&] {
    put(out, mx::random::uniform(mx::array(low), mx::array(high),
                                 shape(dims, ndim), dtype(d), opt(key),
                                 stream(s)));
  });
}

int mlx_random_normal(mlx_array* out, const int* dims, size_t ndim,
                      mlx_dtype d, float loc, float scale, mlx_array key,
                      mlx_stream s) {
  return guard([&] {
    put(out, mx::random::normal(shape(dims, ndim), dtype(d), loc, scale,
                                opt(key), stream(s)));
  });
}

int mlx_random_categorical(mlx_array* out, mlx_array logits, int axis,
                           mlx_array key, mlx_stream s) {
  return guard([&] {
    put(out, mx::random::categorical(arr(logits, "logits"), axis, opt(key),
                                     stream(s)));
  });
}

}  // extern "C"
