#pragma once
// The default floating-point environment for the store's own threads.
//
// A caller may run with flush-to-zero / denormals-are-zero (MXCSR FTZ/DAZ on x86, FPCR.FZ on
// Arm; e.g. torch.set_flush_denormal(True)) or another rounding mode. Threads inherit the FP
// environment of the thread that creates them, and a oneTBB task_arena captures the one of the
// thread that initializes it and applies it to every task run in it, on its workers and on a
// thread that joins it through execute() alike (restoring that thread's own on return). The
// store's results are bit-exact with the reference only under the default environment, so the
// store initializes its arenas and starts its threads under DefaultFpEnv.

#include <cfenv>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace strata {

/// While alive, the calling thread runs with the default FP environment: round to nearest, no
/// flush-to-zero or denormals-are-zero, exceptions masked, no exception flags raised. Restores
/// the thread's previous environment (controls and flags) on destruction. Not copyable.
class DefaultFpEnv {
 public:
#if defined(__x86_64__) || defined(__i386__)
  /// MXCSR after reset: all exceptions masked, round to nearest, FTZ and DAZ off, no flags.
  static constexpr unsigned kDefaultMxcsr = 0x1f80;
#endif

  DefaultFpEnv() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    saved_mxcsr_ = _mm_getcsr();
#endif
    std::fegetenv(&saved_);
    std::fesetenv(FE_DFL_ENV);
#if defined(__x86_64__) || defined(__i386__)
    // FTZ and DAZ are outside ISO C's FP environment: set all of MXCSR rather than rely on what
    // the C library's FE_DFL_ENV does with them (glibc clears them; not every libc is glibc).
    _mm_setcsr(kDefaultMxcsr);
#endif
  }
  ~DefaultFpEnv() {
    std::fesetenv(&saved_);
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(saved_mxcsr_);
#endif
  }
  DefaultFpEnv(const DefaultFpEnv&) = delete;
  DefaultFpEnv& operator=(const DefaultFpEnv&) = delete;

 private:
  std::fenv_t saved_{};
#if defined(__x86_64__) || defined(__i386__)
  unsigned saved_mxcsr_ = 0;
#endif
};

}  // namespace strata
