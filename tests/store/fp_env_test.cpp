// The store computes with the default floating-point environment whatever its caller set
// (host/fp_env.hpp): a caller running with flush-to-zero and denormals-are-zero (as a trainer
// with torch.set_flush_denormal(True) does), or rounding upward, gets the same bits as one with
// the default environment, from every placement mode, and gets its own environment back.
#include <gtest/gtest.h>

#include <cfenv>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "tests/store/store_test_util.hpp"

namespace strata {
namespace {

using namespace strata::testing;

// A non-default FP environment of the calling thread, set while alive.
struct CallerFpEnv {
  const char* name;
  std::function<void()> set;
};

void PrintTo(const CallerFpEnv& e, std::ostream* os) { *os << e.name; }

#if defined(__x86_64__) || defined(__i386__)
constexpr unsigned kFtzDaz = 0x8040;  // MXCSR flush-to-zero (bit 15) and denormals-are-zero (bit 6)
unsigned control_bits() { return _mm_getcsr() & ~0x3fu; }  // without the exception flags
#endif

// Tables of every placement that runs without a world; weights of 0..49 x 1e-40 (denormals), and
// gradients so small that a learning rate times them is a denormal too.
StoreConfig denormal_config() {
  StoreConfig c;
  c.threads = 2;
  c.device.backend = BackendChoice::kEmu;
  const Placement placements[] = {Placement::kCpu, Placement::kOffload, Placement::kCached, Placement::kGpu};
  const Pooling poolings[] = {Pooling::kSum, Pooling::kMean, Pooling::kNone, Pooling::kSum};
  const OptimizerKind optimizers[] = {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad,
                                      OptimizerKind::kAdam};
  for (int t = 0; t < 4; ++t) {
    TableConfig tc;
    tc.spec.name = "t" + std::to_string(t);
    tc.spec.rows = 128;
    tc.spec.dim = t == 0 ? 16 : 8;
    tc.spec.pooling = poolings[t];
    tc.spec.optimizer.kind = optimizers[t];
    tc.spec.optimizer.learning_rate = 0.25f;
    tc.spec.optimizer.initial_accumulator = 1e-30f;
    tc.placement = placements[t];
    if (tc.placement == Placement::kCached) tc.cache.rows = 96;
    c.tables.push_back(tc);
  }
  return c;
}

std::vector<std::uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// The workload's inputs, made once under the default environment (under the caller's, the test's
// own arithmetic would flush these denormals before the store saw them).
struct Inputs {
  std::vector<std::vector<float>> weights;  // per table
  std::vector<KeyBatch> batches;
  std::vector<Buffers> grads;  // per batch
};

Inputs make_inputs(const StoreConfig& c) {
  Inputs in;
  std::mt19937_64 rng(11);
  for (const auto& t : c.tables) {
    in.weights.emplace_back(static_cast<std::size_t>(t.spec.rows * t.spec.dim));
    for (auto& x : in.weights.back()) x = static_cast<float>(static_cast<int>(rng() % 100) - 50) * 1e-40f;
  }
  for (int step = 0; step < 3; ++step) {
    in.batches.push_back(random_batch(rng, c, 16));
    in.grads.push_back(make_buffers(c, in.batches.back()));
    for (auto& d : in.grads.back().data)
      for (auto& x : d) x = static_cast<float>(static_cast<int>(rng() % 200) - 100) * 1e-39f;
  }
  return in;
}

// Every output of every step and the final weights and state, as bits.
struct Outcome {
  std::vector<std::vector<std::uint32_t>> outputs;
  std::vector<std::vector<std::uint32_t>> weights, state;
};

// Runs the workload; `env` (when set) is put in place before the store opens (open_under_env) or
// right after, and every call must leave it as it was.
Outcome run_workload(const StoreConfig& c, const Inputs& in, const CallerFpEnv* env, bool open_under_env) {
  Outcome r;
  std::fenv_t saved;
  std::fegetenv(&saved);
#if defined(__x86_64__) || defined(__i386__)
  const unsigned saved_csr = _mm_getcsr();
#endif
  if (env && open_under_env) env->set();
#if defined(__x86_64__) || defined(__i386__)
  const unsigned before_open = control_bits();
#endif
  auto opened = Store::open(c);
  EXPECT_TRUE(opened.is_ok()) << opened.status().to_string();
#if defined(__x86_64__) || defined(__i386__)
  EXPECT_EQ(control_bits(), before_open) << "Store::open changed the caller's MXCSR";
#endif
  if (opened.is_ok()) {
    Store& s = **opened;
    if (env && !open_under_env) env->set();
#if defined(__x86_64__) || defined(__i386__)
    const unsigned caller_bits = control_bits();
    const auto caller_kept = [&](const char* call) {
      EXPECT_EQ(control_bits(), caller_bits) << call << " changed the caller's MXCSR";
    };
#else
    const auto caller_kept = [](const char*) {};
#endif
    for (std::size_t t = 0; t < c.tables.size(); ++t) {
      EXPECT_TRUE(s.write_rows(static_cast<int>(t), 0, c.tables[t].spec.rows, in.weights[t].data(), nullptr).is_ok());
      caller_kept("write_rows");
    }
    for (std::size_t step = 0; step < in.batches.size(); ++step) {
      const auto id = static_cast<std::int64_t>(step);
      Buffers out = make_buffers(c, in.batches[step]);
      const Status sub = s.submit(id, in.batches[step]);
      EXPECT_TRUE(sub.is_ok()) << sub.to_string();
      caller_kept("submit");
      const Status f = s.forward(id, out.views);
      EXPECT_TRUE(f.is_ok()) << f.to_string();
      caller_kept("forward");
      const Status b = s.backward(id, in.grads[step].cviews);
      EXPECT_TRUE(b.is_ok()) << b.to_string();
      caller_kept("backward");
      for (const auto& d : out.data) r.outputs.push_back(bits_of(d));
    }
    const Snapshot snap = snapshot(s);
    caller_kept("read_rows");
    for (const auto& w : snap.weights) r.weights.push_back(bits_of(w));
    for (const auto& st : snap.state) r.state.push_back(bits_of(st));
    opened.value().reset();
  }
  std::fesetenv(&saved);
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr(saved_csr);
#endif
  return r;
}

// Outputs that are denormals (from the bits: no FP arithmetic involved).
std::int64_t subnormals(const Outcome& o) {
  std::int64_t n = 0;
  for (const auto& v : o.outputs)
    for (std::uint32_t b : v) n += (b & 0x7f800000u) == 0 && (b & 0x007fffffu) != 0;
  return n;
}

class StoreFpEnv : public ::testing::TestWithParam<CallerFpEnv> {};

TEST_P(StoreFpEnv, ResultsAreTheBitsOfTheDefaultEnvironment) {
  const StoreConfig c = denormal_config();
  const Inputs in = make_inputs(c);
  const Outcome expect = run_workload(c, in, nullptr, false);
  ASSERT_GT(subnormals(expect), 0) << "the workload must produce denormal outputs to test anything";
  for (bool open_under_env : {true, false}) {
    SCOPED_TRACE(open_under_env ? "store opened under the caller's environment" : "store opened before it was set");
    const Outcome got = run_workload(c, in, &GetParam(), open_under_env);
    ASSERT_EQ(got.outputs.size(), expect.outputs.size());
    for (std::size_t i = 0; i < expect.outputs.size(); ++i)
      EXPECT_EQ(got.outputs[i], expect.outputs[i]) << "output " << i;
    for (std::size_t t = 0; t < expect.weights.size(); ++t) {
      EXPECT_EQ(got.weights[t], expect.weights[t]) << "weights of table t" << t;
      EXPECT_EQ(got.state[t], expect.state[t]) << "optimizer state of table t" << t;
    }
  }
}

std::vector<CallerFpEnv> caller_envs() {
  std::vector<CallerFpEnv> envs;
#if defined(__x86_64__) || defined(__i386__)
  envs.push_back({"ftz_daz", [] { _mm_setcsr(_mm_getcsr() | kFtzDaz); }});
#endif
  envs.push_back({"round_upward", [] { std::fesetround(FE_UPWARD); }});
  return envs;
}

INSTANTIATE_TEST_SUITE_P(Caller, StoreFpEnv, ::testing::ValuesIn(caller_envs()),
                         [](const ::testing::TestParamInfo<CallerFpEnv>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace strata
