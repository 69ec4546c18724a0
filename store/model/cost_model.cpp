#include "store/model/cost_model.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "dispatch/sharding_plan.hpp"
#include "gpu/staging.hpp"
#include "host/host_table.hpp"
#include "host/repeats.hpp"
#include "host/topology.hpp"
#include "store/detail/json_keys.hpp"
#include "store/detail/numa_home.hpp"
#include "store/engines/cache_transfers.hpp"
#include "store/engines/cached_engine.hpp"
#include "store/engines/cpu_engine.hpp"
#include "store/engines/device_features.hpp"
#include "store/engines/sharded_engine.hpp"

namespace strata {
namespace {

using nlohmann::json;

// The number fields of a profile, in file order, with a pointer to the member they fill.
struct NumberField {
  const char* key;
  ProfileNumber HardwareProfile::*member;
};
constexpr NumberField kNumberFields[] = {
    {"gpus", &HardwareProfile::gpus},
    {"hbm_gbs", &HardwareProfile::hbm_gbs},
    {"pcie_h2d_gbs", &HardwareProfile::pcie_h2d_gbs},
    {"pcie_d2h_gbs", &HardwareProfile::pcie_d2h_gbs},
    {"pcie_latency_us", &HardwareProfile::pcie_latency_us},
    {"all_to_all_gbs", &HardwareProfile::all_to_all_gbs},
    {"kernel_launch_us", &HardwareProfile::kernel_launch_us},
    {"hbm_capacity_gb", &HardwareProfile::hbm_capacity_gb},
    {"host_memory_gb", &HardwareProfile::host_memory_gb},
};

std::string expected_top_level() {
  std::string s = "name, description, numa_nodes";
  for (const auto& f : kNumberFields) s += std::string(", ") + f.key;
  return s + ", gpu_numa_nodes, l2_cache_bytes";
}

// A scalar value as JSON for a message, cut to 64 characters (a user's value can be megabytes
// long); nothing for an array or object, whose type name says enough and whose dump would recurse.
std::string quote_value(const json& v) {
  if (!v.is_primitive()) return "";
  const std::string s = v.dump(-1, ' ', /*ensure_ascii=*/true);
  return " " + (s.size() > 64 ? s.substr(0, 61) + "..." : s);
}

// An object {"value": ..., "source": string} (`shape` describes it for messages) into a T with a
// `source` member; `read_value(x, out)` reads the value, its errors naming where.value.
template <typename T, typename ReadValue>
Result<T> parse_sourced(const std::string& where, const json& v, const std::string& shape, ReadValue read_value) {
  if (!v.is_object())
    return Status::invalid_argument(where + " must be an object " + shape + " (got " + std::string(v.type_name()) +
                                    ")");
  T out;
  bool have_value = false, have_source = false;
  for (const auto& [key, x] : v.items()) {
    if (key == "value") {
      STRATA_RETURN_IF_ERROR(read_value(x, out));
      have_value = true;
    } else if (key == "source") {
      if (!x.is_string())
        return Status::invalid_argument(where + ".source must be a string (got " + std::string(x.type_name()) + ")");
      out.source = x.template get<std::string>();
      have_source = true;
    } else {
      return Status::invalid_argument(where + ": unknown field '" + key + "' (expected value, source)");
    }
  }
  if (!have_value) return Status::invalid_argument(where + ": missing field 'value'");
  if (!have_source) return Status::invalid_argument(where + ": missing field 'source'");
  return out;
}

Result<ProfileNumber> parse_number(const std::string& where, const json& v) {
  return parse_sourced<ProfileNumber>(
      where, v, "{\"value\": number, \"source\": string}", [&](const json& x, ProfileNumber& n) {
        if (!x.is_number())
          return Status::invalid_argument(where + ".value must be a number (got " + std::string(x.type_name()) +
                                          quote_value(x) + ")");
        n.value = x.get<double>();
        return Status::ok();
      });
}

// "gather": [{"row_bytes": integer, "local_rows_per_s": N, "remote_rows_per_s": N}, ...].
Result<std::vector<GatherRate>> parse_gather(const std::string& where, const json& v) {
  if (!v.is_array())
    return Status::invalid_argument(where +
                                    " must be an array of {row_bytes, local_rows_per_s, remote_rows_per_s} (got " +
                                    std::string(v.type_name()) + ")");
  std::vector<GatherRate> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    const json& e = v[i];
    if (!e.is_object())
      return Status::invalid_argument(at + " must be an object (got " + std::string(e.type_name()) + ")");
    GatherRate g;
    bool have_bytes = false, have_local = false, have_remote = false;
    for (const auto& [key, x] : e.items()) {
      if (key == "row_bytes") {
        if (!x.is_number_integer())
          return Status::invalid_argument(at + ".row_bytes must be an integer (got " + std::string(x.type_name()) +
                                          quote_value(x) + ")");
        g.row_bytes = x.get<std::int64_t>();
        have_bytes = true;
      } else if (key == "local_rows_per_s") {
        STRATA_ASSIGN_OR_RETURN(g.local_rows_per_s, parse_number(at + ".local_rows_per_s", x));
        have_local = true;
      } else if (key == "remote_rows_per_s") {
        STRATA_ASSIGN_OR_RETURN(g.remote_rows_per_s, parse_number(at + ".remote_rows_per_s", x));
        have_remote = true;
      } else {
        return Status::invalid_argument(at + ": unknown field '" + key +
                                        "' (expected row_bytes, local_rows_per_s, remote_rows_per_s)");
      }
    }
    if (!have_bytes) return Status::invalid_argument(at + ": missing field 'row_bytes'");
    if (!have_local) return Status::invalid_argument(at + ": missing field 'local_rows_per_s'");
    if (!have_remote) return Status::invalid_argument(at + ": missing field 'remote_rows_per_s'");
    out.push_back(std::move(g));
  }
  return out;
}

// "gpu_numa_nodes": {"value": [integer, ...], "source": string}; its size and range are validate's.
Result<GpuNumaNodes> parse_gpu_nodes(const std::string& where, const json& v) {
  return parse_sourced<GpuNumaNodes>(
      where, v, "{\"value\": [node of each GPU], \"source\": string}", [&](const json& x, GpuNumaNodes& g) {
        if (!x.is_array())
          return Status::invalid_argument(where + ".value must be an array of node indices (got " +
                                          std::string(x.type_name()) + quote_value(x) + ")");
        for (std::size_t i = 0; i < x.size(); ++i) {
          const json& e = x[i];
          if (!e.is_number_integer() || e.get<std::int64_t>() < std::numeric_limits<int>::min() ||
              e.get<std::int64_t>() > std::numeric_limits<int>::max())
            return Status::invalid_argument(where + ".value[" + std::to_string(i) + "] must be a node index (got " +
                                            std::string(e.type_name()) + quote_value(e) + ")");
          g.value.push_back(e.get<int>());
        }
        if (g.value.empty())
          return Status::invalid_argument(where +
                                          ".value is empty (expected the node of each GPU; leave gpu_numa_nodes out "
                                          "when they are not known)");
        return Status::ok();
      });
}

// A number for messages: "-1", "1.5", "nan".
std::string show(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

Status check_number(const std::string& where, const ProfileNumber& n, bool allow_zero) {
  if (!std::isfinite(n.value) || n.value < 0 || (!allow_zero && n.value == 0))
    return Status::invalid_argument(where + " = " + show(n.value) + " (expected a finite number " +
                                    (allow_zero ? ">= 0)" : "> 0)"));
  if (n.source.empty())
    return Status::invalid_argument(where + ": empty source (expected where the number comes from)");
  return Status::ok();
}

json number_json(const ProfileNumber& n) { return json{{"value", n.value}, {"source", n.source}}; }

// `v` with 3 significant digits and no exponent or trailing zeros: 3.1, 56.4, 420, 0.05.
std::string sig3(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : "%.2f", v);
  std::string s = buf;
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s;
}

// `v` in the largest of `units` (each 1000x the previous) that keeps it >= 1.
std::string with_unit(double v, const char* const* units, int n_units) {
  int u = 0;
  while (u + 1 < n_units && v >= 1000.0) {
    v /= 1000.0;
    ++u;
  }
  return sig3(v) + " " + units[u];
}

std::string format_bytes(double b) {
  static const char* const kUnits[] = {"B", "KB", "MB", "GB", "TB"};
  return with_unit(b, kUnits, 5);
}

std::string format_gbs(double g) {
  static const char* const kUnits[] = {"GB/s", "TB/s"};
  return with_unit(g, kUnits, 2);
}

// Seconds as "56.4 ms", "830 us", "1.2 s".
std::string format_seconds(double s) {
  if (s >= 1.0) return sig3(s) + " s";
  if (s >= 1e-3) return sig3(s * 1e3) + " ms";
  return sig3(s * 1e6) + " us";
}

double nonneg(double x) { return std::isfinite(x) && x > 0 ? x : 0.0; }

}  // namespace

const char* link_name(Link link) noexcept {
  switch (link) {
    case Link::kHbm:
      return "hbm";
    case Link::kPcieH2d:
      return "pcie_h2d";
    case Link::kPcieD2h:
      return "pcie_d2h";
    case Link::kHostDram:
      return "host_dram";
    case Link::kAllToAll:
      return "all_to_all";
  }
  return "?";
}

const char* link_label(Link link) noexcept {
  switch (link) {
    case Link::kHbm:
      return "HBM";
    case Link::kPcieH2d:
      return "PCIe H2D";
    case Link::kPcieD2h:
      return "PCIe D2H";
    case Link::kHostDram:
      return "host DRAM";
    case Link::kAllToAll:
      return "all-to-all";
  }
  return "?";
}

namespace {

Status validate_as(const HardwareProfile& p, const std::string& who) {
  if (p.name.empty()) return Status::invalid_argument(who + ": empty name (expected a short id like h200-pcie5)");
  for (const auto& f : kNumberFields) {
    const bool latency = std::strstr(f.key, "_us") != nullptr;
    STRATA_RETURN_IF_ERROR(check_number(who + ": " + f.key, p.*(f.member), latency));
  }
  if (p.gpus.value != std::floor(p.gpus.value) || p.gpus.value < 1)
    return Status::invalid_argument(who + ": gpus = " + show(p.gpus.value) + " (expected an integer >= 1)");
  if (p.numa_nodes.empty()) return Status::invalid_argument(who + ": numa_nodes is empty (expected at least one node)");
  for (std::size_t i = 0; i < p.numa_nodes.size(); ++i) {
    const std::string where = who + ": numa_nodes[" + std::to_string(i) + "]";
    const NumaNodeProfile& node = p.numa_nodes[i];
    STRATA_RETURN_IF_ERROR(check_number(where + ".local_gbs", node.local_gbs, false));
    STRATA_RETURN_IF_ERROR(check_number(where + ".remote_gbs", node.remote_gbs, false));
    for (std::size_t g = 0; g < node.gather.size(); ++g) {
      const std::string at = where + ".gather[" + std::to_string(g) + "]";
      const GatherRate& r = node.gather[g];
      if (r.row_bytes <= 0 || (g > 0 && r.row_bytes <= node.gather[g - 1].row_bytes))
        return Status::invalid_argument(
            at + ".row_bytes = " + std::to_string(r.row_bytes) +
            (g == 0 ? " (expected > 0)"
                    : " (expected > the previous entry's " + std::to_string(node.gather[g - 1].row_bytes) + ")"));
      STRATA_RETURN_IF_ERROR(check_number(at + ".local_rows_per_s", r.local_rows_per_s, false));
      STRATA_RETURN_IF_ERROR(check_number(at + ".remote_rows_per_s", r.remote_rows_per_s, false));
    }
    const auto& first = p.numa_nodes.front().gather;
    bool same = node.gather.size() == first.size();
    for (std::size_t g = 0; same && g < first.size(); ++g) same = node.gather[g].row_bytes == first[g].row_bytes;
    if (!same)
      return Status::invalid_argument(where +
                                      ".gather: row sizes differ from numa_nodes[0]'s (expected the same "
                                      "row_bytes on every node, or no gather rates on any)");
  }
  const ProfileNumber& l2 = p.l2_cache_bytes;
  if (!std::isfinite(l2.value) || l2.value < 0 || l2.value != std::floor(l2.value) || l2.value > 0x1p40)
    return Status::invalid_argument(who + ": l2_cache_bytes = " + show(l2.value) +
                                    " (expected a whole number of bytes in [1, 2^40], or leave it out)");
  if (l2.value > 0 && l2.source.empty())
    return Status::invalid_argument(who + ": l2_cache_bytes: empty source (expected where the size comes from)");
  const std::vector<int>& gpu_nodes = p.gpu_numa_nodes.value;
  if (gpu_nodes.empty()) return Status::ok();
  const std::string where = who + ": gpu_numa_nodes";
  if (gpu_nodes.size() != static_cast<std::size_t>(p.gpus.value))
    return Status::invalid_argument(where + " lists " + std::to_string(gpu_nodes.size()) +
                                    " nodes (expected one per GPU: gpus = " + show(p.gpus.value) + ")");
  for (std::size_t g = 0; g < gpu_nodes.size(); ++g)
    if (gpu_nodes[g] < 0 || gpu_nodes[g] >= static_cast<int>(p.numa_nodes.size()))
      return Status::invalid_argument(where + ".value[" + std::to_string(g) + "] = " + std::to_string(gpu_nodes[g]) +
                                      " (expected a node in [0, " + std::to_string(p.numa_nodes.size()) +
                                      "): the profile has " + std::to_string(p.numa_nodes.size()) + " numa_nodes)");
  if (p.gpu_numa_nodes.source.empty())
    return Status::invalid_argument(where + ": empty source (expected where the GPUs' nodes come from)");
  return Status::ok();
}

}  // namespace

Status validate(const HardwareProfile& p) { return validate_as(p, "profile '" + p.name + "'"); }

Result<HardwareProfile> parse_hardware_profile(const std::string& json_text, const std::string& origin) {
  const std::string who = "profile '" + origin + "'";
  json j;
  DuplicateKeys keys;
  try {
    j = json::parse(json_text, detail::duplicate_keys_callback(keys));
  } catch (const json::parse_error& e) {
    return Status::invalid_argument(who + ": invalid JSON: " + e.what());
  }
  STRATA_RETURN_IF_ERROR(keys.status(who));
  if (!j.is_object())
    return Status::invalid_argument(who + ": expected a JSON object, got " + std::string(j.type_name()));
  HardwareProfile p;
  bool have_name = false, have_description = false, have_numa = false;
  bool have_number[std::size(kNumberFields)] = {};
  for (const auto& [key, v] : j.items()) {
    const std::string where = who + ": " + key;
    if (key == "name" || key == "description") {
      if (!v.is_string())
        return Status::invalid_argument(where + " must be a string (got " + std::string(v.type_name()) + ")");
      (key == "name" ? p.name : p.description) = v.get<std::string>();
      (key == "name" ? have_name : have_description) = true;
      continue;
    }
    if (key == "numa_nodes") {
      if (!v.is_array())
        return Status::invalid_argument(where + " must be an array of {local_gbs, remote_gbs} (got " +
                                        std::string(v.type_name()) + ")");
      for (std::size_t i = 0; i < v.size(); ++i) {
        const std::string node_where = where + "[" + std::to_string(i) + "]";
        const json& node = v[i];
        if (!node.is_object())
          return Status::invalid_argument(node_where + " must be an object (got " + std::string(node.type_name()) +
                                          ")");
        NumaNodeProfile n;
        bool have_local = false, have_remote = false;
        for (const auto& [nkey, nv] : node.items()) {
          if (nkey == "local_gbs") {
            STRATA_ASSIGN_OR_RETURN(n.local_gbs, parse_number(node_where + ".local_gbs", nv));
            have_local = true;
          } else if (nkey == "remote_gbs") {
            STRATA_ASSIGN_OR_RETURN(n.remote_gbs, parse_number(node_where + ".remote_gbs", nv));
            have_remote = true;
          } else if (nkey == "gather") {
            STRATA_ASSIGN_OR_RETURN(n.gather, parse_gather(node_where + ".gather", nv));
          } else {
            return Status::invalid_argument(node_where + ": unknown field '" + nkey +
                                            "' (expected local_gbs, remote_gbs, gather)");
          }
        }
        if (!have_local) return Status::invalid_argument(node_where + ": missing field 'local_gbs'");
        if (!have_remote) return Status::invalid_argument(node_where + ": missing field 'remote_gbs'");
        p.numa_nodes.push_back(std::move(n));
      }
      have_numa = true;
      continue;
    }
    if (key == "gpu_numa_nodes") {
      STRATA_ASSIGN_OR_RETURN(p.gpu_numa_nodes, parse_gpu_nodes(where, v));
      continue;
    }
    if (key == "l2_cache_bytes") {
      STRATA_ASSIGN_OR_RETURN(p.l2_cache_bytes, parse_number(where, v));
      continue;
    }
    bool known = false;
    for (std::size_t f = 0; f < std::size(kNumberFields); ++f) {
      if (key == kNumberFields[f].key) {
        STRATA_ASSIGN_OR_RETURN(p.*(kNumberFields[f].member), parse_number(where, v));
        have_number[f] = true;
        known = true;
        break;
      }
    }
    if (!known)
      return Status::invalid_argument(who + ": unknown field '" + key + "' (expected " + expected_top_level() + ")");
  }
  if (!have_name) return Status::invalid_argument(who + ": missing field 'name'");
  if (!have_description) return Status::invalid_argument(who + ": missing field 'description'");
  if (!have_numa) return Status::invalid_argument(who + ": missing field 'numa_nodes'");
  for (std::size_t f = 0; f < std::size(kNumberFields); ++f)
    if (!have_number[f]) return Status::invalid_argument(who + ": missing field '" + kNumberFields[f].key + "'");
  STRATA_RETURN_IF_ERROR(validate_as(p, who));
  return p;
}

Result<HardwareProfile> load_hardware_profile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return Status::not_found("profile file '" + path + "' does not exist");
    return Status::io_error("cannot open profile file '" + path + "': " + std::strerror(errno));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::io_error("cannot read profile file '" + path + "': " + std::strerror(errno));
  return parse_hardware_profile(ss.str(), path);
}

std::string hardware_profile_to_json(const HardwareProfile& p) {
  json j = json::object();
  j["name"] = p.name;
  j["description"] = p.description;
  for (const auto& f : kNumberFields) j[f.key] = number_json(p.*(f.member));
  j["numa_nodes"] = json::array();
  for (const auto& n : p.numa_nodes) {
    json node{{"local_gbs", number_json(n.local_gbs)}, {"remote_gbs", number_json(n.remote_gbs)}};
    if (!n.gather.empty()) {
      node["gather"] = json::array();
      for (const GatherRate& g : n.gather)
        node["gather"].push_back(json{{"row_bytes", g.row_bytes},
                                      {"local_rows_per_s", number_json(g.local_rows_per_s)},
                                      {"remote_rows_per_s", number_json(g.remote_rows_per_s)}});
    }
    j["numa_nodes"].push_back(std::move(node));
  }
  if (!p.gpu_numa_nodes.value.empty())
    j["gpu_numa_nodes"] = json{{"value", p.gpu_numa_nodes.value}, {"source", p.gpu_numa_nodes.source}};
  if (p.l2_cache_bytes.value > 0) j["l2_cache_bytes"] = number_json(p.l2_cache_bytes);
  return j.dump(2);
}

Result<HostTableMemory> host_table_memory(const StoreConfig& config, int numa_nodes, int world, int rank,
                                          std::uint64_t l2_bytes) {
  int nodes = config.fake_numa_nodes > 0 ? config.fake_numa_nodes : numa_nodes;
  if (nodes <= 0) {
    auto topo = Topology::discover();
    nodes = topo ? topo->num_nodes() : 1;
  }
  // As StoreImpl::init sets them for a store without a GPU: `numa: auto` is priced as interleave, an upper
  // bound (the node of the GPU is known only when the store opens; bound to it, a table's parts share one
  // node's arenas, so it maps at most this much).
  const HostTableOptions options =
      detail::resolve_numa_home(config, Topology::fake(nodes), false, "", detail::NumaAbilities{}).host;
  // The engines that hold host tables, each with its own ArenaPacker (store/engines/*_engine.cpp): cpu,
  // offload, cached (with `hybrid` when there is no communicator), and the sharded engine's cached
  // shards of `hybrid` tables.
  enum Group { kCpuG, kOffloadG, kCachedG, kShardedG, kGroups };
  std::vector<TableSpec> group[kGroups];
  for (std::size_t t = 0; t < config.tables.size(); ++t) {
    const TableConfig& tc = config.tables[t];
    switch (tc.placement) {
      case Placement::kCpu:
        group[kCpuG].push_back(tc.spec);
        break;
      case Placement::kOffload:
        group[kOffloadG].push_back(tc.spec);
        break;
      case Placement::kCached:
        group[kCachedG].push_back(tc.spec);
        break;
      case Placement::kGpu:
        break;  // rows in device memory
      case Placement::kHybrid:
        if (world == 0) {
          group[kCachedG].push_back(tc.spec);
        } else {
          STRATA_ASSIGN_OR_RETURN(dispatch::ShardLayout layout,
                                  dispatch::ShardLayout::make(tc.spec, tc.sharding, world, static_cast<int>(t)));
          if (layout.holds(rank)) group[kShardedG].push_back(layout.shard_spec(tc.spec, rank));
        }
        break;
    }
  }
  HostTableMemory m;
  // cpu and offload tables run backward on the CPU (store/engines/cpu_engine.hpp): each keeps a
  // find_repeats map per arena thread that has scanned it, and each engine's HostBatch one more for
  // its shared pass over the tables of up to kSharedRepeatsRows rows (a table may use both: it joins
  // the shared pass only in batches of few keys).
  const double threads = config.threads > 0 ? config.threads : std::max(1u, std::thread::hardware_concurrency());
  for (const int g : {kCpuG, kOffloadG}) {
    std::int64_t shared_rows = 0;
    for (const TableSpec& spec : group[g]) {
      m.scratch_bytes += threads * 8.0 * static_cast<double>(find_repeats_map_entries(spec.rows, l2_bytes));
      if (spec.rows <= detail::HostBatch::kSharedRepeatsRows) shared_rows += spec.rows;
    }
    shared_rows = std::min(shared_rows, kRepeatsTablesMaxRows);
    m.scratch_bytes += threads * 8.0 * static_cast<double>(find_repeats_map_entries(shared_rows, l2_bytes));
  }
  for (const auto& specs : group) {
    const HostFootprint f = host_footprint(specs, options, nodes, true);
    m.record_bytes += static_cast<double>(f.record_bytes);
    m.mapped_bytes += static_cast<double>(f.mapped_bytes);
    m.tables += static_cast<double>(specs.size());
    m.packed_tables += static_cast<double>(f.packed_tables);
  }
  return m;
}

double EngineStaging::gpu_feature(std::int64_t bags, std::int64_t keys, std::int64_t weights, std::int64_t unique) {
  return static_cast<double>(detail::feature_metadata_bytes(bags, keys, static_cast<std::size_t>(weights), unique));
}

double EngineStaging::sharded_feature(std::int64_t bags, std::int64_t keys, std::int64_t weights, std::int64_t unique) {
  return static_cast<double>(
      detail::sharded_feature_metadata_bytes(bags, keys, static_cast<std::size_t>(weights), unique));
}

double EngineStaging::offload_feature(std::int64_t bags, std::int64_t keys, std::int64_t weights) {
  using gpu::Staging;  // as store/engines/offload_engine.cpp stages them
  return static_cast<double>(Staging::bytes_for<std::int64_t>(static_cast<std::size_t>(bags + 1)) +
                             Staging::bytes_for<Key>(static_cast<std::size_t>(keys)) +
                             Staging::bytes_for<float>(static_cast<std::size_t>(weights)));
}

double EngineStaging::list(std::int64_t n) {
  return static_cast<double>(gpu::Staging::bytes_for<std::uint64_t>(static_cast<std::size_t>(n)));
}

std::int64_t EngineStaging::flush_rows(std::int64_t slots, std::int64_t stride) {
  return detail::cache_flush_rows(slots, stride);
}

std::int64_t EngineStaging::transfer_probe_rows(std::int64_t slots) {
  return std::min(slots, detail::kTransferProbeRows);
}

bool has_gather_rates(const HardwareProfile& p) noexcept {
  if (p.numa_nodes.empty()) return false;
  for (const auto& n : p.numa_nodes)
    if (n.gather.empty()) return false;
  return true;
}

double node_gather_rows_per_s(const HardwareProfile& p, int node, double row_bytes, bool remote) {
  if (!has_gather_rates(p) || !(row_bytes > 0) || node < 0 || node >= static_cast<int>(p.numa_nodes.size())) return 0.0;
  const auto rate = [&](const GatherRate& g) { return (remote ? g.remote_rows_per_s : g.local_rows_per_s).value; };
  const auto& g = p.numa_nodes[static_cast<std::size_t>(node)].gather;
  if (row_bytes <= static_cast<double>(g.front().row_bytes)) return rate(g.front());
  if (row_bytes >= static_cast<double>(g.back().row_bytes))
    return rate(g.back()) * static_cast<double>(g.back().row_bytes) / row_bytes;  // bandwidth-bound beyond
  std::size_t i = 1;
  while (static_cast<double>(g[i].row_bytes) < row_bytes) ++i;
  const double b0 = static_cast<double>(g[i - 1].row_bytes), b1 = static_cast<double>(g[i].row_bytes);
  const double w = (row_bytes - b0) / (b1 - b0);
  const double seconds_per_row = (1 - w) / rate(g[i - 1]) + w / rate(g[i]);  // linear in time per row
  return 1.0 / seconds_per_row;
}

double host_gather_rows_per_s(const HardwareProfile& p, double row_bytes, bool remote) {
  double total = 0.0;
  for (int node = 0; node < static_cast<int>(p.numa_nodes.size()); ++node)
    total += node_gather_rows_per_s(p, node, row_bytes, remote);
  return total;
}

int gpu_numa_node(const HardwareProfile& p, int gpu) {
  const int gpus = std::max(1, static_cast<int>(p.gpus.value));
  const int nodes = std::max(1, static_cast<int>(p.numa_nodes.size()));
  gpu = std::clamp(gpu, 0, gpus - 1);
  if (!p.gpu_numa_nodes.value.empty())
    return std::clamp(p.gpu_numa_nodes.value[static_cast<std::size_t>(gpu) % p.gpu_numa_nodes.value.size()], 0,
                      nodes - 1);
  return static_cast<int>(static_cast<std::int64_t>(gpu) * nodes / gpus);
}

ModelOptions model_options(const HardwareProfile& profile, int ranks, NumaPolicy numa, bool store_has_device) {
  ModelOptions o;
  o.ranks_per_host = std::max(1, std::min(ranks, static_cast<int>(profile.gpus.value)));
  o.host_on_gpu_node = store_has_device && numa == NumaPolicy::kAuto;
  return o;
}

namespace {

// Seconds of host DRAM for `b` on the memory of `nodes` (indices into the profile's numa_nodes), their
// bandwidth and gather rates shared by `ranks` ranks; `remote_bytes` of the host bytes cross nodes.
double host_dram_seconds(const HardwareProfile& p, const StepBytes& b, const std::vector<int>& nodes, double ranks,
                         double remote_bytes) {
  double local_gbs = 0.0, remote_gbs = 0.0;
  for (const int n : nodes) {
    local_gbs += p.numa_nodes[static_cast<std::size_t>(n)].local_gbs.value;
    remote_gbs += p.numa_nodes[static_cast<std::size_t>(n)].remote_gbs.value;
  }
  local_gbs /= ranks;
  remote_gbs /= ranks;
  const auto rows_per_s = [&](double row_bytes, bool remote) {
    double total = 0.0;
    for (const int n : nodes) total += node_gather_rows_per_s(p, n, row_bytes, remote);
    return total / ranks;
  };
  const double host_bytes = nonneg(b.host_read) + nonneg(b.host_write);
  if (host_bytes <= 0) return 0.0;
  const double remote = std::min(remote_bytes, host_bytes);
  const double remote_share = remote / host_bytes;
  // Random-row gathers at the profile's rates where it has them; their bytes leave the sequential part.
  double gather_bytes = 0.0, gather_s = 0.0;
  if (has_gather_rates(p)) {
    for (const RowGather& g : b.host_gathers) {
      const double rows = nonneg(g.rows), row_bytes = nonneg(g.row_bytes);
      if (rows <= 0 || row_bytes <= 0) continue;
      gather_bytes += rows * row_bytes;
      gather_s += rows * (1 - remote_share) / rows_per_s(row_bytes, false);
      if (remote_share > 0) gather_s += rows * remote_share / rows_per_s(row_bytes, true);
    }
  }
  gather_bytes = std::min(gather_bytes, host_bytes);
  const double sequential_local = std::max(0.0, (host_bytes - remote) - gather_bytes * (1 - remote_share));
  const double sequential_remote = std::max(0.0, remote - gather_bytes * remote_share);
  return sequential_local / (local_gbs * 1e9) + sequential_remote / (remote_gbs * 1e9) + gather_s;
}

// "0-3", "0, 2, 5": ascending integers, runs joined.
std::string ranges_text(const std::vector<int>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size();) {
    std::size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(v[i]) + (j > i ? "-" + std::to_string(v[j]) : "");
    i = j + 1;
  }
  return s;
}

// Host DRAM as the header comment prices it: the link's seconds, and ModelledStep's host_node and
// host_pricing.
void price_host_dram(const HardwareProfile& p, const StepBytes& b, const ModelOptions& options, ModelledStep& m) {
  const int ranks = std::max(1, options.ranks_per_host);
  const int nodes = static_cast<int>(p.numa_nodes.size());
  const auto rank_text = [](int n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); };
  LinkTime& host = m.links[static_cast<int>(Link::kHostDram)];
  host.bytes = nonneg(b.host_read) + nonneg(b.host_write);
  if (!options.host_on_gpu_node) {
    std::vector<int> all(static_cast<std::size_t>(nodes));
    double local_gbs = 0.0;
    for (int n = 0; n < nodes; ++n) {
      all[static_cast<std::size_t>(n)] = n;
      local_gbs += p.numa_nodes[static_cast<std::size_t>(n)].local_gbs.value;
    }
    host.seconds = host_dram_seconds(p, b, all, ranks, nonneg(b.host_remote));
    m.host_pricing = "spread over the " + std::to_string(nodes) + " NUMA node" + (nodes == 1 ? "" : "s") + " (" +
                     format_gbs(local_gbs) + " local in all, shared by " + rank_text(ranks) + ")";
  } else {
    // Rank r on GPU r; the ranks on each node.
    std::vector<std::vector<int>> on_node(static_cast<std::size_t>(nodes));
    for (int r = 0; r < ranks; ++r) on_node[static_cast<std::size_t>(gpu_numa_node(p, r))].push_back(r);
    m.host_pricing = "each rank's on its GPU's NUMA node (numa auto):";
    for (int n = 0; n < nodes; ++n) {
      const auto& rs = on_node[static_cast<std::size_t>(n)];
      if (rs.empty()) continue;
      const double s = host_dram_seconds(p, b, {n}, static_cast<double>(rs.size()), 0.0);
      if (m.host_node < 0 || s > host.seconds) {
        host.seconds = s;
        m.host_node = n;
      }
      m.host_pricing += std::string(m.host_pricing.back() == ':' ? " " : ", ") + "node " + std::to_string(n) +
                        " for GPU" + (rs.size() == 1 ? " " : "s ") + ranges_text(rs) + " (" +
                        format_gbs(p.numa_nodes[static_cast<std::size_t>(n)].local_gbs.value) + " local, shared by " +
                        rank_text(static_cast<int>(rs.size())) + ")";
    }
    if (p.gpu_numa_nodes.value.empty() && nodes > 1)
      m.host_pricing += " (the profile has no gpu_numa_nodes: GPUs assumed spread over the nodes in order)";
    const bool several = std::count_if(on_node.begin(), on_node.end(), [](const auto& v) { return !v.empty(); }) > 1;
    if (several)
      m.host_pricing += "; node " + std::to_string(m.host_node) + "'s ranks are the slowest and price the step";
  }
  host.gbs = host.seconds > 0 ? host.bytes / host.seconds / 1e9 : 0.0;
}

}  // namespace

ModelledStep model_step(const HardwareProfile& p, const StepBytes& b, const ModelOptions& options) {
  ModelledStep m;
  auto& hbm = m.links[static_cast<int>(Link::kHbm)];
  auto& h2d = m.links[static_cast<int>(Link::kPcieH2d)];
  auto& d2h = m.links[static_cast<int>(Link::kPcieD2h)];
  auto& a2a = m.links[static_cast<int>(Link::kAllToAll)];

  const auto bandwidth_link = [](LinkTime& l, double bytes, double gbs, double latency_s) {
    l.bytes = bytes;
    l.gbs = bytes > 0 ? gbs : 0.0;
    l.seconds = bytes > 0 ? bytes / (gbs * 1e9) + latency_s : 0.0;
  };
  bandwidth_link(hbm, nonneg(b.hbm_read) + nonneg(b.hbm_write), p.hbm_gbs.value, 0.0);
  bandwidth_link(h2d, nonneg(b.h2d), p.pcie_h2d_gbs.value, p.pcie_latency_us.value * 1e-6);
  bandwidth_link(d2h, nonneg(b.d2h), p.pcie_d2h_gbs.value, p.pcie_latency_us.value * 1e-6);
  bandwidth_link(a2a, nonneg(b.all_to_all), p.all_to_all_gbs.value, 0.0);

  if (!b.host_gathers.empty()) m.gather_model = has_gather_rates(p) ? "gather rates" : "sequential bandwidth";
  price_host_dram(p, b, options, m);

  m.launch_s = nonneg(b.launches) * p.kernel_launch_us.value * 1e-6;
  int slowest = 0;
  double max_s = 0.0, sum_s = 0.0;
  for (int i = 0; i < kNumLinks; ++i) {
    sum_s += m.links[i].seconds;
    if (m.links[i].seconds > max_s) {
      max_s = m.links[i].seconds;
      slowest = i;
    }
  }
  m.step_s = max_s + m.launch_s;
  m.serial_s = sum_s + m.launch_s;

  if (m.step_s <= 0.0) {
    m.bottleneck = "none";
    m.explanation = "idle: no bytes moved and no kernel launches";
  } else if (m.launch_s > max_s) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.0f", nonneg(b.launches));
    m.bottleneck = "launch";
    m.explanation = std::string("launch-bound: ") + buf + " kernel launches at " +
                    format_seconds(p.kernel_launch_us.value * 1e-6) + " = " + format_seconds(m.launch_s) + " of a " +
                    format_seconds(m.step_s) + " step";
  } else {
    const auto link = static_cast<Link>(slowest);
    const LinkTime& l = m.links[slowest];
    m.bottleneck = link_name(link);
    m.explanation = std::string(link_label(link)) + "-bound: " + format_bytes(l.bytes) + " per step at " +
                    format_gbs(l.gbs) + " = " + format_seconds(l.seconds) + " of a " + format_seconds(m.step_s) +
                    " step (serial sum " + format_seconds(m.serial_s) + ")";
  }
  if (m.gather_model == "gather rates")
    m.explanation += "; host gathers at the profile's random-row rates";
  else if (m.gather_model == "sequential bandwidth")
    m.explanation +=
        "; host gathers priced at sequential bandwidth (the profile has no gather rates: run strata-tune "
        "calibrate)";
  if (m.host_node >= 0 && p.numa_nodes.size() > 1 && m.bottleneck == link_name(Link::kHostDram))
    m.explanation += "; host DRAM of node " + std::to_string(m.host_node) + ", the GPU's";
  return m;
}

}  // namespace strata
