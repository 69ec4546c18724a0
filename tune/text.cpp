#include "tune/text.hpp"

#include <cstdio>

namespace strata::tune {

std::string bytes_text(double bytes) {
  static const char* const kUnits[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (u < 5 && bytes >= 1000.0) {
    bytes /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g %s", bytes, kUnits[u]);
  return buf;
}

std::string percent_text(double fraction) {
  if (fraction < 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * fraction);
  return buf;
}

std::string ms_text(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g ms", seconds * 1e3);
  return buf;
}

}  // namespace strata::tune
