// The sharded-store equivalence (sharded_harness.hpp) with real processes: run under
// `mpirun -np N`, one rank per process over the `mpi` communicator. Every rank runs every case and
// the ranks agree on the outcome; exit status 0 only when every case passed on every rank.

#include <cstdio>

#include "dispatch/mpi_communicator.hpp"
#include "tests/store/sharded_harness.hpp"

int main() {
  using namespace strata;
  dispatch::CommOptions o;
  o.timeout = std::chrono::milliseconds(60000);
  auto made = dispatch::make_mpi_communicator(o);
  if (!made) {
    std::fprintf(stderr, "sharded_mpi_test: %s\n", made.status().to_string().c_str());
    return 1;
  }
  std::shared_ptr<dispatch::Communicator> comm(std::move(made).value());
  int cases = 0, failed = 0;
  std::uint64_t seed = 5000;
  for (int type = -1; type < 4; ++type)
    for (int placement : {static_cast<int>(Placement::kGpu), static_cast<int>(Placement::kHybrid), -1})
      for (int repeat = 0; repeat < 2; ++repeat) {
        strata::testing::ShardCase c;
        c.world = comm->size();
        c.type = type;
        c.placement = placement;
        c.seed = seed++;
        c.steps = 6;
        const std::string err = strata::testing::run_sharded_rank(c, comm);
        if (!err.empty()) std::fprintf(stderr, "%s:\n%s", strata::testing::case_name(c).c_str(), err.c_str());
        std::int32_t bad = err.empty() ? 0 : 1;
        const Status s = comm->all_reduce(&bad, 1, dispatch::DataType::kInt32, dispatch::ReduceOp::kSum);
        if (!s.is_ok()) {
          std::fprintf(stderr, "rank %d: %s\n", comm->rank(), s.to_string().c_str());
          return 1;
        }
        ++cases;
        failed += bad > 0;
      }
  if (comm->rank() == 0)
    std::printf("sharded stores over %d processes: %d cases, %d failed\n", comm->size(), cases, failed);
  return failed ? 1 : 0;
}
