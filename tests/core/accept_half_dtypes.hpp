#pragma once
// Turns on half_dtypes_accepted() (core/table_spec.hpp) for a test's scope, for tests of the parts
// that already handle half-size elements (the reference store) while validate still refuses them.

#include "core/half.hpp"
#include "core/table_spec.hpp"

namespace strata {

class AcceptHalfDTypes {
 public:
  AcceptHalfDTypes() noexcept { set_half_dtypes_accepted(true); }
  ~AcceptHalfDTypes() { set_half_dtypes_accepted(false); }
  AcceptHalfDTypes(const AcceptHalfDTypes&) = delete;
  AcceptHalfDTypes& operator=(const AcceptHalfDTypes&) = delete;
};

}  // namespace strata
