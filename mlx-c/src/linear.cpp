// x @ wᵀ, with a matrix-vector path for a single float32 row on the CPU.
//
// MLX's CPU matmul always calls cblas_sgemm. For one row (decoding) OpenBLAS
// then packs the whole weight matrix on every call; cblas_sgemv streams it
// once instead. The BLAS that libmlx.so already loaded provides the symbol,
// found at run time; without it, or off the CPU, this is plain matmul.
#include <dlfcn.h>

#include "internal.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

using namespace mlxc;

namespace {

using SgemvFn = void (*)(int order, int trans, int m, int n, float alpha,
                         const float* a, int lda, const float* x, int incx,
                         float beta, float* y, int incy);

constexpr int kCblasRowMajor = 101;
constexpr int kCblasNoTrans = 111;

SgemvFn find_sgemv() {
  static SgemvFn fn =
      reinterpret_cast<SgemvFn>(dlsym(RTLD_DEFAULT, "cblas_sgemv"));
  return fn;
}

/// y = W x for one row x [..., K] and a row-contiguous W [N, K].
class RowTimesTransposed : public mx::UnaryPrimitive {
 public:
  RowTimesTransposed(mx::Stream stream, SgemvFn sgemv)
      : UnaryPrimitive(stream), sgemv_(sgemv) {}

  void eval_cpu(const std::vector<mx::array>& inputs,
                mx::array& out) override {
    const auto& x = inputs[0];
    const auto& w = inputs[1];
    if (!x.flags().row_contiguous || !w.flags().row_contiguous) {
      throw std::runtime_error("RowTimesTransposed needs contiguous inputs");
    }
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    encoder.set_input_array(w);
    encoder.set_output_array(out);
    int n = w.shape(0);
    int k = w.shape(1);
    encoder.dispatch([sgemv = sgemv_, xp = x.data<float>(),
                      wp = w.data<float>(), yp = out.data<float>(), n, k]() {
      sgemv(kCblasRowMajor, kCblasNoTrans, n, k, 1.0f, wp, k, xp, 1, 0.0f, yp,
            1);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("RowTimesTransposed runs on the CPU only");
  }

  DEFINE_NAME(RowTimesTransposed)
  DEFINE_DEFAULT_IS_EQUIVALENT()

 private:
  SgemvFn sgemv_;
};

}  // namespace

extern "C" {

int mlx_linear(mlx_array* out, mlx_array x, mlx_array w, mlx_stream s) {
  return guard([&] {
    const auto& xa = arr(x, "x");
    const auto& wa = arr(w, "w");
    auto st = mx::to_stream(stream(s));
    auto sgemv = find_sgemv();
    bool one_row = xa.ndim() >= 1 && wa.ndim() == 2 &&
                   xa.shape(-1) == wa.shape(1) && xa.size() == static_cast<size_t>(xa.shape(-1));
    if (sgemv == nullptr || st.device != mx::Device::cpu || !one_row ||
        xa.dtype() != mx::float32 || wa.dtype() != mx::float32) {
      put(out, mx::matmul(xa, mx::transpose(wa, st), st));
      return;
    }
    auto shape = xa.shape();
    shape.back() = wa.shape(0);
    auto xc = mx::contiguous(xa, false, st);
    auto wc = mx::contiguous(wa, false, st);
    put(out, mx::array(std::move(shape), mx::float32,
                       std::make_shared<RowTimesTransposed>(st, sgemv),
                       {xc, wc}));
  });
}

}  // extern "C"
