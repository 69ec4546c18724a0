#include "store/engines/cpu_engine.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cstring>
#include <unordered_map>

#include "host/kernels.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

BagsView bags_of(const JaggedKeys& f) {
  BagsView v;
  v.offsets = f.offsets.data();
  v.batch = f.batch_size();
  v.keys = f.keys.data();
  v.weights = f.weights.empty() ? nullptr : f.weights.data();
  return v;
}

void HostTableOps::forward(const JaggedKeys& f, float* out) const {
  if (table_.spec().pooling == Pooling::kNone) {
    gather_rows(table_.ref(), f.keys.data(), f.weights.empty() ? nullptr : f.weights.data(), f.num_keys(), out);
  } else {
    gather_pool(table_.ref(), bags_of(f), table_.spec().pooling, out);
  }
}

void HostTableOps::backward(const JaggedKeys& f, const float* grads, const OptimizerStep& step) {
  // Repeated keys are only needed by backward, so they are found here: inference never pays for
  // it. Rows used once are updated straight from their bag's gradient.
  if (table_.spec().pooling != Pooling::kNone) bag_of_positions(f.offsets.data(), f.batch_size(), bag_of_);
  find_repeats(f.keys.data(), f.num_keys(), table_.spec().rows, repeats_, scratch_);
  backward_update_by_bag(table_.ref(), bags_of(f), table_.spec().pooling, repeats_, bag_of_.data(), grads, step);
}

void HostTableOps::read_rows(std::int64_t row0, std::int64_t n, float* weights, float* state) const {
  const std::size_t dim = static_cast<std::size_t>(table_.dim()), sd = static_cast<std::size_t>(table_.state_dim());
  for (std::int64_t i = 0; i < n; ++i) {
    const float* rec = table_.row(row0 + i);
    std::memcpy(weights + static_cast<std::size_t>(i) * dim, rec, dim * sizeof(float));
    if (state && sd) std::memcpy(state + static_cast<std::size_t>(i) * sd, rec + dim, sd * sizeof(float));
  }
}

void HostTableOps::write_rows(std::int64_t row0, std::int64_t n, const float* weights, const float* state) {
  const std::size_t dim = static_cast<std::size_t>(table_.dim()), sd = static_cast<std::size_t>(table_.state_dim());
  for (std::int64_t i = 0; i < n; ++i) {
    float* rec = table_.row(row0 + i);
    std::memcpy(rec, weights + static_cast<std::size_t>(i) * dim, dim * sizeof(float));
    if (state && sd) std::memcpy(rec + dim, state + static_cast<std::size_t>(i) * sd, sd * sizeof(float));
  }
}

namespace {

// `cpu` mode has nothing to prepare at submit.
struct CpuBatch final : EngineBatch {};

class CpuEngine final : public Engine {
 public:
  CpuEngine(const StoreConfig& config, std::unordered_map<int, HostTableOps> tables)
      : config_(config), tables_(std::move(tables)) {}

  Result<std::unique_ptr<EngineBatch>> submit(std::int64_t, const KeyBatch&, const EngineFeatures&) override {
    return std::unique_ptr<EngineBatch>(std::make_unique<CpuBatch>());
  }

  Status forward(EngineBatch&, const KeyBatch& batch, const EngineFeatures& f, const std::vector<MatrixView>& outputs,
                 const CallOrder&) override {
    for_each_feature(f, [&](std::size_t i) {
      const std::size_t fi = static_cast<std::size_t>(f.feature[i]);
      tables_.at(f.table[i]).forward(batch.features[fi], outputs[fi].data);
    });
    return Status::ok();
  }

  Status backward(EngineBatch&, const KeyBatch& batch, const EngineFeatures& f,
                  const std::vector<ConstMatrixView>& grads, std::int64_t t, const CallOrder&) override {
    for_each_feature(f, [&](std::size_t i) {
      const std::size_t fi = static_cast<std::size_t>(f.feature[i]);
      const TableSpec& spec = config_.tables[static_cast<std::size_t>(f.table[i])].spec;
      tables_.at(f.table[i]).backward(batch.features[fi], grads[fi].data, make_optimizer_step(spec, t));
    });
    return Status::ok();
  }

  Status discard(EngineBatch&, const KeyBatch&, const EngineFeatures&) override { return Status::ok(); }
  Status flush() override { return Status::ok(); }

  Status read_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) override {
    tables_.at(table).read_rows(row0, n, weights, state);
    return Status::ok();
  }
  Status write_rows(int table, std::int64_t row0, std::int64_t n, const float* weights, const float* state) override {
    tables_.at(table).write_rows(row0, n, weights, state);
    return Status::ok();
  }

 private:
  // Runs fn(i) for every feature of the batch, the features' tables side by side: each table's
  // kernels are parallel within the table, and running the tables as tasks of one parallel loop
  // (nested in oneTBB's work stealing) removes the join between one table and the next, which
  // dominates with many small tables (26 one-hot Criteo features of 8192 bags). Safe: a table
  // appears at most once per batch, each HostTableOps keeps its own scratch, and the features'
  // outputs and rows are disjoint; each output is computed as before (bit-identical).
  template <class Fn>
  static void for_each_feature(const EngineFeatures& f, Fn fn) {
    if (f.feature.size() == 1) {
      fn(0);
      return;
    }
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, f.feature.size(), 1),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t i = r.begin(); i < r.end(); ++i) {
                          fn(i);
                        }
                      });
  }

  const StoreConfig& config_;
  std::unordered_map<int, HostTableOps> tables_;
};

}  // namespace

Result<std::unique_ptr<Engine>> make_cpu_engine(const Topology& topo, const StoreConfig& config,
                                                const std::vector<int>& tables, const HostTableOptions& options) {
  // Small tables share 2 MiB arenas (host/host_table.hpp); the tables keep them alive.
  ArenaPacker packer;
  HostTableOptions packed = options;
  packed.packer = &packer;
  std::unordered_map<int, HostTableOps> ops;
  for (int t : tables) {
    STRATA_ASSIGN_OR_RETURN(HostTable table,
                            HostTable::create(topo, config.tables[static_cast<std::size_t>(t)].spec, packed));
    ops.emplace(t, HostTableOps(std::move(table)));
  }
  return std::unique_ptr<Engine>(std::make_unique<CpuEngine>(config, std::move(ops)));
}

}  // namespace strata::detail
