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

}  // namespace strata::dispatch
