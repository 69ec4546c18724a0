#pragma once
// ThreadTransport: a dispatch::Transport whose ranks are threads of this process, for tests of the
// `transport` communicator (tests/dispatch/transport_test.cpp) and of stores over it (tests/store).
// It moves its bytes over a `local` group, whose error texts it passes on without local's
// "<collective>: " prefix, as the Transport contract says.

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "dispatch/local_communicator.hpp"
#include "dispatch/transport_communicator.hpp"

namespace strata::dispatch::testing {

/// `direct`: takes every device space (the caller's device pointers go to the Transport, as
/// NCCL's); else none (the communicator stages device buffers through pinned memory, as gloo's).
class ThreadTransport final : public Transport {
 public:
  ThreadTransport(std::unique_ptr<Communicator> comm, bool direct) : comm_(std::move(comm)), direct_(direct) {}

  int rank() const noexcept override { return comm_->rank(); }
  int size() const noexcept override { return comm_->size(); }
  int local_rank() const noexcept override { return comm_->local_rank(); }
  const char* kind() const noexcept override { return "threads"; }
  bool takes_device(const BufferSpace& /*space*/) const noexcept override { return direct_; }
  std::chrono::milliseconds timeout() const noexcept override { return comm_->timeout(); }

  Result<HostStage> host_stage(std::int64_t send_bytes, std::int64_t recv_bytes) override {
    ++stages;
    if (send_.size() < static_cast<std::size_t>(send_bytes)) send_.resize(static_cast<std::size_t>(send_bytes));
    if (recv_.size() < static_cast<std::size_t>(recv_bytes)) recv_.resize(static_cast<std::size_t>(recv_bytes));
    send_bytes_ = send_bytes;
    return HostStage{send_.data(), recv_.data()};
  }

  Status all_gather(std::int64_t bytes, const DeviceBuffers* dev) override {
    ++gathers;
    STRATA_RETURN_IF_ERROR(failed("all_gather"));
    if (!dev && tamper) tamper(send_.data(), send_bytes_);
    return on(dev, dev ? comm_->all_gather(dev->send, bytes, dev->recv, dev->space)
                       : comm_->all_gather(send_.data(), bytes, recv_.data()));
  }

  Status all_to_all(const std::int64_t* send_splits, const std::int64_t* recv_splits,
                    const DeviceBuffers* dev) override {
    ++exchanges;
    STRATA_RETURN_IF_ERROR(failed("all_to_all"));
    const int n = size();
    std::vector<std::int64_t> sd(n), rd(n);
    for (int r = 1; r < n; ++r) {
      sd[r] = sd[r - 1] + send_splits[r - 1];
      rd[r] = rd[r - 1] + recv_splits[r - 1];
    }
    return on(
        dev, dev ? comm_->all_to_all_v(dev->send, send_splits, sd.data(), dev->recv, recv_splits, rd.data(), dev->space)
                 : comm_->all_to_all_v(send_.data(), send_splits, sd.data(), recv_.data(), recv_splits, rd.data()));
  }

  Status broadcast(std::int64_t bytes, int root, const DeviceBuffers* dev) override {
    ++broadcasts;
    STRATA_RETURN_IF_ERROR(failed("broadcast"));
    return on(dev, dev ? comm_->broadcast(dev->recv, bytes, root, dev->space)
                       : comm_->broadcast(rank() == root ? send_.data() : recv_.data(), bytes, root));
  }

  // What the tests watch and change (the owning thread only).
  int stages = 0, gathers = 0, exchanges = 0, broadcasts = 0;
  int device_ops = 0;  // operations given device buffers (all_gather, all_to_all, broadcast)
  /// Called after a device operation succeeded, before it returns: work it queues on
  /// `dev.space.stream` is left running (a Transport that only orders its work on the stream).
  std::function<void(const DeviceBuffers& dev)> queue_after;
  std::function<void(char* send, std::int64_t bytes)> tamper;  // changes what a host all_gather sends
  /// Asked first by every operation ("all_gather", "all_to_all", "broadcast"): a non-OK Status
  /// fails the operation on this rank without moving a byte (a Python transport that raised).
  std::function<Status(const char* operation)> fail;

 private:
  Status failed(const char* operation) const { return fail ? fail(operation) : Status::ok(); }

  // Counts a device operation and runs queue_after after its success; then strip().
  Status on(const DeviceBuffers* dev, const Status& s) {
    if (dev) ++device_ops;
    if (dev && s.is_ok() && queue_after) queue_after(*dev);
    return strip(s);
  }

  // local's messages start with the collective's name; a Transport's do not.
  static Status strip(const Status& s) {
    if (s.is_ok()) return s;
    for (const char* op : {"all_gather: ", "all_to_all_v: ", "broadcast: "}) {
      if (s.message().rfind(op, 0) == 0) return Status::from_code(s.code(), s.message().substr(std::strlen(op)));
    }
    return s;
  }

  std::unique_ptr<Communicator> comm_;
  const bool direct_;
  std::vector<char> send_, recv_;
  std::int64_t send_bytes_ = 0;
};

/// n transport communicators over a fresh `local` group, and their transports (owned by them).
struct TransportGroup {
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<ThreadTransport*> transports;
};

inline TransportGroup make_transport_group(int n, bool direct, const CommOptions& options = {}) {
  TransportGroup g;
  auto locals = make_local_group(n, options).value();
  for (int r = 0; r < n; ++r) {
    auto t = std::make_unique<ThreadTransport>(std::move(locals[static_cast<std::size_t>(r)]), direct);
    g.transports.push_back(t.get());
    g.comms.push_back(make_transport_communicator(std::move(t)).value());
  }
  return g;
}

}  // namespace strata::dispatch::testing
