// An operation whose CPU evaluation is a kernel of the caller's: MLX hands it
// the inputs' bytes and the output's buffer on the CPU stream's thread.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "internal.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

using namespace mlxc;

namespace {

/// An input that is not row-contiguous (a broadcast, a transpose, a strided
/// slice): gathered into a buffer of its own on the stream's thread, when
/// its values are ready. By hand: MLX's own copy (`copy_cpu`,
/// `contiguous_copy_cpu`) is not exported from the wheels' `libmlx.so`.
struct Scattered {
  size_t input;
  const char* src;
  std::vector<int> shape;
  std::vector<int64_t> strides;
  size_t itemsize;
  size_t nbytes;
};

/// The values of `in` in row-major order, into `dst`.
void gather(const Scattered& in, char* dst) {
  // Unit axes dropped, axes that step into each other merged.
  std::vector<int> shape;
  std::vector<int64_t> strides;
  for (size_t i = 0; i < in.shape.size(); ++i) {
    if (in.shape[i] == 1) {
      continue;
    }
    if (!shape.empty() && strides.back() == in.strides[i] * in.shape[i]) {
      shape.back() *= in.shape[i];
      strides.back() = in.strides[i];
      continue;
    }
    shape.push_back(in.shape[i]);
    strides.push_back(in.strides[i]);
  }
  const size_t item = in.itemsize;
  if (shape.empty()) {
    std::memcpy(dst, in.src, in.nbytes);
    return;
  }
  const size_t axes = shape.size();
  const int inner = shape.back();
  const int64_t step = strides.back() * static_cast<int64_t>(item);
  const bool run = strides.back() == 1;
  std::vector<int> index(axes, 0);
  const char* src = in.src;
  for (size_t done = 0; done < in.nbytes; done += inner * item) {
    if (run) {
      std::memcpy(dst, src, inner * item);
    } else {
      for (int i = 0; i < inner; ++i) {
        std::memcpy(dst + i * item, src + i * step, item);
      }
    }
    dst += inner * item;
    // The next row: the outer index counts up like an odometer.
    for (size_t a = axes - 1; a-- > 0;) {
      src += strides[a] * static_cast<int64_t>(item);
      if (++index[a] < shape[a]) {
        break;
      }
      src -= strides[a] * static_cast<int64_t>(item) * shape[a];
      index[a] = 0;
    }
  }
}

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
    std::vector<Scattered> scattered;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& x = inputs[i];
      encoder.set_input_array(x);
      if (x.flags().row_contiguous) {
        // The array's own buffer (a view's part of it: a slice of rows is
        // not copied): a kernel may write into an input handed over to it
        // (mlx_c.h).
        data.push_back(const_cast<void*>(x.data<void>()));
      } else {
        std::vector<int64_t> strides(x.strides().begin(), x.strides().end());
        scattered.push_back(Scattered{i, x.data<char>(),
                                      std::vector<int>(x.shape().begin(),
                                                       x.shape().end()),
                                      std::move(strides), x.itemsize(),
                                      x.nbytes()});
        data.push_back(nullptr);
      }
      bytes.push_back(x.nbytes());
    }
    encoder.set_output_array(out);
    bool floating = mx::issubdtype(out.dtype(), mx::floating);
    size_t count = out.size();
    encoder.dispatch([fn = fn_, owner = owner_, data = std::move(data),
                      bytes = std::move(bytes),
                      scattered = std::move(scattered), dst = out.data<void>(),
                      out_bytes = out.nbytes(), floating, count,
                      dtype = out.dtype()]() mutable {
      std::vector<std::unique_ptr<char[]>> gathered;
      for (const auto& in : scattered) {
        gathered.emplace_back(new char[in.nbytes]);
        gather(in, gathered.back().get());
        data[in.input] = gathered.back().get();
      }
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
    put(out, mx::array(mlxc::shape(shape, ndim), mlxc::dtype(dtype),
                       std::make_shared<CpuKernel>(st, fn, owner),
                       arrays(inputs, n)));
  });
}

}  // extern "C"
