#include "gpu/counters.hpp"

#include <algorithm>
#include <numeric>

namespace strata::gpu {

LinkBytes LinkBytes::operator-(const LinkBytes& e) const {
  LinkBytes d = *this;
  d.hbm_read -= e.hbm_read;
  d.hbm_write -= e.hbm_write;
  d.h2d -= e.h2d;
  d.d2h -= e.d2h;
  d.host_copy -= e.host_copy;
  for (std::size_t i = 0; i < d.host_read.size() && i < e.host_read.size(); ++i) d.host_read[i] -= e.host_read[i];
  for (std::size_t i = 0; i < d.host_write.size() && i < e.host_write.size(); ++i) d.host_write[i] -= e.host_write[i];
  return d;
}

LinkBytes& LinkBytes::operator+=(const LinkBytes& o) {
  hbm_read += o.hbm_read;
  hbm_write += o.hbm_write;
  h2d += o.h2d;
  d2h += o.d2h;
  host_copy += o.host_copy;
  host_read.resize(std::max(host_read.size(), o.host_read.size()));
  host_write.resize(std::max(host_write.size(), o.host_write.size()));
  for (std::size_t i = 0; i < o.host_read.size(); ++i) host_read[i] += o.host_read[i];
  for (std::size_t i = 0; i < o.host_write.size(); ++i) host_write[i] += o.host_write[i];
  return *this;
}

std::uint64_t LinkBytes::host_read_total() const noexcept {
  return std::accumulate(host_read.begin(), host_read.end(), std::uint64_t{0});
}
std::uint64_t LinkBytes::host_write_total() const noexcept {
  return std::accumulate(host_write.begin(), host_write.end(), std::uint64_t{0});
}

LinkCounters::LinkCounters(int numa_nodes) noexcept : nodes_(std::clamp(numa_nodes, 1, kMaxNodes)) {}

std::size_t LinkCounters::clamp(int node) const noexcept {
  return static_cast<std::size_t>(std::clamp(node, 0, nodes_ - 1));
}

void LinkCounters::add_host_reads(const NodeBytes& b) noexcept {
  for (int n = 0; n < kMaxNodes; ++n)
    if (b.bytes[static_cast<std::size_t>(n)]) add_host_read(n, b.bytes[static_cast<std::size_t>(n)]);
}

void LinkCounters::add_host_writes(const NodeBytes& b) noexcept {
  for (int n = 0; n < kMaxNodes; ++n)
    if (b.bytes[static_cast<std::size_t>(n)]) add_host_write(n, b.bytes[static_cast<std::size_t>(n)]);
}

LinkBytes LinkCounters::snapshot() const {
  LinkBytes s;
  s.hbm_read = hbm_read_.load(std::memory_order_relaxed);
  s.hbm_write = hbm_write_.load(std::memory_order_relaxed);
  s.h2d = h2d_.load(std::memory_order_relaxed);
  s.d2h = d2h_.load(std::memory_order_relaxed);
  s.host_copy = host_copy_.load(std::memory_order_relaxed);
  for (int i = 0; i < nodes_; ++i) {
    s.host_read.push_back(host_read_[static_cast<std::size_t>(i)].load(std::memory_order_relaxed));
    s.host_write.push_back(host_write_[static_cast<std::size_t>(i)].load(std::memory_order_relaxed));
  }
  return s;
}

}  // namespace strata::gpu
