#pragma once
// Plain parameter structs of the device operations (raft's *_types.hpp style). Every pointer says
// its memory space; "device" means memory from Device::allocate (under `emu`, host memory behind
// an address the host cannot dereference).

#include <cstdint>
#include <string>

#include "core/record_layout.hpp"
#include "core/row_math.hpp"
#include "core/table_spec.hpp"
#include "host/row_ref.hpp"

namespace strata::gpu {

/// Which implementation of the device layer.
enum class Backend {
  kEmu = 0,   ///< host memory with a capacity limit, one worker thread per stream
  kCuda = 1,  ///< the CUDA runtime and the kernels in gpu/cuda/
};
/// "emu" or "cuda".
const char* to_string(Backend b) noexcept;

/// A slot pool in device memory: `slots` records of `stride` words, [weights (dim elements of dtype) |
/// pad | state (state_dim elements of state_dtype) | pad] (core/record_layout.hpp). Slots of one
/// pool are shared by every table of that record shape. Slot numbers from
/// `slots` on, when the pool has an overflow region, address its records instead: slot s >= slots
/// is overflow record s - slots (the rows a `cached` pool serves outside its cache, for the
/// batches in flight that use them; every kernel that takes slot numbers follows this mapping).
struct SlotPool {
  float* base = nullptr;            ///< (slots, stride) device
  std::int64_t slots = 0;           ///< number of records
  std::int64_t stride = 0;          ///< words per record (record_words(shape()))
  std::int32_t dim = 0;             ///< weights per row
  std::int32_t state_dim = 0;       ///< optimizer state elements per row
  float* overflow = nullptr;        ///< (overflow_slots, stride) device, or nullptr: records of slots >= slots
  std::int64_t overflow_slots = 0;  ///< records of the overflow region
  DType dtype = DType::kF32;        ///< the weights' element type
  DType state_dtype = DType::kF32;  ///< the optimizer state's element type

  /// Bytes of one record.
  std::int64_t record_bytes() const noexcept { return stride * static_cast<std::int64_t>(sizeof(float)); }
  /// The shape of its records.
  RecordShape shape() const noexcept { return {dim, dtype, state_dim, state_dtype}; }
  /// Bytes of a record's weights and state, without padding (what a fill or write-back of a row moves).
  std::int64_t row_bytes() const noexcept {
    return (row_words(shape()) + state_words(shape())) * static_cast<std::int64_t>(sizeof(float));
  }
};

/// One table's lookups in one launch. `rows` are slot numbers (gather_pool on a SlotPool) or host
/// row ids (gather_pool_host on a pinned HostTable).
struct LookupFeature {
  const std::int64_t* offsets = nullptr;  ///< (batch + 1) device
  std::int64_t batch = 0;                 ///< number of bags
  const Key* rows = nullptr;              ///< (num_keys) device
  const float* weights = nullptr;         ///< (num_keys) device, or nullptr
  std::int64_t num_keys = 0;
  Pooling pooling = Pooling::kSum;  ///< kNone: out is (num_keys, dim), one row per lookup
  float* out = nullptr;             ///< (batch, dim) or (num_keys, dim) device, fully overwritten
  DType out_dtype = DType::kF32;    ///< out's element type: half ones are fp32 sums rounded to nearest once
};

/// One table's fused backward in one launch: for each unique slot, the sum of the gradients of its
/// uses (in ascending position order) goes through the optimizer step, in place in the pool.
struct UpdateFeature {
  const std::int64_t* offsets = nullptr;  ///< (batch + 1) device
  std::int64_t batch = 0;
  const float* weights = nullptr;  ///< (num_keys) device, or nullptr
  std::int64_t num_keys = 0;
  Pooling pooling = Pooling::kSum;
  const Key* unique_slots = nullptr;  ///< (num_unique) device, distinct slots
  /// (num_unique) device: the table row (shard-local) of each unique slot, which keys its
  /// stochastic rounding bits (Rounding::row_key); nullptr where nothing rounds stochastically.
  const Key* unique_rows = nullptr;
  const std::int64_t* unique_offsets = nullptr;  ///< (num_unique + 1) device, CSR into positions
  const std::int32_t* positions = nullptr;       ///< (num_keys) device, key positions grouped by slot, ascending
  const std::int32_t* bag_of = nullptr;          ///< (num_keys) device, bag of each position (unused for kNone)
  std::int64_t num_unique = 0;
  const float* grads = nullptr;  ///< (batch, dim) or (num_keys, dim) device, fp32 (half ones widened before)
  OptimizerStep step;            ///< the table's optimizer for this step
  /// (num_hot) device: every unique row used more than gpu/kernels' kHotUses times, or nullptr
  /// (then the device searches every unique row for them). With the list, a backward without hot
  /// rows launches no segment kernel at all, and the segment kernel searches the list alone.
  const std::int64_t* hot = nullptr;
  std::int64_t num_hot = 0;
};

/// n elements of dtype at data, for Device::count_nonfinite.
struct FloatRange {
  const float* data = nullptr;  ///< (n) device
  std::int64_t n = 0;
  DType dtype = DType::kF32;
};

/// How a device initializes the records of a table (Device::init_records): record i holds row
/// global_row(i) = row0 + i * row_stride of the whole table, columns col_offset.. of it.
struct RecordInit {
  std::uint64_t table_seed = 0;  ///< table_seed(init.seed, table_name_hash(name))
  float bound = 0.0f;            ///< InitSpec::bound
  std::int64_t row0 = 0;         ///< global row of the first record
  std::int64_t row_stride = 1;   ///< global rows between consecutive records
  std::int32_t col_offset = 0;   ///< InitSpec::col_offset
  OptimizerSpec optimizer;       ///< the state's initial value (init_state)
};

/// How table `spec` (a shard's spec: its initializer holds the shard's origin) initializes its
/// records: those of HostTable::reset.
inline RecordInit record_init(const TableSpec& spec) {
  RecordInit init;
  init.table_seed = table_seed(spec.init.seed, table_name_hash(spec.name));
  init.bound = spec.init.bound;
  init.row0 = spec.init.global_row(0);
  init.row_stride = spec.init.row_stride;
  init.col_offset = spec.init.col_offset;
  init.optimizer = spec.optimizer;
  return init;
}

/// What a device is.
struct DeviceInfo {
  Backend backend = Backend::kEmu;
  std::string name;          ///< "emu" or the CUDA device name
  int ordinal = 0;           ///< CUDA ordinal (0 for emu)
  std::size_t capacity = 0;  ///< bytes Device::allocate may hand out in total
  int numa_node = -1;        ///< node the device hangs off (-1: unknown)
  std::string pci_bus_id;    ///< CUDA's "0000:3B:00.0" ("" for emu), to find the GPU in hwloc's topology
};

}  // namespace strata::gpu
