#include "host/numa_arena.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

namespace strata {

namespace {
constexpr std::size_t kHugePage = 2u << 20;

std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }
}  // namespace

Result<NumaArena> NumaArena::create(const Topology& topo, std::size_t bytes, const ArenaOptions& options) {
  if (bytes == 0) return Status::invalid_argument("NumaArena: size must be > 0");
  if (options.node < 0 || options.node >= topo.num_nodes())
    return Status::invalid_argument("NumaArena: node " + std::to_string(options.node) + " out of range [0, " +
                                    std::to_string(topo.num_nodes()) + ")");
  const std::size_t mapped = round_up(bytes, kHugePage);
  // Over-map by one huge page so the base can be 2 MiB aligned (THP needs aligned extents).
  void* raw = mmap(nullptr, mapped + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED)
    return Status::resource_exhausted("NumaArena: cannot map " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
  auto addr = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = round_up(addr, kHugePage);
  if (aligned > addr) munmap(raw, aligned - addr);
  const std::uintptr_t end = aligned + mapped;
  const std::uintptr_t raw_end = addr + mapped + kHugePage;
  if (raw_end > end) munmap(reinterpret_cast<void*>(end), raw_end - end);
  void* base = reinterpret_cast<void*>(aligned);

  NumaArena arena;
  arena.base_ = base;
  arena.size_ = bytes;
  arena.mapped_ = mapped;
  arena.node_ = options.node;
  if (options.huge_pages) madvise(base, mapped, MADV_HUGEPAGE);  // advisory: ignore failure
  STRATA_RETURN_IF_ERROR(topo.bind_memory(base, mapped, options.node));

  // Pre-fault: first touch by threads on the node puts pages there even where binding is unavailable.
  const auto& cpus = topo.nodes()[static_cast<std::size_t>(options.node)].cpus;
  int threads = options.prefault_threads > 0 ? options.prefault_threads : static_cast<int>(cpus.size());
  threads = std::max(1, std::min<int>(threads, static_cast<int>(mapped / kHugePage)));
  const std::size_t chunk = round_up((mapped + static_cast<std::size_t>(threads) - 1) / static_cast<std::size_t>(threads), kHugePage);
  const long page = sysconf(_SC_PAGESIZE);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    const std::size_t lo = static_cast<std::size_t>(t) * chunk;
    const std::size_t hi = std::min(mapped, lo + chunk);
    if (lo >= hi) break;
    workers.emplace_back([&topo, node = options.node, base, lo, hi, page] {
      (void)topo.bind_current_thread(node);  // best effort: placement is already set by membind
      auto* p = static_cast<volatile char*>(base);
      for (std::size_t off = lo; off < hi; off += static_cast<std::size_t>(page)) p[off] = 0;
    });
  }
  for (auto& w : workers) w.join();

  Pinner* pinner = options.pinner ? options.pinner : &NoopPinner::instance();
  STRATA_RETURN_IF_ERROR(pinner->pin(base, mapped));
  arena.pinner_ = pinner;
  return arena;
}

NumaArena::NumaArena(NumaArena&& o) noexcept
    : base_(o.base_), size_(o.size_), mapped_(o.mapped_), node_(o.node_), pinner_(o.pinner_) {
  o.base_ = nullptr;
  o.size_ = o.mapped_ = 0;
  o.pinner_ = nullptr;
}

NumaArena& NumaArena::operator=(NumaArena&& o) noexcept {
  if (this != &o) {
    release();
    base_ = o.base_;
    size_ = o.size_;
    mapped_ = o.mapped_;
    node_ = o.node_;
    pinner_ = o.pinner_;
    o.base_ = nullptr;
    o.size_ = o.mapped_ = 0;
    o.pinner_ = nullptr;
  }
  return *this;
}

NumaArena::~NumaArena() { release(); }

void NumaArena::release() noexcept {
  if (!base_) return;
  if (pinner_) pinner_->unpin(base_, mapped_);
  munmap(base_, mapped_);
  base_ = nullptr;
}

}  // namespace strata
