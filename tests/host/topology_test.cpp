#include "host/topology.hpp"

#include <gtest/gtest.h>
#include <sched.h>

#include <thread>

#include "host/numa_arena.hpp"

namespace strata {

TEST(Topology, DiscoversRealMachine) {
  auto topo = Topology::discover();
  ASSERT_TRUE(topo.is_ok()) << topo.status().to_string();
  EXPECT_GE(topo->num_nodes(), 1);
  EXPECT_EQ(topo->num_cpus(), static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_FALSE(topo->is_fake());
  EXPECT_NE(topo->describe().find("NUMA node"), std::string::npos);
  // The thread's CPUs are put back after: under the sanitizers the cases of a shard share this
  // thread (tests/CMakeLists.txt).
  cpu_set_t cpus;
  ASSERT_EQ(::sched_getaffinity(0, sizeof cpus, &cpus), 0);
  EXPECT_TRUE(topo->bind_current_thread(0).is_ok());
  EXPECT_FALSE(topo->bind_current_thread(topo->num_nodes()).is_ok());
  EXPECT_EQ(::sched_setaffinity(0, sizeof cpus, &cpus), 0);
}

TEST(Topology, FakeSplitsCpusOverNodes) {
  Topology t = Topology::fake(4);
  EXPECT_EQ(t.num_nodes(), 4);
  EXPECT_TRUE(t.is_fake());
  EXPECT_EQ(t.num_cpus(), static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_TRUE(t.bind_current_thread(3).is_ok());
}

TEST(NumaArena, AllocatesZeroedAlignedMemoryOnEachNode) {
  auto real = Topology::discover();
  ASSERT_TRUE(real.is_ok());
  for (const Topology* t : {&real.value()}) {
    ArenaOptions o;
    o.node = 0;
    auto a = NumaArena::create(*t, (5u << 20) + 123, o);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a->data()) % (2u << 20), 0u);
    EXPECT_EQ(a->size(), (5u << 20) + 123);
    auto* p = static_cast<unsigned char*>(a->data());
    for (std::size_t i = 0; i < a->size(); i += 4096) ASSERT_EQ(p[i], 0);
    p[a->size() - 1] = 7;  // writable to the end
    NumaArena moved = std::move(a).value();
    EXPECT_EQ(moved.data(), p);
  }
  Topology fake = Topology::fake(3);
  ArenaOptions o;
  o.node = 2;
  auto a = NumaArena::create(fake, 1 << 20, o);
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->node(), 2);
  o.node = 3;
  EXPECT_EQ(NumaArena::create(fake, 1 << 20, o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(NumaArena::create(fake, 0, ArenaOptions{}).is_ok());
}

// A pinner that records what it saw, proving the arena registers and unregisters its memory.
struct CountingPinner final : Pinner {
  int pins = 0, unpins = 0;
  std::size_t bytes = 0;
  Status pin(void*, std::size_t len) override {
    ++pins;
    bytes = len;
    return Status::ok();
  }
  void unpin(void*, std::size_t) noexcept override { ++unpins; }
  const char* name() const noexcept override { return "counting"; }
};

TEST(NumaArena, PinsThroughThePinner) {
  CountingPinner pinner;
  {
    ArenaOptions o;
    o.pinner = &pinner;
    auto a = NumaArena::create(Topology::fake(1), 3 << 20, o);
    ASSERT_TRUE(a.is_ok());
    EXPECT_EQ(pinner.pins, 1);
    EXPECT_GE(pinner.bytes, 3u << 20);
    EXPECT_EQ(pinner.unpins, 0);
  }
  EXPECT_EQ(pinner.unpins, 1);
}

}  // namespace strata
