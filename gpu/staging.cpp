#include "gpu/staging.hpp"

#include <algorithm>

namespace strata::gpu {

Result<Staging> Staging::create(Device& device) {
  Staging s(device);
  STRATA_ASSIGN_OR_RETURN(s.ready_, device.create_event());
  STRATA_ASSIGN_OR_RETURN(s.done_, device.create_event());
  STRATA_ASSIGN_OR_RETURN(s.drained_, device.create_event());
  return s;
}

Status Staging::reserve(const StagingSizes& want, const StagingSizes& floor) {
  mirrored_used_ = host_used_ = dev_used_ = 0;
  if (want.fits_in(capacity()) && (floor.fits_in(capacity()) || tight_)) return Status::ok();
  // Region sizes stay multiples of kAlign: the host-only and device-only regions start after the
  // mirrored one, and every allocation in them must stay aligned.
  auto round = [](std::size_t b) { return (b + kAlign - 1) / kAlign * kAlign; };
  const StagingSizes roomy{round(std::max({2 * want.mirrored, floor.mirrored, mirrored_cap_})),
                           round(std::max({2 * want.host_only, floor.host_only, host_cap_})),
                           round(std::max({2 * want.dev_only, floor.dev_only, dev_cap_}))};
  // Without room for the headroom, exactly what is asked (a device nearly full): the request
  // alone, not the old capacity too (the old buffers are freed first, so a batch that fits on its
  // own is never refused because an earlier, larger one was).
  const StagingSizes exact{round(want.mirrored), round(want.host_only), round(want.dev_only)};
  host_ = PinnedBuffer();
  dev_ = DeviceBuffer();
  mirrored_cap_ = host_cap_ = dev_cap_ = 0;
  Status last;
  // Pointers, not copies (an initializer_list of StagingSizes would copy them), so that the entry
  // remembers that it fell back to `exact`.
  for (const StagingSizes* z : {&roomy, &exact}) {
    auto hb = dev_ptr_->allocate_pinned(z->mirrored + z->host_only);
    if (!hb) {
      last = hb.status();
      continue;
    }
    auto db = dev_ptr_->allocate(z->mirrored + z->dev_only);
    if (!db) {
      last = db.status();
      continue;
    }
    host_ = std::move(hb).value();
    dev_ = std::move(db).value();
    mirrored_cap_ = z->mirrored;
    host_cap_ = z->host_only;
    dev_cap_ = z->dev_only;
    tight_ = z == &exact;
    return Status::ok();
  }
  return last.with_context("staging buffers");
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

Status Staging::wait_idle() {
  STRATA_RETURN_IF_ERROR(dev_ptr_->synchronize(done()));
  return dev_ptr_->synchronize(drained());
}

Result<std::unique_ptr<Staging>> StagingRing::take(const StagingSizes& want) {
  std::unique_ptr<Staging> st;
  // The oldest free entry may still wait for the caller's stream (its done() follows the caller's
  // work under stream-ordered calls): waiting for it would block the host on the caller's queue, so
  // a new entry is made instead while fewer than kMaxBusyFree free entries are waiting.
  const bool grow = !free_.empty() && free_.size() < kMaxBusyFree && !dev_->ready(free_.front()->done());
  if (!free_.empty() && !grow) {
    st = std::move(free_.front());
    free_.pop_front();
    if (Status idle = st->wait_idle(); !idle.is_ok()) {
      free_.push_front(std::move(st));
      return idle;
    }
  } else {
    STRATA_ASSIGN_OR_RETURN(Staging made, Staging::create(*dev_));
    st = std::make_unique<Staging>(std::move(made));
    if (grow) ++made_ahead_;
  }
  // The reservation is raised only once an entry could be reserved for the request: a batch whose
  // staging cannot be had must not leave every entry a floor it can never reach.
  StagingSizes raised = reserved_;
  if (!want.fits_in(reserved_))
    raised = {std::max(reserved_.mirrored, 2 * want.mirrored), std::max(reserved_.host_only, 2 * want.host_only),
              std::max(reserved_.dev_only, 2 * want.dev_only)};
  if (Status r = st->reserve(want, raised); !r.is_ok()) {
    free_.push_front(std::move(st));
    return r;
  }
  // Not when the entry fell back to the request alone: on a nearly full device a floor no entry
  // can reach would make every other entry free and remake its buffers when next taken.
  if (!st->tight()) reserved_ = raised;
  return st;
}

StagingSizes StagingRing::free_capacity() const noexcept {
  StagingSizes z;
  for (const auto& s : free_) {
    const StagingSizes c = s->capacity();
    z.mirrored += c.mirrored;
    z.host_only += c.host_only;
    z.dev_only += c.dev_only;
  }
  return z;
}

void StagingRing::give_back(std::unique_ptr<Staging> s) {
  if (s) free_.push_back(std::move(s));
}

}  // namespace strata::gpu
