// Linked into every test binary of the `tsan` preset only, and into Strata's programs
// (strata_program in CMakeLists.txt) in a thread-sanitized build that includes them. Debian's
// oneTBB is not built with ThreadSanitizer, so TSan cannot see the happens-before edges of TBB's
// scheduler and flags every write made inside a parallel_for body. Under TSan we therefore run TBB
// work on one thread and let TSan check the threads Strata creates itself (arena pre-fault threads,
// the emulated device streams and communicator ranks). The parallel kernels' correctness is
// covered by the default and asan presets, which run them on all cores.
#include <tbb/global_control.h>

namespace {
const tbb::global_control serial_tbb(tbb::global_control::max_allowed_parallelism, 1);
}  // namespace
