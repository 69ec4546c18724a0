#include "store/detail/dynamic_keys.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <utility>

#include "core/half.hpp"
#include "core/row_math.hpp"
#include "host/dedup.hpp"

namespace strata::detail {

DynamicKeys::DynamicKeys(const StoreConfig& config, dispatch::Communicator* comm) : comm_(comm) {
  for (std::size_t t = 0; t < config.tables.size(); ++t) {
    const TableConfig& tc = config.tables[t];
    if (!tc.dynamic) continue;
    Table x;
    x.table = static_cast<int>(t);
    x.spec = tc.spec;
    x.dyn = *tc.dynamic;
    x.seed = table_seed(tc.spec.init.seed, table_name_hash(tc.spec.name));
    x.capacity = tc.spec.rows;
    if (comm) {  // the store validated the plan (dispatch::validate_dynamic_plan)
      TableSpec served = tc.spec;
      served.rows = tc.spec.rows + 1;
      auto layout = dispatch::ShardLayout::make(served, tc.sharding, comm->size(), static_cast<int>(t));
      STRATA_CHECK(layout.is_ok());
      x.layout = layout.value();
      x.capacity = x.layout.key_capacity(comm->rank());
    }
    // A table-wise shard of another rank holds no key: an index of one row that none is ever routed to, counting none
    // (no admission sketch: its state, read and restored, is empty).
    DynamicSpec spec = *tc.dynamic;
    if (x.capacity == 0) spec.admit_after = 1;
    x.index = std::make_unique<KeyIndex>(std::max<std::int64_t>(x.capacity, 1), spec);
    tables_.push_back(std::move(x));
  }
}

void DynamicKeys::engine_rows(int table, std::vector<std::int64_t>& rows) const {
  const Table* t = find(table);
  if (!comm_ || !t) return;
  for (std::int64_t& r : rows) r = t->layout.global_row(comm_->rank(), r);
}

int DynamicKeys::owner(int table, Key key) const {
  const Table* t = find(table);
  return comm_ && t ? t->layout.key_owner(key) : 0;
}

DynamicKeys::Table* DynamicKeys::find(int table) {
  for (Table& t : tables_)
    if (t.table == table) return &t;
  return nullptr;
}
const DynamicKeys::Table* DynamicKeys::find(int table) const {
  for (const Table& t : tables_)
    if (t.table == table) return &t;
  return nullptr;
}

const KeyIndex* DynamicKeys::index(int table) const {
  const Table* t = find(table);
  return t ? t->index.get() : nullptr;
}
KeyIndex* DynamicKeys::index(int table) {
  Table* t = find(table);
  return t ? t->index.get() : nullptr;
}

namespace {
bool ok(const std::vector<Status>& status) {
  return std::all_of(status.begin(), status.end(), [](const Status& s) { return s.is_ok(); });
}
}  // namespace

Result<Admitted> DynamicKeys::admit(TableBatch& tb, bool train, std::int64_t id, const Reset& reset) {
  if (comm_) return admit_world(tb, train, id, reset);
  const std::size_t n = tb.batch.features.size();
  Admitted a;
  a.rows.resize(n);
  a.missing_at.resize(n);
  a.missing_key.resize(n);
  // Each dynamic entry's distinct keys in first-use order and their uses; every table checked before any changes.
  // The tables side by side (each index is its own; a batch has one entry per table).
  std::vector<Status> status(n);
  const auto each_entry = [&](auto&& work) {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 1), [&](const tbb::blocked_range<std::size_t>& r) {
      for (std::size_t e = r.begin(); e < r.end(); ++e)
        if (Table* t = find(tb.tables[e])) work(e, *t);
    });
  };
  each_entry([&](std::size_t e, Table& t) {
    const JaggedKeys& f = tb.batch.features[e];
    dedup_keys(f.keys.data(), static_cast<std::int64_t>(f.keys.size()), t.unique, t.scratch, DedupOrder::kFirstUse);
    std::vector<std::int64_t>& u = t.uses;
    u.resize(t.unique.keys.size());
    for (std::size_t i = 0; i < u.size(); ++i) u[i] = t.unique.offsets[i + 1] - t.unique.offsets[i];
    // A batch whose distinct keys fit beside the rows earlier batches pin cannot be refused (its admissions and its
    // hits no earlier batch pins are at most its distinct keys): no need to look them up twice.
    const bool fits = t.index->capacity() - t.index->pinned() >= static_cast<std::int64_t>(u.size());
    if (train && !fits) status[e] = t.index->check(t.unique.keys, u).with_context("table '" + t.spec.name + "'");
  });
  for (const Status& st : status) STRATA_RETURN_IF_ERROR(st);
  each_entry([&](std::size_t e, Table& t) {
    std::vector<std::int64_t>& rows = a.rows[e];
    t.made.clear();
    if (train) {
      // Checked above: train() applies (a failure here would be a bug of check()).
      STRATA_CHECK(t.index->train(t.unique.keys, t.uses, rows, t.made).is_ok());
    } else {
      t.index->find(t.unique.keys, t.uses, rows);
    }
    new_rows(t);
    translate(t, t.scratch.uid, rows, tb.batch.features[e], a.missing_at[e], a.missing_key[e]);
  });
  // The engines write the new rows one table at a time (an engine is not thread-safe; several tables share one).
  for (std::size_t e = 0; e < n && ok(status); ++e) {
    const Table* t = find(tb.tables[e]);
    if (t && !t->fresh.rows.empty()) status[e] = reset(t->table, t->fresh.rows, t->fresh.w.data(), t->fresh.s.data());
  }
  // Every training submit advances every dynamic table's clock (and its TTL), whether or not the batch has its keys.
  if (train) {
    for (Table& t : tables_) {
      if (std::find(tb.tables.begin(), tb.tables.end(), t.table) != tb.tables.end()) continue;
      std::vector<std::int64_t> rows;
      STRATA_CHECK(t.index->train({}, {}, rows, t.made).is_ok());
    }
  }
  // Rows an engine could not write (a failed device, no pinned memory) fail the submit: the batch's pins are released
  // and the keys given rows whose writes failed or were not made take none (KeyIndex::forget), so that no key reads
  // another's row; the keys evicted for them stay evicted.
  if (ok(status)) return a;
  release(tb, a);
  bool failed = false;
  for (std::size_t e = 0; e < n; ++e) {
    failed = failed || !status[e].is_ok();
    Table* t = find(tb.tables[e]);
    if (failed && t) t->index->forget(t->fresh.rows);
  }
  for (const Status& st : status)
    if (!st.is_ok()) return st;
  return a;
}

void DynamicKeys::new_rows(Table& t) {
  const std::int32_t dim = t.spec.dim;
  const std::int32_t sd = optimizer_state_dim(t.spec.optimizer.kind, dim);
  NewRows& x = t.fresh;
  x.rows.resize(t.made.size());
  x.w.resize(t.made.size() * static_cast<std::size_t>(dim));
  x.s.resize(t.made.size() * static_cast<std::size_t>(sd));
  for (std::size_t i = 0; i < t.made.size(); ++i) {
    x.rows[i] = t.made[i].first;
    init_row(x.w.data() + i * static_cast<std::size_t>(dim), t.seed, t.made[i].second, dim, t.spec.init.bound);
    init_state(x.s.data() + i * static_cast<std::size_t>(sd), t.spec.optimizer, sd);
  }
}

void DynamicKeys::translate(const Table& t, const std::vector<std::int32_t>& uid, const std::vector<std::int64_t>& rows,
                            JaggedKeys& f, std::vector<std::int64_t>& missing_at, std::vector<Key>& missing_key) {
  // The keys become rows; a key without one reads the table's last row, replaced at forward. Positions ascend.
  for (std::size_t j = 0; j < f.keys.size(); ++j) {
    const std::int64_t row = rows[static_cast<std::size_t>(uid[j])];
    if (row != KeyIndex::kNone) {
      f.keys[j] = row;
      continue;
    }
    missing_at.push_back(static_cast<std::int64_t>(j));
    missing_key.push_back(f.keys[j]);
    f.keys[j] = t.spec.rows;
  }
}

void DynamicKeys::release(const TableBatch& tb, const Admitted& a) {
  for (std::size_t j = 0; j < a.held.size(); ++j) tables_[j].index->release(a.held[j]);
  for (std::size_t e = 0; e < a.rows.size(); ++e) {
    Table* t = find(tb.tables[e]);
    if (t) t->index->release(a.rows[e]);
  }
}

void DynamicKeys::fill_missing(const TableBatch& tb, const Admitted& a, const std::vector<float*>& rows) const {
  for (std::size_t e = 0; e < a.missing_at.size(); ++e) {
    const Table* t = find(tb.tables[e]);
    if (!t || a.missing_at[e].empty()) continue;
    const std::int32_t dim = t->spec.dim;
    for (std::size_t i = 0; i < a.missing_at[e].size(); ++i) {
      float* r = rows[e] + a.missing_at[e][i] * dim;
      if (t->dyn.unseen == Unseen::kZeros) {
        std::fill(r, r + dim, 0.0f);
        continue;
      }
      // What a row of this key would start as: the initial values rounded into the table's dtype.
      init_row(r, t->seed, a.missing_key[e][i], dim, t->spec.init.bound);
      if (t->spec.dtype != DType::kF32)
        for (std::int32_t c = 0; c < dim; ++c) r[c] = rounded(t->spec.dtype, r[c], false, 0);
    }
  }
}

void DynamicKeys::drop_missing(const TableBatch& tb, const Admitted& a, const std::vector<float*>& grads) const {
  for (std::size_t e = 0; e < a.missing_at.size(); ++e) {
    const Table* t = find(tb.tables[e]);
    if (!t) continue;
    const std::int32_t dim = t->spec.dim;
    for (const std::int64_t at : a.missing_at[e]) std::fill(grads[e] + at * dim, grads[e] + (at + 1) * dim, 0.0f);
  }
}

void DynamicKeys::stats(std::vector<std::pair<std::string, DynamicStats>>& out) const {
  for (const Table& t : tables_) {
    const KeyIndex& x = *t.index;
    const KeyIndex::Counts c = x.counts();
    DynamicStats s;
    s.rows = x.size();
    s.capacity = t.capacity;
    s.admissions = c.admissions;
    s.evictions = c.evictions;
    s.expirations = c.expirations;
    s.not_admitted = c.not_admitted;
    s.unseen = c.unseen;
    s.index_bytes = x.bytes();
    out.emplace_back(t.spec.name, s);
  }
}

}  // namespace strata::detail
