// Shared pieces of the C API's implementation: handle layouts, argument
// conversion and the one guard every entry point runs its body in.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mlx/mlx.h"
#include "mlx_c.h"

namespace mx = mlx::core;

struct mlx_array_s {
  mx::array a;
};

struct mlx_vector_array_s {
  std::vector<mx::array> v;
};

struct mlx_device_s {
  mx::Device d;
};

struct mlx_stream_s {
  mx::Stream s;
};

struct mlx_closure_s {
  std::function<std::vector<mx::array>(const std::vector<mx::array>&)> f;
  // Keeps whatever the function needs alive (its context, a compile cache entry).
  std::shared_ptr<void> keep;
};

namespace mlxc {

/// A caller's context handed to a callback (a closure, a CPU kernel): freed
/// by the caller's function when the last holder is gone.
struct CallerContext {
  void* ctx = nullptr;
  void (*ctx_free)(void*) = nullptr;
  ~CallerContext() {
    if (ctx_free != nullptr) {
      ctx_free(ctx);
    }
  }
};

/// Stores `message` as this thread's last error.
void set_error(const std::string& message);

/// This thread's last error message.
const char* last_error_text();

/// Runs `body`; returns 0, or 1 with the exception's message stored.
template <typename F>
int guard(F&& body) noexcept {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
  } catch (...) {
    set_error("unknown C++ exception");
  }
  return 1;
}

/// Throws unless `p` is non-null; `name` is the argument's name.
template <typename T>
T* need(T* p, const char* name) {
  if (p == nullptr) {
    throw std::invalid_argument(std::string("argument '") + name +
                                "' is NULL");
  }
  return p;
}

/// The array behind a required handle.
inline const mx::array& arr(mlx_array h, const char* name) {
  return need(h, name)->a;
}

/// The array behind a nullable handle.
inline std::optional<mx::array> opt(mlx_array h) {
  if (h == nullptr) {
    return std::nullopt;
  }
  return h->a;
}

/// The stream behind a nullable handle ({} selects the default stream).
inline mx::StreamOrDevice stream(mlx_stream s) {
  if (s == nullptr) {
    return {};
  }
  return s->s;
}

/// A shape from a pointer and a length.
mx::Shape shape(const int* dims, size_t ndim);

/// A list of ints from a pointer and a length.
std::vector<int> ints(const int* values, size_t n);

/// Axes from a pointer and a length, or every axis of `a` when `axes` is NULL.
std::vector<int> axes_or_all(const mx::array& a, const int* axes, size_t n);

/// The arrays behind a list of handles.
std::vector<mx::array> arrays(const mlx_array* handles, size_t n);

/// MLX's dtype for a C dtype (throws for an unknown value).
mx::Dtype dtype(mlx_dtype d);

/// The C dtype for MLX's dtype.
mlx_dtype c_dtype(mx::Dtype d);

/// Writes a new handle holding `a` to `out`.
inline void put(mlx_array* out, mx::array a) {
  *need(out, "out") = new mlx_array_s{std::move(a)};
}

}  // namespace mlxc
