#pragma once
// Pinner: how the host tier registers its large allocations for fast device access. The host tier
// knows nothing of CUDA; the gpu layer implements this with cudaHostRegister.

#include <cstddef>

#include "core/status.hpp"

namespace strata {

/// Registers host memory ranges for DMA. Implementations must be thread-safe.
class Pinner {
 public:
  virtual ~Pinner() = default;
  /// Pins [addr, addr+len) (host memory, page aligned). Errors leave the range unpinned.
  virtual Status pin(void* addr, std::size_t len) = 0;
  /// Undoes pin(); never fails (errors are logged by the implementation).
  virtual void unpin(void* addr, std::size_t len) noexcept = 0;
  /// Name for logs ("none", "cuda", "emu").
  virtual const char* name() const noexcept = 0;
};

/// The pinner of CPU-only builds: pins nothing.
class NoopPinner final : public Pinner {
 public:
  Status pin(void*, std::size_t) override { return Status::ok(); }
  void unpin(void*, std::size_t) noexcept override {}
  const char* name() const noexcept override { return "none"; }
  /// A shared instance (stateless).
  static NoopPinner& instance() noexcept {
    static NoopPinner p;
    return p;
  }
};

}  // namespace strata
