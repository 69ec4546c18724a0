#include "toolkit/feature_tables.hpp"

#include <algorithm>
#include <map>

#include "core/table_spec.hpp"
#include "toolkit/bounded_input.hpp"
#include "toolkit/cli_flags.hpp"

namespace strata::bench {
namespace {

const char* const kMappingSyntax = "expected TABLE=FEATURE[+FEATURE...], e.g. item=clicked+bought,user=user_id";

// The items of "a+b+c", empty ones included.
std::vector<std::string> split_plus(const std::string& text) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != '+') continue;
    out.push_back(text.substr(begin, i - begin));
    begin = i + 1;
  }
  return out;
}

}  // namespace

std::string name_list(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size() && i < 8; ++i) s += (i ? ", " : "") + quote_prefix(names[i]);
  if (names.size() > 8) s += ", ... (" + std::to_string(names.size()) + " in all)";
  return s;
}

Status check_same_features(const std::string& table, const std::vector<std::string>& listed, const std::string& config,
                           const std::vector<std::string>& used, const std::string& source) {
  if (listed == used) return Status::ok();
  const auto said = [](const std::vector<std::string>& names) {
    return names.empty() ? std::string("its own name") : "features " + name_list(names);
  };
  return Status::invalid_argument("table '" + table + "' is looked up by " + said(listed) + " in the " + config +
                                  " but by " + said(used) + " in the " + source);
}

bool is_table_mapping(const std::string& text) {
  for (const std::string& item : split_list(text)) {
    const std::size_t eq = item.find('=');
    if (eq != std::string::npos && (eq + 1 == item.size() || item[eq + 1] < '0' || item[eq + 1] > '9')) return true;
  }
  return false;
}

Result<std::vector<TableFeatures>> parse_table_mapping(const std::string& text) {
  std::vector<TableFeatures> out;
  std::map<std::string, std::string> table_of;  // feature -> table
  const std::vector<std::string> items = split_list(text);
  if (items.empty()) return Status::invalid_argument("'': no tables (" + std::string(kMappingSyntax) + ")");
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string& item = items[i];
    const std::string who = "item " + std::to_string(i + 1) + " '" + quote_prefix(item) + "': ";
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) return Status::invalid_argument(who + "no '=' (" + kMappingSyntax + ")");
    TableFeatures t{item.substr(0, eq), split_plus(item.substr(eq + 1))};
    if (Status s = validate_table_name(t.table); !s.is_ok()) return Status::invalid_argument(who + s.message());
    if (std::any_of(out.begin(), out.end(), [&](const TableFeatures& o) { return o.table == t.table; }))
      return Status::invalid_argument(who + "table '" + t.table + "' is listed twice (expected each table once, " +
                                      "its features joined by '+': " + t.table + "=A+B)");
    for (const std::string& f : t.features) {
      if (f.empty() || f.find('=') != std::string::npos)
        return Status::invalid_argument(who + "a feature is empty or holds '=' (" + kMappingSyntax + ")");
      const auto [it, fresh] = table_of.emplace(f, t.table);
      if (fresh) continue;
      if (it->second == t.table)
        return Status::invalid_argument(who + "feature '" + quote_prefix(f) + "' is listed twice in table '" + t.table +
                                        "' (expected each feature once)");
      return Status::invalid_argument(who + "feature '" + quote_prefix(f) + "' is mapped to table '" + it->second +
                                      "' and to table '" + t.table + "' (expected one table per feature)");
    }
    out.push_back(std::move(t));
  }
  return out;
}

Result<std::vector<SourceTable>> map_features(const std::vector<TableFeatures>& mapping,
                                              const std::vector<TraceTable>& features, const std::string& source,
                                              MappedRows rows, const std::string& hint) {
  std::map<std::string, std::size_t> index;  // feature name -> index in `features`
  for (std::size_t f = 0; f < features.size(); ++f) index.emplace(features[f].name, f);
  std::vector<std::size_t> table_of(features.size(), mapping.size());  // feature -> index in `mapping`
  for (std::size_t m = 0; m < mapping.size(); ++m) {
    for (const std::string& f : mapping[m].features) {
      const auto it = index.find(f);
      if (it == index.end()) {
        std::vector<std::string> names;
        names.reserve(features.size());
        for (const TraceTable& t : features) names.push_back(t.name);
        return Status::invalid_argument("table '" + mapping[m].table + "': feature '" + quote_prefix(f) +
                                        "' is not in " + source + " (" +
                                        (hint.empty() ? "its features: " + name_list(names) : hint) + ")");
      }
      if (table_of[it->second] != mapping.size() && table_of[it->second] != m)
        return Status::invalid_argument("feature '" + quote_prefix(f) + "' is mapped to table '" +
                                        mapping[table_of[it->second]].table + "' and to table '" + mapping[m].table +
                                        "' (expected one table per feature)");
      table_of[it->second] = m;
    }
  }
  std::vector<SourceTable> out;
  std::vector<bool> emitted(mapping.size(), false);
  for (std::size_t f = 0; f < features.size(); ++f) {
    const std::size_t m = table_of[f];
    if (m == mapping.size()) {
      out.push_back({features[f].name, features[f].rows, {f}});
      continue;
    }
    if (emitted[m]) continue;
    emitted[m] = true;
    SourceTable t{mapping[m].table, 0, {}};
    for (const std::string& name : mapping[m].features) {
      const std::size_t g = index.at(name);
      t.features.push_back(g);
      t.rows = rows == MappedRows::kSum ? t.rows + features[g].rows : std::max(t.rows, features[g].rows);
    }
    out.push_back(std::move(t));
  }
  // A table of the mapping named as a feature it leaves out, which is a table of its own.
  for (const SourceTable& t : out) {
    const auto it = index.find(t.name);
    if (it == index.end() || table_of[it->second] != mapping.size() || t.features.front() == it->second) continue;
    return Status::invalid_argument("table '" + t.name + "' is listed twice: in the mapping and as feature '" + t.name +
                                    "' of " + source +
                                    ", which the mapping leaves out and so is a table of its own (expected each table "
                                    "once: map feature '" +
                                    t.name + "' to a table, or name the table otherwise)");
  }
  return out;
}

std::vector<std::string> feature_names(const SourceTable& table, const std::vector<TraceTable>& features) {
  if (table.features.size() == 1 && features[table.features.front()].name == table.name) return {};
  std::vector<std::string> names;
  for (const std::size_t f : table.features) names.push_back(features[f].name);
  return names;
}

Result<CriteoColumns> map_criteo_columns(const std::vector<TableFeatures>& mapping, const std::vector<TableSpec>& set) {
  std::vector<TraceTable> features;
  features.reserve(set.size());
  for (const TableSpec& s : set) features.push_back({s.name, s.rows});
  CriteoColumns c;
  STRATA_ASSIGN_OR_RETURN(c.tables, map_features(mapping, features, "a Criteo file", MappedRows::kSum,
                                                 "its columns: C1..C26, the categorical features"));
  c.columns = set;
  c.key_columns.assign(set.size(), 0);
  for (const SourceTable& t : c.tables) {
    const std::size_t first = *std::min_element(t.features.begin(), t.features.end());
    for (const std::size_t f : t.features) {
      c.columns[f].rows = t.rows;
      c.key_columns[f] = static_cast<int>(first);
    }
  }
  return c;
}

}  // namespace strata::bench
