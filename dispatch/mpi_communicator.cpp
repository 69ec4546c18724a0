// The `mpi` communicator (see mpi_communicator.hpp). Each collective is:
//   1. header: every rank sends its CallInfo (kind, sizes, for all_to_all_v its whole count
//      arrays) to every peer and receives theirs. A peer whose header does not come before the
//      deadline "did not arrive". With every rank's call in hand, each rank runs the same
//      check_agreement() and reaches the same verdict, so no rank moves data that a peer rejects.
//   2. payload: point-to-point sends and receives of the data (all_reduce: a reduce-scatter then an
//      all-gather, each rank reducing its slice in rank order, so results match `local` bit for
//      bit), polled until the same deadline.
// Tags: 3 per call (header, payload round 1, round 2), from the call's sequence number, so a
// message of one call can never be taken for another's; the control tag carries failures.

#include "dispatch/mpi_communicator.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dispatch/detail/comm_check.hpp"
#include "dispatch/detail/device_stage.hpp"
#include "gpu/device.hpp"

namespace strata::dispatch {
namespace {

using detail::CallInfo;
using detail::Collective;
using Clock = std::chrono::steady_clock;

Status mpi_status(int err, const char* expr, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(err, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof(text), "MPI error %d", err);
  return Status::internal(std::string(expr) + " failed at " + file + ":" + std::to_string(line) + ": " + text);
}

}  // namespace
}  // namespace strata::dispatch

/// Evaluates an MPI call and returns an Internal Status (call, MPI's text, file, line) from the
/// enclosing function when it fails. Our communicators use MPI_ERRORS_RETURN, so errors come back.
#define STRATA_MPI_TRY(expr)                                                             \
  do {                                                                                   \
    const int strata_mpi_err_ = (expr);                                                  \
    if (strata_mpi_err_ != MPI_SUCCESS)                                                  \
      return ::strata::dispatch::mpi_status(strata_mpi_err_, #expr, __FILE__, __LINE__); \
  } while (0)

namespace strata::dispatch {
namespace {

constexpr int kControlTag = 1;
constexpr int kFirstTag = 2;
constexpr int kTagsPerCall = 3;  // header, payload round 1, payload round 2
// MPI counts are ints: larger messages go as several, which MPI matches in order.
constexpr std::int64_t kMaxMessage = std::int64_t{1} << 30;
// After a failure, how long cancelled receives may take to report their cancellation.
constexpr std::chrono::milliseconds kCancelGrace{200};

// A failure report on the control tag: the code, then the message.
struct WireFailure {
  std::int32_t code = 0;
  char message[508] = {};
};

// Polling backoff: spin briefly (low latency when peers are ready), then yield, then sleep, so
// ranks oversubscribed on few cores (mpirun --oversubscribe) leave the CPU to the peers they wait for.
void backoff(int idle_rounds) {
  if (idle_rounds < 64) return;
  if (idle_rounds < 256) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// A pending request and the peer at its other end.
struct Op {
  MPI_Request req = MPI_REQUEST_NULL;
  int peer = 0;
  bool recv = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size, int tag_span, const CommOptions& options)
      : comm_(comm), rank_(rank), size_(size), tag_span_(tag_span), options_(options) {
    buffers_.header_in.resize(size);
  }

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;  // MPI is gone (MPI_Finalize ran first); nothing may be called
    bool leftover = false;
    for (MPI_Request& r : graveyard_) {
      int done = 0;
      if (r != MPI_REQUEST_NULL && MPI_Test(&r, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) continue;
      if (r != MPI_REQUEST_NULL) {
        MPI_Request_free(&r);
        leftover = true;
      }
    }
    if (leftover) {
      // MPI may still read these buffers for sends no peer received: keep them alive (a bounded
      // leak, only after a failure).
      auto* keep = new Buffers(std::move(buffers_));  // NOLINT: intentionally never freed
      (void)keep;
    }
    MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::chrono::milliseconds timeout() const noexcept override { return options_.timeout; }
  const char* kind() const noexcept override { return "mpi"; }
  int local_rank() const noexcept override {
    const int local = launcher_local_rank();
    return local >= 0 ? local : rank_;
  }

  Status all_to_all_v_host(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs,
                           void* recv, const std::int64_t* recv_counts, const std::int64_t* recv_displs,
                           const std::string& space_error, const Status& device_error = Status::ok()) {
    CallInfo info =
        detail::all_to_all_v_call(size_, rank_, send, send_counts, send_displs, recv, recv_counts, recv_displs);
    detail::judge_staging(info, space_error, device_error);
    return run(info, [&](std::uint64_t seq, Clock::time_point deadline, const char* what) -> Status {
      std::int64_t total = 0;
      for (int p = 0; p < size_; ++p) total += p == rank_ ? 0 : send_counts[p];
      // Stage every outgoing part before any receive is posted, so that what is sent is the send
      // buffer as it was at the call, whatever arrives meanwhile.
      auto& stage = stage_for(total);
      std::vector<std::int64_t> off(size_, 0);
      std::int64_t at = 0;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_ || send_counts[p] == 0) continue;
        off[p] = at;
        std::memcpy(stage.data() + at, static_cast<const char*>(send) + send_displs[p],
                    static_cast<std::size_t>(send_counts[p]));
        at += send_counts[p];
      }
      std::vector<Op> ops;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_ || recv_counts[p] == 0) continue;
        STRATA_RETURN_IF_ERROR(
            post(ops, true, static_cast<char*>(recv) + recv_displs[p], recv_counts[p], p, tag(seq, 1)));
      }
      for (int p = 0; p < size_; ++p) {
        if (p == rank_ || send_counts[p] == 0) continue;
        STRATA_RETURN_IF_ERROR(post(ops, false, stage.data() + off[p], send_counts[p], p, tag(seq, 1)));
      }
      if (recv_counts[rank_] > 0) {
        std::memmove(static_cast<char*>(recv) + recv_displs[rank_], static_cast<const char*>(send) + send_displs[rank_],
                     static_cast<std::size_t>(recv_counts[rank_]));
      }
      return wait(ops, deadline, what, /*arrival=*/false);
    });
  }

  Status all_gather_host(const void* send, std::int64_t bytes, void* recv, const std::string& space_error,
                         const Status& device_error = Status::ok()) {
    CallInfo info = detail::all_gather_call(size_, send, bytes, recv);
    detail::judge_staging(info, space_error, device_error);
    return run(info, [&](std::uint64_t seq, Clock::time_point deadline, const char* what) -> Status {
      if (bytes == 0) return Status::ok();
      auto& stage = stage_for(bytes);
      std::memcpy(stage.data(), send, static_cast<std::size_t>(bytes));
      std::vector<Op> ops;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        STRATA_RETURN_IF_ERROR(post(ops, true, static_cast<char*>(recv) + p * bytes, bytes, p, tag(seq, 1)));
      }
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        STRATA_RETURN_IF_ERROR(post(ops, false, stage.data(), bytes, p, tag(seq, 1)));
      }
      std::memmove(static_cast<char*>(recv) + rank_ * bytes, send, static_cast<std::size_t>(bytes));
      return wait(ops, deadline, what, false);
    });
  }

  Status all_reduce(void* data, std::int64_t count, DataType type, ReduceOp op) override {
    CallInfo info = detail::all_reduce_call(size_, data, count, type, op);
    return run(info, [&](std::uint64_t seq, Clock::time_point deadline, const char* what) -> Status {
      if (count == 0 || size_ == 1) return Status::ok();
      const std::int64_t es = static_cast<std::int64_t>(size_of(type));
      // Rank c owns elements [lo(c), lo(c + 1)).
      auto lo = [&](int c) { return count * c / size_; };
      const std::int64_t mine = (lo(rank_ + 1) - lo(rank_)) * es;
      char* bytes = static_cast<char*>(data);
      auto& stage = stage_for(count * es);
      std::memcpy(stage.data(), data, static_cast<std::size_t>(count * es));
      auto& in = buffers_.reduce_in;
      if (static_cast<std::int64_t>(in.size()) < mine * size_) in.resize(static_cast<std::size_t>(mine * size_));

      // Round 1 (reduce-scatter): every rank sends each owner its slice.
      std::vector<Op> ops;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_ || mine == 0) continue;
        STRATA_RETURN_IF_ERROR(post(ops, true, in.data() + p * mine, mine, p, tag(seq, 1)));
      }
      for (int p = 0; p < size_; ++p) {
        const std::int64_t n = (lo(p + 1) - lo(p)) * es;
        if (p == rank_ || n == 0) continue;
        STRATA_RETURN_IF_ERROR(post(ops, false, stage.data() + lo(p) * es, n, p, tag(seq, 1)));
      }
      STRATA_RETURN_IF_ERROR(wait(ops, deadline, what, false));
      char* slice = bytes + lo(rank_) * es;
      if (mine > 0) {
        const std::int64_t n = lo(rank_ + 1) - lo(rank_);
        auto contribution = [&](int r) -> const char* {
          return r == rank_ ? stage.data() + lo(rank_) * es : in.data() + r * mine;
        };
        std::memcpy(slice, contribution(0), static_cast<std::size_t>(mine));
        for (int r = 1; r < size_; ++r) detail::reduce_into(slice, contribution(r), n, type, op);
        // The reduced slice goes out from the stage (round 1's sends are done with it).
        std::memcpy(stage.data() + lo(rank_) * es, slice, static_cast<std::size_t>(mine));
      }

      // Round 2 (all-gather of the reduced slices).
      ops.clear();
      for (int p = 0; p < size_; ++p) {
        const std::int64_t n = (lo(p + 1) - lo(p)) * es;
        if (p == rank_ || n == 0) continue;
        STRATA_RETURN_IF_ERROR(post(ops, true, bytes + lo(p) * es, n, p, tag(seq, 2)));
      }
      for (int p = 0; p < size_; ++p) {
        if (p == rank_ || mine == 0) continue;
        STRATA_RETURN_IF_ERROR(post(ops, false, stage.data() + lo(rank_) * es, mine, p, tag(seq, 2)));
      }
      return wait(ops, deadline, what, false);
    });
  }

  Status broadcast_host(void* data, std::int64_t bytes, int root, const std::string& space_error,
                        const Status& device_error = Status::ok()) {
    CallInfo info = detail::broadcast_call(size_, data, bytes, root);
    detail::judge_staging(info, space_error, device_error);
    return run(info, [&](std::uint64_t seq, Clock::time_point deadline, const char* what) -> Status {
      if (bytes == 0 || size_ == 1) return Status::ok();
      std::vector<Op> ops;
      if (rank_ == root) {
        auto& stage = stage_for(bytes);
        std::memcpy(stage.data(), data, static_cast<std::size_t>(bytes));
        for (int p = 0; p < size_; ++p) {
          if (p != rank_) STRATA_RETURN_IF_ERROR(post(ops, false, stage.data(), bytes, p, tag(seq, 1)));
        }
      } else {
        STRATA_RETURN_IF_ERROR(post(ops, true, data, bytes, root, tag(seq, 1)));
      }
      return wait(ops, deadline, what, false);
    });
  }

  // ---- device buffers: staged through pinned host memory (detail/device_stage.hpp) ----

  Status do_all_to_all_v(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs, void* recv,
                         const std::int64_t* recv_counts, const std::int64_t* recv_displs,
                         const BufferSpace& space) override {
    if (!space.on_device())
      return all_to_all_v_host(send, send_counts, send_displs, recv, recv_counts, recv_displs, "");
    return detail::staged_all_to_all_v(stages_, size_, rank_, send, send_counts, send_displs, recv, recv_counts,
                                       recv_displs, space,
                                       [this](auto... host_args) { return all_to_all_v_host(host_args...); });
  }

  Status do_all_gather(const void* send, std::int64_t bytes, void* recv, const BufferSpace& space) override {
    if (!space.on_device()) return all_gather_host(send, bytes, recv, "");
    return detail::staged_all_gather(
        stages_, size_, rank_, send, bytes, recv, space,
        [&](const void* hs, void* hr, const std::string& arg_error, const Status& device_error) {
          return all_gather_host(hs, bytes, hr, arg_error, device_error);
        });
  }

  Status do_broadcast(void* data, std::int64_t bytes, int root, const BufferSpace& space) override {
    if (!space.on_device()) return broadcast_host(data, bytes, root, "");
    return detail::staged_broadcast(stages_, size_, rank_, data, bytes, root, space,
                                    [&](void* hd, const std::string& arg_error, const Status& device_error) {
                                      return broadcast_host(hd, bytes, root, arg_error, device_error);
                                    });
  }

  void forget_device(const gpu::Device& device) noexcept override {
    // Only `device`'s pinned buffers go; the other devices' stages stay as they are.
    stages_.forget(device);
  }

  Status barrier() override {
    CallInfo info;
    info.kind = Collective::kBarrier;
    return run(info, [](std::uint64_t, Clock::time_point, const char*) { return Status::ok(); });
  }

  CommCounters counters() const noexcept override { return tally_.counters(); }

 private:
  // Internal buffers that pending MPI requests may point into.
  struct Buffers {
    std::vector<std::int64_t> header_out;              // this rank's WireHeader (+ counts)
    std::vector<std::vector<std::int64_t>> header_in;  // per peer
    std::vector<char> stage;                           // data being sent
    std::vector<char> reduce_in;                       // all_reduce: the peers' parts of this rank's slice
    WireFailure failure;                               // the failure report sent to peers
  };

  int tag(std::uint64_t seq, int phase) const noexcept {
    return kFirstTag + static_cast<int>(seq % static_cast<std::uint64_t>(tag_span_)) * kTagsPerCall + phase;
  }

  std::vector<char>& stage_for(std::int64_t bytes) {
    if (static_cast<std::int64_t>(buffers_.stage.size()) < bytes)
      buffers_.stage.resize(static_cast<std::size_t>(bytes));
    return buffers_.stage;
  }

  // Posts a send or receive of `bytes` at `p` with `peer`, split into messages MPI can count.
  // On an MPI error the requests already in `ops` are abandoned (they may point into the caller's
  // buffers) and the error returned.
  Status post(std::vector<Op>& ops, bool recv, void* p, std::int64_t bytes, int peer, int tag) {
    char* at = static_cast<char*>(p);
    while (bytes > 0) {
      const int n = static_cast<int>(std::min(bytes, kMaxMessage));
      Op op;
      op.peer = peer;
      op.recv = recv;
      const int err = recv ? MPI_Irecv(at, n, MPI_BYTE, peer, tag, comm_, &op.req)
                           : MPI_Isend(at, n, MPI_BYTE, peer, tag, comm_, &op.req);
      if (err != MPI_SUCCESS) {
        abandon(ops);
        return mpi_status(err,
                          recv ? "MPI_Irecv(buf, n, MPI_BYTE, peer, tag, comm, &req)"
                               : "MPI_Isend(buf, n, MPI_BYTE, peer, tag, comm, &req)",
                          __FILE__, __LINE__);
      }
      ops.push_back(op);
      at += n;
      bytes -= n;
    }
    return Status::ok();
  }

  // One collective: header exchange, agreement, then `payload(seq, deadline, what)`.
  template <class Payload>
  Status run(const CallInfo& mine, Payload&& payload) {
    tally_.count_call();
    const char* what = detail::collective_name(mine.kind);
    if (!broken_.is_ok()) return detail::broken_status(what, broken_);
    Status s = check_control();
    if (!s.is_ok()) return fail(s, /*tell_peers=*/false);
    const std::uint64_t seq = seq_++;
    const auto deadline = Clock::now() + options_.timeout;

    std::vector<CallInfo> all;
    s = exchange_headers(mine, seq, deadline, what, all);
    if (!s.is_ok()) return s;  // already broken (and told) by exchange_headers
    std::vector<const CallInfo*> calls(size_);
    for (int r = 0; r < size_; ++r) calls[r] = &all[r];
    const detail::Verdict verdict = detail::check_agreement(calls);
    // Every rank reached the same verdict: none needs telling, and one that does not break the
    // communicator (device errors found before the call) leaves every rank in step.
    if (!verdict.status.is_ok()) return verdict.breaks ? fail(verdict.status, false) : verdict.status;

    s = payload(seq, deadline, what);
    if (!s.is_ok()) return broken_.is_ok() ? fail(s, true) : s;
    tally_.count_moved(mine, rank_, size_);
    return Status::ok();
  }

  Status exchange_headers(const CallInfo& mine, std::uint64_t seq, Clock::time_point deadline, const char* what,
                          std::vector<CallInfo>& all) {
    // A header without counts goes alone; a receive takes the longest.
    const std::size_t max_words = detail::wire_words(size_);
    auto& out = buffers_.header_out;
    out.resize(max_words);
    const std::size_t words = detail::encode_call(mine, seq, size_, out.data());

    std::vector<Op> ops;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      auto& in = buffers_.header_in[p];
      in.resize(max_words);
      Status s =
          post(ops, true, in.data(), static_cast<std::int64_t>(max_words * sizeof(std::int64_t)), p, tag(seq, 0));
      if (!s.is_ok()) return fail(s, true);
    }
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      Status s = post(ops, false, out.data(), static_cast<std::int64_t>(words * sizeof(std::int64_t)), p, tag(seq, 0));
      if (!s.is_ok()) return fail(s, true);
    }
    Status s = wait(ops, deadline, what, /*arrival=*/true);
    if (!s.is_ok()) return broken_.is_ok() ? fail(s, true) : s;

    // Every call as it went on the wire, this rank's too (from the header just encoded), so every
    // rank judges the same texts.
    all.assign(size_, CallInfo{});
    for (int p = 0; p < size_; ++p) {
      const std::int64_t* in = p == rank_ ? out.data() : buffers_.header_in[p].data();
      if (!detail::is_wire_header(in)) {
        return fail(Status::internal(std::string(what) + ": rank " + std::to_string(p) +
                                     " sent a message that is not a strata header (another program on this MPI "
                                     "communicator?)"),
                    true);
      }
      detail::decode_call(in, size_, all[p]);
    }
    return Status::ok();
  }

  // Polls `ops` until all completed, the deadline passes or a peer reports a failure.
  // `arrival`: the header exchange, where an incomplete receive means the peer did not arrive.
  Status wait(std::vector<Op>& ops, Clock::time_point deadline, const char* what, bool arrival) {
    int idle = 0;
    for (;;) {
      bool all_done = true;
      bool progress = false;
      for (Op& op : ops) {
        if (op.req == MPI_REQUEST_NULL) continue;
        int done = 0;
        const int err = MPI_Test(&op.req, &done, MPI_STATUS_IGNORE);
        if (err != MPI_SUCCESS) {
          abandon(ops);
          return mpi_status(err, "MPI_Test(&req, &done, MPI_STATUS_IGNORE)", __FILE__, __LINE__).with_context(what);
        }
        if (done) {
          progress = true;
        } else {
          all_done = false;
        }
      }
      if (all_done) return Status::ok();
      Status peer = check_control();
      if (!peer.is_ok()) {
        abandon(ops);
        return fail(peer, false);
      }
      if (Clock::now() >= deadline) {
        // Name the peers we still wait for: receives first (they did not send), else sends.
        std::vector<int> missing;
        for (int pass = 0; pass < 2 && missing.empty(); ++pass) {
          for (const Op& op : ops) {
            if (op.req != MPI_REQUEST_NULL && op.recv == (pass == 0) &&
                std::find(missing.begin(), missing.end(), op.peer) == missing.end()) {
              missing.push_back(op.peer);
            }
          }
        }
        std::sort(missing.begin(), missing.end());
        abandon(ops);
        if (arrival) return fail(detail::timeout_status(what, options_.timeout, missing, size_), true);
        return fail(
            Status::unavailable(std::string(what) + ": timed out after " + std::to_string(options_.timeout.count()) +
                                " ms moving data; " + detail::rank_list(missing) + " of " + std::to_string(size_) +
                                " did not complete the transfer"),
            true);
      }
      idle = progress ? 0 : idle + 1;
      backoff(idle);
    }
  }

  // Gives up on the incomplete requests of a failed call: receives are cancelled (they point
  // into the caller's buffers); whatever is still pending is kept for the destructor.
  void abandon(std::vector<Op>& ops) {
    for (Op& op : ops) {
      if (op.req != MPI_REQUEST_NULL && op.recv) MPI_Cancel(&op.req);
    }
    const auto until = Clock::now() + kCancelGrace;
    bool pending = true;
    while (pending && Clock::now() < until) {
      pending = false;
      for (Op& op : ops) {
        if (op.req == MPI_REQUEST_NULL) continue;
        int done = 0;
        if (MPI_Test(&op.req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) pending = pending || op.recv;
      }
      if (pending) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    for (Op& op : ops) {
      if (op.req != MPI_REQUEST_NULL) graveyard_.push_back(op.req);
      op.req = MPI_REQUEST_NULL;
    }
  }

  // A failure report from a peer, if one came (non-blocking).
  Status check_control() {
    int flag = 0;
    MPI_Status st;
    STRATA_MPI_TRY(MPI_Iprobe(MPI_ANY_SOURCE, kControlTag, comm_, &flag, &st));
    if (!flag) return Status::ok();
    WireFailure f;
    STRATA_MPI_TRY(MPI_Recv(&f, sizeof(f), MPI_BYTE, st.MPI_SOURCE, kControlTag, comm_, MPI_STATUS_IGNORE));
    f.message[sizeof(f.message) - 1] = '\0';
    return Status::from_code(static_cast<StatusCode>(f.code), "rank " + std::to_string(st.MPI_SOURCE) + " of " +
                                                                  std::to_string(size_) + " failed: " + f.message);
  }

  // Breaks the communicator with `s`; `tell_peers` when they may not know (a timeout, a local
  // MPI error), so that they fail now rather than at their own timeout.
  Status fail(Status s, bool tell_peers) {
    if (!broken_.is_ok()) return s;
    broken_ = s;
    if (tell_peers && size_ > 1) {
      buffers_.failure.code = static_cast<std::int32_t>(s.code());
      detail::copy_text(buffers_.failure.message, sizeof(buffers_.failure.message), s.message());
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        MPI_Request r = MPI_REQUEST_NULL;
        if (MPI_Isend(&buffers_.failure, sizeof(WireFailure), MPI_BYTE, p, kControlTag, comm_, &r) == MPI_SUCCESS) {
          graveyard_.push_back(r);
        }
      }
    }
    return s;
  }

  MPI_Comm comm_;
  const int rank_;
  const int size_;
  const int tag_span_;
  const CommOptions options_;
  std::uint64_t seq_ = 0;
  Status broken_;
  Buffers buffers_;
  detail::DeviceStages stages_;         // pinned staging of device buffers, one per device
  std::vector<MPI_Request> graveyard_;  // requests of failed calls (and failure reports) still pending
  detail::CallTally tally_;
};

std::mutex g_init_mu;

void finalize_mpi_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

bool mpi_built() noexcept { return true; }

Status ensure_mpi_initialized() {
  std::lock_guard<std::mutex> lock(g_init_mu);
  int initialized = 0;
  int finalized = 0;
  STRATA_MPI_TRY(MPI_Initialized(&initialized));
  STRATA_MPI_TRY(MPI_Finalized(&finalized));
  if (finalized) return Status::failed_precondition("mpi: MPI was already finalized; it cannot be initialized again");
  if (initialized) return Status::ok();
  int provided = 0;
  STRATA_MPI_TRY(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
  std::atexit(finalize_mpi_at_exit);
  return Status::ok();
}

Result<MpiPlace> mpi_place() {
  STRATA_RETURN_IF_ERROR(ensure_mpi_initialized());
  MpiPlace place;
  STRATA_MPI_TRY(MPI_Comm_rank(MPI_COMM_WORLD, &place.rank));
  STRATA_MPI_TRY(MPI_Comm_size(MPI_COMM_WORLD, &place.size));
  const int local = launcher_local_rank();
  place.local_rank = local >= 0 ? local : place.rank;
  return place;
}

Result<std::unique_ptr<Communicator>> make_mpi_communicator(const CommOptions& options) {
  STRATA_RETURN_IF_ERROR(ensure_mpi_initialized());
  MPI_Comm world = MPI_COMM_WORLD;
  return make_mpi_communicator_over(&world, options);
}

Result<std::unique_ptr<Communicator>> make_mpi_communicator_over(const void* mpi_comm, const CommOptions& options) {
  if (!mpi_comm) return Status::invalid_argument("mpi communicator: mpi_comm is null (pass a pointer to an MPI_Comm)");
  if (options.timeout.count() <= 0) {
    return Status::invalid_argument("mpi communicator: timeout " + std::to_string(options.timeout.count()) +
                                    " ms must be positive");
  }
  int initialized = 0;
  STRATA_MPI_TRY(MPI_Initialized(&initialized));
  if (!initialized) {
    return Status::failed_precondition("mpi communicator: MPI is not initialized (call ensure_mpi_initialized())");
  }
  const MPI_Comm parent = *static_cast<const MPI_Comm*>(mpi_comm);
  // A non-blocking duplicate, polled with the timeout: MPI_Comm_dup would wait forever for a
  // process that never creates its communicator.
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  STRATA_MPI_TRY(MPI_Comm_idup(parent, &comm, &req));
  const auto deadline = Clock::now() + options.timeout;
  int idle = 0;
  for (;;) {
    int done = 0;
    STRATA_MPI_TRY(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) break;
    if (Clock::now() >= deadline) {
      // A pending MPI_Comm_idup cannot be cancelled; its request stays with MPI.
      MPI_Request_free(&req);
      return Status::unavailable("mpi communicator: timed out after " + std::to_string(options.timeout.count()) +
                                 " ms duplicating the MPI communicator: not every process created its "
                                 "communicator (MPI does not say which)");
    }
    backoff(++idle);
  }
  STRATA_MPI_TRY(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = 0;
  int size = 0;
  STRATA_MPI_TRY(MPI_Comm_rank(comm, &rank));
  STRATA_MPI_TRY(MPI_Comm_size(comm, &size));
  int* tag_ub = nullptr;
  int flag = 0;
  STRATA_MPI_TRY(MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &flag));
  const int ub = flag && tag_ub ? *tag_ub : 32767;  // the standard's guaranteed minimum
  const int span = std::min((ub - kFirstTag) / kTagsPerCall, 1 << 20);
  return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(comm, rank, size, span, options));
}

}  // namespace strata::dispatch
