// The `transport` communicator (see transport_communicator.hpp). Each collective is:
//   1. header: every rank's CallInfo (kind, sizes, its argument or device error, the all_to_all_v
//      count arrays) in a fixed-size WireHeader, all-gathered through the Transport; every rank
//      decodes every header (its own too) and runs the same check_agreement(), so no rank moves
//      data that a peer rejects;
//   2. payload: one Transport operation (or none when no rank moves a byte).

#include "dispatch/transport_communicator.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/detail/comm_check.hpp"
#include "dispatch/detail/device_stage.hpp"
#include "gpu/device.hpp"

namespace strata::dispatch {
namespace {

using detail::CallInfo;
using detail::Collective;

class TransportCommunicator final : public Communicator {
 public:
  explicit TransportCommunicator(std::unique_ptr<Transport> t)
      : t_(std::move(t)), rank_(t_->rank()), size_(t_->size()), words_(detail::wire_words(size_)) {}

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  const char* kind() const noexcept override { return t_->kind(); }
  int local_rank() const noexcept override { return t_->local_rank(); }
  int device() const noexcept override { return t_->device(); }
  std::chrono::milliseconds timeout() const noexcept override { return t_->timeout(); }

  Status all_reduce(void* data, std::int64_t count, DataType type, ReduceOp op) override {
    return run(detail::all_reduce_call(size_, data, count, type, op), [&]() -> Status {
      if (count == 0 || size_ == 1) return Status::ok();
      const std::int64_t bytes = count * static_cast<std::int64_t>(size_of(type));
      STRATA_ASSIGN_OR_RETURN(HostStage stage, t_->host_stage(bytes, bytes * size_));
      std::memcpy(stage.send, data, static_cast<std::size_t>(bytes));
      STRATA_RETURN_IF_ERROR(t_->all_gather(bytes, nullptr));
      // In rank order on every rank: the same bits everywhere, and as `local` and `mpi`.
      const char* in = static_cast<const char*>(stage.recv);
      std::memcpy(data, in, static_cast<std::size_t>(bytes));
      for (int r = 1; r < size_; ++r) detail::reduce_into(data, in + r * bytes, count, type, op);
      return Status::ok();
    });
  }

  Status barrier() override {
    CallInfo info;
    info.kind = Collective::kBarrier;
    return run(info, [] { return Status::ok(); });
  }

  void forget_device(const gpu::Device& device) noexcept override { stages_.forget(device); }

  CommCounters counters() const noexcept override { return tally_.counters(); }

  Status broken() const override {
    std::lock_guard<std::mutex> lock(broken_mu_);
    return broken_;
  }

 private:
  // ---- host buffers ----

  Status all_to_all_v_host(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs,
                           void* recv, const std::int64_t* recv_counts, const std::int64_t* recv_displs,
                           const std::string& space_error, const Status& device_error) {
    CallInfo info =
        detail::all_to_all_v_call(size_, rank_, send, send_counts, send_displs, recv, recv_counts, recv_displs);
    detail::judge_staging(info, space_error, device_error);
    return run(info, [&]() -> Status {
      if (anyone_sends_to_a_peer()) {
        std::vector<std::int64_t> sc(send_counts, send_counts + size_), rc(recv_counts, recv_counts + size_);
        sc[rank_] = rc[rank_] = 0;
        std::int64_t send_total = 0, recv_total = 0;
        for (int p = 0; p < size_; ++p) {
          send_total += sc[p];
          recv_total += rc[p];
        }
        STRATA_ASSIGN_OR_RETURN(HostStage stage, t_->host_stage(send_total, recv_total));
        char* out = static_cast<char*>(stage.send);
        for (int p = 0; p < size_; ++p) {
          if (sc[p] == 0) continue;
          std::memcpy(out, static_cast<const char*>(send) + send_displs[p], static_cast<std::size_t>(sc[p]));
          out += sc[p];
        }
        STRATA_RETURN_IF_ERROR(t_->all_to_all(sc.data(), rc.data(), nullptr));
        const char* in = static_cast<const char*>(stage.recv);
        for (int p = 0; p < size_; ++p) {
          if (rc[p] == 0) continue;
          std::memcpy(static_cast<char*>(recv) + recv_displs[p], in, static_cast<std::size_t>(rc[p]));
          in += rc[p];
        }
      }
      // The own share last (after the Transport succeeded: a failed call writes nothing), unless
      // in place. No receive range overlaps a send range (check_a2a_arguments).
      const std::int64_t own = recv_counts[rank_];
      if (own > 0) {
        char* to = static_cast<char*>(recv) + recv_displs[rank_];
        const char* from = static_cast<const char*>(send) + send_displs[rank_];
        if (to != from) std::memcpy(to, from, static_cast<std::size_t>(own));
      }
      return Status::ok();
    });
  }

  Status all_gather_host(const void* send, std::int64_t bytes, void* recv, const std::string& space_error,
                         const Status& device_error) {
    CallInfo info = detail::all_gather_call(size_, send, bytes, recv);
    detail::judge_staging(info, space_error, device_error);
    return run(info, [&]() -> Status {
      if (bytes == 0) return Status::ok();
      if (size_ > 1) {
        STRATA_ASSIGN_OR_RETURN(HostStage stage, t_->host_stage(bytes, bytes * size_));
        std::memcpy(stage.send, send, static_cast<std::size_t>(bytes));
        STRATA_RETURN_IF_ERROR(t_->all_gather(bytes, nullptr));
        for (int p = 0; p < size_; ++p) {
          if (p == rank_) continue;
          std::memcpy(static_cast<char*>(recv) + p * bytes, static_cast<const char*>(stage.recv) + p * bytes,
                      static_cast<std::size_t>(bytes));
        }
      }
      char* own = static_cast<char*>(recv) + rank_ * bytes;
      if (own != send) std::memmove(own, send, static_cast<std::size_t>(bytes));
      return Status::ok();
    });
  }

  Status broadcast_host(void* data, std::int64_t bytes, int root, const std::string& space_error,
                        const Status& device_error) {
    CallInfo info = detail::broadcast_call(size_, data, bytes, root);
    detail::judge_staging(info, space_error, device_error);
    return run(info, [&]() -> Status {
      if (bytes == 0 || size_ == 1) return Status::ok();
      const bool is_root = rank_ == root;
      STRATA_ASSIGN_OR_RETURN(HostStage stage, t_->host_stage(is_root ? bytes : 0, is_root ? 0 : bytes));
      if (is_root) std::memcpy(stage.send, data, static_cast<std::size_t>(bytes));
      STRATA_RETURN_IF_ERROR(t_->broadcast(bytes, root, nullptr));
      if (!is_root) std::memcpy(data, stage.recv, static_cast<std::size_t>(bytes));
      return Status::ok();
    });
  }

  // ---- device buffers: the Transport's own (takes_device), else staged (detail/device_stage) ----

  Status do_all_to_all_v(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs, void* recv,
                         const std::int64_t* recv_counts, const std::int64_t* recv_displs,
                         const BufferSpace& space) override {
    if (!broken_.is_ok()) return refuse_broken(Collective::kAllToAllV);
    if (!space.on_device())
      return all_to_all_v_host(send, send_counts, send_displs, recv, recv_counts, recv_displs, "", Status::ok());
    if (t_->takes_device(space) && packed(send_counts, send_displs) && packed(recv_counts, recv_displs)) {
      CallInfo info =
          detail::all_to_all_v_call(size_, rank_, send, send_counts, send_displs, recv, recv_counts, recv_displs);
      detail::judge_space(info, space);
      info.direct = true;
      bool own_only = false;
      STRATA_RETURN_IF_ERROR(run(info, [&]() -> Status {
        own_only = !anyone_sends_to_a_peer();
        if (own_only) return Status::ok();
        const DeviceBuffers dev{send, recv, space};
        return t_->all_to_all(send_counts, recv_counts, &dev);
      }));
      // No rank sends to another: the own share alone, after run() (as the staged path's), so a
      // device fault in it is this rank's error and leaves the ranks in step.
      const std::int64_t own = recv_counts[rank_];
      char* to = static_cast<char*>(recv) + recv_displs[rank_];
      const char* from = static_cast<const char*>(send) + send_displs[rank_];
      if (own_only && own > 0 && to != from)
        space.device->copy_d2d(space.stream, to, from, static_cast<std::size_t>(own));
      return completed(space, "all_to_all_v");
    }
    return detail::staged_all_to_all_v(stages_, size_, rank_, send, send_counts, send_displs, recv, recv_counts,
                                       recv_displs, space,
                                       [this](auto... host_args) { return all_to_all_v_host(host_args...); });
  }

  Status do_all_gather(const void* send, std::int64_t bytes, void* recv, const BufferSpace& space) override {
    if (!broken_.is_ok()) return refuse_broken(Collective::kAllGather);
    if (!space.on_device()) return all_gather_host(send, bytes, recv, "", Status::ok());
    if (t_->takes_device(space)) {
      CallInfo info = detail::all_gather_call(size_, send, bytes, recv);
      detail::judge_space(info, space);
      info.direct = true;
      STRATA_RETURN_IF_ERROR(run(info, [&]() -> Status {
        if (bytes == 0) return Status::ok();
        const DeviceBuffers dev{send, recv, space};
        return t_->all_gather(bytes, &dev);
      }));
      return completed(space, "all_gather");
    }
    return detail::staged_all_gather(
        stages_, size_, rank_, send, bytes, recv, space,
        [&](const void* hs, void* hr, const std::string& arg_error, const Status& device_error) {
          return all_gather_host(hs, bytes, hr, arg_error, device_error);
        });
  }

  Status do_broadcast(void* data, std::int64_t bytes, int root, const BufferSpace& space) override {
    if (!broken_.is_ok()) return refuse_broken(Collective::kBroadcast);
    if (!space.on_device()) return broadcast_host(data, bytes, root, "", Status::ok());
    if (t_->takes_device(space)) {
      CallInfo info = detail::broadcast_call(size_, data, bytes, root);
      detail::judge_space(info, space);
      info.direct = true;
      STRATA_RETURN_IF_ERROR(run(info, [&]() -> Status {
        if (bytes == 0 || size_ == 1) return Status::ok();
        const DeviceBuffers dev{data, data, space};
        return t_->broadcast(bytes, root, &dev);
      }));
      return completed(space, "broadcast");
    }
    return detail::staged_broadcast(stages_, size_, rank_, data, bytes, root, space,
                                    [&](void* hd, const std::string& arg_error, const Status& device_error) {
                                      return broadcast_host(hd, bytes, root, arg_error, device_error);
                                    });
  }

  // After a direct device collective succeeded on every rank: waits for `space.stream` (the
  // Transport only orders its work before later work there; a device collective is synchronous for
  // the host). A fault here is this rank's device error: the ranks are in step, so it breaks nothing.
  static Status completed(const BufferSpace& space, const char* what) {
    return space.device->synchronize(space.stream).with_context(what);
  }

  // ---- one collective ----

  // Whether the displacements are the prefix sums of the counts from 0 (the parts packed in rank
  // order), as a Transport's device all_to_all takes them.
  bool packed(const std::int64_t* counts, const std::int64_t* displs) const noexcept {
    if (!counts || !displs) return false;
    std::int64_t at = 0;
    for (int p = 0; p < size_; ++p) {
      if (counts[p] < 0 || displs[p] != at) return false;
      at += counts[p];
    }
    return true;
  }

  // From the decoded headers of the current all_to_all_v (every rank's, so every rank decides
  // alike): whether any rank sends a byte to another rank.
  bool anyone_sends_to_a_peer() const noexcept {
    for (int r = 0; r < size_; ++r) {
      const std::int64_t* sc = headers_.data() + r * words_ + detail::kWireHeaderWords;
      for (int p = 0; p < size_; ++p) {
        if (p != r && sc[p] > 0) return true;
      }
    }
    return false;
  }

  // A call on a broken communicator: counted, refused with the first error, before any device
  // work (staging) or Transport call.
  Status refuse_broken(Collective kind) {
    tally_.count_call();
    return detail::broken_status(detail::collective_name(kind), broken_);
  }

  // Header exchange, agreement, then `payload()`.
  template <class Payload>
  Status run(const CallInfo& mine, Payload&& payload) {
    if (!broken_.is_ok()) return refuse_broken(mine.kind);
    tally_.count_call();
    const char* what = detail::collective_name(mine.kind);
    const std::uint64_t seq = seq_++;

    std::vector<CallInfo> all;
    Status s = exchange_headers(mine, seq, what, all);
    if (!s.is_ok()) return s;  // broken by exchange_headers
    std::vector<const CallInfo*> calls(size_);
    for (int r = 0; r < size_; ++r) calls[r] = &all[r];
    const detail::Verdict verdict = detail::check_agreement(calls);
    // Every rank reached the same verdict; one that does not break the communicator (device
    // errors found before the call) leaves every rank in step.
    if (!verdict.status.is_ok()) return verdict.breaks ? fail(verdict.status) : verdict.status;

    s = payload();
    if (!s.is_ok()) return fail(s.with_context(what));
    tally_.count_moved(mine, rank_, size_);
    return Status::ok();
  }

  Status exchange_headers(const CallInfo& mine, std::uint64_t seq, const char* what, std::vector<CallInfo>& all) {
    const std::int64_t header_bytes = static_cast<std::int64_t>(words_ * sizeof(std::int64_t));
    mine_.resize(words_);
    detail::encode_call(mine, seq, size_, mine_.data());
    headers_.assign(words_ * size_, 0);
    if (size_ == 1) {
      headers_ = mine_;
    } else {
      auto stage = t_->host_stage(header_bytes, header_bytes * size_);
      if (!stage) return fail(stage.status().with_context(what));
      std::memcpy(stage->send, mine_.data(), static_cast<std::size_t>(header_bytes));
      const Status s = t_->all_gather(header_bytes, nullptr);
      if (!s.is_ok()) return fail(s.with_context(what));
      std::memcpy(headers_.data(), stage->recv, static_cast<std::size_t>(header_bytes * size_));
    }

    // Every call as the Transport delivered it, this rank's own too (not the header it encoded),
    // so every rank judges the same bytes and reaches the same verdict.
    all.assign(size_, CallInfo{});
    std::vector<int> foreign;
    std::vector<std::uint64_t> seqs(size_);
    for (int p = 0; p < size_; ++p) {
      const std::int64_t* in = headers_.data() + p * words_;
      if (!detail::is_wire_header(in)) {
        foreign.push_back(p);
        continue;
      }
      seqs[p] = detail::decode_call(in, size_, all[p]);
    }
    if (!foreign.empty()) {
      return fail(Status::failed_precondition(
          std::string(what) + ": " + detail::rank_list(foreign) + " of " + std::to_string(size_) +
          " sent no strata header: another collective on the transport's world (one of the trainer's own on its "
          "process group?) met one of Strata's; every rank must make them in the same order"));
    }
    if (std::any_of(seqs.begin(), seqs.end(), [&](std::uint64_t q) { return q != seqs[0]; })) {
      std::string text;
      for (int p = 0; p < size_; ++p) {
        text += (p ? ", rank " : "rank ") + std::to_string(p) + " at call " + std::to_string(seqs[p]);
      }
      return fail(Status::failed_precondition(std::string(what) + ": ranks are out of step: " + text));
    }
    return Status::ok();
  }

  // Breaks the communicator with `s` (the first error stays).
  Status fail(Status s) {
    std::lock_guard<std::mutex> lock(broken_mu_);
    if (broken_.is_ok()) broken_ = s;
    return s;
  }

  std::unique_ptr<Transport> t_;
  const int rank_;
  const int size_;
  const std::size_t words_;            // one header and its counts, in int64 words
  std::vector<std::int64_t> mine_;     // this rank's header of the current call
  std::vector<std::int64_t> headers_;  // every rank's header of the current call, rank order
  std::uint64_t seq_ = 0;
  Status broken_;                 // written under broken_mu_ (read without it by the calling thread)
  mutable std::mutex broken_mu_;  // broken_ for broken(), from any thread
  detail::DeviceStages stages_;   // pinned staging of device buffers the Transport does not take
  detail::CallTally tally_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_transport_communicator(std::unique_ptr<Transport> transport) {
  if (!transport) return Status::invalid_argument("transport communicator: transport is null");
  const int rank = transport->rank(), size = transport->size();
  if (size < 1 || rank < 0 || rank >= size) {
    return Status::invalid_argument("transport communicator: rank " + std::to_string(rank) + " of size " +
                                    std::to_string(size) + " is not a world (expected 0 <= rank < size)");
  }
  return std::unique_ptr<Communicator>(std::make_unique<TransportCommunicator>(std::move(transport)));
}

}  // namespace strata::dispatch
