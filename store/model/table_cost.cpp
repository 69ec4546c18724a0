#include "store/model/table_cost.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "core/half.hpp"
#include "core/record_layout.hpp"
#include "host/host_table.hpp"
#include "store/engines/detail/slot_pool_engine.hpp"

namespace strata {

void add_bytes(StepBytes& total, const StepBytes& b) {
  total.hbm_read += b.hbm_read;
  total.hbm_write += b.hbm_write;
  total.h2d += b.h2d;
  total.d2h += b.d2h;
  total.host_read += b.host_read;
  total.host_write += b.host_write;
  total.host_remote += b.host_remote;
  total.all_to_all += b.all_to_all;
  total.launches += b.launches;
  total.host_cpu_read += b.host_cpu_read;
  total.host_cpu_write += b.host_cpu_write;
  total.host_gathers.insert(total.host_gathers.end(), b.host_gathers.begin(), b.host_gathers.end());
}

RowSizes row_sizes(const TableSpec& spec) {
  const RecordShape shape = record_shape(spec);
  const auto bytes = [](std::int64_t words) { return 4.0 * static_cast<double>(words); };
  return {static_cast<double>(element_bytes(spec.dtype)) * spec.dim,
          static_cast<double>(element_bytes(spec.output_dtype)) * spec.dim, 4.0 * spec.dim,
          bytes(row_words(shape) + state_words(shape)), bytes(record_words(shape))};
}

double exchanged_row_bytes(const TableSpec& spec) { return 4.0 * spec.dim; }

double exchange_bytes(const TableSpec& spec, double remote) { return (8.0 + 2.0 * exchanged_row_bytes(spec)) * remote; }

void scale_bytes(StepBytes& b, double f) {
  for (double* x : {&b.hbm_read, &b.hbm_write, &b.h2d, &b.d2h, &b.host_read, &b.host_write, &b.host_remote,
                    &b.all_to_all, &b.launches, &b.host_cpu_read, &b.host_cpu_write})
    *x *= f;
  for (RowGather& g : b.host_gathers) g.rows *= f;
}

namespace {

// Random host rows read (`read`) or written.
void host_rows(StepBytes& b, double rows, double row_bytes, bool read) {
  if (rows <= 0) return;
  (read ? b.host_read : b.host_write) += rows * row_bytes;
  b.host_gathers.push_back({rows, row_bytes});
}

// The table alone in `placement`, as the store maps its host records (several ranks: rank 0's
// shard, sharded row-wise; CostOptions::whole_shards: the whole table).
Result<HostTableMemory> host_memory(const TableSpec& spec, Placement placement, const CostOptions& o) {
  StoreConfig one;
  one.threads = o.threads;
  TableConfig tc;
  tc.spec = spec;
  tc.placement = placement;
  one.tables.push_back(tc);
  return host_table_memory(one, o.numa_nodes, o.ranks > 1 && !o.whole_shards ? o.ranks : 0, 0, o.l2_bytes);
}

// A device copy of `n` bytes: over PCIe, and written into (H2D) or read from (D2H) HBM.
void copy_h2d(StepBytes& b, double n) {
  b.h2d += n;
  b.hbm_write += n;
}
void copy_d2h(StepBytes& b, double n) {
  b.d2h += n;
  b.hbm_read += n;
}

// Pooled rows of a batch: one per bag, or one per key without pooling.
double pooled_rows(const TableSpec& spec, const BatchKeys& k) {
  return static_cast<double>(spec.pooling == Pooling::kNone ? k.keys : k.bags);
}

// The gather kernel (gpu/device.cpp: gather_pool): K rows of `row` bytes and the index read,
// `out_rows` outputs of `out` bytes written.
void gather(StepBytes& b, const BatchKeys& k, double row, double out_rows, double out) {
  const double K = static_cast<double>(k.keys);
  b.hbm_read += K * row + 8.0 * (static_cast<double>(k.bags) + 1) + K * (8.0 + (k.weights > 0 ? 4.0 : 0.0));
  b.hbm_write += out_rows * out;
}

// The store's NaN/Inf count of device gradients (store/engines/finite_check.cpp): the gradients
// read, one 8-byte count per view written and copied D2H.
void finite_check(StepBytes& b, double grad_bytes, const CostOptions& o, double views = 1) {
  if (!o.check_finite || grad_bytes <= 0) return;
  b.hbm_read += grad_bytes;
  b.hbm_write += 8 * views;
  copy_d2h(b, 8 * views);
}

// A table of several features as its engine serves it (store/detail/features.hpp): unpooled, fp32
// outputs, into host views (the store's buffers of its unpooled rows, then of its spread
// gradients), one entry of its keys (`k` less its features).
bool merged(const BatchKeys& k) { return k.features > 1; }
TableSpec served_spec(const TableSpec& spec) {
  TableSpec s = spec;
  s.pooling = Pooling::kNone;
  s.output_dtype = DType::kF32;
  return s;
}
BatchKeys served_keys(BatchKeys k) {
  k.features = k.feature_rows = 0;
  return k;
}
CostOptions host_views(CostOptions o) {
  o.trainer_on_device = false;
  return o;
}

// The store's front of a table of several features (store/store_impl.cpp): with the trainer on the
// device, its features' views go through the host bounce (outputs H2D, gradients D2H), the
// gradients counted for NaN and Inf first (a count per view). The host pools the features from the
// unpooled rows (a CPU gather of K fp32 rows) and spreads their gradients onto the keys.
void front_bytes(StepBytes& b, const TableSpec& spec, Placement placement, const BatchKeys& k, const CostOptions& o) {
  const double out = static_cast<double>(k.feature_rows) * row_sizes(spec).out;
  const double K = static_cast<double>(k.keys);
  host_rows(b, K, exchanged_row_bytes(spec), true);
  b.host_cpu_read += K * exchanged_row_bytes(spec);
  if (!o.trainer_on_device) return;
  copy_h2d(b, out);
  if (placement != Placement::kCpu || o.store_has_device) finite_check(b, out, o, static_cast<double>(k.features));
  copy_d2h(b, out);
}

// The CPU optimizer: U records read and written by CPU threads.
void cpu_optimizer(StepBytes& b, double distinct, double record) {
  host_rows(b, distinct, record, true);
  host_rows(b, distinct, record, false);
  b.host_cpu_read += distinct * record;
  b.host_cpu_write += distinct * record;
}

// A cache's fills and write-backs of one batch (store/engines/cached_engine.cpp).
void add_transfers(StepBytes& b, const TableSpec& spec, const BatchKeys& k, const CostOptions& o) {
  const RowSizes z = row_sizes(spec);
  const double F = static_cast<double>(k.fills), W = static_cast<double>(k.writebacks);
  // Write-backs: packed on the device (slots read), then home.
  b.hbm_read += W * z.stride + 8.0 * W;
  b.hbm_write += W * z.stride;
  if (o.zero_copy) {
    b.d2h += W * z.record;
    b.hbm_read += W * z.record + 16.0 * W;
  } else {
    copy_d2h(b, W * z.stride);
  }
  host_rows(b, W, z.record, /*read=*/false);
  // Fills: host rows to the device, into their slots.
  host_rows(b, F, z.record, /*read=*/true);
  if (o.zero_copy) {
    b.h2d += F * z.record;
    b.hbm_read += 16.0 * F;
    b.hbm_write += F * z.record;
  } else {
    copy_h2d(b, F * z.stride);
    b.hbm_read += F * z.stride + 8.0 * F;
    b.hbm_write += F * z.stride;
  }
}

}  // namespace

StepBytes submit_bytes(const TableSpec& spec, Placement placement, const BatchKeys& k, const CostOptions& o) {
  StepBytes b;
  const RowSizes z = row_sizes(spec);
  switch (placement) {
    case Placement::kGpu:
    case Placement::kCached:
      copy_h2d(b, EngineStaging::gpu_feature(k.bags, k.keys, k.weights, k.distinct));
      if (placement == Placement::kCached) add_transfers(b, spec, k, o);
      break;
    case Placement::kOffload:
      if (o.offload_cpu_gather) break;
      copy_h2d(b, EngineStaging::offload_feature(k.bags, k.keys, k.weights));
      host_rows(b, static_cast<double>(k.distinct), z.row, true);  // the device reads them at forward
      break;
    case Placement::kCpu:
    case Placement::kHybrid:
      break;
  }
  return b;
}

std::int64_t feature_rows(const TableConfig& table, std::int64_t bags, const std::vector<std::int64_t>& keys) {
  if (table.features.size() <= 1) {
    const Pooling p =
        table.features.empty() ? table.spec.pooling : table.features[0].pooling.value_or(table.spec.pooling);
    return p == Pooling::kNone ? (keys.empty() ? 0 : keys[0]) : bags;
  }
  std::int64_t rows = 0;
  for (std::size_t j = 0; j < table.features.size(); ++j)
    rows += table.features[j].pooling.value_or(table.spec.pooling) == Pooling::kNone ? keys.at(j) : bags;
  return rows;
}

StepBytes compute_bytes(const TableSpec& spec, Placement placement, const BatchKeys& k, const CostOptions& o) {
  if (merged(k)) {
    StepBytes b = compute_bytes(served_spec(spec), placement, served_keys(k), host_views(o));
    front_bytes(b, spec, placement, k, o);
    return b;
  }
  StepBytes b;
  const RowSizes z = row_sizes(spec);
  const double K = static_cast<double>(k.keys), U = static_cast<double>(k.distinct);
  const double P = pooled_rows(spec, k), out = P * z.out;
  switch (placement) {
    case Placement::kGpu:
    case Placement::kCached:
      // Gradients are updated from fp32 (store/engines/device_features.cpp): half ones widened on
      // the host, a device view's brought there first (D2H at its size), then H2D at 4 bytes an element.
      gather(b, k, z.row, P, z.out);
      if (o.trainer_on_device) {
        finite_check(b, out, o);
        if (spec.output_dtype != DType::kF32) {
          copy_d2h(b, out);
          copy_h2d(b, P * z.grad);
        }
      } else {
        copy_d2h(b, out);         // outputs
        copy_h2d(b, P * z.grad);  // gradients
      }
      b.hbm_read += P * z.grad + U * (z.record + 16.0) + 8.0 * K;  // the update
      b.hbm_write += U * z.record;
      break;
    case Placement::kOffload:
      // The engine takes device views itself (store/engines/offload_engine.cpp).
      if (o.offload_cpu_gather) {
        host_rows(b, K, z.row, true);  // CPU threads pool
        b.host_cpu_read += K * z.row;
        if (o.trainer_on_device) copy_h2d(b, out);  // into the trainer's outputs (a host trainer's: pooled in place)
      } else {
        b.h2d += U * z.row;  // the distinct rows, zero-copy from pinned host memory
        b.hbm_read += 16.0 * U;
        b.hbm_write += U * z.row;
        gather(b, k, z.row, P, z.out);               // a device trainer's outputs are written in place
        if (!o.trainer_on_device) copy_d2h(b, out);  // a host trainer's come back
      }
      if (o.trainer_on_device) {  // the gradients, D2H once for the CPU optimizer
        finite_check(b, out, o);
        copy_d2h(b, out);
      }
      cpu_optimizer(b, U, z.record);
      break;
    case Placement::kCpu:
      host_rows(b, K, z.row, true);
      b.host_cpu_read += K * z.row;
      cpu_optimizer(b, U, z.record);
      if (o.trainer_on_device) {  // the store's host-bounce adaptor, or (no device in the store) the trainer's own
        copy_h2d(b, out);
        if (o.store_has_device) finite_check(b, out, o);
        copy_d2h(b, out);
      }
      break;
    case Placement::kHybrid:
      break;
  }
  return b;
}

StepBytes group_submit_bytes(Placement placement, std::int64_t fills, std::int64_t writebacks, std::int64_t distinct,
                             const CostOptions& o) {
  StepBytes b;
  if (placement == Placement::kCached) {
    double lists = EngineStaging::list(writebacks) + EngineStaging::list(fills);
    if (o.zero_copy) lists *= 2;  // and the host addresses of their rows
    copy_h2d(b, lists);
  } else if (placement == Placement::kOffload && !o.offload_cpu_gather) {
    copy_h2d(b, EngineStaging::list(distinct));
  }
  return b;
}

namespace {

// An array of `bytes` in the sharded engine's metadata, rounded up to 8-byte words (stage_meta).
double words(double bytes) { return std::ceil(bytes / 8.0) * 8.0; }

// The shard as its inner engine's table: rank 0's rows of it, served as unpooled bags.
TableSpec inner_spec(const TableSpec& spec, int ranks) {
  TableSpec s = spec;
  s.rows = (spec.rows + ranks - 1) / ranks;
  s.pooling = Pooling::kNone;
  return s;
}

// The inner engine's options: device views of the served rows and their gradients, which the
// store does not check (it checks the caller's gradients).
CostOptions inner_options(const CostOptions& o) {
  CostOptions i = o;
  i.trainer_on_device = true;
  i.check_finite = false;
  return i;
}

}  // namespace

StepBytes sharded_submit_bytes(const TableSpec& spec, Placement placement, const ShardStep& k, const CostOptions& o) {
  if (k.served.keys == 0) return {};  // the inner engine is given no feature of the table
  return submit_bytes(inner_spec(spec, o.ranks), placement == Placement::kHybrid ? Placement::kCached : Placement::kGpu,
                      k.served, inner_options(o));
}

StepBytes sharded_compute_bytes(const TableSpec& spec, const ShardStep& k, const CostOptions& o) {
  if (merged(k.source)) {
    ShardStep served = k;
    served.source = served_keys(k.source);
    StepBytes b = sharded_compute_bytes(served_spec(spec), served, host_views(o));
    front_bytes(b, spec, Placement::kGpu, k.source, o);
    return b;
  }
  StepBytes b;
  const RowSizes z = row_sizes(spec);
  // r: a stored row; x: a row as it moves between ranks and through the exchange's buffers.
  const double r = z.row, x = exchanged_row_bytes(spec), K = static_cast<double>(k.source.keys);
  const double B = static_cast<double>(k.source.bags), U = static_cast<double>(k.source.distinct);
  const double W = static_cast<double>(k.source.weights), S = static_cast<double>(k.served.keys);
  const double P = pooled_rows(spec, k.source), out = P * z.out, grad = P * z.grad;
  const bool pooled = spec.pooling != Pooling::kNone;
  // Forward: the shard's inner engine looks the served keys up into device memory.
  if (S > 0) gather(b, k.served, r, S, x);
  // Rows back to their sources (dispatch/exchange.cpp, device form): the index list of the keys
  // sent up; the served rows packed, sent (read at this rank, written at the receivers: peer
  // copies of thread ranks), the returned rows received and put at the unique keys.
  copy_h2d(b, 8.0 * U);
  b.hbm_read += 2.0 * S * x;
  b.hbm_write += S * x;
  b.hbm_write += U * x;
  b.hbm_read += U * x + 8.0 * U;
  b.hbm_write += U * x;
  // The source pools its bags from its unique rows: offsets, each key's unique index and the
  // weights up (8-byte words), then gather_pool.
  copy_h2d(b, words(8.0 * (B + 1)) + words(8.0 * K) + words(4.0 * W));
  gather(b, k.source, x, P, z.out);
  // Gradients are summed from fp32: half ones widened on the host, a device view's brought there
  // first (D2H at its size), then H2D at 4 bytes an element.
  if (o.trainer_on_device) {  // outputs and gradients in the trainer's device buffers
    finite_check(b, out, o);
    if (spec.output_dtype != DType::kF32) {
      copy_d2h(b, out);
      copy_h2d(b, grad);
    }
  } else {  // the engine's own D2H of the outputs (in 32-bit words) and H2D of the gradients
    copy_d2h(b, 4.0 * std::ceil(out / 4.0));
    copy_h2d(b, grad);
  }
  // Backward: the gradient sums' arguments up (offsets, weights, unique slots and offsets,
  // positions, bag of each position), then reduce_grads.
  copy_h2d(b, words(8.0 * (B + 1)) + words(4.0 * W) + words(8.0 * U) + words(8.0 * (U + 1)) + words(4.0 * K) +
                  (pooled ? words(4.0 * K) : 0.0));
  b.hbm_read += grad + 16.0 * U + 8.0 * K;
  b.hbm_write += U * x;
  // Sums to the holders: the index list up; the sums taken, sent, received and copied into the
  // served order.
  copy_h2d(b, 8.0 * U);
  b.hbm_read += U * x + 8.0 * U;
  b.hbm_write += U * x;
  b.hbm_read += U * x;
  b.hbm_write += S * x;
  b.hbm_read += S * x;
  b.hbm_write += S * x;
  // The inner engine's update of the served rows' U_s records from the served gradients (one
  // unpooled bag each; device views, which the store does not check).
  const double Us = static_cast<double>(k.served.distinct);
  b.hbm_read += S * x + Us * (z.record + 16.0) + 8.0 * S;
  b.hbm_write += Us * z.record;
  // Keys out, their rows back and their gradients out, to and from the other ranks, and one count
  // per table and peer (dispatch::KeyExchange).
  b.all_to_all += exchange_bytes(spec, static_cast<double>(k.remote)) + 8.0 * (o.ranks - 1.0);
  return b;
}

namespace {

double round64(double bytes) { return std::ceil(bytes / 64.0) * 64.0; }

// Device and pinned host bytes of staging buffers.
struct Staged {
  double device = 0, pinned = 0;
};

// The regions of a gpu::Staging request (gpu/staging.hpp) and what the buffers take once reserved
// for it with the headroom: twice each region, the mirrored one on both sides.
struct Regions {
  double mirrored = 0, host_only = 0, dev_only = 0;
  Staged doubled() const { return {2.0 * (mirrored + dev_only), 2.0 * (mirrored + host_only)}; }
};

// `n` records of a slot pool of `spec`'s shape, as staging holds them (at the stride).
double records(const TableSpec& spec, double n) { return round64(n * row_sizes(spec).stride); }

// One batch's staging in a slot-pool engine's ring (store/engines/gpu_engine.cpp submit,
// cached_engine.cpp prepare) for a feature of `bags` bags, `keys` keys (no per-key weights, as
// everywhere in this model) and `unique` distinct rows: its lookup and update arguments and,
// cached, the slots of its fills and write-backs, the write-backs packed on the device and the
// fills (staged: in the device and pinned at the stride; zero-copy: their host addresses).
Regions batch_regions(const TableSpec& spec, bool cached, std::int64_t bags, std::int64_t keys, std::int64_t unique,
                      const CostOptions& o) {
  Regions r;
  r.mirrored = EngineStaging::gpu_feature(bags, keys, 0, unique);
  if (!cached) return r;
  const double rec = records(spec, static_cast<double>(unique));
  r.mirrored += 2.0 * EngineStaging::list(unique);
  r.dev_only += rec;  // write-backs, packed
  if (o.zero_copy) {
    r.mirrored += 2.0 * EngineStaging::list(unique);
  } else {
    r.host_only += 2.0 * rec;
    r.dev_only += rec;  // fills
  }
  return r;
}

// A cache's flush staging (store/engines/cached_engine.cpp flush_sizes): one flush chunk of a slot
// pool of `spec`'s shape and `pool_rows` slots, before the headroom.
Regions flush_regions(const TableSpec& spec, std::int64_t pool_rows, const CostOptions& o) {
  const std::int64_t stride = record_words(record_shape(spec));
  const auto w = EngineStaging::flush_rows(pool_rows, stride);
  Regions flush;
  flush.mirrored = EngineStaging::list(w) * (o.zero_copy ? 2.0 : 1.0);
  flush.dev_only = records(spec, static_cast<double>(w));
  flush.host_only = o.zero_copy ? 0.0 : flush.dev_only;
  return flush;
}

// A slot-pool table's staging (gpu or cached, one rank or an inner engine of a sharded one):
// max_in_flight entries of the batch ring, each grown to twice the largest batch's need, and a
// cache's (`cache_rows` > 0) flush staging, grown to twice one flush chunk and kept (a flush:
// checkpoints, reads, the end of training). With cache.transfer auto the store first measures
// both transfers through up to EngineStaging::transfer_probe_rows rows of the pool, while it opens
// (nothing else staged yet): the larger of the two. `flush`: the part of the result that is the
// flush staging (a store keeps one for all its pools: store_memory counts it once).
Staged slot_pool_staging(const TableSpec& spec, bool cached, std::int64_t bags, std::int64_t keys, std::int64_t unique,
                         std::int64_t cache_rows, const CostOptions& o, Staged* flush = nullptr) {
  const Staged entry = batch_regions(spec, cached, bags, keys, unique, o).doubled();
  Staged s{o.max_in_flight * entry.device, o.max_in_flight * entry.pinned};
  if (!cached) return s;
  const Staged ring = s;
  const Staged f = flush_regions(spec, cache_rows, o).doubled();
  s.device += f.device;
  s.pinned += f.pinned;
  Staged without = ring;                   // the probe beside the ring alone
  if (o.transfer_probe && !o.zero_copy) {  // store/engines/cache_transfers.cpp zero_copy_is_faster
    const auto n = EngineStaging::transfer_probe_rows(cache_rows);
    Regions probe;
    probe.mirrored = 2.0 * EngineStaging::list(n);
    probe.dev_only = probe.host_only = records(spec, static_cast<double>(n));
    const Staged p = probe.doubled();
    s.device = std::max(s.device, p.device);
    s.pinned = std::max(s.pinned, p.pinned);
    without.device = std::max(without.device, p.device);
    without.pinned = std::max(without.pinned, p.pinned);
  }
  if (flush) *flush = {s.device - without.device, s.pinned - without.pinned};
  return s;
}

// An offload table's staging and outputs (store/engines/offload_engine.cpp submit and forward):
// every batch in flight takes an entry of the engine's ring, grown to twice its largest batch's
// need: the outputs in pinned memory (a device view's gradients come D2H into them too) and, with
// the device gather, its arguments (offsets, keys and the distinct rows' host addresses; no per-key
// weights, as everywhere in this model) mirrored and the distinct rows read into device memory.
// One step's outputs and gradients: with the trainer on the device its own buffers in HBM; host
// views of the device gather take a device buffer of the outputs per batch in flight, grown to
// twice (the CPU gather pools into them in place).
Staged offload_staging(const TableLoad& load, double b_max, double p_max, const RowSizes& z, const CostOptions& o) {
  const bool device_gather = !o.offload_cpu_gather;
  Regions r;
  r.host_only = round64(p_max * z.out);
  if (device_gather) {
    r.mirrored =
        EngineStaging::offload_feature(std::llround(b_max), load.max_keys, 0) + EngineStaging::list(load.max_distinct);
    r.dev_only = round64(static_cast<double>(load.max_distinct) * z.row);
  }
  const Staged entry = r.doubled();
  Staged s{o.max_in_flight * entry.device, o.max_in_flight * entry.pinned};
  if (o.trainer_on_device) {
    s.device += 2.0 * p_max * z.out;
  } else if (device_gather) {
    s.device += o.max_in_flight * 2.0 * round64(p_max * z.out);
  }
  return s;
}

// The front of a table of several features (store/store_impl.cpp): with the trainer on the device,
// its own buffers of the features' outputs and gradients in HBM (as a cpu table's, not counted)
// and the host bounce's pinned scratch (store/engines/host_bounce.cpp: two buffers, each grown to
// twice a call's views, every view rounded up to 64 bytes); the unpooled rows of a batch in host
// memory (keys x dim fp32: forward's rows, then backward's spread gradients). `pinned`: the host
// side, the bounce's scratch and the rows' buffer.
Staged front_memory(const TableSpec& spec, const TableLoad& load, Placement placement, const CostOptions& o) {
  Staged s;
  s.pinned = static_cast<double>(load.max_keys) * exchanged_row_bytes(spec);
  if (!o.trainer_on_device) return s;
  const double out = static_cast<double>(load.max_feature_rows) * row_sizes(spec).out;
  if (placement != Placement::kCpu) s.device += 2.0 * out;
  s.pinned += 4.0 * (out + 64.0 * load.features);
  return s;
}

// A cache of `cache_rows` rows over host records (the table's, or rank 0's shard's): its slots
// in HBM; in host memory the mapped records and the cache index.
Status add_cache(TableCost& c, const TableSpec& spec, std::int64_t cache_rows, Placement placement,
                 const CostOptions& o) {
  const RowSizes z = row_sizes(spec);
  c.hbm_bytes += static_cast<double>(cache_rows) * z.stride;
  STRATA_ASSIGN_OR_RETURN(const HostTableMemory m, host_memory(spec, placement, o));
  c.host_bytes += m.mapped_bytes + kCacheIndexBytesPerSlot * static_cast<double>(cache_rows);
  c.host_table_bytes += m.mapped_bytes;
  return Status::ok();
}

// One step of rank 0's sharded table (several ranks) from the means of `load` (the planner's):
// the rank's own batch of K keys, B bags and U distinct rows, U f of them held by other ranks;
// it serves S = U keys (row sharding spreads every rank's keys evenly) to U_s distinct rows of its
// shard, a hybrid cache missing U_s (1 - hit rate) of them, each miss a fill and a write-back.
ShardStep mean_shard_step(const TableLoad& load, double hit_rate, Placement placement, const CostOptions& o) {
  ShardStep k;
  const double f = (o.ranks - 1.0) / o.ranks;
  k.source.keys = std::llround(load.keys);
  k.source.bags = std::llround(load.bags);
  k.source.distinct = std::llround(load.distinct);
  k.remote = std::llround(load.distinct * f);
  const double us = load.shard_distinct > 0 ? load.shard_distinct : load.distinct;
  k.served.keys = k.served.bags = k.source.distinct;
  k.served.distinct = std::llround(us);
  if (placement == Placement::kHybrid) k.served.fills = k.served.writebacks = std::llround(us * (1.0 - hit_rate));
  return k;
}

// One rank's cost of a table sharded row-wise over o.ranks ranks (header comment).
Result<TableCost> sharded_cost(const TableSpec& spec, const TableLoad& load, Placement placement,
                               std::int64_t cache_rows, double hit_rate, const CostOptions& o) {
  const RowSizes z = row_sizes(spec);
  const double in_flight = o.max_in_flight;
  TableCost c;
  const ShardStep step = mean_shard_step(load, hit_rate, placement, o);
  c.bytes = sharded_submit_bytes(spec, placement, step, o);
  add_bytes(c.bytes, sharded_compute_bytes(spec, step, o));
  if (placement == Placement::kHybrid)
    add_bytes(c.bytes, group_submit_bytes(Placement::kCached, step.served.fills, step.served.writebacks, 0, o));
  // The most keys the rank serves in one step (every source's distinct keys of its shard), the
  // most distinct rows among them, and the rank's own most distinct rows, keys and bags.
  // Other plans than row sharding (CostOptions::whole_shards): the whole table on the rank, serving
  // every rank's distinct keys.
  const std::int64_t whole_served = o.ranks * load.max_distinct;
  const std::int64_t us_max = o.whole_shards ? std::max<std::int64_t>(1, std::min(whole_served, spec.rows))
                                             : std::max<std::int64_t>(1, load.shard_max_distinct);
  const std::int64_t s_max = o.whole_shards              ? whole_served
                             : load.shard_max_served > 0 ? load.shard_max_served
                                                         : std::max(load.max_distinct, load.shard_max_distinct);
  const double u_max = static_cast<double>(load.max_distinct), k_max = static_cast<double>(load.max_keys);
  const double sm = static_cast<double>(s_max);
  // The shard's inner engine (gpu or cached) stages the served keys (one unpooled bag each) as a
  // gpu or cached table's batch, in HBM and again in pinned memory, and a hybrid cache's fills and
  // write-backs with them.
  Staged flush;
  const Staged served = slot_pool_staging(spec, placement == Placement::kHybrid, s_max, s_max, us_max,
                                          placement == Placement::kHybrid ? cache_rows : 0, o, &flush);
  c.flush_hbm_bytes = flush.device;
  c.flush_host_bytes = flush.pinned;
  // The sharded engine's device scratch, grown to twice one step's need (gpu/grow_buffer.hpp):
  // served rows (then served gradients), unique rows, their gradient sums, and the exchange's send
  // and receive buffers.
  c.hbm_bytes += served.device + 2.0 * z.row * (sm + 2.0 * u_max + 2.0 * std::max(sm, u_max));
  // Its metadata scratch, grown likewise (store/engines/sharded_engine.cpp, reserve): the arguments
  // of the source's pooling and gradient sums, in HBM and again in pinned staging (no per-key
  // weights, as everywhere in this model); the exchange's index lists of the keys sent, in HBM and
  // pinned; one step's outputs, then their gradients (fp32, half ones widened): with the trainer on
  // the host the engine's buffer of them in HBM (out_) and its pinned staging (host_out_); on the
  // device the trainer's own buffers in HBM (of the output dtype) and, for half outputs, the
  // engine's buffers too, and its pinned buffer of the half gradients brought to the host
  // (half_grads_, in 32-bit words).
  const double b_max = load.max_bags > 0 ? static_cast<double>(load.max_bags) : std::ceil(load.bags);
  const double p_max = spec.pooling == Pooling::kNone ? k_max : b_max;
  const double meta = 2.0 * EngineStaging::sharded_feature(std::llround(b_max), load.max_keys, 0, load.max_distinct);
  const double index = 2.0 * 8.0 * u_max, staged = 2.0 * p_max * z.grad;
  const bool half = spec.output_dtype != DType::kF32;
  double dev_act = staged, host_act = staged;
  if (o.trainer_on_device) {
    dev_act = 2.0 * p_max * z.out + (half ? staged : 0.0);
    host_act = half ? staged + 2.0 * 4.0 * std::ceil(p_max * z.out / 4.0) : 0.0;
  }
  c.hbm_bytes += meta + index + dev_act;
  c.comm_bytes = in_flight * (16.0 * u_max + 12.0 * k_max + 4.0 * u_max + 24.0 * sm) + index;
  c.host_bytes += c.comm_bytes + served.pinned + meta + host_act;
  if (placement == Placement::kGpu) {
    c.hbm_bytes +=
        (o.whole_shards ? static_cast<double>(spec.rows) : std::ceil(static_cast<double>(spec.rows) / o.ranks)) *
        z.stride;
    return c;
  }
  STRATA_RETURN_IF_ERROR(add_cache(c, spec, cache_rows, placement, o));
  return c;
}

}  // namespace

Result<TableCost> table_cost(const TableSpec& spec, const TableLoad& load, Placement placement, std::int64_t cache_rows,
                             double hit_rate, const CostOptions& o) {
  if (load.features > 1) {
    // The engine's part as it serves the table (unpooled, fp32, host views), then the front's.
    TableLoad served = load;
    served.features = 0;
    served.feature_rows = 0;
    served.max_feature_rows = 0;
    STRATA_ASSIGN_OR_RETURN(TableCost c,
                            table_cost(served_spec(spec), served, placement, cache_rows, hit_rate, host_views(o)));
    BatchKeys k;
    k.keys = std::llround(load.keys);
    k.features = load.features;
    k.feature_rows = std::llround(load.feature_rows);
    front_bytes(c.bytes, spec, o.ranks > 1 ? Placement::kGpu : placement, k, o);
    const Staged front = front_memory(spec, load, placement, o);
    c.hbm_bytes += front.device;
    (placement == Placement::kGpu ? c.gpu_pinned_bytes : c.host_bytes) += front.pinned;
    return c;
  }
  if (o.ranks > 1) {
    if (placement != Placement::kGpu && placement != Placement::kHybrid)
      return Status::invalid_argument("table '" + spec.name + "': placement " + to_string(placement) +
                                      " serves one rank (expected gpu or hybrid over " + std::to_string(o.ranks) +
                                      " ranks)");
    return sharded_cost(spec, load, placement, cache_rows, hit_rate, o);
  }
  const RowSizes z = row_sizes(spec);
  const double in_flight = o.max_in_flight;
  const double B = load.bags;
  if (placement == Placement::kHybrid)
    return Status::invalid_argument("table '" + spec.name +
                                    "': placement hybrid is planned over several ranks (--ranks > 1)");
  // A mean step, counts rounded; in steady training every miss evicts a dirty row.
  BatchKeys k;
  k.keys = std::llround(load.keys);
  k.bags = std::llround(load.bags);
  k.distinct = std::llround(load.distinct);
  if (placement == Placement::kCached) k.fills = k.writebacks = std::llround(load.distinct * (1.0 - hit_rate));
  TableCost c;
  c.bytes = submit_bytes(spec, placement, k, o);
  add_bytes(c.bytes, compute_bytes(spec, placement, k, o));
  add_bytes(c.bytes, group_submit_bytes(placement, k.fills, k.writebacks, k.distinct, o));
  const double b_max = load.max_bags > 0 ? static_cast<double>(load.max_bags) : std::ceil(B);
  const double p_max = spec.pooling == Pooling::kNone ? static_cast<double>(load.max_keys) : b_max;
  switch (placement) {
    case Placement::kGpu:
    case Placement::kCached: {
      const bool cached = placement == Placement::kCached;
      Staged flush;
      const Staged st = slot_pool_staging(spec, cached, std::llround(b_max), load.max_keys, load.max_distinct,
                                          cached ? cache_rows : 0, o, &flush);
      c.flush_hbm_bytes = flush.device;
      c.flush_host_bytes = flush.pinned;
      // One step's outputs and gradients: the trainer's own buffers in HBM with it on the device;
      // the activation staging (an output buffer and an fp32 gradient buffer in HBM and pinned,
      // grown to twice the need) of each batch in flight with it on the host, and for half outputs
      // (device_features.cpp: needs_activation_staging) also with it on the device.
      const bool staged = !o.trainer_on_device || spec.output_dtype != DType::kF32;
      const double staging = staged ? in_flight * 2.0 * (round64(p_max * z.out) + round64(p_max * z.grad)) : 0.0;
      c.hbm_bytes += st.device + staging + (o.trainer_on_device ? 2.0 * p_max * z.out : 0.0);
      if (cached) {
        c.host_bytes += st.pinned + staging;
        STRATA_RETURN_IF_ERROR(add_cache(c, spec, cache_rows, placement, o));
      } else {
        c.hbm_bytes += static_cast<double>(spec.rows) * z.stride;
        c.gpu_pinned_bytes = st.pinned + staging;
      }
      break;
    }
    case Placement::kOffload:
    case Placement::kCpu: {
      if (placement == Placement::kOffload) {
        const Staged st = offload_staging(load, b_max, p_max, z, o);
        c.hbm_bytes += st.device;
        c.host_bytes += st.pinned;
      }
      STRATA_ASSIGN_OR_RETURN(const HostTableMemory m, host_memory(spec, placement, o));
      c.host_bytes += m.mapped_bytes + m.scratch_bytes;
      c.host_table_bytes += m.mapped_bytes + m.scratch_bytes;
      break;
    }
    case Placement::kHybrid:
      return Status::invalid_argument("table '" + spec.name +
                                      "': placement hybrid is planned over several ranks (--ranks > 1)");
  }
  return c;
}

TableLoad largest_load(const TableSpec& spec, std::int64_t keys, std::int64_t bags, int ranks) {
  TableLoad l;
  l.max_keys = keys;
  l.max_bags = bags;
  l.max_distinct = std::min(keys, spec.rows);
  l.keys = static_cast<double>(l.max_keys);
  l.bags = static_cast<double>(l.max_bags);
  l.distinct = static_cast<double>(l.max_distinct);
  if (ranks > 1) {
    l.shard_max_distinct = std::min(l.max_distinct, (spec.rows + ranks - 1) / ranks);
    l.shard_distinct = static_cast<double>(l.shard_max_distinct);
  }
  return l;
}

std::vector<SlotPool> slot_pools(const StoreConfig& config) {
  std::map<RecordShape, SlotPool, RecordShapeLess> by_shape;
  for (std::size_t t = 0; t < config.tables.size(); ++t) {
    const TableConfig& tc = config.tables[t];
    if (tc.placement != Placement::kCached && tc.placement != Placement::kHybrid) continue;
    const RecordShape shape = record_shape(tc.spec);
    SlotPool& p = by_shape[shape];
    p.shape = shape;
    p.name = detail::pool_name(shape);
    p.rows += cache_rows(tc);
    p.tables.push_back(t);
  }
  std::vector<SlotPool> out;
  out.reserve(by_shape.size());
  for (auto& [shape, pool] : by_shape) out.push_back(std::move(pool));
  return out;
}

Result<StoreMemory> store_memory(const StoreConfig& config, const std::vector<TableLoad>& loads,
                                 const CostOptions& options) {
  if (loads.size() != config.tables.size())
    return Status::invalid_argument("store_memory: " + std::to_string(loads.size()) + " loads for " +
                                    std::to_string(config.tables.size()) + " tables (expected one per table)");
  StoreMemory m;
  // The caches' slot pools of rank 0 (one per shape): the store keeps one flush staging, for the
  // largest chunk of any pool (store/engines/cached_engine.cpp flush).
  std::map<RecordShape, std::pair<TableSpec, std::int64_t>, RecordShapeLess> pools;
  for (std::size_t t = 0; t < config.tables.size(); ++t) {
    const TableConfig& tc = config.tables[t];
    // Without a world a hybrid table is a world of one: its shard is the table, cached.
    const Placement p = options.ranks <= 1 && tc.placement == Placement::kHybrid ? Placement::kCached : tc.placement;
    // Row sharding: rank 0's shard holds the most rows; other plans: priced as the whole table on
    // the rank (replicated holds it on every rank, table sharding on its owner).
    CostOptions o = options;
    o.whole_shards = options.ranks > 1 && tc.sharding.type != dispatch::ShardingType::kRow;
    std::int64_t rows = 0;
    if (p == Placement::kCached || p == Placement::kHybrid) {
      TableConfig shard = tc;
      if (options.ranks > 1 && !o.whole_shards) shard.spec.rows = (tc.spec.rows + options.ranks - 1) / options.ranks;
      rows = cache_rows(shard);
      auto& pool = pools[record_shape(tc.spec)];
      pool.first = tc.spec;
      pool.second += rows;
    }
    STRATA_ASSIGN_OR_RETURN(const TableCost c, table_cost(tc.spec, loads[t], p, rows, 0.0, o));
    m.hbm_bytes += c.hbm_bytes - c.flush_hbm_bytes;
    m.host_staging_bytes += c.host_bytes - c.host_table_bytes - c.flush_host_bytes + c.gpu_pinned_bytes;
  }
  Regions flush;
  for (const auto& [shape, pool] : pools) {
    const Regions f = flush_regions(pool.first, pool.second, options);
    flush = {std::max(flush.mirrored, f.mirrored), std::max(flush.host_only, f.host_only),
             std::max(flush.dev_only, f.dev_only)};
  }
  const Staged f = flush.doubled();
  m.hbm_bytes += f.device;
  m.host_staging_bytes += f.pinned;
  return m;
}

}  // namespace strata
