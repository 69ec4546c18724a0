#pragma once
// Whether a test program runs under ASan or TSan (the asan and tsan presets). Those check memory and
// races, not bits: a long sweep there runs a part of its length, enough to reach every code path,
// and the default preset runs it whole (CI's sanitizer step has a time limit).

namespace strata::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

/// `full` in the default preset, `sanitized` under ASan or TSan.
constexpr int full_or_sanitized(int full, int sanitized) noexcept { return kSanitized ? sanitized : full; }

}  // namespace strata::testing
