#include "toolkit/cli_flags.hpp"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>

#include "toolkit/bounded_input.hpp"

namespace strata::bench {
namespace {

// The magnitude and sign of a plain decimal integer ("-"? digits), or nullopt for any other text
// or a magnitude of 2^64 and beyond.
struct Decimal {
  bool negative = false;
  std::uint64_t magnitude = 0;
};

std::optional<Decimal> decimal(const std::string& text) noexcept {
  Decimal d;
  std::size_t i = 0;
  if (!text.empty() && text[0] == '-') {
    d.negative = true;
    i = 1;
  }
  if (i == text.size()) return std::nullopt;
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c < '0' || c > '9') return std::nullopt;
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (d.magnitude > (kMax - digit) / 10) return std::nullopt;
    d.magnitude = d.magnitude * 10 + digit;
  }
  return d;
}

std::string not_an_integer(const std::string& text, const std::string& lo, const std::string& hi) {
  return "'" + quote_prefix(text) + "' is not an integer in [" + lo + ", " + hi + "]";
}

}  // namespace

Result<std::int64_t> parse_integer(const std::string& text, std::int64_t lo, std::int64_t hi) {
  const auto bad = [&] {
    return Status::invalid_argument(not_an_integer(text, std::to_string(lo), std::to_string(hi)));
  };
  const std::optional<Decimal> d = decimal(text);
  if (!d) return bad();
  // |INT64_MIN| = INT64_MAX + 1 is the largest magnitude any int64 has.
  constexpr auto kMaxMagnitude = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (d->magnitude > kMaxMagnitude + (d->negative ? 1 : 0)) return bad();
  const std::int64_t v = d->negative ? static_cast<std::int64_t>(0 - d->magnitude)  // two's complement
                                     : static_cast<std::int64_t>(d->magnitude);
  if (v < lo || v > hi) return bad();
  return v;
}

Result<std::uint64_t> parse_unsigned(const std::string& text, std::uint64_t hi) {
  const std::optional<Decimal> d = decimal(text);
  if (!d || (d->negative && d->magnitude != 0) || d->magnitude > hi)
    return Status::invalid_argument(not_an_integer(text, "0", std::to_string(hi)));
  return d->magnitude;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  if (text.empty()) return items;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t comma = text.find(',', begin);
    items.push_back(text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    if (comma == std::string::npos) return items;
    begin = comma + 1;
  }
}

Result<std::vector<std::int64_t>> parse_integer_list(const std::string& text, std::int64_t lo, std::int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  const std::vector<std::string> items = split_list(text);
  if (items.empty())
    return Status::invalid_argument("'': no items (expected a comma-separated list of integers in " + range + ")");
  std::vector<std::int64_t> out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const Result<std::int64_t> v = parse_integer(items[i], lo, hi);
    if (!v)
      return Status::invalid_argument("'" + quote_prefix(text) + "': item " + std::to_string(i + 1) + " '" +
                                      quote_prefix(items[i]) + "' is not an integer in " + range +
                                      (items[i].empty() ? " (an empty item is refused, not dropped)" : ""));
    out.push_back(*v);
  }
  return out;
}

CLI::Validator integer_in(std::int64_t lo, std::int64_t hi, const std::string& desc) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        const Result<std::int64_t> v = parse_integer(text, lo, hi);
        if (!v) return v.status().message();
        text = std::to_string(*v);
        return "";
      },
      desc.empty() ? "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]" : desc);
}

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv, const std::string& program) {
  app.failure_message([program](const CLI::App*, const CLI::Error& e) {
    return program + ": " + e.what() + " (run with --help for the usage)\n";
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return std::nullopt;
}

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

}  // namespace strata::bench
