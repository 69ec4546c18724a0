// The reference implementation: the oracle for every mode. Deliberately simple: rows in plain
// vectors, one thread, no dedup; gradients are summed per row in the order keys appear, in
// segments of kGradSegment uses (the order the fast kernels also use, so fp32 results match bit
// for bit).
//
// Half-size elements (core/half.hpp) are held as the fp32 values they widen to: a bf16 or fp16 row
// starts as its fp32 initial values rounded to nearest, and after each update every weight (and
// every state element of a bf16 state) becomes the value store_weight would store, rounded to
// nearest or stochastically with the bits of (seed, table, global row, step, global column, what).
// The math is fp32, as everywhere. Half-size outputs are rounded to nearest once per output row
// element; half-size gradients are widened where read.

#include <cstdint>
#include <cstring>
#include <map>
#include <unordered_map>
#include <vector>

#include "core/row_math.hpp"
#include "store/detail/batch_checks.hpp"
#include "store/detail/features.hpp"
#include "store/store.hpp"

namespace strata {
namespace {

// Same words as the production store's refusal of a null weights buffer.
Status null_weights(const char* op, const TableSpec& s, std::int64_t n) {
  return Status::invalid_argument("table '" + s.name + "': " + op + " weights is null (expected a buffer of " +
                                  std::to_string(n) + " x " + std::to_string(s.dim) + " floats)");
}

// One row's gradient, added use by use: the first kGradSegment uses into the total, then each
// further segment of kGradSegment uses into a partial sum from 0.0f that joins the total when the
// segment is complete (or at the end).
class GradSum {
 public:
  void add(const float* grad, float scale, std::int32_t dim) {
    if (total_.empty()) total_.assign(static_cast<std::size_t>(dim), 0.0f);
    const bool first = uses_ < kGradSegment;
    if (!first && uses_ % kGradSegment == 0) part_.assign(static_cast<std::size_t>(dim), 0.0f);
    row_axpy(first ? total_.data() : part_.data(), grad, scale, dim);
    ++uses_;
    if (!first && uses_ % kGradSegment == 0) row_add(total_.data(), part_.data(), dim);
  }
  // The finished sum (call once, after the last add).
  float* finish(std::int32_t dim) {
    if (uses_ > kGradSegment && uses_ % kGradSegment != 0) row_add(total_.data(), part_.data(), dim);
    return total_.data();
  }

 private:
  std::vector<float> total_, part_;
  std::int64_t uses_ = 0;
};

// Rounds n elements of `dtype` in place to nearest, as a half-size table stores written values.
void round_to_nearest(float* v, std::int64_t n, DType dtype) {
  if (dtype == DType::kF32) return;
  for (std::int64_t i = 0; i < n; ++i) v[i] = rounded(dtype, v[i], false, 0);
}

// A view's n elements as fp32: widened from the 2-byte elements of a half-size view (copied first:
// the view's memory holds no floats), or the view's own floats.
const float* widened(const ConstMatrixView& v, DType dtype, std::vector<float>& scratch) {
  if (dtype == DType::kF32) return v.data;
  const auto n = static_cast<std::size_t>(v.rows * v.cols);
  std::vector<std::uint16_t> bits(n);
  if (n > 0) std::memcpy(bits.data(), v.data, n * sizeof(std::uint16_t));  // data may be null when empty
  scratch.resize(n);
  for (std::size_t k = 0; k < n; ++k) scratch[k] = widen(dtype, bits[k]);
  return scratch.data();
}

class ReferenceStore final : public Store {
 public:
  explicit ReferenceStore(StoreConfig config) : Store(std::move(config)), features_(config_) {
    for (const auto& t : config_.tables) {
      Table tab;
      tab.spec = t.spec;
      tab.state_dim = optimizer_state_dim(t.spec.optimizer.kind, t.spec.dim);
      tab.weights.resize(static_cast<std::size_t>(t.spec.rows * t.spec.dim));
      tab.state.resize(static_cast<std::size_t>(t.spec.rows * tab.state_dim));
      const std::uint64_t seed = table_seed(t.spec.init.seed, table_name_hash(t.spec.name));
      for (std::int64_t r = 0; r < t.spec.rows; ++r) {
        init_row(tab.weights.data() + r * t.spec.dim, seed, r, t.spec.dim, t.spec.init.bound);
        init_state(tab.state.data() + r * tab.state_dim, t.spec.optimizer, tab.state_dim);
      }
      round_to_nearest(tab.weights.data(), static_cast<std::int64_t>(tab.weights.size()), t.spec.dtype);
      round_to_nearest(tab.state.data(), static_cast<std::int64_t>(tab.state.size()), t.spec.state_dtype);
      tables_.push_back(std::move(tab));
    }
  }

  Status submit(std::int64_t id, KeyBatch batch) override {
    if (batches_.count(id)) return detail::duplicate_batch(id);
    STRATA_ASSIGN_OR_RETURN(std::vector<int> tables,
                            detail::check_batch(id, batch, features_.features(), features_.index()));
    batches_.emplace(id, Entry{std::move(batch), std::move(tables), false, {}});
    (void)previews_.submitted(id);
    return Status::ok();
  }

  // Previews only steer a cache: checked like every mode checks them, then only their ids are kept.
  Status preview(std::int64_t id, const KeyBatch& batch) override {
    STRATA_RETURN_IF_ERROR(
        detail::check_preview(id, batch, features_.features(), features_.index(), previews_, batches_.count(id) > 0)
            .status());
    previews_.add(id);
    return Status::ok();
  }
  void drop_previews() override { previews_.clear(); }
  std::int64_t previewed() const noexcept override { return previews_.size(); }

  Status forward(std::int64_t id, const std::vector<MatrixView>& outputs) override {
    STRATA_ASSIGN_OR_RETURN(Entry * found,
                            detail::find_batch(batches_, id, features_.features(), outputs, "output", false, nullptr));
    Entry& e = *found;
    for (std::size_t i = 0; i < e.tables.size(); ++i) {
      const Table& t = tables_[static_cast<std::size_t>(features_.table_of(e.tables[i]))];
      const Pooling pooling = features_.features().tables[static_cast<std::size_t>(e.tables[i])].spec.pooling;
      const JaggedKeys& f = e.batch.features[i];
      const MatrixView& view = outputs[i];
      if (t.spec.output_dtype == DType::kF32) {
        pool(t, f, pooling, view.data);
        continue;
      }
      // Pooled in fp32, then each element rounded to nearest into the half-size view.
      const auto n = static_cast<std::size_t>(view.rows * view.cols);
      std::vector<float> out(n);
      pool(t, f, pooling, out.data());
      std::vector<std::uint16_t> bits(n);
      for (std::size_t k = 0; k < n; ++k) bits[k] = narrow(t.spec.output_dtype, out[k], false, 0);
      if (n > 0) std::memcpy(view.data, bits.data(), n * sizeof(std::uint16_t));  // data may be null when empty
    }
    e.forwarded = true;
    e.spaces.assign(outputs.size(), MemorySpace::kHost);
    return Status::ok();
  }
  // No device: every stream is refused (after the views are checked, as the store checks them).
  Status forward(std::int64_t id, const std::vector<MatrixView>& outputs, gpu::StreamView stream) override {
    STRATA_RETURN_IF_ERROR(
        detail::find_batch(batches_, id, features_.features(), outputs, "output", false, nullptr).status());
    return detail::check_stream("forward", id, nullptr, stream);
  }
  Status backward(std::int64_t id, const std::vector<ConstMatrixView>& grads, gpu::StreamView stream) override {
    STRATA_RETURN_IF_ERROR(
        detail::find_batch(batches_, id, features_.features(), grads, "gradient", true, nullptr).status());
    return detail::check_stream("backward", id, nullptr, stream);
  }

  Status backward(std::int64_t id, const std::vector<ConstMatrixView>& grads) override {
    STRATA_ASSIGN_OR_RETURN(Entry * found,
                            detail::find_batch(batches_, id, features_.features(), grads, "gradient", true, nullptr));
    Entry& e = *found;
    ++step_;
    // The batch's features of each table, in the table's feature order (features_ lists them so).
    std::map<int, std::map<int, std::size_t>> of_table;  // table -> feature -> position in the batch
    for (std::size_t i = 0; i < e.tables.size(); ++i) of_table[features_.table_of(e.tables[i])][e.tables[i]] = i;
    for (const auto& [table, mine] : of_table) {
      Table& t = tables_[static_cast<std::size_t>(table)];
      const std::int32_t dim = t.spec.dim;
      std::vector<std::vector<float>> wide(mine.size());
      std::vector<const float*> grad_of;  // per feature of `mine`, fp32
      for (const auto& [feature, i] : mine)
        grad_of.push_back(widened(grads[i], t.spec.output_dtype, wide[grad_of.size()]));
      // Per-row gradient sums, each accumulated in the order its uses appear (bag by bag; in a bag, the table's
      // features in their order, each in its key order), in segments of kGradSegment uses (core/row_math.hpp). All
      // the table's features add to one sum per row: a row two features use gets both in one update.
      std::map<Key, GradSum> sums;
      for (std::int64_t b = 0; b < e.batch.batch_size(); ++b) {
        std::size_t n = 0;
        for (const auto& [feature, i] : mine) {
          const JaggedKeys& f = e.batch.features[i];
          const Pooling pooling = features_.features().tables[static_cast<std::size_t>(feature)].spec.pooling;
          const float* w = f.weights.empty() ? nullptr : f.weights.data();
          const float* grad = grad_of[n++];
          const std::int64_t lo = f.offset(b), hi = f.offset(b + 1);
          for (std::int64_t j = lo; j < hi; ++j) {
            GradSum& sum = sums[f.key(j)];
            if (pooling == Pooling::kNone) {
              sum.add(grad + j * dim, grad_scale(Pooling::kNone, 1, w, j), dim);
            } else {
              sum.add(grad + b * dim, grad_scale(pooling, hi - lo, w, j), dim);
            }
          }
        }
      }
      const OptimizerStep st = make_optimizer_step(t.spec, step_);
      for (auto& [key, sum] : sums) {
        apply_optimizer(st, t.row(key), t.state_of(key), sum.finish(dim), dim);
        t.store(st.round, key);
      }
    }
    batches_.erase(id);
    return Status::ok();
  }

  Status discard(std::int64_t id) override {
    if (!batches_.erase(id)) return detail::unknown_batch(id);
    return Status::ok();
  }
  Status flush() override { return Status::ok(); }
  std::int64_t in_flight() const noexcept override { return static_cast<std::int64_t>(batches_.size()); }

  Result<std::vector<Key>> keys_held(int) const override { return Status::internal("keys_held: not built yet"); }
  Status read_keys(int, const std::vector<Key>&, float*, float*) override {
    return Status::internal("read_keys: not built yet");
  }
  Status read_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) override {
    STRATA_RETURN_IF_ERROR(detail::check_row_range(table, row0, n, config_));
    const Table& t = tables_[static_cast<std::size_t>(table)];
    if (!weights && n > 0) return null_weights("read_rows", t.spec, n);
    if (n <= 0) return Status::ok();  // buffers may be null: no memcpy of nothing from null (n < 0 was refused)
    std::memcpy(weights, t.row(row0), sizeof(float) * static_cast<std::size_t>(n * t.spec.dim));
    if (state && t.state_dim)
      std::memcpy(state, t.state.data() + row0 * t.state_dim,
                  sizeof(float) * static_cast<std::size_t>(n * t.state_dim));
    return Status::ok();
  }
  Status write_rows(int table, std::int64_t row0, std::int64_t n, const float* weights, const float* state) override {
    if (!batches_.empty()) return detail::busy("write_rows", in_flight());
    STRATA_RETURN_IF_ERROR(detail::check_row_range(table, row0, n, config_));
    Table& t = tables_[static_cast<std::size_t>(table)];
    if (!weights && n > 0) return null_weights("write_rows", t.spec, n);
    if (n <= 0) return Status::ok();  // n < 0 was refused above
    STRATA_RETURN_IF_ERROR(
        detail::check_holdable("write_rows", t.spec, row0, n, t.spec.dim, weights, t.state_dim, state));
    std::memcpy(t.row(row0), weights, sizeof(float) * static_cast<std::size_t>(n * t.spec.dim));
    round_to_nearest(t.row(row0), n * t.spec.dim, t.spec.dtype);
    if (state && t.state_dim) {
      std::memcpy(t.state_of(row0), state, sizeof(float) * static_cast<std::size_t>(n * t.state_dim));
      round_to_nearest(t.state_of(row0), n * t.state_dim, t.spec.state_dtype);
    }
    return Status::ok();
  }

 protected:
  // Each table keeps its own copy of the spec.
  void learning_rate_changed(int table, float learning_rate) override {
    tables_[static_cast<std::size_t>(table)].spec.optimizer.learning_rate = learning_rate;
  }

 private:
  struct Table {
    TableSpec spec;
    std::int32_t state_dim = 0;
    std::vector<float> weights;  // (rows, dim)
    std::vector<float> state;    // (rows, state_dim)
    float* row(Key k) { return weights.data() + k * spec.dim; }
    const float* row(Key k) const { return weights.data() + k * spec.dim; }
    float* state_of(Key k) { return state.data() + k * state_dim; }
    // Row k's weights and state after an update, as its element types store them (fp32: as is).
    // A state of several vectors (adam's m and v) salts each with its own RoundingSalt.
    void store(const Rounding& round, Key k) {
      if (spec.dtype != DType::kF32) {
        const std::uint64_t key = round.row_key(k, RoundingSalt::kWeights);
        float* w = row(k);
        for (std::int32_t c = 0; c < spec.dim; ++c) w[c] = stored_value(round, spec.dtype, key, c, w[c]);
      }
      if (spec.state_dtype != DType::kF32) {
        float* s = state_of(k);
        for (std::int32_t v = 0; v * spec.dim < state_dim; ++v) {
          const std::uint64_t key = round.row_key(k, static_cast<RoundingSalt>(1 + v));
          for (std::int32_t c = 0; c < spec.dim; ++c)
            s[v * spec.dim + c] = stored_value(round, spec.state_dtype, key, c, s[v * spec.dim + c]);
        }
      }
    }
  };
  // The fp32 outputs of feature f of table t, pooled by `pooling`, into `out` (output_rows x dim).
  static void pool(const Table& t, const JaggedKeys& f, Pooling pooling, float* out) {
    const std::int32_t dim = t.spec.dim;
    const float* w = f.weights.empty() ? nullptr : f.weights.data();
    if (pooling == Pooling::kNone) {
      for (std::int64_t j = 0; j < f.num_keys(); ++j) {
        // The row, or the weight times it (not 0 + w * row: the sign of a zero must survive).
        float* o = out + j * dim;
        const float* row = t.row(f.key(j));
        for (std::int32_t c = 0; c < dim; ++c) o[c] = w ? w[j] * row[c] : row[c];
      }
      return;
    }
    for (std::int64_t b = 0; b < f.batch_size(); ++b) {
      float* o = out + b * dim;
      for (std::int32_t c = 0; c < dim; ++c) o[c] = 0.0f;
      const std::int64_t lo = f.offset(b), hi = f.offset(b + 1);
      for (std::int64_t j = lo; j < hi; ++j) row_axpy(o, t.row(f.key(j)), w ? w[j] : 1.0f, dim);
      if (pooling == Pooling::kMean && hi > lo) row_scale(o, bag_scale(pooling, hi - lo), dim);
    }
  }

  struct Entry {
    KeyBatch batch;
    std::vector<int> tables;
    bool forwarded = false;
    std::vector<MemorySpace> spaces;  // of forward's outputs, per feature
  };
  detail::FeatureMap features_;  // the store's features (a table's own name when it lists none)
  std::vector<Table> tables_;
  std::unordered_map<std::int64_t, Entry> batches_;
  detail::PreviewIds previews_;  // previewed, not yet submitted
};

}  // namespace

Result<std::unique_ptr<Store>> open_reference_store(const StoreConfig& config) {
  STRATA_RETURN_IF_ERROR(validate(config));
  return std::unique_ptr<Store>(std::make_unique<ReferenceStore>(config));
}

}  // namespace strata
