// launched_by_mpi() (see mpi_communicator.hpp): the launcher's environment only, so it is part of
// every build, with or without the mpi communicator (a build without MPI started by mpirun can then
// say that it cannot join the job instead of running as N separate worlds of one).

#include <cstdlib>

#include "dispatch/mpi_communicator.hpp"

namespace strata::dispatch {

bool launched_by_mpi() noexcept {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    if (std::getenv(v)) return true;
  }
  return false;
}

int launcher_local_rank() noexcept {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    if (const char* s = std::getenv(v)) {
      char* end = nullptr;
      const long r = std::strtol(s, &end, 10);
      if (end != s && *end == '\0' && r >= 0 && r <= 1 << 30) return static_cast<int>(r);
    }
  }
  return -1;
}

}  // namespace strata::dispatch
