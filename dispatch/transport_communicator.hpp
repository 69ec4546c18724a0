#pragma once
// The `transport` communicator: the whole Communicator contract (communicator.hpp) over a Transport,
// a plain byte mover that somebody else implements: the Python binding over a torch.distributed
// ProcessGroup (gloo, NCCL), or a C++ program over whatever it has. The Transport judges nothing;
// the communicator does everything the other communicators promise:
//   - it judges each rank's own arguments (detail::check_*_arguments, the BufferSpace);
//   - it all-gathers one fixed-size header per call (magic "STRATAW1", the call's number, kind,
//     sizes, the all_to_all_v count arrays, this rank's argument or device error), so every rank
//     reaches the same verdict (detail::check_agreement) before any data moves: other collectives,
//     disagreeing sizes or invalid arguments on any rank fail the call on every rank, and break the
//     communicator; a device that failed before a device collective fails the call on every rank
//     and leaves it usable. A header without the magic (one of the trainer's own collectives on the
//     same process group met one of Strata's) or of another call number (ranks out of step) breaks
//     it with FailedPrecondition naming the ranks;
//   - it moves the data (below) and counts it as every communicator does (CommCounters);
//   - after the first error that breaks it, every call returns that error (detail::broken_status)
//     without calling the Transport.
//
// Data: host buffers pass only through memory the Transport owns (host_stage()): the communicator
// copies the caller's bytes in and the received bytes out after the Transport returned OK, so a
// failed call writes nothing into the caller's buffers, and an operation the Transport abandoned
// (at a timeout) can never touch them later. This rank's own share of an all_to_all_v or
// all_gather never goes to the Transport. all_reduce is an all_gather followed by a reduction in
// rank order on every rank (the same bits as `local` and `mpi`); barrier is the header alone. An
// operation that moves no byte on any rank (all_gather of 0 bytes, an all_to_all_v whose every
// count between two different ranks is 0, ...) is not given to the Transport.
// Device buffers: when the Transport takes_device() the space, the caller's device pointers go to
// the Transport directly for all_gather and broadcast, and for all_to_all_v when the displacements
// are the prefix sums of the counts (packed in rank order from 0, as dispatch::exchange() lays
// them out; the own share then goes too); otherwise they are staged through pinned host memory
// the communicator owns per device (as `mpi`: D2H, the host path, H2D). Every rank must take the
// same path for a call (the same takes_device() answer, packed displacements on all or none): each
// header says which it took, and a mix is refused on every rank (InvalidArgument) and breaks the world.

#include <chrono>
#include <cstdint>
#include <memory>

#include "core/status.hpp"
#include "dispatch/communicator.hpp"

namespace strata::dispatch {

/// Host memory that a Transport owns, for one operation: `send` holds at least the send bytes and
/// `recv` at least the receive bytes asked of host_stage() (either may be null when 0 were
/// asked). The two must not overlap.
struct HostStage {
  void* send = nullptr;
  void* recv = nullptr;
};

/// An operation's device buffers, passed to the Transport only for a space it takes_device():
/// the caller's own device pointers (bytes as in the operation), ordered on `space.stream`, whose
/// earlier work the communicator already waited for on the host.
struct DeviceBuffers {
  const void* send = nullptr;
  void* recv = nullptr;
  BufferSpace space;
};

/// Moves bytes between the ranks of one world and judges nothing. The contract, for every
/// implementation (the Python one drives a torch.distributed ProcessGroup):
///
/// Threads: one TransportCommunicator calls its Transport, from whichever thread calls the
/// communicator (one thread at a time: the Strata store's driving thread, the thread of the
/// Python call), never from two threads at once, and only between the communicator's creation
/// and its destruction. The Transport may block (it is the collective) but must not call back
/// into the communicator.
///
/// Operations: every rank calls the same operations in the same order with the same sizes (the
/// communicator makes sure of it: it all-gathers a header first, and gives the Transport only
/// operations on which every rank agreed). Each call is synchronous: when it returns OK the
/// received bytes are in place and the send bytes were read; the Transport keeps no reference to
/// the memory of an operation that returned OK.
///   Host operations (`dev` null) work in the memory of the last host_stage() call: they read
///   `stage.send` and write `stage.recv`, from their beginning, and touch nothing else.
///   Device operations (`dev` not null; only for spaces takes_device() accepted) read `dev->send`
///   and write `dev->recv` on the device, and return when the received bytes are in place on the
///   device (work the Transport queued must have completed, or be ordered before later work on
///   `dev->space.stream`, e.g. by synchronizing its own stream: the communicator treats them as
///   complete for the host).
///
/// Errors: a non-OK Status means the operation did not complete on this rank; its message says
/// why without the collective's name (the communicator prefixes it: "all_to_all_v: <message>").
/// kUnavailable for a timeout ("timed out after 500 ms; rank 2 of 3 did not arrive", naming the
/// ranks when the transport knows them) or a peer that left ("a peer left the process group ...");
/// kInternal (or another code) for anything else, an interrupted caller included (Python: the
/// binding keeps the KeyboardInterrupt or SystemExit and raises it again when the Strata call
/// returns; the Status only says "interrupted"). Any error breaks the communicator (the ranks may no longer
/// be in step), so the Transport is never called again by it; memory the failed operation may
/// still write later (an abandoned operation) must stay the Transport's, never the caller's (host
/// operations only ever see the Transport's own stage). The Transport enforces its own timeout:
/// no call may block forever when a peer never arrives.
class Transport {
 public:
  virtual ~Transport() = default;
  /// This rank in [0, size()), and the world's size (>= 1): fixed for the Transport's life.
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  /// Communicator::local_rank() (the rank among the ranks of this host; picks the GPU).
  virtual int local_rank() const noexcept = 0;
  /// Communicator::device(): the CUDA ordinal this rank's collectives run on, -1 when none.
  virtual int device() const noexcept { return -1; }
  /// Communicator::timeout(): how long its operations wait for a peer (the default: CommOptions').
  virtual std::chrono::milliseconds timeout() const noexcept { return CommOptions{}.timeout; }
  /// Communicator::kind() of the communicator over it ("torch").
  virtual const char* kind() const noexcept = 0;
  /// Whether the device operations may be given device buffers of `space` (a device space)
  /// directly; false (the default): the communicator stages them through host memory.
  virtual bool takes_device(const BufferSpace& /*space*/) const noexcept { return false; }

  /// Memory for the next host operation: `send_bytes` and `recv_bytes` (>= 0) at least. Valid
  /// until the next host_stage() call or the Transport's destruction; the communicator calls it
  /// before each host operation (also to read a received header), writes `send` before and reads
  /// `recv` after the operation. Not a collective: ranks may ask for different sizes. An error
  /// (ResourceExhausted, ...) breaks the communicator like an operation's; one for a payload (after
  /// the header went out) leaves this rank's peers in the Transport's operation until their timeout
  /// (kUnavailable naming this rank): give memory that cannot fail late, e.g. grown ahead.
  virtual Result<HostStage> host_stage(std::int64_t send_bytes, std::int64_t recv_bytes) = 0;

  /// Every rank contributes `bytes` (> 0, the same on every rank): host, the first `bytes` of
  /// stage.send; the size() * bytes received go to stage.recv (or dev->recv) in rank order, this
  /// rank's own block included.
  virtual Status all_gather(std::int64_t bytes, const DeviceBuffers* dev) = 0;
  /// `send_splits[r]` bytes go to rank r and `recv_splits[r]` come from rank r (size() entries
  /// each, host memory, >= 0; every rank's send_splits[p] equals rank p's recv_splits[me]). Host:
  /// the parts are packed in rank order from the start of stage.send and of stage.recv; this
  /// rank's own split is 0. Device: packed the same way in dev->send and dev->recv, the own share
  /// included (it may be non-zero).
  virtual Status all_to_all(const std::int64_t* send_splits, const std::int64_t* recv_splits,
                            const DeviceBuffers* dev) = 0;
  /// `bytes` (> 0) from rank `root` to every rank. Host: the root reads them from stage.send, every
  /// other rank writes them to stage.recv (the root's stage.recv and the others' stage.send are
  /// empty). Device: in place, dev->send == dev->recv on every rank.
  virtual Status broadcast(std::int64_t bytes, int root, const DeviceBuffers* dev) = 0;
};

/// A communicator of `transport`'s world (rank(), size(), kind() are the Transport's). Collective:
/// every rank makes one, in the same order relative to the other operations on the transport's
/// world; it moves no byte itself. InvalidArgument when `transport` is null or its rank and size
/// are not a valid world (0 <= rank < size). The communicator owns the Transport and destroys it
/// with itself.
Result<std::unique_ptr<Communicator>> make_transport_communicator(std::unique_ptr<Transport> transport);

}  // namespace strata::dispatch
