#include "host/page_nodes.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>

namespace strata {
namespace {

// move_pages(2) with nodes null: fills status with each page's node or -errno; -1 and errno when the
// call itself fails. Through syscall(2): no libnuma.
long query_pages(std::size_t n, const void** pages, int* status) {
  return syscall(SYS_move_pages, 0, n, pages, nullptr, status, 0);
}

}  // namespace

PageNodes sample_page_nodes(const std::vector<std::pair<const void*, std::size_t>>& ranges, int max_pages) {
  PageNodes out;
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  // Each range's first page and page count, and the pages of all of them.
  std::vector<std::pair<std::uintptr_t, std::size_t>> spans;
  std::size_t total = 0;
  for (const auto& [start, bytes] : ranges) {
    if (!start || bytes == 0) continue;
    const auto lo = reinterpret_cast<std::uintptr_t>(start) / page * page;
    const std::size_t n = (reinterpret_cast<std::uintptr_t>(start) + bytes - lo + page - 1) / page;
    spans.emplace_back(lo, n);
    total += n;
  }
  const std::size_t want = std::min<std::size_t>(total, static_cast<std::size_t>(std::max(max_pages, 1)));
  if (want == 0) return out;
  std::vector<const void*> pages;
  pages.reserve(want);
  std::size_t span = 0, before = 0;  // pages of the spans before `span`
  for (std::size_t i = 0; i < want; ++i) {
    const std::size_t k = want == 1 ? 0 : i * (total - 1) / (want - 1);  // evenly spaced, first and last included
    while (k >= before + spans[span].second) before += spans[span++].second;
    pages.push_back(reinterpret_cast<const void*>(spans[span].first + (k - before) * page));
  }
  std::vector<int> status(want, 0);
  out.sampled = static_cast<int>(want);
  if (query_pages(want, pages.data(), status.data()) != 0) {
    const int err = errno;
    out.note = std::string("unknown: move_pages failed (") + std::strerror(err) +
               (err == ENOSYS || err == EPERM ? "): no NUMA support in this kernel or container" : ")");
    return out;
  }
  std::map<int, int> on;
  for (const int s : status) {
    if (s == -ENOENT)
      ++out.unfaulted;
    else
      ++on[s < 0 ? -1 : s];
  }
  out.nodes.assign(on.begin(), on.end());
  return out;
}

int page_node(const void* p) {
  int status = 0;
  if (query_pages(1, &p, &status) != 0) return -errno;
  return status;
}

}  // namespace strata
