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
//
// Dynamic tables restate the rules of store/detail/dynamic_keys.hpp as plainly as they read: a
// std::map from key to row, a slot per row (its key, last use, count, touch order, pins), linear
// scans for the lowest free row and for victims, and the shared AdmissionSketch for admission
// counts. A row is a row as a dense table's: stochastic rounding draws with the row, not the key.
//
// In a world of several ranks (open_reference_world) a dynamic table is `world` such indexes, shards, one per
// rank (dispatch::ShardLayout: key_owner, key_capacity), each with its own rows, sketch, touches and counters, their
// clocks ticking together: a batch's keys of a table go to their owners' shards in first-use order, each shard applies
// the rules above with its own capacity, and a batch that one shard cannot fit is refused with nothing changed in
// any. A shard's rows are its own (0 .. key_capacity - 1); the weights are held at their global rows (global_row),
// which stochastic rounding draws with, as the engines see them.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/row_math.hpp"
#include "dispatch/shard_layout.hpp"
#include "host/admission_sketch.hpp"
#include "store/detail/batch_checks.hpp"
#include "store/detail/dynamic_state.hpp"
#include "store/detail/features.hpp"
#include "store/detail/reference_world.hpp"
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

class ReferenceStore final : public Store, public detail::DynamicAccess, public detail::ReferenceWorld {
 public:
  // `world`: checked by open_reference_world, as each dynamic table's plan for it.
  ReferenceStore(StoreConfig config, int world) : Store(std::move(config)), world_(world), features_(config_) {
    for (const auto& t : config_.tables) {
      Table tab;
      tab.spec = t.spec;
      tab.state_dim = optimizer_state_dim(t.spec.optimizer.kind, t.spec.dim);
      tab.weights.resize(static_cast<std::size_t>(t.spec.rows * t.spec.dim));
      tab.state.resize(static_cast<std::size_t>(t.spec.rows * tab.state_dim));
      tab.seed = table_seed(t.spec.init.seed, table_name_hash(t.spec.name));
      if (t.dynamic) {  // its rows get their values when a key is admitted
        tab.dyn_spec = *t.dynamic;
        TableSpec served = t.spec;  // the engines' rows: the capacity and the row of keys without one
        served.rows = t.spec.rows + 1;
        auto layout = dispatch::ShardLayout::make(served, t.sharding, world, static_cast<int>(tables_.size()));
        STRATA_CHECK(layout.is_ok());
        tab.layout = layout.value();
        for (int r = 0; r < world; ++r) {
          const std::int64_t capacity = tab.layout.key_capacity(r);
          tab.shards.push_back(capacity > 0 ? std::make_unique<Dynamic>(*t.dynamic, capacity) : nullptr);
        }
        tables_.push_back(std::move(tab));
        continue;
      }
      for (std::int64_t r = 0; r < t.spec.rows; ++r) {
        init_row(tab.weights.data() + r * t.spec.dim, tab.seed, r, t.spec.dim, t.spec.init.bound);
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
    STRATA_ASSIGN_OR_RETURN(HeldRows rows, admit(id, batch, tables));
    batches_.emplace(id, Entry{std::move(batch), std::move(tables), false, {}, std::move(rows)});
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
      const int table = features_.table_of(e.tables[i]);
      const Table& t = tables_[static_cast<std::size_t>(table)];
      const std::map<Key, std::int64_t>* held = held_rows(e, table);
      const Pooling pooling = features_.features().tables[static_cast<std::size_t>(e.tables[i])].spec.pooling;
      const JaggedKeys& f = e.batch.features[i];
      const MatrixView& view = outputs[i];
      if (t.spec.output_dtype == DType::kF32) {
        pool(t, held, f, pooling, view.data);
        continue;
      }
      // Pooled in fp32, then each element rounded to nearest into the half-size view.
      const auto n = static_cast<std::size_t>(view.rows * view.cols);
      std::vector<float> out(n);
      pool(t, held, f, pooling, out.data());
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
    STRATA_RETURN_IF_ERROR(trains(id));
    STRATA_RETURN_IF_ERROR(
        detail::find_batch(batches_, id, features_.features(), grads, "gradient", true, nullptr).status());
    return detail::check_stream("backward", id, nullptr, stream);
  }

  Status backward(std::int64_t id, const std::vector<ConstMatrixView>& grads) override {
    STRATA_RETURN_IF_ERROR(trains(id));
    STRATA_ASSIGN_OR_RETURN(Entry * found,
                            detail::find_batch(batches_, id, features_.features(), grads, "gradient", true, nullptr));
    Entry& e = *found;
    ++step_;
    for (const auto& [table, mine] : of_tables(e.tables)) {
      Table& t = tables_[static_cast<std::size_t>(table)];
      const std::map<Key, std::int64_t>* held = held_rows(e, table);
      const std::int32_t dim = t.spec.dim;
      std::vector<std::vector<float>> wide(mine.size());
      std::vector<const float*> grad_of;  // per feature of `mine`, fp32
      for (const auto& [feature, i] : mine)
        grad_of.push_back(widened(grads[i], t.spec.output_dtype, wide[grad_of.size()]));
      // Per-row gradient sums, each accumulated in the order its uses appear (bag by bag; in a bag, the table's
      // features in their order, each in its key order), in segments of kGradSegment uses (core/row_math.hpp). All
      // the table's features add to one sum per row: a row two features use gets both in one update. A dynamic table's
      // key without a row at submit adds nothing.
      std::map<std::int64_t, GradSum> sums;  // row -> its sum
      for (std::int64_t b = 0; b < e.batch.batch_size(); ++b) {
        std::size_t n = 0;
        for (const auto& [feature, i] : mine) {
          const JaggedKeys& f = e.batch.features[i];
          const Pooling pooling = features_.features().tables[static_cast<std::size_t>(feature)].spec.pooling;
          const float* w = f.weights.empty() ? nullptr : f.weights.data();
          const float* grad = grad_of[n++];
          const std::int64_t lo = f.offset(b), hi = f.offset(b + 1);
          for (std::int64_t j = lo; j < hi; ++j) {
            const auto row = held ? held->find(f.key(j)) : std::map<Key, std::int64_t>::const_iterator{};
            if (held && row == held->end()) continue;
            GradSum& sum = sums[held ? row->second : f.key(j)];
            if (pooling == Pooling::kNone) {
              sum.add(grad + j * dim, grad_scale(Pooling::kNone, 1, w, j), dim);
            } else {
              sum.add(grad + b * dim, grad_scale(pooling, hi - lo, w, j), dim);
            }
          }
        }
      }
      const OptimizerStep st = make_optimizer_step(t.spec, step_);
      for (auto& [row, sum] : sums) {
        apply_optimizer(st, t.row(row), t.state_of(row), sum.finish(dim), dim);
        t.store(st.round, row);
      }
    }
    release(e);
    batches_.erase(id);
    return Status::ok();
  }

  Status discard(std::int64_t id) override {
    auto it = batches_.find(id);
    if (it == batches_.end()) return detail::unknown_batch(id);
    release(it->second);
    batches_.erase(it);
    return Status::ok();
  }
  Status flush() override { return Status::ok(); }
  std::int64_t in_flight() const noexcept override { return static_cast<std::int64_t>(batches_.size()); }

  Result<std::vector<Key>> keys_held(int table) const override {
    STRATA_ASSIGN_OR_RETURN(const Table* t, dynamic_table("keys_held", table));
    std::vector<Key> keys;
    for (const auto& d : t->shards)
      if (d)
        for (const auto& [key, row] : d->row_of) keys.push_back(key);
    std::sort(keys.begin(), keys.end());
    return keys;
  }
  Status read_keys(int table, const std::vector<Key>& keys, float* weights, float* state) override {
    STRATA_ASSIGN_OR_RETURN(const Table* found, dynamic_table("read_keys", table));
    const Table& t = *found;
    const auto n = static_cast<std::int64_t>(keys.size());
    if (n == 0) return Status::ok();  // the buffers may be null
    if (!weights) return null_weights("read_keys", t.spec, n);
    std::vector<std::int64_t> rows;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const int shard = t.layout.key_owner(keys[i]);
      const Dynamic& d = t.shard(shard);
      const auto it = d.row_of.find(keys[i]);
      if (it == d.row_of.end()) return detail::key_without_row(t.spec, keys[i], i);
      rows.push_back(t.layout.global_row(shard, it->second));
    }
    for (std::size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(weights + i * t.spec.dim, t.row(rows[i]), sizeof(float) * static_cast<std::size_t>(t.spec.dim));
      if (state && t.state_dim)
        std::memcpy(state + i * t.state_dim, t.state.data() + rows[i] * t.state_dim,
                    sizeof(float) * static_cast<std::size_t>(t.state_dim));
    }
    return Status::ok();
  }
  Status read_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) override {
    STRATA_RETURN_IF_ERROR(detail::dense_only("read_rows", table, config_));
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
    STRATA_RETURN_IF_ERROR(detail::dense_only("write_rows", table, config_));
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

  StoreStats stats() const override {
    StoreStats s;
    for (const Table& t : tables_) {
      if (!t.dynamic()) continue;
      DynamicStats d;  // the shards' counters summed
      for (const auto& shard : t.shards) {
        if (!shard) continue;
        DynamicStats x = shard->stats;
        x.rows = static_cast<std::int64_t>(shard->row_of.size());
        d += x;
      }
      d.capacity = t.spec.rows;
      s.dynamic.emplace_back(t.spec.name, d);
    }
    return s;
  }

 protected:
  int reference_world() const noexcept override { return world_; }
  // Each table keeps its own copy of the spec.
  void learning_rate_changed(int table, float learning_rate) override {
    tables_[static_cast<std::size_t>(table)].spec.optimizer.learning_rate = learning_rate;
  }
  // The rows in use by touch (the tie order), the clock, the sketch as KeyIndex writes it (none for admit_after <= 1).
  // In a world: shard 0's entries, then shard 1's, ..., with the shards' own rows, and the shards' sketches one after
  // the other (a rank holding none of the keys has none).
  Status read_dynamic(int table, detail::DynamicState& out) override {
    STRATA_ASSIGN_OR_RETURN(const Table* found, dynamic_table("read_dynamic", table));
    const Table& t = *found;
    out = detail::DynamicState{};
    for (std::size_t r = 0; r < t.shards.size(); ++r) {
      if (!t.shards[r]) continue;
      const Dynamic& d = *t.shards[r];
      std::vector<std::int64_t> rows;
      for (const auto& [key, row] : d.row_of) rows.push_back(row);
      std::sort(rows.begin(), rows.end(), [&](std::int64_t a, std::int64_t b) {
        return d.slots[static_cast<std::size_t>(a)].touch < d.slots[static_cast<std::size_t>(b)].touch;
      });
      out.clock = d.clock;  // the same in every shard
      if (d.spec.admit_after > 1) {
        const std::vector<std::uint8_t> sketch = d.sketch.state();
        out.sketch.insert(out.sketch.end(), sketch.begin(), sketch.end());
      }
      for (const std::int64_t l : rows) {
        const Slot& s = d.slots[static_cast<std::size_t>(l)];
        out.entries.push_back(KeyIndex::Entry{s.key, l, s.last_use, s.count});
        const Key g = t.layout.global_row(static_cast<int>(r), l);
        out.weights.insert(out.weights.end(), t.row(g), t.row(g) + t.spec.dim);
        const float* st = t.state.data() + g * t.state_dim;
        out.state.insert(out.state.end(), st, st + t.state_dim);
      }
    }
    return Status::ok();
  }
  // Trusts `in` (checked by the caller) but for what a world adds: each entry goes to its key's shard, whose capacity
  // its row must be below, and the sketch is the shards' in order. Each entry's row takes its key, touched in order; an
  // empty sketch is zeroed. Refused with nothing changed. (Store::write_keys, giving its i-th key row i, thus holds in
  // a world only while each key's position is below its shard's capacity.)
  Status write_dynamic(int table, const detail::DynamicState& in) override {
    STRATA_RETURN_IF_ERROR(dynamic_table("write_dynamic", table).status());
    Table& t = tables_[static_cast<std::size_t>(table)];
    const int world = t.layout.world();
    const std::string who = "write_dynamic: table '" + t.spec.name + "': ";
    std::vector<AdmissionSketch> sketches;  // per shard (a rank without one: an unused empty sketch)
    std::size_t at = 0, total = 0;
    for (const auto& d : t.shards) {
      sketches.emplace_back(d ? AdmissionSketch(static_cast<std::int64_t>(d->slots.size())) : AdmissionSketch());
      total += d ? static_cast<std::size_t>(sketches.back().state_bytes()) : 0;
    }
    if (!in.sketch.empty() && world == 1 && !sketches[0].restore_state(in.sketch))
      return Status::invalid_argument("write_dynamic: a sketch of another size");
    if (!in.sketch.empty() && world > 1) {
      if (in.sketch.size() != total)
        return Status::invalid_argument(who + "a sketch of " + std::to_string(in.sketch.size()) + " bytes (expected " +
                                        std::to_string(total) + ": its " + std::to_string(world) +
                                        " shards' sketches in shard order)");
      for (std::size_t r = 0; r < t.shards.size(); ++r) {
        if (!t.shards[r]) continue;
        const auto n = static_cast<std::size_t>(sketches[r].state_bytes());
        const auto from = in.sketch.begin() + static_cast<std::ptrdiff_t>(at);
        if (!sketches[r].restore_state(std::vector<std::uint8_t>(from, from + static_cast<std::ptrdiff_t>(n))))
          return Status::invalid_argument(who + "the sketch of shard " + std::to_string(r) + " of " +
                                          std::to_string(world) +
                                          " is not one (its uses added reach the aging "
                                          "threshold)");
        at += n;
      }
    }
    for (std::size_t i = 0; i < in.entries.size(); ++i) {
      const KeyIndex::Entry& e = in.entries[i];
      const int r = t.layout.key_owner(e.key);
      const auto capacity = t.layout.key_capacity(r);
      if (e.row < 0 || e.row >= capacity)
        return Status::invalid_argument(who + "key " + std::to_string(e.key) + " (entry " + std::to_string(i) +
                                        ") at row " + std::to_string(e.row) + " of shard " + std::to_string(r) +
                                        " of " + std::to_string(world) + " (expected a row below its capacity, " +
                                        std::to_string(capacity) + ")");
    }
    for (std::size_t r = 0; r < t.shards.size(); ++r) {
      if (!t.shards[r]) continue;
      Dynamic& d = *t.shards[r];
      d.sketch = std::move(sketches[r]);
      d.row_of.clear();
      d.slots.assign(d.slots.size(), Slot{});
      d.clock = in.clock;
      d.touches = 0;
    }
    for (std::size_t i = 0; i < in.entries.size(); ++i) {
      const KeyIndex::Entry& e = in.entries[i];
      const int r = t.layout.key_owner(e.key);
      Dynamic& d = t.shard(r);
      d.slots[static_cast<std::size_t>(e.row)] = Slot{true, e.key, e.last_use, e.count, ++d.touches, 0};
      d.row_of[e.key] = e.row;
      const Key g = t.layout.global_row(r, e.row);
      std::memcpy(t.row(g), in.weights.data() + i * static_cast<std::size_t>(t.spec.dim),
                  sizeof(float) * static_cast<std::size_t>(t.spec.dim));
      round_to_nearest(t.row(g), t.spec.dim, t.spec.dtype);
      if (t.state_dim == 0) continue;  // sgd: no state (and no buffer to copy from)
      std::memcpy(t.state_of(g), in.state.data() + i * static_cast<std::size_t>(t.state_dim),
                  sizeof(float) * static_cast<std::size_t>(t.state_dim));
      round_to_nearest(t.state_of(g), t.state_dim, t.spec.state_dtype);
    }
    return Status::ok();
  }

 private:
  // One row of a dynamic table.
  struct Slot {
    bool held = false;  // a key has this row
    Key key = 0;
    std::int64_t last_use = 0;  // the clock of the last training batch that used it
    std::int64_t count = 0;     // uses since it was admitted
    std::int64_t touch = 0;     // when it was last touched (hit or admitted), in first-use order
    std::int64_t pins = 0;      // batches in flight that use it
  };
  // A dynamic table's keys and rows (in a world: one shard's, its rows the shard's own).
  struct Dynamic {
    Dynamic(const DynamicSpec& s, std::int64_t capacity)
        : spec(s), sketch(capacity), slots(static_cast<std::size_t>(capacity)) {}
    DynamicSpec spec;
    AdmissionSketch sketch;
    std::map<Key, std::int64_t> row_of;  // key -> row
    std::vector<Slot> slots;             // (capacity)
    std::int64_t clock = 0, touches = 0;
    DynamicStats stats;  // its counters (rows, capacity: filled in by stats())
  };
  struct Table {
    TableSpec spec;
    std::int32_t state_dim = 0;
    std::uint64_t seed = 0;      // table_seed of the table
    std::vector<float> weights;  // (rows, dim)
    std::vector<float> state;    // (rows, state_dim)
    // A dynamic table's: its options, its shards (one per rank of the world; null: a rank holding none of its keys;
    // none: a dense table), and the layout that says which shard holds a key and the global row of a shard's row.
    DynamicSpec dyn_spec;
    std::vector<std::unique_ptr<Dynamic>> shards;
    dispatch::ShardLayout layout;
    bool dynamic() const noexcept { return !shards.empty(); }
    Dynamic& shard(int r) { return *shards[static_cast<std::size_t>(r)]; }
    const Dynamic& shard(int r) const { return *shards[static_cast<std::size_t>(r)]; }
    float* row(Key k) { return weights.data() + k * spec.dim; }
    const float* row(Key k) const { return weights.data() + k * spec.dim; }
    float* state_of(Key k) { return state.data() + k * state_dim; }
    // What key k of a dynamic table reads without a row (dim floats into `out`): its initial values, as dense row k
    // starts, or zeros.
    const float* unseen(Key k, std::vector<float>& out) const {
      out.assign(static_cast<std::size_t>(spec.dim), 0.0f);
      if (dyn_spec.unseen == Unseen::kInitial) {
        init_row(out.data(), seed, k, spec.dim, spec.init.bound);
        round_to_nearest(out.data(), spec.dim, spec.dtype);
      }
      return out.data();
    }
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
  // A dynamic table's keys of a batch that have a row (key -> global row), pinned while the batch is in flight.
  using HeldRows = std::map<int, std::map<Key, std::int64_t>>;  // per dynamic table of the batch

  // The fp32 outputs of feature f of table t, pooled by `pooling`, into `out` (output_rows x dim). `held`: a dynamic
  // table's rows of the batch's keys (null for a dense table, whose key is its row).
  static void pool(const Table& t, const std::map<Key, std::int64_t>* held, const JaggedKeys& f, Pooling pooling,
                   float* out) {
    const std::int32_t dim = t.spec.dim;
    const float* w = f.weights.empty() ? nullptr : f.weights.data();
    std::vector<float> scratch;
    const auto row_of = [&](Key k) -> const float* {
      if (!held) return t.row(k);
      const auto it = held->find(k);
      return it == held->end() ? t.unseen(k, scratch) : t.row(it->second);
    };
    if (pooling == Pooling::kNone) {
      for (std::int64_t j = 0; j < f.num_keys(); ++j) {
        // The row, or the weight times it (not 0 + w * row: the sign of a zero must survive).
        float* o = out + j * dim;
        const float* row = row_of(f.key(j));
        for (std::int32_t c = 0; c < dim; ++c) o[c] = w ? w[j] * row[c] : row[c];
      }
      return;
    }
    for (std::int64_t b = 0; b < f.batch_size(); ++b) {
      float* o = out + b * dim;
      for (std::int32_t c = 0; c < dim; ++c) o[c] = 0.0f;
      const std::int64_t lo = f.offset(b), hi = f.offset(b + 1);
      for (std::int64_t j = lo; j < hi; ++j) row_axpy(o, row_of(f.key(j)), w ? w[j] : 1.0f, dim);
      if (pooling == Pooling::kMean && hi > lo) row_scale(o, bag_scale(pooling, hi - lo), dim);
    }
  }

  struct Entry {
    KeyBatch batch;
    std::vector<int> tables;
    bool forwarded = false;
    std::vector<MemorySpace> spaces;  // of forward's outputs, per feature
    HeldRows held;                    // of its dynamic tables
  };

  // Backward refuses an evaluation batch (an unknown id is left to find_batch).
  Status trains(std::int64_t id) const {
    const auto it = batches_.find(id);
    if (it == batches_.end() || it->second.batch.train) return Status::ok();
    return detail::evaluation_backward(id);
  }

  static const std::map<Key, std::int64_t>* held_rows(const Entry& e, int table) {
    const auto it = e.held.find(table);
    return it == e.held.end() ? nullptr : &it->second;
  }

  // The batch's features of each table, in the table's feature order (features_ lists them so): table -> feature ->
  // position in the batch.
  std::map<int, std::map<int, std::size_t>> of_tables(const std::vector<int>& features) const {
    std::map<int, std::map<int, std::size_t>> of_table;
    for (std::size_t i = 0; i < features.size(); ++i) of_table[features_.table_of(features[i])][features[i]] = i;
    return of_table;
  }

  // A table's distinct keys in a batch, in first-use order (bag by bag, its features in order, each in key order),
  // with their uses.
  static std::vector<std::pair<Key, std::int64_t>> first_uses(const KeyBatch& batch,
                                                              const std::map<int, std::size_t>& mine) {
    std::vector<std::pair<Key, std::int64_t>> keys;
    std::map<Key, std::size_t> at;
    for (std::int64_t b = 0; b < batch.batch_size(); ++b) {
      for (const auto& [feature, i] : mine) {
        const JaggedKeys& f = batch.features[i];
        for (std::int64_t j = f.offset(b); j < f.offset(b + 1); ++j) {
          const auto [it, fresh] = at.emplace(f.key(j), keys.size());
          if (fresh) keys.emplace_back(f.key(j), 0);
          ++keys[it->second].second;
        }
      }
    }
    return keys;
  }

  // What a training batch does to one shard of a dynamic table, decided before anything changes.
  struct Plan {
    int table = 0, shard = 0;
    std::vector<std::pair<Key, std::int64_t>> keys;  // the shard's, distinct, first-use order, with uses
    std::vector<char> admit;                         // per key: without a row and admitted
    std::vector<char> used;                          // per row: used by this batch
  };

  // The admissions of a training batch's shard of a dynamic table, or ResourceExhausted when they cannot fit beside the
  // rows this batch and the batches in flight pin.
  Status plan(std::int64_t id, const Table& t, Plan& p) const {
    const Dynamic& d = t.shard(p.shard);
    p.used.assign(d.slots.size(), 0);
    std::int64_t admitted = 0;
    for (const auto& [key, uses] : p.keys) {
      const auto it = d.row_of.find(key);
      if (it != d.row_of.end()) p.used[static_cast<std::size_t>(it->second)] = 1;
      const bool in =
          it == d.row_of.end() &&
          (d.spec.admit_after <= 1 || static_cast<std::int64_t>(d.sketch.estimate(key)) + uses >= d.spec.admit_after);
      p.admit.push_back(in ? 1 : 0);
      admitted += in ? 1 : 0;
    }
    std::int64_t free = 0, evictable = 0;
    for (std::size_t r = 0; r < d.slots.size(); ++r) {
      if (!d.slots[r].held)
        ++free;
      else if (d.slots[r].pins == 0 && !p.used[r])
        ++evictable;
    }
    if (admitted <= free + evictable) return Status::ok();
    const auto capacity = static_cast<std::int64_t>(d.slots.size());
    const int world = t.layout.world();
    const std::string shard =
        world > 1 ? ", shard " + std::to_string(p.shard) + " of " + std::to_string(world) : std::string();
    return Status::resource_exhausted("batch " + std::to_string(id) + ": table '" + t.spec.name + "'" + shard + ": " +
                                      std::to_string(admitted) + " new keys need rows: " + std::to_string(free) +
                                      " free and " + std::to_string(evictable) + " evictable of capacity " +
                                      std::to_string(capacity) + " (" + std::to_string(capacity - free - evictable) +
                                      " rows pinned by batches in flight)");
  }

  // Row r of a dynamic table loses its key.
  static void drop(Dynamic& d, std::int64_t r) {
    Slot& s = d.slots[static_cast<std::size_t>(r)];
    d.row_of.erase(s.key);
    s = Slot{};
  }

  // The unpinned row, not used by this batch, first in the eviction order (-1: none).
  static std::int64_t victim(const Dynamic& d, const std::vector<char>& used) {
    std::int64_t best = -1;
    for (std::size_t r = 0; r < d.slots.size(); ++r) {
      const Slot& s = d.slots[r];
      if (!s.held || s.pins > 0 || used[r]) continue;
      if (best >= 0) {
        const Slot& b = d.slots[static_cast<std::size_t>(best)];
        const bool lfu = d.spec.eviction == Eviction::kLfu;
        if (std::make_tuple(lfu ? s.count : 0, s.last_use, s.touch) >=
            std::make_tuple(lfu ? b.count : 0, b.last_use, b.touch))
          continue;
      }
      best = static_cast<std::int64_t>(r);
    }
    return best;
  }

  // A training batch's keys of a shard of a dynamic table at its clock (after plan()): hits, the sketch, the TTL,
  // admissions. `held` gets global rows.
  void train(Table& t, Plan& p, std::map<Key, std::int64_t>& held) {
    Dynamic& d = t.shard(p.shard);
    const std::int64_t now = d.clock;
    for (const auto& [key, uses] : p.keys)
      if (!d.row_of.count(key)) d.sketch.add(key, uses);
    d.sketch.age();
    const std::int64_t ttl = d.spec.evict_after_steps;
    for (std::size_t r = 0; r < d.slots.size() && ttl > 0; ++r) {
      const Slot& s = d.slots[r];
      if (s.held && s.pins == 0 && !p.used[r] && now - s.last_use > ttl) {
        drop(d, static_cast<std::int64_t>(r));
        ++d.stats.expirations;
      }
    }
    for (std::size_t i = 0; i < p.keys.size(); ++i) {
      const auto [key, uses] = p.keys[i];
      const auto it = d.row_of.find(key);
      if (it != d.row_of.end()) {  // a hit
        Slot& s = d.slots[static_cast<std::size_t>(it->second)];
        s.last_use = now;
        s.count += uses;
        s.touch = ++d.touches;
        held[key] = t.layout.global_row(p.shard, it->second);
        continue;
      }
      if (!p.admit[i]) {
        d.stats.not_admitted += uses;
        continue;
      }
      std::int64_t row = -1;
      for (std::size_t r = 0; r < d.slots.size() && row < 0; ++r)
        if (!d.slots[r].held) row = static_cast<std::int64_t>(r);
      if (row < 0) {
        row = victim(d, p.used);  // plan() counted one for each admitted key
        drop(d, row);
        ++d.stats.evictions;
      }
      d.slots[static_cast<std::size_t>(row)] = Slot{true, key, now, uses, ++d.touches, 0};
      d.row_of[key] = row;
      p.used[static_cast<std::size_t>(row)] = 1;
      ++d.stats.admissions;
      const Key g = t.layout.global_row(p.shard, row);
      init_row(t.row(g), t.seed, key, t.spec.dim, t.spec.init.bound);
      round_to_nearest(t.row(g), t.spec.dim, t.spec.dtype);
      init_state(t.state_of(g), t.spec.optimizer, t.state_dim);
      round_to_nearest(t.state_of(g), t.state_dim, t.spec.state_dtype);
      held[key] = g;
    }
  }

  // The plans of a batch's keys of table t (empty: none), one per shard of the table, each with the keys its shard
  // holds in first-use order.
  static std::vector<Plan> shard_plans(int table, const Table& t,
                                       const std::vector<std::pair<Key, std::int64_t>>& keys) {
    std::vector<Plan> plans;
    std::vector<std::size_t> at(t.shards.size());  // shard -> its plan
    for (std::size_t r = 0; r < t.shards.size(); ++r) {
      if (!t.shards[r]) continue;
      at[r] = plans.size();
      plans.emplace_back();
      plans.back().table = table;
      plans.back().shard = static_cast<int>(r);
    }
    for (const auto& ku : keys) plans[at[static_cast<std::size_t>(t.layout.key_owner(ku.first))]].keys.push_back(ku);
    return plans;
  }

  // Gives the keys of a batch's dynamic tables their rows and pins them: a training batch advances every dynamic
  // table's clock (every shard's) and admits (train()); an evaluation batch reads the rows there are. Refused (nothing
  // changed) when a shard's admitted keys cannot fit.
  Result<HeldRows> admit(std::int64_t id, const KeyBatch& batch, const std::vector<int>& features) {
    std::vector<Plan> plans;
    for (const auto& [table, mine] : of_tables(features)) {
      const Table& t = tables_[static_cast<std::size_t>(table)];
      if (!t.dynamic()) continue;
      for (Plan& p : shard_plans(table, t, first_uses(batch, mine))) {
        if (batch.train) STRATA_RETURN_IF_ERROR(plan(id, t, p));
        plans.push_back(std::move(p));
      }
    }
    // Every training batch is one at every dynamic table's clock: a table the batch has no keys of expires rows too.
    if (batch.train) {
      for (std::size_t table = 0; table < tables_.size(); ++table) {
        const auto has = [&](const Plan& p) { return p.table == static_cast<int>(table); };
        if (!tables_[table].dynamic() || std::any_of(plans.begin(), plans.end(), has)) continue;
        for (Plan& p : shard_plans(static_cast<int>(table), tables_[table], {})) {
          STRATA_RETURN_IF_ERROR(plan(id, tables_[table], p));  // no keys: fits
          plans.push_back(std::move(p));
        }
      }
    }
    if (batch.train)
      for (Table& t : tables_)
        for (auto& d : t.shards)
          if (d) ++d->clock;
    HeldRows held;
    for (Plan& p : plans) {
      Table& t = tables_[static_cast<std::size_t>(p.table)];
      Dynamic& d = t.shard(p.shard);
      std::map<Key, std::int64_t>& mine = held[p.table];
      if (batch.train) {
        train(t, p, mine);
      } else {
        for (const auto& [key, uses] : p.keys) {
          const auto it = d.row_of.find(key);
          if (it != d.row_of.end())
            mine[key] = t.layout.global_row(p.shard, it->second);
          else
            d.stats.unseen += uses;
        }
      }
    }
    for (const auto& [table, mine] : held) pin(table, mine, 1);
    return held;
  }

  // Adds `by` to the pins of the rows of a batch's keys of a table (key -> global row).
  void pin(int table, const std::map<Key, std::int64_t>& rows, std::int64_t by) {
    Table& t = tables_[static_cast<std::size_t>(table)];
    for (const auto& [key, row] : rows)
      t.shard(t.layout.key_owner(key)).slots[static_cast<std::size_t>(t.layout.local_row(row))].pins += by;
  }

  // Unpins what admit() pinned for a batch.
  void release(const Entry& e) {
    for (const auto& [table, mine] : e.held) pin(table, mine, -1);
  }

  // Table `table` if it is dynamic: NotFound for an unknown index, InvalidArgument for a dense table (`op` names the
  // call).
  Result<const Table*> dynamic_table(const char* op, int table) const {
    STRATA_RETURN_IF_ERROR(detail::dynamic_only(op, table, config_));
    return &tables_[static_cast<std::size_t>(table)];
  }
  int world_;                    // open_reference_world's
  detail::FeatureMap features_;  // the store's features (a table's own name when it lists none)
  std::vector<Table> tables_;
  std::unordered_map<std::int64_t, Entry> batches_;
  detail::PreviewIds previews_;  // previewed, not yet submitted
};

}  // namespace

Result<std::unique_ptr<Store>> open_reference_store(const StoreConfig& config) {
  return open_reference_world(config, 1);
}

Result<std::unique_ptr<Store>> open_reference_world(const StoreConfig& config, int world) {
  STRATA_RETURN_IF_ERROR(validate(config));
  if (world < 1)
    return Status::invalid_argument("open_reference_world: a world of " + std::to_string(world) +
                                    " ranks (expected at least 1)");
  for (const TableConfig& t : config.tables)
    if (t.dynamic) STRATA_RETURN_IF_ERROR(dispatch::validate_dynamic_plan(t.spec, t.sharding, world));
  return std::unique_ptr<Store>(std::make_unique<ReferenceStore>(config, world));
}

}  // namespace strata
