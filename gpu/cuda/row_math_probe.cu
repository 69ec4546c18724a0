// Compiles core/row_math.hpp in device code so a change that breaks CUDA use of the shared row
// math fails the build here, before the device layer lands.
#include "core/row_math.hpp"

namespace strata {

__global__ void row_math_probe_kernel(float* w, float* state, float* g, int dim, OptimizerStep step) {
  apply_optimizer(step, w, state, g, dim);
  row_axpy(w, g, bag_scale(Pooling::kMean, 4), dim);
  w[0] += initial_value(table_seed(1, 2), 3, 0, 0.5f);
}

}  // namespace strata
