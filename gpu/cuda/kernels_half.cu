// The `cuda` backend's kernels of half-size rows (bf16 or fp16 rows, a bf16 optimizer state): the
// gather and update bodies of gpu/kernels/bodies.hpp with the element types as template parameters,
// in a translation unit of their own, so that they compile beside kernels.cu (every instance is
// compiled for each architecture; together they take about as long as kernels.cu) and the fp32
// kernels there stay the code they were. Each half type has one gather instance and one update
// instance, which take any source or pool (the overflow and interleaved mappings chosen at run
// time), and the bf16-state instances leave out row-wise adagrad (validate refuses that pair): 2
// gather and 5 update instances (with_half_elem, with_half_elems). They run on the grids of the
// fp32 kernels they stand for (an instance with fewer resident blocks queues the rest).

#include <cstdint>

#include "gpu/cuda/kernel_grid.cuh"
#include "gpu/cuda/kernels.cuh"
#include "gpu/kernels/bodies.hpp"

namespace strata::gpu::cuda_detail {
namespace {

using namespace kernels;

// Rows of any source (one part with or without an overflow region, or interleaved parts).
template <class Elem>
__global__ void __launch_bounds__(kBlock, kHeavyMinBlocks) gather_half_kernel(const GatherArgs a) {
  for_warp_items(a.begin[a.count],
                 [&](const DeviceWarp& w, std::int64_t item) { gather_item<true, true, Elem>(w, a, item); });
}

// A pool with or without an overflow region (kNoOverflow maps every slot into the pool).
template <class Elem, class SElem>
__global__ void __launch_bounds__(kBlock, kHeavyMinBlocks) update_half_kernel(const UpdateArgs a) {
  for_warp_items(a.begin[a.count],
                 [&](const DeviceWarp& w, std::int64_t item) { update_item<true, Elem, SElem>(w, a, item); });
}

}  // namespace

cudaError_t launch_gather_half(const GatherArgs& args, cudaStream_t stream, const KernelGrids& grids) {
  const std::int64_t items = args.begin[args.count];
  const Kernel k = args.source.parts > 1  ? Kernel::kGatherInterleaved
                   : args.source.overflow ? Kernel::kGatherOverflow
                                          : Kernel::kGather;
  cudaError_t e = cudaSuccess;
  with_half_elem(args.source.dtype, [&](auto row) {
    e = launch(gather_half_kernel<decltype(row)>, warp_grid(items, grids, k), kBlock, stream, args);
  });
  return e;
}

cudaError_t launch_update_half(const UpdateArgs& args, cudaStream_t stream, const KernelGrids& grids) {
  const std::int64_t items = args.begin[args.count];
  const Kernel k = args.overflow ? Kernel::kUpdateOverflow : Kernel::kUpdate;
  cudaError_t e = cudaSuccess;
  with_half_elems(args.dtype, args.state_dtype, [&](auto row, auto state) {
    e = launch(update_half_kernel<decltype(row), decltype(state)>, warp_grid(items, grids, k), kBlock, stream, args);
  });
  return e;
}

}  // namespace strata::gpu::cuda_detail
