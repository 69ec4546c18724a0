#include "store/engines/detail/slot_pool_engine.hpp"

#include <utility>

#include "core/record_layout.hpp"
#include "core/row_math.hpp"
#include "host/host_table.hpp"

namespace strata::detail {

SlotPoolEngine::~SlotPoolEngine() {
  // Streams that init() never created (it failed first) have nothing to wait for; waiting on one
  // would leave a sticky error on the device the store shares.
  for (const gpu::Stream* s : {&copy_, &writeback_, &compute_}) {
    if (*s) (void)dev_.synchronize(s->view());
  }
}

Status SlotPoolEngine::init(const SlotPoolOptions& options) {
  STRATA_ASSIGN_OR_RETURN(copy_, dev_.create_stream());
  if (options.writeback_stream) {
    STRATA_ASSIGN_OR_RETURN(writeback_, dev_.create_stream());
  }
  STRATA_ASSIGN_OR_RETURN(compute_, dev_.create_stream());
  if (options.progress_event) {
    STRATA_ASSIGN_OR_RETURN(progress_, dev_.create_event());
  }
  return Status::ok();
}

std::string pool_name(const RecordShape& shape) {
  std::string s = "(dim " + std::to_string(shape.dim) + ", state " + std::to_string(shape.state_dim);
  if (shape.dtype != DType::kF32 || shape.state_dtype != DType::kF32)
    s += std::string(", ") + to_string(shape.dtype) + ", state " + to_string(shape.state_dtype);
  return s + ")";
}

std::map<RecordShape, std::vector<int>, RecordShapeLess> SlotPoolEngine::shapes(const StoreConfig& config,
                                                                                const std::vector<int>& tables) {
  std::map<RecordShape, std::vector<int>, RecordShapeLess> out;
  for (int t : tables) out[record_shape(config.tables[static_cast<std::size_t>(t)].spec)].push_back(t);
  return out;
}

Status SlotPoolEngine::add_pool(const RecordShape& shape, std::int64_t slots, std::vector<int> tables,
                                const std::string& needs) {
  const std::int64_t stride = record_words(shape);
  const std::size_t bytes = static_cast<std::size_t>(slots * stride) * sizeof(float);
  auto mem = dev_.allocate(bytes);
  if (!mem)
    return Status::resource_exhausted(needs + std::to_string(bytes) +
                                      " bytes of device memory: " + mem.status().message());
  Pool pool;
  pool.memory = std::move(mem).value();
  pool.view = gpu::SlotPool{pool.memory.as<float>(), slots, stride, shape.dim, shape.state_dim};
  pool.view.dtype = shape.dtype;
  pool.view.state_dtype = shape.state_dtype;
  pool.tables = std::move(tables);
  pools_.push_back(std::move(pool));
  return Status::ok();
}

Status SlotPoolEngine::reserve_overflow(int p, std::int64_t records) {
  Pool& pool = pools_[static_cast<std::size_t>(p)];
  if (records <= pool.view.overflow_slots) return Status::ok();
  const std::size_t rec = static_cast<std::size_t>(pool.view.record_bytes());
  for (const gpu::Stream* s : {&copy_, &writeback_, &compute_})
    if (*s) STRATA_RETURN_IF_ERROR(dev_.synchronize(s->view()));
  // Exactly what the plan needs, no headroom: a region that took more than its batch needs could
  // leave no room for that batch's staging, taken next, and never shrinks, so the batch would be
  // refused at every forward. It grows again only when a batch needs more (warm-up).
  auto mem = dev_.allocate(static_cast<std::size_t>(records) * rec);
  const std::int64_t got = records;
  if (!mem)
    return Status::resource_exhausted(std::to_string(static_cast<std::size_t>(records) * rec) +
                                      " bytes of device memory for " + std::to_string(records) +
                                      " rows outside slot pool " + pool_name(pool.view.shape()) + ": " +
                                      mem.status().message());
  gpu::DeviceBuffer grown = std::move(mem).value();
  if (pool.view.overflow_slots > 0) {
    dev_.copy_d2d(copy_.view(), grown.data(), pool.view.overflow,
                  static_cast<std::size_t>(pool.view.overflow_slots) * rec);
    STRATA_RETURN_IF_ERROR(dev_.synchronize(copy_.view()));
  }
  pool.overflow = std::move(grown);  // frees the old region (after the device's work, gpu/device.hpp)
  pool.view.overflow = pool.overflow.as<float>();
  pool.view.overflow_slots = got;
  return Status::ok();
}

Status SlotPoolEngine::forward(SlotBatch& b, const EngineFeatures& f, const std::vector<MatrixView>& outputs,
                               const CallOrder& order) {
  for (std::size_t i = 0; i < b.dev.size() && !b.act; ++i)
    if (needs_activation_staging(b.dev[i], outputs[static_cast<std::size_t>(f.feature[i])]))
      STRATA_RETURN_IF_ERROR(stage_activations(b));
  const gpu::StreamView s = compute_.view();
  if (order.after.state()) dev_.wait(s, order.after);
  dev_.wait(s, b.st->ready());
  for (PoolWork& w : b.work) {
    w.looks.resize(w.feats.size());
    for (std::size_t j = 0; j < w.feats.size(); ++j) {
      const std::size_t i = static_cast<std::size_t>(w.feats[j]);
      w.looks[j] = lookup_into(b.dev[i], outputs[static_cast<std::size_t>(f.feature[i])]);
    }
    dev_.gather_pool(s, pools_[static_cast<std::size_t>(w.pool)].view, w.looks);
  }
  return finish_outputs(dev_, s, *b.st, b.dev, f.feature, outputs, order);
}

Status SlotPoolEngine::backward(SlotBatch& b, const EngineFeatures& f, const std::vector<ConstMatrixView>& grads,
                                std::int64_t t, const CallOrder& order) {
  // Host and half-size gradients land in the activation staging that forward took for the host or
  // half-size outputs: the store refuses a gradient in another space than its output
  // (batch_checks.cpp), so one is there.
  for (std::size_t i = 0; i < b.dev.size(); ++i)
    STRATA_CHECK(b.act || !b.dev[i].out_bytes ||
                 (grads[static_cast<std::size_t>(f.feature[i])].space != MemorySpace::kHost &&
                  b.dev[i].look.out_dtype == DType::kF32));
  const gpu::StreamView s = compute_.view();
  if (order.after.state()) dev_.wait(s, order.after);
  // Half-size device gradients are widened on the host (a host wait on the device): a failed device fails the call
  // there, and the batch retires (its staging back to the rings) as after any failed update.
  const Result<bool> copied = copy_gradients(dev_, s, b.dev, f.feature, grads);
  if (!copied) {
    retire(b);
    return copied.status();
  }
  const bool device_grads = copied.value();
  for (PoolWork& w : b.work) {
    w.updates.resize(w.feats.size());
    for (std::size_t j = 0; j < w.feats.size(); ++j) {
      const std::size_t i = static_cast<std::size_t>(w.feats[j]);
      w.updates[j] = update_from(b.dev[i], grads[static_cast<std::size_t>(f.feature[i])]);
      w.updates[j].step = make_optimizer_step(spec_of(f.table[i]), t);
    }
    dev_.backward_update(s, pools_[static_cast<std::size_t>(w.pool)].view, w.updates);
  }
  const gpu::EventView done = b.st->done();
  retire(b);  // records done after the updates
  return finish_gradients(dev_, done, device_grads, order);
}

void SlotPoolEngine::discard(SlotBatch& b) {
  dev_.wait(compute_.view(), b.st->ready());
  retire(b);
}

void SlotPoolEngine::retire(SlotBatch& b) {
  if (progress_) dev_.record(progress_.view(), compute_.view());
  dev_.record(b.st->done(), compute_.view());
  staging_.give_back(std::move(b.st));
  if (b.act) {
    dev_.record(b.act->done(), compute_.view());
    activations_.give_back(std::move(b.act));
  }
}

Status SlotPoolEngine::stage_activations(SlotBatch& b) {
  if (b.act) return Status::ok();
  const gpu::StagingSizes want = activation_bytes(b.dev);
  auto act = activations_.take(want);
  if (!act)
    return act.status().with_context("staging of " + std::to_string(want.dev_only) + " bytes of device memory and " +
                                     std::to_string(want.host_only) +
                                     " bytes of pinned memory for the outputs and gradients of host views");
  b.act = std::move(act).value();
  detail::stage_activations(*b.act, b.dev);
  return Status::ok();
}

}  // namespace strata::detail
