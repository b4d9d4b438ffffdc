// An operation whose CPU evaluation is a kernel of the caller's: MLX hands it
// the inputs' bytes and the output's buffer on the CPU stream's thread.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "internal.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

using namespace mlxc;

namespace {

class CpuKernel : public mx::UnaryPrimitive {
 public:
  CpuKernel(mx::Stream stream, mlx_cpu_kernel_fn fn,
            std::shared_ptr<CallerContext> owner)
      : UnaryPrimitive(stream), fn_(fn), owner_(std::move(owner)) {}

  void eval_cpu(const std::vector<mx::array>& inputs,
                mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    std::vector<void*> data;
    std::vector<size_t> bytes;
    for (const auto& x : inputs) {
      if (!x.flags().row_contiguous) {
        throw std::runtime_error("cpu kernel: an input is not row-contiguous");
      }
      encoder.set_input_array(x);
      // The array's own buffer: a kernel may write into an input handed
      // over to it (mlx_c.h).
      data.push_back(const_cast<void*>(x.data<void>()));
      bytes.push_back(x.nbytes());
    }
    encoder.set_output_array(out);
    bool floating = mx::issubdtype(out.dtype(), mx::floating);
    size_t count = out.size();
    encoder.dispatch([fn = fn_, owner = owner_, data = std::move(data),
                      bytes = std::move(bytes), dst = out.data<void>(),
                      out_bytes = out.nbytes(), floating, count,
                      dtype = out.dtype()]() {
      char error[512] = {0};
      int status = fn(owner->ctx, data.data(), bytes.data(), data.size(), dst,
                      out_bytes, error, sizeof(error));
      if (status == 0) {
        return;
      }
      // Nothing can be thrown from here (the stream's thread): the failure
      // is reported and the output poisoned, so that it is never silently
      // taken for a result.
      error[sizeof(error) - 1] = '\0';
      std::fprintf(stderr, "cpu kernel failed: %s\n", error);
      if (floating && dtype == mx::float32) {
        auto* f = static_cast<float*>(dst);
        for (size_t i = 0; i < count; ++i) {
          f[i] = std::nanf("");
        }
      } else {
        std::memset(dst, 0xff, out_bytes);
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("a cpu kernel runs on the CPU only");
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const CpuKernel*>(&other);
    return o != nullptr && o->fn_ == fn_ && o->owner_ == owner_;
  }

  DEFINE_NAME(CpuKernel)

 private:
  mlx_cpu_kernel_fn fn_;
  std::shared_ptr<CallerContext> owner_;
};

}  // namespace

extern "C" {

int mlx_cpu_kernel(mlx_array* out, mlx_cpu_kernel_fn fn, void* ctx,
                   void (*ctx_free)(void* ctx), const mlx_array* inputs,
                   size_t n, const int* shape, size_t ndim, mlx_dtype dtype,
                   mlx_stream s) {
  auto owner = std::make_shared<CallerContext>();
  owner->ctx = ctx;
  owner->ctx_free = ctx_free;
  return guard([&] {
    need(fn, "fn");
    auto st = mx::to_stream(stream(s));
    if (st.device != mx::Device::cpu) {
      throw std::invalid_argument("a cpu kernel needs a CPU stream");
    }
    std::vector<mx::array> args;
    for (const auto& x : arrays(inputs, n)) {
      args.push_back(mx::contiguous(x, false, st));
    }
    put(out, mx::array(mlxc::shape(shape, ndim), mlxc::dtype(dtype),
                       std::make_shared<CpuKernel>(st, fn, owner),
                       std::move(args)));
  });
}

}  // extern "C"
