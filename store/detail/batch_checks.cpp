#include "store/detail/batch_checks.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <sstream>

#include <tbb/blocked_range.h>
#include <tbb/parallel_reduce.h>

#include "core/half.hpp"
#include "core/simd.hpp"

namespace strata::detail {

TableIndex make_table_index(const StoreConfig& config) {
  TableIndex index;
  for (std::size_t i = 0; i < config.tables.size(); ++i) index.emplace(config.tables[i].spec.name, static_cast<int>(i));
  return index;
}

Result<std::vector<int>> check_batch(std::int64_t batch_id, const KeyBatch& batch, const StoreConfig& config,
                                     const TableIndex& index) {
  return check_batch("batch " + std::to_string(batch_id), batch, config, index);
}

Result<std::vector<int>> check_batch(const std::string& who, const KeyBatch& batch, const StoreConfig& config,
                                     const TableIndex& index) {
  std::vector<int> tables;
  tables.reserve(batch.features.size());
  std::vector<bool> seen(config.tables.size(), false);
  const std::int64_t batch_size = batch.batch_size();
  for (const JaggedKeys& f : batch.features) {
    auto it = index.find(f.table);
    if (it == index.end())
      return Status::not_found(who + ": unknown feature '" + f.table +
                               "' (expected a table's name, or one of its features for a table that lists them)");
    if (seen[static_cast<std::size_t>(it->second)])
      return Status::invalid_argument(who + ": feature '" + f.table + "' appears twice (expected at most once)");
    seen[static_cast<std::size_t>(it->second)] = true;
    const TableConfig& tc = config.tables[static_cast<std::size_t>(it->second)];
    Status s = validate(f, tc.spec, batch_size, tc.dynamic.has_value());
    if (!s.is_ok()) return s.with_context(who);
    if (f.num_keys() >= (std::int64_t{1} << 31))
      return Status::invalid_argument(who + ", table '" + f.table + "': " + std::to_string(f.num_keys()) +
                                      " keys (expected fewer than 2^31 per table per batch)");
    tables.push_back(it->second);
  }
  return tables;
}

bool PreviewIds::submitted(std::int64_t id) {
  const auto it = std::find(ids_.begin(), ids_.end(), id);
  if (it == ids_.end()) return false;
  ids_.erase(ids_.begin(), it + 1);
  return true;
}

Result<std::vector<int>> check_preview(std::int64_t batch_id, const KeyBatch& batch, const StoreConfig& config,
                                       const TableIndex& index, const PreviewIds& previews, bool in_flight) {
  const std::string who = "preview of batch " + std::to_string(batch_id);
  const int horizon = config.cache.preview;
  if (horizon == 0)
    return Status::failed_precondition(
        who + ": previews are off (cache.preview = 0; expected cache.preview > 0 to allow them)");
  if (previews.size() >= horizon)
    return Status::failed_precondition(
        who + ": " + std::to_string(previews.size()) +
        " batches are previewed and not yet submitted, and cache.preview = " + std::to_string(horizon) +
        " allows no more (submit the oldest first, or drop_previews())");
  if (in_flight)
    return Status::already_exists(who + ": the batch is already in flight (expected a batch not yet submitted)");
  if (previews.size() > 0 && batch_id <= previews.ids().back())
    return Status::invalid_argument(who + ": batch ids of previews must increase (expected an id above " +
                                    std::to_string(previews.ids().back()) +
                                    ", the last batch previewed and not yet submitted)");
  return check_batch(who, batch, config, index);
}

namespace {
// Whether a row of n floats holds a NaN or an Inf: all exponent bits set. Integer ops on whole
// registers (simd::U32s), then the tail one float at a time. The plain loop over n floats stayed
// scalar: GCC 12 at -O2 (the default preset's RelWithDebInfo) does not vectorize a loop of unknown
// trip count, and that loop took more cycles than the whole table-batched update on the default
// strata-bench workload (perf: 7.0% of the run against 4.7%, reading the step's 54.5 MB of gradients
// at 4-6 instructions a float).
bool has_nonfinite(const float* row, std::int64_t n) {
  constexpr std::uint32_t kExponent = 0x7f800000u;
  simd::I32s any_lane{};  // the comparisons' lane masks, or-ed
  std::int64_t j = 0;
  for (; j + simd::kFloats <= n; j += simd::kFloats) {
    simd::U32s bits;
    std::memcpy(&bits, row + j, sizeof bits);
    any_lane |= (bits & kExponent) == kExponent;
  }
  std::uint32_t any = 0;
  for (int l = 0; l < simd::kFloats; ++l) any |= static_cast<std::uint32_t>(any_lane[l]);
  for (; j < n; ++j) {
    std::uint32_t bits;
    std::memcpy(&bits, row + j, sizeof bits);
    any |= static_cast<std::uint32_t>((bits & kExponent) == kExponent);
  }
  return any != 0;
}

// has_nonfinite over n elements of `dtype` at p: a half-size element is NaN or Inf when all its
// exponent bits are set (bf16: 8 bits, fp16: 5).
bool has_nonfinite(const void* p, std::int64_t n, DType dtype) {
  if (dtype == DType::kF32) return has_nonfinite(static_cast<const float*>(p), n);
  const std::uint16_t exponent = dtype == DType::kBF16 ? 0x7f80u : 0x7c00u;
  const auto* bytes = static_cast<const unsigned char*>(p);
  for (std::int64_t j = 0; j < n; ++j) {
    std::uint16_t bits;
    std::memcpy(&bits, bytes + 2 * j, sizeof bits);
    if ((bits & exponent) == exponent) return true;
  }
  return false;
}

// Element j of a view's row as fp32 (widened from a half-size element).
float element(const void* row, std::int64_t j, DType dtype) {
  const auto* bytes = static_cast<const unsigned char*>(row);
  if (dtype == DType::kF32) {
    float v;
    std::memcpy(&v, bytes + 4 * j, sizeof v);
    return v;
  }
  std::uint16_t bits;
  std::memcpy(&bits, bytes + 2 * j, sizeof bits);
  return widen(dtype, bits);
}

// The address of row r of view g (its elements of g.dtype).
const void* view_row(const ConstMatrixView& g, std::int64_t r) {
  return reinterpret_cast<const unsigned char*>(g.data) + r * g.cols * element_bytes(g.dtype);
}

// Whether any of the host gradients `grads` holds a non-finite value: has_nonfinite over chunks of
// 64 KiB of all of them in one parallel loop on the calling arena's threads (the gradients of a
// step are tens of MB, 54.5 MB on the default strata-bench workload, which one thread reads in
// several milliseconds; one loop for all the tables, not a loop and its join per table, as the
// table-batched kernels: 26 one-hot Criteo tables have 512 KiB each).
bool any_nonfinite(const std::vector<ConstMatrixView>& grads) {
  constexpr std::int64_t kChunk = 16384;
  struct Chunk {
    const void* p;
    std::int64_t n;
    DType dtype;
  };
  std::vector<Chunk> chunks;
  for (const ConstMatrixView& g : grads) {
    if (g.space == MemorySpace::kDevice) continue;  // counted on the device by the store
    const std::int64_t n = g.rows * g.cols;
    const auto* bytes = reinterpret_cast<const unsigned char*>(g.data);
    for (std::int64_t at = 0; at < n; at += kChunk)
      chunks.push_back({bytes + at * element_bytes(g.dtype), std::min(kChunk, n - at), g.dtype});
  }
  if (chunks.size() <= 1) return !chunks.empty() && has_nonfinite(chunks[0].p, chunks[0].n, chunks[0].dtype);
  return tbb::parallel_reduce(
      tbb::blocked_range<std::size_t>(0, chunks.size(), 1), false,
      [&chunks](const tbb::blocked_range<std::size_t>& r, bool found) {
        for (std::size_t c = r.begin(); c < r.end() && !found; ++c)
          found = has_nonfinite(chunks[c].p, chunks[c].n, chunks[c].dtype);
        return found;
      },
      std::logical_or<>());
}
}  // namespace

Status check_finite_gradients(std::int64_t batch_id, const KeyBatch& batch, const std::vector<int>& tables,
                              const StoreConfig& config, const std::vector<ConstMatrixView>& grads) {
  if (config.accept_nonfinite_gradients) return Status::ok();
  if (!any_nonfinite(grads)) return Status::ok();  // the usual case; else find the first
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const ConstMatrixView& g = grads[i];
    if (g.space == MemorySpace::kDevice || !has_nonfinite(g.data, g.rows * g.cols, g.dtype)) continue;
    return nonfinite_gradient(batch_id, batch, tables, config, i, g);
  }
  return Status::ok();
}

Status nonfinite_gradient(std::int64_t batch_id, const KeyBatch& batch, const std::vector<int>& tables,
                          const StoreConfig& config, std::size_t i, const ConstMatrixView& g) {
  for (std::int64_t r = 0; r < g.rows; ++r) {
    const void* row = view_row(g, r);
    if (!has_nonfinite(row, g.cols, g.dtype)) continue;
    std::int64_t col = 0;
    while (std::isfinite(element(row, col, g.dtype))) ++col;
    const TableSpec& spec = config.tables[static_cast<std::size_t>(tables[i])].spec;
    const JaggedKeys& f = batch.features[i];
    std::string where;
    if (spec.pooling == Pooling::kNone) {
      std::int64_t bag = 0;  // the last bag that starts at or before r
      while (bag + 1 < f.batch_size() && f.offset(bag + 1) <= r) ++bag;
      where = "key position " + std::to_string(r) + " (bag " + std::to_string(bag) + ")";
    } else {
      where = "bag " + std::to_string(r);
    }
    std::ostringstream value;
    value << element(row, col, g.dtype);
    return Status::invalid_argument("batch " + std::to_string(batch_id) + ", table '" + spec.name + "': gradient of " +
                                    where + ", column " + std::to_string(col) + " is " + value.str() +
                                    " (expected finite values; set accept_nonfinite_gradients to let them through)");
  }
  return Status::ok();
}

Status check_space(std::int64_t batch_id, const TableSpec& spec, const char* what, std::size_t index, MemorySpace space,
                   const void* data, std::int64_t elements, const gpu::Device* device,
                   const MemorySpace* forward_space) {
  const std::string who =
      "batch " + std::to_string(batch_id) + ", table '" + spec.name + "': " + what + " view " + std::to_string(index);
  if (forward_space && space != *forward_space)
    return Status::invalid_argument(who + " is " + to_string(space) + " memory, but forward's output was " +
                                    to_string(*forward_space) + " memory (expected the gradients in the space of " +
                                    "the outputs)");
  if (space == MemorySpace::kHost) return Status::ok();
  if (!device)
    return Status::invalid_argument(who + " is device memory, but this store has no device (expected a host view; " +
                                    "a store has a device when it has a gpu, cached, offload or hybrid table)");
  // `elements` of the table's output_dtype (the view's, checked before).
  const Status range =
      device->check_device_range(data, static_cast<std::size_t>(elements * element_bytes(spec.output_dtype)));
  if (!range.is_ok()) return Status::invalid_argument(who + " (device memory): " + range.message());
  return Status::ok();
}

Status check_stream(const char* op, std::int64_t batch_id, const gpu::Device* device, gpu::StreamView stream) {
  const std::string who = std::string(op) + " of batch " + std::to_string(batch_id);
  if (!device)
    return Status::invalid_argument(who + ": this store has no device, so it takes no stream (expected the call " +
                                    "without a stream)");
  if (!stream.state())
    return Status::invalid_argument(who + ": the stream is null (expected a stream of the store's device, " +
                                    device->info().name + ": Store::device()->create_stream())");
  if (!device->owns(stream))
    return Status::invalid_argument(who + ": the stream belongs to another device (expected a stream of the " +
                                    "store's device, " + device->info().name + ")");
  return Status::ok();
}

Status unknown_batch(std::int64_t batch_id) {
  return Status::not_found("batch " + std::to_string(batch_id) + " was not submitted (or is already retired)");
}
Status duplicate_batch(std::int64_t batch_id) {
  return Status::already_exists("batch " + std::to_string(batch_id) +
                                " is already in flight (expected a new batch id)");
}
Status backward_before_forward(std::int64_t batch_id) {
  return Status::failed_precondition("batch " + std::to_string(batch_id) +
                                     ": backward before forward (expected forward first)");
}
Status busy(const char* operation, std::int64_t in_flight) {
  return Status::failed_precondition(std::string(operation) + " with " + std::to_string(in_flight) +
                                     " batch(es) in flight (expected none: finish or discard them first)");
}

Status dense_only(const char* op, int table, const StoreConfig& config) {
  if (table < 0 || static_cast<std::size_t>(table) >= config.tables.size()) return Status::ok();
  const TableConfig& tc = config.tables[static_cast<std::size_t>(table)];
  if (!tc.dynamic) return Status::ok();
  return Status::invalid_argument("table '" + tc.spec.name + "': " + op +
                                  " of a dynamic table (expected a dense table; a dynamic table's rows are read by "
                                  "key: keys_held, read_keys)");
}

Status dynamic_only(const char* op, int table, const StoreConfig& config) {
  STRATA_RETURN_IF_ERROR(check_table(table, config).with_context(op));
  const TableConfig& tc = config.tables[static_cast<std::size_t>(table)];
  if (tc.dynamic) return Status::ok();
  return Status::invalid_argument("table '" + tc.spec.name + "': " + op +
                                  " of a dense table (expected a dynamic table)");
}

Status key_without_row(const TableSpec& spec, Key key, std::size_t position, int owner, int me) {
  if (owner != me)
    return Status::not_found("table '" + spec.name + "': key " + std::to_string(key) + " at position " +
                             std::to_string(position) + " belongs to rank " + std::to_string(owner) +
                             "'s shard, not rank " + std::to_string(me) +
                             "'s (expected keys that this rank's keys_held lists)");
  return Status::not_found("table '" + spec.name + "': key " + std::to_string(key) + " at position " +
                           std::to_string(position) + " has no row (expected keys that keys_held lists)");
}

Status key_of_another_rank(const TableSpec& spec, Key key, int owner, int me) {
  return Status::invalid_argument("table '" + spec.name + "': key " + std::to_string(key) + " belongs to rank " +
                                  std::to_string(owner) + "'s shard, not rank " + std::to_string(me) +
                                  "'s (expected keys of this rank's shard: a world's dynamic table is written shard "
                                  "by shard)");
}

Status evaluation_backward(std::int64_t batch_id) {
  return Status::failed_precondition("batch " + std::to_string(batch_id) +
                                     ": backward of an evaluation batch (KeyBatch::train false; expected discard)");
}
Status check_table(int table, const StoreConfig& config) {
  if (table < 0 || table >= static_cast<int>(config.tables.size()))
    return Status::not_found("table index " + std::to_string(table) + " out of range [0, " +
                             std::to_string(config.tables.size()) + ")");
  return Status::ok();
}
Status check_row_range(int table, std::int64_t row0, std::int64_t n, const StoreConfig& config) {
  STRATA_RETURN_IF_ERROR(check_table(table, config));
  const TableSpec& s = config.tables[static_cast<std::size_t>(table)].spec;
  if (row0 < 0 || n < 0 || row0 > s.rows - n)
    return Status::out_of_range("table '" + s.name + "': rows [" + std::to_string(row0) + ", " +
                                std::to_string(row0 + n) + ") out of range [0, " + std::to_string(s.rows) + ")");
  return Status::ok();
}

std::string unholdable(DType dtype, float x) {
  std::ostringstream m;
  m.precision(9);
  m << x << ", which " << to_string(dtype) << " cannot hold (expected a magnitude below "
    << (dtype == DType::kBF16 ? "about 3.39615e38" : "65520") << ": it would round to an infinity)";
  return m.str();
}

Status check_holdable(const char* op, const TableSpec& spec, std::int64_t first_row, std::int64_t n, std::int32_t cols,
                      const float* weights, std::int32_t state_cols, const float* state) {
  for (const bool of_state : {false, true}) {
    const DType dtype = of_state ? spec.state_dtype : spec.dtype;
    const float* p = of_state ? state : weights;
    const std::int64_t width = of_state ? state_cols : cols;
    if (dtype == DType::kF32 || p == nullptr) continue;
    for (std::int64_t i = 0; i < n * width; ++i) {
      if (!rounds_to_infinity(dtype, p[i])) continue;
      return Status::invalid_argument("table '" + spec.name + "': " + op + (of_state ? " state" : " weight") +
                                      " of row " + std::to_string(first_row + i / width) + ", column " +
                                      std::to_string(i % width) + " is " + unholdable(dtype, p[i]));
    }
  }
  return Status::ok();
}

}  // namespace strata::detail
