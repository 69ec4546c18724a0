// Factories of the `mpi` communicator in builds without it (STRATA_MPI=OFF, or AUTO where no MPI
// was found): every one says so, naming the option.

#include "dispatch/mpi_communicator.hpp"

namespace strata::dispatch {
namespace {

Status not_built() {
  return Status::failed_precondition(
      "mpi communicator: this build has no MPI support (configured with STRATA_MPI=OFF, or STRATA_MPI=AUTO found no "
      "MPI: install one, e.g. Debian's libopenmpi-dev, and configure with STRATA_MPI=ON)");
}

}  // namespace

bool mpi_built() noexcept { return false; }

Status ensure_mpi_initialized() { return not_built(); }

Result<MpiPlace> mpi_place() { return not_built(); }

Result<std::unique_ptr<Communicator>> make_mpi_communicator(const CommOptions&) { return not_built(); }

Result<std::unique_ptr<Communicator>> make_mpi_communicator_over(const void*, const CommOptions&) {
  return not_built();
}

}  // namespace strata::dispatch
