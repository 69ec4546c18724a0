#include "core/text.hpp"

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

}  // namespace strata
