#pragma once
// Turns on half_dtypes_accepted() (core/table_spec.hpp) for a test's scope, for tests of the parts
// that already handle half-size elements (the reference store) while validate still refuses them.

#include "core/half.hpp"
#include "core/table_spec.hpp"

namespace strata {

class AcceptHalfDTypes {
 public:
  AcceptHalfDTypes() noexcept : before_(half_dtypes_accepted()) { set_half_dtypes_accepted(true); }
  ~AcceptHalfDTypes() { set_half_dtypes_accepted(before_); }
  AcceptHalfDTypes(const AcceptHalfDTypes&) = delete;
  AcceptHalfDTypes& operator=(const AcceptHalfDTypes&) = delete;

 private:
  bool before_;  ///< restored on destruction, so nested guards keep the outer one's setting
};

}  // namespace strata
