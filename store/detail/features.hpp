#pragma once
// Features (TableConfig::features) at the store's front: what a trainer gives and takes (a KeyBatch
// by feature, a view per feature) against what the engines serve (a batch by table).
//
// A table with one feature is served with that feature's pooling; its batch entry goes to the
// engines as it is, renamed to the table. A dynamic table (dynamic_keys.hpp) is merged as one of
// several features is. A table with several features ("merged") is served
// unpooled in fp32: merge() puts its features' keys in one entry, bag by bag (bag b holds each of
// its features' bag b in the table's feature order, each in its key order), so the engines dedup,
// cache, exchange and update the table's rows once for all its features; forward's unpooled rows
// are pooled per feature by pool_features (the pooling kernels, reading the rows from there), and
// backward's gradients are spread by spread_gradients onto the key positions, each use's gradient
// row times its scale (grad_scale), which the engines' unpooled reduction sums in position order:
// exactly the terms, in the order, that the reference store sums for a row (bit for bit).

#include <cstdint>
#include <vector>

#include "core/key_batch.hpp"
#include "store/detail/batch_checks.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

/// A batch as the engines see it: one entry per table, ascending table index.
struct TableBatch {
  KeyBatch batch;
  std::vector<int> tables;    ///< table index of each entry
  std::vector<int> entry_of;  ///< per feature of the trainer's batch: its table's entry
  /// Per feature of the trainer's batch whose table is merged: the position of each of its keys in
  /// the table's entry (empty for the others).
  std::vector<std::vector<Key>> positions;
};

class FeatureMap {
 public:
  explicit FeatureMap(const StoreConfig& config);

  /// Every table has one feature of its own name and pooling: batches and views go to the engines as they are.
  bool trivial() const noexcept { return trivial_; }
  /// One "table" per feature (in table order, each table's features in its order): the config of the feature's
  /// table, pooled as the feature and named for messages (`item' feature 'bought`, so that a check's "table '...'"
  /// names both). Batches and views by feature are checked against it.
  const StoreConfig& features() const noexcept { return features_; }
  const TableIndex& index() const noexcept { return index_; }
  /// The tables as the engines serve them: a merged table unpooled with fp32 outputs; a table with one feature with
  /// that feature's pooling.
  const StoreConfig& engines() const noexcept { return engines_; }
  int table_of(int feature) const { return table_of_[static_cast<std::size_t>(feature)]; }
  bool merged(int table) const { return merged_[static_cast<std::size_t>(table)] != 0; }

  /// Sets a table's rate in features() and engines() (Store::learning_rate_changed: the engines read engines()).
  void set_learning_rate(int table, float learning_rate);

  /// The engines' batch of a checked batch by feature (`features`: the feature index of each entry).
  TableBatch merge(const KeyBatch& batch, const std::vector<int>& features) const;

 private:
  bool trivial_ = true;
  StoreConfig features_, engines_;
  TableIndex index_;
  std::vector<int> table_of_;
  std::vector<char> merged_;
};

/// Forward's outputs of the merged tables' features: for each feature i of `batch` whose table is
/// merged, outputs[i] (host memory) = its bags pooled from rows[entry] (the engines' unpooled fp32
/// output of its table's entry, (keys, dim) host), with the feature's pooling and weights, rounded
/// to its output_dtype. On the calling arena's threads.
void pool_features(const FeatureMap& map, const KeyBatch& batch, const std::vector<int>& features, const TableBatch& tb,
                   const std::vector<const float*>& rows, const std::vector<MatrixView>& outputs);

/// Backward's unpooled fp32 gradients of each merged table's entry: spread[entry] ((keys, dim)
/// host, every row written) gets, at each key position of each of its features, the gradient row
/// of the key's bag (pooled) or of the key (none), widened from the feature's grads[i] (host), times
/// grad_scale of the use. On the calling arena's threads.
void spread_gradients(const FeatureMap& map, const KeyBatch& batch, const std::vector<int>& features,
                      const TableBatch& tb, const std::vector<ConstMatrixView>& grads,
                      const std::vector<float*>& spread);

}  // namespace strata::detail
