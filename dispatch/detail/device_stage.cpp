#include "dispatch/detail/device_stage.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "dispatch/detail/comm_check.hpp"

namespace strata::dispatch::detail {
namespace {

Status synchronized(const BufferSpace& space) {
  return space.device->synchronize(space.stream).with_context("staging device buffers failed");
}

// Judges `pre`, a call on device buffers of `space`, and when it is fine grows the device's stage
// to `send_bytes` and `recv_bytes`: a stage that cannot grow is the call's device error.
DeviceStage& judged_stage(DeviceStages& stages, CallInfo& pre, const BufferSpace& space, std::int64_t send_bytes,
                          std::int64_t recv_bytes) {
  judge_space(pre, space);
  DeviceStage& st = stages.of(*space.device);
  if (pre.arg_error.empty() && pre.device_error.is_ok())
    pre.device_error = DeviceStages::grow(st, *space.device, send_bytes, recv_bytes);
  return st;
}

}  // namespace

DeviceStage& DeviceStages::of(const gpu::Device& d) {
  // A linear search: a process has a device or two per communicator.
  for (DeviceStage& s : stages_) {
    if (s.device == &d) return s;
  }
  DeviceStage& s = stages_.emplace_back();
  s.device = &d;
  return s;
}

Status DeviceStages::grow(DeviceStage& st, gpu::Device& d, std::int64_t send, std::int64_t recv) {
  for (auto [buf, want] : {std::pair<gpu::PinnedBuffer*, std::int64_t>{&st.send, send}, {&st.recv, recv}}) {
    if (static_cast<std::int64_t>(buf->bytes()) >= want) continue;
    *buf = gpu::PinnedBuffer{};
    // Twice the call, in size_t (2 * want could overflow int64; such a request fails anyway).
    const auto bytes = static_cast<std::size_t>(want);
    auto b = d.allocate_pinned(bytes <= SIZE_MAX / 2 ? 2 * bytes : bytes);
    if (!b) return b.status().with_context("pinned staging of device buffers");
    *buf = std::move(b).value();
  }
  return Status::ok();
}

void DeviceStages::forget(const gpu::Device& device) noexcept {
  stages_.erase(
      std::remove_if(stages_.begin(), stages_.end(), [&](const DeviceStage& s) { return s.device == &device; }),
      stages_.end());
}

Status staged_all_to_all_v(DeviceStages& stages, int size, int rank, const void* send, const std::int64_t* send_counts,
                           const std::int64_t* send_displs, void* recv, const std::int64_t* recv_counts,
                           const std::int64_t* recv_displs, const BufferSpace& space, const HostAllToAllV& host) {
  CallInfo pre = all_to_all_v_call(size, rank, send, send_counts, send_displs, recv, recv_counts, recv_displs);
  judge_space(pre, space);
  if (!pre.arg_error.empty() || !pre.device_error.is_ok())
    return host(send, send_counts, send_displs, recv, recv_counts, recv_displs, pre.arg_error, pre.device_error);
  // No overflow: check_a2a_arguments refused any displacement + count past int64.
  std::int64_t send_end = 0, recv_end = 0;
  for (int p = 0; p < size; ++p) {
    if (send_counts[p] > 0) send_end = std::max(send_end, send_displs[p] + send_counts[p]);
    if (recv_counts[p] > 0) recv_end = std::max(recv_end, recv_displs[p] + recv_counts[p]);
  }
  gpu::Device& d = *space.device;
  DeviceStage& st = stages.of(d);
  Status staged = DeviceStages::grow(st, d, send_end, recv_end);
  if (staged.is_ok()) {
    for (int p = 0; p < size; ++p) {
      if (p == rank || send_counts[p] == 0) continue;
      d.copy_d2h(space.stream, st.send.as<char>() + send_displs[p], static_cast<const char*>(send) + send_displs[p],
                 static_cast<std::size_t>(send_counts[p]));
    }
    staged = synchronized(space);
  }
  // With the caller's pointers, as above: a stage that failed to grow is empty, and the host
  // path's own check would report it as a null buffer instead of this error.
  if (!staged.is_ok()) return host(send, send_counts, send_displs, recv, recv_counts, recv_displs, "", staged);
  // This rank's own share stays on the device: out of the host collective's way (zero bytes to
  // itself; every rank sees its own counts, so the others are not affected).
  std::vector<std::int64_t> sc(send_counts, send_counts + size), rc(recv_counts, recv_counts + size);
  const std::int64_t own = recv_counts[rank];
  if (own == send_counts[rank]) sc[rank] = rc[rank] = 0;
  STRATA_RETURN_IF_ERROR(
      host(st.send.data(), sc.data(), send_displs, st.recv.data(), rc.data(), recv_displs, "", Status::ok()));
  // The own share first, device to device, unless it is in place: compared by address, for send
  // and recv may be one buffer whose displacements keep the ranges apart. No received range
  // overlaps its source (check_a2a_arguments), and it goes first all the same, so that nothing
  // queued after could ever overwrite what it reads.
  if (own > 0) {
    char* own_to = static_cast<char*>(recv) + recv_displs[rank];
    const char* own_from = static_cast<const char*>(send) + send_displs[rank];
    if (own_to != own_from) d.copy_d2d(space.stream, own_to, own_from, static_cast<std::size_t>(own));
  }
  for (int p = 0; p < size; ++p) {
    if (p == rank || recv_counts[p] == 0) continue;
    d.copy_h2d(space.stream, static_cast<char*>(recv) + recv_displs[p], st.recv.as<char>() + recv_displs[p],
               static_cast<std::size_t>(recv_counts[p]));
  }
  // The host collective counted the bytes to peers; the own share moves none between ranks.
  return d.synchronize(space.stream).with_context("all_to_all_v");
}

Status staged_all_gather(DeviceStages& stages, int size, int rank, const void* send, std::int64_t bytes, void* recv,
                         const BufferSpace& space, const HostAllGather& host) {
  CallInfo pre = all_gather_call(size, send, bytes, recv);
  DeviceStage& st = judged_stage(stages, pre, space, bytes, bytes * size);
  gpu::Device& d = *space.device;
  if (pre.arg_error.empty() && pre.device_error.is_ok() && bytes > 0) {
    d.copy_d2h(space.stream, st.send.data(), send, static_cast<std::size_t>(bytes));
    pre.device_error = synchronized(space);
  }
  if (!pre.arg_error.empty() || !pre.device_error.is_ok()) return host(send, recv, pre.arg_error, pre.device_error);
  STRATA_RETURN_IF_ERROR(host(st.send.data(), st.recv.data(), "", Status::ok()));
  if (bytes == 0) return Status::ok();
  for (int p = 0; p < size; ++p) {
    char* to = static_cast<char*>(recv) + p * bytes;
    if (p != rank) {
      d.copy_h2d(space.stream, to, st.recv.as<char>() + p * bytes, static_cast<std::size_t>(bytes));
    } else if (to != send) {
      d.copy_d2d(space.stream, to, send, static_cast<std::size_t>(bytes));
    }
  }
  return d.synchronize(space.stream).with_context("all_gather");
}

Status staged_broadcast(DeviceStages& stages, int size, int rank, void* data, std::int64_t bytes, int root,
                        const BufferSpace& space, const HostBroadcast& host) {
  CallInfo pre = broadcast_call(size, data, bytes, root);
  DeviceStage& st = judged_stage(stages, pre, space, bytes, 0);
  gpu::Device& d = *space.device;
  const bool moves = bytes > 0 && size > 1;
  if (pre.arg_error.empty() && pre.device_error.is_ok() && moves && rank == root) {
    d.copy_d2h(space.stream, st.send.data(), data, static_cast<std::size_t>(bytes));
    pre.device_error = synchronized(space);
  }
  if (!pre.arg_error.empty() || !pre.device_error.is_ok()) return host(data, pre.arg_error, pre.device_error);
  STRATA_RETURN_IF_ERROR(host(st.send.data(), "", Status::ok()));
  if (!moves || rank == root) return Status::ok();
  d.copy_h2d(space.stream, data, st.send.data(), static_cast<std::size_t>(bytes));
  return d.synchronize(space.stream).with_context("broadcast");
}

}  // namespace strata::dispatch::detail
