// Errors, version, devices, streams, memory, arrays, vectors and closures.
#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "internal.h"
#include "mlx/compile_impl.h"

namespace mlxc {

namespace {
thread_local std::string last_error;
}

void set_error(const std::string& message) { last_error = message; }

const char* last_error_text() { return last_error.c_str(); }

mx::Shape shape(const int* dims, size_t ndim) {
  if (ndim > 0) {
    need(dims, "shape");
  }
  mx::Shape out;
  for (size_t i = 0; i < ndim; ++i) {
    if (dims[i] < 0) {
      throw std::invalid_argument("shape has a negative dimension " +
                                  std::to_string(dims[i]));
    }
    out.push_back(dims[i]);
  }
  return out;
}

std::vector<int> ints(const int* values, size_t n) {
  if (n > 0) {
    need(values, "list");
  }
  return std::vector<int>(values, values + n);
}

std::vector<int> axes_or_all(const mx::array& a, const int* axes, size_t n) {
  if (axes == nullptr) {
    std::vector<int> all(a.ndim());
    for (size_t i = 0; i < all.size(); ++i) {
      all[i] = static_cast<int>(i);
    }
    return all;
  }
  return ints(axes, n);
}

std::vector<mx::array> arrays(const mlx_array* handles, size_t n) {
  if (n > 0) {
    need(handles, "arrays");
  }
  std::vector<mx::array> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(arr(handles[i], "arrays[i]"));
  }
  return out;
}

mx::Dtype dtype(mlx_dtype d) {
  switch (d) {
    case MLX_BOOL: return mx::bool_;
    case MLX_UINT8: return mx::uint8;
    case MLX_UINT16: return mx::uint16;
    case MLX_UINT32: return mx::uint32;
    case MLX_UINT64: return mx::uint64;
    case MLX_INT8: return mx::int8;
    case MLX_INT16: return mx::int16;
    case MLX_INT32: return mx::int32;
    case MLX_INT64: return mx::int64;
    case MLX_FLOAT16: return mx::float16;
    case MLX_FLOAT32: return mx::float32;
    case MLX_FLOAT64: return mx::float64;
    case MLX_BFLOAT16: return mx::bfloat16;
    case MLX_COMPLEX64: return mx::complex64;
  }
  throw std::invalid_argument("unknown dtype value " +
                              std::to_string(static_cast<int>(d)));
}

mlx_dtype c_dtype(mx::Dtype d) {
  switch (d.val()) {
    case mx::Dtype::Val::bool_: return MLX_BOOL;
    case mx::Dtype::Val::uint8: return MLX_UINT8;
    case mx::Dtype::Val::uint16: return MLX_UINT16;
    case mx::Dtype::Val::uint32: return MLX_UINT32;
    case mx::Dtype::Val::uint64: return MLX_UINT64;
    case mx::Dtype::Val::int8: return MLX_INT8;
    case mx::Dtype::Val::int16: return MLX_INT16;
    case mx::Dtype::Val::int32: return MLX_INT32;
    case mx::Dtype::Val::int64: return MLX_INT64;
    case mx::Dtype::Val::float16: return MLX_FLOAT16;
    case mx::Dtype::Val::float32: return MLX_FLOAT32;
    case mx::Dtype::Val::float64: return MLX_FLOAT64;
    case mx::Dtype::Val::bfloat16: return MLX_BFLOAT16;
    case mx::Dtype::Val::complex64: return MLX_COMPLEX64;
  }
  throw std::invalid_argument("MLX dtype without a C equivalent");
}

}  // namespace mlxc

using namespace mlxc;

extern "C" {

const char* mlx_last_error(void) { return last_error_text(); }

const char* mlx_version(void) { return mx::version(); }

// ---- devices and streams

int mlx_device_new(mlx_device* out, mlx_device_type type, int index) {
  return guard([&] {
    auto t = type == MLX_DEVICE_GPU ? mx::Device::gpu : mx::Device::cpu;
    if (type != MLX_DEVICE_GPU && type != MLX_DEVICE_CPU) {
      throw std::invalid_argument("unknown device type");
    }
    *need(out, "out") = new mlx_device_s{mx::Device(t, index)};
  });
}

void mlx_device_free(mlx_device dev) { delete dev; }

int mlx_device_get_type(mlx_device_type* out, mlx_device dev) {
  return guard([&] {
    *need(out, "out") = need(dev, "dev")->d.type == mx::Device::gpu
                            ? MLX_DEVICE_GPU
                            : MLX_DEVICE_CPU;
  });
}

int mlx_device_get_index(int* out, mlx_device dev) {
  return guard([&] { *need(out, "out") = need(dev, "dev")->d.index; });
}

int mlx_device_is_available(bool* out, mlx_device dev) {
  return guard(
      [&] { *need(out, "out") = mx::is_available(need(dev, "dev")->d); });
}

int mlx_cuda_device_attribute(int* out, int index,
                              mlx_cuda_attribute attribute) {
  return guard([&] {
    // The driver is already loaded where MLX computes on CUDA; nothing is
    // loaded (or linked) otherwise.
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (driver == nullptr) {
      throw std::runtime_error("no CUDA driver is loaded (MLX is not computing on CUDA)");
    }
    using GetDevice = int (*)(int*, int);
    using GetAttribute = int (*)(int*, int, int);
    auto get_device = reinterpret_cast<GetDevice>(dlsym(driver, "cuDeviceGet"));
    auto get_attribute =
        reinterpret_cast<GetAttribute>(dlsym(driver, "cuDeviceGetAttribute"));
    int device = 0;
    int value = 0;
    if (get_device == nullptr || get_attribute == nullptr ||
        get_device(&device, index) != 0 ||
        get_attribute(&value, attribute, device) != 0) {
      dlclose(driver);
      throw std::runtime_error("the CUDA driver did not give attribute " +
                               std::to_string(attribute) + " of GPU " +
                               std::to_string(index));
    }
    dlclose(driver);
    *need(out, "out") = value;
  });
}

int mlx_get_default_device(mlx_device* out) {
  return guard(
      [&] { *need(out, "out") = new mlx_device_s{mx::default_device()}; });
}

int mlx_set_default_device(mlx_device dev) {
  return guard([&] { mx::set_default_device(need(dev, "dev")->d); });
}

int mlx_stream_new(mlx_stream* out, mlx_device dev) {
  return guard([&] {
    *need(out, "out") = new mlx_stream_s{mx::new_stream(need(dev, "dev")->d)};
  });
}

int mlx_stream_default(mlx_stream* out, mlx_device dev) {
  return guard([&] {
    *need(out, "out") =
        new mlx_stream_s{mx::default_stream(need(dev, "dev")->d)};
  });
}

void mlx_stream_free(mlx_stream s) { delete s; }

int mlx_stream_get_device(mlx_device* out, mlx_stream s) {
  return guard([&] {
    *need(out, "out") = new mlx_device_s{need(s, "s")->s.device};
  });
}

int mlx_synchronize(mlx_stream s) {
  return guard([&] {
    if (s == nullptr) {
      mx::synchronize();
    } else {
      mx::synchronize(s->s);
    }
  });
}

// ---- memory

int mlx_memory_active(size_t* out) {
  return guard([&] { *need(out, "out") = mx::get_active_memory(); });
}

int mlx_memory_peak(size_t* out) {
  return guard([&] { *need(out, "out") = mx::get_peak_memory(); });
}

int mlx_memory_cache(size_t* out) {
  return guard([&] { *need(out, "out") = mx::get_cache_memory(); });
}

int mlx_memory_reset_peak(void) {
  return guard([&] { mx::reset_peak_memory(); });
}

int mlx_memory_limit(size_t* out) {
  return guard([&] { *need(out, "out") = mx::get_memory_limit(); });
}

int mlx_memory_set_limit(size_t* previous, size_t limit) {
  return guard(
      [&] { *need(previous, "previous") = mx::set_memory_limit(limit); });
}

int mlx_memory_set_cache_limit(size_t* previous, size_t limit) {
  return guard(
      [&] { *need(previous, "previous") = mx::set_cache_limit(limit); });
}

int mlx_memory_clear_cache(void) {
  return guard([&] { mx::clear_cache(); });
}

// ---- arrays

void mlx_array_free(mlx_array a) { delete a; }

int mlx_array_clone(mlx_array* out, mlx_array a) {
  return guard([&] { put(out, arr(a, "a")); });
}

int mlx_array_from_data(mlx_array* out, const void* data, const int* dims,
                        size_t ndim, mlx_dtype d) {
  return guard([&] {
    auto shp = shape(dims, ndim);
    auto dt = dtype(d);
    size_t size = 1;
    for (auto dim : shp) {
      size *= static_cast<size_t>(dim);
    }
    if (size > 0) {
      need(data, "data");
    }
    // One byte copy into MLX's allocator serves every dtype.
    auto buffer = mx::allocator::malloc(size * dt.size());
    if (size > 0) {
      std::memcpy(buffer.buffer().raw_ptr(), data, size * dt.size());
    }
    put(out, mx::array(std::move(buffer), std::move(shp), dt));
  });
}

int mlx_array_alloc(mlx_array* out, void** data, const int* dims, size_t ndim,
                    mlx_dtype d) {
  return guard([&] {
    need(data, "data");
    auto shp = shape(dims, ndim);
    auto dt = dtype(d);
    size_t size = 1;
    for (auto dim : shp) {
      size *= static_cast<size_t>(dim);
    }
    auto buffer = mx::allocator::malloc(size * dt.size());
    void* raw = size > 0 ? buffer.buffer().raw_ptr() : nullptr;
    put(out, mx::array(std::move(buffer), std::move(shp), dt));
    *data = raw;
  });
}

int mlx_array_from_buffer(mlx_array* out, void* data, const int* dims,
                          size_t ndim, mlx_dtype d,
                          void (*release)(void* ctx), void* ctx) {
  auto released = std::make_shared<bool>(false);
  auto release_once = [release, ctx, released](void*) {
    if (!*released) {
      *released = true;
      if (release != nullptr) {
        release(ctx);
      }
    }
  };
  int status = guard([&] {
    auto shp = shape(dims, ndim);
    auto dt = dtype(d);
    need(data, "data");
    put(out, mx::array(data, std::move(shp), dt, release_once));
  });
  if (status != 0) {
    release_once(nullptr);
  }
  return status;
}

int mlx_array_scalar(mlx_array* out, double value, mlx_dtype d) {
  return guard([&] {
    // Converted on the host into a ready array: no graph node, no stream.
    put(out, mx::array(value, dtype(d)));
  });
}

int mlx_array_ndim(size_t* out, mlx_array a) {
  return guard([&] { *need(out, "out") = arr(a, "a").ndim(); });
}

int mlx_array_shape(const int** out, mlx_array a) {
  return guard([&] { *need(out, "out") = arr(a, "a").shape().data(); });
}

int mlx_array_dtype(mlx_dtype* out, mlx_array a) {
  return guard([&] { *need(out, "out") = c_dtype(arr(a, "a").dtype()); });
}

int mlx_array_size(size_t* out, mlx_array a) {
  return guard([&] { *need(out, "out") = arr(a, "a").size(); });
}

int mlx_array_nbytes(size_t* out, mlx_array a) {
  return guard([&] { *need(out, "out") = arr(a, "a").nbytes(); });
}

int mlx_array_is_available(bool* out, mlx_array a) {
  return guard([&] { *need(out, "out") = arr(a, "a").is_available(); });
}

int mlx_dtype_size(size_t* out, mlx_dtype d) {
  return guard([&] { *need(out, "out") = dtype(d).size(); });
}

int mlx_array_read(mlx_array a, void* dst, size_t dst_bytes) {
  return guard([&] {
    mx::array x = arr(a, "a");
    if (dst_bytes != x.nbytes()) {
      throw std::invalid_argument(
          "read buffer holds " + std::to_string(dst_bytes) +
          " bytes, the array has " + std::to_string(x.nbytes()));
    }
    x = mx::contiguous(x, false, mx::Device::cpu);
    x.eval();
    x.wait();
    if (dst_bytes > 0) {
      std::memcpy(need(dst, "dst"), x.data<uint8_t>(), dst_bytes);
    }
  });
}

int mlx_eval(const mlx_array* handles, size_t n) {
  return guard([&] { mx::eval(arrays(handles, n)); });
}

int mlx_async_eval(const mlx_array* handles, size_t n) {
  return guard([&] { mx::async_eval(arrays(handles, n)); });
}

// ---- vectors of arrays

int mlx_vector_array_new(mlx_vector_array* out) {
  return guard([&] { *need(out, "out") = new mlx_vector_array_s{}; });
}

void mlx_vector_array_free(mlx_vector_array v) { delete v; }

int mlx_vector_array_size(size_t* out, mlx_vector_array v) {
  return guard([&] { *need(out, "out") = need(v, "v")->v.size(); });
}

int mlx_vector_array_get(mlx_array* out, mlx_vector_array v, size_t index) {
  return guard([&] {
    auto& items = need(v, "v")->v;
    if (index >= items.size()) {
      throw std::out_of_range("index " + std::to_string(index) +
                              " past the vector's " +
                              std::to_string(items.size()) + " arrays");
    }
    put(out, items[index]);
  });
}

int mlx_vector_array_push(mlx_vector_array v, mlx_array a) {
  return guard([&] { need(v, "v")->v.push_back(arr(a, "a")); });
}

// ---- closures and compile

namespace {

using CacheRef = mx::detail::CompileCacheWeakPtr;

/// Whether two references name the same compile cache (one per thread).
bool same_cache(const CacheRef& a, const CacheRef& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}

/// Traces of dropped compiled functions left in another thread's compile
/// cache; that thread erases them itself (the caches are not shared between
/// threads) the next time it calls a compiled function.
struct DeferredErase {
  std::mutex mutex;
  std::vector<std::pair<CacheRef, std::uintptr_t>> entries;
};

DeferredErase& deferred_erase() {
  static DeferredErase deferred;
  return deferred;
}

/// Erases the traces deferred to this thread's cache.
void erase_deferred_for_this_thread() {
  auto mine = mx::detail::compile_cache();
  std::vector<std::uintptr_t> ids;
  {
    auto& deferred = deferred_erase();
    std::lock_guard<std::mutex> lock(deferred.mutex);
    std::erase_if(deferred.entries, [&](const auto& entry) {
      if (entry.first.expired()) {
        return true;  // that thread and its cache are gone
      }
      if (same_cache(entry.first, mine)) {
        ids.push_back(entry.second);
        return true;
      }
      return false;
    });
  }
  for (auto id : ids) {
    mx::detail::compile_erase(mine, id);
  }
}

/// A compiled function's key in MLX's compile caches and the caches (one per
/// thread that called it) holding its traces, which are erased when it is
/// dropped. Keys are never reused, so a trace that outlives its function
/// can never be taken for another function's.
struct CompiledEntry {
  std::shared_ptr<void> inner;
  std::uintptr_t id;
  std::mutex mutex;
  std::vector<CacheRef> caches;

  CompiledEntry() {
    static std::atomic<std::uintptr_t> next_id{1};
    id = next_id.fetch_add(1);
  }

  /// Records that this thread's cache may now hold a trace.
  void note_this_thread() {
    auto mine = mx::detail::compile_cache();
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& cache : caches) {
      if (same_cache(cache, mine)) {
        return;
      }
    }
    caches.push_back(mine);
  }

  ~CompiledEntry() {
    auto mine = mx::detail::compile_cache();
    for (const auto& cache : caches) {
      if (cache.expired()) {
        continue;
      }
      if (same_cache(cache, mine)) {
        mx::detail::compile_erase(cache, id);
      } else {
        auto& deferred = deferred_erase();
        std::lock_guard<std::mutex> lock(deferred.mutex);
        deferred.entries.emplace_back(cache, id);
      }
    }
  }
};

}  // namespace

int mlx_closure_new(mlx_closure* out, mlx_closure_fn fn, void* ctx,
                    void (*ctx_free)(void* ctx)) {
  auto owner = std::make_shared<CallerContext>();
  owner->ctx = ctx;
  owner->ctx_free = ctx_free;
  return guard([&] {
    need(fn, "fn");
    auto f = [fn, owner](const std::vector<mx::array>& inputs) {
      std::vector<mlx_array_s> held;
      held.reserve(inputs.size());
      for (const auto& x : inputs) {
        held.push_back(mlx_array_s{x});
      }
      std::vector<mlx_array> handles;
      handles.reserve(held.size());
      for (auto& h : held) {
        handles.push_back(&h);
      }
      mlx_vector_array_s outputs;
      char error[1024] = {0};
      int status = fn(owner->ctx, handles.data(), handles.size(), &outputs,
                      error, sizeof(error));
      if (status != 0) {
        error[sizeof(error) - 1] = '\0';
        throw std::runtime_error(error[0] != '\0' ? error
                                                  : "closure failed");
      }
      return outputs.v;
    };
    *need(out, "out") = new mlx_closure_s{f, owner};
  });
}

void mlx_closure_free(mlx_closure c) { delete c; }

int mlx_compile(mlx_closure* out, mlx_closure c, bool shapeless) {
  return guard([&] {
    need(c, "c");
    auto entry = std::make_shared<CompiledEntry>();
    entry->inner = c->keep;
    auto compiled = mx::detail::compile(c->f, entry->id, shapeless);
    // `entry` outlives every call: the closure handle keeps it with `f`.
    auto* raw = entry.get();
    auto f = [compiled, raw](const std::vector<mx::array>& inputs) {
      erase_deferred_for_this_thread();
      raw->note_this_thread();
      return compiled(inputs);
    };
    *need(out, "out") = new mlx_closure_s{f, entry};
  });
}

int mlx_closure_apply(mlx_vector_array* out, mlx_closure c,
                      const mlx_array* inputs, size_t n) {
  return guard([&] {
    auto result = need(c, "c")->f(arrays(inputs, n));
    *need(out, "out") = new mlx_vector_array_s{std::move(result)};
  });
}

}  // extern "C"
