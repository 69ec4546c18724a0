#pragma once
// Cache hints for the planner's loops over a batch's rows.

/// Marks a function whose only effect is a prefetch. GCC (12 at least) otherwise finds such a
/// function free of side effects once it is not inlined, and drops the calls: always inline it.
#define STRATA_PREFETCH_FN __attribute__((always_inline)) inline
