#include "store/detail/cpu_engine.hpp"

#include <cstring>

#include "host/dedup.hpp"
#include "host/kernels.hpp"

namespace strata::detail {
namespace {

// Dedup is only needed by backward, so it is done there: inference (submit, forward, discard)
// never pays for it, and `cpu` mode has nothing to prefetch at submit.
struct CpuPrepared final : PreparedFeature {};

BagsView bags_of(const JaggedKeys& f) {
  BagsView v;
  v.offsets = f.offsets.data();
  v.batch = f.batch_size();
  v.keys = f.keys.data();
  v.weights = f.weights.empty() ? nullptr : f.weights.data();
  return v;
}

class CpuEngine final : public TableEngine {
 public:
  explicit CpuEngine(HostTable table) : table_(std::move(table)) {}

  std::unique_ptr<PreparedFeature> prepare(const JaggedKeys&) override {
    return std::make_unique<CpuPrepared>();
  }

  Status forward(const JaggedKeys& f, PreparedFeature&, MatrixView out) override {
    if (table_.spec().pooling == Pooling::kNone) {
      gather_rows(table_.ref(), f.keys.data(), f.weights.empty() ? nullptr : f.weights.data(), f.num_keys(), out.data);
    } else {
      gather_pool(table_.ref(), bags_of(f), table_.spec().pooling, out.data);
    }
    return Status::ok();
  }

  Status backward(const JaggedKeys& f, PreparedFeature&, ConstMatrixView grad, const OptimizerStep& st) override {
    // Reused across batches: the store drives one call at a time.
    dedup_keys(f.keys.data(), f.num_keys(), unique_, scratch_);
    if (table_.spec().pooling != Pooling::kNone) bag_of_positions(f.offsets.data(), f.batch_size(), bag_of_);
    backward_update(table_.ref(), bags_of(f), table_.spec().pooling, view_of(unique_), bag_of_.data(), grad.data, st);
    return Status::ok();
  }

  Status flush() override { return Status::ok(); }

  void read_rows(std::int64_t row0, std::int64_t n, float* weights, float* state) override {
    const std::size_t dim = static_cast<std::size_t>(table_.dim()), sd = static_cast<std::size_t>(table_.state_dim());
    for (std::int64_t i = 0; i < n; ++i) {
      const float* rec = table_.row(row0 + i);
      std::memcpy(weights + static_cast<std::size_t>(i) * dim, rec, dim * sizeof(float));
      if (state && sd) std::memcpy(state + static_cast<std::size_t>(i) * sd, rec + dim, sd * sizeof(float));
    }
  }

  void write_rows(std::int64_t row0, std::int64_t n, const float* weights, const float* state) override {
    const std::size_t dim = static_cast<std::size_t>(table_.dim()), sd = static_cast<std::size_t>(table_.state_dim());
    for (std::int64_t i = 0; i < n; ++i) {
      float* rec = table_.row(row0 + i);
      std::memcpy(rec, weights + static_cast<std::size_t>(i) * dim, dim * sizeof(float));
      if (state && sd) std::memcpy(rec + dim, state + static_cast<std::size_t>(i) * sd, sd * sizeof(float));
    }
  }

 private:
  HostTable table_;
  UniqueKeys unique_;
  DedupScratch scratch_;
  std::vector<std::int32_t> bag_of_;
};

}  // namespace

Result<std::unique_ptr<TableEngine>> make_cpu_engine(const Topology& topo, const TableSpec& spec,
                                                     const HostTableOptions& options) {
  STRATA_ASSIGN_OR_RETURN(HostTable table, HostTable::create(topo, spec, options));
  return std::unique_ptr<TableEngine>(std::make_unique<CpuEngine>(std::move(table)));
}

}  // namespace strata::detail
