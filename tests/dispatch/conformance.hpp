#pragma once
// The communicator conformance suite: one set of tests (conformance_test.cpp) run against every
// implementation. A World makes a fresh communicator world and runs a test body on each of its
// ranks: N threads of this process for `local`, this process's rank under mpirun for `mpi`, one
// GPU for `nccl`. Each test binary instantiates the suite with its worlds:
//   INSTANTIATE_TEST_SUITE_P(Local, Conformance, ::testing::Values(...), world_name);

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <utility>

#include "dispatch/communicator.hpp"

namespace strata::dispatch::testing {

/// What a test body gets on each rank.
struct RankEnv {
  Communicator& comm;
  /// Meets every rank of the world outside the communicator under test (test control only, e.g.
  /// "every rank has seen the timeout" before checking that the group stays broken). Fails the
  /// test (or, under MPI, aborts the job) instead of hanging when a rank never comes.
  std::function<void()> sync;
  /// A directory every rank of the world can read and write (removed after the run).
  std::string shared_dir;
};

class World {
 public:
  virtual ~World() = default;
  /// Test name suffix ("local4", "mpi").
  virtual std::string name() const = 0;
  /// What Communicator::kind() must say.
  virtual std::string kind() const = 0;
  virtual int size() const = 0;
  /// Why this world cannot run here ("" when it can): no GPU, ...
  virtual std::string skip_reason() const { return ""; }
  /// Makes a fresh world with `options` and runs `body` on each rank this process hosts; returns
  /// when they are done (and every rank of the world got there).
  virtual void run(const CommOptions& options, const std::function<void(RankEnv&)>& body) = 0;
};

/// The suite's parameter: a World, printed by name in test output.
struct WorldPtr {
  std::shared_ptr<World> world;
  World* operator->() const noexcept { return world.get(); }
  World& operator*() const noexcept { return *world; }
  friend void PrintTo(const WorldPtr& w, std::ostream* os) { *os << w->name(); }
};

template <class W, class... Args>
WorldPtr make_world(Args&&... args) {
  return WorldPtr{std::make_shared<W>(std::forward<Args>(args)...)};
}

inline std::string world_name(const ::testing::TestParamInfo<WorldPtr>& info) { return info.param->name(); }

class Conformance : public ::testing::TestWithParam<WorldPtr> {
 protected:
  void SetUp() override {
    const std::string why = GetParam()->skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  World& world() const { return *GetParam(); }
  int n() const { return GetParam()->size(); }
};

}  // namespace strata::dispatch::testing
