#include "host/numa_arena.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

namespace strata {

namespace {
constexpr std::size_t kHugePage = NumaArena::kGranularity;

std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

std::atomic<std::size_t> g_live_mapped{0};  // NumaArena::live_mapped_bytes()

// Where a region of `bytes` goes among the arenas of one key (`used`: bytes used per arena, in
// creation order): the first of the last ArenaPacker::kFitWindow arenas with room, else
// used.size() (a new arena). The window keeps placement O(1) per region with many arenas.
template <typename List, typename UsedOf>
std::size_t first_fit(const List& list, const UsedOf& used_of, std::size_t bytes) {
  const std::size_t n = list.size();
  for (std::size_t i = n > ArenaPacker::kFitWindow ? n - ArenaPacker::kFitWindow : 0; i < n; ++i)
    if (used_of(list[i]) + bytes <= ArenaPacker::kChunkBytes) return i;
  return n;
}
}  // namespace

std::size_t NumaArena::live_mapped_bytes() noexcept { return g_live_mapped.load(); }

Result<NumaArena> NumaArena::create(const Topology& topo, std::size_t bytes, const ArenaOptions& options) {
  if (bytes == 0) return Status::invalid_argument("NumaArena: size must be > 0");
  if (options.node < 0 || options.node >= topo.num_nodes())
    return Status::invalid_argument("NumaArena: node " + std::to_string(options.node) + " out of range [0, " +
                                    std::to_string(topo.num_nodes()) + ")");
  const std::size_t mapped = round_up(bytes, kHugePage);
  // Over-map by one huge page so the base can be 2 MiB aligned (THP needs aligned extents).
  void* raw =
      mmap(nullptr, mapped + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED)
    return Status::resource_exhausted("NumaArena: cannot map " + std::to_string(bytes) +
                                      " bytes: " + std::strerror(errno));
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
  const std::size_t chunk =
      round_up((mapped + static_cast<std::size_t>(threads) - 1) / static_cast<std::size_t>(threads), kHugePage);
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
  g_live_mapped.fetch_add(mapped);
  return arena;
}

namespace {
std::size_t page_bytes() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }
}  // namespace

Result<void*> map_on_node(const Topology& topo, std::size_t bytes, int node) {
  const std::size_t page = page_bytes();
  if (bytes == 0 || bytes > SIZE_MAX - page)
    return Status::resource_exhausted("map_on_node: cannot map " + std::to_string(bytes) + " bytes");
  const std::size_t len = round_up(bytes, page);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return Status::resource_exhausted("map_on_node: cannot map " + std::to_string(bytes) +
                                      " bytes: " + std::strerror(errno));
  const Status bound = topo.bind_memory(p, len, node);
  if (!bound.is_ok()) {
    munmap(p, len);
    return bound;
  }
  auto* bytes_at = static_cast<volatile char*>(p);
  for (std::size_t off = 0; off < len; off += page) bytes_at[off] = 0;
  return p;
}

void unmap_on_node(void* p, std::size_t bytes) noexcept {
  if (p) munmap(p, round_up(bytes, page_bytes()));
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
  if (pinner_) {
    // Only fully created arenas are pinned and counted (a failed create() unmaps without either).
    pinner_->unpin(base_, mapped_);
    g_live_mapped.fetch_sub(mapped_);
  }
  munmap(base_, mapped_);
  base_ = nullptr;
}

Result<ArenaRegion> ArenaPacker::allocate(const Topology& topo, std::size_t bytes, const ArenaOptions& options) {
  if (bytes == 0 || bytes > kChunkBytes)
    return Status::invalid_argument("ArenaPacker: region of " + std::to_string(bytes) + " bytes (expected 1 to " +
                                    std::to_string(kChunkBytes) + ")");
  const std::size_t need = round_up(bytes, kAlignment);
  const auto key = std::make_tuple(&topo, options.node, options.huge_pages, options.pinner);
  std::lock_guard<std::mutex> lock(m_);
  std::vector<Chunk>& chunks = chunks_[key];
  const std::size_t i = first_fit(
      chunks, [](const Chunk& c) { return c.used; }, need);
  if (i == chunks.size()) {
    auto arena = NumaArena::create(topo, kChunkBytes, options);
    if (!arena) return arena.status();
    chunks.push_back({std::make_shared<NumaArena>(std::move(arena).value()), 0});
  }
  Chunk& c = chunks[i];
  ArenaRegion r{c.arena, c.used, need};
  c.used += need;
  return r;
}

std::size_t ArenaPacker::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(m_);
  std::size_t n = 0;
  for (const auto& [key, chunks] : chunks_)
    for (const auto& c : chunks) n += c.arena->mapped_bytes();
  return n;
}

std::size_t ArenaPacker::Plan::place(std::uint64_t key, std::size_t bytes) {
  const std::size_t need = round_up(bytes, kAlignment);
  std::vector<std::size_t>& used = used_[key];
  const std::size_t i = first_fit(
      used, [](std::size_t u) { return u; }, need);
  std::size_t added = 0;
  if (i == used.size()) {
    used.push_back(0);
    added = kChunkBytes;
    mapped_ += added;
  }
  used[i] += need;
  return added;
}

}  // namespace strata
