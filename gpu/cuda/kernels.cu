// The `cuda` backend's kernels: grids over the shared kernel bodies of gpu/kernels/bodies.hpp (the
// same source the `emu` backend runs on the CPU grid). Blocks of kBlock threads, a warp per work
// item, grids as large as the GPU holds at once (KernelGrids, from the occupancy of each kernel at
// device creation) and looping over the items; the hot rows of a backward or gradient reduction
// get a kernel before it that sums each of their segments in a warp of its own (hot_segment_kernel).
//
// Register budgets: __launch_bounds__(kBlock) alone let ptxas cap gather_kernel<true> and
// update_kernel at 64 registers, where they spilled 24-52 bytes a thread (nvcc 13.0, sm_80 and
// sm_90); they ask for 3 resident blocks instead (up to 85 registers, and no spill on sm_90), as
// does reduce_kernel (it spilled 24 bytes under the 64-register cap once it read hot rows'
// partials). gpu/cuda/kernel_resources_sm90.txt holds every kernel's registers, spills and shared
// memory (the counts are there, not here), and the test gpu_kernel_resources_sm90 compares each
// compile with it.
//
// Half-size rows (bf16/fp16 rows, bf16 state) have kernels of their own in kernels_half.cu (a second
// translation unit, compiled beside this one: see there).

#include <cstdint>
#include <utility>

#include "gpu/cuda/kernel_grid.cuh"
#include "gpu/cuda/kernels.cuh"
#include "gpu/kernels/bodies.hpp"

namespace strata::gpu::cuda_detail {
namespace {

using namespace kernels;

template <bool kInterleaved>
__global__ void __launch_bounds__(kBlock, kHeavyMinBlocks) gather_kernel(const GatherArgs a) {
  const DeviceWarp w = this_warp();
  const std::int64_t total = a.begin[a.count];
  for (std::int64_t item = first_item(); item < total; item += item_step())
    gather_item<kInterleaved, false, float>(w, a, item);
}

// The gather and update kernels of a slot pool with an overflow region (rows a `cached`
// pool serves outside its cache): the same bodies with the overflow mapping of slot numbers, apart
// so that the kernels of every other launch keep their registers.
__global__ void __launch_bounds__(kBlock, kHeavyMinBlocks) gather_overflow_kernel(const GatherArgs a) {
  const DeviceWarp w = this_warp();
  const std::int64_t total = a.begin[a.count];
  for (std::int64_t item = first_item(); item < total; item += item_step()) gather_item<false, true, float>(w, a, item);
}

template <bool kOverflow>
__device__ __forceinline__ void update_items(const UpdateArgs& a) {
  const DeviceWarp w = this_warp();
  const std::int64_t total = a.begin[a.count];
  for (std::int64_t item = first_item(); item < total; item += item_step())
    update_item<kOverflow, float, float>(w, a, item);
}
__global__ void __launch_bounds__(kBlock, kHeavyMinBlocks) update_kernel(const UpdateArgs a) { update_items<false>(a); }
__global__ void __launch_bounds__(kBlock, kHeavyMinBlocks) update_overflow_kernel(const UpdateArgs a) {
  update_items<true>(a);
}
// The hot rows' segments of a backward or gradient reduction (UpdateArgs::partials), before its
// update or reduce kernel on the same stream.
__global__ void __launch_bounds__(kBlock) hot_segment_kernel(const UpdateArgs a) {
  const DeviceWarp w = this_warp();
  const std::int64_t total = a.segment_items();
  for (std::int64_t item = first_item(); item < total; item += item_step()) hot_segment_item(w, a, item);
}

__global__ void __launch_bounds__(kBlock, kHeavyMinBlocks) reduce_kernel(const UpdateArgs a) {
  const DeviceWarp w = this_warp();
  const std::int64_t total = a.begin[a.count];
  for (std::int64_t item = first_item(); item < total; item += item_step()) reduce_item(w, a, item);
}

template <bool kUnpack>
__global__ void __launch_bounds__(kBlock) records_kernel(const RecordArgs a) {
  const DeviceWarp w = this_warp();
  for (std::int64_t i = first_item(); i < a.n; i += item_step()) {
    if (kUnpack) {
      unpack_record(w, a, i);
    } else {
      pack_record(w, a, i);
    }
  }
}

template <bool kToHost>
__global__ void __launch_bounds__(kBlock) host_records_kernel(const HostRecordArgs a) {
  const DeviceWarp w = this_warp();
  for (std::int64_t i = first_item(); i < a.n; i += item_step()) move_host_record(w, a, i, kToHost);
}

__global__ void __launch_bounds__(kBlock) init_kernel(const InitArgs a) {
  const DeviceWarp w = this_warp();
  for (std::int64_t i = first_item(); i < a.n; i += item_step()) init_record(w, a, i);
}

__global__ void __launch_bounds__(kBlock) nonfinite_chunk_kernel(const FiniteArgs a) {
  const DeviceWarp w = this_warp();
  const std::int64_t total = a.begin[a.count];
  for (std::int64_t item = first_item(); item < total; item += item_step()) count_nonfinite_chunk(w, a, item);
}

// A warp per feature (after nonfinite_chunk_kernel, on the same stream).
__global__ void __launch_bounds__(kBlock) nonfinite_sum_kernel(const FiniteArgs a) {
  const DeviceWarp w = this_warp();
  for (std::int64_t f = first_item(); f < a.count; f += item_step()) sum_nonfinite(w, a, static_cast<int>(f));
}

struct KernelEntry {
  Kernel kernel;
  const void* function;
  int block;
};

// Every kernel with its block size, in the order of Kernel.
const KernelEntry kKernels[] = {
    {Kernel::kGather, reinterpret_cast<const void*>(&gather_kernel<false>), kBlock},
    {Kernel::kGatherInterleaved, reinterpret_cast<const void*>(&gather_kernel<true>), kBlock},
    {Kernel::kUpdate, reinterpret_cast<const void*>(&update_kernel), kBlock},
    {Kernel::kHotSegments, reinterpret_cast<const void*>(&hot_segment_kernel), kBlock},
    {Kernel::kReduce, reinterpret_cast<const void*>(&reduce_kernel), kBlock},
    {Kernel::kPack, reinterpret_cast<const void*>(&records_kernel<false>), kBlock},
    {Kernel::kUnpack, reinterpret_cast<const void*>(&records_kernel<true>), kBlock},
    {Kernel::kFromHost, reinterpret_cast<const void*>(&host_records_kernel<false>), kBlock},
    {Kernel::kToHost, reinterpret_cast<const void*>(&host_records_kernel<true>), kBlock},
    {Kernel::kInit, reinterpret_cast<const void*>(&init_kernel), kBlock},
    {Kernel::kNonfiniteChunk, reinterpret_cast<const void*>(&nonfinite_chunk_kernel), kBlock},
    {Kernel::kNonfiniteSum, reinterpret_cast<const void*>(&nonfinite_sum_kernel), kBlock},
    {Kernel::kGatherOverflow, reinterpret_cast<const void*>(&gather_overflow_kernel), kBlock},
    {Kernel::kUpdateOverflow, reinterpret_cast<const void*>(&update_overflow_kernel), kBlock},
};
static_assert(sizeof(kKernels) / sizeof(kKernels[0]) == kKernelCount, "one entry per Kernel");

}  // namespace

const char* kernel_name(Kernel k) {
  static const char* const names[] = {"gather_kernel<false>",
                                      "gather_kernel<true>",
                                      "update_kernel",
                                      "hot_segment_kernel",
                                      "reduce_kernel",
                                      "records_kernel<false>",
                                      "records_kernel<true>",
                                      "host_records_kernel<false>",
                                      "host_records_kernel<true>",
                                      "init_kernel",
                                      "nonfinite_chunk_kernel",
                                      "nonfinite_sum_kernel",
                                      "gather_overflow_kernel",
                                      "update_overflow_kernel"};
  static_assert(sizeof(names) / sizeof(names[0]) == kKernelCount, "one name per Kernel");
  return names[static_cast<int>(k)];
}

int kernel_block(Kernel k) { return kKernels[static_cast<int>(k)].block; }

cudaError_t query_kernel_grids(int sm_count, KernelGrids* grids) {
  *grids = KernelGrids{};
  grids->sm_count = sm_count;
  for (const KernelEntry& e : kKernels) {
    int blocks = 0;
    const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, e.function, e.block, 0);
    if (err != cudaSuccess) return err;
    grids->blocks_per_sm[static_cast<int>(e.kernel)] = blocks;
  }
  return cudaSuccess;
}

cudaError_t launch_gather(const GatherArgs& args, cudaStream_t stream, const KernelGrids& grids) {
  const std::int64_t items = args.begin[args.count];
  if (items <= 0) return cudaSuccess;
  if (args.source.dtype != DType::kF32) return launch_gather_half(args, stream, grids);
  if (args.source.parts == 1 && args.source.overflow)
    return launch(gather_overflow_kernel, warp_grid(items, grids, Kernel::kGatherOverflow), kBlock, stream, args);
  if (args.source.parts == 1)
    return launch(gather_kernel<false>, warp_grid(items, grids, Kernel::kGather), kBlock, stream, args);
  return launch(gather_kernel<true>, warp_grid(items, grids, Kernel::kGatherInterleaved), kBlock, stream, args);
}

namespace {
// The hot rows' segments of `args`, when it has scratch for them (else nothing to launch).
cudaError_t launch_segments(const UpdateArgs& args, cudaStream_t stream, const KernelGrids& grids) {
  const std::int64_t items = args.segment_items();
  if (items <= 0) return cudaSuccess;
  return launch(hot_segment_kernel, warp_grid(items, grids, Kernel::kHotSegments), kBlock, stream, args);
}
}  // namespace

cudaError_t launch_update(const UpdateArgs& args, cudaStream_t stream, const KernelGrids& grids) {
  const std::int64_t items = args.begin[args.count];
  if (items <= 0) return cudaSuccess;
  if (cudaError_t e = launch_segments(args, stream, grids); e != cudaSuccess) return e;
  const bool overflow = args.overflow != nullptr;
  const Kernel k = overflow ? Kernel::kUpdateOverflow : Kernel::kUpdate;
  if (args.dtype != DType::kF32 || args.state_dtype != DType::kF32) return launch_update_half(args, stream, grids);
  return launch(overflow ? update_overflow_kernel : update_kernel, warp_grid(items, grids, k), kBlock, stream, args);
}

cudaError_t launch_reduce(const UpdateArgs& args, cudaStream_t stream, const KernelGrids& grids) {
  const std::int64_t items = args.begin[args.count];
  if (items <= 0) return cudaSuccess;
  if (cudaError_t e = launch_segments(args, stream, grids); e != cudaSuccess) return e;
  return launch(reduce_kernel, warp_grid(items, grids, Kernel::kReduce), kBlock, stream, args);
}

cudaError_t launch_records(const RecordArgs& args, bool unpack, cudaStream_t stream, const KernelGrids& grids) {
  if (args.n <= 0 || args.stride <= 0) return cudaSuccess;
  if (unpack) return launch(records_kernel<true>, warp_grid(args.n, grids, Kernel::kUnpack), kBlock, stream, args);
  return launch(records_kernel<false>, warp_grid(args.n, grids, Kernel::kPack), kBlock, stream, args);
}

cudaError_t launch_host_records(const HostRecordArgs& args, bool to_host, cudaStream_t stream,
                                const KernelGrids& grids) {
  if (args.n <= 0) return cudaSuccess;
  if (to_host)
    return launch(host_records_kernel<true>, warp_grid(args.n, grids, Kernel::kToHost), kBlock, stream, args);
  return launch(host_records_kernel<false>, warp_grid(args.n, grids, Kernel::kFromHost), kBlock, stream, args);
}

cudaError_t launch_init(const InitArgs& args, cudaStream_t stream, const KernelGrids& grids) {
  if (args.n <= 0) return cudaSuccess;
  return launch(init_kernel, warp_grid(args.n, grids, Kernel::kInit), kBlock, stream, args);
}

cudaError_t launch_nonfinite(const FiniteArgs& args, cudaStream_t stream, const KernelGrids& grids) {
  if (args.count <= 0) return cudaSuccess;
  const std::int64_t chunks = args.begin[args.count];
  if (chunks > 0) {
    if (cudaError_t e =
            launch(nonfinite_chunk_kernel, warp_grid(chunks, grids, Kernel::kNonfiniteChunk), kBlock, stream, args);
        e != cudaSuccess)
      return e;
  }
  return launch(nonfinite_sum_kernel, warp_grid(args.count, grids, Kernel::kNonfiniteSum), kBlock, stream, args);
}

}  // namespace strata::gpu::cuda_detail
