#pragma once
// StreamGate: holds a device stream back until open(), as a trainer's dense model still running
// on its stream would, so tests can check what waits for that stream and what does not.

#include <future>

#include "gpu/device.hpp"

namespace strata::gpu {

struct StreamGate {
  std::promise<void> go;
  std::shared_future<void> opened = go.get_future().share();
  /// Queues on `s` a host task that waits until open(): work queued after it on `s` waits too.
  void hold(Device& dev, StreamView s) const {
    dev.host_task(s, [f = opened] { f.wait(); });
  }
  /// Lets every held stream run on.
  void open() { go.set_value(); }
};

}  // namespace strata::gpu
