#include "gpu/staging.hpp"

namespace strata::gpu {

Result<Staging> Staging::create(Device& device) {
  Staging s(device);
  STRATA_ASSIGN_OR_RETURN(s.done_, device.create_event());
  return s;
}

Status Staging::reserve(std::size_t mirrored, std::size_t host_only, std::size_t dev_only) {
  mirrored_used_ = host_used_ = dev_used_ = 0;
  if (mirrored <= mirrored_cap_ && host_only <= host_cap_ && dev_only <= dev_cap_) return Status::ok();
  // Grow with headroom so that batches of slowly varying size do not reallocate every time.
  // Region sizes stay multiples of kAlign: the host-only and device-only regions start after the
  // mirrored one, and every allocation in them must stay aligned.
  auto grow = [](std::size_t want, std::size_t cap) { return (std::max(want, cap + cap / 4) + kAlign - 1) / kAlign * kAlign; };
  const std::size_t m = grow(mirrored, mirrored_cap_);
  const std::size_t h = grow(host_only, host_cap_);
  const std::size_t d = grow(dev_only, dev_cap_);
  host_ = PinnedBuffer();
  dev_ = DeviceBuffer();
  mirrored_cap_ = host_cap_ = dev_cap_ = 0;
  auto hb = dev_ptr_->allocate_pinned(m + h);
  if (!hb) return hb.status().with_context("staging buffers");
  auto db = dev_ptr_->allocate(m + d);
  if (!db) return db.status().with_context("staging buffers");
  host_ = std::move(hb).value();
  dev_ = std::move(db).value();
  mirrored_cap_ = m;
  host_cap_ = h;
  dev_cap_ = d;
  return Status::ok();
}

std::size_t Staging::take(std::size_t& used, std::size_t cap, std::size_t bytes) {
  STRATA_CHECK(used + bytes <= cap);  // reserve() was given the sizes
  const std::size_t off = used;
  used += bytes;
  return off;
}

void Staging::upload(StreamView s) {
  if (mirrored_used_ > 0) dev_ptr_->copy_h2d(s, dev_.data(), host_.data(), mirrored_used_);
}

Result<std::unique_ptr<Staging>> StagingPool::take() {
  if (!free_.empty()) {
    auto st = std::move(free_.front());
    free_.pop_front();
    STRATA_RETURN_IF_ERROR(dev_->synchronize(st->done()));
    return st;
  }
  STRATA_ASSIGN_OR_RETURN(Staging st, Staging::create(*dev_));
  return std::make_unique<Staging>(std::move(st));
}

void StagingPool::give_back(std::unique_ptr<Staging> s) {
  if (s) free_.push_back(std::move(s));
}

}  // namespace strata::gpu
