#pragma once
// The per-feature device arguments that every slot-pool engine (`cached`, `gpu`) stages for a
// batch: lookup and fused-update arguments in a Staging's mirrored region, pinned buffers for the
// outputs and gradients, and the two host sync steps around them (outputs back, gradients in).

#include <cstdint>
#include <vector>

#include "core/key_batch.hpp"
#include "gpu/device.hpp"
#include "gpu/staging.hpp"
#include "host/dedup.hpp"

namespace strata::detail {

/// One feature's device work for one batch.
struct DeviceFeature {
  gpu::LookupFeature look;
  gpu::UpdateFeature update;
  float* host_out = nullptr;   ///< pinned (out_floats)
  float* host_grad = nullptr;  ///< pinned (out_floats)
  std::size_t out_floats = 0;  ///< output_rows * dim
};

/// Staging bytes that stage_feature takes for a feature: adds to the three region sizes.
void add_feature_bytes(const JaggedKeys& k, const TableSpec& spec, std::int64_t unique, std::size_t& mirrored,
                       std::size_t& host_only, std::size_t& dev_only);

/// Writes the feature's lookup and update arguments into `st` (reserved with add_feature_bytes):
/// `unique_slots[u]` is the slot of unique key u of `u`.
DeviceFeature stage_feature(gpu::Staging& st, const JaggedKeys& k, const TableSpec& spec, const UniqueKeys& u,
                            const std::vector<Key>& unique_slots);

/// On `s`: copies every feature's output D2H into its pinned buffer, records st.done(), waits for
/// it (a host sync point) and copies the outputs to `outputs[feature[i]]`.
Status copy_outputs(gpu::Device& dev, gpu::StreamView s, gpu::Staging& st, const std::vector<DeviceFeature>& feats,
                    const std::vector<int>& feature, const std::vector<MatrixView>& outputs);

/// On `s`: copies every feature's gradient `grads[feature[i]]` through its pinned buffer H2D.
void copy_gradients(gpu::Device& dev, gpu::StreamView s, std::vector<DeviceFeature>& feats,
                    const std::vector<int>& feature, const std::vector<ConstMatrixView>& grads);

}  // namespace strata::detail
