// A build without the mpi or nccl communicator (STRATA_MPI=OFF, STRATA_NCCL=OFF, or AUTO where they
// were not found): asking for one fails with FailedPrecondition naming the communicator and the
// option that leaves it out, and the local communicator still works. Skipped in builds that have them.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "dispatch/comm_factory.hpp"
#include "dispatch/local_communicator.hpp"
#include "dispatch/mpi_communicator.hpp"
#include "dispatch/nccl_communicator.hpp"

namespace strata::dispatch::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

void expect_not_built(const Status& s, const std::string& kind, const std::string& option) {
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
  EXPECT_THAT(s.message(), AllOf(HasSubstr(kind + " communicator: this build has no"), HasSubstr(option)));
}

TEST(NotBuilt, MpiSaysWhichOptionLeftItOut) {
  if (mpi_built()) GTEST_SKIP() << "this build has the mpi communicator";
  expect_not_built(make_communicators("mpi", 1).status(), "mpi", "STRATA_MPI");
  expect_not_built(make_mpi_communicator().status(), "mpi", "STRATA_MPI");
  int fake_comm = 0;
  expect_not_built(make_mpi_communicator_over(&fake_comm).status(), "mpi", "STRATA_MPI");
  expect_not_built(mpi_place().status(), "mpi", "STRATA_MPI");
  expect_not_built(ensure_mpi_initialized(), "mpi", "STRATA_MPI");
  // Arguments are still checked first, as in a build with MPI.
  EXPECT_EQ(make_communicators("mpi", 2).status().code(), StatusCode::kInvalidArgument);
  auto local = make_communicators("local", 2);
  ASSERT_TRUE(local.is_ok()) << local.status().to_string();
  EXPECT_EQ(local->size(), 2u);
}

TEST(NotBuilt, NcclSaysWhichOptionLeftItOut) {
  if (nccl_built()) GTEST_SKIP() << "this build has the nccl communicator";
  expect_not_built(make_communicators("nccl", 1).status(), "nccl", "STRATA_NCCL");
  expect_not_built(make_communicators("nccl", 2).status(), "nccl", "STRATA_NCCL");
  auto boot = make_local_group(1);
  ASSERT_TRUE(boot.is_ok()) << boot.status().to_string();
  expect_not_built(make_nccl_communicator(*boot.value()[0]).status(), "nccl", "STRATA_NCCL");
}

}  // namespace
}  // namespace strata::dispatch::testing
