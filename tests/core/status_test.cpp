#include "core/status.hpp"

#include <gtest/gtest.h>

namespace strata {

TEST(Status, OkIsCheapAndPrintsOk) {
  Status s;
  EXPECT_TRUE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.to_string(), "OK");
  EXPECT_EQ(s.message(), "");
}

TEST(Status, ErrorCarriesCodeAndMessage) {
  Status s = Status::out_of_range("table 'user': key 70000 out of range [0, 65536)");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s.to_string(), "OutOfRange: table 'user': key 70000 out of range [0, 65536)");
  EXPECT_EQ(s.with_context("batch 3").message(), "batch 3: table 'user': key 70000 out of range [0, 65536)");
}

// A code known only at run time (received from a peer as an integer): kept when it is a failure
// code, else Internal; the message is kept either way.
TEST(Status, FromCodeKeepsEveryFailureCode) {
  for (StatusCode code :
       {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kOutOfRange, StatusCode::kFailedPrecondition,
        StatusCode::kAlreadyExists, StatusCode::kResourceExhausted, StatusCode::kDataLoss, StatusCode::kIoError,
        StatusCode::kInternal, StatusCode::kUnavailable}) {
    const Status s = Status::from_code(code, "rank 1: disk full");
    EXPECT_EQ(s.code(), code) << status_code_name(code);
    EXPECT_EQ(s.message(), "rank 1: disk full");
  }
  for (StatusCode code : {StatusCode::kOk, static_cast<StatusCode>(-3), static_cast<StatusCode>(99)}) {
    const Status s = Status::from_code(code, "rank 1: what");
    EXPECT_EQ(s.code(), StatusCode::kInternal) << static_cast<int>(code);
    EXPECT_EQ(s.message(), "rank 1: what");
  }
}

Result<int> half(int x) {
  if (x % 2) return Status::invalid_argument("odd " + std::to_string(x));
  return x / 2;
}
Status use(int x, int* out) {
  STRATA_ASSIGN_OR_RETURN(*out, half(x));
  return Status::ok();
}

TEST(Result, ValueOrStatusAndMacros) {
  EXPECT_EQ(half(4).value(), 2);
  EXPECT_EQ(half(3).status().code(), StatusCode::kInvalidArgument);
  int v = 0;
  EXPECT_TRUE(use(8, &v).is_ok());
  EXPECT_EQ(v, 4);
  EXPECT_EQ(use(7, &v).message(), "odd 7");
  EXPECT_EQ(v, 4);
}

TEST(ResultDeathTest, ValueOfErrorAborts) { EXPECT_DEATH((void)half(3).value(), "odd 3"); }

}  // namespace strata
