// Custom CUDA kernels (MLX's fast::cuda_kernel) behind the C API.
#include "internal.h"

using namespace mlxc;

struct mlx_cuda_kernel_s {
  mx::fast::CustomKernelFunction f;
};

namespace {

std::vector<std::string> names(const char* const* list, size_t n,
                               const char* what) {
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) {
    out.emplace_back(need(need(list, what)[i], what));
  }
  return out;
}

}  // namespace

extern "C" {

int mlx_cuda_kernel_new(mlx_cuda_kernel* out, const char* name,
                        const char* const* input_names, size_t n_inputs,
                        const char* const* output_names, size_t n_outputs,
                        const char* source, const char* header,
                        bool ensure_row_contiguous, int shared_memory) {
  return guard([&] {
    auto f = mx::fast::cuda_kernel(
        need(name, "name"), names(input_names, n_inputs, "input_names"),
        names(output_names, n_outputs, "output_names"), need(source, "source"),
        header == nullptr ? "" : header, ensure_row_contiguous, shared_memory);
    *need(out, "out") = new mlx_cuda_kernel_s{std::move(f)};
  });
}

void mlx_cuda_kernel_free(mlx_cuda_kernel k) { delete k; }

int mlx_cuda_kernel_apply(mlx_vector_array* out, mlx_cuda_kernel k,
                          const mlx_array* inputs, size_t n_inputs,
                          const int* output_shapes, const size_t* output_ndims,
                          const mlx_dtype* output_dtypes, size_t n_outputs,
                          const int* grid, const int* block,
                          const char* const* template_names,
                          const int* template_values,
                          const mlx_template_kind* template_kinds,
                          size_t n_templates, mlx_stream s) {
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
    std::vector<std::pair<std::string, mx::fast::TemplateArg>> templates;
    for (size_t i = 0; i < n_templates; ++i) {
      std::string name = need(need(template_names, "template_names")[i],
                              "template_names");
      int value = need(template_values, "template_values")[i];
      switch (need(template_kinds, "template_kinds")[i]) {
        case MLX_TEMPLATE_INT:
          templates.emplace_back(name, value);
          break;
        case MLX_TEMPLATE_BOOL:
          templates.emplace_back(name, value != 0);
          break;
        case MLX_TEMPLATE_DTYPE:
          templates.emplace_back(name, dtype(static_cast<mlx_dtype>(value)));
          break;
        default:
          throw std::invalid_argument("unknown template argument kind");
      }
    }
    need(grid, "grid");
    need(block, "block");
    auto result = need(k, "k")->f(
        arrays(inputs, n_inputs), shapes, dtypes,
        {grid[0], grid[1], grid[2]}, {block[0], block[1], block[2]}, templates,
        std::nullopt, false, stream(s));
    *need(out, "out") = new mlx_vector_array_s{std::move(result)};
  });
}

}  // extern "C"
