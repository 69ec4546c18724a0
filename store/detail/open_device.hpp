#pragma once
// The device a store opens (config `device`): the backend, and under cuda which GPU its ordinal
// stands for on this rank.

#include <memory>

#include "dispatch/communicator.hpp"
#include "gpu/device.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

/// The CUDA ordinal `d.ordinal` stands for, with `visible` GPUs visible (> 0): an ordinal >= 0
/// itself (InvalidArgument naming device.ordinal when it is not visible); kDeviceOrdinalCurrent
/// the calling thread's current device; kDeviceOrdinalAuto, with a communicator, its GPU (nccl)
/// or its local rank modulo `visible`, else 0. With a communicator that has a GPU (device() >= 0),
/// a pinned or current ordinal that is not that GPU is InvalidArgument naming device.ordinal, the
/// value and the communicator's device.
Result<int> cuda_ordinal(const DeviceConfig& d, const dispatch::Communicator* comm, int visible);

/// Opens the device of a store, on the thread that calls Store::open (ordinal "current" reads that
/// thread's current device): backend auto is cuda when a GPU is visible (a broken CUDA is an
/// error, never a silent fall-back to emu), else emu.
Result<std::unique_ptr<gpu::Device>> open_device(const DeviceConfig& d, const dispatch::Communicator* comm, int threads,
                                                 int numa_nodes);

}  // namespace strata::detail
