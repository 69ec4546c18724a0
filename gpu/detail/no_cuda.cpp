// Factories of the CUDA backend in builds without it.

#include "gpu/current_device.hpp"
#include "gpu/device.hpp"

namespace strata::gpu {

Result<std::unique_ptr<Device>> make_cuda_device(int, std::size_t, int) {
  return Status::unavailable("the CUDA backend was not built (configure with STRATA_CUDA=ON and a CUDA toolkit)");
}
Result<int> cuda_devices() { return 0; }
bool cuda_backend_built() noexcept { return false; }
Result<int> cuda_current_device() {
  return Status::unavailable("the CUDA backend was not built: there is no current CUDA device");
}

}  // namespace strata::gpu
