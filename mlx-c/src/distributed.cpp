// Distributed groups and the collectives over them (MLX's ring, MPI, NCCL
// or JACCL backend, chosen and configured as MLX's launcher sets it up).
#include "internal.h"
#include "mlx/distributed/distributed.h"
#include "mlx/distributed/ops.h"

namespace dist = mlx::core::distributed;

struct mlx_distributed_group_s {
  dist::Group g;
};

using mlxc::arr;
using mlxc::guard;
using mlxc::need;
using mlxc::put;

namespace {

const dist::Group& group(mlx_distributed_group g) {
  return need(g, "group")->g;
}

}  // namespace

extern "C" {

int mlx_distributed_init(mlx_distributed_group* out, bool strict,
                         const char* backend) {
  return guard([&] {
    need(out, "out");
    auto g = dist::init(strict, need(backend, "backend"));
    *out = new mlx_distributed_group_s{std::move(g)};
  });
}

void mlx_distributed_group_free(mlx_distributed_group g) { delete g; }

int mlx_distributed_group_rank(int* out, mlx_distributed_group g) {
  return guard([&] { *need(out, "out") = group(g).rank(); });
}

int mlx_distributed_group_size(int* out, mlx_distributed_group g) {
  return guard([&] { *need(out, "out") = group(g).size(); });
}

int mlx_distributed_all_sum(mlx_array* out, mlx_array x,
                            mlx_distributed_group g, mlx_stream s) {
  return guard([&] {
    put(out, dist::all_sum(arr(x, "x"), group(g), mlxc::stream(s)));
  });
}

int mlx_distributed_all_gather(mlx_array* out, mlx_array x,
                               mlx_distributed_group g, mlx_stream s) {
  return guard([&] {
    put(out, dist::all_gather(arr(x, "x"), group(g), mlxc::stream(s)));
  });
}

}  // extern "C"
