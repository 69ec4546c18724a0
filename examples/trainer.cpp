// A small trainer on Strata: three tables placed `cached`, `offload` and `cpu` in one store on the
// emulated device (`emu`, so it runs on any machine), a pipeline that submits batches ahead of the
// step it trains, and a checkpoint saved and loaded into a second store, which must then hold the
// same rows. Every Status is checked: the first failure is printed and the program exits with 1.
//
//   strata-example-trainer [CHECKPOINT_DIR]   (default: a fresh folder under the temporary directory,
//                                              removed at the end)
//
// Built in Strata's tree (examples/ is a subdirectory) and, as its own project, against an
// installed Strata: cmake -S examples -B build-example -DCMAKE_PREFIX_PATH=<prefix>.

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/status.hpp"
#include "store/store.hpp"

namespace {

// Prints what failed and returns 1 from the enclosing function (main) when `expr` is an error.
#define EXAMPLE_CHECK(expr)                                                                \
  do {                                                                                     \
    const ::strata::Status example_status_ = (expr);                                       \
    if (!example_status_.is_ok()) {                                                        \
      std::fprintf(stderr, "%s failed: %s\n", #expr, example_status_.to_string().c_str()); \
      return 1;                                                                            \
    }                                                                                      \
  } while (0)

constexpr int kBatch = 64;   // bags per batch
constexpr int kSteps = 24;   // training steps
constexpr int kAhead = 3;    // batches submitted ahead of the one being trained
constexpr int kBagKeys = 4;  // keys per bag

// One table: its shape, optimizer and placement.
strata::TableConfig table(const char* name, std::int64_t rows, std::int32_t dim, strata::OptimizerKind optimizer,
                          float learning_rate, strata::Placement placement) {
  strata::TableConfig t;
  t.spec.name = name;
  t.spec.rows = rows;
  t.spec.dim = dim;
  t.spec.optimizer.kind = optimizer;
  t.spec.optimizer.learning_rate = learning_rate;
  t.placement = placement;
  return t;
}

strata::StoreConfig make_config() {
  strata::StoreConfig config;
  config.threads = 2;
  config.device.backend = strata::BackendChoice::kEmu;  // kAuto would use a CUDA GPU when there is one
  config.device.capacity = std::int64_t{64} << 20;
  config.cache.policy = strata::cache::Policy::kLookahead;
  config.cache.lookahead = kAhead - 1;  // the planner sees the batches submitted behind the one it plans
  config.cache.max_in_flight = kAhead + 1;
  // Large and skewed: rows in pinned host memory, the hot ones cached on the device (5% of the rows).
  config.tables.push_back(
      table("user", 50'000, 16, strata::OptimizerKind::kRowwiseAdagrad, 0.05f, strata::Placement::kCached));
  config.tables.back().cache.fraction = 0.05;
  // Pinned host rows that the device reads zero-copy.
  config.tables.push_back(
      table("item", 20'000, 16, strata::OptimizerKind::kAdagrad, 0.05f, strata::Placement::kOffload));
  // Small: CPU kernels on host rows, mean pooling.
  config.tables.push_back(table("country", 200, 8, strata::OptimizerKind::kSgd, 0.1f, strata::Placement::kCpu));
  config.tables.back().spec.pooling = strata::Pooling::kMean;
  return config;
}

// Batch `id`: kBatch bags per table, keys skewed towards low rows (squares of uniform draws).
strata::KeyBatch make_batch(const strata::StoreConfig& config, std::int64_t id) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(id) * 0x9E3779B97F4A7C15ull + 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  strata::KeyBatch batch;
  for (const strata::TableConfig& t : config.tables) {
    strata::JaggedKeys f;
    f.table = t.spec.name;
    f.offsets.push_back(0);
    for (int b = 0; b < kBatch; ++b) {
      for (int k = 0; k < kBagKeys; ++k) {
        const double x = u(rng);
        f.keys.push_back(static_cast<strata::Key>(x * x * static_cast<double>(t.spec.rows)) % t.spec.rows);
      }
      f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
    }
    batch.features.push_back(std::move(f));
  }
  return batch;
}

// Output buffers of one batch, one (kBatch, dim) matrix per table (every table is pooled).
struct Outputs {
  std::vector<std::vector<float>> data;
  std::vector<strata::MatrixView> views;
  explicit Outputs(const strata::StoreConfig& config) {
    for (const strata::TableConfig& t : config.tables) data.emplace_back(std::size_t{kBatch} * t.spec.dim);
    for (std::size_t i = 0; i < data.size(); ++i) {
      views.push_back({data[i].data(), kBatch, config.tables[i].spec.dim});
    }
  }
};

// Gradient of the loss 0.5 * |out - 0.1|^2 (every output pulled towards 0.1); returns the loss.
double loss_gradient(const Outputs& out, std::vector<std::vector<float>>& grads,
                     std::vector<strata::ConstMatrixView>& views) {
  double loss = 0;
  grads.resize(out.data.size());
  views.clear();
  for (std::size_t i = 0; i < out.data.size(); ++i) {
    grads[i].resize(out.data[i].size());
    for (std::size_t j = 0; j < out.data[i].size(); ++j) {
      const float d = out.data[i][j] - 0.1f;
      grads[i][j] = d;
      loss += 0.5 * d * d;
    }
    views.push_back({grads[i].data(), out.views[i].rows, out.views[i].cols});
  }
  return loss / kBatch;
}

// Whether every row and optimizer state of every table is the same in both stores.
strata::Result<bool> same_rows(strata::Store& a, strata::Store& b) {
  for (int t = 0; t < static_cast<int>(a.config().tables.size()); ++t) {
    const strata::TableSpec& spec = a.config().tables[t].spec;
    const std::size_t n = static_cast<std::size_t>(spec.rows);
    const std::size_t sd = static_cast<std::size_t>(strata::optimizer_state_dim(spec.optimizer.kind, spec.dim));
    std::vector<float> wa(n * spec.dim), wb(n * spec.dim), sa(n * sd + 1), sb(n * sd + 1);
    STRATA_RETURN_IF_ERROR(a.read_rows(t, 0, spec.rows, wa.data(), sa.data()));
    STRATA_RETURN_IF_ERROR(b.read_rows(t, 0, spec.rows, wb.data(), sb.data()));
    if (std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)) != 0 ||
        std::memcmp(sa.data(), sb.data(), sa.size() * sizeof(float)) != 0) {
      std::fprintf(stderr, "table '%s' differs after load\n", spec.name.c_str());
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const bool own_dir = argc < 2;
  const std::string ckpt =
      own_dir ? (std::filesystem::temp_directory_path() / ("strata-example-" + std::to_string(::getpid()))).string()
              : argv[1];
  const strata::StoreConfig config = make_config();
  strata::Result<std::unique_ptr<strata::Store>> opened = strata::Store::open(config);
  EXAMPLE_CHECK(opened.status());
  std::unique_ptr<strata::Store> store = std::move(opened).value();

  // The pipeline: batches 0 .. kAhead-1 go in first; each step trains batch s and submits s+kAhead,
  // so the cache prefetches the rows of the batches behind the one being trained.
  for (std::int64_t id = 0; id < kAhead && id < kSteps; ++id) EXAMPLE_CHECK(store->submit(id, make_batch(config, id)));
  Outputs out(config);
  std::vector<std::vector<float>> grads;
  std::vector<strata::ConstMatrixView> grad_views;
  double first_loss = 0, last_loss = 0;
  for (std::int64_t s = 0; s < kSteps; ++s) {
    EXAMPLE_CHECK(store->forward(s, out.views));
    const double loss = loss_gradient(out, grads, grad_views);
    if (!std::isfinite(loss)) {
      std::fprintf(stderr, "step %lld: loss %g is not finite\n", static_cast<long long>(s), loss);
      return 1;
    }
    (s == 0 ? first_loss : last_loss) = loss;
    EXAMPLE_CHECK(store->backward(s, grad_views));
    if (s + kAhead < kSteps) EXAMPLE_CHECK(store->submit(s + kAhead, make_batch(config, s + kAhead)));
  }
  std::printf("trained %lld steps on %s: loss %.6f -> %.6f\n", static_cast<long long>(store->step()),
              store->stats().device.c_str(), first_loss, last_loss);
  for (const auto& [table, cs] : store->stats().cache) {
    std::printf("  cache of '%s': %lld hits, %lld misses\n", table.c_str(), static_cast<long long>(cs.hits),
                static_cast<long long>(cs.misses));
  }

  // Checkpoint: save, then load into a second store opened with the same config.
  EXAMPLE_CHECK(store->save(ckpt));
  strata::Result<std::unique_ptr<strata::Store>> reopened = strata::Store::open(config);
  EXAMPLE_CHECK(reopened.status());
  std::unique_ptr<strata::Store> restored = std::move(reopened).value();
  EXAMPLE_CHECK(restored->load(ckpt));
  if (restored->step() != store->step()) {
    std::fprintf(stderr, "step after load: %lld, saved at %lld\n", static_cast<long long>(restored->step()),
                 static_cast<long long>(store->step()));
    return 1;
  }
  strata::Result<bool> same = same_rows(*store, *restored);
  EXAMPLE_CHECK(same.status());
  if (!same.value()) return 1;
  std::printf("checkpoint %s: saved and loaded, step %lld, every row equal\n", ckpt.c_str(),
              static_cast<long long>(restored->step()));
  if (own_dir) {
    std::error_code ec;
    std::filesystem::remove_all(ckpt, ec);
  }
  return 0;
}
