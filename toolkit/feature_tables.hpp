#pragma once
// Which features of a file source look up which table. A trace's header and a Criteo file's columns
// (C1..C26) name features; by default each feature is a table of its own name. A mapping says
// otherwise: the mapping form of --tables, "item=clicked+bought,user=user_id" (table item is looked
// up by features clicked and bought, table user by user_id), or a store config's features lists. A
// feature a mapping leaves out stays a table of its own. All the features of a table share its rows:
// its keys, deduplicated per table and batch, are what the tools' caches and counts see.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "core/table_spec.hpp"
#include "toolkit/trace.hpp"

namespace strata::bench {

/// A table and the features that look it up, as a mapping names them.
struct TableFeatures {
  std::string table;                  ///< the table's name
  std::vector<std::string> features;  ///< its features in the table's order (at least one)
};

/// A table of a source: its name, its rows and which of the source's features look it up.
struct SourceTable {
  std::string name;                   ///< the table's name
  std::int64_t rows = 0;              ///< rows (> 0): every key of its features is below
  std::vector<std::size_t> features;  ///< indices into the source's features, in the table's feature order
};

/// How a table of several features gets its rows from theirs.
enum class MappedRows : std::uint8_t {
  kMax = 0,  ///< the most rows of its features (a trace: each feature's keys are below its header rows)
  kSum = 1,  ///< the sum of its features' rows (Criteo columns: the rows they would have had apart)
};

/// Whether a --tables value is a mapping rather than a table set: some item has a '=' followed by
/// something other than a digit ("item=clicked+bought"; a table set's "user=1000x64" has rows there).
bool is_table_mapping(const std::string& text);

/// Parses "TABLE=FEATURE[+FEATURE...][,TABLE=...]". Errors (kInvalidArgument, for the caller to
/// prefix with the flag) name the item and what was expected: an item without '=' or with an empty
/// feature, a table name validate_table_name refuses, a table listed twice, a feature listed twice
/// or mapped to two tables.
Result<std::vector<TableFeatures>> parse_table_mapping(const std::string& text);

/// The tables of a source whose features are `features` (a trace's header, or C1..C26 with their
/// rows): each table of `mapping` with its features, and every feature `mapping` leaves out as a
/// table of its own name; in the order of their first feature. `source` names the source in errors
/// ("trace day0.strtrace"), `hint` says which features it has when one is not there ("its features:
/// a, b" when empty). Errors: a feature the source does not have, a table that has the name of a
/// feature left out (that feature's own table), a table listed twice or a feature in two tables (as
/// parse_table_mapping).
Result<std::vector<SourceTable>> map_features(const std::vector<TableFeatures>& mapping,
                                              const std::vector<TraceTable>& features, const std::string& source,
                                              MappedRows rows, const std::string& hint = "");

/// The names of `table`'s features (of `features`, the source's) when they are other than the table
/// itself, as a store config's features list; empty for a table of one feature of its own name.
std::vector<std::string> feature_names(const SourceTable& table, const std::vector<TraceTable>& features);

/// A Criteo file's 26 columns as CriteoTsvReader reads them under a mapping, and its tables.
struct CriteoColumns {
  std::vector<TableSpec> columns;   ///< column t: its feature's name and its table's rows (the reader's `tables`)
  std::vector<int> key_columns;     ///< column t is keyed as its table's first column (CriteoTsvOptions::key_columns)
  std::vector<SourceTable> tables;  ///< the tables (map_features, their rows summed over their columns)
};

/// The columns and tables of a Criteo file whose 26 columns are `set` (a table set of 26: names and
/// rows, dims unused) and whose columns `mapping` maps to tables by name (C1..C26 in a mapping are
/// the columns of the "criteo" set). Errors as map_features; `set` of other than 26 tables is a
/// programmer error.
Result<CriteoColumns> map_criteo_columns(const std::vector<TableFeatures>& mapping, const std::vector<TableSpec>& set);

/// Checks that table `table` is looked up by the same features in a store config (`listed`, its
/// features list; `config` names it: "config", "plan") and in a source (`used`, as feature_names
/// gives them; `source` names it: "workload", "trace"); empty lists mean the table's own name. Error:
/// "table 'item' is looked up by features a, b in the config but by its own name in the workload".
Status check_same_features(const std::string& table, const std::vector<std::string>& listed, const std::string& config,
                           const std::vector<std::string>& used, const std::string& source);

/// "a, b, c", or the first eight and a count: names for messages.
std::string name_list(const std::vector<std::string>& names);

}  // namespace strata::bench
