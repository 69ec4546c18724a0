#include "store/store_config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/record_layout.hpp"
#include "core/text.hpp"
#include "store/detail/json_keys.hpp"

namespace strata {

using nlohmann::json;

const char* to_string(Placement p) noexcept {
  switch (p) {
    case Placement::kCpu:
      return "cpu";
    case Placement::kOffload:
      return "offload";
    case Placement::kCached:
      return "cached";
    case Placement::kGpu:
      return "gpu";
    case Placement::kHybrid:
      return "hybrid";
  }
  return "?";
}
Result<Placement> parse_placement(const std::string& s) {
  if (s == "cpu") return Placement::kCpu;
  if (s == "offload") return Placement::kOffload;
  if (s == "cached") return Placement::kCached;
  if (s == "gpu") return Placement::kGpu;
  if (s == "hybrid") return Placement::kHybrid;
  return Status::invalid_argument("unknown placement '" + s + "' (expected cpu, offload, cached, gpu or hybrid)");
}
const char* to_string(NumaPolicy p) noexcept {
  switch (p) {
    case NumaPolicy::kInterleave:
      return "interleave";
    case NumaPolicy::kBind:
      return "bind";
    case NumaPolicy::kAuto:
      return "auto";
  }
  return "?";
}
Result<NumaPolicy> parse_numa_policy(const std::string& s) {
  if (s == "interleave") return NumaPolicy::kInterleave;
  if (s == "bind") return NumaPolicy::kBind;
  if (s == "auto") return NumaPolicy::kAuto;
  return Status::invalid_argument("unknown numa policy '" + s + "' (expected auto, interleave or bind)");
}

const char* to_string(BackendChoice b) noexcept {
  switch (b) {
    case BackendChoice::kAuto:
      return "auto";
    case BackendChoice::kCuda:
      return "cuda";
    case BackendChoice::kEmu:
      return "emu";
  }
  return "?";
}
Result<BackendChoice> parse_backend(const std::string& s) {
  if (s == "auto") return BackendChoice::kAuto;
  if (s == "cuda") return BackendChoice::kCuda;
  if (s == "emu") return BackendChoice::kEmu;
  return Status::invalid_argument("unknown device backend '" + s + "' (expected auto, cuda or emu)");
}
const char* to_string(OffloadGather g) noexcept {
  switch (g) {
    case OffloadGather::kDevice:
      return "device";
    case OffloadGather::kCpu:
      return "cpu";
  }
  return "?";
}
Result<OffloadGather> parse_offload_gather(const std::string& s) {
  if (s == "device") return OffloadGather::kDevice;
  if (s == "cpu") return OffloadGather::kCpu;
  return Status::invalid_argument("unknown offload_gather '" + s + "' (expected device or cpu)");
}

const char* to_string(CacheTransfer t) noexcept {
  switch (t) {
    case CacheTransfer::kAuto:
      return "auto";
    case CacheTransfer::kStaged:
      return "staged";
    case CacheTransfer::kZeroCopy:
      return "zero_copy";
  }
  return "?";
}
Result<CacheTransfer> parse_cache_transfer(const std::string& s) {
  if (s == "auto") return CacheTransfer::kAuto;
  if (s == "staged") return CacheTransfer::kStaged;
  if (s == "zero_copy") return CacheTransfer::kZeroCopy;
  return Status::invalid_argument("unknown cache transfer '" + s + "' (expected auto, staged or zero_copy)");
}

const char* to_string(Eviction e) noexcept {
  switch (e) {
    case Eviction::kLru:
      return "lru";
    case Eviction::kLfu:
      return "lfu";
  }
  return "?";
}
Result<Eviction> parse_eviction(const std::string& s) {
  if (s == "lru") return Eviction::kLru;
  if (s == "lfu") return Eviction::kLfu;
  return Status::invalid_argument("unknown eviction '" + s + "' (expected lru or lfu)");
}

const char* to_string(Unseen u) noexcept {
  switch (u) {
    case Unseen::kInitial:
      return "initial";
    case Unseen::kZeros:
      return "zeros";
  }
  return "?";
}
Result<Unseen> parse_unseen(const std::string& s) {
  if (s == "initial") return Unseen::kInitial;
  if (s == "zeros") return Unseen::kZeros;
  return Status::invalid_argument("unknown unseen '" + s + "' (expected initial or zeros)");
}

std::int64_t cache_rows(const TableConfig& t) {
  const TableCacheConfig& c = t.cache;
  std::int64_t rows;
  if (c.rows > 0) {
    rows = c.rows;
  } else if (c.bytes > 0) {
    const RecordShape shape = record_shape(t.spec);  // half-size rows: more of them in the bytes
    const std::int64_t rec = (row_words(shape) + state_words(shape)) * 4;
    rows = c.bytes / rec;
  } else {
    rows = static_cast<std::int64_t>(static_cast<double>(t.spec.rows) * (c.fraction > 0 ? c.fraction : 0.1));
  }
  return std::max<std::int64_t>(1, std::min(rows, t.spec.rows));
}

Result<std::pair<int, Pooling>> find_feature(const StoreConfig& config, const std::string& name) {
  for (std::size_t t = 0; t < config.tables.size(); ++t) {
    const TableConfig& tc = config.tables[t];
    if (tc.features.empty() && tc.spec.name == name) return std::make_pair(static_cast<int>(t), tc.spec.pooling);
    for (const FeatureConfig& f : tc.features)
      if (f.name == name) return std::make_pair(static_cast<int>(t), f.pooling.value_or(tc.spec.pooling));
  }
  return Status::not_found("unknown feature '" + name + "'");
}

namespace {

// A JSON value for an error message, as written when it is a scalar or a small flat array or
// object, cut to 64 characters; else by its kind and size only (dumping a user's value whole would
// recurse as deep as it nests).
std::string quoted(const json& v) {
  if (v.is_structured()) {
    bool flat = v.size() <= 8;
    for (const auto& e : v) flat = flat && !e.is_structured();
    if (!flat)
      return std::string(v.is_array() ? "an array of " : "an object of ") + std::to_string(v.size()) +
             (v.is_array() ? " values" : " fields");
  }
  std::string s = v.dump();
  if (s.size() > 64) s = s.substr(0, utf8_cut(s, 64)) + "...";  // a message Python can decode
  return s;
}

// An enum value a config holds is one its to_string names; anything else (a cast integer) is refused
// before any switch over it can fall through.
template <typename E>
Status check_enum(E value, const std::string& field, const char* expected) {
  const char* name = to_string(value);
  if (name[0] != '?' || name[1] != '\0') return Status::ok();
  return Status::invalid_argument(field + " " + std::to_string(static_cast<long long>(value)) +
                                  " is out of range (expected " + expected + ")");
}

Status validate_cache(const TableConfig& t) {
  const TableCacheConfig& c = t.cache;
  const std::string who = "table '" + t.spec.name + "': cache ";
  if (c.rows < 0 || c.bytes < 0 || !(c.fraction >= 0 && c.fraction <= 1))
    return Status::invalid_argument(who + "rows " + std::to_string(c.rows) + ", bytes " + std::to_string(c.bytes) +
                                    ", fraction " + std::to_string(c.fraction) +
                                    " (expected rows >= 0, bytes >= 0, fraction in [0, 1])");
  if ((c.rows > 0) + (c.bytes > 0) + (c.fraction > 0) > 1)
    return Status::invalid_argument(who + "size is given more than once (set one of rows, bytes, fraction)");
  if (t.placement != Placement::kCached && t.placement != Placement::kHybrid &&
      (c.rows > 0 || c.bytes > 0 || c.fraction > 0 || c.cap))
    return Status::invalid_argument(who + "size given but the placement is " + to_string(t.placement) +
                                    " (expected cached or hybrid)");
  return Status::ok();
}

bool sharded(Placement p) { return p == Placement::kGpu || p == Placement::kHybrid; }

Status validate_sharding(const TableConfig& t) {
  const dispatch::ShardingPlan& p = t.sharding;
  STRATA_RETURN_IF_ERROR(
      check_enum(p.type, "table '" + t.spec.name + "': sharding type", "replicated, table, row or column"));
  const dispatch::ShardingPlan none;
  if (!sharded(t.placement) && (p.type != none.type || p.owner != none.owner))
    return Status::invalid_argument("table '" + t.spec.name + "': sharding " + dispatch::to_string(p.type) +
                                    " given but the placement is " + to_string(t.placement) +
                                    " (expected gpu or hybrid)");
  // The world size is known at open (Store::open checks the plan against it); here the smallest
  // world the plan can mean (in 64 bits: owner + 1 overflows at INT_MAX, which the plan then refuses).
  const std::int64_t world = std::max<std::int64_t>(1, std::int64_t{p.owner} + 1);
  return dispatch::validate_plan(t.spec, p,
                                 static_cast<int>(std::min<std::int64_t>(world, std::numeric_limits<int>::max())));
}

// A dynamic table's options, in range.
Status validate_dynamic(const TableConfig& t) {
  if (!t.dynamic) return Status::ok();
  const DynamicSpec& d = *t.dynamic;
  const std::string who = "table '" + t.spec.name + "': ";
  if (t.spec.rows > kMaxDynamicCapacity)
    return Status::invalid_argument(who + "capacity " + std::to_string(t.spec.rows) + " is past a dynamic table's " +
                                    std::to_string(kMaxDynamicCapacity) + " rows (expected a capacity in [1, " +
                                    std::to_string(kMaxDynamicCapacity) + "])");
  if (d.admit_after < 1 || d.admit_after > kMaxAdmitAfter)
    return Status::invalid_argument(who + "admit_after " + std::to_string(d.admit_after) +
                                    " is out of range (expected [1, " + std::to_string(kMaxAdmitAfter) + "])");
  if (d.evict_after_steps < 0 || d.evict_after_steps >= (std::int64_t{1} << 62))
    return Status::invalid_argument(who + "evict_after_steps " + std::to_string(d.evict_after_steps) +
                                    " is out of range (expected [0, 2^62): 0 for no TTL)");
  STRATA_RETURN_IF_ERROR(check_enum(d.eviction, who + "eviction", "lru or lfu"));
  return check_enum(d.unseen, who + "unseen", "initial or zeros");
}

// Every feature names one table: names non-empty and unique over the store (a table without a features list has
// one feature of its own name), poolings within their enum.
Status validate_features(const StoreConfig& c) {
  std::map<std::string, std::string> table_of;  // feature -> table
  std::set<std::string> tables;
  for (const auto& t : c.tables) tables.insert(t.spec.name);
  for (const auto& t : c.tables) {
    const std::string who = "table '" + t.spec.name + "': ";
    std::vector<std::string> names;
    for (const FeatureConfig& f : t.features) {
      if (f.name.empty()) return Status::invalid_argument(who + "a feature has an empty name (expected a name)");
      if (f.name != t.spec.name && tables.count(f.name))
        return Status::invalid_argument(who + "feature '" + f.name +
                                        "' is named as another table (expected a name no "
                                        "other table has: a batch entry of that name would look up this table)");
      if (f.pooling)
        STRATA_RETURN_IF_ERROR(check_enum(*f.pooling, who + "feature '" + f.name + "': pooling", "sum, mean or none"));
      names.push_back(f.name);
    }
    if (t.features.empty()) names.push_back(t.spec.name);
    for (const std::string& n : names) {
      const auto [it, fresh] = table_of.emplace(n, t.spec.name);
      if (fresh) continue;
      if (it->second == t.spec.name)
        return Status::invalid_argument(who + "feature '" + n + "' is listed twice (expected each feature once)");
      return Status::invalid_argument("feature '" + n + "' looks up table '" + it->second + "' and table '" +
                                      t.spec.name +
                                      "' (expected one table per feature; a table without a features "
                                      "list has one feature of its own name)");
    }
  }
  return Status::ok();
}
}  // namespace

Status validate(const StoreConfig& c) {
  if (c.tables.empty()) return Status::invalid_argument("config has no tables (expected at least one)");
  std::set<std::string> names;
  for (const auto& t : c.tables) {
    STRATA_RETURN_IF_ERROR(validate(t.spec));
    // The shard origin is dispatch's to set, on the specs of each rank's shard: a config's tables
    // are whole tables (row_stride 0 opened and gave other rows than the reference's).
    const InitializerSpec& init = t.spec.init;
    const InitializerSpec whole;
    if (init.row_stride != whole.row_stride || init.row_offset != whole.row_offset ||
        init.col_offset != whole.col_offset)
      return Status::invalid_argument(
          "table '" + t.spec.name + "': init.row_stride " + std::to_string(init.row_stride) + ", init.row_offset " +
          std::to_string(init.row_offset) + ", init.col_offset " + std::to_string(init.col_offset) +
          ": these place a shard in its table and are set by dispatch, not by a config "
          "(expected 1, 0, 0)");
    STRATA_RETURN_IF_ERROR(
        check_enum(t.placement, "table '" + t.spec.name + "': placement", "cpu, offload, cached, gpu or hybrid"));
    if (!names.insert(t.spec.name).second)
      return Status::invalid_argument("table '" + t.spec.name + "' is defined twice (names must be unique)");
    STRATA_RETURN_IF_ERROR(validate_cache(t));
    STRATA_RETURN_IF_ERROR(validate_sharding(t));
    STRATA_RETURN_IF_ERROR(validate_dynamic(t));
  }
  STRATA_RETURN_IF_ERROR(validate_features(c));
  if (c.cache.policy != cache::Policy::kLru && c.cache.policy != cache::Policy::kLfu &&
      c.cache.policy != cache::Policy::kLookahead)
    return Status::invalid_argument("cache policy " + std::to_string(static_cast<int>(c.cache.policy)) +
                                    " is not a policy (expected lru, lfu or lookahead)");
  if (c.cache.max_in_flight < 1)
    return Status::invalid_argument("cache max_in_flight " + std::to_string(c.cache.max_in_flight) + " must be >= 1");
  if (c.cache.lookahead < 0 || c.cache.lookahead >= c.cache.max_in_flight)
    return Status::invalid_argument("cache lookahead " + std::to_string(c.cache.lookahead) +
                                    " must be in [0, max_in_flight) = [0, " + std::to_string(c.cache.max_in_flight) +
                                    "): the staging ring must hold the window plus the batch being planned");
  if (c.cache.preview < 0 || c.cache.preview > kMaxPreview)
    return Status::invalid_argument("cache preview " + std::to_string(c.cache.preview) + " must be in [0, " +
                                    std::to_string(kMaxPreview) + "] (batches previewed and not yet submitted)");
  if (c.cache.planner_partitions < 1 || c.cache.planner_partitions > kMaxPlannerPartitions)
    return Status::invalid_argument("cache planner_partitions " + std::to_string(c.cache.planner_partitions) +
                                    " must be in [1, " + std::to_string(kMaxPlannerPartitions) +
                                    "] (cores planning each slot pool)");
  if (c.cache.flush_every < 0)
    return Status::invalid_argument("cache flush_every " + std::to_string(c.cache.flush_every) +
                                    " must be >= 0 (0: no periodic flush)");
  if (c.device.ordinal < kDeviceOrdinalAuto)
    return Status::invalid_argument(
        "device ordinal " + std::to_string(c.device.ordinal) +
        " must be a CUDA device (>= 0), kDeviceOrdinalCurrent (-1) or kDeviceOrdinalAuto (-2)");
  if (c.device.capacity < 0)
    return Status::invalid_argument("device capacity " + std::to_string(c.device.capacity) + " must be >= 0");
  if (c.device.emu_max_delay_us < 0)
    return Status::invalid_argument("device emu_max_delay_us " + std::to_string(c.device.emu_max_delay_us) +
                                    " must be >= 0");
  STRATA_RETURN_IF_ERROR(check_enum(c.numa, "numa", "auto, interleave or bind"));
  STRATA_RETURN_IF_ERROR(check_enum(c.device.backend, "device backend", "auto, cuda or emu"));
  STRATA_RETURN_IF_ERROR(check_enum(c.offload_gather, "offload_gather", "device or cpu"));
  STRATA_RETURN_IF_ERROR(check_enum(c.cache.transfer, "cache transfer", "auto, staged or zero_copy"));
  if (c.threads < 0 || c.threads > kMaxThreads)
    return Status::invalid_argument("threads " + std::to_string(c.threads) + " must be in [0, " +
                                    std::to_string(kMaxThreads) + "] (kernel worker threads; 0: all cores)");
  if (c.numa_node < 0) return Status::invalid_argument("numa_node " + std::to_string(c.numa_node) + " must be >= 0");
  // 0, the default, passes with every policy: configs and checkpoints of earlier builds record it.
  if (c.numa != NumaPolicy::kBind && c.numa_node != 0)
    return Status::invalid_argument("numa_node " + std::to_string(c.numa_node) +
                                    " is the node of numa \"bind\", but numa is \"" + to_string(c.numa) +
                                    "\" (drop numa_node, or set numa to \"bind\")");
  if (c.fake_numa_nodes < 0 || c.fake_numa_nodes > 64)
    return Status::invalid_argument("fake_numa_nodes " + std::to_string(c.fake_numa_nodes) + " must be in [0, 64]");
  return Status::ok();
}

namespace {

// Reads the fields of one JSON object with their types checked, never coerced: each getter leaves
// `out` alone when the key is absent, and otherwise stores the value or returns an error quoting
// what the config holds ("table 'user': dim: expected an integer in [-2^31, 2^31), got 8.9"). Ranges
// are those of the destination types (validate then checks what each field means). The keys
// asked for are remembered, so whatever is left is an unknown field (check_unknown).
class Fields {
 public:
  // `where` names the object in errors ("table 'user'", "config"); `prefix` is the path of a nested
  // object inside it ("optimizer.").
  Fields(const json& j, std::string where, std::string prefix = "")
      : j_(j), where_(std::move(where)), prefix_(std::move(prefix)) {}

  // A JSON integer that T holds.
  template <typename T>
  Status integer(const char* key, T& out) {
    static_assert(std::is_integral_v<T> && sizeof(T) <= 8, "integer fields are at most 64-bit");
    const json* v = find(key);
    if (!v) return Status::ok();
    const T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
    if (!fits_in(*v, lo, hi, out)) return wrong(key, "an integer in " + range_text(lo, hi), *v);
    return Status::ok();
  }

  // A JSON number (integer or not) that the destination holds: finite, and for a float within
  // float's range (1e39 would become inf, and 1e-50 or -1e-50 0: not that number).
  template <typename T>
  Status number(const char* key, T& out) {
    static_assert(std::is_floating_point_v<T>, "number fields are float or double");
    const json* v = find(key);
    if (!v) return Status::ok();
    if (!v->is_number()) return wrong(key, "a number", *v);
    const double d = v->get<double>();
    if (!std::isfinite(d) || std::fabs(d) > static_cast<double>(std::numeric_limits<T>::max()) ||
        (d != 0 && static_cast<T>(d) == 0))
      return wrong(key, std::is_same_v<T, float> ? "a number in float range" : "a finite number", *v);
    out = static_cast<T>(d);
    return Status::ok();
  }

  // A device ordinal: "auto", "current", or an integer >= -1 (-1 is "current").
  Status device_ordinal(const char* key, int& out) {
    const json* v = find(key);
    if (!v) return Status::ok();
    int i = 0;
    if (v->is_string() && v->get<std::string>() == "auto") {
      out = kDeviceOrdinalAuto;
    } else if (v->is_string() && v->get<std::string>() == "current") {
      out = kDeviceOrdinalCurrent;
    } else if (fits_in(*v, -1, std::numeric_limits<int>::max(), i)) {
      out = i;
    } else {
      return wrong(key, "\"auto\", \"current\" or an integer in [-1, 2^31) (a CUDA device; -1: current)", *v);
    }
    return Status::ok();
  }

  Status boolean(const char* key, bool& out) {
    const json* v = find(key);
    if (!v) return Status::ok();
    if (!v->is_boolean()) return wrong(key, "true or false", *v);
    out = v->get<bool>();
    return Status::ok();
  }

  Status string(const char* key, std::string& out) {
    const json* v = find(key);
    if (!v) return Status::ok();
    if (!v->is_string()) return wrong(key, "a string", *v);
    out = v->get<std::string>();
    return Status::ok();
  }

  // A string naming one value of an enum, read with its parser ("placement": "cached").
  template <typename E>
  Status choice(const char* key, E& out, Result<E> (*parse)(const std::string&)) {
    std::string name;
    const json* v = find(key);
    if (!v) return Status::ok();
    STRATA_RETURN_IF_ERROR(string(key, name));
    Result<E> parsed = parse(name);
    if (!parsed) return parsed.status().with_context(where_ + ": " + prefix_ + key);
    out = parsed.value();
    return Status::ok();
  }

  // A nested object: calls read(fields of it) when the key is present, then checks that object
  // for unknown keys.
  template <typename Read>
  Status object(const char* key, Read read) {
    const json* v = find(key);
    if (!v) return Status::ok();
    if (!v->is_object()) return wrong(key, "an object", *v);
    Fields inner(*v, where_, prefix_ + key + ".");
    STRATA_RETURN_IF_ERROR(read(inner));
    return inner.check_unknown();
  }

  // A JSON array, or nullptr when the key is absent.
  Result<const json*> array(const char* key) {
    const json* v = find(key);
    if (v && !v->is_array()) return wrong(key, "an array", *v);
    return v;
  }

  Status check_unknown() const {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (!known_.count(it.key())) {
        std::string list;
        for (const auto& k : known_) list += (list.empty() ? "" : ", ") + k;
        return Status::invalid_argument(where_ + ": unknown field '" + prefix_ + it.key() + "' (expected one of " +
                                        list + ")");
      }
    }
    return Status::ok();
  }

  void rename(std::string where) { where_ = std::move(where); }

  // An error when a field is given under both its name and `old`, an earlier name that stays
  // accepted (read it first, then `key`, into the same destination).
  Status not_both(const char* key, const char* old) const {
    if (!j_.contains(key) || !j_.contains(old)) return Status::ok();
    return Status::invalid_argument(where_ + ": " + prefix_ + key + " and " + prefix_ + old + " are the same field (" +
                                    old + " is its earlier name); give one");
  }

 private:
  const json* find(const char* key) {
    known_.insert(key);
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }

  Status wrong(const char* key, const std::string& expected, const json& got) const {
    return Status::invalid_argument(where_ + ": " + prefix_ + key + ": expected " + expected + ", got " + quoted(got));
  }

  // Stores v in out when v is a JSON integer in [lo, hi] (nlohmann keeps non-negative integers as
  // unsigned and negative ones as signed 64-bit).
  template <typename T>
  static bool fits_in(const json& v, T lo, T hi, T& out) {
    if (!v.is_number_integer()) return false;  // floats, booleans, strings...
    if (v.is_number_unsigned() || v.get<std::int64_t>() >= 0) {
      const std::uint64_t u = v.get<std::uint64_t>();
      if constexpr (std::is_signed_v<T>) {
        if (hi < 0 || u > static_cast<std::uint64_t>(hi) || (lo > 0 && u < static_cast<std::uint64_t>(lo)))
          return false;
      } else {
        if (u > hi || u < lo) return false;
      }
      out = static_cast<T>(u);
      return true;
    }
    const std::int64_t i = v.get<std::int64_t>();
    if constexpr (std::is_signed_v<T>) {
      if (i < lo || i > hi) return false;
      out = static_cast<T>(i);
      return true;
    }
    return false;
  }

  // "2^31" for the powers of two that bound the integer types, else the number.
  template <typename T>
  static std::string bound_text(T v, bool upper) {
    for (int b : {8, 15, 16, 31, 32, 63, 64}) {
      const long double p = std::ldexp(1.0L, b);
      const long double x = static_cast<long double>(v) + (upper ? 1.0L : 0.0L);
      if (x == p) return "2^" + std::to_string(b);
      if (x == -p) return "-2^" + std::to_string(b);
    }
    return std::to_string(v);
  }
  // "[-2^31, 2^31)" for [INT32_MIN, INT32_MAX]; "[0, 100]" for bounds that are not powers of two.
  template <typename T>
  static std::string range_text(T lo, T hi) {
    const std::string top = bound_text(hi, true);
    if (top.find('^') != std::string::npos) return "[" + bound_text(lo, false) + ", " + top + ")";
    return "[" + bound_text(lo, false) + ", " + std::to_string(hi) + "]";
  }

  const json& j_;
  std::string where_;
  std::string prefix_;
  std::set<std::string> known_;
};

// "features": a non-empty array of names or {"name": ..., "pooling": ...} objects (pooling optional).
Status parse_features(Fields& f, TableConfig& t) {
  STRATA_ASSIGN_OR_RETURN(const json* features, f.array("features"));
  if (!features) return Status::ok();
  const std::string at = "table '" + t.spec.name + "': features";
  if (features->empty())
    return Status::invalid_argument(at +
                                    ": empty (expected at least one feature; leave the field out for one feature "
                                    "named as the table)");
  for (std::size_t i = 0; i < features->size(); ++i) {
    const json& item = (*features)[i];
    FeatureConfig fc;
    if (item.is_string()) {
      fc.name = item.get<std::string>();
    } else if (item.is_object()) {
      Fields g(item, at + "[" + std::to_string(i) + "]");
      if (!item.contains("name")) return Status::invalid_argument(at + "[" + std::to_string(i) + "]: name is required");
      STRATA_RETURN_IF_ERROR(g.string("name", fc.name));
      Pooling p = Pooling::kSum;
      STRATA_RETURN_IF_ERROR(g.choice("pooling", p, parse_pooling));
      if (item.contains("pooling")) fc.pooling = p;
      STRATA_RETURN_IF_ERROR(g.check_unknown());
    } else {
      return Status::invalid_argument(at + "[" + std::to_string(i) +
                                      "]: expected a name or an object with name and "
                                      "pooling, got " +
                                      quoted(item));
    }
    t.features.push_back(std::move(fc));
  }
  return Status::ok();
}

// "kind": "dense" (the default) or "dynamic", with a dynamic table's options; a table's size is its "rows" or, dynamic,
// its "capacity", never the other.
Status parse_kind(Fields& f, const json& j, TableConfig& t) {
  std::string kind = "dense";
  STRATA_RETURN_IF_ERROR(f.string("kind", kind));
  const std::string who = "table '" + t.spec.name + "': ";
  if (kind != "dense" && kind != "dynamic")
    return Status::invalid_argument(who + "kind '" + kind + "' (expected dense or dynamic)");
  const char* options[] = {"capacity", "admit_after", "eviction", "evict_after_steps", "unseen"};
  if (kind == "dense") {
    for (const char* o : options)
      if (j.contains(o))
        return Status::invalid_argument(
            who + "'" + o + "' is given but the table is dense (expected \"kind\": " + "\"dynamic\" with it)");
    return Status::ok();
  }
  if (j.contains("rows"))
    return Status::invalid_argument(who + "a dynamic table has a capacity, not rows (expected \"capacity\")");
  DynamicSpec d;
  STRATA_RETURN_IF_ERROR(f.integer("admit_after", d.admit_after));
  STRATA_RETURN_IF_ERROR(f.choice("eviction", d.eviction, parse_eviction));
  STRATA_RETURN_IF_ERROR(f.integer("evict_after_steps", d.evict_after_steps));
  STRATA_RETURN_IF_ERROR(f.choice("unseen", d.unseen, parse_unseen));
  t.dynamic = d;
  return Status::ok();
}

Status parse_table(const json& j, std::size_t index, TableConfig& t) {
  const std::string at = "tables[" + std::to_string(index) + "]";
  if (!j.is_object()) return Status::invalid_argument(at + ": expected an object, got " + quoted(j));
  Fields f(j, at);
  STRATA_RETURN_IF_ERROR(f.string("name", t.spec.name));
  if (!t.spec.name.empty()) f.rename("table '" + t.spec.name + "'");
  TableSpec& s = t.spec;
  STRATA_RETURN_IF_ERROR(parse_kind(f, j, t));
  if (!j.contains("name") || !j.contains(t.dynamic ? "capacity" : "rows") || !j.contains("dim"))
    return Status::invalid_argument((t.spec.name.empty() ? at : "table '" + t.spec.name + "'") + ": name, " +
                                    (t.dynamic ? "capacity" : "rows") + " and dim are required");
  STRATA_RETURN_IF_ERROR(f.integer(t.dynamic ? "capacity" : "rows", s.rows));
  STRATA_RETURN_IF_ERROR(f.integer("dim", s.dim));
  STRATA_RETURN_IF_ERROR(f.choice("dtype", s.dtype, parse_dtype));
  STRATA_RETURN_IF_ERROR(f.choice("state_dtype", s.state_dtype, parse_dtype));
  STRATA_RETURN_IF_ERROR(f.boolean("stochastic_rounding", s.stochastic_rounding));
  STRATA_RETURN_IF_ERROR(f.choice("output_dtype", s.output_dtype, parse_dtype));
  STRATA_RETURN_IF_ERROR(f.choice("pooling", s.pooling, parse_pooling));
  STRATA_RETURN_IF_ERROR(f.choice("placement", t.placement, parse_placement));
  STRATA_RETURN_IF_ERROR(f.object("init", [&](Fields& g) {
    STRATA_RETURN_IF_ERROR(g.number("bound", s.init.bound));
    return g.integer("seed", s.init.seed);
  }));
  STRATA_RETURN_IF_ERROR(f.object("optimizer", [&](Fields& g) {
    OptimizerSpec& o = s.optimizer;
    STRATA_RETURN_IF_ERROR(g.choice("kind", o.kind, parse_optimizer));
    STRATA_RETURN_IF_ERROR(g.number("learning_rate", o.learning_rate));
    STRATA_RETURN_IF_ERROR(g.number("eps", o.eps));
    STRATA_RETURN_IF_ERROR(g.number("beta1", o.beta1));
    STRATA_RETURN_IF_ERROR(g.number("beta2", o.beta2));
    STRATA_RETURN_IF_ERROR(g.number("weight_decay", o.weight_decay));
    return g.number("initial_accumulator", o.initial_accumulator);
  }));
  STRATA_RETURN_IF_ERROR(f.object("cache", [&](Fields& g) {
    STRATA_RETURN_IF_ERROR(g.integer("rows", t.cache.rows));
    STRATA_RETURN_IF_ERROR(g.integer("bytes", t.cache.bytes));
    STRATA_RETURN_IF_ERROR(g.number("fraction", t.cache.fraction));
    return g.boolean("cap", t.cache.cap);
  }));
  STRATA_RETURN_IF_ERROR(f.object("sharding", [&](Fields& g) {
    STRATA_RETURN_IF_ERROR(g.choice("type", t.sharding.type, dispatch::parse_sharding));
    return g.integer("owner", t.sharding.owner);
  }));
  STRATA_RETURN_IF_ERROR(parse_features(f, t));
  return f.check_unknown();
}

Status parse_store_wide(Fields& f, StoreConfig& c) {
  STRATA_RETURN_IF_ERROR(f.integer("threads", c.threads));
  STRATA_RETURN_IF_ERROR(f.choice("numa", c.numa, parse_numa_policy));
  STRATA_RETURN_IF_ERROR(f.integer("numa_node", c.numa_node));
  STRATA_RETURN_IF_ERROR(f.boolean("huge_pages", c.huge_pages));
  STRATA_RETURN_IF_ERROR(f.integer("fake_numa_nodes", c.fake_numa_nodes));
  STRATA_RETURN_IF_ERROR(f.object("device", [&](Fields& g) {
    STRATA_RETURN_IF_ERROR(g.choice("backend", c.device.backend, parse_backend));
    STRATA_RETURN_IF_ERROR(g.device_ordinal("ordinal", c.device.ordinal));
    STRATA_RETURN_IF_ERROR(g.integer("capacity", c.device.capacity));
    STRATA_RETURN_IF_ERROR(g.integer("emu_max_delay_us", c.device.emu_max_delay_us));
    return g.integer("emu_fail_after_ops", c.device.emu_fail_after_ops);
  }));
  STRATA_RETURN_IF_ERROR(f.object("cache", [&](Fields& g) {
    STRATA_RETURN_IF_ERROR(g.choice("policy", c.cache.policy, cache::parse_policy));
    STRATA_RETURN_IF_ERROR(g.integer("lookahead", c.cache.lookahead));
    STRATA_RETURN_IF_ERROR(g.integer("max_in_flight", c.cache.max_in_flight));
    STRATA_RETURN_IF_ERROR(g.integer("preview", c.cache.preview));
    STRATA_RETURN_IF_ERROR(g.not_both("planner_partitions", "planner_shards"));
    STRATA_RETURN_IF_ERROR(g.integer("planner_shards", c.cache.planner_partitions));
    STRATA_RETURN_IF_ERROR(g.integer("planner_partitions", c.cache.planner_partitions));
    STRATA_RETURN_IF_ERROR(g.integer("flush_every", c.cache.flush_every));
    return g.choice("transfer", c.cache.transfer, parse_cache_transfer);
  }));
  STRATA_RETURN_IF_ERROR(f.choice("offload_gather", c.offload_gather, parse_offload_gather));
  return f.boolean("accept_nonfinite_gradients", c.accept_nonfinite_gradients);
}

}  // namespace

Result<StoreConfig> parse_store_config(const std::string& text) {
  json j;
  DuplicateKeys keys;
  try {
    j = json::parse(text, detail::duplicate_keys_callback(keys));
  } catch (const json::exception& e) {
    return Status::invalid_argument(std::string("config is not valid JSON: ") + e.what());
  }
  STRATA_RETURN_IF_ERROR(keys.status("config"));
  if (!j.is_object()) return Status::invalid_argument("config: expected a JSON object at the top level");
  StoreConfig c;
  Fields f(j, "config");
  STRATA_RETURN_IF_ERROR(parse_store_wide(f, c));
  STRATA_ASSIGN_OR_RETURN(const json* tables, f.array("tables"));
  if (!tables) return Status::invalid_argument("config: 'tables' must be an array of tables");
  for (std::size_t i = 0; i < tables->size(); ++i) {
    TableConfig t;
    STRATA_RETURN_IF_ERROR(parse_table((*tables)[i], i, t));
    c.tables.push_back(std::move(t));
  }
  STRATA_RETURN_IF_ERROR(f.check_unknown());
  STRATA_RETURN_IF_ERROR(validate(c));
  return c;
}

Result<StoreConfig> load_store_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::not_found("config file '" + path + "' cannot be opened");
  std::stringstream ss;
  ss << in.rdbuf();
  auto c = parse_store_config(ss.str());
  if (!c) return c.status().with_context(path);
  return c;
}

namespace {
json device_ordinal_json(int ordinal) {
  if (ordinal == kDeviceOrdinalAuto) return "auto";
  if (ordinal == kDeviceOrdinalCurrent) return "current";
  return ordinal;
}
}  // namespace

std::string to_json(const StoreConfig& c) {
  json j;
  j["threads"] = c.threads;
  j["numa"] = to_string(c.numa);
  j["numa_node"] = c.numa_node;
  j["huge_pages"] = c.huge_pages;
  j["fake_numa_nodes"] = c.fake_numa_nodes;
  j["device"] = {{"backend", to_string(c.device.backend)},
                 {"ordinal", device_ordinal_json(c.device.ordinal)},
                 {"capacity", c.device.capacity},
                 {"emu_max_delay_us", c.device.emu_max_delay_us},
                 {"emu_fail_after_ops", c.device.emu_fail_after_ops}};
  j["cache"] = {{"policy", cache::to_string(c.cache.policy)},       {"lookahead", c.cache.lookahead},
                {"max_in_flight", c.cache.max_in_flight},           {"preview", c.cache.preview},
                {"planner_partitions", c.cache.planner_partitions}, {"flush_every", c.cache.flush_every},
                {"transfer", to_string(c.cache.transfer)}};
  j["offload_gather"] = to_string(c.offload_gather);
  j["accept_nonfinite_gradients"] = c.accept_nonfinite_gradients;
  j["tables"] = json::array();
  for (const auto& t : c.tables) {
    const OptimizerSpec& o = t.spec.optimizer;
    j["tables"].push_back(
        {{"name", t.spec.name},
         {"rows", t.spec.rows},
         {"dim", t.spec.dim},
         {"dtype", to_string(t.spec.dtype)},
         {"pooling", to_string(t.spec.pooling)},
         {"placement", to_string(t.placement)},
         {"init", {{"bound", t.spec.init.bound}, {"seed", t.spec.init.seed}}},
         {"optimizer",
          {{"kind", to_string(o.kind)},
           {"learning_rate", o.learning_rate},
           {"eps", o.eps},
           {"beta1", o.beta1},
           {"beta2", o.beta2},
           {"weight_decay", o.weight_decay},
           {"initial_accumulator", o.initial_accumulator}}},
         {"cache",
          {{"rows", t.cache.rows}, {"bytes", t.cache.bytes}, {"fraction", t.cache.fraction}, {"cap", t.cache.cap}}},
         {"sharding", {{"type", dispatch::to_string(t.sharding.type)}, {"owner", t.sharding.owner}}}});
    json& table = j["tables"].back();
    // Written only when not the default, so that the config of an fp32 store (and the manifest of
    // its checkpoints, which records it) reads as it did before these keys existed.
    if (t.spec.state_dtype != DType::kF32) table["state_dtype"] = to_string(t.spec.state_dtype);
    if (t.spec.stochastic_rounding) table["stochastic_rounding"] = true;
    if (t.spec.output_dtype != DType::kF32) table["output_dtype"] = to_string(t.spec.output_dtype);
    if (t.dynamic) {
      table.erase("rows");
      table["kind"] = "dynamic";
      table["capacity"] = t.spec.rows;
      table["admit_after"] = t.dynamic->admit_after;
      table["eviction"] = to_string(t.dynamic->eviction);
      table["evict_after_steps"] = t.dynamic->evict_after_steps;
      table["unseen"] = to_string(t.dynamic->unseen);
    }
    if (t.features.empty()) continue;
    json& features = table["features"] = json::array();
    for (const FeatureConfig& fc : t.features) {
      if (fc.pooling)
        features.push_back({{"name", fc.name}, {"pooling", to_string(*fc.pooling)}});
      else
        features.push_back(fc.name);
    }
  }
  return j.dump(2);
}

}  // namespace strata
