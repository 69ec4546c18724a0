// The `nccl` communicator (see nccl_communicator.hpp). Built for real when CMake defines
// STRATA_DISPATCH_NCCL (CUDA backend and NCCL found); otherwise only the factories' errors.

#include "dispatch/nccl_communicator.hpp"

#include <string>
#include <vector>

namespace strata::dispatch::detail {

Result<int> nccl_device_for_rank(int local_rank, int gpus, int wanted) {
  if (gpus <= 0) return Status::unavailable("nccl communicator: no CUDA GPU is visible");
  if (wanted >= 0) {
    if (wanted >= gpus) {
      return Status::invalid_argument("nccl communicator: device " + std::to_string(wanted) + " out of range [0, " +
                                      std::to_string(gpus) + ") (" + std::to_string(gpus) + " GPU(s) visible)");
    }
    return wanted;
  }
  return local_rank % gpus;
}

Status nccl_one_rank_per_gpu(const std::vector<NcclPlacement>& ranks) {
  const int size = static_cast<int>(ranks.size());
  for (int a = 0; a < size; ++a) {
    for (int b = a + 1; b < size; ++b) {
      const NcclPlacement& x = ranks[static_cast<std::size_t>(a)];
      const NcclPlacement& y = ranks[static_cast<std::size_t>(b)];
      if (x.host != y.host || x.gpu != y.gpu) continue;
      return Status::failed_precondition(
          "nccl communicator: ranks " + std::to_string(a) + " and " + std::to_string(b) + " of " +
          std::to_string(size) + " are on one GPU, " + x.gpu + " (device " + std::to_string(x.device) + " of rank " +
          std::to_string(a) + ", device " + std::to_string(y.device) + " of rank " + std::to_string(b) + ", host " +
          x.host +
          "), and NCCL runs one rank per GPU, so no rank starts NCCL: give each rank its own GPU "
          "(CUDA_VISIBLE_DEVICES, NcclOptions::device) or start fewer ranks on that host");
    }
  }
  return Status::ok();
}

}  // namespace strata::dispatch::detail

#if defined(STRATA_DISPATCH_NCCL)

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dispatch/detail/comm_check.hpp"
#include "dispatch/mpi_communicator.hpp"
#include "gpu/cuda/cuda_try.hpp"
#include "gpu/cuda/device_scope.hpp"
#include "gpu/device.hpp"

namespace strata::dispatch {
namespace {

using detail::CallInfo;
using detail::Collective;
using Clock = std::chrono::steady_clock;

// "ncclSend(...) failed at file:line: unhandled system error (NCCL's last error)". Errors a peer
// caused (remote, system: a dead process, a broken link) are Unavailable; others Internal.
Status nccl_status(ncclResult_t r, const char* expr, const char* file, int line, ncclComm_t comm) {
  std::string msg =
      std::string(expr) + " failed at " + file + ":" + std::to_string(line) + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) msg += std::string(" (") + last + ")";
  if (r == ncclRemoteError || r == ncclSystemError) return Status::unavailable(msg);
  return Status::internal(msg);
}

}  // namespace
}  // namespace strata::dispatch

/// Evaluates an NCCL call on communicator `comm` and returns its error as a Status (call, NCCL's
/// text, file, line) from the enclosing function. ncclInProgress is not an error: the
/// communicator is non-blocking, and the caller then waits for it with settle().
#define STRATA_NCCL_TRY(comm, expr)                                                              \
  do {                                                                                           \
    const ncclResult_t strata_nccl_r_ = (expr);                                                  \
    if (strata_nccl_r_ != ncclSuccess && strata_nccl_r_ != ncclInProgress)                       \
      return ::strata::dispatch::nccl_status(strata_nccl_r_, #expr, __FILE__, __LINE__, (comm)); \
  } while (0)

namespace strata::dispatch {
namespace {

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

void backoff(int idle_rounds) {
  if (idle_rounds < 64) return;
  if (idle_rounds < 256) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// The communicator must not change which GPU (context) the calling thread works on: every entry
// makes its device current through the device layer's guard, which restores the caller's after.
using gpu::cuda_detail::DeviceScope;
using gpu::cuda_detail::PrimaryContext;

// Device memory that grows to twice the largest request (freed and reallocated, stream-ordered on
// the communicator's stream where the device has memory pools; the old contents go).
struct DeviceMemory {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  char* at(std::int64_t offset) const noexcept { return static_cast<char*>(ptr) + offset; }
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int local_rank, PrimaryContext ctx, cudaStream_t stream,
                   cudaEvent_t done, const CommOptions& options)
      : comm_(comm),
        rank_(rank),
        size_(size),
        local_rank_(local_rank),
        ctx_(std::move(ctx)),
        device_(ctx_.ordinal()),
        stream_(stream),
        done_(done),
        options_(options),
        header_bytes_(detail::wire_words(size) * sizeof(std::int64_t)) {}

  ~NcclCommunicator() override {
    const DeviceScope scope(ctx_);
    if (comm_) {  // null once aborted (every failure aborts at once: fail())
      if (broken_.is_ok()) {
        // Flush, then destroy; a peer that never finalizes must not hang us: abort after the timeout.
        ncclResult_t r = ncclCommFinalize(comm_);
        const auto deadline = Clock::now() + options_.timeout;
        int idle = 0;
        ncclResult_t state = ncclInProgress;
        while (r == ncclSuccess || r == ncclInProgress) {
          if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state != ncclInProgress) break;
          if (Clock::now() >= deadline) break;
          backoff(++idle);
        }
        if (state == ncclSuccess) {
          ncclCommDestroy(comm_);
        } else {
          ncclCommAbort(comm_);
        }
      } else {
        ncclCommAbort(comm_);
      }
    }
    // Free device memory only once the stream is idle: an aborted kernel that still ran would
    // otherwise write freed memory. If it does not drain, leak (a failure path only).
    bool idle = false;
    const auto deadline = Clock::now() + options_.timeout;
    while (Clock::now() < deadline) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q != cudaErrorNotReady) {
        idle = q == cudaSuccess;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (idle) {
      for (DeviceMemory* m : {&send_, &recv_, &header_mine_, &header_all_}) {
        if (m->ptr) cudaFree(m->ptr);
      }
      if (header_host_) cudaFreeHost(header_host_);
      cudaStreamDestroy(stream_);
      cudaEventDestroy(done_);
    }
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::chrono::milliseconds timeout() const noexcept override { return options_.timeout; }
  const char* kind() const noexcept override { return "nccl"; }
  int local_rank() const noexcept override { return local_rank_; }
  int device() const noexcept override { return device_; }

  Status do_all_to_all_v(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs, void* recv,
                         const std::int64_t* recv_counts, const std::int64_t* recv_displs,
                         const BufferSpace& space) override {
    CallInfo info =
        detail::all_to_all_v_call(size_, rank_, send, send_counts, send_displs, recv, recv_counts, recv_displs);
    if (space.on_device()) {
      ready(info, space);
      return run(info, [&](Clock::time_point deadline, const char* what) -> Status {
        // NCCL reads and writes the caller's buffers; the own share is a device copy, unless it is
        // in place: compared by address, for send and recv may be one buffer whose displacements
        // keep the ranges apart (no other range overlaps, check_a2a_arguments).
        if (recv_counts[rank_] > 0) {
          char* own_to = static_cast<char*>(recv) + recv_displs[rank_];
          const char* own_from = static_cast<const char*>(send) + send_displs[rank_];
          if (own_to != own_from) {
            STRATA_CUDA_TRY(cudaMemcpyAsync(own_to, own_from, static_cast<std::size_t>(recv_counts[rank_]),
                                            cudaMemcpyDeviceToDevice, stream_));
          }
        }
        STRATA_NCCL_TRY(comm_, ncclGroupStart());
        Status issued = [&]() -> Status {
          for (int p = 0; p < size_; ++p) {
            if (p == rank_) continue;
            if (send_counts[p] > 0) {
              STRATA_NCCL_TRY(comm_, ncclSend(static_cast<const char*>(send) + send_displs[p],
                                              static_cast<std::size_t>(send_counts[p]), ncclUint8, p, comm_, stream_));
            }
            if (recv_counts[p] > 0) {
              STRATA_NCCL_TRY(comm_, ncclRecv(static_cast<char*>(recv) + recv_displs[p],
                                              static_cast<std::size_t>(recv_counts[p]), ncclUint8, p, comm_, stream_));
            }
          }
          return Status::ok();
        }();
        STRATA_NCCL_TRY(comm_, ncclGroupEnd());
        STRATA_RETURN_IF_ERROR(issued);
        return wait(deadline, what);
      });
    }
    return run(info, [&](Clock::time_point deadline, const char* what) -> Status {
      // Peers' parts packed in rank order on the device; this rank's own part is a host copy.
      std::vector<std::int64_t> send_off(size_, 0), recv_off(size_, 0);
      std::int64_t send_total = 0, recv_total = 0;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        send_off[p] = send_total;
        recv_off[p] = recv_total;
        send_total += send_counts[p];
        recv_total += recv_counts[p];
      }
      STRATA_RETURN_IF_ERROR(grow(send_, send_total));
      STRATA_RETURN_IF_ERROR(grow(recv_, recv_total));
      for (int p = 0; p < size_; ++p) {
        if (p == rank_ || send_counts[p] == 0) continue;
        STRATA_CUDA_TRY(cudaMemcpyAsync(send_.at(send_off[p]), static_cast<const char*>(send) + send_displs[p],
                                        static_cast<std::size_t>(send_counts[p]), cudaMemcpyHostToDevice, stream_));
      }
      if (send_total + recv_total > 0) {
        STRATA_NCCL_TRY(comm_, ncclGroupStart());
        // The group is always closed, also after a failed call inside it: an open group would
        // swallow this thread's later NCCL calls, on any communicator.
        Status issued = [&]() -> Status {
          for (int p = 0; p < size_; ++p) {
            if (p == rank_) continue;
            if (send_counts[p] > 0) {
              STRATA_NCCL_TRY(comm_, ncclSend(send_.at(send_off[p]), static_cast<std::size_t>(send_counts[p]),
                                              ncclUint8, p, comm_, stream_));
            }
            if (recv_counts[p] > 0) {
              STRATA_NCCL_TRY(comm_, ncclRecv(recv_.at(recv_off[p]), static_cast<std::size_t>(recv_counts[p]),
                                              ncclUint8, p, comm_, stream_));
            }
          }
          return Status::ok();
        }();
        STRATA_NCCL_TRY(comm_, ncclGroupEnd());
        STRATA_RETURN_IF_ERROR(issued);
        STRATA_RETURN_IF_ERROR(wait(deadline, what));
        for (int p = 0; p < size_; ++p) {
          if (p == rank_ || recv_counts[p] == 0) continue;
          STRATA_CUDA_TRY(cudaMemcpyAsync(static_cast<char*>(recv) + recv_displs[p], recv_.at(recv_off[p]),
                                          static_cast<std::size_t>(recv_counts[p]), cudaMemcpyDeviceToHost, stream_));
        }
        STRATA_CUDA_TRY(cudaStreamSynchronize(stream_));  // local copies only: the collective is done
      }
      // After the peers' shares landed: none of them overlaps its source (check_a2a_arguments).
      if (recv_counts[rank_] > 0) {
        std::memmove(static_cast<char*>(recv) + recv_displs[rank_], static_cast<const char*>(send) + send_displs[rank_],
                     static_cast<std::size_t>(recv_counts[rank_]));
      }
      return Status::ok();
    });
  }

  Status do_all_gather(const void* send, std::int64_t bytes, void* recv, const BufferSpace& space) override {
    CallInfo info = detail::all_gather_call(size_, send, bytes, recv);
    if (space.on_device()) {
      ready(info, space);
      return run(info, [&](Clock::time_point deadline, const char* what) -> Status {
        if (bytes == 0) return Status::ok();
        STRATA_NCCL_TRY(comm_, ncclAllGather(send, recv, static_cast<std::size_t>(bytes), ncclUint8, comm_, stream_));
        return wait(deadline, what);
      });
    }
    return run(info, [&](Clock::time_point deadline, const char* what) -> Status {
      if (bytes == 0) return Status::ok();
      STRATA_RETURN_IF_ERROR(grow(send_, bytes));
      STRATA_RETURN_IF_ERROR(grow(recv_, bytes * size_));
      STRATA_CUDA_TRY(
          cudaMemcpyAsync(send_.ptr, send, static_cast<std::size_t>(bytes), cudaMemcpyHostToDevice, stream_));
      STRATA_NCCL_TRY(comm_,
                      ncclAllGather(send_.ptr, recv_.ptr, static_cast<std::size_t>(bytes), ncclUint8, comm_, stream_));
      STRATA_RETURN_IF_ERROR(wait(deadline, what));
      STRATA_CUDA_TRY(
          cudaMemcpyAsync(recv, recv_.ptr, static_cast<std::size_t>(bytes * size_), cudaMemcpyDeviceToHost, stream_));
      STRATA_CUDA_TRY(cudaStreamSynchronize(stream_));
      return Status::ok();
    });
  }

  Status all_reduce(void* data, std::int64_t count, DataType type, ReduceOp op) override {
    CallInfo info = detail::all_reduce_call(size_, data, count, type, op);
    return run(info, [&](Clock::time_point deadline, const char* what) -> Status {
      if (count == 0) return Status::ok();
      const std::size_t bytes = static_cast<std::size_t>(count) * size_of(type);
      STRATA_RETURN_IF_ERROR(grow(send_, static_cast<std::int64_t>(bytes)));
      STRATA_CUDA_TRY(cudaMemcpyAsync(send_.ptr, data, bytes, cudaMemcpyHostToDevice, stream_));
      STRATA_NCCL_TRY(comm_, ncclAllReduce(send_.ptr, send_.ptr, static_cast<std::size_t>(count), nccl_type(type),
                                           nccl_op(op), comm_, stream_));
      STRATA_RETURN_IF_ERROR(wait(deadline, what));
      STRATA_CUDA_TRY(cudaMemcpyAsync(data, send_.ptr, bytes, cudaMemcpyDeviceToHost, stream_));
      STRATA_CUDA_TRY(cudaStreamSynchronize(stream_));
      return Status::ok();
    });
  }

  Status do_broadcast(void* data, std::int64_t bytes, int root, const BufferSpace& space) override {
    CallInfo info = detail::broadcast_call(size_, data, bytes, root);
    if (space.on_device()) {
      ready(info, space);
      return run(info, [&](Clock::time_point deadline, const char* what) -> Status {
        if (bytes == 0 || size_ == 1) return Status::ok();
        STRATA_NCCL_TRY(comm_,
                        ncclBroadcast(data, data, static_cast<std::size_t>(bytes), ncclUint8, root, comm_, stream_));
        return wait(deadline, what);
      });
    }
    return run(info, [&](Clock::time_point deadline, const char* what) -> Status {
      if (bytes == 0 || size_ == 1) return Status::ok();
      STRATA_RETURN_IF_ERROR(grow(send_, bytes));
      if (rank_ == root) {
        STRATA_CUDA_TRY(
            cudaMemcpyAsync(send_.ptr, data, static_cast<std::size_t>(bytes), cudaMemcpyHostToDevice, stream_));
      }
      STRATA_NCCL_TRY(
          comm_, ncclBroadcast(send_.ptr, send_.ptr, static_cast<std::size_t>(bytes), ncclUint8, root, comm_, stream_));
      STRATA_RETURN_IF_ERROR(wait(deadline, what));
      if (rank_ != root) {
        STRATA_CUDA_TRY(
            cudaMemcpyAsync(data, send_.ptr, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToHost, stream_));
        STRATA_CUDA_TRY(cudaStreamSynchronize(stream_));
      }
      return Status::ok();
    });
  }

  Status barrier() override {
    CallInfo info;
    info.kind = Collective::kBarrier;
    return run(info, [](Clock::time_point, const char*) { return Status::ok(); });
  }

  CommCounters counters() const noexcept override { return tally_.counters(); }

  // The first failure of a collective breaks the communicator (every later call returns it) and
  // aborts NCCL at once, whatever the failure, except a verdict that does not break it (device
  // errors found before the call, detail::Verdict: no NCCL work of the call was issued but the
  // header all-gather, which completed on every rank): a peer that died mid-collective leaves NCCL's
  // kernels spinning on this GPU, and the next cudaFree or cudaFreeHost on it (a store closing its
  // engines, which goes before the communicator, or a staging buffer growing) would wait for them
  // forever. An abort stops them; the buffers they may still write are freed only once the stream
  // is idle (the destructor). The factory also fails a communicator that it does not hand out.
  void fail(const Status& s) {
    if (broken_.is_ok()) broken_ = s;
    abort_nccl();
  }

  // Allocates the header buffers (called once by the factory).
  Status init() {
    int pools = 0;
    if (gpu::cuda_detail::call_quietly(
            [&] { return cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device_); }) != cudaSuccess) {
      pools = 0;  // read as "no pools"
    }
    stream_ordered_ = pools != 0;
    STRATA_RETURN_IF_ERROR(grow(header_mine_, static_cast<std::int64_t>(header_bytes_)));
    STRATA_RETURN_IF_ERROR(grow(header_all_, static_cast<std::int64_t>(header_bytes_) * size_));
    STRATA_CUDA_TRY(cudaMallocHost(&header_host_, header_bytes_ * (static_cast<std::size_t>(size_) + 1)));
    return Status::ok();
  }

 private:
  // Stream-ordered (cudaFreeAsync, cudaMallocAsync on stream_): growing never synchronizes the
  // device (cudaFree would, stalling every stream of the store on this GPU), and to twice the
  // request, so that calls of a training loop, which vary little in size, stop growing after the
  // first steps and allocate nothing in the steady state. A device without memory pools
  // (cudaDevAttrMemoryPoolsSupported = 0, e.g. some vGPUs) has no stream-ordered allocator: there
  // growth waits for the stream and uses cudaFree and cudaMalloc, which synchronize the device,
  // still only while calls grow (the first steps), never in the steady state. That cudaFree waits
  // for every kernel on the GPU, another communicator's too (a trainer's NCCL all-reduce waiting
  // for peers that wait here would hang it, past Strata's timeout): on such devices, let the
  // first steps grow the buffers before the trainer's own collectives start.
  Status grow(DeviceMemory& m, std::int64_t bytes) {
    if (static_cast<std::int64_t>(m.bytes) >= bytes) return Status::ok();
    if (m.ptr) {
      if (stream_ordered_) {
        STRATA_CUDA_TRY(cudaFreeAsync(m.ptr, stream_));
      } else {
        STRATA_CUDA_TRY(cudaStreamSynchronize(stream_));
        STRATA_CUDA_TRY(cudaFree(m.ptr));
      }
      m.ptr = nullptr;
      m.bytes = 0;
    }
    const std::size_t want = 2 * static_cast<std::size_t>(bytes);
    if (stream_ordered_) {
      STRATA_CUDA_TRY(cudaMallocAsync(&m.ptr, want, stream_));
    } else {
      STRATA_CUDA_TRY(cudaMalloc(&m.ptr, want));
    }
    m.bytes = want;
    return Status::ok();
  }

  // Device buffers must be memory of this communicator's GPU (NCCL works on one device), an
  // argument error of `info` (whose own arguments were judged); then detail::judge_space.
  void ready(CallInfo& info, const BufferSpace& space) const {
    const gpu::DeviceInfo& d = space.device->info();
    if (info.arg_error.empty() && (d.backend != gpu::Backend::kCuda || d.ordinal != device_)) {
      info.arg_error = "device buffers of " + d.name +
                       (d.backend == gpu::Backend::kCuda ? " (CUDA device " + std::to_string(d.ordinal) + ")"
                                                         : std::string(" (emulated)")) +
                       ", expected memory of this communicator's CUDA device " + std::to_string(device_);
    }
    detail::judge_space(info, space);
  }

  // One collective: header all-gather, agreement, then `payload(deadline, what)`.
  template <class Payload>
  Status run(const CallInfo& mine, Payload&& payload) {
    tally_.count_call();
    const char* what = detail::collective_name(mine.kind);
    if (!broken_.is_ok()) return detail::broken_status(what, broken_);
    const auto deadline = Clock::now() + options_.timeout;
    const DeviceScope scope(ctx_);
    bool in_step = false;  // refused by a verdict that leaves the communicator usable
    Status s = [&]() -> Status {
      STRATA_RETURN_IF_ERROR(scope.status());
      std::vector<CallInfo> all;
      STRATA_RETURN_IF_ERROR(exchange_headers(mine, deadline, what, all));
      std::vector<const CallInfo*> calls(size_);
      for (int r = 0; r < size_; ++r) calls[r] = &all[r];
      const detail::Verdict verdict = detail::check_agreement(calls);
      if (!verdict.status.is_ok()) {
        in_step = !verdict.breaks;
        return verdict.status;
      }
      return payload(deadline, what);
    }();
    if (!s.is_ok()) {
      if (!in_step) fail(s);
      return s;
    }
    tally_.count_moved(mine, rank_, size_);
    return Status::ok();
  }

  Status exchange_headers(const CallInfo& mine, Clock::time_point deadline, const char* what,
                          std::vector<CallInfo>& all) {
    const std::size_t words = header_bytes_ / sizeof(std::int64_t);
    auto* host_mine = static_cast<std::int64_t*>(header_host_);
    std::int64_t* host_all = host_mine + words;
    // Always the whole header and counts: the same size on every rank whatever the kind, so the
    // all-gather itself always matches.
    detail::encode_call(mine, 0, size_, host_mine);
    STRATA_CUDA_TRY(cudaMemcpyAsync(header_mine_.ptr, host_mine, header_bytes_, cudaMemcpyHostToDevice, stream_));
    STRATA_NCCL_TRY(comm_, ncclAllGather(header_mine_.ptr, header_all_.ptr, header_bytes_, ncclUint8, comm_, stream_));
    STRATA_RETURN_IF_ERROR(wait(deadline, what));
    STRATA_CUDA_TRY(cudaMemcpyAsync(host_all, header_all_.ptr, header_bytes_ * size_, cudaMemcpyDeviceToHost, stream_));
    STRATA_CUDA_TRY(cudaStreamSynchronize(stream_));

    // Every call as it went on the wire, this rank's too (from the header just encoded), so every
    // rank judges the same texts.
    all.assign(size_, CallInfo{});
    for (int r = 0; r < size_; ++r) {
      detail::decode_call(r == rank_ ? host_mine : host_all + words * r, size_, all[r]);
    }
    return Status::ok();
  }

  // Waits for the NCCL work issued on the stream: first for the non-blocking enqueue to settle,
  // then for the stream, polling the communicator's asynchronous error; aborts at the deadline.
  Status wait(Clock::time_point deadline, const char* what) {
    bool recorded = false;
    int idle = 0;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      STRATA_NCCL_TRY(comm_, ncclCommGetAsyncError(comm_, &state));
      if (state != ncclSuccess && state != ncclInProgress) {
        return nccl_status(state, "ncclCommGetAsyncError(comm, &state)", __FILE__, __LINE__, comm_).with_context(what);
      }
      if (state == ncclSuccess) {
        if (!recorded) {
          STRATA_CUDA_TRY(cudaEventRecord(done_, stream_));
          recorded = true;
        }
        const cudaError_t q = cudaEventQuery(done_);
        if (q == cudaSuccess) return Status::ok();
        if (q != cudaErrorNotReady) STRATA_CUDA_TRY(q);
      }
      if (Clock::now() >= deadline) {
        abort_nccl();
        return Status::unavailable(std::string(what) + ": timed out after " + std::to_string(options_.timeout.count()) +
                                   " ms; not every one of the " + std::to_string(size_) +
                                   " ranks arrived (NCCL does not say which); the NCCL communicator was aborted");
      }
      backoff(++idle);
    }
  }

  void abort_nccl() noexcept {
    if (!comm_) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  ncclComm_t comm_;  // null once aborted
  const int rank_;
  const int size_;
  const int local_rank_;      // the bootstrap's (thread ranks) or the launcher's, else rank_
  const PrimaryContext ctx_;  // the primary context of device_, retained while the communicator lives
  const int device_;
  cudaStream_t stream_;
  cudaEvent_t done_;
  const CommOptions options_;
  const std::size_t header_bytes_;
  void* header_host_ = nullptr;  // pinned: this rank's header, then every rank's
  DeviceMemory send_, recv_, header_mine_, header_all_;
  bool stream_ordered_ = false;  // the device has memory pools: grow() uses cudaMallocAsync/cudaFreeAsync
  Status broken_;
  detail::CallTally tally_;
};

// The local rank of a rank bootstrapped without a communicator (one process per rank): the
// launcher's, else the rank.
int process_local_rank(int rank) {
  const int local = launcher_local_rank();
  return local >= 0 ? local : rank;
}

// The GPU of a rank (detail::nccl_device_for_rank over the GPUs visible here).
Result<int> pick_device(int local_rank, int wanted) {
  auto gpus = gpu::cuda_devices();
  if (!gpus) return gpus.status().with_context("nccl communicator");
  return detail::nccl_device_for_rank(local_rank, gpus.value(), wanted);
}

// This host's identity: the kernel's boot id (distinct per host, shared by the containers of one
// host, which share its GPUs), else the host name.
std::string host_identity() {
  char buf[128] = {};
  const int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
    ::close(fd);
    std::string id(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
    while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
    if (!id.empty()) return "boot id " + id;
  }
  if (::gethostname(buf, sizeof(buf) - 1) == 0 && buf[0]) return std::string("host name ") + buf;
  return "unknown host";
}

// The UUID of CUDA device `device`, as nvidia-smi prints it (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx).
Result<std::string> gpu_uuid(int device) {
  // cudaDeviceProp::uuid: CUDA 13 has no cudaDeviceGetUuid.
  cudaDeviceProp prop{};
  const cudaError_t e = gpu::cuda_detail::call_quietly([&] { return cudaGetDeviceProperties(&prop, device); });
  if (e != cudaSuccess)
    return gpu::cuda_detail::cuda_status(e, "cudaGetDeviceProperties(&prop, device)", __FILE__, __LINE__);
  const cudaUUID_t u = prop.uuid;
  char out[48];
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  std::snprintf(out, sizeof(out), "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return std::string(out);
}

// What every rank all-gathers before it starts (or keeps) NCCL: why it has no GPU (empty when it
// has one), else where its GPU is. Fixed size, the same on every rank.
struct PlacementWire {
  char why[512] = {};
  char host[128] = {};
  char gpu[48] = {};
  std::int32_t device = -1;
  std::int32_t pad = 0;
};

// The ranks of `over` (the bootstrap, or the new NCCL communicator itself) tell each other where
// they run: a rank without a GPU (`device` failed) returns its reason, the others a
// FailedPrecondition naming it; two ranks on one GPU (host and UUID): every rank
// detail::nccl_one_rank_per_gpu's FailedPrecondition. `what` says which exchange failed.
Status agree_on_placement(Communicator& over, const Result<int>& device, const char* what) {
  PlacementWire mine;
  Status own = device.status();
  if (own.is_ok()) {
    Result<std::string> uuid = gpu_uuid(device.value());
    if (uuid.is_ok()) {
      detail::copy_text(mine.host, sizeof(mine.host), host_identity());
      detail::copy_text(mine.gpu, sizeof(mine.gpu), uuid.value());
      mine.device = device.value();
    } else {
      own = uuid.status().with_context("nccl communicator: the UUID of device " + std::to_string(device.value()));
    }
  }
  if (!own.is_ok()) {
    detail::copy_text(mine.why, sizeof(mine.why), own.message());
    mine.why[0] = mine.why[0] ? mine.why[0] : '?';
  }
  const std::size_t size = static_cast<std::size_t>(over.size());
  std::vector<PlacementWire> all(size);
  Status s = over.all_gather(&mine, static_cast<std::int64_t>(sizeof(mine)), all.data());
  if (!s.is_ok()) return s.with_context(what);
  if (!own.is_ok()) return own;
  std::vector<detail::NcclPlacement> placed(size);
  for (std::size_t r = 0; r < size; ++r) {
    PlacementWire& w = all[r];
    w.why[sizeof(w.why) - 1] = w.host[sizeof(w.host) - 1] = w.gpu[sizeof(w.gpu) - 1] = '\0';
    if (w.why[0]) {
      return Status::failed_precondition("nccl communicator: rank " + std::to_string(r) + " of " +
                                         std::to_string(size) + " has no GPU of its own (" + w.why +
                                         "), so no rank starts NCCL");
    }
    placed[r] = detail::NcclPlacement{w.host, w.gpu, w.device};
  }
  return detail::nccl_one_rank_per_gpu(placed);
}

// `placement_agreed`: the ranks already compared their GPUs over a bootstrap (agree_on_placement);
// otherwise they do it over the new communicator before it is handed out.
Result<std::unique_ptr<Communicator>> create(const ncclUniqueId& id, int rank, int size, int local_rank, int device,
                                             const NcclOptions& options, bool placement_agreed) {
  STRATA_ASSIGN_OR_RETURN(PrimaryContext ctx, PrimaryContext::retain(device));
  const DeviceScope scope(ctx);
  STRATA_RETURN_IF_ERROR(scope.status());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait polls, so a missing rank ends in a timeout, not a hang
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm) ncclCommAbort(comm);
    return nccl_status(r, "ncclCommInitRankConfig(&comm, size, id, rank, &config)", __FILE__, __LINE__, nullptr);
  }
  const auto deadline = Clock::now() + options.comm.timeout;
  int idle = 0;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    if (q != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      Status s = nccl_status(q != ncclSuccess ? q : state, "ncclCommInitRankConfig(&comm, size, id, rank, &config)",
                             __FILE__, __LINE__, comm);
      ncclCommAbort(comm);
      return s;
    }
    if (state == ncclSuccess) break;
    if (Clock::now() >= deadline) {
      ncclCommAbort(comm);
      return Status::unavailable("nccl communicator: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                 ": ncclCommInitRankConfig did not complete within " +
                                 std::to_string(options.comm.timeout.count()) + " ms (not every rank joined)");
    }
    backoff(++idle);
  }
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    ncclCommAbort(comm);
    if (stream) cudaStreamDestroy(stream);
    return gpu::cuda_detail::cuda_status(e, "cudaStreamCreateWithFlags / cudaEventCreateWithFlags", __FILE__, __LINE__);
  }
  auto c = std::make_unique<NcclCommunicator>(comm, rank, size, local_rank, std::move(ctx), stream, done, options.comm);
  // A communicator not handed out is aborted, not finalized: a failed init or a refused placement
  // must not wait in ncclCommFinalize for peers that fail the same way.
  Status s = c->init();
  if (s.is_ok() && !placement_agreed) {
    s = agree_on_placement(*c, device, "nccl communicator: telling the ranks which GPU each took");
  }
  if (!s.is_ok()) {
    c->fail(s);
    return s;
  }
  return std::unique_ptr<Communicator>(std::move(c));
}

Status check_options(int rank, int size, const NcclOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return Status::invalid_argument("nccl communicator: rank " + std::to_string(rank) + " out of range [0, " +
                                    std::to_string(size) + ")");
  }
  if (options.comm.timeout.count() <= 0) {
    return Status::invalid_argument("nccl communicator: timeout " + std::to_string(options.comm.timeout.count()) +
                                    " ms must be positive");
  }
  return Status::ok();
}

}  // namespace

bool nccl_built() noexcept { return true; }

Result<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator& bootstrap, const NcclOptions& options) {
  STRATA_RETURN_IF_ERROR(check_options(bootstrap.rank(), bootstrap.size(), options));
  // The bootstrap's local rank: thread ranks of a `local` bootstrap are distinct GPUs of one process
  // even under a launcher whose environment gives the process one local rank. Every rank picks its
  // GPU before NCCL starts, and the ranks tell each other where they are: one that has no GPU, or
  // two on one GPU, fail every rank at once, where the others would wait in NCCL's initialization
  // until the timeout (or NCCL would run two ranks on one GPU).
  const Result<int> device = pick_device(bootstrap.local_rank(), options.device);
  STRATA_RETURN_IF_ERROR(
      agree_on_placement(bootstrap, device, "nccl communicator: telling the ranks which GPU each takes"));
  // Rank 0 always broadcasts, also when it failed to make the id, so that no peer waits for it.
  struct IdMessage {
    std::int32_t ok = 0;
    std::int32_t pad = 0;
    ncclUniqueId id{};
  } msg;
  if (bootstrap.rank() == 0) msg.ok = ncclGetUniqueId(&msg.id) == ncclSuccess ? 1 : 0;
  Status s = bootstrap.broadcast(&msg, sizeof(msg), 0);
  if (!s.is_ok()) return s.with_context("nccl communicator: broadcasting the NCCL id");
  if (!msg.ok) return Status::internal("nccl communicator: rank 0 could not make an NCCL id (ncclGetUniqueId failed)");
  return create(msg.id, bootstrap.rank(), bootstrap.size(), bootstrap.local_rank(), device.value(), options,
                /*placement_agreed=*/true);
}

Result<std::unique_ptr<Communicator>> make_nccl_communicator_from_file(const std::string& id_path, int rank, int size,
                                                                       const NcclOptions& options) {
  STRATA_RETURN_IF_ERROR(check_options(rank, size, options));
  // Fail before touching NCCL (or the file) when this rank has no GPU of its own to run on.
  const int local_rank = process_local_rank(rank);
  STRATA_ASSIGN_OR_RETURN(const int device, pick_device(local_rank, options.device));
  ncclUniqueId id{};
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return nccl_status(r, "ncclGetUniqueId(&id)", __FILE__, __LINE__, nullptr);
    // Write, fsync, rename: a reader sees the whole id or no file.
    const std::string tmp = id_path + ".tmp." + std::to_string(::getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::io_error("nccl communicator: cannot create '" + tmp + "': " + std::strerror(errno));
    const bool ok = ::write(fd, &id, sizeof(id)) == static_cast<ssize_t>(sizeof(id)) && ::fsync(fd) == 0;
    const int err = errno;
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), id_path.c_str()) != 0) {
      const std::string why = std::strerror(ok ? errno : err);
      ::unlink(tmp.c_str());
      return Status::io_error("nccl communicator: cannot write the NCCL id to '" + id_path + "': " + why);
    }
  } else {
    const auto deadline = Clock::now() + options.comm.timeout;
    for (;;) {
      const int fd = ::open(id_path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        const ssize_t n = ::read(fd, &id, sizeof(id));
        ::close(fd);
        if (n == static_cast<ssize_t>(sizeof(id))) break;
      }
      if (Clock::now() >= deadline) {
        return Status::unavailable("nccl communicator: rank " + std::to_string(rank) + ": the NCCL id file '" +
                                   id_path + "' did not appear within " + std::to_string(options.comm.timeout.count()) +
                                   " ms (is rank 0 running, and does it see the same path?)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return create(id, rank, size, local_rank, device, options, /*placement_agreed=*/false);
}

}  // namespace strata::dispatch

#else  // !STRATA_DISPATCH_NCCL

namespace strata::dispatch {
namespace {
Status not_built() {
  return Status::failed_precondition(
      "nccl communicator: this build has no NCCL support (configured with STRATA_NCCL=OFF, or without the CUDA "
      "backend, or STRATA_NCCL=AUTO found no NCCL: configure with STRATA_CUDA=ON and STRATA_NCCL=ON on a machine "
      "with the CUDA toolkit and NCCL)");
}
}  // namespace

bool nccl_built() noexcept { return false; }

Result<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator&, const NcclOptions&) { return not_built(); }

Result<std::unique_ptr<Communicator>> make_nccl_communicator_from_file(const std::string&, int, int,
                                                                       const NcclOptions&) {
  return not_built();
}

}  // namespace strata::dispatch

#endif  // STRATA_DISPATCH_NCCL
