#pragma once
// KeyBatch: one training batch of several features, jagged per feature, in the shape of TorchRec's
// KeyedJaggedTensor (per feature an offsets array of length batch+1, keys, optional weights).

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "core/table_spec.hpp"

namespace strata {

/// The keys of one feature for one batch. Bag b holds keys[offsets[b] .. offsets[b+1]). Keys and offsets are int64, or
/// int32 in keys32 and offsets32 (read as they are, never widened into a copy): a feature gives one of each pair.
struct JaggedKeys {
  std::string table;                  ///< the feature's name (a table's own name unless it lists features)
  std::vector<std::int64_t> offsets;  ///< (batch + 1), offsets[0] == 0, non-decreasing, back() == num_keys()
  std::vector<Key> keys;              ///< (num_keys) row ids in [0, rows)
  std::vector<float> weights;         ///< empty, or (num_keys) per-key weights multiplied into the pooled sum
  std::vector<std::int32_t> offsets32{}, keys32{};  ///< int32 offsets, keys (instead of offsets, keys)

  std::int64_t batch_size() const noexcept { return std::max<std::int64_t>(0, size_of(offsets, offsets32) - 1); }
  std::int64_t num_keys() const noexcept { return size_of(keys, keys32); }
  Key key(std::int64_t j) const { return keys32.empty() ? keys.data()[j] : keys32.data()[j]; }
  std::int64_t offset(std::int64_t b) const { return offsets32.empty() ? offsets.data()[b] : offsets32.data()[b]; }
  template <class W, class N>
  static std::int64_t size_of(const W& w, const N& n) noexcept {
    return static_cast<std::int64_t>(n.empty() ? w.size() : n.size());
  }
};

/// One batch: every feature's keys for the same `batch_size` samples. A feature may appear at most once.
struct KeyBatch {
  std::vector<JaggedKeys> features;  ///< one entry per feature used by this batch
  /// false: an evaluation batch (forward, then discard): backward refuses it, and dynamic tables admit nothing for it.
  bool train = true;

  /// Batch size (bags per feature); 0 when there are no features.
  std::int64_t batch_size() const noexcept { return features.empty() ? 0 : features.front().batch_size(); }
  /// Total keys over all features.
  std::int64_t total_keys() const noexcept;
};

/// Checks the shape of one feature against its table: offsets of length batch+1 starting at 0, non-decreasing, ending
/// at the key count; keys in [0, rows); weights empty or one per key. The message names the table, the offending value
/// and what was expected. `any_key`: every int64 key is valid (a dynamic table's).
Status validate(const JaggedKeys& f, const TableSpec& spec, std::int64_t expected_batch, bool any_key = false);

/// Where the memory of a view lives. kDevice: memory of the store's device (Store::device(); on `emu` a
/// Device::allocate block, on `cuda` device memory of that GPU), which the host must not dereference. Keys (KeyBatch)
/// are always host memory: the planner reads them on the CPU.
enum class MemorySpace { kHost, kDevice };

/// Row-major matrix view. Non-owning. `space` says where `data` lives and `dtype` what it holds (a host fp32 view
/// unless set, so `{ptr, rows, cols}` stays one; `data`: the first element).
struct MatrixView {
  float* data = nullptr;  ///< (rows, cols), row-major
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  MemorySpace space = MemorySpace::kHost;
  DType dtype = DType::kF32;
};
/// Read-only counterpart of MatrixView.
struct ConstMatrixView {
  const float* data = nullptr;  ///< (rows, cols), row-major
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  MemorySpace space = MemorySpace::kHost;
  DType dtype = DType::kF32;
};
/// "host" or "device".
inline const char* to_string(MemorySpace s) noexcept { return s == MemorySpace::kDevice ? "device" : "host"; }

/// Rows of a feature's forward output (and backward gradient): batch when pooled, num_keys for pooling none.
inline std::int64_t output_rows(const JaggedKeys& f, Pooling p) noexcept {
  return p == Pooling::kNone ? f.num_keys() : f.batch_size();
}

}  // namespace strata
