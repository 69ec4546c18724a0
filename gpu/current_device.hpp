#pragma once
// Which device the calling thread has current, in both backends. Strata never changes it: every
// operation of a Device that needs its device makes it current for the operation's duration and
// restores the caller's (cuda: the context guard of gpu/cuda/device_scope.hpp; emu: the
// thread-local below), so a trainer that selected its GPU finds it selected after any store call.
// Threads that Strata owns (stream workers) may set theirs freely.

#include "core/status.hpp"

namespace strata::gpu {

/// The calling thread's current CUDA device, as cudaGetDevice says (the device of the thread's
/// current context, else the one it last selected, else 0); creates no context. Used by the
/// device ordinal "current" (store/store_config.hpp). An error when this build has no CUDA
/// backend or the CUDA runtime cannot start.
Result<int> cuda_current_device();

/// The emulated device's stand-in for the thread's current CUDA device: the id of the emu device
/// current on the calling thread, -1 (none) on every thread until something sets it. Each emu
/// operation makes its device current for its duration, as it would have to under CUDA, and
/// restores the caller's value. Tests set a value here (as a trainer calls cudaSetDevice) and
/// assert that store calls left it unchanged.
int emu_current_device() noexcept;
/// Sets the calling thread's emu current device (emu_current_device); any int, -1 for none.
void set_emu_current_device(int id) noexcept;

}  // namespace strata::gpu
