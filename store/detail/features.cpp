#include "store/detail/features.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/half.hpp"
#include "core/row_math.hpp"
#include "host/kernels.hpp"

namespace strata::detail {

FeatureMap::FeatureMap(const StoreConfig& config) : features_(config), engines_(config) {
  features_.tables.clear();
  merged_.assign(config.tables.size(), 0);
  for (std::size_t t = 0; t < config.tables.size(); ++t) {
    const TableConfig& tc = config.tables[t];
    std::vector<FeatureConfig> list = tc.features;
    if (list.empty()) list.push_back({tc.spec.name, std::nullopt});
    TableSpec& served = engines_.tables[t].spec;
    // A dynamic table is served unpooled too (dynamic_keys.hpp: its keys without a row read values set here), with
    // one more row, which those keys look up.
    if (tc.dynamic) {
      served.rows = tc.spec.rows + 1;
      trivial_ = false;
    }
    if (list.size() > 1 || tc.dynamic) {
      merged_[t] = 1;
      served.pooling = Pooling::kNone;
      served.output_dtype = DType::kF32;
    } else {
      served.pooling = list.front().pooling.value_or(tc.spec.pooling);
    }
    for (const FeatureConfig& f : list) {
      TableConfig fc = tc;
      if (!tc.features.empty()) fc.spec.name = tc.spec.name + "' feature '" + f.name;
      fc.spec.pooling = f.pooling.value_or(tc.spec.pooling);
      fc.features.clear();
      if (list.size() > 1 || f.name != tc.spec.name || fc.spec.pooling != tc.spec.pooling) trivial_ = false;
      index_.emplace(f.name, static_cast<int>(features_.tables.size()));
      table_of_.push_back(static_cast<int>(t));
      features_.tables.push_back(std::move(fc));
    }
  }
}

void FeatureMap::set_learning_rate(int table, float learning_rate) {
  engines_.tables[static_cast<std::size_t>(table)].spec.optimizer.learning_rate = learning_rate;
  for (std::size_t f = 0; f < table_of_.size(); ++f)
    if (table_of_[f] == table) features_.tables[f].spec.optimizer.learning_rate = learning_rate;
}

TableBatch FeatureMap::merge(const KeyBatch& batch, const std::vector<int>& features) const {
  const std::size_t n = batch.features.size();
  TableBatch tb;
  tb.entry_of.assign(n, -1);
  tb.positions.resize(n);
  // The batch's features of each table, in the table's feature order (features_ lists them so).
  std::vector<std::vector<std::size_t>> of_table(engines_.tables.size());
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return features[a] < features[b]; });
  for (const std::size_t i : order) of_table[static_cast<std::size_t>(table_of(features[i]))].push_back(i);
  const std::int64_t bags = batch.batch_size();
  for (std::size_t t = 0; t < of_table.size(); ++t) {
    const std::vector<std::size_t>& mine = of_table[t];
    if (mine.empty()) continue;
    const int entry = static_cast<int>(tb.batch.features.size());
    tb.tables.push_back(static_cast<int>(t));
    JaggedKeys e;
    e.table = engines_.tables[t].spec.name;
    if (!merged_[t]) {
      const JaggedKeys& f = batch.features[mine.front()];
      e.offsets = f.offsets;
      e.keys = f.keys;
      e.weights = f.weights;
      e.offsets32 = f.offsets32;
      e.keys32 = f.keys32;
    } else {
      std::int64_t total = 0;
      for (const std::size_t i : mine) {
        total += batch.features[i].num_keys();
        tb.positions[i].resize(static_cast<std::size_t>(batch.features[i].num_keys()));
      }
      e.offsets.assign(static_cast<std::size_t>(bags) + 1, 0);
      e.keys.resize(static_cast<std::size_t>(total));
      std::int64_t at = 0;
      for (std::int64_t b = 0; b < bags; ++b) {
        for (const std::size_t i : mine) {
          const JaggedKeys& f = batch.features[i];
          for (std::int64_t j = f.offset(b); j < f.offset(b + 1); ++j) {
            tb.positions[i][static_cast<std::size_t>(j)] = at;
            e.keys[static_cast<std::size_t>(at++)] = f.key(j);
          }
        }
        e.offsets[static_cast<std::size_t>(b) + 1] = at;
      }
    }
    for (const std::size_t i : mine) tb.entry_of[i] = entry;
    tb.batch.features.push_back(std::move(e));
  }
  return tb;
}

void pool_features(const FeatureMap& map, const KeyBatch& batch, const std::vector<int>& features, const TableBatch& tb,
                   const std::vector<const float*>& rows, const std::vector<MatrixView>& outputs) {
  const std::size_t n = batch.features.size();
  std::vector<float*> bases(n, nullptr);  // RowRef::bases of each item: must outlive the call
  std::vector<TableBatchItem> items;
  for (std::size_t i = 0; i < n; ++i) {
    if (!map.merged(map.table_of(features[i]))) continue;
    const TableSpec& spec = map.features().tables[static_cast<std::size_t>(features[i])].spec;
    const JaggedKeys& f = batch.features[i];
    bases[i] = const_cast<float*>(rows[static_cast<std::size_t>(tb.entry_of[i])]);  // read only
    TableBatchItem it;
    it.table.bases = &bases[i];
    it.table.stride = spec.dim;
    it.table.dim = spec.dim;
    it.bags = bags_of(f);
    it.bags.keys = tb.positions[i].data();  // the rows of its keys in the table's unpooled rows
    it.bags.keys32 = nullptr;
    it.pooling = spec.pooling;
    it.out = outputs[i].data;
    it.out_dtype = spec.output_dtype;
    items.push_back(it);
  }
  if (items.empty()) return;
  TableBatchScratch scratch;
  gather_pool_tables(items, scratch);
}

namespace {

// Element (r, c) of a gradient view of `dtype` (dim columns), widened to fp32.
float grad_at(const ConstMatrixView& g, DType dtype, std::int64_t r, std::int32_t c, std::int32_t dim) {
  const std::int64_t k = r * dim + c;
  if (dtype == DType::kF32) return g.data[k];
  std::uint16_t bits = 0;
  std::memcpy(&bits, reinterpret_cast<const char*>(g.data) + k * 2, sizeof bits);
  return widen(dtype, bits);
}

}  // namespace

void spread_gradients(const FeatureMap& map, const KeyBatch& batch, const std::vector<int>& features,
                      const TableBatch& tb, const std::vector<ConstMatrixView>& grads,
                      const std::vector<float*>& spread) {
  for (std::size_t i = 0; i < batch.features.size(); ++i) {
    if (!map.merged(map.table_of(features[i]))) continue;
    const TableSpec& spec = map.features().tables[static_cast<std::size_t>(features[i])].spec;
    const JaggedKeys& f = batch.features[i];
    const float* w = f.weights.empty() ? nullptr : f.weights.data();
    const std::int32_t dim = spec.dim;
    float* out = spread[static_cast<std::size_t>(tb.entry_of[i])];
    const std::vector<Key>& pos = tb.positions[i];
    const bool none = spec.pooling == Pooling::kNone;
    tbb::parallel_for(
        tbb::blocked_range<std::int64_t>(0, f.batch_size()), [&](const tbb::blocked_range<std::int64_t>& r) {
          for (std::int64_t b = r.begin(); b < r.end(); ++b) {
            const std::int64_t lo = f.offset(b), hi = f.offset(b + 1);
            for (std::int64_t j = lo; j < hi; ++j) {
              // The use's term of its row's gradient sum, as the reference and the kernels form it.
              const float s = none ? grad_scale(Pooling::kNone, 1, w, j) : grad_scale(spec.pooling, hi - lo, w, j);
              const std::int64_t src = none ? j : b;
              float* o = out + pos[static_cast<std::size_t>(j)] * dim;
              for (std::int32_t c = 0; c < dim; ++c) o[c] = s * grad_at(grads[i], spec.output_dtype, src, c, dim);
            }
          }
        });
  }
}

}  // namespace strata::detail
