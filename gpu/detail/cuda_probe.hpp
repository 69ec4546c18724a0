#pragma once
// What cuda_devices() (gpu/device.hpp) makes of the CUDA runtime's answers: a pure function of
// the cudaError_t of cudaGetDeviceCount and the driver and runtime versions, host C++ only, so
// that every build tests it (tests/gpu/device_test.cpp) whether or not it has the CUDA backend.

#include <string>

#include "core/status.hpp"

namespace strata::gpu::detail {

/// The cudaError_t values classify_cuda_probe tells apart (gpu/cuda/cuda_device.cpp checks them
/// against the runtime's enum at compile time).
inline constexpr int kCudaSuccess = 0;
inline constexpr int kCudaErrorInsufficientDriver = 35;
inline constexpr int kCudaErrorNoDevice = 100;

/// What the CUDA runtime said when asked for its GPUs.
struct CudaProbe {
  int error = kCudaSuccess;  ///< cudaError_t of cudaGetDeviceCount
  std::string error_name;    ///< cudaGetErrorName of it ("cudaErrorInsufficientDriver")
  std::string error_text;    ///< cudaGetErrorString of it
  int count = 0;             ///< GPUs counted (meaningful only when error is kCudaSuccess)
  /// cudaDriverGetVersion: the newest CUDA the driver supports (1000 * major + 10 * minor); 0: no
  /// driver installed.
  int driver_version = 0;
  int runtime_version = 0;  ///< cudaRuntimeGetVersion: the CUDA runtime this build links
};

/// "13.0" for 13000, "12.4" for 12040.
inline std::string cuda_version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

/// The number of usable GPUs, or why CUDA is installed but unusable (Unavailable). None (0):
/// cudaErrorNoDevice, a count of 0, or cudaErrorInsufficientDriver with no driver installed at all
/// (driver_version 0: a machine without the NVIDIA driver, where the runtime cannot find libcuda).
/// Any other error is a broken setup, and the message names it, both versions and what to check:
/// a driver older than the runtime (cudaErrorInsufficientDriver with a driver present) is the
/// common case, e.g. a CUDA 13 build on a driver that supports CUDA 12.
inline Result<int> classify_cuda_probe(const CudaProbe& p) {
  if (p.error == kCudaSuccess) return p.count > 0 ? p.count : 0;
  if (p.error == kCudaErrorNoDevice) return 0;
  if (p.error == kCudaErrorInsufficientDriver && p.driver_version == 0) return 0;
  const std::string runtime = "CUDA " + cuda_version_text(p.runtime_version);
  const std::string driver =
      p.driver_version > 0 ? "CUDA " + cuda_version_text(p.driver_version) : "no CUDA version (no driver found)";
  std::string msg = "CUDA is installed but unusable: cudaGetDeviceCount failed with " + p.error_name + " (" +
                    p.error_text + "); the NVIDIA driver supports " + driver + ", this build's runtime is " + runtime;
  if (p.error == kCudaErrorInsufficientDriver) {
    msg += ": install a driver that supports " + runtime +
           " (nvidia-smi shows the driver's CUDA version), or build with a "
           "CUDA toolkit no newer than the driver supports";
  } else {
    msg += ": check the driver (nvidia-smi), the device files /dev/nvidia*, and CUDA_VISIBLE_DEVICES";
  }
  return Status::unavailable(msg);
}

}  // namespace strata::gpu::detail
