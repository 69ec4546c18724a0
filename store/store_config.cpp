#include "store/store_config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

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
  }
  return "?";
}
Result<NumaPolicy> parse_numa_policy(const std::string& s) {
  if (s == "interleave") return NumaPolicy::kInterleave;
  if (s == "bind") return NumaPolicy::kBind;
  return Status::invalid_argument("unknown numa policy '" + s + "' (expected interleave or bind)");
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

std::int64_t cache_rows(const TableConfig& t) {
  const TableCacheConfig& c = t.cache;
  std::int64_t rows;
  if (c.rows > 0) {
    rows = c.rows;
  } else if (c.bytes > 0) {
    const std::int64_t rec = (t.spec.dim + optimizer_state_dim(t.spec.optimizer.kind, t.spec.dim)) * 4;
    rows = c.bytes / rec;
  } else {
    rows = static_cast<std::int64_t>(static_cast<double>(t.spec.rows) * (c.fraction > 0 ? c.fraction : 0.1));
  }
  return std::max<std::int64_t>(1, std::min(rows, t.spec.rows));
}

namespace {

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
  if (c.rows < 0 || c.bytes < 0 || c.fraction < 0 || c.fraction > 1)
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
  // world the plan can mean.
  return dispatch::validate_plan(t.spec, p, std::max(1, p.owner + 1));
}
}  // namespace

Status validate(const StoreConfig& c) {
  if (c.tables.empty()) return Status::invalid_argument("config has no tables (expected at least one)");
  std::set<std::string> names;
  for (const auto& t : c.tables) {
    STRATA_RETURN_IF_ERROR(validate(t.spec));
    STRATA_RETURN_IF_ERROR(
        check_enum(t.placement, "table '" + t.spec.name + "': placement", "cpu, offload, cached, gpu or hybrid"));
    if (!names.insert(t.spec.name).second)
      return Status::invalid_argument("table '" + t.spec.name + "' is defined twice (names must be unique)");
    STRATA_RETURN_IF_ERROR(validate_cache(t));
    STRATA_RETURN_IF_ERROR(validate_sharding(t));
  }
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
  if (c.cache.planner_shards < 1 || c.cache.planner_shards > kMaxPlannerShards)
    return Status::invalid_argument("cache planner_shards " + std::to_string(c.cache.planner_shards) +
                                    " must be in [1, " + std::to_string(kMaxPlannerShards) +
                                    "] (cores planning each cache pool)");
  if (c.device.capacity < 0)
    return Status::invalid_argument("device capacity " + std::to_string(c.device.capacity) + " must be >= 0");
  if (c.device.emu_max_delay_us < 0)
    return Status::invalid_argument("device emu_max_delay_us " + std::to_string(c.device.emu_max_delay_us) +
                                    " must be >= 0");
  STRATA_RETURN_IF_ERROR(check_enum(c.numa, "numa", "interleave or bind"));
  STRATA_RETURN_IF_ERROR(check_enum(c.device.backend, "device backend", "auto, cuda or emu"));
  STRATA_RETURN_IF_ERROR(check_enum(c.offload_gather, "offload_gather", "device or cpu"));
  if (c.threads < 0 || c.threads > kMaxThreads)
    return Status::invalid_argument("threads " + std::to_string(c.threads) + " must be in [0, " +
                                    std::to_string(kMaxThreads) + "] (kernel worker threads; 0: all cores)");
  if (c.numa_node < 0) return Status::invalid_argument("numa_node " + std::to_string(c.numa_node) + " must be >= 0");
  if (c.fake_numa_nodes < 0 || c.fake_numa_nodes > 64)
    return Status::invalid_argument("fake_numa_nodes " + std::to_string(c.fake_numa_nodes) + " must be in [0, 64]");
  return Status::ok();
}

namespace {

// Reads j[key] into out when present, checking the type; records the key as known.
template <typename T>
Status get(const json& j, const char* key, T& out, std::set<std::string>& known, const std::string& where) {
  known.insert(key);
  auto it = j.find(key);
  if (it == j.end()) return Status::ok();
  try {
    out = it->get<T>();
  } catch (const json::exception& e) {
    return Status::invalid_argument(where + ": field '" + key + "' has the wrong type (" + e.what() + ")");
  }
  return Status::ok();
}

Status check_unknown(const json& j, const std::set<std::string>& known, const std::string& where) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!known.count(it.key())) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      return Status::invalid_argument(where + ": unknown field '" + it.key() + "' (expected one of " + list + ")");
    }
  }
  return Status::ok();
}

Status parse_table(const json& j, std::size_t index, TableConfig& t) {
  std::string where = "tables[" + std::to_string(index) + "]";
  if (!j.is_object()) return Status::invalid_argument(where + ": expected an object");
  std::set<std::string> known;
  STRATA_RETURN_IF_ERROR(get(j, "name", t.spec.name, known, where));
  if (!t.spec.name.empty()) where = "table '" + t.spec.name + "'";
  if (!j.contains("name") || !j.contains("rows") || !j.contains("dim"))
    return Status::invalid_argument(where + ": name, rows and dim are required");
  STRATA_RETURN_IF_ERROR(get(j, "rows", t.spec.rows, known, where));
  STRATA_RETURN_IF_ERROR(get(j, "dim", t.spec.dim, known, where));
  std::string dtype = to_string(t.spec.dtype), pooling = to_string(t.spec.pooling), placement = to_string(t.placement);
  STRATA_RETURN_IF_ERROR(get(j, "dtype", dtype, known, where));
  STRATA_RETURN_IF_ERROR(get(j, "pooling", pooling, known, where));
  STRATA_RETURN_IF_ERROR(get(j, "placement", placement, known, where));
  STRATA_ASSIGN_OR_RETURN(t.spec.dtype, parse_dtype(dtype));
  STRATA_ASSIGN_OR_RETURN(t.spec.pooling, parse_pooling(pooling));
  auto pl = parse_placement(placement);
  if (!pl) return pl.status().with_context(where);
  t.placement = pl.value();
  known.insert("init");
  if (auto it = j.find("init"); it != j.end()) {
    std::set<std::string> k2;
    STRATA_RETURN_IF_ERROR(get(*it, "bound", t.spec.init.bound, k2, where + ".init"));
    STRATA_RETURN_IF_ERROR(get(*it, "seed", t.spec.init.seed, k2, where + ".init"));
    STRATA_RETURN_IF_ERROR(check_unknown(*it, k2, where + ".init"));
  }
  known.insert("optimizer");
  if (auto it = j.find("optimizer"); it != j.end()) {
    std::set<std::string> k2;
    OptimizerSpec& o = t.spec.optimizer;
    std::string kind = to_string(o.kind);
    const std::string w = where + ".optimizer";
    STRATA_RETURN_IF_ERROR(get(*it, "kind", kind, k2, w));
    auto parsed = parse_optimizer(kind);
    if (!parsed) return parsed.status().with_context(where);
    o.kind = parsed.value();
    STRATA_RETURN_IF_ERROR(get(*it, "learning_rate", o.learning_rate, k2, w));
    STRATA_RETURN_IF_ERROR(get(*it, "eps", o.eps, k2, w));
    STRATA_RETURN_IF_ERROR(get(*it, "beta1", o.beta1, k2, w));
    STRATA_RETURN_IF_ERROR(get(*it, "beta2", o.beta2, k2, w));
    STRATA_RETURN_IF_ERROR(get(*it, "weight_decay", o.weight_decay, k2, w));
    STRATA_RETURN_IF_ERROR(get(*it, "initial_accumulator", o.initial_accumulator, k2, w));
    STRATA_RETURN_IF_ERROR(check_unknown(*it, k2, w));
  }
  known.insert("cache");
  if (auto it = j.find("cache"); it != j.end()) {
    std::set<std::string> k2;
    const std::string w = where + ".cache";
    STRATA_RETURN_IF_ERROR(get(*it, "rows", t.cache.rows, k2, w));
    STRATA_RETURN_IF_ERROR(get(*it, "bytes", t.cache.bytes, k2, w));
    STRATA_RETURN_IF_ERROR(get(*it, "fraction", t.cache.fraction, k2, w));
    STRATA_RETURN_IF_ERROR(get(*it, "cap", t.cache.cap, k2, w));
    STRATA_RETURN_IF_ERROR(check_unknown(*it, k2, w));
  }
  known.insert("sharding");
  if (auto it = j.find("sharding"); it != j.end()) {
    std::set<std::string> k2;
    const std::string w = where + ".sharding";
    std::string type = dispatch::to_string(t.sharding.type);
    STRATA_RETURN_IF_ERROR(get(*it, "type", type, k2, w));
    auto parsed = dispatch::parse_sharding(type);
    if (!parsed) return parsed.status().with_context(w);
    t.sharding.type = parsed.value();
    STRATA_RETURN_IF_ERROR(get(*it, "owner", t.sharding.owner, k2, w));
    STRATA_RETURN_IF_ERROR(check_unknown(*it, k2, w));
  }
  return check_unknown(j, known, where);
}

Status parse_device_and_cache(const json& j, StoreConfig& c, std::set<std::string>& known) {
  known.insert("device");
  if (auto it = j.find("device"); it != j.end()) {
    std::set<std::string> k2;
    std::string backend = to_string(c.device.backend);
    STRATA_RETURN_IF_ERROR(get(*it, "backend", backend, k2, "config.device"));
    STRATA_ASSIGN_OR_RETURN(c.device.backend, parse_backend(backend));
    STRATA_RETURN_IF_ERROR(get(*it, "ordinal", c.device.ordinal, k2, "config.device"));
    STRATA_RETURN_IF_ERROR(get(*it, "capacity", c.device.capacity, k2, "config.device"));
    STRATA_RETURN_IF_ERROR(get(*it, "emu_max_delay_us", c.device.emu_max_delay_us, k2, "config.device"));
    STRATA_RETURN_IF_ERROR(get(*it, "emu_fail_after_ops", c.device.emu_fail_after_ops, k2, "config.device"));
    STRATA_RETURN_IF_ERROR(check_unknown(*it, k2, "config.device"));
  }
  known.insert("cache");
  if (auto it = j.find("cache"); it != j.end()) {
    std::set<std::string> k2;
    std::string policy = cache::to_string(c.cache.policy);
    STRATA_RETURN_IF_ERROR(get(*it, "policy", policy, k2, "config.cache"));
    STRATA_ASSIGN_OR_RETURN(c.cache.policy, cache::parse_policy(policy));
    STRATA_RETURN_IF_ERROR(get(*it, "lookahead", c.cache.lookahead, k2, "config.cache"));
    STRATA_RETURN_IF_ERROR(get(*it, "max_in_flight", c.cache.max_in_flight, k2, "config.cache"));
    STRATA_RETURN_IF_ERROR(get(*it, "preview", c.cache.preview, k2, "config.cache"));
    STRATA_RETURN_IF_ERROR(get(*it, "planner_shards", c.cache.planner_shards, k2, "config.cache"));
    STRATA_RETURN_IF_ERROR(check_unknown(*it, k2, "config.cache"));
  }
  std::string gather = to_string(c.offload_gather);
  STRATA_RETURN_IF_ERROR(get(j, "offload_gather", gather, known, "config"));
  STRATA_ASSIGN_OR_RETURN(c.offload_gather, parse_offload_gather(gather));
  return Status::ok();
}

}  // namespace

Result<StoreConfig> parse_store_config(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return Status::invalid_argument(std::string("config is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return Status::invalid_argument("config: expected a JSON object at the top level");
  StoreConfig c;
  std::set<std::string> known;
  const std::string where = "config";
  STRATA_RETURN_IF_ERROR(get(j, "threads", c.threads, known, where));
  std::string numa = to_string(c.numa);
  STRATA_RETURN_IF_ERROR(get(j, "numa", numa, known, where));
  STRATA_ASSIGN_OR_RETURN(c.numa, parse_numa_policy(numa));
  STRATA_RETURN_IF_ERROR(get(j, "numa_node", c.numa_node, known, where));
  STRATA_RETURN_IF_ERROR(get(j, "huge_pages", c.huge_pages, known, where));
  STRATA_RETURN_IF_ERROR(get(j, "fake_numa_nodes", c.fake_numa_nodes, known, where));
  STRATA_RETURN_IF_ERROR(parse_device_and_cache(j, c, known));
  known.insert("tables");
  auto it = j.find("tables");
  if (it == j.end() || !it->is_array()) return Status::invalid_argument("config: 'tables' must be an array of tables");
  for (std::size_t i = 0; i < it->size(); ++i) {
    TableConfig t;
    STRATA_RETURN_IF_ERROR(parse_table((*it)[i], i, t));
    c.tables.push_back(std::move(t));
  }
  STRATA_RETURN_IF_ERROR(check_unknown(j, known, where));
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

std::string to_json(const StoreConfig& c) {
  json j;
  j["threads"] = c.threads;
  j["numa"] = to_string(c.numa);
  j["numa_node"] = c.numa_node;
  j["huge_pages"] = c.huge_pages;
  j["fake_numa_nodes"] = c.fake_numa_nodes;
  j["device"] = {{"backend", to_string(c.device.backend)},
                 {"ordinal", c.device.ordinal},
                 {"capacity", c.device.capacity},
                 {"emu_max_delay_us", c.device.emu_max_delay_us},
                 {"emu_fail_after_ops", c.device.emu_fail_after_ops}};
  j["cache"] = {{"policy", cache::to_string(c.cache.policy)},
                {"lookahead", c.cache.lookahead},
                {"max_in_flight", c.cache.max_in_flight},
                {"preview", c.cache.preview},
                {"planner_shards", c.cache.planner_shards}};
  j["offload_gather"] = to_string(c.offload_gather);
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
  }
  return j.dump(2);
}

}  // namespace strata
