#include "store/detail/config_agreement.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/text.hpp"

namespace strata::detail {
namespace {

using nlohmann::json;

std::string value_text(const json& v) {
  if (v.is_string()) return "'" + v.get<std::string>() + "'";
  if (v.is_number_float()) return number_text(v.get<double>());
  return v.dump();
}

// First difference of `mine` from `theirs` (`whose`: "rank 0's"), walking objects in key order.
// `label` names the value so far: "table 'user' " (a trailing space: the keys below it follow
// without a dot), "table 'user' optimizer", or "" at the top.
std::string first_difference(const json& mine, const json& theirs, const std::string& label, const std::string& whose) {
  if (mine.is_object() && theirs.is_object()) {
    const std::string sep = label.empty() || label.back() == ' ' ? "" : ".";
    for (auto it = theirs.begin(); it != theirs.end(); ++it) {
      auto m = mine.find(it.key());
      if (m == mine.end()) return label + sep + it.key() + " is missing (" + whose + " is " + value_text(*it) + ")";
      std::string d = first_difference(*m, *it, label + sep + it.key(), whose);
      if (!d.empty()) return d;
    }
    for (auto it = mine.begin(); it != mine.end(); ++it)
      if (!theirs.contains(it.key()))
        return label + sep + it.key() + " " + value_text(*it) + " is not in " + whose + " config";
    return "";
  }
  if (mine.is_array() && theirs.is_array()) {
    if (mine.size() != theirs.size())
      return "number of " + label + " " + std::to_string(mine.size()) + " differs from " + whose + " " +
             std::to_string(theirs.size());
    for (std::size_t i = 0; i < mine.size(); ++i) {
      std::string d = first_difference(mine[i], theirs[i], label + "[" + std::to_string(i) + "]", whose);
      if (!d.empty()) return d;
    }
    return "";
  }
  if (mine == theirs) return "";
  return label + " " + value_text(mine) + " differs from " + whose + " " + value_text(theirs);
}

// Store-wide and per-table keys of to_json that may differ from rank to rank (see Store::open).
const char* const kPerRank[] = {"threads",         "numa",   "numa_node",     "huge_pages",
                                "fake_numa_nodes", "device", "offload_gather"};
const char* const kPerRankCache[] = {"policy", "lookahead", "planner_partitions", "transfer"};
const char* const kPerRankTable[] = {"cache"};

}  // namespace

std::string per_rank_fields() {
  std::string text;
  for (const char* k : kPerRank) text += std::string(text.empty() ? "" : ", ") + k;
  for (const char* k : kPerRankCache) text += std::string(", cache.") + k;
  for (const char* k : kPerRankTable) text += std::string(", each table's ") + k;
  return text;
}

std::string shared_config(const StoreConfig& config) {
  json j = json::parse(to_json(config));
  for (const char* k : kPerRank) j.erase(k);
  for (const char* k : kPerRankCache) j["cache"].erase(k);
  json& tables = j["tables"];
  for (std::size_t i = 0; i < tables.size(); ++i) {
    for (const char* k : kPerRankTable) tables[i].erase(k);
    // Not in to_json (dispatch sets it for shards), but it changes the initial rows.
    const InitializerSpec& init = config.tables[i].spec.init;
    tables[i]["init"]["row_stride"] = init.row_stride;
    tables[i]["init"]["row_offset"] = init.row_offset;
    tables[i]["init"]["col_offset"] = init.col_offset;
  }
  return j.dump();
}

std::string config_difference(const std::string& mine, const std::string& rank0, const std::string& whose) {
  const json m = json::parse(mine, nullptr, false);
  const json t = json::parse(rank0, nullptr, false);
  if (m.is_discarded() || t.is_discarded() || !m.is_object() || !t.is_object())
    return mine == rank0 ? "" : "its config cannot be read";
  // Tables first, in order, each named by its name (compared first); then the store-wide fields.
  const json& mt = m.contains("tables") ? m["tables"] : json::array();
  const json& tt = t.contains("tables") ? t["tables"] : json::array();
  if (mt.size() != tt.size())
    return "number of tables " + std::to_string(mt.size()) + " differs from " + whose + " " + std::to_string(tt.size());
  for (std::size_t i = 0; i < mt.size(); ++i) {
    const json name = mt[i].is_object() && mt[i].contains("name") ? mt[i]["name"] : json();
    const json name0 = tt[i].is_object() && tt[i].contains("name") ? tt[i]["name"] : json();
    if (name != name0)
      return "table " + std::to_string(i) + " name " + value_text(name) + " differs from " + whose + " " +
             value_text(name0);
    const std::string label =
        name.is_string() ? "table '" + name.get<std::string>() + "' " : "table " + std::to_string(i) + " ";
    std::string d = first_difference(mt[i], tt[i], label, whose);
    if (!d.empty()) return d;
  }
  json mrest = m, trest = t;
  mrest.erase("tables");
  trest.erase("tables");
  return first_difference(mrest, trest, "", whose);
}

Status agree_on_config(dispatch::Communicator& comm, const StoreConfig& config) {
  const int n = comm.size();
  if (n == 1) return Status::ok();
  const std::string mine = shared_config(config);
  // Lengths first: all_gather moves the same number of bytes from every rank, and configs that
  // differ may differ in length (a table more, a longer name).
  const std::int64_t len = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> lens(static_cast<std::size_t>(n));
  STRATA_RETURN_IF_ERROR(comm.all_gather(&len, sizeof(len), lens.data()));
  const std::int64_t width = *std::max_element(lens.begin(), lens.end());
  std::vector<char> send(static_cast<std::size_t>(width), '\0');
  std::copy(mine.begin(), mine.end(), send.begin());
  std::vector<char> all(static_cast<std::size_t>(width) * static_cast<std::size_t>(n));
  STRATA_RETURN_IF_ERROR(comm.all_gather(send.data(), width, all.data()));
  const auto text_of = [&](int r) {
    return std::string(all.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(width),
                       static_cast<std::size_t>(lens[static_cast<std::size_t>(r)]));
  };
  const std::string rank0 = text_of(0);
  std::string differ;
  int differing = 0;
  constexpr int kNamed = 4;  // ranks named in the message; the rest are counted
  for (int r = 1; r < n; ++r) {
    const std::string theirs = text_of(r);
    if (theirs == rank0) continue;
    if (++differing > kNamed) continue;
    std::string d = config_difference(theirs, rank0);
    if (d.empty()) d = "its config differs from rank 0's";  // same JSON, other bytes: cannot happen with one to_json
    differ += (differ.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + d);
  }
  if (differing == 0) return Status::ok();
  if (differing > kNamed) differ += "; and " + std::to_string(differing - kNamed) + " more ranks";
  return Status::invalid_argument(
      "ranks opened the store with different configs: " + differ +
      " (every rank must open it with the same tables and shared settings; see Store::open)");
}

}  // namespace strata::detail
