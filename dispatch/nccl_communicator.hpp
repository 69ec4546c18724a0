#pragma once
// The `nccl` communicator: one rank per GPU over NCCL. Compiled for real only when the CUDA
// backend is built and NCCL was found (STRATA_NCCL, see dispatch/CMakeLists.txt); otherwise the
// factories return FailedPrecondition. No CUDA or NCCL header here.
//
// Device buffers (BufferSpace on a CUDA Device of this communicator's GPU) go to NCCL as they
// are: the call waits for the caller's stream, issues the collective on the communicator's
// stream straight from and into the caller's buffers, and polls it to completion (no staging, no
// host copy). Host buffers are staged through device buffers that the communicator owns on its own non-blocking CUDA
// stream (grown stream-ordered to twice the largest call: no growth synchronizes the device, and calls no larger than
// before allocate nothing; on a device without memory pools growth uses cudaMalloc/cudaFree, which do synchronize it);
// the host copies wait for the collective, so every call is synchronous like the other implementations. Before the
// data, the ranks all-gather a fixed-size header (kind and sizes, all_to_all_v's counts) so that a mismatch is reported
// by every rank instead of corrupting data or hanging inside NCCL. The NCCL communicator is non-blocking
// (ncclConfig_t::blocking = 0) and every wait polls until the timeout; on timeout it is aborted (ncclCommAbort) and the
// call returns kUnavailable. Any failure of a call (a timeout, an NCCL or CUDA error, arguments the ranks disagree on)
// breaks the communicator and aborts it at once (ncclCommAbort), so that no NCCL kernel is left spinning on the GPU
// for the next cudaFree to wait on; except a device that failed before the call (its sticky error, found by the
// readiness check and carried in the header), which fails the call on every rank and breaks nothing, as in `local`
// and `mpi`, as long as the rank's CUDA context still works. A fault that poisons the context (cudaErrorIllegalAddress
// and the like) fails the rank's header copy before the all-gather: that rank breaks and aborts, and its peers time
// out after CommOptions::timeout with kUnavailable and break. Unlike `local` and `mpi`, NCCL cannot say which ranks did
// not arrive, so a timeout's message names none.

#include <memory>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "dispatch/communicator.hpp"

namespace strata::dispatch {

/// Whether this build contains the nccl communicator (CUDA backend and NCCL found).
bool nccl_built() noexcept;

struct NcclOptions {
  CommOptions comm;  ///< timeout of the bootstrap and of every collective
  /// CUDA device of this rank; -1: its local rank (make_nccl_communicator: the bootstrap's
  /// local_rank(); from a file: the launcher's local rank, else the rank) modulo the number of
  /// visible GPUs (detail::nccl_device_for_rank). Either way the ranks then compare where they
  /// landed (host and GPU UUID) and refuse a world with two ranks on one GPU.
  int device = -1;
};

namespace detail {
/// How a rank of an NCCL world picks its GPU among the `gpus` visible (the factories below apply it;
/// no CUDA here): `wanted` >= 0 is that GPU (InvalidArgument when it is not one of them); else
/// `local_rank % gpus` (a process that sees one GPU, CUDA_VISIBLE_DEVICES=$LOCAL_RANK, takes it,
/// whatever its local rank; a rank without a launcher's local rank uses its global rank). Whether
/// two ranks then share a GPU only all ranks together can tell: nccl_one_rank_per_gpu.
/// No GPU visible: Unavailable.
Result<int> nccl_device_for_rank(int local_rank, int gpus, int wanted);

/// Where one rank of an NCCL world runs: its host's identity (the kernel's boot id, else the host
/// name), the UUID of its GPU, and that GPU's CUDA ordinal in the rank's process.
struct NcclPlacement {
  std::string host;
  std::string gpu;
  int device = -1;
};

/// OK when no two of `ranks` (indexed by rank) share a host and a GPU UUID; else FailedPrecondition
/// naming the first two that do, the GPU and the host: NCCL runs one rank per GPU. Every rank
/// decides this from the same all-gathered list, so every rank refuses together.
Status nccl_one_rank_per_gpu(const std::vector<NcclPlacement>& ranks);
}  // namespace detail

/// This rank of an NCCL world with the ranks of `bootstrap` (rank bootstrap.rank() of
/// bootstrap.size()): rank 0 makes the ncclUniqueId and broadcasts it over `bootstrap`, which may
/// be any communicator (`mpi` for one process per GPU, `local` for threads driving different GPUs
/// of one process). Collective over `bootstrap`, which is not kept. FailedPrecondition when built
/// without CUDA or NCCL; Unavailable when no GPU is visible or a rank does not join in time. Every
/// rank picks its GPU first and the ranks all-gather where they are (host, GPU UUID) over `bootstrap`:
/// when one cannot pick a GPU (none, or NcclOptions::device out of range), that rank returns why and
/// every other rank a FailedPrecondition naming it; when two ranks landed on one GPU, every rank
/// returns the FailedPrecondition of detail::nccl_one_rank_per_gpu; either way before any rank
/// starts NCCL.
Result<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator& bootstrap, const NcclOptions& options = {});

/// The same bootstrapped through a file: rank 0 writes the id to `id_path` atomically (a
/// temporary file, fsync, rename) and the other ranks poll for it until the timeout. The path
/// must be fresh for each world (a file left by an earlier run would be read as this run's id):
/// put a job id in it. `id_path` must be visible to every rank (a shared file system across hosts).
/// With no bootstrap before NCCL, the ranks compare their GPUs (host, UUID) over the new NCCL
/// communicator itself, right after its initialization, and every rank refuses two ranks on one GPU
/// as above (NCCL's own initialization may refuse such a world first: its "Duplicate GPU" error).
Result<std::unique_ptr<Communicator>> make_nccl_communicator_from_file(const std::string& id_path, int rank, int size,
                                                                       const NcclOptions& options = {});

}  // namespace strata::dispatch
