// The host kernels' vector types are no wider than the target's registers: a wider GCC vector is
// split by the compiler (through the stack with AVX2), which halved the pooled gather's speed.
#include "core/simd.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace strata {
namespace {

// Register width the compiler targets, from its own macros (independent of core/simd.hpp's choice).
constexpr int target_register_bytes() {
#if defined(__AVX512F__)
  return 64;
#elif defined(__AVX__)
  return 32;
#else
  return 16;
#endif
}

TEST(Simd, VectorsAreNoWiderThanTheTargetRegisters) {
  static_assert(sizeof(simd::Floats) <= target_register_bytes());
  static_assert(sizeof(simd::U64s) <= target_register_bytes());
  EXPECT_EQ(simd::kFloats * static_cast<int>(sizeof(float)), simd::kVectorBytes);
  EXPECT_EQ(simd::kU64s * static_cast<int>(sizeof(std::uint64_t)), simd::kVectorBytes);
#if defined(__AVX512F__)
  EXPECT_EQ(simd::kVectorBytes, 64);
#elif defined(__AVX2__)
  EXPECT_EQ(simd::kVectorBytes, 32);
#endif
}

// Every vector type of the library comes from core/simd.hpp, whose width is checked above: no other
// source declares one (a hand-written 64-byte type is one AVX-512 register but two AVX2 ones).
TEST(Simd, NoVectorTypeOutsideSimdHeader) {
  const std::filesystem::path root = STRATA_SOURCE_DIR;
  const std::string attribute = std::string("vector_") + "size(";  // not spelled whole: this file is scanned too
  std::vector<std::string> offenders;
  int scanned = 0;
  for (const char* dir : {"core", "host", "cache", "store", "dispatch", "gpu", "bench", "tests"}) {
    if (!std::filesystem::exists(root / dir)) continue;
    for (const auto& e : std::filesystem::recursive_directory_iterator(root / dir)) {
      const auto ext = e.path().extension();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".hpp" && ext != ".cu" && ext != ".cuh")) continue;
      ++scanned;
      std::ifstream in(e.path());
      std::stringstream text;
      text << in.rdbuf();
      const std::string rel = std::filesystem::relative(e.path(), root).generic_string();
      if (text.str().find(attribute) != std::string::npos && rel != "core/simd.hpp") offenders.push_back(rel);
    }
  }
  EXPECT_GT(scanned, 20) << "sources not found under " << root;
  EXPECT_TRUE(offenders.empty()) << "vector types outside core/simd.hpp (use simd::Floats / simd::U64s): "
                                 << ::testing::PrintToString(offenders);
}

}  // namespace
}  // namespace strata
