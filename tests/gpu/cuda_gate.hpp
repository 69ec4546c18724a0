#pragma once
// The one gate of every test that needs a CUDA GPU (tests/gpu, tests/store, tests/dispatch):
// without a GPU such a test skips, except where a skip would hide a problem:
//  - CUDA is installed but broken (gpu::cuda_devices() is an error, e.g. a driver older than the
//    CUDA runtime of this build): the test fails, with the CUDA error in the message;
//  - STRATA_REQUIRE_GPU=1 in the environment (set it on GPU machines; bench/gpu_targets.sh does):
//    no GPU is a failure, so a GPU run whose GPU vanished cannot pass by skipping everything.

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "gpu/device.hpp"

namespace strata::testing {

/// What a test that needs a CUDA GPU must do here.
struct CudaGate {
  bool run = false;   ///< a GPU is visible: run the test
  bool fail = false;  ///< no run, and it must fail rather than skip (see the file comment)
  std::string why;    ///< why it cannot run ("" when it can)
};

inline CudaGate cuda_gate() {
  CudaGate g;
  const char* env = std::getenv("STRATA_REQUIRE_GPU");
  const std::string require = env ? env : "";
  if (require != "" && require != "0" && require != "1") {
    g.fail = true;
    g.why = "STRATA_REQUIRE_GPU='" + require + "' (expected 0 or 1)";
    return g;
  }
  const Result<int> gpus = gpu::cuda_devices();
  if (!gpus.is_ok()) {
    g.fail = true;
    g.why = gpus.status().to_string();
    return g;
  }
  if (gpus.value() > 0) {
    g.run = true;
    return g;
  }
  g.why = gpu::cuda_backend_built() ? "no CUDA GPU visible" : "this build has no CUDA backend";
  if (require == "1") {
    g.fail = true;
    g.why += ", and STRATA_REQUIRE_GPU=1 requires one (unset it on machines without a GPU)";
  }
  return g;
}

}  // namespace strata::testing

/// In a test body or SetUp(): returns from it, skipping the test or failing it (cuda_gate()),
/// unless a CUDA GPU is visible.
#define STRATA_SKIP_WITHOUT_CUDA_GPU()                                               \
  do {                                                                               \
    const ::strata::testing::CudaGate strata_gate_ = ::strata::testing::cuda_gate(); \
    if (strata_gate_.fail) GTEST_FAIL() << strata_gate_.why;                         \
    if (!strata_gate_.run) GTEST_SKIP() << strata_gate_.why;                         \
  } while (0)
