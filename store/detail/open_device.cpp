#include "store/detail/open_device.hpp"

#include <string>

#include "gpu/current_device.hpp"

namespace strata::detail {

namespace {

// The ordinal a pinned number or "current" stands for, before it is checked against a communicator.
Result<int> chosen_ordinal(const DeviceConfig& d, int visible, const std::string& gpus) {
  if (d.ordinal >= 0) {
    if (d.ordinal >= visible)
      return Status::invalid_argument("device.ordinal " + std::to_string(d.ordinal) + " is not a visible GPU: " + gpus);
    return d.ordinal;
  }
  Result<int> current = gpu::cuda_current_device();
  if (!current) return current.status().with_context("device.ordinal \"current\"");
  return current;
}

}  // namespace

Result<int> cuda_ordinal(const DeviceConfig& d, const dispatch::Communicator* comm, int visible) {
  const std::string gpus = std::to_string(visible) + " CUDA GPU(s) visible, ordinals [0, " + std::to_string(visible) +
                           ") (CUDA_VISIBLE_DEVICES)";
  if (d.ordinal >= 0 || d.ordinal == kDeviceOrdinalCurrent) {
    STRATA_ASSIGN_OR_RETURN(const int ordinal, chosen_ordinal(d, visible, gpus));
    // A rank whose collectives run on a GPU (nccl) keeps its store there: another GPU would stage
    // every exchange across devices, or be another rank's.
    if (comm && comm->device() >= 0 && ordinal != comm->device()) {
      const std::string given =
          d.ordinal >= 0 ? std::to_string(d.ordinal) : "\"current\" (CUDA device " + std::to_string(ordinal) + ")";
      return Status::invalid_argument("device.ordinal " + given + " is not the GPU of rank " +
                                      std::to_string(comm->rank()) + "'s " + comm->kind() +
                                      " communicator, CUDA device " + std::to_string(comm->device()) +
                                      ": expected \"auto\" or " + std::to_string(comm->device()));
    }
    return ordinal;
  }
  if (d.ordinal != kDeviceOrdinalAuto)
    return Status::invalid_argument("device.ordinal " + std::to_string(d.ordinal) +
                                    " is not a device ordinal (expected >= 0, \"current\" or \"auto\")");
  if (!comm) return 0;
  if (comm->device() >= 0) return comm->device();
  return comm->local_rank() % visible;
}

Result<std::unique_ptr<gpu::Device>> open_device(const DeviceConfig& d, const dispatch::Communicator* comm, int threads,
                                                 int numa_nodes) {
  bool want_cuda = d.backend == BackendChoice::kCuda;
  int visible = 0;
  if (d.backend != BackendChoice::kEmu) {
    // A broken CUDA setup is not "no GPU": running on emu would hide it behind a slow store.
    auto gpus = gpu::cuda_devices();
    if (!gpus) {
      if (d.backend == BackendChoice::kAuto)
        return gpus.status().with_context(
            "device backend auto: will not fall back to the emulated device while CUDA is broken (fix CUDA, or set "
            "device.backend to emu to run without the GPU)");
      return gpus.status().with_context("device backend cuda");
    }
    visible = gpus.value();
    if (d.backend == BackendChoice::kAuto) want_cuda = visible > 0;
  }
  if (want_cuda) {
    int ordinal = 0;  // with no GPU (or no CUDA backend) make_cuda_device says so
    if (visible > 0) {
      STRATA_ASSIGN_OR_RETURN(ordinal, cuda_ordinal(d, comm, visible));
    }
    auto dev = gpu::make_cuda_device(ordinal, static_cast<std::size_t>(d.capacity), numa_nodes);
    if (!dev) return dev.status().with_context("device backend cuda");
    return dev;
  }
  gpu::EmuOptions o;
  if (d.capacity > 0) o.capacity = static_cast<std::size_t>(d.capacity);
  o.threads = threads;
  o.max_delay_us = d.emu_max_delay_us;
  o.fail_after_ops = d.emu_fail_after_ops;
  o.numa_nodes = numa_nodes;
  return gpu::make_emu_device(o);
}

}  // namespace strata::detail
