#include "store/engines/cpu_engine.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <unordered_map>

#include "host/kernels.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

TableBatchItem HostTableOps::forward_item(const JaggedKeys& f, float* out) const {
  TableBatchItem it;
  it.table = table_.ref();
  it.bags = bags_of(f);
  it.pooling = table_.spec().pooling;
  it.out = out;
  it.out_dtype = table_.spec().output_dtype;
  return it;
}

void HostTableOps::prepare_backward(const JaggedKeys& f, bool shared) {
  // Repeated keys are only needed by backward, so they are found here: inference never pays for
  // it. Rows used once are updated straight from their bag's gradient.
  if (table_.spec().pooling != Pooling::kNone) bag_of_positions(f, bag_of_);
  if (!shared) find_repeats(f, table_.spec().rows, repeats_, scratch_);
}

TableBatchItem HostTableOps::backward_item(const JaggedKeys& f, const float* grads, const OptimizerStep& step) const {
  TableBatchItem it = forward_item(f, nullptr);
  it.grads = grads;
  it.repeats = &repeats_;
  it.bag_of = bag_of_.data();
  it.step = step;
  return it;
}

void HostBatch::forward(const std::vector<HostFeature>& f) {
  items_.clear();
  for (const HostFeature& x : f) items_.push_back(x.ops->forward_item(*x.keys, x.out));
  gather_pool_tables(items_, scratch_);
}

void HostBatch::backward(const std::vector<HostFeature>& f) {
  shared_.assign(f.size(), 0);
  shared_keys_.clear();
  shared_out_.clear();
  std::int64_t rows = 0, keys = 0;
  for (std::size_t i = 0; i < f.size(); ++i) {
    const std::int64_t r = f[i].ops->table().spec().rows, n = f[i].keys->num_keys();
    if (r > kSharedRepeatsRows || n > kSharedRepeatsKeys || rows + r > kRepeatsTablesMaxRows ||
        keys + n > kRepeatsTablesMaxKeys)
      continue;
    rows += r;
    keys += n;
    shared_[i] = 1;
    const JaggedKeys& k = *f[i].keys;
    shared_keys_.push_back({k.keys.data(), k.num_keys(), r, k.keys32.empty() ? nullptr : k.keys32.data()});
    shared_out_.push_back(&f[i].ops->repeats());
  }
  // Each key's bag, and the large tables' repeated keys, the tables side by side (each
  // HostTableOps has its own scratch); then the others' in one shared pass.
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, f.size(), 1), [&](const tbb::blocked_range<std::size_t>& r) {
    for (std::size_t i = r.begin(); i < r.end(); ++i) f[i].ops->prepare_backward(*f[i].keys, shared_[i] != 0);
  });
  if (!shared_keys_.empty()) find_repeats_tables(shared_keys_, shared_out_, repeats_scratch_);
  items_.clear();
  for (const HostFeature& x : f) items_.push_back(x.ops->backward_item(*x.keys, x.grads, x.step));
  backward_update_tables(items_, scratch_);
}

void HostTableOps::read_rows(std::int64_t row0, std::int64_t n, float* weights, float* state) const {
  const std::size_t dim = static_cast<std::size_t>(table_.dim()), sd = static_cast<std::size_t>(table_.state_dim());
  for (std::int64_t i = 0; i < n; ++i)
    table_.read_row(row0 + i, weights + static_cast<std::size_t>(i) * dim,
                    state && sd ? state + static_cast<std::size_t>(i) * sd : nullptr);
}

void HostTableOps::write_rows(std::int64_t row0, std::int64_t n, const float* weights, const float* state) {
  const std::size_t dim = static_cast<std::size_t>(table_.dim()), sd = static_cast<std::size_t>(table_.state_dim());
  for (std::int64_t i = 0; i < n; ++i)
    table_.write_row(row0 + i, weights + static_cast<std::size_t>(i) * dim,
                     state && sd ? state + static_cast<std::size_t>(i) * sd : nullptr);
}

void HostTableOps::read_rows(const std::vector<std::int64_t>& rows, float* weights, float* state) const {
  const std::size_t dim = static_cast<std::size_t>(table_.dim()), sd = static_cast<std::size_t>(table_.state_dim());
  for (std::size_t i = 0; i < rows.size(); ++i)
    table_.read_row(rows[i], weights + i * dim, state && sd ? state + i * sd : nullptr);
}

void HostTableOps::write_rows(const std::vector<std::int64_t>& rows, const float* weights, const float* state) {
  const std::size_t dim = static_cast<std::size_t>(table_.dim()), sd = static_cast<std::size_t>(table_.state_dim());
  for (std::size_t i = 0; i < rows.size(); ++i)
    table_.write_row(rows[i], weights + i * dim, state && sd ? state + i * sd : nullptr);
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
    features_.clear();
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const std::size_t fi = static_cast<std::size_t>(f.feature[i]);
      HostFeature x;
      x.ops = &tables_.at(f.table[i]);
      x.keys = &batch.features[fi];
      x.out = outputs[fi].data;
      features_.push_back(x);
    }
    batch_.forward(features_);
    return Status::ok();
  }

  Status backward(EngineBatch&, const KeyBatch& batch, const EngineFeatures& f,
                  const std::vector<ConstMatrixView>& grads, std::int64_t t, const CallOrder&) override {
    features_.clear();
    for (std::size_t i = 0; i < f.feature.size(); ++i) {
      const std::size_t fi = static_cast<std::size_t>(f.feature[i]);
      HostFeature x;
      x.ops = &tables_.at(f.table[i]);
      x.keys = &batch.features[fi];
      x.grads = grads[fi].data;
      x.step = make_optimizer_step(config_.tables[static_cast<std::size_t>(f.table[i])].spec, t);
      features_.push_back(x);
    }
    batch_.backward(features_);
    return Status::ok();
  }

  Status discard(EngineBatch&, const KeyBatch&, const EngineFeatures&) override { return Status::ok(); }
  Status flush() override { return Status::ok(); }
  const char* name() const noexcept override { return "cpu"; }
  bool uses_device() const noexcept override { return false; }
  void host_tables(std::vector<std::pair<int, const HostTable*>>& out) const override { add_host_tables(tables_, out); }

  Status read_rows_at(int table, const TableSpec&, const std::vector<std::int64_t>& rows, float* weights,
                      float* state) override {
    tables_.at(table).read_rows(rows, weights, state);
    return Status::ok();
  }
  Status read_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) override {
    tables_.at(table).read_rows(row0, n, weights, state);
    return Status::ok();
  }
  Status write_rows(int table, std::int64_t row0, std::int64_t n, const float* weights, const float* state) override {
    tables_.at(table).write_rows(row0, n, weights, state);
    return Status::ok();
  }
  Status reset_rows(int table, const std::vector<std::int64_t>& rows, const float* weights,
                    const float* state) override {
    tables_.at(table).write_rows(rows, weights, state);
    return Status::ok();
  }

 private:
  const StoreConfig& config_;
  std::unordered_map<int, HostTableOps> tables_;
  std::vector<HostFeature> features_;  // the call's features (reused)
  HostBatch batch_;
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
