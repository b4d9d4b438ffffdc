// Custom CUDA kernels behind the C API: compiled with the NVRTC that MLX's
// CUDA backend loaded, and run as MLX's precompiled custom kernels.
#include <dlfcn.h>

#include <mutex>

#include "internal.h"

using namespace mlxc;

struct mlx_cuda_binary_s {
  std::string code;
};

namespace {

// NVRTC's C API, as declared in nvrtc.h (its status is an enum, its program
// an opaque pointer).
using Program = void*;
struct Nvrtc {
  int (*version)(int*, int*);
  int (*create)(Program*, const char*, const char*, int, const char* const*,
                const char* const*);
  int (*compile)(Program, int, const char* const*);
  int (*log_size)(Program, size_t*);
  int (*log)(Program, char*);
  int (*cubin_size)(Program, size_t*);
  int (*cubin)(Program, char*);
  int (*destroy)(Program*);
  const char* (*error)(int);
};

template <typename F>
void bind(void* library, const char* symbol, F*& into) {
  into = reinterpret_cast<F*>(dlsym(library, symbol));
  if (into == nullptr) {
    throw std::runtime_error(std::string("NVRTC lacks ") + symbol);
  }
}

// The NVRTC library MLX's CUDA backend linked, found once; nothing is loaded
// where MLX does not compute on CUDA.
const Nvrtc& nvrtc() {
  static std::once_flag once;
  static Nvrtc api;
  static std::string failure;
  std::call_once(once, [] {
    void* library = nullptr;
    for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12"}) {
      library = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
      if (library != nullptr) {
        break;
      }
    }
    if (library == nullptr) {
      failure = "no NVRTC library is loaded (MLX is not computing on CUDA)";
      return;
    }
    try {
      bind(library, "nvrtcVersion", api.version);
      bind(library, "nvrtcCreateProgram", api.create);
      bind(library, "nvrtcCompileProgram", api.compile);
      bind(library, "nvrtcGetProgramLogSize", api.log_size);
      bind(library, "nvrtcGetProgramLog", api.log);
      bind(library, "nvrtcGetCUBINSize", api.cubin_size);
      bind(library, "nvrtcGetCUBIN", api.cubin);
      bind(library, "nvrtcDestroyProgram", api.destroy);
      bind(library, "nvrtcGetErrorString", api.error);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) {
    throw std::runtime_error(failure);
  }
  return api;
}

void nvrtc_check(const Nvrtc& api, int status, const char* call) {
  if (status != 0) {
    throw std::runtime_error(std::string(call) + " failed: " +
                             api.error(status));
  }
}

}  // namespace

extern "C" {

int mlx_cuda_compiler_version(int* major, int* minor) {
  return guard([&] {
    const Nvrtc& api = nvrtc();
    nvrtc_check(api, api.version(need(major, "major"), need(minor, "minor")),
                "nvrtcVersion");
  });
}

int mlx_cuda_compile(mlx_cuda_binary* out, const char* source,
                     const char* program_name, const char* const* options,
                     size_t n_options) {
  return guard([&] {
    const Nvrtc& api = nvrtc();
    Program program = nullptr;
    nvrtc_check(api,
                api.create(&program, need(source, "source"),
                           need(program_name, "program_name"), 0, nullptr,
                           nullptr),
                "nvrtcCreateProgram");
    std::unique_ptr<Program, void (*)(Program*)> owned(
        &program, [](Program* p) { nvrtc().destroy(p); });
    if (n_options > 0) {
      need(options, "options");
    }
    int status = api.compile(program, static_cast<int>(n_options), options);
    if (status != 0) {
      size_t size = 0;
      api.log_size(program, &size);
      std::string log(size, '\0');
      api.log(program, log.data());
      throw std::runtime_error(std::string("NVRTC could not compile ") +
                               program_name + ": " + api.error(status) +
                               "\n" + log.c_str());
    }
    size_t size = 0;
    nvrtc_check(api, api.cubin_size(program, &size), "nvrtcGetCUBINSize");
    std::string code(size, '\0');
    nvrtc_check(api, api.cubin(program, code.data()), "nvrtcGetCUBIN");
    *need(out, "out") = new mlx_cuda_binary_s{std::move(code)};
  });
}

int mlx_cuda_binary_from_bytes(mlx_cuda_binary* out, const uint8_t* data,
                               size_t size) {
  return guard([&] {
    if (size > 0) {
      need(data, "data");
    }
    *need(out, "out") = new mlx_cuda_binary_s{
        std::string(reinterpret_cast<const char*>(data), size)};
  });
}

int mlx_cuda_binary_bytes(const uint8_t** data, size_t* size,
                          mlx_cuda_binary binary) {
  return guard([&] {
    const std::string& code = need(binary, "binary")->code;
    *need(data, "data") = reinterpret_cast<const uint8_t*>(code.data());
    *need(size, "size") = code.size();
  });
}

void mlx_cuda_binary_free(mlx_cuda_binary binary) { delete binary; }

int mlx_cuda_binary_apply(mlx_vector_array* out, mlx_cuda_binary binary,
                          const char* kernel_name, const mlx_array* inputs,
                          size_t n_inputs, const int* output_shapes,
                          const size_t* output_ndims,
                          const mlx_dtype* output_dtypes, size_t n_outputs,
                          const int* scalars, size_t n_scalars,
                          const int* grid, const int* block,
                          int shared_memory, mlx_stream s) {
  return guard([&] {
    std::vector<mx::Shape> shapes;
    std::vector<mx::Dtype> dtypes;
    size_t at = 0;
    for (size_t i = 0; i < n_outputs; ++i) {
      size_t ndim = need(output_ndims, "output_ndims")[i];
      shapes.push_back(shape(output_shapes + at, ndim));
      at += ndim;
      dtypes.push_back(dtype(need(output_dtypes, "output_dtypes")[i]));
    }
    std::vector<mx::fast::ScalarArg> scalar_args;
    for (int value : ints(scalars, n_scalars)) {
      scalar_args.emplace_back(value);
    }
    need(grid, "grid");
    need(block, "block");
    if (shared_memory < 0) {
      throw std::invalid_argument("negative dynamic shared memory: " +
                                  std::to_string(shared_memory));
    }
    auto result = mx::fast::precompiled_cuda_kernel(
        need(kernel_name, "kernel_name"), need(binary, "binary")->code,
        arrays(inputs, n_inputs), shapes, dtypes, scalar_args,
        {grid[0], grid[1], grid[2]}, {block[0], block[1], block[2]},
        shared_memory, std::nullopt, true, stream(s));
    *need(out, "out") = new mlx_vector_array_s{std::move(result)};
  });
}

}  // extern "C"
