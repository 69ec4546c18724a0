#include "dispatch/comm_factory.hpp"

#include <thread>
#include <utility>

#include "dispatch/local_communicator.hpp"
#include "dispatch/mpi_communicator.hpp"
#include "dispatch/nccl_communicator.hpp"

namespace strata::dispatch {
namespace {

using Comms = std::vector<std::unique_ptr<Communicator>>;

Result<Comms> one(Result<std::unique_ptr<Communicator>> c) {
  if (!c.is_ok()) return c.status();
  Comms out;
  out.push_back(std::move(c).value());
  return out;
}

// N NCCL ranks as threads of this process: the NCCL id travels over a local group, and every rank
// must create its communicator at the same time (NCCL's initialization is collective).
Result<Comms> nccl_threads(int n, const CommOptions& options) {
  STRATA_ASSIGN_OR_RETURN(Comms bootstrap, make_local_group(n, options));
  Comms out(n);
  std::vector<Status> errors(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      NcclOptions o;
      o.comm = options;
      o.device = r;
      auto made = make_nccl_communicator(*bootstrap[r], o);
      if (made.is_ok()) {
        out[r] = std::move(made).value();
      } else {
        errors[r] = made.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!errors[r].is_ok()) return errors[r].with_context("rank " + std::to_string(r));
  }
  return out;
}

}  // namespace

const char* communicator_kinds() noexcept { return "local, mpi, nccl"; }

Result<Comms> make_communicators(const std::string& kind, int local_ranks, const CommOptions& options) {
  if (local_ranks < 1) {
    return Status::invalid_argument("communicator '" + kind + "': local_ranks " + std::to_string(local_ranks) +
                                    " must be at least 1");
  }
  if (kind == "local") return make_local_group(local_ranks, options);
  if (kind == "mpi") {
    if (local_ranks != 1) {
      return Status::invalid_argument("communicator 'mpi' runs one rank per process, not " +
                                      std::to_string(local_ranks) + ": start the ranks as processes (mpirun -np N)");
    }
    return one(make_mpi_communicator(options));
  }
  if (kind == "nccl") {
    if (!nccl_built()) return one(make_nccl_communicator_from_file("", 0, 1));  // its "not built" error
    if (local_ranks > 1) {
      if (launched_by_mpi()) {
        return Status::invalid_argument("communicator 'nccl' under an MPI launcher runs one rank per process, not " +
                                        std::to_string(local_ranks));
      }
      return nccl_threads(local_ranks, options);
    }
    STRATA_ASSIGN_OR_RETURN(auto bootstrap, make_mpi_communicator(options));
    NcclOptions o;
    o.comm = options;
    return one(make_nccl_communicator(*bootstrap, o));
  }
  return Status::invalid_argument("unknown communicator kind '" + kind + "' (expected one of: " + communicator_kinds() +
                                  ")");
}

}  // namespace strata::dispatch
