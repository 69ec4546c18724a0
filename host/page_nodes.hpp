#pragma once
// Where pages of host memory lie: the NUMA node of a bounded sample of pages, as the kernel reports
// it (move_pages(2) with no target nodes moves nothing and returns each page's node). For StoreStats
// (each table's measured placement) and the tests that check where memory went.

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace strata {

/// The nodes of a sample of pages (plain values).
struct PageNodes {
  std::vector<std::pair<int, int>> nodes;  ///< (the OS's node number, -1 for an error; sampled pages on it), ascending
  int sampled = 0, unfaulted = 0;          ///< pages asked about; of them, not faulted in yet (on no node)
  std::string note;  ///< "" when the kernel answered; else why the nodes are unknown (a kernel without NUMA support)
};

/// Up to `max_pages` (> 0) pages evenly spaced over `ranges` (host memory: start and bytes of each part; the first and
/// last page among them), asked of the kernel in one call. Never fails: where the kernel or the container has no NUMA
/// support (move_pages fails: ENOSYS, EPERM), no nodes and a note. Thread-safe.
PageNodes sample_page_nodes(const std::vector<std::pair<const void*, std::size_t>>& ranges, int max_pages = 64);

/// The OS's node of the page holding `p` (host memory), or -errno: -ENOENT when it is not faulted in, -ENOSYS or -EPERM
/// without NUMA support.
int page_node(const void* p);

}  // namespace strata
