// The production Store: validates, tracks batches in flight, and fans out to one TableEngine per
// table (chosen by the table's placement), inside a oneTBB arena of `threads` workers.

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <unordered_map>

#include "store/detail/batch_checks.hpp"
#include "store/detail/cpu_engine.hpp"
#include "store/store.hpp"

namespace strata {
namespace {

class StoreImpl final : public Store {
 public:
  StoreImpl(StoreConfig config, Topology topo)
      : Store(std::move(config)),
        topo_(std::move(topo)),
        index_(detail::make_table_index(config_)),
        arena_(config_.threads > 0 ? config_.threads : tbb::task_arena::automatic) {}

  Status init() {
    HostTableOptions ho;
    ho.interleave = config_.numa == NumaPolicy::kInterleave;
    ho.node = config_.numa_node;
    ho.huge_pages = config_.huge_pages;
    if (config_.numa == NumaPolicy::kBind && config_.numa_node >= topo_.num_nodes())
      return Status::invalid_argument("numa_node " + std::to_string(config_.numa_node) + " out of range [0, " +
                                      std::to_string(topo_.num_nodes()) + ")");
    Status status;
    arena_.execute([&] {
      for (const auto& t : config_.tables) {
        auto engine = detail::make_cpu_engine(topo_, t.spec, ho);
        if (!engine) {
          status = engine.status();
          return;
        }
        engines_.push_back(std::move(engine).value());
      }
    });
    return status;
  }

  Status submit(std::int64_t id, KeyBatch batch) override {
    if (batches_.count(id)) return detail::duplicate_batch(id);
    STRATA_ASSIGN_OR_RETURN(std::vector<int> tables, detail::check_batch(id, batch, config_, index_));
    Entry e;
    e.batch = std::move(batch);
    e.tables = std::move(tables);
    e.prepared.resize(e.tables.size());
    arena_.execute([&] {
      tbb::parallel_for(std::size_t{0}, e.tables.size(), [&](std::size_t i) {
        e.prepared[i] = engines_[static_cast<std::size_t>(e.tables[i])]->prepare(e.batch.features[i]);
      });
    });
    batches_.emplace(id, std::move(e));
    return Status::ok();
  }

  Status forward(std::int64_t id, const std::vector<MatrixView>& outputs) override {
    STRATA_ASSIGN_OR_RETURN(Entry * found, detail::find_batch(batches_, id, config_, outputs, "output", false));
    Entry& e = *found;
    Status status;
    arena_.execute([&] {
      for (std::size_t i = 0; i < e.tables.size() && status.is_ok(); ++i)
        status = engines_[static_cast<std::size_t>(e.tables[i])]->forward(e.batch.features[i], *e.prepared[i], outputs[i]);
    });
    if (status.is_ok()) e.forwarded = true;
    return status;
  }

  Status backward(std::int64_t id, const std::vector<ConstMatrixView>& grads) override {
    STRATA_ASSIGN_OR_RETURN(Entry * found, detail::find_batch(batches_, id, config_, grads, "gradient", true));
    Entry& e = *found;
    const std::int64_t t = step_ + 1;
    Status status;
    arena_.execute([&] {
      for (std::size_t i = 0; i < e.tables.size() && status.is_ok(); ++i) {
        const auto& spec = config_.tables[static_cast<std::size_t>(e.tables[i])].spec;
        status = engines_[static_cast<std::size_t>(e.tables[i])]->backward(
            e.batch.features[i], *e.prepared[i], grads[i], make_optimizer_step(spec.optimizer, t));
      }
    });
    step_ = t;
    batches_.erase(id);
    return status;
  }

  Status discard(std::int64_t id) override {
    if (!batches_.erase(id)) return detail::unknown_batch(id);
    return Status::ok();
  }

  Status flush() override {
    Status status;
    arena_.execute([&] {
      for (auto& engine : engines_) {
        status = engine->flush();
        if (!status.is_ok()) return;
      }
    });
    return status;
  }

  std::int64_t in_flight() const noexcept override { return static_cast<std::int64_t>(batches_.size()); }

  Status read_rows(int table, std::int64_t row0, std::int64_t n, float* weights, float* state) override {
    STRATA_RETURN_IF_ERROR(detail::check_row_range(table, row0, n, config_));
    STRATA_RETURN_IF_ERROR(flush());
    engines_[static_cast<std::size_t>(table)]->read_rows(row0, n, weights, state);
    return Status::ok();
  }

  Status write_rows(int table, std::int64_t row0, std::int64_t n, const float* weights, const float* state) override {
    if (!batches_.empty()) return detail::busy("write_rows", in_flight());
    STRATA_RETURN_IF_ERROR(detail::check_row_range(table, row0, n, config_));
    engines_[static_cast<std::size_t>(table)]->write_rows(row0, n, weights, state);
    return Status::ok();
  }

 private:
  struct Entry {
    KeyBatch batch;
    std::vector<int> tables;
    std::vector<std::unique_ptr<detail::PreparedFeature>> prepared;
    bool forwarded = false;
  };
  Topology topo_;
  detail::TableIndex index_;
  tbb::task_arena arena_;
  std::vector<std::unique_ptr<detail::TableEngine>> engines_;
  std::unordered_map<std::int64_t, Entry> batches_;
};

}  // namespace

Result<std::unique_ptr<Store>> Store::open(const StoreConfig& config) {
  STRATA_RETURN_IF_ERROR(validate(config));
  Result<Topology> topo = config.fake_numa_nodes > 0 ? Result<Topology>(Topology::fake(config.fake_numa_nodes))
                                                      : Topology::discover();
  if (!topo) return topo.status();
  auto store = std::make_unique<StoreImpl>(config, std::move(topo).value());
  STRATA_RETURN_IF_ERROR(store->init());
  return std::unique_ptr<Store>(std::move(store));
}

Result<int> Store::table_index(const std::string& name) const {
  for (std::size_t i = 0; i < config_.tables.size(); ++i)
    if (config_.tables[i].spec.name == name) return static_cast<int>(i);
  return Status::not_found("unknown table '" + name + "'");
}

}  // namespace strata
