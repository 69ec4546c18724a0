#include "core/record_layout.hpp"

#include <gtest/gtest.h>

#include <cstdint>

namespace strata {
namespace {

// The stride rule of every fp32 record before half-size elements existed (host/host_table.cpp's
// record_stride at e06189b), kept here to hold the new rule to it.
std::int64_t fp32_stride_before(std::int32_t dim, std::int32_t state_dim) {
  const std::int64_t n = std::int64_t{dim} + state_dim;
  if (n >= 16) return (n + 15) / 16 * 16;
  std::int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

TableSpec spec(std::int32_t dim, DType dtype, OptimizerKind kind, DType state_dtype = DType::kF32) {
  TableSpec s;
  s.name = "t";
  s.rows = 10;
  s.dim = dim;
  s.dtype = dtype;
  s.optimizer.kind = kind;
  s.state_dtype = state_dtype;
  return s;
}

}  // namespace

// fp32 tables keep their layout, so their host memory, device slots, byte models and checkpoints
// stay what they were.
TEST(RecordLayout, Fp32StridesAreUnchanged) {
  for (const OptimizerKind kind :
       {OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowwiseAdagrad, OptimizerKind::kAdam}) {
    for (std::int32_t dim = 1; dim <= 300; ++dim) {
      const RecordShape shape = record_shape(spec(dim, DType::kF32, kind));
      const std::int32_t state = optimizer_state_dim(kind, dim);
      ASSERT_EQ(record_words(shape), fp32_stride_before(dim, state)) << to_string(kind) << " dim " << dim;
      ASSERT_EQ(record_stride(dim, state), fp32_stride_before(dim, state));
      ASSERT_EQ(row_words(shape), dim);
      ASSERT_EQ(state_words(shape), state);
    }
  }
  EXPECT_EQ(record_stride(1, 0), 1);
  EXPECT_EQ(record_stride(3, 1), 4);
  EXPECT_EQ(record_stride(5, 0), 8);
  EXPECT_EQ(record_stride(16, 0), 16);
  EXPECT_EQ(record_stride(128, 1), 144);
  EXPECT_EQ(record_stride(64, 128), 192);
}

// Records with a half-size element: two elements a word, padded to a power of two up to 4 words,
// else to a multiple of 4 words (16 bytes); the state starts at word row_words.
TEST(RecordLayout, HalfRecordsPackTwoElementsAWordIn16ByteSteps) {
  const RecordShape rowwise = record_shape(spec(64, DType::kBF16, OptimizerKind::kRowwiseAdagrad));
  EXPECT_EQ(row_words(rowwise), 32);
  EXPECT_EQ(state_words(rowwise), 1);  // its one fp32
  EXPECT_EQ(record_words(rowwise), 36);
  EXPECT_EQ(record_words(record_shape(spec(128, DType::kBF16, OptimizerKind::kSgd))), 64);
  EXPECT_EQ(record_words(record_shape(spec(128, DType::kF16, OptimizerKind::kSgd))), 64);
  // Odd dims round the weights up to whole words.
  const RecordShape odd = record_shape(spec(7, DType::kF16, OptimizerKind::kAdagrad));
  EXPECT_EQ(row_words(odd), 4);
  EXPECT_EQ(state_words(odd), 7);
  EXPECT_EQ(record_words(odd), 12);
  // bf16 state with fp32 weights is a half record too; adam keeps 2 * dim state elements.
  const RecordShape adam = record_shape(spec(10, DType::kF32, OptimizerKind::kAdam, DType::kBF16));
  EXPECT_EQ(row_words(adam), 10);
  EXPECT_EQ(state_words(adam), 10);
  EXPECT_EQ(record_words(adam), 20);  // fp32 would be 30 -> 32
  // Powers of two up to 4 words.
  for (const auto& [dim, words] :
       {std::pair<int, int>{1, 1}, {2, 1}, {3, 2}, {4, 2}, {5, 4}, {8, 4}, {9, 8}, {10, 8}, {11, 8}, {17, 12}})
    EXPECT_EQ(record_words(record_shape(spec(dim, DType::kBF16, OptimizerKind::kSgd))), words) << "dim " << dim;
  // A state_dtype on an optimizer without state changes nothing.
  EXPECT_EQ(record_words({16, DType::kF32, 0, DType::kBF16}), 16);
}

}  // namespace strata
