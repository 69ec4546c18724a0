#include "toolkit/workload.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "toolkit/bounded_input.hpp"
#include "toolkit/probe_util.hpp"

namespace strata::bench {
namespace {

// ---- small hashing / RNG helpers ----

std::uint64_t splitmix64(std::uint64_t& x) noexcept {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A stateless 64-bit mixer (the splitmix64 finalizer); a good Feistel round function.
std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::uint64_t mix2(std::uint64_t a, std::uint64_t b) noexcept { return mix64(a ^ mix64(b + 0x9e3779b97f4a7c15ull)); }

std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }

std::uint64_t low_mask(int bits) noexcept { return bits >= 64 ? ~0ull : ((1ull << bits) - 1); }

// log1p(x)/x and expm1(x)/x, continuous at 0 (needed so alpha == 1 needs no special case).
double helper1(double x) noexcept {
  if (std::fabs(x) > 1e-8) return std::log1p(x) / x;
  return 1.0 - x * (0.5 - x * (1.0 / 3.0 - x * 0.25));
}
double helper2(double x) noexcept {
  if (std::fabs(x) > 1e-8) return std::expm1(x) / x;
  return 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + x * 0.25));
}

// ---- JSON field readers ----

const char* json_type(const nlohmann::json& v) noexcept { return v.type_name(); }

Result<std::int64_t> json_integer(const std::string& key, const nlohmann::json& v, std::int64_t lo, std::int64_t hi) {
  std::int64_t x = 0;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return Status::invalid_argument("workload key '" + key + "': " + std::to_string(u) + " is too large");
    x = static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<std::int64_t>();
  } else if (v.is_number_float()) {
    // Accept integral floats so "rows": 1e8 works.
    const double d = v.get<double>();
    if (!(std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18))
      return Status::invalid_argument("workload key '" + key + "' must be an integer (got " + json_excerpt(v) + ")");
    x = static_cast<std::int64_t>(d);
  } else {
    return Status::invalid_argument("workload key '" + key + "' must be an integer (got " + json_type(v) + " " +
                                    json_excerpt(v) + ")");
  }
  if (x < lo || x > hi)
    return Status::invalid_argument("workload key '" + key + "': " + std::to_string(x) + " out of range [" +
                                    std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

// A plain decimal integer in [1, max] (no sign, no exponent, no spaces), or nullopt.
std::optional<std::int64_t> positive_decimal(const std::string& s, std::int64_t max) noexcept {
  if (s.empty() || s.size() > 19) return std::nullopt;
  std::int64_t v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  if (v < 1 || v > max) return std::nullopt;
  return v;
}

constexpr std::int64_t kIntMin = std::numeric_limits<int>::min();
constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
constexpr std::int64_t kI64Min = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();

// ---- little-endian writer ----

class RawWriter {
 public:
  explicit RawWriter(std::FILE* f) : f_(f) {}
  bool ok() const noexcept { return ok_; }
  void bytes(const void* p, std::size_t n) {
    if (ok_ && n > 0 && std::fwrite(p, 1, n, f_) != n) ok_ = false;
  }
  void u32(std::uint32_t v) {
    unsigned char b[4];
    for (int i = 0; i < 4; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    bytes(b, 4);
  }
  void u64(std::uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    bytes(b, 8);
  }
  void i64_array(const std::int64_t* p, std::size_t n) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    bytes(p, n * sizeof(std::int64_t));  // already in file order
#else
    for (std::size_t i = 0; i < n; ++i) u64(static_cast<std::uint64_t>(p[i]));
#endif
  }

 private:
  std::FILE* f_;
  bool ok_ = true;
};

struct FileCloser {
  void operator()(std::FILE* f) const noexcept {
    if (f) std::fclose(f);
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// WorkloadSpec

Result<Distribution> parse_distribution(const std::string& s) {
  const auto unknown = [&] {
    return Status::invalid_argument("unknown distribution '" + s + "' (expected uniform, zipf:ALPHA or drift:ALPHA:N)");
  };
  if (s == "uniform") return Distribution{Distribution::Kind::kUniform, 0.0, 0};
  const std::string zipf = "zipf:";
  const std::string drift = "drift:";
  const bool is_zipf = s.compare(0, zipf.size(), zipf) == 0;
  const bool is_drift = s.compare(0, drift.size(), drift) == 0;
  if (!is_zipf && !is_drift) return unknown();
  const char* begin = s.c_str() + (is_zipf ? zipf.size() : drift.size());
  char* end = nullptr;
  errno = 0;
  const double alpha = std::strtod(begin, &end);
  if (end == begin || errno == ERANGE || !std::isfinite(alpha) || !(alpha > 0.0)) return unknown();
  if (is_zipf) {
    if (*end != '\0') return unknown();
    return Distribution{Distribution::Kind::kZipf, alpha, 0};
  }
  // drift: ":N" with N a plain decimal integer >= 1 (no sign, no exponent).
  if (*end != ':') return unknown();
  const char* n_begin = end + 1;
  if (*n_begin < '0' || *n_begin > '9') return unknown();
  errno = 0;
  char* n_end = nullptr;
  const long long n = std::strtoll(n_begin, &n_end, 10);
  if (*n_end != '\0' || errno == ERANGE || n < 1) return unknown();
  return Distribution{Distribution::Kind::kDrift, alpha, static_cast<std::int64_t>(n)};
}

Result<BagDist> parse_bag_dist(const std::string& s) {
  if (s == "fixed") return BagDist::kFixed;
  if (s == "uniform") return BagDist::kUniform;
  return Status::invalid_argument("unknown bag length distribution '" + s + "' (expected fixed or uniform)");
}

Status validate(const WorkloadSpec& s) {
  if (s.table_list.empty()) {
    if (s.tables < 1) return Status::invalid_argument("workload: tables " + std::to_string(s.tables) + " must be >= 1");
    if (s.tables > kMaxWorkloadTables)
      return Status::invalid_argument("workload: tables " + std::to_string(s.tables) + " is over the limit of " +
                                      std::to_string(kMaxWorkloadTables) + " (expected 1.." +
                                      std::to_string(kMaxWorkloadTables) + ")");
    if (s.rows <= 0) return Status::invalid_argument("workload: rows " + std::to_string(s.rows) + " must be > 0");
    if (s.dim <= 0) return Status::invalid_argument("workload: dim " + std::to_string(s.dim) + " must be > 0");
  } else {
    if (s.table_list.size() > static_cast<std::size_t>(kMaxWorkloadTables))
      return Status::invalid_argument("workload: " + std::to_string(s.table_list.size()) +
                                      " tables, over the limit of " + std::to_string(kMaxWorkloadTables));
    std::set<std::string> names;
    for (std::size_t i = 0; i < s.table_list.size(); ++i) {
      const TableShape& t = s.table_list[i];
      const std::string who = "workload: table " + std::to_string(i) + " '" + quote_prefix(t.name) + "'";
      if (Status named = validate_table_name(t.name); !named.is_ok())
        return Status::invalid_argument(who + ": " + named.message());
      if (!names.insert(t.name).second)
        return Status::invalid_argument(who + ": name used twice (expected unique names)");
      if (t.rows <= 0) return Status::invalid_argument(who + ": rows " + std::to_string(t.rows) + " must be > 0");
      if (t.dim <= 0) return Status::invalid_argument(who + ": dim " + std::to_string(t.dim) + " must be > 0");
    }
  }
  if (s.batch <= 0) return Status::invalid_argument("workload: batch " + std::to_string(s.batch) + " must be > 0");
  if (s.bag_size < 0)
    return Status::invalid_argument("workload: bag_size " + std::to_string(s.bag_size) + " must be >= 0");
  if (s.distinct_batches < 1)
    return Status::invalid_argument("workload: distinct_batches " + std::to_string(s.distinct_batches) +
                                    " must be >= 1");
  if (s.batch > kI64Max / std::max(1, s.bag_size))
    return Status::invalid_argument("workload: batch " + std::to_string(s.batch) + " x bag_size " +
                                    std::to_string(s.bag_size) + " overflows the key count");
  auto d = parse_distribution(s.dist);
  if (!d.is_ok()) return d.status().with_context("workload");
  auto bd = parse_bag_dist(s.bag_dist);
  if (!bd.is_ok()) return bd.status().with_context("workload");
  // Uniform bag lengths reach 2 * bag_size, so the key count can reach twice batch x bag_size.
  if (*bd == BagDist::kUniform && s.bag_size > 0 && s.batch > kI64Max / 2 / s.bag_size)
    return Status::invalid_argument("workload: batch " + std::to_string(s.batch) + " x 2 x bag_size " +
                                    std::to_string(s.bag_size) + " overflows the key count (bag_dist uniform)");
  return Status::ok();
}

double max_batch_keys(const WorkloadSpec& s) {
  const double keys_per_bag = s.bag_dist == "uniform" ? 2.0 * s.bag_size : s.bag_size;
  const double tables = s.table_list.empty() ? s.tables : static_cast<double>(s.table_list.size());
  return tables * static_cast<double>(s.batch) * keys_per_bag;
}

double max_batch_bytes(const WorkloadSpec& s) {
  const double tables = s.table_list.empty() ? s.tables : static_cast<double>(s.table_list.size());
  return (max_batch_keys(s) + tables * (static_cast<double>(s.batch) + 1.0)) * 8.0;
}

Result<WorkloadSpec> parse_workload_json(const std::string& json_text) {
  STRATA_ASSIGN_OR_RETURN(const nlohmann::json j, parse_json_limited(json_text, "workload"));
  if (!j.is_object())
    return Status::invalid_argument(std::string("workload: expected a JSON object, got ") + json_type(j));
  WorkloadSpec s;
  std::optional<std::string> table_set;         // "tables" as a string, resolved once "dim" is known
  const nlohmann::json* table_array = nullptr;  // "tables" as an array, likewise
  for (const auto& [key, v] : j.items()) {
    if (key == "tables") {
      if (v.is_string()) {
        table_set = v.get<std::string>();
      } else if (v.is_array()) {
        table_array = &v;
      } else if (v.is_number()) {
        STRATA_ASSIGN_OR_RETURN(auto x, json_integer(key, v, kIntMin, kIntMax));
        s.tables = static_cast<int>(x);
      } else {
        return Status::invalid_argument(std::string("workload key 'tables' must be an integer, a string or an array "
                                                    "of {\"name\", \"rows\", \"dim\"} objects (got ") +
                                        json_type(v) + " " + json_excerpt(v) + ")");
      }
    } else if (key == "rows") {
      STRATA_ASSIGN_OR_RETURN(s.rows, json_integer(key, v, kI64Min, kI64Max));
    } else if (key == "dim") {
      STRATA_ASSIGN_OR_RETURN(auto x, json_integer(key, v, kIntMin, kIntMax));
      s.dim = static_cast<int>(x);
    } else if (key == "batch") {
      STRATA_ASSIGN_OR_RETURN(s.batch, json_integer(key, v, kI64Min, kI64Max));
    } else if (key == "bag_size") {
      STRATA_ASSIGN_OR_RETURN(auto x, json_integer(key, v, kIntMin, kIntMax));
      s.bag_size = static_cast<int>(x);
    } else if (key == "bag_dist") {
      if (!v.is_string())
        return Status::invalid_argument(std::string("workload key 'bag_dist' must be a string (got ") + json_type(v) +
                                        " " + json_excerpt(v) + ")");
      s.bag_dist = v.get<std::string>();
    } else if (key == "dist") {
      if (!v.is_string())
        return Status::invalid_argument(std::string("workload key 'dist' must be a string (got ") + json_type(v) + " " +
                                        json_excerpt(v) + ")");
      s.dist = v.get<std::string>();
    } else if (key == "seed") {
      if (v.is_number_unsigned()) {
        s.seed = v.get<std::uint64_t>();
      } else {
        STRATA_ASSIGN_OR_RETURN(auto x, json_integer(key, v, 0, kI64Max));
        s.seed = static_cast<std::uint64_t>(x);
      }
    } else if (key == "distinct_batches") {
      STRATA_ASSIGN_OR_RETURN(auto x, json_integer(key, v, kIntMin, kIntMax));
      s.distinct_batches = static_cast<int>(x);
    } else {
      return Status::invalid_argument("unknown workload key '" + key +
                                      "' (expected tables, rows, dim, batch, bag_size, bag_dist, dist, seed, "
                                      "distinct_batches)");
    }
  }
  if ((table_set || table_array) && j.contains("rows"))
    return Status::invalid_argument(
        "workload key 'rows' is unused when 'tables' names the tables (give each "
        "table its rows, or make 'tables' an integer)");
  if (table_set) STRATA_RETURN_IF_ERROR(apply_table_set(s, *table_set).with_context("workload key 'tables'"));
  if (table_array) {
    if (table_array->empty())
      return Status::invalid_argument("workload key 'tables': the array is empty (expected at least one table)");
    if (table_array->size() > static_cast<std::size_t>(kMaxWorkloadTables))
      return Status::invalid_argument("workload key 'tables': the array has " + std::to_string(table_array->size()) +
                                      " tables, over the limit of " + std::to_string(kMaxWorkloadTables));
    std::vector<TableShape> list;
    for (std::size_t i = 0; i < table_array->size(); ++i) {
      const nlohmann::json& t = (*table_array)[i];
      const std::string who = "tables[" + std::to_string(i) + "]";
      if (!t.is_object())
        return Status::invalid_argument("workload key '" + who +
                                        "' must be an object {\"name\", \"rows\", \"dim\"} (got " + json_type(t) + " " +
                                        json_excerpt(t) + ")");
      TableShape shape{"t" + std::to_string(i), 0, s.dim};
      bool has_rows = false;
      for (const auto& [k, x] : t.items()) {
        if (k == "name") {
          if (!x.is_string())
            return Status::invalid_argument("workload key '" + who + ".name' must be a string (got " + json_type(x) +
                                            " " + json_excerpt(x) + ")");
          shape.name = x.get<std::string>();
        } else if (k == "rows") {
          STRATA_ASSIGN_OR_RETURN(shape.rows, json_integer(who + ".rows", x, kI64Min, kI64Max));
          has_rows = true;
        } else if (k == "dim") {
          STRATA_ASSIGN_OR_RETURN(auto d, json_integer(who + ".dim", x, kIntMin, kIntMax));
          shape.dim = static_cast<int>(d);
        } else {
          return Status::invalid_argument("unknown workload key '" + who + "." + k + "' (expected name, rows, dim)");
        }
      }
      if (!has_rows) return Status::invalid_argument("workload key '" + who + "' has no \"rows\"");
      list.push_back(std::move(shape));
    }
    s.table_list = std::move(list);
    s.tables = static_cast<int>(s.table_list.size());
  }
  STRATA_RETURN_IF_ERROR(validate(s));
  return s;
}

std::string workload_to_json(const WorkloadSpec& s) {
  nlohmann::json j;
  if (s.table_list.empty()) {
    j["tables"] = s.tables;
    j["rows"] = s.rows;
    j["dim"] = s.dim;
  } else {
    j["tables"] = nlohmann::json::array();
    for (const TableShape& t : s.table_list)
      j["tables"].push_back({{"name", t.name}, {"rows", t.rows}, {"dim", t.dim}});
  }
  j["batch"] = s.batch;
  j["bag_size"] = s.bag_size;
  j["bag_dist"] = s.bag_dist;
  j["dist"] = s.dist;
  j["seed"] = s.seed;
  j["distinct_batches"] = s.distinct_batches;
  return j.dump();
}

Status apply_table_set(WorkloadSpec& spec, const std::string& set) {
  constexpr const char* kExpected = "expected N, criteo, criteo:TOTAL_ROWS or [NAME=]ROWS[xDIM],...";
  if (set.empty()) return Status::invalid_argument(std::string("empty table set (") + kExpected + ")");
  if (const auto n = positive_decimal(set, kI64Max)) {
    if (*n > kMaxWorkloadTables)
      return Status::invalid_argument("table set '" + set + "': " + std::to_string(*n) + " tables, over the limit of " +
                                      std::to_string(kMaxWorkloadTables) + " (expected 1.." +
                                      std::to_string(kMaxWorkloadTables) + ")");
    spec.tables = static_cast<int>(*n);
    spec.table_list.clear();
    return Status::ok();
  }
  if (set == "criteo" || set.rfind("criteo:", 0) == 0) {
    std::int64_t total = kCriteoDefaultMaxRows;
    if (set != "criteo") {
      const auto t = positive_decimal(set.substr(7), kI64Max);
      if (!t)
        return Status::invalid_argument("table set '" + set + "': TOTAL_ROWS '" + set.substr(7) +
                                        "' is not a positive integer (" + kExpected + ")");
      total = *t;
    }
    STRATA_ASSIGN_OR_RETURN(std::vector<TableSpec> tables, criteo_default_tables(total, spec.dim));
    std::vector<TableShape> list;
    for (const TableSpec& t : tables) list.push_back({t.name, t.rows, t.dim});
    spec.table_list = std::move(list);
    spec.tables = static_cast<int>(spec.table_list.size());
    return Status::ok();
  }
  // Count the items before building any of them.
  if (const auto items = static_cast<std::int64_t>(std::count(set.begin(), set.end(), ',')) + 1;
      items > kMaxWorkloadTables)
    return Status::invalid_argument("table list of " + std::to_string(items) + " items: over the limit of " +
                                    std::to_string(kMaxWorkloadTables) + " tables");
  std::vector<TableShape> list;
  std::size_t begin = 0;
  for (int index = 0;; ++index) {
    const std::size_t comma = set.find(',', begin);
    const std::string item = set.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    const std::string who = "table list item " + std::to_string(index) + " '" + quote_prefix(item) + "'";
    const std::string form = " (expected [NAME=]ROWS[xDIM], e.g. user=1000000x128)";
    TableShape t{"t" + std::to_string(index), 0, spec.dim};
    std::string shape = item;
    if (const std::size_t eq = item.find('='); eq != std::string::npos) {
      t.name = item.substr(0, eq);
      if (Status named = validate_table_name(t.name); !named.is_ok())
        return Status::invalid_argument(who + ": " + named.message() + form);
      shape = item.substr(eq + 1);
    }
    const std::size_t x = shape.find('x');
    const std::string rows = shape.substr(0, x);
    const auto r = positive_decimal(rows, kI64Max);
    if (!r) return Status::invalid_argument(who + ": rows '" + rows + "' is not a positive integer" + form);
    t.rows = *r;
    if (x != std::string::npos) {
      const std::string dim = shape.substr(x + 1);
      const auto d = positive_decimal(dim, kIntMax);
      if (!d) return Status::invalid_argument(who + ": dim '" + dim + "' is not a positive integer" + form);
      t.dim = static_cast<int>(*d);
    }
    for (const TableShape& other : list)
      if (other.name == t.name) return Status::invalid_argument(who + ": table name '" + t.name + "' used twice");
    list.push_back(std::move(t));
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  spec.table_list = std::move(list);
  spec.tables = static_cast<int>(spec.table_list.size());
  return Status::ok();
}

std::vector<TableShape> workload_tables(const WorkloadSpec& spec) {
  if (!spec.table_list.empty()) return spec.table_list;
  std::vector<TableShape> out;
  for (int t = 0; t < spec.tables; ++t) out.push_back({"t" + std::to_string(t), spec.rows, spec.dim});
  return out;
}

// ---------------------------------------------------------------------------------------------
// RowPermutation

RowPermutation::RowPermutation(std::int64_t n, std::uint64_t seed) : n_(n), bits_(2) {
  STRATA_CHECK(n >= 1);
  while (bits_ < 63 && (std::int64_t{1} << bits_) < n) ++bits_;
  std::uint64_t sm = seed ^ 0x5bd1e9955bd1e995ull;
  for (auto& k : keys_) k = splitmix64(sm);
}

std::uint64_t RowPermutation::network(std::uint64_t x) const noexcept {
  // Unbalanced Feistel over `bits_` bits: each round maps (hi, lo) -> (lo, hi ^ F(lo)) and the
  // halves swap widths, so every round is a bijection of [0, 2^bits_) even when bits_ is odd.
  int lo_bits = bits_ - bits_ / 2;
  for (const std::uint64_t key : keys_) {
    const int hi_bits = bits_ - lo_bits;
    const std::uint64_t hi = x >> lo_bits;
    const std::uint64_t lo = x & low_mask(lo_bits);
    const std::uint64_t f = mix64(lo ^ key) & low_mask(hi_bits);
    x = (lo << hi_bits) | (hi ^ f);
    lo_bits = hi_bits;
  }
  return x;
}

std::int64_t RowPermutation::operator()(std::int64_t x) const noexcept {
  // Cycle-walking: the network permutes [0, 2^bits_) with 2^bits_ < 2n (n >= 3), so following
  // the cycle until it re-enters [0, n) restricts it to a bijection of [0, n).
  std::uint64_t y = static_cast<std::uint64_t>(x);
  do {
    y = network(y);
  } while (y >= static_cast<std::uint64_t>(n_));
  return static_cast<std::int64_t>(y);
}

// ---------------------------------------------------------------------------------------------
// KeySampler

KeySampler::KeySampler(Distribution dist, std::int64_t rows, std::uint64_t seed)
    : dist_(dist),
      rows_(rows),
      seed_(seed),
      perm_seed_(mix2(seed, 0x7065726d75746174ull /* "permutat" */)),
      perm_(rows, perm_seed_) {
  if (dist_.kind != Distribution::Kind::kUniform) {
    // Hörmann & Derflinger (1996), "Rejection-inversion to generate variates from monotone
    // discrete distributions", with H(x) = ((x)^(1-a) - 1) / (1-a) (log x at a == 1) as the
    // integral of the hat function h(x) = x^-a, as in Apache Commons' ZipfRejectionInversionSampler.
    h_integral_x1_ = h_integral(1.5) - 1.0;
    h_integral_n_ = h_integral(static_cast<double>(rows_) + 0.5);
    s_ = 2.0 - h_integral_inverse(h_integral(2.5) - h(2.0));
  }
  set_stream(0);
}

Result<KeySampler> KeySampler::create(const std::string& dist, std::int64_t rows, std::uint64_t seed) {
  STRATA_ASSIGN_OR_RETURN(Distribution d, parse_distribution(dist));
  if (rows <= 0) return Status::invalid_argument("key sampler: rows " + std::to_string(rows) + " must be > 0");
  return KeySampler(d, rows, seed);
}

void KeySampler::set_step(std::int64_t step) noexcept {
  if (dist_.kind != Distribution::Kind::kDrift) return;
  const std::int64_t epoch = std::max<std::int64_t>(step, 0) / dist_.drift_steps;
  if (epoch == epoch_) return;
  epoch_ = epoch;
  // Epoch 0 keeps the zipf permutation; each later epoch gets an independent key schedule, so the
  // hot rows of consecutive epochs are unrelated (the popularity of a row shifts abruptly).
  perm_ = RowPermutation(rows_, epoch == 0 ? perm_seed_ : mix2(perm_seed_, static_cast<std::uint64_t>(epoch)));
}

void KeySampler::set_stream(std::uint64_t stream) noexcept {
  std::uint64_t sm = mix2(seed_, stream);
  for (auto& s : state_) s = splitmix64(sm);
  // xoshiro must not start from the all-zero state (splitmix64 makes that practically impossible).
  if ((state_[0] | state_[1] | state_[2] | state_[3]) == 0) state_[0] = 1;
}

std::uint64_t KeySampler::next_u64() noexcept {
  // xoshiro256** (Blackman & Vigna).
  const std::uint64_t result = rotl(state_[1] * 5, 7) * 9;
  const std::uint64_t t = state_[1] << 17;
  state_[2] ^= state_[0];
  state_[3] ^= state_[1];
  state_[1] ^= state_[2];
  state_[0] ^= state_[3];
  state_[2] ^= t;
  state_[3] = rotl(state_[3], 45);
  return result;
}

double KeySampler::next_unit() noexcept { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

std::int64_t KeySampler::next_below(std::uint64_t range) noexcept {
  // Lemire's nearly divisionless multiply-shift with rejection: exactly uniform.
  unsigned __int128 m = static_cast<unsigned __int128>(next_u64()) * range;
  auto low = static_cast<std::uint64_t>(m);
  if (low < range) {
    const std::uint64_t threshold = (0 - range) % range;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(next_u64()) * range;
      low = static_cast<std::uint64_t>(m);
    }
  }
  return static_cast<std::int64_t>(m >> 64);
}

double KeySampler::h(double x) const noexcept { return std::exp(-dist_.alpha * std::log(x)); }

double KeySampler::h_integral(double x) const noexcept {
  const double log_x = std::log(x);
  return helper2((1.0 - dist_.alpha) * log_x) * log_x;
}

double KeySampler::h_integral_inverse(double x) const noexcept {
  double t = x * (1.0 - dist_.alpha);
  if (t < -1.0) t = -1.0;  // rounding can push t just below the domain of log1p
  return std::exp(helper1(t) * x);
}

std::int64_t KeySampler::next_zipf_rank() noexcept {
  for (;;) {
    // u uniform in (H(1.5) - 1, H(rows + 0.5)]
    const double u = h_integral_n_ + next_unit() * (h_integral_x1_ - h_integral_n_);
    const double x = h_integral_inverse(u);
    double kd = std::floor(x + 0.5);
    // Clamp: rounding can put x just outside [0.5, rows + 0.5].
    kd = std::min(std::max(kd, 1.0), static_cast<double>(rows_));
    // Accept if k is in the squeeze region, or under the hat: P(k) = H(k+.5) - H(k-.5) exactly.
    if (kd - x <= s_ || u >= h_integral(kd + 0.5) - h(kd)) return static_cast<std::int64_t>(kd) - 1;
  }
}

std::int64_t KeySampler::next_rank() noexcept {
  if (dist_.kind != Distribution::Kind::kUniform) return next_zipf_rank();
  return next_below(static_cast<std::uint64_t>(rows_));
}

void KeySampler::fill(Key* out, std::int64_t n) noexcept {
  for (std::int64_t i = 0; i < n; ++i) out[i] = next();
}

// ---------------------------------------------------------------------------------------------
// Batches

std::vector<KeyBatch> make_batches(const WorkloadSpec& spec, const std::vector<std::string>& table_names, int threads) {
  {
    const Status st = validate(spec);
    if (!st.is_ok()) {
      std::fprintf(stderr, "strata: make_batches: %s\n", st.to_string().c_str());
      std::abort();
    }
  }
  const std::vector<TableShape> shapes = workload_tables(spec);
  STRATA_CHECK(table_names.size() == shapes.size());
  const auto num_tables = static_cast<std::int64_t>(shapes.size());
  const BagDist bag_dist = parse_bag_dist(spec.bag_dist).value();

  // Bags per chunk: the unit of work and of random streams, fixed so results are independent of
  // the thread count.
  constexpr std::int64_t kChunkBags = 1024;
  const std::int64_t chunks_per_feature = (spec.batch + kChunkBags - 1) / kChunkBags;

  std::vector<KeySampler> prototypes;
  prototypes.reserve(table_names.size());
  for (std::size_t t = 0; t < table_names.size(); ++t) {
    auto s = KeySampler::create(spec.dist, shapes[t].rows, mix2(spec.seed, table_name_hash(table_names[t])));
    STRATA_CHECK(s.is_ok());
    prototypes.push_back(std::move(s).value());
  }

  std::vector<KeyBatch> batches(static_cast<std::size_t>(spec.distinct_batches));
  for (auto& b : batches) {
    b.features.resize(table_names.size());
    for (std::size_t t = 0; t < table_names.size(); ++t) {
      JaggedKeys& f = b.features[t];
      f.table = table_names[t];
      f.offsets.resize(static_cast<std::size_t>(spec.batch) + 1);
      for (std::int64_t i = 0; i <= spec.batch; ++i) f.offsets[static_cast<std::size_t>(i)] = i * spec.bag_size;
    }
  }
  if (bag_dist == BagDist::kUniform) {
    // Lengths come from a sampler of their own (uniform over [0, 2 * bag_size]), one stream per
    // batch, so they do not depend on the thread count and do not disturb the key streams.
    for (std::size_t t = 0; t < table_names.size(); ++t) {
      auto lens = KeySampler::create(
          "uniform", 2 * static_cast<std::int64_t>(spec.bag_size) + 1,
          mix2(mix2(spec.seed, table_name_hash(table_names[t])), 0x6261675f6c656e73ull /* "bag_lens" */));
      STRATA_CHECK(lens.is_ok());
      for (std::size_t b = 0; b < batches.size(); ++b) {
        lens->set_stream(b);
        std::vector<std::int64_t>& off = batches[b].features[t].offsets;
        for (std::int64_t i = 0; i < spec.batch; ++i)
          off[static_cast<std::size_t>(i) + 1] = off[static_cast<std::size_t>(i)] + lens->next();
      }
    }
  }
  for (auto& b : batches)
    for (auto& f : b.features) f.keys.resize(static_cast<std::size_t>(f.offsets.back()));

  const std::int64_t total_chunks = static_cast<std::int64_t>(batches.size()) * num_tables * chunks_per_feature;
  std::atomic<std::int64_t> next_chunk{0};
  const auto worker = [&] {
    for (;;) {
      const std::int64_t c = next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (c >= total_chunks) return;
      const std::int64_t chunk = c % chunks_per_feature;
      const std::int64_t feature = c / chunks_per_feature;
      const std::int64_t t = feature % num_tables;
      const std::int64_t b = feature / num_tables;
      KeySampler s = prototypes[static_cast<std::size_t>(t)];
      s.set_stream((static_cast<std::uint64_t>(b) << 32) ^ static_cast<std::uint64_t>(chunk));
      s.set_step(b);  // batch b is step b (moves the hot set under drift; a no-op otherwise)
      const std::int64_t bag_begin = chunk * kChunkBags;
      const std::int64_t bag_end = std::min(spec.batch, bag_begin + kChunkBags);
      JaggedKeys& f = batches[static_cast<std::size_t>(b)].features[static_cast<std::size_t>(t)];
      const std::int64_t key_begin = f.offsets[static_cast<std::size_t>(bag_begin)];
      s.fill(f.keys.data() + key_begin, f.offsets[static_cast<std::size_t>(bag_end)] - key_begin);
    }
  };

  int n_threads = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads = static_cast<int>(std::min<std::int64_t>(n_threads, total_chunks));
  if (n_threads <= 1) {
    worker();
  } else {
    std::vector<std::thread> pool;
    pool.reserve(static_cast<std::size_t>(n_threads));
    for (int i = 0; i < n_threads; ++i) pool.emplace_back(worker);
    for (auto& th : pool) th.join();
  }
  return batches;
}

Key spread_key(Key k) noexcept {
  return static_cast<Key>((static_cast<std::uint64_t>(k) * 0x9E3779B97F4A7C15ull) & 0x7FFFFFFFFFFFFFFFull);
}

void spread_keys(KeyBatch& b) {
  for (JaggedKeys& f : b.features) {
    if (!f.keys32.empty()) {
      f.keys.assign(f.keys32.begin(), f.keys32.end());
      f.keys32.clear();
    }
    for (Key& k : f.keys) k = spread_key(k);
  }
}

std::vector<KeyBatch> make_batches(const WorkloadSpec& spec, int threads) {
  std::vector<std::string> names;
  for (const TableShape& t : workload_tables(spec)) names.push_back(t.name);
  return make_batches(spec, names, threads);
}

// ---------------------------------------------------------------------------------------------
// Built-in Criteo-shaped table set

// Copied from shared/data/criteo_tables.json ("criteo_kaggle" -> "rows"; the project's shared
// data folder, not available at run time), the cardinalities published with public recommender
// benchmarks for the Criteo Kaggle display-advertising challenge.
const std::int64_t kCriteoKaggleRows[26] = {1460,  583,  10131227, 2202608, 305, 24,     12517,   633,   3,
                                            93145, 5683, 8351593,  3194,    27,  14992,  5461306, 10,    5652,
                                            2173,  4,    7046547,  18,      15,  286181, 105,     142572};

Result<std::vector<std::int64_t>> scale_table_rows(const std::vector<std::int64_t>& rows, std::int64_t max_total_rows) {
  if (rows.empty()) return Status::invalid_argument("scale_table_rows: no tables (expected at least one)");
  std::int64_t total = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] <= 0)
      return Status::invalid_argument("scale_table_rows: table " + std::to_string(i) + " has " +
                                      std::to_string(rows[i]) + " rows (expected > 0)");
    total = rows[i] > kI64Max - total ? kI64Max : total + rows[i];
  }
  const auto n = static_cast<std::int64_t>(rows.size());
  if (max_total_rows < n)
    return Status::invalid_argument("scale_table_rows: max_total_rows " + std::to_string(max_total_rows) +
                                    " is below one row for each of the " + std::to_string(n) + " tables");
  if (total <= max_total_rows) return rows;

  std::vector<bool> pinned(rows.size(), false);
  std::vector<std::int64_t> out(rows.size(), 1);
  for (;;) {
    std::int64_t n_pinned = 0;
    double free_rows = 0.0;  // rows of the tables not pinned; exact in double below 2^53
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (pinned[i]) {
        ++n_pinned;
      } else {
        free_rows += static_cast<double>(rows[i]);
      }
    }
    if (n_pinned == n) break;
    const double scale = static_cast<double>(max_total_rows - n_pinned) / free_rows;
    bool grew = false;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (pinned[i]) continue;
      const auto r = static_cast<std::int64_t>(std::floor(static_cast<double>(rows[i]) * scale));
      if (r < 1) {
        pinned[i] = true;
        grew = true;
      }
      out[i] = std::max<std::int64_t>(r, 1);
    }
    if (!grew) break;
  }
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (pinned[i]) out[i] = 1;
  // Guard against rounding in scale pushing a floor up by one: trim the largest tables.
  std::int64_t sum = 0;
  for (const auto r : out) sum += r;
  while (sum > max_total_rows) {
    const auto it = std::max_element(out.begin(), out.end());
    --*it;
    --sum;
  }
  return out;
}

Result<std::vector<TableSpec>> criteo_default_tables(std::int64_t max_total_rows, int dim) {
  if (dim <= 0) return Status::invalid_argument("criteo_default_tables: dim " + std::to_string(dim) + " must be > 0");
  STRATA_ASSIGN_OR_RETURN(
      std::vector<std::int64_t> rows,
      scale_table_rows(std::vector<std::int64_t>(std::begin(kCriteoKaggleRows), std::end(kCriteoKaggleRows)),
                       max_total_rows));
  std::vector<TableSpec> tables(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    tables[i].name = "C" + std::to_string(i + 1);
    tables[i].rows = rows[i];
    tables[i].dim = dim;
  }
  return tables;
}

Status write_batches_raw(const std::string& path, const std::vector<KeyBatch>& batches) {
  const std::size_t num_tables = batches.empty() ? 0 : batches.front().features.size();
  for (std::size_t b = 0; b < batches.size(); ++b) {
    if (batches[b].features.size() != num_tables)
      return Status::invalid_argument("write_batches_raw: batch " + std::to_string(b) + " has " +
                                      std::to_string(batches[b].features.size()) + " features (expected " +
                                      std::to_string(num_tables) + " like batch 0)");
  }
  if (batches.size() > 0xffffffffu || num_tables > 0xffffffffu)
    return Status::invalid_argument("write_batches_raw: too many batches or tables for a u32 count");

  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "wb"));
  if (!f) return Status::io_error("cannot open '" + path + "' for writing: " + std::strerror(errno));
  RawWriter w(f.get());
  w.bytes("STRKEYS1", 8);
  w.u32(1);
  w.u32(static_cast<std::uint32_t>(batches.size()));
  w.u32(static_cast<std::uint32_t>(num_tables));
  for (const KeyBatch& b : batches) {
    for (const JaggedKeys& jk : b.features) {
      w.u64(jk.offsets.size());
      w.i64_array(jk.offsets.data(), jk.offsets.size());
      w.u64(jk.keys.size());
      w.i64_array(jk.keys.data(), jk.keys.size());
    }
  }
  if (!w.ok()) return Status::io_error("cannot write '" + path + "': " + std::strerror(errno));
  std::FILE* raw = f.release();
  if (std::fclose(raw) != 0) return Status::io_error("cannot close '" + path + "': " + std::strerror(errno));
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Bandwidth probe

namespace {

// Sums `n` words with independent accumulators so the loop is bandwidth-bound, not latency-bound,
// and the compiler can vectorize it.
std::uint64_t sum_words(const std::uint64_t* p, std::size_t n) noexcept {
  std::uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    a0 += p[i + 0];
    a1 += p[i + 1];
    a2 += p[i + 2];
    a3 += p[i + 3];
    a4 += p[i + 4];
    a5 += p[i + 5];
    a6 += p[i + 6];
    a7 += p[i + 7];
  }
  for (; i < n; ++i) a0 += p[i];
  return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

}  // namespace

double measure_read_bandwidth_gbs(std::size_t bytes, int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (bytes == 0) bytes = std::size_t{1} << 30;
  const std::size_t unit = 64 * static_cast<std::size_t>(threads);
  bytes = std::max(unit, bytes / unit * unit);

  const auto mem = alloc_huge_buffer(bytes);
  if (!mem) return 0.0;
  auto* words = static_cast<std::uint64_t*>(mem.get());
  const std::size_t n_words = bytes / sizeof(std::uint64_t);
  const std::size_t per_thread = n_words / static_cast<std::size_t>(threads);

  // First touch from the reading threads, so pages land near the threads that read them.
  (void)timed_parallel(threads, [&](int t) {
    std::uint64_t* p = words + per_thread * static_cast<std::size_t>(t);
    for (std::size_t i = 0; i < per_thread; ++i) p[i] = i ^ static_cast<std::uint64_t>(t);
  });

  volatile std::uint64_t sink = 0;
  std::vector<std::uint64_t> partial(static_cast<std::size_t>(threads) * 8, 0);  // a cache line apart
  constexpr int kPasses = 5;
  std::vector<double> gbs;
  for (int pass = 0; pass < kPasses; ++pass) {
    const double sec = timed_parallel(threads, [&](int t) {
      const std::size_t slice = static_cast<std::size_t>(t);
      partial[slice * 8] = sum_words(words + per_thread * slice, per_thread);
    });
    for (int t = 0; t < threads; ++t) sink = sink + partial[static_cast<std::size_t>(t) * 8];
    gbs.push_back(static_cast<double>(per_thread * static_cast<std::size_t>(threads) * sizeof(std::uint64_t)) / sec /
                  1e9);
  }
  (void)sink;
  std::sort(gbs.begin(), gbs.end());
  return gbs[gbs.size() / 2];
}

}  // namespace strata::bench
