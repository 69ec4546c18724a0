#include "store/engines/device_features.hpp"

#include <cstring>

#include "cache/cache_planner.hpp"
#include "gpu/kernels/launch_args.hpp"
#include "store/engines/detail/activation_copy.hpp"

namespace strata::detail {

using gpu::Staging;

namespace {
// Most unique rows of n key positions that can be hot (used more than kHotUses times).
std::size_t max_hot_rows(std::size_t n) { return n / static_cast<std::size_t>(gpu::kernels::kHotUses + 1); }
// 32-bit words that hold `bytes` (an activation buffer of half elements may end mid-word).
std::size_t words(std::size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }
}  // namespace

std::size_t feature_metadata_bytes(std::int64_t bags, std::int64_t keys, std::size_t weights, std::int64_t unique,
                                   bool rows) {
  const std::size_t n = static_cast<std::size_t>(keys), U = static_cast<std::size_t>(unique);
  return Staging::bytes_for<std::int64_t>(static_cast<std::size_t>(bags + 1)) + Staging::bytes_for<Key>(n) +
         Staging::bytes_for<float>(weights) + Staging::bytes_for<Key>(U) + Staging::bytes_for<std::int64_t>(U + 1) +
         2 * Staging::bytes_for<std::int32_t>(n) + Staging::bytes_for<std::int64_t>(max_hot_rows(n)) +
         (rows ? Staging::bytes_for<Key>(U) : 0);
}

bool rounds_by_row(const TableSpec& spec) {
  return spec.stochastic_rounding && (spec.dtype != DType::kF32 || spec.state_dtype != DType::kF32);
}

void add_feature_bytes(const JaggedKeys& k, std::int64_t unique, const TableSpec& spec, std::size_t& mirrored) {
  mirrored += feature_metadata_bytes(k.batch_size(), k.num_keys(), k.weights.size(), unique, rounds_by_row(spec));
}

bool needs_activation_staging(const DeviceFeature& f, const MatrixView& out) {
  return f.out_bytes && (out.space == MemorySpace::kHost || f.look.out_dtype != DType::kF32);
}

gpu::StagingSizes activation_bytes(const std::vector<DeviceFeature>& feats) {
  gpu::StagingSizes z;
  for (const DeviceFeature& f : feats) {
    const std::size_t both =
        Staging::bytes_for<float>(words(f.out_bytes)) + Staging::bytes_for<float>(words(f.grad_bytes));
    z.host_only += both;
    z.dev_only += both;
  }
  return z;
}

void stage_activations(Staging& act, std::vector<DeviceFeature>& feats) {
  for (DeviceFeature& f : feats) {
    f.look.out = act.dev_only<float>(words(f.out_bytes));
    f.update.grads = act.dev_only<float>(words(f.grad_bytes));
    f.host_out = act.host_only<float>(words(f.out_bytes));
    f.host_grad = act.host_only<float>(words(f.grad_bytes));
  }
}

DeviceFeature stage_feature(Staging& st, const JaggedKeys& k, const TableSpec& spec, const UniqueKeys& u,
                            const std::vector<Key>& unique_slots) {
  const std::size_t n = static_cast<std::size_t>(k.num_keys());
  auto offs = st.mirrored<std::int64_t>(static_cast<std::size_t>(k.batch_size() + 1));
  copy_offsets(k, offs.host);
  auto slots = st.mirrored<Key>(n);
  cache::expand_slots(u, unique_slots, slots.host);
  const float* wdev = nullptr;
  if (!k.weights.empty()) {
    auto wt = st.mirrored<float>(n);
    std::memcpy(wt.host, k.weights.data(), n * sizeof(float));
    wdev = wt.dev;
  }
  auto us = st.mirrored<Key>(static_cast<std::size_t>(u.size()));
  if (u.size()) std::memcpy(us.host, unique_slots.data(), static_cast<std::size_t>(u.size()) * sizeof(Key));
  auto uo = st.mirrored<std::int64_t>(u.offsets.size());
  std::memcpy(uo.host, u.offsets.data(), u.offsets.size() * sizeof(std::int64_t));
  auto pos = st.mirrored<std::int32_t>(n);
  if (n) std::memcpy(pos.host, u.positions.data(), n * sizeof(std::int32_t));
  auto bag = st.mirrored<std::int32_t>(n);
  if (spec.pooling != Pooling::kNone) bag_of_positions(k, bag.host);
  auto hot = st.mirrored<std::int64_t>(max_hot_rows(n));
  const Key* rows = nullptr;
  if (rounds_by_row(spec)) {
    auto r = st.mirrored<Key>(static_cast<std::size_t>(u.size()));
    if (u.size()) std::memcpy(r.host, u.keys.data(), static_cast<std::size_t>(u.size()) * sizeof(Key));
    rows = r.dev;
  }
  std::int64_t num_hot = 0;
  for (std::int64_t r = 0; r < u.size(); ++r)
    if (u.offsets[static_cast<std::size_t>(r) + 1] - u.offsets[static_cast<std::size_t>(r)] > gpu::kernels::kHotUses)
      hot.host[num_hot++] = r;

  DeviceFeature f;
  const std::int64_t elements = output_rows(k, spec.pooling) * spec.dim;
  f.out_bytes = static_cast<std::size_t>(elements * element_bytes(spec.output_dtype));
  f.grad_bytes = static_cast<std::size_t>(elements) * sizeof(float);
  f.look = gpu::LookupFeature{offs.dev,     k.batch_size(), slots.dev, wdev,
                              k.num_keys(), spec.pooling,   nullptr,   spec.output_dtype};
  gpu::UpdateFeature& uf = f.update;
  uf.offsets = offs.dev;
  uf.batch = k.batch_size();
  uf.weights = wdev;
  uf.num_keys = k.num_keys();
  uf.pooling = spec.pooling;
  uf.unique_slots = us.dev;
  uf.unique_rows = rows;
  uf.unique_offsets = uo.dev;
  uf.positions = pos.dev;
  uf.bag_of = bag.dev;
  uf.num_unique = u.size();
  uf.grads = nullptr;
  uf.hot = hot.dev;
  uf.num_hot = num_hot;
  return f;
}

gpu::LookupFeature lookup_into(const DeviceFeature& f, const MatrixView& out) {
  gpu::LookupFeature l = f.look;
  if (out.space == MemorySpace::kDevice) l.out = out.data;
  return l;
}

gpu::UpdateFeature update_from(const DeviceFeature& f, const ConstMatrixView& grads) {
  gpu::UpdateFeature u = f.update;
  if (grads.space == MemorySpace::kDevice && f.look.out_dtype == DType::kF32) u.grads = grads.data;
  return u;
}

Status finish_outputs(gpu::Device& dev, gpu::StreamView s, Staging& st, const std::vector<DeviceFeature>& feats,
                      const std::vector<int>& feature, const std::vector<MatrixView>& outputs, const CallOrder& order) {
  bool host = false, device = false;
  for (std::size_t i = 0; i < feats.size(); ++i) {
    const DeviceFeature& f = feats[i];
    if (f.out_bytes == 0) continue;  // a feature of zero rows may have null views
    if (outputs[static_cast<std::size_t>(feature[i])].space == MemorySpace::kDevice) {
      device = true;
    } else {
      dev.copy_d2h(s, f.host_out, f.look.out, f.out_bytes);
      host = true;
    }
  }
  dev.record(st.done(), s);
  if (device && order.caller.state()) dev.wait(order.caller, st.done());
  if (!host && order.caller.state()) return dev.status();
  STRATA_RETURN_IF_ERROR(dev.synchronize(st.done()));
  for (std::size_t i = 0; i < feats.size(); ++i) {
    const MatrixView& out = outputs[static_cast<std::size_t>(feature[i])];
    if (feats[i].out_bytes && out.space == MemorySpace::kHost)
      copy_activations(dev.counters(), out.data, feats[i].host_out, feats[i].out_bytes);
  }
  return Status::ok();
}

Result<bool> copy_gradients(gpu::Device& dev, gpu::StreamView s, std::vector<DeviceFeature>& feats,
                            const std::vector<int>& feature, const std::vector<ConstMatrixView>& grads) {
  bool device = false, widen_later = false;
  for (std::size_t i = 0; i < feats.size(); ++i) {
    DeviceFeature& f = feats[i];
    if (f.out_bytes == 0) continue;
    const ConstMatrixView& g = grads[static_cast<std::size_t>(feature[i])];
    const DType dtype = f.look.out_dtype;
    if (g.space == MemorySpace::kDevice) {
      device = true;
      if (dtype == DType::kF32) continue;
      dev.copy_d2h(s, f.host_out, g.data, f.out_bytes);  // widened below, once the host has it
      widen_later = true;
      continue;
    }
    if (dtype == DType::kF32) {
      copy_activations(dev.counters(), f.host_grad, g.data, f.grad_bytes);
    } else {
      widen_activations(dev.counters(), f.host_grad, g.data, dtype, f.grad_bytes / sizeof(float));
    }
    dev.copy_h2d(s, const_cast<float*>(f.update.grads), f.host_grad, f.grad_bytes);
  }
  if (!widen_later) return device;
  STRATA_RETURN_IF_ERROR(dev.synchronize(s));
  for (std::size_t i = 0; i < feats.size(); ++i) {
    DeviceFeature& f = feats[i];
    const ConstMatrixView& g = grads[static_cast<std::size_t>(feature[i])];
    if (f.out_bytes == 0 || g.space != MemorySpace::kDevice || f.look.out_dtype == DType::kF32) continue;
    widen_activations(dev.counters(), f.host_grad, f.host_out, f.look.out_dtype, f.grad_bytes / sizeof(float));
    dev.copy_h2d(s, const_cast<float*>(f.update.grads), f.host_grad, f.grad_bytes);
  }
  return device;
}

Status finish_gradients(gpu::Device& dev, gpu::EventView done, bool device_grads, const CallOrder& order) {
  if (!device_grads) return dev.status();
  if (order.caller.state()) {
    dev.wait(order.caller, done);
    return dev.status();
  }
  return dev.synchronize(done);
}

}  // namespace strata::detail
