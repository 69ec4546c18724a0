#pragma once
// The per-feature device arguments that every slot-pool engine (`cached`, `gpu`) stages for a
// batch: lookup and fused-update arguments in a Staging's mirrored region, pinned buffers for the
// outputs and gradients of host views, and the steps around the device work: outputs written into
// device views or brought back to host views (through staging carved only for them), gradients read from device views
// or copied in from host views, each ordered with the caller's stream (CallOrder) or waited for by the host.

#include <cstdint>
#include <vector>

#include "core/key_batch.hpp"
#include "gpu/device.hpp"
#include "gpu/staging.hpp"
#include "host/dedup.hpp"
#include "store/engines/engine.hpp"

namespace strata::detail {

/// One feature's device work for one batch. The buffers of host views (the lookup's and the
/// update's device buffers, the pinned ones) are null until stage_activations carves them.
struct DeviceFeature {
  gpu::LookupFeature look;
  gpu::UpdateFeature update;
  float* host_out = nullptr;   ///< pinned (out_bytes), for a host view's output (or a half device view's gradient)
  float* host_grad = nullptr;  ///< pinned (grad_bytes), for a host view's gradient, or a half one widened
  std::size_t out_bytes = 0;   ///< output_rows * dim elements of the table's output_dtype (look.out_dtype)
  std::size_t grad_bytes = 0;  ///< the same elements in fp32, as the update reads them (half gradients widened)
};

/// Mirrored staging bytes (uploaded H2D with the batch) that stage_feature takes for a feature of
/// `bags` bags, `keys` keys, `weights` per-key weights (0 or keys) and `unique` distinct rows; with
/// `rows`, also the unique rows' ids (a table that rounds stochastically: rounds_by_row).
std::size_t feature_metadata_bytes(std::int64_t bags, std::int64_t keys, std::size_t weights, std::int64_t unique,
                                   bool rows = false);

/// Whether a table's updates need each unique row's id on the device: half elements rounded
/// stochastically (the bits are keyed by the row, gpu::UpdateFeature::unique_rows).
bool rounds_by_row(const TableSpec& spec);

/// Mirrored staging bytes that stage_feature takes for a feature of table `spec`: adds them to `mirrored`.
void add_feature_bytes(const JaggedKeys& k, std::int64_t unique, const TableSpec& spec, std::size_t& mirrored);

/// Writes the feature's lookup and update arguments into `st` (reserved with add_feature_bytes):
/// `unique_slots[u]` is the slot of unique key u of `u` (and, where rounds_by_row, u.keys its
/// rows). Takes nothing for outputs or gradients: device views need no staging for them
/// (stage_activations, for host views).
DeviceFeature stage_feature(gpu::Staging& st, const JaggedKeys& k, const TableSpec& spec, const UniqueKeys& u,
                            const std::vector<Key>& unique_slots);

/// Whether feature `f` needs the activation staging (stage_activations) for `out`, its output view: a
/// host view, or half-size outputs (their gradients are widened to fp32 through it, copy_gradients).
bool needs_activation_staging(const DeviceFeature& f, const MatrixView& out);
/// The host-only and device-only bytes that stage_activations takes for `feats`: an output and a
/// gradient buffer per feature on each side.
gpu::StagingSizes activation_bytes(const std::vector<DeviceFeature>& feats);
/// Carves every feature's output and gradient buffers, pinned and device, out of `act` (reserved
/// with activation_bytes): what a host view's output goes D2H through, and a host gradient H2D.
void stage_activations(gpu::Staging& act, std::vector<DeviceFeature>& feats);

/// The feature's lookup, writing into `out` when it is a device view (else into its staging buffer).
gpu::LookupFeature lookup_into(const DeviceFeature& f, const MatrixView& out);
/// The feature's update, reading `grads` when it is a device view (else its staging buffer).
gpu::UpdateFeature update_from(const DeviceFeature& f, const ConstMatrixView& grads);

/// On `s`, after the lookups: copies the output of every host view among `outputs[feature[i]]`
/// D2H into its pinned buffer and records st.done(). The host waits for it when there is a host
/// view or no caller stream (a synchronous call), then copies the host views' outputs into place;
/// with a caller stream, that stream waits for it (the device views are written before anything
/// it runs next).
Status finish_outputs(gpu::Device& dev, gpu::StreamView s, gpu::Staging& st, const std::vector<DeviceFeature>& feats,
                      const std::vector<int>& feature, const std::vector<MatrixView>& outputs, const CallOrder& order);

/// On `s`: copies every host gradient among `grads[feature[i]]` through its pinned buffer H2D, a
/// half-size one widened to fp32 on the host first; a half-size device view goes D2H, the host
/// waits for `s` and widens it, and it goes back H2D in fp32. Returns whether any feature reads a
/// device view (update_from uses an fp32 one in place).
Result<bool> copy_gradients(gpu::Device& dev, gpu::StreamView s, std::vector<DeviceFeature>& feats,
                            const std::vector<int>& feature, const std::vector<ConstMatrixView>& grads);

/// After the updates, with `done` recorded after them: when some gradient was a device view, the
/// caller's stream waits for `done` (the gradients are consumed before anything it runs next), or
/// without one the host does. The device's sticky error, if any.
Status finish_gradients(gpu::Device& dev, gpu::EventView done, bool device_grads, const CallOrder& order);

}  // namespace strata::detail
