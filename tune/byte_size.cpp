#include "tune/byte_size.hpp"

#include <cctype>
#include <cmath>
#include <cstdlib>

namespace strata::tune {

Result<double> parse_byte_size(const std::string& text, const std::string& flag) {
  const auto bad = [&] {
    return Status::invalid_argument(flag + " '" + text + "': expected a size like 80GB, 512MiB or 1e9");
  };
  const char* begin = text.c_str();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(v) || v < 0) return bad();
  std::string unit;
  for (const char* c = end; *c; ++c)
    if (!std::isspace(static_cast<unsigned char>(*c)))
      unit += static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
  struct Unit {
    const char* name;
    double scale;
  };
  static const Unit kUnits[] = {{"", 1},
                                {"b", 1},
                                {"k", 1e3},
                                {"kb", 1e3},
                                {"m", 1e6},
                                {"mb", 1e6},
                                {"g", 1e9},
                                {"gb", 1e9},
                                {"t", 1e12},
                                {"tb", 1e12},
                                {"kib", 1024.0},
                                {"mib", 1048576.0},
                                {"gib", 1073741824.0},
                                {"tib", 1099511627776.0}};
  for (const Unit& u : kUnits)
    if (unit == u.name) return v * u.scale;
  return bad();
}

}  // namespace strata::tune
