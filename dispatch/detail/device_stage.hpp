#pragma once
// Pinned host staging of device buffers, for communicators that move device buffers through host
// memory (`mpi`, and `transport` when its Transport does not take device buffers): one D2H copy
// into the stage before the collective, one H2D copy from it after.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "dispatch/communicator.hpp"
#include "gpu/device.hpp"

namespace strata::dispatch::detail {

/// Pinned staging of one device's buffers, allocated from that device (pinned memory belongs to a
/// device in this layer's accounting).
struct DeviceStage {
  const gpu::Device* device = nullptr;
  gpu::PinnedBuffer send, recv;
};

/// The stages of the devices a communicator was given, one per device. Each is grown to twice the
/// largest call made with it, so a steady state allocates nothing, also when several devices (the
/// stores sharing a communicator) take turns. Not thread-safe (one thread calls a communicator).
class DeviceStages {
 public:
  /// The stage of `d` (an empty one the first time). A reference valid until the next of()
  /// or forget().
  DeviceStage& of(const gpu::Device& d);
  /// Makes `st`, the stage of `d`, hold at least `send` and `recv` bytes: OK, or what failed
  /// (with the context "pinned staging of device buffers"; the buffer that failed is left empty).
  static Status grow(DeviceStage& st, gpu::Device& d, std::int64_t send, std::int64_t recv);
  /// Frees `device`'s stage (Communicator::forget_device); the other devices' stay.
  void forget(const gpu::Device& device) noexcept;

 private:
  std::vector<DeviceStage> stages_;
};

// ---- device collectives over a host collective ----
// Each checks its arguments and readies the device (judge_space), copies what leaves this rank
// D2H into the pinned send stage, runs the communicator's host collective between the stages and
// copies what arrived H2D. This rank's own share moves device to device. A failure before the data
// moves goes to the host collective (with the caller's pointers) as this rank's argument error or
// device error, so every rank fails the call alike (and a device error leaves the communicator
// usable). `space` is on a device.

/// The communicator's host all_to_all_v, with this rank's argument error ("" when none) and
/// device error (OK when none).
using HostAllToAllV =
    std::function<Status(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs, void* recv,
                         const std::int64_t* recv_counts, const std::int64_t* recv_displs, const std::string& arg_error,
                         const Status& device_error)>;
/// The host all_gather of the call's `bytes` between `send` and `recv`.
using HostAllGather =
    std::function<Status(const void* send, void* recv, const std::string& arg_error, const Status& device_error)>;
/// The host broadcast of the call's bytes and root in `data`.
using HostBroadcast = std::function<Status(void* data, const std::string& arg_error, const Status& device_error)>;

Status staged_all_to_all_v(DeviceStages& stages, int size, int rank, const void* send, const std::int64_t* send_counts,
                           const std::int64_t* send_displs, void* recv, const std::int64_t* recv_counts,
                           const std::int64_t* recv_displs, const BufferSpace& space, const HostAllToAllV& host);
Status staged_all_gather(DeviceStages& stages, int size, int rank, const void* send, std::int64_t bytes, void* recv,
                         const BufferSpace& space, const HostAllGather& host);
Status staged_broadcast(DeviceStages& stages, int size, int rank, void* data, std::int64_t bytes, int root,
                        const BufferSpace& space, const HostBroadcast& host);

}  // namespace strata::dispatch::detail
