#pragma once
// The README's device-views snippet, compiled from README.md (readme_device_views.cpp.in) and run
// by readme_test.cpp: what the snippet calls the dense model is a DenseModel here.

#include <memory>

#include "gpu/device.hpp"
#include "store/store.hpp"

namespace strata::readme {

/// Stands for the trainer's dense model: on `stream`, reads the outputs the store wrote into `out`
/// and writes the gradients into `grad` (device buffers of the snippet's shape).
class DenseModel {
 public:
  virtual ~DenseModel() = default;
  virtual void run(gpu::Device& dev, gpu::DeviceBuffer& out, gpu::DeviceBuffer& grad, gpu::Stream& stream) = 0;
};

/// The README block as written, on `store` (which has a device) with `batch` as its batch 0.
Status device_views_snippet(std::unique_ptr<Store>& store, const KeyBatch& batch, DenseModel& model);

}  // namespace strata::readme
