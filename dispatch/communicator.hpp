#pragma once
// Communicator: the collectives that dispatch needs between the ranks of one world. Four
// implementations share this interface and one conformance suite: `local` (ranks are threads of
// one process), `mpi` (one rank per process, OpenMPI), `nccl` (one rank per GPU) and `transport`
// (transport_communicator.hpp: over a Transport that only moves bytes, which a program implements
// over what it has, e.g. a torch.distributed process group; its kind() is the Transport's).
//
// Every call is a collective: all ranks of the world must make the same calls in the same order. A
// call that cannot complete within the communicator's timeout returns kUnavailable naming the ranks
// that did not arrive; a call whose peers are in a different collective (or disagree on a size that
// must match) returns an error naming the ranks and what they called. After such an error the
// communicator is broken: every later call returns the same error, never a hang. A device that
// failed before a device collective (a sticky error found by the call's own readiness check,
// however late it came: work of another stream of the device may fail after the caller's last
// agreement), or the pinned staging of device buffers (`mpi`, `transport`) that cannot be allocated
// (ResourceExhausted), fails that call on every rank with the same error, and breaks nothing: every
// rank learns it with the call's arguments, before any data moved, so the ranks stay in step.
// Except under `nccl` when the fault poisoned the rank's CUDA context (cudaErrorIllegalAddress and
// the like): that rank cannot copy its header for the all-gather either, so it breaks and aborts,
// and its peers time out after CommOptions::timeout with kUnavailable and break. A device error on
// one rank after a device collective's copies started (its device failed during the call) fails
// that rank's call only in `local`, `mpi` and `transport` when the communicator's own copies see
// it (staging, the own share, the wait for the stream after the data moved); a failed device
// operation of `nccl`, or of a `transport` whose Transport takes the device buffers (its device
// operation returned an error), breaks the communicator like any error of the collective itself:
// a device dying mid-call, as one can during any kernel.
//
// Memory spaces: the data-moving collectives (all_to_all_v, all_gather, broadcast) take a
// BufferSpace saying where their buffers live: host memory (the default) or device memory of a
// gpu::Device, ordered on one of its streams. Every implementation accepts both, and every rank
// of a world may choose its own space, except `local`, whose ranks read each other's buffers and
// so must all pass the same kind of space (else every rank fails with InvalidArgument):
//   local  host: memcpy between the ranks' buffers; device: Device::copy_peer from each peer's
//          device into this rank's (emu devices of one process, or CUDA devices / one CUDA device
//          shared by thread ranks), issued on this rank's stream. The ranks read each other's
//          send buffers while writing their own receive buffers, so the buffers of different
//          ranks must not overlap (not checked)
//   mpi    host: as is; device: staged through pinned host memory the communicator owns (one D2H
//          before, one H2D after; MPI's own CUDA awareness is not used, see mpi_communicator.hpp)
//   nccl   host: staged through device buffers the communicator owns; device: NCCL reads and
//          writes the caller's device buffers directly (they must be on the communicator's GPU)
//   transport  host: copied through the Transport's own memory; device: given to the Transport
//          directly when it takes_device() the space, else staged as `mpi` does
// all_reduce and barrier work on host memory only: they carry control values (counts, verdicts),
// never rows.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "gpu/device.hpp"

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

/// Where the buffers of one collective live.
///
/// Host (the default, `device` null): pageable or pinned host memory, read and written by the
/// calling thread. Device: memory of `device` (Device::allocate). The collective first waits (on
/// the host) for the work queued on `stream` before the call, so the send buffer is read as that
/// work left it; when it returns OK the received data is in place in device memory and whatever
/// it queued on `stream` has completed: like host collectives, a device collective is synchronous
/// for the host, and the caller may queue work that reads the received data right away. `stream`
/// must be a stream of `device`, else every rank fails the call with InvalidArgument (a broken
/// communicator, as for any invalid argument). A sticky error of `device` found before the data
/// moves (or, `mpi` and `transport`, staging it failing) fails every rank with that error's code, naming the rank,
/// and leaves the communicator usable (`nccl`: unless the fault poisoned the CUDA context, see the
/// top of this file); one found after (the copies in) fails this rank only.
/// Device pointers, counts and displacements are bytes as for host buffers; the arrays of counts
/// and displacements are always host memory.
struct BufferSpace {
  gpu::Device* device = nullptr;  ///< nullptr: host memory; else the device whose memory the buffers are
  gpu::StreamView stream;         ///< device buffers: a stream of `device` ordering the collective
  bool on_device() const noexcept { return device != nullptr; }
  /// Host memory.
  static BufferSpace host() noexcept { return {}; }
  /// Device memory of `d`, ordered on `s` (a stream of `d`).
  static BufferSpace on(gpu::Device& d, gpu::StreamView s) noexcept { return {&d, s}; }
};

/// One rank of a world. Not thread-safe: one thread at a time calls a given communicator (the
/// ranks of a `local` world are called from different threads at once, one thread per rank);
/// counters() may be read from any thread.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  /// "local", "mpi", "nccl", or for `transport` its Transport's kind() (e.g. "torch").
  virtual const char* kind() const noexcept = 0;
  /// This rank's place among the ranks of its host, which picks its GPU (local_rank modulo the
  /// visible GPUs: a store's device ordinal "auto", the `nccl` communicator's device): `local`
  /// ranks are threads of one process, so its rank; `mpi` the launcher's local rank
  /// (launcher_local_rank(), dispatch/mpi_communicator.hpp), else the rank; `nccl` its bootstrap
  /// communicator's (from an id file: as `mpi`).
  virtual int local_rank() const noexcept = 0;
  /// The CUDA device this rank's collectives run on (`nccl`; `transport`: its Transport's
  /// device(), e.g. an NCCL process group's), -1 for communicators that are tied to no GPU (`local`,
  /// `mpi`, a `transport` whose Transport names none: they work in host memory and take device
  /// buffers of any device). A store in this rank's world opens that device (device ordinal "auto").
  virtual int device() const noexcept { return -1; }
  /// How long a collective waits for its peers (CommOptions::timeout; `transport`: its Transport's).
  virtual std::chrono::milliseconds timeout() const noexcept { return CommOptions{}.timeout; }

  /// All-to-all with variable sizes, in bytes: `send_counts[r]` bytes starting at
  /// `send + send_displs[r]` go to rank r and arrive there at `recv + recv_displs[me]` of rank r,
  /// which must expect exactly that many (`recv_counts[me]`), else an error naming both ranks.
  /// Each array has size() entries (host). `send` and `recv` are in `space`; bytes of `recv`
  /// outside the received ranges are left as they were.
  ///
  /// Not in place: no byte may be both sent and received. The send ranges (`send_counts[r]` bytes
  /// at `send + send_displs[r]`) must not overlap the receive ranges (`recv_counts[r]` bytes at
  /// `recv + recv_displs[r]`), else InvalidArgument on every rank (as any invalid argument, it
  /// breaks the communicator), for host and device buffers alike: peers may read this rank's send
  /// ranges while its receive ranges are written, and MPI_Alltoallv and NCCL's send/receive do not
  /// allow aliased buffers either. `send` and `recv` may be one buffer (even the same pointer) when
  /// the displacements keep the ranges apart. The one exception is this rank's own share in place:
  /// `send + send_displs[me] == recv + recv_displs[me]` is left as it is (no copy).
  /// Nor may two receive ranges overlap (the same InvalidArgument): two ranks' shares would land on
  /// the same bytes (MPI_Irecv into overlapping memory is erroneous, two ncclRecv race). Send
  /// ranges may overlap each other: the same bytes may go to several ranks (they are only read; MPI
  /// allows it too). Each `displs[r] + counts[r]` of a non-empty range must fit int64, and the
  /// range must end inside the address space; the send counts must add up to at most INT64_MAX
  /// (else InvalidArgument). In `local`, where the ranks are threads reading each other's buffers,
  /// the buffers of different ranks must not overlap either (not checked: a rank sees only its own
  /// arguments).
  Status all_to_all_v(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs, void* recv,
                      const std::int64_t* recv_counts, const std::int64_t* recv_displs, const BufferSpace& space = {}) {
    return do_all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, space);
  }
  /// Every rank contributes `bytes` (the same on every rank); `recv` receives size() * bytes in
  /// rank order. `send` and `recv` are in `space`.
  Status all_gather(const void* send, std::int64_t bytes, void* recv, const BufferSpace& space = {}) {
    return do_all_gather(send, bytes, recv, space);
  }
  /// In place element-wise reduction of `count` elements (the same count and type on every rank).
  /// `data` is host memory.
  virtual Status all_reduce(void* data, std::int64_t count, DataType type, ReduceOp op) = 0;
  /// Copies `bytes` from `root`'s `data` into every rank's `data` (in `space`).
  Status broadcast(void* data, std::int64_t bytes, int root, const BufferSpace& space = {}) {
    return do_broadcast(data, bytes, root, space);
  }
  virtual Status barrier() = 0;

  /// Frees whatever the communicator keeps for buffers of `device` (`mpi`: its pinned staging
  /// buffers, which belong to that device). Whoever destroys a device that was given to this
  /// communicator in a BufferSpace calls this first (the sharded engine does, in its destructor);
  /// later calls with that device allocate again. Not a collective; not while a call is in progress.
  virtual void forget_device(const gpu::Device& /*device*/) noexcept {}

  virtual CommCounters counters() const noexcept = 0;

  /// OK, or the first error that broke the communicator (every later call fails with it). May be
  /// read from any thread. Only `transport` reports it (the Python world refuses a load before any
  /// write with it); the others report OK.
  virtual Status broken() const { return Status::ok(); }

 private:
  virtual Status do_all_to_all_v(const void* send, const std::int64_t* send_counts, const std::int64_t* send_displs,
                                 void* recv, const std::int64_t* recv_counts, const std::int64_t* recv_displs,
                                 const BufferSpace& space) = 0;
  virtual Status do_all_gather(const void* send, std::int64_t bytes, void* recv, const BufferSpace& space) = 0;
  virtual Status do_broadcast(void* data, std::int64_t bytes, int root, const BufferSpace& space) = 0;
};

/// All-to-all of one int64 per peer: `send[r]` goes to rank r, `recv[r]` comes from rank r
/// (the usual exchange of counts before an all_to_all_v).
Status all_to_all_counts(Communicator& comm, const std::vector<std::int64_t>& send, std::vector<std::int64_t>& recv);

}  // namespace strata::dispatch
