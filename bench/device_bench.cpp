// strata-devbench: the device layer's bandwidths, each next to the baseline the GPU targets of the
// cache issue compare it with, measured in the same process:
//  - gather-pool by slot (dim 128 fp32, sum pooling, uniform slots) against a device-to-device copy
//    (target: at least 70%); both count HBM bytes read + written;
//  - the prefetcher's fill upload (slot ids and records from pinned staging H2D, then unpacked into
//    their slots: what the copy stream runs for a batch's misses once the host threads have gathered
//    the rows) against a large pinned H2D copy (target: at least 85%), at several miss counts;
//  - gather-pool at several dims, one-hot (1 key per bag) and pooled, each as a fraction of the
//    D2D copy (targets: at least 70% pooled at dim 128, at least 50% pooled at dim 32);
//  - the fused backward (SGD) on uniform and zipf:1.05 keys, whose hot rows the segment kernel
//    sums (target: zipf within 2x of uniform).
// Each op is also timed without waiting for the device ("issue"): the host's share of the op,
// which the device time ("s") must exceed for the figure to be the device's.
// Every figure is the median of --reps timed repetitions of --iters operations on one stream
// (host clock around the issue and a stream synchronize), after one untimed repetition. With
// --backend emu the same code runs on the emulated device, whose "HBM" is host memory: the numbers
// then say nothing about a GPU, but the program and its JSON are exercised (tests/bench).

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/record_layout.hpp"
#include "gpu/device.hpp"
#include "gpu/kernels/launch_args.hpp"
#include "host/dedup.hpp"
#include "host/host_table.hpp"
#include "store/store_config.hpp"

namespace strata::bench {
namespace {

struct Options {
  std::string backend = "auto";
  double copy_mib = 1024;        // bytes of the D2D and the baseline H2D/D2H copies
  std::int64_t slots = 4 << 20;  // gather-pool: records in the pool
  std::int32_t dim = 128;
  std::int32_t state_dim = 0;                                  // fill: optimizer state floats per record (0: SGD)
  std::int64_t bags = 16384;                                   // gather-pool: bags per launch
  std::int32_t pooling = 32;                                   // keys per bag
  std::vector<std::int64_t> fill_rows = {4096, 16384, 65536};  // misses per fill
  std::vector<std::int32_t> sweep_dims = {16, 32, 64, 128};    // gather sweep: dims
  std::vector<std::int32_t> sweep_pooling = {1, 32};           // gather sweep: keys per bag (1: one-hot)
  int reps = 15;
  int iters = 10;
  std::string json_path;
  bool progress = ::isatty(STDERR_FILENO) != 0;  // progress only on a terminal (--no-progress hides it there too)
};

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Seconds per operation: the median over reps of (time to issue `iters` ops and drain the stream) / iters.
// `issue`, when given, gets the median time per op spent issuing them (host only).
Result<double> time_op(gpu::Device& dev, gpu::StreamView s, const Options& o, const std::function<void()>& op,
                       double* issue = nullptr) {
  std::vector<double> per_op, issued;
  for (int r = 0; r <= o.reps; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < o.iters; ++i) op();
    const auto t1 = Clock::now();
    STRATA_RETURN_IF_ERROR(dev.synchronize(s));
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count() / o.iters;
    if (r > 0) {  // the first repetition warms up
      per_op.push_back(sec);
      issued.push_back(std::chrono::duration<double>(t1 - t0).count() / o.iters);
    }
  }
  if (issue) *issue = median(issued);
  return median(per_op);
}

// Zipf(1.05) row ids over [0, n), hottest first (inverse CDF).
std::vector<Key> zipf_keys(std::int64_t n, std::int64_t count, std::mt19937_64& rng) {
  std::vector<double> cdf(static_cast<std::size_t>(n));
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) cdf[static_cast<std::size_t>(i)] = sum += 1.0 / std::pow(i + 1.0, 1.05);
  std::vector<Key> keys(static_cast<std::size_t>(count));
  std::uniform_real_distribution<double> u(0.0, sum);
  for (auto& k : keys) k = static_cast<Key>(std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin());
  return keys;
}

// Fills device memory with `value` bytes through a pinned bounce buffer.
Status fill_device(gpu::Device& dev, gpu::StreamView s, void* dst, std::size_t bytes, gpu::PinnedBuffer& bounce) {
  for (std::size_t off = 0; off < bytes; off += bounce.bytes()) {
    dev.copy_h2d(s, static_cast<char*>(dst) + off, bounce.data(), std::min(bounce.bytes(), bytes - off));
    STRATA_RETURN_IF_ERROR(dev.synchronize(s));  // the bounce buffer is reused
  }
  return Status::ok();
}

double gbs(double bytes, double sec) { return sec > 0 ? bytes / sec / 1e9 : 0.0; }

Result<std::unique_ptr<gpu::Device>> open(const Options& o, std::size_t need) {
  STRATA_ASSIGN_OR_RETURN(const BackendChoice choice, parse_backend(o.backend));
  bool cuda = choice == BackendChoice::kCuda;
  if (choice == BackendChoice::kAuto) {
    auto gpus = gpu::cuda_devices();  // a broken CUDA is an error, not a reason to measure emu
    if (!gpus) return gpus.status().with_context("--backend auto");
    cuda = gpus.value() > 0;
  }
  if (cuda) {
    auto dev = gpu::make_cuda_device(0, 0);
    if (!dev) return dev.status().with_context("--backend " + o.backend);
    return dev;
  }
  gpu::EmuOptions e;
  e.capacity = need + (std::size_t{64} << 20);
  return gpu::make_emu_device(e);
}

// Device bytes the sweep and the backward hold at once, at most (the largest dim's pool, its
// indexes and outputs, gradients).
std::size_t sweep_bytes(const Options& o) {
  std::int32_t dim = o.dim;
  for (std::int32_t d : o.sweep_dims) dim = std::max(dim, d);
  const std::size_t keys = static_cast<std::size_t>(o.bags * o.pooling);
  return static_cast<std::size_t>(o.slots * record_stride(dim, 0)) * sizeof(float) + keys * 48 +
         2 * keys * static_cast<std::size_t>(dim) * sizeof(float);
}

void say(const Options& o, const std::string& what) {
  if (o.progress) std::fprintf(stderr, "  %s...\n", what.c_str());
}

// Uploads `bytes` of host memory to fresh device memory through the pinned buffer `bounce`.
Result<gpu::DeviceBuffer> upload(gpu::Device& dev, gpu::StreamView s, const void* src, std::size_t bytes,
                                 gpu::PinnedBuffer& bounce) {
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer d, dev.allocate(std::max<std::size_t>(bytes, 1)));
  for (std::size_t off = 0; off < bytes; off += bounce.bytes()) {
    const std::size_t n = std::min(bounce.bytes(), bytes - off);
    std::memcpy(bounce.data(), static_cast<const char*>(src) + off, n);
    dev.copy_h2d(s, d.as<char>() + off, bounce.data(), n);
    STRATA_RETURN_IF_ERROR(dev.synchronize(s));  // the bounce buffer is reused
  }
  return d;
}

// Gather-pool over o.sweep_dims x o.sweep_pooling: o.bags * o.pooling uniform keys each (one-hot:
// that many bags of one key), from a pool of o.slots records of the dim.
Status gather_sweep(gpu::Device& dev, gpu::StreamView s, const Options& o, double d2d_gbs, gpu::PinnedBuffer& bounce,
                    std::mt19937_64& rng, nlohmann::json& j) {
  nlohmann::json sweep = nlohmann::json::array();
  const std::int64_t keys = o.bags * o.pooling;
  for (const std::int32_t dim : o.sweep_dims) {
    const std::int64_t stride = record_stride(dim, 0);
    STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer pool_mem,
                            dev.allocate(static_cast<std::size_t>(o.slots * stride) * sizeof(float)));
    const gpu::SlotPool pool{pool_mem.as<float>(), o.slots, stride, dim, 0};
    for (const std::int32_t per_bag : o.sweep_pooling) {
      say(o, "gather-pool dim " + std::to_string(dim) + ", " + std::to_string(per_bag) + " per bag");
      const std::int64_t bags = keys / per_bag;
      std::vector<Key> rows(static_cast<std::size_t>(bags * per_bag));
      std::uniform_int_distribution<Key> pick(0, o.slots - 1);
      for (auto& r : rows) r = pick(rng);
      std::vector<std::int64_t> offsets(static_cast<std::size_t>(bags + 1));
      for (std::int64_t i = 0; i <= bags; ++i) offsets[static_cast<std::size_t>(i)] = i * per_bag;
      STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer rows_dev,
                              upload(dev, s, rows.data(), rows.size() * sizeof(Key), bounce));
      STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer offs_dev,
                              upload(dev, s, offsets.data(), offsets.size() * sizeof(std::int64_t), bounce));
      STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer out,
                              dev.allocate(static_cast<std::size_t>(bags * dim) * sizeof(float)));
      gpu::LookupFeature f;
      f.rows = rows_dev.as<Key>();
      f.offsets = offs_dev.as<std::int64_t>();
      f.batch = bags;
      f.num_keys = static_cast<std::int64_t>(rows.size());
      f.out = out.as<float>();
      const std::vector<gpu::LookupFeature> features{f};
      double issue = 0;
      STRATA_ASSIGN_OR_RETURN(const double sec, time_op(
                                                    dev, s, o, [&] { dev.gather_pool(s, pool, features); }, &issue));
      const double bytes = (static_cast<double>(rows.size()) + static_cast<double>(bags)) * dim * sizeof(float);
      const double hbm = gbs(bytes, sec);
      sweep.push_back({{"dim", dim},
                       {"keys_per_bag", per_bag},
                       {"bags", bags},
                       {"s", sec},
                       {"issue_s", issue},
                       {"hbm_gbs", hbm},
                       {"fraction_of_d2d", d2d_gbs > 0 ? hbm / d2d_gbs : 0.0},
                       {"lookups_per_s", sec > 0 ? static_cast<double>(rows.size()) / sec : 0.0}});
    }
  }
  j["gather_sweep"] = sweep;
  for (const auto& x : sweep) {
    const int dim = x["dim"].get<int>();
    if (x["keys_per_bag"].get<int>() <= 1 || (dim != 128 && dim != 32)) continue;
    j["targets"]["gather_dim" + std::to_string(dim) + "_fraction_of_d2d"] = {{"value", x["fraction_of_d2d"]},
                                                                             {"target", dim == 128 ? 0.70 : 0.50}};
  }
  return Status::ok();
}

// The fused backward (SGD, o.dim, sum pooling) of o.bags bags of o.pooling keys over o.slots rows:
// uniform keys, then zipf:1.05 ones (a few rows used thousands of times). The unique rows, their
// uses and the hot list are made on the host, as the store makes them.
Status backward(gpu::Device& dev, gpu::StreamView s, const Options& o, gpu::PinnedBuffer& bounce, std::mt19937_64& rng,
                nlohmann::json& j) {
  const std::int64_t keys = o.bags * o.pooling, stride = record_stride(o.dim, 0);
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer pool_mem,
                          dev.allocate(static_cast<std::size_t>(o.slots * stride) * sizeof(float)));
  const gpu::SlotPool pool{pool_mem.as<float>(), o.slots, stride, o.dim, 0};
  std::vector<float> grads(static_cast<std::size_t>(o.bags * o.dim), 1e-3f);
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer grads_dev,
                          upload(dev, s, grads.data(), grads.size() * sizeof(float), bounce));
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(o.bags + 1));
  for (std::int64_t i = 0; i <= o.bags; ++i) offsets[static_cast<std::size_t>(i)] = i * o.pooling;
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer offs_dev,
                          upload(dev, s, offsets.data(), offsets.size() * sizeof(std::int64_t), bounce));
  const std::vector<std::int32_t> bag_of = bag_of_positions(offsets.data(), o.bags);
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer bag_dev,
                          upload(dev, s, bag_of.data(), bag_of.size() * sizeof(std::int32_t), bounce));
  nlohmann::json out;
  for (const bool zipf : {false, true}) {
    say(o, std::string("backward, ") + (zipf ? "zipf:1.05" : "uniform") + " keys");
    std::vector<Key> k;
    if (zipf) {
      k = zipf_keys(o.slots, keys, rng);
    } else {
      k.resize(static_cast<std::size_t>(keys));
      std::uniform_int_distribution<Key> pick(0, o.slots - 1);
      for (auto& x : k) x = pick(rng);
    }
    const UniqueKeys u = dedup_keys(k.data(), keys);
    std::vector<std::int64_t> hot;
    std::int64_t most = 0;
    for (std::int64_t r = 0; r < u.size(); ++r) {
      const std::int64_t uses = u.offsets[static_cast<std::size_t>(r) + 1] - u.offsets[static_cast<std::size_t>(r)];
      most = std::max(most, uses);
      if (uses > gpu::kernels::kHotUses) hot.push_back(r);
    }
    STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer slots_dev,
                            upload(dev, s, u.keys.data(), u.keys.size() * sizeof(Key), bounce));
    STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer uoff_dev,
                            upload(dev, s, u.offsets.data(), u.offsets.size() * sizeof(std::int64_t), bounce));
    STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer pos_dev,
                            upload(dev, s, u.positions.data(), u.positions.size() * sizeof(std::int32_t), bounce));
    STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer hot_dev,
                            upload(dev, s, hot.data(), hot.size() * sizeof(std::int64_t), bounce));
    gpu::UpdateFeature f;
    f.offsets = offs_dev.as<std::int64_t>();
    f.batch = o.bags;
    f.num_keys = keys;
    f.unique_slots = slots_dev.as<Key>();
    f.unique_offsets = uoff_dev.as<std::int64_t>();
    f.positions = pos_dev.as<std::int32_t>();
    f.bag_of = bag_dev.as<std::int32_t>();
    f.num_unique = u.size();
    f.grads = grads_dev.as<float>();
    f.step.spec.kind = OptimizerKind::kSgd;
    f.step.spec.learning_rate = 1e-3f;
    f.hot = hot_dev.as<std::int64_t>();
    f.num_hot = static_cast<std::int64_t>(hot.size());
    const std::vector<gpu::UpdateFeature> features{f};
    double issue = 0;
    STRATA_ASSIGN_OR_RETURN(const double sec, time_op(
                                                  dev, s, o, [&] { dev.backward_update(s, pool, features); }, &issue));
    out[zipf ? "zipf" : "uniform"] = {{"s", sec},
                                      {"issue_s", issue},
                                      {"unique_rows", u.size()},
                                      {"hot_rows", hot.size()},
                                      {"most_uses", most},
                                      {"lookups_per_s", sec > 0 ? static_cast<double>(keys) / sec : 0.0}};
  }
  const double ratio = out["zipf"]["s"].get<double>() / std::max(1e-12, out["uniform"]["s"].get<double>());
  out["zipf_over_uniform"] = ratio;
  j["backward"] = out;
  j["targets"]["backward_zipf_over_uniform"] = {{"value", ratio}, {"target", 2.0}, {"at_most", true}};
  return Status::ok();
}

// The options' ranges (kInvalidArgument naming the flag).
Status check_options(const Options& o) {
  const auto at_least = [](const char* flag, std::int64_t v, std::int64_t min) {
    return v >= min ? Status::ok()
                    : Status::invalid_argument(std::string(flag) + ": " + std::to_string(v) +
                                               " (expected >= " + std::to_string(min) + ")");
  };
  if (!(o.copy_mib >= 1.0 / 1024))
    return Status::invalid_argument("--copy-mib: " + std::to_string(o.copy_mib) + " (expected >= 1/1024)");
  STRATA_RETURN_IF_ERROR(at_least("--slots", o.slots, 1));
  STRATA_RETURN_IF_ERROR(at_least("--dim", o.dim, 1));
  STRATA_RETURN_IF_ERROR(at_least("--state-dim", o.state_dim, 0));
  STRATA_RETURN_IF_ERROR(at_least("--bags", o.bags, 1));
  STRATA_RETURN_IF_ERROR(at_least("--pooling", o.pooling, 1));
  STRATA_RETURN_IF_ERROR(at_least("--reps", o.reps, 1));
  STRATA_RETURN_IF_ERROR(at_least("--iters", o.iters, 1));
  if (o.fill_rows.empty())
    return Status::invalid_argument("--fill-rows is empty (expected a list of counts, e.g. 4096,65536)");
  for (std::int64_t r : o.fill_rows) STRATA_RETURN_IF_ERROR(at_least("--fill-rows", r, 1));
  for (std::int32_t d : o.sweep_dims) STRATA_RETURN_IF_ERROR(at_least("--sweep-dims", d, 1));
  for (std::int32_t p : o.sweep_pooling) STRATA_RETURN_IF_ERROR(at_least("--sweep-pooling", p, 1));
  return Status::ok();
}

// Fill uploads of each --fill-rows count: slot ids and records H2D from pinned staging, then
// unpacked into their slots (j["fill_upload"]), against a plain H2D of as many bytes.
Status fill_uploads(gpu::Device& dev, gpu::StreamView s, const Options& o, double h2d_gbs, std::mt19937_64& rng,
                    nlohmann::json& j) {
  const std::int64_t fill_stride = record_stride(o.dim, o.state_dim);
  const std::int64_t max_fill = *std::max_element(o.fill_rows.begin(), o.fill_rows.end());
  const std::size_t fill_pool_bytes = static_cast<std::size_t>(max_fill * fill_stride) * sizeof(float);
  const std::size_t fill_bytes =
      static_cast<std::size_t>(max_fill) * (static_cast<std::size_t>(fill_stride) * sizeof(float) + sizeof(Key));
  say(o, "fill uploads");
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer fill_pool_mem, dev.allocate(fill_pool_bytes));
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer fill_dev, dev.allocate(fill_bytes));
  STRATA_ASSIGN_OR_RETURN(gpu::PinnedBuffer fill_host, dev.allocate_pinned(fill_bytes));
  std::memset(fill_host.data(), 0, fill_bytes);
  const gpu::SlotPool fill_pool{fill_pool_mem.as<float>(), max_fill, fill_stride, o.dim, o.state_dim};
  nlohmann::json fills = nlohmann::json::array();
  for (const std::int64_t n : o.fill_rows) {
    Key* slots_host = fill_host.as<Key>();
    std::vector<Key> order(static_cast<std::size_t>(max_fill));
    for (std::int64_t i = 0; i < max_fill; ++i) order[static_cast<std::size_t>(i)] = i;
    std::shuffle(order.begin(), order.end(), rng);  // misses land in scattered slots
    std::copy(order.begin(), order.begin() + n, slots_host);
    const std::size_t ids = static_cast<std::size_t>(n) * sizeof(Key);
    const std::size_t recs = static_cast<std::size_t>(n * fill_stride) * sizeof(float);
    auto* recs_dev = reinterpret_cast<float*>(fill_dev.as<char>() + ids);
    const void* recs_host = fill_host.as<char>() + ids;
    STRATA_ASSIGN_OR_RETURN(const double fill_s, time_op(dev, s, o, [&] {
                              dev.copy_h2d(s, fill_dev.data(), fill_host.data(), ids);
                              dev.copy_h2d(s, recs_dev, recs_host, recs);
                              dev.unpack_records(s, fill_pool, fill_dev.as<Key>(), n, recs_dev);
                            }));
    STRATA_ASSIGN_OR_RETURN(const double raw_s, time_op(dev, s, o, [&] {
                              dev.copy_h2d(s, fill_dev.data(), fill_host.data(), ids + recs);
                            }));
    const double fill_gbs = gbs(static_cast<double>(ids + recs), fill_s);
    fills.push_back({{"rows", n},
                     {"bytes", ids + recs},
                     {"s", fill_s},
                     {"gbs", fill_gbs},
                     {"fraction_of_h2d", h2d_gbs > 0 ? fill_gbs / h2d_gbs : 0.0},
                     {"same_size_h2d_gbs", gbs(static_cast<double>(ids + recs), raw_s)}});
  }
  j["fill_upload"] = fills;
  return Status::ok();
}

Result<nlohmann::json> run(const Options& o) {
  STRATA_RETURN_IF_ERROR(check_options(o));
  const std::size_t copy = static_cast<std::size_t>(o.copy_mib * (1 << 20)) / 64 * 64;
  const std::int64_t stride = record_stride(o.dim, 0);
  const std::int64_t fill_stride = record_stride(o.dim, o.state_dim);
  const std::int64_t keys = o.bags * o.pooling;
  const std::int64_t max_fill = *std::max_element(o.fill_rows.begin(), o.fill_rows.end());
  const std::size_t pool_bytes = static_cast<std::size_t>(o.slots * stride) * sizeof(float);
  const std::size_t fill_pool_bytes = static_cast<std::size_t>(max_fill * fill_stride) * sizeof(float);
  const std::size_t fill_bytes =
      static_cast<std::size_t>(max_fill) * (static_cast<std::size_t>(fill_stride) * sizeof(float) + sizeof(Key));
  const std::size_t need = 2 * copy + pool_bytes + static_cast<std::size_t>(keys) * sizeof(Key) +
                           static_cast<std::size_t>(o.bags + 1) * sizeof(std::int64_t) +
                           static_cast<std::size_t>(o.bags * o.dim) * sizeof(float) + fill_pool_bytes + fill_bytes +
                           sweep_bytes(o);
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<gpu::Device> dev, open(o, need));
  STRATA_ASSIGN_OR_RETURN(gpu::Stream stream, dev->create_stream());
  const gpu::StreamView s = stream.view();
  nlohmann::json j;
  j["device"] = {{"backend", gpu::to_string(dev->info().backend)},
                 {"name", dev->info().name},
                 {"capacity_bytes", dev->info().capacity}};
  j["settings"] = {{"copy_bytes", copy},       {"slots", o.slots}, {"dim", o.dim},
                   {"state_dim", o.state_dim}, {"bags", o.bags},   {"pooling", o.pooling},
                   {"fill_rows", o.fill_rows}, {"reps", o.reps},   {"iters", o.iters}};

  // Baselines: D2D, pinned H2D and D2H copies of `copy` bytes.
  say(o, "copies");
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer a, dev->allocate(copy));
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer b, dev->allocate(copy));
  STRATA_ASSIGN_OR_RETURN(gpu::PinnedBuffer host, dev->allocate_pinned(copy));
  std::memset(host.data(), 0, copy);
  STRATA_ASSIGN_OR_RETURN(const double d2d_s, time_op(*dev, s, o, [&] { dev->copy_d2d(s, b.data(), a.data(), copy); }));
  STRATA_ASSIGN_OR_RETURN(const double h2d_s,
                          time_op(*dev, s, o, [&] { dev->copy_h2d(s, a.data(), host.data(), copy); }));
  STRATA_ASSIGN_OR_RETURN(const double d2h_s,
                          time_op(*dev, s, o, [&] { dev->copy_d2h(s, host.data(), a.data(), copy); }));
  const double d2d_gbs = gbs(2.0 * static_cast<double>(copy), d2d_s), h2d_gbs = gbs(static_cast<double>(copy), h2d_s);
  j["copies"] = {{"d2d_hbm_gbs", d2d_gbs},
                 {"d2d_s", d2d_s},
                 {"h2d_gbs", h2d_gbs},
                 {"h2d_s", h2d_s},
                 {"d2h_gbs", gbs(static_cast<double>(copy), d2h_s)},
                 {"d2h_s", d2h_s}};
  a = gpu::DeviceBuffer();
  b = gpu::DeviceBuffer();

  // Gather-pool: `bags` bags of `pooling` uniform slots of a pool of `slots` records.
  say(o, "gather-pool");
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer pool_mem, dev->allocate(pool_bytes));
  STRATA_RETURN_IF_ERROR(fill_device(*dev, s, pool_mem.data(), pool_bytes, host));
  const std::size_t index_bytes =
      static_cast<std::size_t>(keys) * sizeof(Key) + static_cast<std::size_t>(o.bags + 1) * sizeof(std::int64_t);
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer index, dev->allocate(index_bytes));
  STRATA_ASSIGN_OR_RETURN(gpu::PinnedBuffer index_host, dev->allocate_pinned(index_bytes));
  Key* rows_host = index_host.as<Key>();
  auto* offsets_host = reinterpret_cast<std::int64_t*>(rows_host + keys);
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<Key> pick(0, o.slots - 1);
  for (std::int64_t k = 0; k < keys; ++k) rows_host[k] = pick(rng);
  for (std::int64_t i = 0; i <= o.bags; ++i) offsets_host[i] = i * o.pooling;
  dev->copy_h2d(s, index.data(), index_host.data(), index_bytes);
  STRATA_ASSIGN_OR_RETURN(gpu::DeviceBuffer out,
                          dev->allocate(static_cast<std::size_t>(o.bags * o.dim) * sizeof(float)));
  STRATA_RETURN_IF_ERROR(dev->synchronize(s));
  const gpu::SlotPool pool{pool_mem.as<float>(), o.slots, stride, o.dim, 0};
  gpu::LookupFeature f;
  f.rows = index.as<Key>();
  f.offsets = reinterpret_cast<const std::int64_t*>(index.as<Key>() + keys);
  f.batch = o.bags;
  f.num_keys = keys;
  f.out = out.as<float>();
  const std::vector<gpu::LookupFeature> features{f};
  STRATA_ASSIGN_OR_RETURN(const double gather_s, time_op(*dev, s, o, [&] { dev->gather_pool(s, pool, features); }));
  const double row_bytes = static_cast<double>(keys) * o.dim * sizeof(float);
  const double out_bytes = static_cast<double>(o.bags) * o.dim * sizeof(float);
  const double gather_gbs = gbs(row_bytes + out_bytes, gather_s);
  j["gather_pool"] = {{"s", gather_s},
                      {"rows_read_bytes", row_bytes},
                      {"out_written_bytes", out_bytes},
                      {"index_bytes", index_bytes},
                      {"hbm_gbs", gather_gbs},
                      {"fraction_of_d2d", d2d_gbs > 0 ? gather_gbs / d2d_gbs : 0.0},
                      {"lookups_per_s", gather_s > 0 ? static_cast<double>(keys) / gather_s : 0.0}};
  pool_mem = gpu::DeviceBuffer();
  index = gpu::DeviceBuffer();
  out = gpu::DeviceBuffer();

  STRATA_RETURN_IF_ERROR(fill_uploads(*dev, s, o, h2d_gbs, rng, j));
  double worst_fill = 1e300;
  for (const auto& x : j["fill_upload"]) worst_fill = std::min(worst_fill, x["fraction_of_h2d"].get<double>());
  j["targets"] = {{"gather_pool_fraction_of_d2d", {{"value", j["gather_pool"]["fraction_of_d2d"]}, {"target", 0.70}}},
                  {"fill_upload_fraction_of_h2d_worst", {{"value", worst_fill}, {"target", 0.85}}}};
  STRATA_RETURN_IF_ERROR(gather_sweep(*dev, s, o, d2d_gbs, host, rng, j));
  STRATA_RETURN_IF_ERROR(backward(*dev, s, o, host, rng, j));
  return j;
}

void print(const nlohmann::json& j) {
  const auto& c = j["copies"];
  std::printf("device: %s (%s)\n", j["device"]["name"].get<std::string>().c_str(),
              j["device"]["backend"].get<std::string>().c_str());
  std::printf("copies (%.0f MiB): D2D %.1f GB/s of HBM traffic (read + write), pinned H2D %.2f GB/s, D2H %.2f GB/s\n",
              j["settings"]["copy_bytes"].get<double>() / (1 << 20), c["d2d_hbm_gbs"].get<double>(),
              c["h2d_gbs"].get<double>(), c["d2h_gbs"].get<double>());
  const auto& g = j["gather_pool"];
  std::printf(
      "gather-pool dim %d, %lld bags x %d: %.3f ms, %.1f GB/s (rows read + output written) = %.1f%% of D2D (target "
      "70%%)\n",
      j["settings"]["dim"].get<int>(), j["settings"]["bags"].get<long long>(), j["settings"]["pooling"].get<int>(),
      g["s"].get<double>() * 1e3, g["hbm_gbs"].get<double>(), 100 * g["fraction_of_d2d"].get<double>());
  for (const auto& x : j["gather_sweep"])
    std::printf("gather-pool dim %3d, %2d key(s) per bag: %.3f ms (issue %.3f ms), %.1f GB/s = %.1f%% of D2D\n",
                x["dim"].get<int>(), x["keys_per_bag"].get<int>(), x["s"].get<double>() * 1e3,
                x["issue_s"].get<double>() * 1e3, x["hbm_gbs"].get<double>(), 100 * x["fraction_of_d2d"].get<double>());
  const auto& bw = j["backward"];
  for (const char* k : {"uniform", "zipf"})
    std::printf("backward (sgd) %-7s: %.3f ms (issue %.3f ms), %lld unique rows, %lld hot, most used %lld times\n", k,
                bw[k]["s"].get<double>() * 1e3, bw[k]["issue_s"].get<double>() * 1e3,
                bw[k]["unique_rows"].get<long long>(), bw[k]["hot_rows"].get<long long>(),
                bw[k]["most_uses"].get<long long>());
  std::printf("backward zipf / uniform: %.2fx (target at most 2x)\n", bw["zipf_over_uniform"].get<double>());
  for (const auto& x : j["fill_upload"])
    std::printf(
        "fill upload of %6lld misses (%.2f MB): %.3f ms, %.2f GB/s = %.1f%% of pinned H2D (target 85%%); a plain H2D "
        "of that size: %.2f GB/s\n",
        x["rows"].get<long long>(), x["bytes"].get<double>() / 1e6, x["s"].get<double>() * 1e3, x["gbs"].get<double>(),
        100 * x["fraction_of_h2d"].get<double>(), x["same_size_h2d_gbs"].get<double>());
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  using namespace strata::bench;
  Options o;
  CLI::App app{"strata-devbench: device bandwidths next to the baselines of the GPU targets (same process)"};
  app.add_option("--backend", o.backend, "auto | cuda | emu")->capture_default_str();
  app.add_option("--copy-mib", o.copy_mib, "MiB of the D2D and the baseline pinned H2D/D2H copies")
      ->capture_default_str();
  app.add_option("--slots", o.slots, "gather-pool: records in the slot pool")->capture_default_str();
  app.add_option("--dim", o.dim, "row dim (fp32)")->capture_default_str();
  app.add_option("--state-dim", o.state_dim, "fill upload: optimizer state floats per record")->capture_default_str();
  app.add_option("--bags", o.bags, "gather-pool: bags per launch")->capture_default_str();
  app.add_option("--pooling", o.pooling, "gather-pool: keys per bag (uniform slots)")->capture_default_str();
  app.add_option("--fill-rows", o.fill_rows, "fill upload: misses per batch, a list")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--sweep-dims", o.sweep_dims, "gather sweep: dims, a list")->delimiter(',')->capture_default_str();
  app.add_option("--sweep-pooling", o.sweep_pooling, "gather sweep: keys per bag, a list (1: one-hot)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--reps", o.reps, "timed repetitions (the median is reported)")->capture_default_str();
  app.add_option("--iters", o.iters, "operations per repetition")->capture_default_str();
  app.add_option("--json", o.json_path, "write the results as JSON here");
  app.add_flag("!--no-progress", o.progress, "no progress lines on stderr");
  CLI11_PARSE(app, argc, argv);
  auto r = run(o);
  if (!r.is_ok()) {
    std::fprintf(stderr, "strata-devbench: %s\n", r.status().to_string().c_str());
    return 1;
  }
  nlohmann::json j = std::move(r).value();
  j["command"] = [&] {
    std::string c;
    for (int i = 0; i < argc; ++i) c += (i ? " " : "") + std::string(argv[i]);
    return c;
  }();
  print(j);
  if (!o.json_path.empty()) {
    std::ofstream out(o.json_path);
    out << j.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "strata-devbench: cannot write %s\n", o.json_path.c_str());
      return 1;
    }
  }
  return 0;
}
