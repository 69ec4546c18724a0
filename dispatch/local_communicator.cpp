// The `local` communicator. One Group per world holds the rendezvous; see local_communicator.hpp
// for the protocol in short. Every collective is three steps:
//   1. arrive: post this rank's call (kind, sizes, buffer pointers) and wait until every rank has
//      posted the same generation, or the timeout. The last rank to arrive judges the calls
//      (check_agreement) once for all, so every rank returns the same verdict.
//   2. copy: each rank reads its peers' posted buffers directly into its own (no lock held):
//      memcpy for host buffers; for device buffers Device::copy_peer from each peer's device on
//      this rank's stream, then a wait for that stream (peers may reuse their buffers once every
//      rank departed, so the copies must be done by then).
//   3. depart: wait until every rank has finished copying, because peers read this rank's
//      buffers, which the caller may free as soon as the call returns.
// Step 3 has no timeout: every rank that passed step 1 is inside a bounded memcpy loop, so it
// always ends, and returning early would let the caller free memory a peer is still reading.

#include "dispatch/local_communicator.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "dispatch/detail/comm_check.hpp"

namespace strata::dispatch {
namespace {

using detail::CallInfo;
using detail::Collective;

// One rank's part of a collective as its peers see it.
struct Posting {
  CallInfo info;
  /// What peers read: the send buffer (all_to_all_v, all_gather), the data (broadcast root) or a
  /// copy of the input (all_reduce). Host memory, valid until the rank departs.
  const void* src = nullptr;
  const std::int64_t* send_displs = nullptr;  ///< all_to_all_v (size() entries)
  /// The device whose memory `src` is (BufferSpace::device); nullptr: host memory.
  gpu::Device* device = nullptr;
  bool data = false;  ///< a data-moving collective, whose ranks must agree on the memory space
};

// Ranks read each other's buffers, so they must all pass host memory or all device memory: ""
// or the reason (the same on every rank, judged from every rank's posting).
std::string space_disagreement(const std::vector<Posting>& posts) {
  std::vector<int> host, device;
  for (int r = 0; r < static_cast<int>(posts.size()); ++r) {
    if (!posts[r].data) return "";
    (posts[r].device ? device : host).push_back(r);
  }
  if (host.empty() || device.empty()) return "";
  return "the ranks of a local communicator read each other's buffers, so all must pass the same memory space; " +
         detail::rank_list(host) + " passed host memory and " + detail::rank_list(device) + " device memory";
}

class Group {
 public:
  Group(int size, const CommOptions& options) : size_(size), options_(options), posts_(size), arrived_(size, 0) {}

  int size() const noexcept { return size_; }
  std::chrono::milliseconds timeout() const noexcept { return options_.timeout; }

  // Step 1 for call number `k` (1-based, per rank) of rank `me`. Returns OK when every rank
  // arrived and the calls agree; otherwise the error, which also breaks the group unless it is
  // a device error found before the call (detail::Verdict::breaks).
  Status arrive(int me, std::uint64_t k, Posting post, const char* what) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!broken_.is_ok()) return detail::broken_status(what, broken_);
    posts_[me] = std::move(post);
    arrived_[me] = k;
    if (++arrivals_ == size_) {
      arrivals_ = 0;
      std::vector<const CallInfo*> calls(size_);
      for (int r = 0; r < size_; ++r) calls[r] = &posts_[r].info;
      detail::Verdict v = detail::check_agreement(calls);
      if (!v.breaks) {  // OK or device errors alone: ranks in mixed memory spaces disagree all the same
        const std::string mixed = space_disagreement(posts_);
        if (!mixed.empty()) v = {Status::invalid_argument(std::string(what) + ": " + mixed), true};
      }
      verdict_ = v.status;
      if (v.breaks) broken_ = verdict_;
      completed_ = k;
      cv_.notify_all();
      return verdict_;
    }
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    cv_.wait_until(lock, deadline, [&] { return completed_ >= k || !broken_.is_ok(); });
    // Completion wins over a later break (a peer that finished and closed its communicator).
    // Generation k + 1 cannot complete without this rank, so verdict_ is still generation k's.
    if (completed_ >= k) return verdict_;
    // Broken while this rank waited: a peer timed out on this very call or left the group; its
    // error is this call's error.
    if (!broken_.is_ok()) return broken_;
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r) {
      if (arrived_[r] < k) missing.push_back(r);
    }
    broken_ = detail::timeout_status(what, options_.timeout, missing, size_);
    cv_.notify_all();
    return broken_;
  }

  // Step 3 of call `k`.
  void depart(std::uint64_t k) {
    std::unique_lock<std::mutex> lock(mu_);
    if (++departures_ == size_) {
      departures_ = 0;
      released_ = k;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return released_ >= k; });
  }

  // Rank r's posting. Read without the lock between arrive() and depart(): it was written under
  // the lock before every rank's arrive() returned, and rank r cannot post again before every
  // rank has departed.
  const Posting& post(int r) const noexcept { return posts_[r]; }

  // Rank `me` leaves: nobody can complete a collective with the group any more, so say so now
  // rather than letting the others wait for the timeout.
  void close(int me) {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.is_ok()) {
      broken_ = Status::unavailable("rank " + std::to_string(me) + " of " + std::to_string(size_) +
                                    " closed its local communicator (left the group)");
    }
    cv_.notify_all();
  }

 private:
  const int size_;
  const CommOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Posting> posts_;
  std::vector<std::uint64_t> arrived_;  // the last call number each rank arrived at
  int arrivals_ = 0;                    // ranks arrived at the generation in progress
  std::uint64_t completed_ = 0;         // the last generation every rank arrived at
  Status verdict_;                      // the verdict on generation completed_ (check_agreement())
  int departures_ = 0;
  std::uint64_t released_ = 0;  // the last generation every rank departed from
  Status broken_;               // the first failure; every later call returns it
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}
  ~LocalCommunicator() override { group_->close(rank_); }
  LocalCommunicator(const LocalCommunicator&) = delete;
  LocalCommunicator& operator=(const LocalCommunicator&) = delete;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return group_->size(); }
  const char* kind() const noexcept override { return "local"; }
  int local_rank() const noexcept override { return rank_; }
  std::chrono::milliseconds timeout() const noexcept override { return group_->timeout(); }

  Status do_all_to_all_v(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs, void* recv,
                         const std::int64_t* recv_counts, const std::int64_t* recv_displs,
                         const BufferSpace& space) override {
    Posting p;
    p.info = detail::all_to_all_v_call(size(), rank_, send, send_counts, send_displs, recv, recv_counts, recv_displs);
    detail::judge_space(p.info, space);
    p.src = send;
    p.send_displs = send_displs;
    p.device = space.device;
    p.data = true;
    return run(std::move(p), /*peers_read=*/true, [&] {
      const int n = size();
      // Start with the next rank so that the ranks do not all read the same peer first.
      for (int i = 1; i <= n; ++i) {
        const int peer = (rank_ + i) % n;
        const std::int64_t bytes = recv_counts[peer];
        if (bytes == 0) continue;
        const Posting& q = group_->post(peer);
        const char* from = static_cast<const char*>(q.src) + q.send_displs[rank_];
        char* to = static_cast<char*>(recv) + recv_displs[peer];
        copy(space, to, q, from, bytes, peer);
      }
      return finish(space);
    });
  }

  Status do_all_gather(const void* send, std::int64_t bytes, void* recv, const BufferSpace& space) override {
    Posting p;
    p.info = detail::all_gather_call(size(), send, bytes, recv);
    detail::judge_space(p.info, space);
    p.src = send;
    p.device = space.device;
    p.data = true;
    return run(std::move(p), true, [&] {
      if (bytes == 0) return Status::ok();
      const int n = size();
      for (int i = 1; i <= n; ++i) {
        const int peer = (rank_ + i) % n;
        const Posting& q = group_->post(peer);
        copy(space, static_cast<char*>(recv) + peer * bytes, q, q.src, bytes, peer);
      }
      return finish(space);
    });
  }

  Status all_reduce(void* data, std::int64_t count, DataType type, ReduceOp op) override {
    Posting p;
    p.info = detail::all_reduce_call(size(), data, count, type, op);
    const bool work = p.info.arg_error.empty() && count > 0 && size() > 1;
    if (work) {
      // `data` is both input and output, and peers read every rank's input while this rank
      // writes its result: post a copy. Every rank reduces all inputs in rank order, so every
      // rank gets the same bits.
      const std::size_t bytes = static_cast<std::size_t>(count) * size_of(type);
      if (scratch_.size() < bytes) scratch_.resize(bytes);
      std::memcpy(scratch_.data(), data, bytes);
      p.src = scratch_.data();
    }
    return run(std::move(p), true, [&] {
      if (!work) return Status::ok();
      const std::size_t bytes = static_cast<std::size_t>(count) * size_of(type);
      std::memcpy(data, group_->post(0).src, bytes);
      for (int r = 1; r < size(); ++r) detail::reduce_into(data, group_->post(r).src, count, type, op);
      return Status::ok();
    });
  }

  Status do_broadcast(void* data, std::int64_t bytes, int root, const BufferSpace& space) override {
    Posting p;
    p.info = detail::broadcast_call(size(), data, bytes, root);
    detail::judge_space(p.info, space);
    p.src = data;
    p.device = space.device;
    p.data = true;
    return run(std::move(p), true, [&] {
      if (rank_ == root || bytes == 0) return Status::ok();
      copy(space, data, group_->post(root), group_->post(root).src, bytes, root);
      return finish(space);
    });
  }

  Status barrier() override {
    Posting p;
    p.info.kind = Collective::kBarrier;
    return run(std::move(p), /*peers_read=*/false, [] { return Status::ok(); });
  }

  CommCounters counters() const noexcept override { return tally_.counters(); }

 private:
  // Steps 1 to 3 (see the top of the file); `copy_in` is step 2, run only when every rank agreed.
  // Its error (device buffers whose copies failed) is this rank's alone: the group stays whole.
  template <class CopyIn>
  Status run(Posting post, bool peers_read, CopyIn&& copy_in) {
    // Two threads in one rank's collectives at once would silently corrupt the rendezvous: a
    // programmer error, so abort with a message.
    if (busy_.exchange(true, std::memory_order_acquire)) {
      std::fprintf(stderr, "strata: local communicator rank %d called from two threads at once\n", rank_);
      std::abort();
    }
    struct Release {
      std::atomic<bool>& busy;
      ~Release() { busy.store(false, std::memory_order_release); }
    } release{busy_};
    tally_.count_call();
    const std::uint64_t k = ++calls_;
    const Collective kind = post.info.kind;
    // The counts arrays of all_to_all_v stay valid for the whole call; keep a copy of the rest.
    CallInfo info = post.info;
    Status s = group_->arrive(rank_, k, std::move(post), detail::collective_name(kind));
    if (!s.is_ok()) return s;
    const Status copied = copy_in();
    if (peers_read) group_->depart(k);
    if (!copied.is_ok()) return copied.with_context(detail::collective_name(kind));
    tally_.count_moved(info, rank_, size());
    return Status::ok();
  }

  // One peer's part into this rank's buffer. Only this rank's own part may be in place (an
  // all_to_all_v refuses any other overlap of send and receive ranges, check_a2a_arguments, for
  // peers read this rank's send ranges while it writes its receive ranges): a copy onto itself is
  // skipped, and the host self copy is a memmove all the same. Buffers of different ranks never
  // overlap. Device buffers: a device copy on this rank's stream (its own share d2d, a peer's from
  // the peer's device); finish() waits for them.
  void copy(const BufferSpace& space, void* to, const Posting& from_post, const void* from, std::int64_t bytes,
            int peer) const noexcept {
    if (to == from) return;
    const std::size_t n = static_cast<std::size_t>(bytes);
    if (space.on_device()) {
      if (peer == rank_) {
        space.device->copy_d2d(space.stream, to, from, n);
      } else {
        space.device->copy_peer(space.stream, to, *from_post.device, from, n);
      }
    } else if (peer == rank_) {
      std::memmove(to, from, n);
    } else {
      std::memcpy(to, from, n);
    }
  }

  // Device buffers: waits until this rank's copies are done (before it departs, after which peers
  // may reuse the buffers it read).
  static Status finish(const BufferSpace& space) {
    return space.on_device() ? space.device->synchronize(space.stream) : Status::ok();
  }

  std::shared_ptr<Group> group_;
  const int rank_;
  std::uint64_t calls_ = 0;             // collectives started, numbering the generations
  std::vector<unsigned char> scratch_;  // all_reduce input posted to the peers
  detail::CallTally tally_;
  std::atomic<bool> busy_{false};  // a call is in progress
};

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> make_local_group(int size, const CommOptions& options) {
  if (size < 1) return Status::invalid_argument("local group: size " + std::to_string(size) + " must be at least 1");
  if (options.timeout.count() <= 0) {
    return Status::invalid_argument("local group: timeout " + std::to_string(options.timeout.count()) +
                                    " ms must be positive");
  }
  auto group = std::make_shared<Group>(size, options);
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.reserve(size);
  for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<LocalCommunicator>(group, r));
  return comms;
}

}  // namespace strata::dispatch
