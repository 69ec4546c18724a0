#pragma once
// Communicators by kind name, for programs and configs that choose the transport at run time
// (strata-bench --comm local|mpi|nccl, a Store config).

#include <memory>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "dispatch/communicator.hpp"

namespace strata::dispatch {

/// The kinds make_communicators() knows, for help texts: "local, mpi, nccl".
const char* communicator_kinds() noexcept;

/// The ranks this process runs, element i being the i-th (each to be used by its own thread):
///   "local": `local_ranks` ranks as threads of this process (the whole world; element r is rank r);
///   "mpi":   this process's rank of MPI_COMM_WORLD (one element; `local_ranks` must be 1;
///            start N processes with mpirun -np N); collective over the MPI world;
///   "nccl":  one GPU per rank: with `local_ranks` == 1, this process's rank of an NCCL world over
///            MPI_COMM_WORLD (bootstrapped through MPI); with `local_ranks` > 1 and no MPI launcher,
///            `local_ranks` ranks as threads of this process, one GPU each.
/// InvalidArgument for an unknown kind (naming the known ones) or a rank count the kind cannot
/// have; the factories' errors otherwise (FailedPrecondition for nccl in a build without CUDA).
Result<std::vector<std::unique_ptr<Communicator>>> make_communicators(const std::string& kind, int local_ranks,
                                                                      const CommOptions& options = {});

}  // namespace strata::dispatch
