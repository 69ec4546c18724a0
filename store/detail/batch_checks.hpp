#pragma once
// Checks shared by every Store implementation: a batch against the tables, output and gradient
// views against the batch (shapes, memory spaces, device ranges), streams against the store's
// device, and the batch-id lifecycle. Validation happens here, before any state
// changes, so every mode rejects bad input with the same message.

#include <cstdint>
#include <deque>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "core/key_batch.hpp"
#include "gpu/device.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

/// Name -> table index of a config.
using TableIndex = std::unordered_map<std::string, int>;
TableIndex make_table_index(const StoreConfig& config);

/// Validates a whole batch; on success returns the table index of each feature. Errors start with
/// "batch ID".
Result<std::vector<int>> check_batch(std::int64_t batch_id, const KeyBatch& batch, const StoreConfig& config,
                                     const TableIndex& index);
/// The same, errors starting with `who` (e.g. "preview of batch 7").
Result<std::vector<int>> check_batch(const std::string& who, const KeyBatch& batch, const StoreConfig& config,
                                     const TableIndex& index);

/// The batch ids a store holds previews of (Store::preview): previewed, not yet submitted nor
/// dropped, ascending. Every Store implementation keeps one, so that every mode accepts and refuses
/// previews alike, whether or not it uses them.
class PreviewIds {
 public:
  /// After submit(id) succeeded. When `id` was previewed: removes it and every id before it (those
  /// batches were skipped) and returns true. Otherwise changes nothing (a batch submitted without
  /// a preview leaves the previews as they are) and returns false.
  bool submitted(std::int64_t id);
  void add(std::int64_t id) { ids_.push_back(id); }
  void clear() noexcept { ids_.clear(); }
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(ids_.size()); }
  const std::deque<std::int64_t>& ids() const noexcept { return ids_; }

 private:
  std::deque<std::int64_t> ids_;
};

/// Every check of Store::preview(id, batch), before any state changes: previews enabled and the
/// horizon (`config.cache.preview` previews not yet submitted) not reached, `id` not in flight and
/// above every id previewed and not yet submitted, then the keys as submit checks them. Errors start
/// with "preview of batch ID". On success returns the table index of each feature.
Result<std::vector<int>> check_preview(std::int64_t batch_id, const KeyBatch& batch, const StoreConfig& config,
                                       const TableIndex& index, const PreviewIds& previews, bool in_flight);

/// Validates one view per feature with the shape forward produces (`what` is "output" or "gradient").
template <typename View>
Status check_views(std::int64_t batch_id, const KeyBatch& batch, const std::vector<int>& tables,
                   const StoreConfig& config, const std::vector<View>& views, const char* what) {
  const std::string who = "batch " + std::to_string(batch_id);
  if (views.size() != batch.features.size())
    return Status::invalid_argument(who + ": " + std::to_string(views.size()) + " " + what + " views for " +
                                    std::to_string(batch.features.size()) + " features (expected one per feature)");
  for (std::size_t i = 0; i < views.size(); ++i) {
    const TableSpec& spec = config.tables[static_cast<std::size_t>(tables[i])].spec;
    const std::int64_t rows = output_rows(batch.features[i], spec.pooling);
    const View& v = views[i];
    if (v.rows != rows || v.cols != spec.dim)
      return Status::invalid_argument(who + ", table '" + spec.name + "': " + what + " shape (" +
                                      std::to_string(v.rows) + ", " + std::to_string(v.cols) + ") (expected (" +
                                      std::to_string(rows) + ", " + std::to_string(spec.dim) + "))");
    if (v.dtype != spec.output_dtype)
      return Status::invalid_argument(who + ", table '" + spec.name + "': " + what + " view dtype " +
                                      to_string(v.dtype) + " (expected " + to_string(spec.output_dtype) +
                                      ": the table's output_dtype)");
    if (v.data == nullptr && rows > 0)
      return Status::invalid_argument(who + ", table '" + spec.name + "': " + what + " data is null");
  }
  return Status::ok();
}

Status unknown_batch(std::int64_t batch_id);
Status backward_before_forward(std::int64_t batch_id);

/// The memory space of view `index` (an "output" or "gradient" view of table `spec`) against the
/// store's `device` (null: none): a device view needs a device and a range of its memory
/// (Device::check_device_range; never dereferenced). `forward_space`: for gradients, the space of
/// forward's output, which they must share (null for outputs).
Status check_space(std::int64_t batch_id, const TableSpec& spec, const char* what, std::size_t index, MemorySpace space,
                   const void* data, std::int64_t elements, const gpu::Device* device,
                   const MemorySpace* forward_space);

/// The stream of Store::forward/backward(id, views, stream) (`op`): a stream of `device`. Errors
/// name the call and what was expected (a store without a device takes no stream).
Status check_stream(const char* op, std::int64_t batch_id, const gpu::Device* device, gpu::StreamView stream);

/// Unless `config.accept_nonfinite_gradients`: InvalidArgument at the first NaN or +-Inf of the
/// host gradients (views already checked against the batch; device views are skipped: the store
/// counts theirs on the device), naming the table, the bag (and the key's position for pooling
/// none), the column and the value. One pass over the gradients (on the calling arena's threads:
/// call it inside the store's arena), no writes.
Status check_finite_gradients(std::int64_t batch_id, const KeyBatch& batch, const std::vector<int>& tables,
                              const StoreConfig& config, const std::vector<ConstMatrixView>& grads);
/// The error of check_finite_gradients for feature `i`, whose gradient `g` (host memory: a copy,
/// for device gradients) holds a NaN or an Inf; ok when it holds none.
Status nonfinite_gradient(std::int64_t batch_id, const KeyBatch& batch, const std::vector<int>& tables,
                          const StoreConfig& config, std::size_t i, const ConstMatrixView& g);

/// The in-flight batch `id` of a store's batch map, checked against `views` (one per feature, of
/// the shape forward produces, in the memory spaces that the store's `device` (null: none) allows);
/// with `need_forward` (gradients), the batch must have been forwarded, the gradients must be in
/// the spaces of forward's outputs (the entry's `spaces`), and host gradients must be finite.
template <typename Map, typename View>
Result<typename Map::mapped_type*> find_batch(Map& batches, std::int64_t id, const StoreConfig& config,
                                              const std::vector<View>& views, const char* what, bool need_forward,
                                              const gpu::Device* device) {
  auto it = batches.find(id);
  if (it == batches.end()) return unknown_batch(id);
  auto& e = it->second;
  if (need_forward && !e.forwarded) return backward_before_forward(id);
  STRATA_RETURN_IF_ERROR(check_views(id, e.batch, e.tables, config, views, what));
  for (std::size_t i = 0; i < views.size(); ++i) {
    const TableSpec& spec = config.tables[static_cast<std::size_t>(e.tables[i])].spec;
    STRATA_RETURN_IF_ERROR(check_space(id, spec, what, i, views[i].space, views[i].data, views[i].rows * views[i].cols,
                                       device, need_forward ? &e.spaces[i] : nullptr));
  }
  if constexpr (std::is_same_v<View, ConstMatrixView>)
    STRATA_RETURN_IF_ERROR(check_finite_gradients(id, e.batch, e.tables, config, views));
  return &e;
}

/// Errors for the batch lifecycle, shared so every mode words them the same way.
Status unknown_batch(std::int64_t batch_id);
Status duplicate_batch(std::int64_t batch_id);
Status backward_before_forward(std::int64_t batch_id);
Status busy(const char* operation, std::int64_t in_flight);
Status check_table(int table, const StoreConfig& config);
/// Dynamic tables (TableConfig::dynamic), worded alike by every store: `op` by row id refused for a dynamic table (ok
/// for a dense one or an unknown index, which the caller's range check names); `op` by key refused for a dense table
/// or an unknown index; a key without a row; backward of an evaluation batch (KeyBatch::train false).
Status dense_only(const char* op, int table, const StoreConfig& config);
Status dynamic_only(const char* op, int table, const StoreConfig& config);
/// In a world, `owner` is the rank whose shard holds the key and `me` this rank (a key of another rank's shard).
Status key_without_row(const TableSpec& spec, Key key, std::size_t position, int owner = 0, int me = 0);
/// A key written to a shard of a world that does not hold it (InvalidArgument).
Status key_of_another_rank(const TableSpec& spec, Key key, int owner, int me);
Status evaluation_backward(std::int64_t batch_id);
Status check_row_range(int table, std::int64_t row0, std::int64_t n, const StoreConfig& config);
/// Refuses (naming `op`, the table, the row, the column and the value) a finite weight or state value of `n` rows being
/// written into table `spec` that its dtype or state_dtype cannot hold: it would round to an infinity there (fp16 from
/// 65520 in magnitude, bf16 from about 3.3961e38). fp32 takes anything; NaN and +-Inf are stored as they are.
/// `first_row`: the row of weights[0]; `cols`, `state_cols`: floats per row of each (state may be null).
Status check_holdable(const char* op, const TableSpec& spec, std::int64_t first_row, std::int64_t n, std::int32_t cols,
                      const float* weights, std::int32_t state_cols, const float* state);
/// "70000, which fp16 cannot hold (expected a magnitude below 65520: it would round to an infinity)": the end of
/// check_holdable's messages, for x with rounds_to_infinity(dtype, x).
std::string unholdable(DType dtype, float x);

}  // namespace strata::detail
