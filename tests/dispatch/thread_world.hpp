#pragma once
// Worlds whose ranks are threads of the test process (the `local` and `transport` conformance
// worlds): a barrier for the test threads themselves, and one thread per rank running a test body.

#include <gtest/gtest.h>
#include <stdlib.h>  // mkdtemp

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dispatch/communicator.hpp"
#include "tests/dispatch/conformance.hpp"

namespace strata::dispatch::testing {

/// A barrier for the test threads themselves (not under test). Fails the test instead of hanging.
class ThreadSync {
 public:
  explicit ThreadSync(int n) : n_(n) {}
  void arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    const std::uint64_t gen = generation_;
    if (++count_ == n_) {
      count_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return generation_ != gen; })) {
      ADD_FAILURE() << "test sync: not every rank arrived within 60 s";
    }
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int count_ = 0;
  std::uint64_t generation_ = 0;
};

/// Runs `body` on one thread per communicator (rank r on comms[r]), each with a ThreadSync of them
/// all and a fresh directory /tmp/strata-<name>-XXXXXX (removed after); returns when all returned.
inline void run_thread_world(const std::vector<std::unique_ptr<Communicator>>& comms, const std::string& name,
                             const std::function<void(RankEnv&)>& body) {
  std::string dir = "/tmp/strata-" + name + "-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  ThreadSync sync(static_cast<int>(comms.size()));
  std::vector<std::thread> threads;
  for (const auto& comm : comms) {
    threads.emplace_back([&, c = comm.get()] {
      RankEnv env{*c, [&] { sync.arrive(); }, dir};
      body(env);
    });
  }
  for (auto& t : threads) t.join();
  std::filesystem::remove_all(dir);
}

}  // namespace strata::dispatch::testing
