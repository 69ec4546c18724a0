#pragma once
// Communicator: the collectives that dispatch needs between the ranks of one world. Three
// implementations share this interface and one conformance suite: `local` (ranks are threads of
// one process), `mpi` (one rank per process, OpenMPI) and `nccl` (one rank per GPU).
//
// Every call is a collective: all ranks of the world must make the same calls in the same order.
// A call that cannot complete within the communicator's timeout returns kUnavailable naming the
// ranks that did not arrive; a call whose peers are in a different collective (or disagree on a
// size that must match) returns an error naming the ranks and what they called. After such an
// error the communicator is broken: every later call returns the same error, never a hang.
// Buffers are host memory for every implementation (`nccl` stages through device buffers).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace strata::dispatch {

enum class DataType { kInt32, kInt64, kFloat32, kFloat64 };
enum class ReduceOp { kSum, kMin, kMax };

/// Size in bytes of one element of `t`.
std::size_t size_of(DataType t) noexcept;

struct CommOptions {
  /// How long a collective waits for its peers before failing with kUnavailable.
  std::chrono::milliseconds timeout{30000};
};

/// Bytes moved by this rank's collectives since creation (what it sent to other ranks and
/// received from them; its own rank's share is not counted). Every implementation counts the
/// payload the same way, whatever its algorithm: all_to_all_v the counts of the other ranks;
/// all_gather and all_reduce the buffer once per other rank in each direction; broadcast the
/// buffer once per other rank at the root and once at every other rank; barrier nothing. Only
/// successful calls move bytes; `calls` counts every call, failed ones included.
struct CommCounters {
  std::int64_t sent_bytes = 0;
  std::int64_t received_bytes = 0;
  std::int64_t calls = 0;
};

/// One rank of a world. Not thread-safe: one thread at a time calls a given communicator (the
/// ranks of a `local` world are called from different threads at once, one thread per rank);
/// counters() may be read from any thread.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  /// "local", "mpi" or "nccl".
  virtual const char* kind() const noexcept = 0;
  /// This rank's place among the ranks of its host, which picks its GPU (local_rank modulo the
  /// visible GPUs: a store's device ordinal "auto", the `nccl` communicator's device): `local`
  /// ranks are threads of one process, so its rank; `mpi` the launcher's local rank
  /// (launcher_local_rank(), dispatch/mpi_communicator.hpp), else the rank; `nccl` its bootstrap
  /// communicator's (from an id file: as `mpi`).
  virtual int local_rank() const noexcept = 0;
  /// The CUDA device this rank's collectives run on (`nccl`), -1 for communicators that work in
  /// host memory. A store in this rank's world opens that device (device ordinal "auto").
  virtual int device() const noexcept { return -1; }

  /// All-to-all with variable sizes, in bytes: `send_counts[r]` bytes starting at
  /// `send + send_displs[r]` go to rank r and arrive there at `recv + recv_displs[me]` of rank r,
  /// which must expect exactly that many (`recv_counts[me]`), else an error naming both ranks.
  /// Each array has size() entries.
  virtual Status all_to_all_v(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs,
                              void* recv, const std::int64_t* recv_counts, const std::int64_t* recv_displs) = 0;
  /// Every rank contributes `bytes` (the same on every rank); `recv` receives size() * bytes in
  /// rank order.
  virtual Status all_gather(const void* send, std::int64_t bytes, void* recv) = 0;
  /// In place element-wise reduction of `count` elements (the same count and type on every rank).
  virtual Status all_reduce(void* data, std::int64_t count, DataType type, ReduceOp op) = 0;
  /// Copies `bytes` from `root`'s `data` into every rank's `data`.
  virtual Status broadcast(void* data, std::int64_t bytes, int root) = 0;
  virtual Status barrier() = 0;

  virtual CommCounters counters() const noexcept = 0;
};

/// All-to-all of one int64 per peer: `send[r]` goes to rank r, `recv[r]` comes from rank r
/// (the usual exchange of counts before an all_to_all_v).
Status all_to_all_counts(Communicator& comm, const std::vector<std::int64_t>& send, std::vector<std::int64_t>& recv);

}  // namespace strata::dispatch
