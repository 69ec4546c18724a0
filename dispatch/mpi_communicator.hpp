#pragma once
// The `mpi` communicator: one rank per process over MPI (OpenMPI on Debian), within a host or
// across hosts. <mpi.h> stays out of this header: a program that only picks a communicator by
// name needs neither the MPI headers nor MPI's compiler wrappers.
//
// Every collective first exchanges a small header with every peer (point to point, non-blocking,
// tagged with the call's sequence number) so that all ranks judge the same calls the same way;
// only then does data move. Requests are polled until the timeout, so a rank that does not arrive
// yields kUnavailable naming it instead of a hang. A rank that fails that way tells its peers
// (a message on a control tag), so they fail at once instead of at their own timeout.
//
// Data is sent from a copy owned by the communicator: after a timeout, a send that no peer will
// ever receive may stay pending inside MPI, and it must not point into a buffer the caller frees.
// Receives go straight into the caller's buffers and are cancelled on failure.
//
// Device buffers (BufferSpace on a device) are staged through pinned host memory that the
// communicator allocates from that device and keeps, one stage per device (each grown to twice
// the largest call with its device, so the steady state allocates nothing, also when the stores
// of several devices share the communicator and take turns; Communicator::forget_device frees
// that device's stage only): one D2H of what leaves this rank before the exchange, then this
// rank's own share device to device and one H2D of what arrived. CUDA-aware MPI
// (MPIX_Query_cuda_support) is not used: staging works with every MPI and with the emulated
// device, whose memory no MPI could read, and keeps one code path under test.

#include <memory>

#include "core/status.hpp"
#include "dispatch/communicator.hpp"

namespace strata::dispatch {

/// Whether this build contains the mpi communicator (STRATA_MPI, and an MPI was found). Without
/// it every function below except launched_by_mpi() returns FailedPrecondition saying so.
bool mpi_built() noexcept;

/// Initializes MPI unless the program already did: MPI_Init_thread asking for
/// MPI_THREAD_MULTIPLE (several communicators of one process, say an `mpi` one and the bootstrap
/// of an `nccl` one, may be used from different threads), and MPI_Finalize at exit, for that case
/// only. Idempotent and thread-safe. FailedPrecondition once MPI was finalized.
Status ensure_mpi_initialized();

/// Whether this process was started by an MPI launcher (mpirun, srun with PMI): looks at the
/// launcher's environment only; does not initialize MPI.
bool launched_by_mpi() noexcept;

/// This process's rank among the processes of its host as the launcher says
/// (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or SLURM_LOCALID), or -1 when none says it. Every
/// build; does not initialize MPI.
int launcher_local_rank() noexcept;

/// This process's place in MPI_COMM_WORLD (initializes MPI when needed).
struct MpiPlace {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  ///< rank among the processes of this host (the launcher's, else `rank`)
};
Result<MpiPlace> mpi_place();

/// This process's rank of a world made of MPI_COMM_WORLD (initializes MPI when needed).
/// Collective: every process of the world calls it; it duplicates MPI_COMM_WORLD (so its messages
/// never meet the program's own) and waits for that with the timeout: kUnavailable when some
/// process does not arrive. Not thread-safe against other MPI calls on MPI_COMM_WORLD.
Result<std::unique_ptr<Communicator>> make_mpi_communicator(const CommOptions& options = {});

/// The same over a duplicate of `*mpi_comm`, which must point to an `MPI_Comm` (type-erased to
/// keep <mpi.h> out of this header: `make_mpi_communicator_over(&comm)`). MPI must be initialized.
Result<std::unique_ptr<Communicator>> make_mpi_communicator_over(const void* mpi_comm, const CommOptions& options = {});

}  // namespace strata::dispatch
