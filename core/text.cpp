#include "core/text.hpp"

#include <cstdio>
#include <cstdlib>

namespace strata {

std::size_t utf8_cut(const std::string& s, std::size_t n) noexcept {
  if (n >= s.size()) return s.size();
  // s[n] starts the part cut off: back over the continuation bytes (10xxxxxx) of its character.
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}

std::string quote_prefix(const std::string& s, std::size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  return s.substr(0, utf8_cut(s, max_bytes > 3 ? max_bytes - 3 : 0)) + "...";
}

std::string number_text(double d) {
  char buf[40];
  const float f = static_cast<float>(d);
  if (static_cast<double>(f) == d) {
    for (int p = 1; p <= 9; ++p) {
      std::snprintf(buf, sizeof(buf), "%.*g", p, static_cast<double>(f));
      if (std::strtof(buf, nullptr) == f) return buf;
    }
  }
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof(buf), "%.*g", p, d);
    if (std::strtod(buf, nullptr) == d) return buf;
  }
  return buf;
}

}  // namespace strata
