#pragma once
// StoreConfig: tables, placement per table, threads and NUMA policy; in C++ and in JSON.

#include <string>
#include <vector>

#include "core/status.hpp"
#include "core/table_spec.hpp"

namespace strata {

/// Where a table's rows live and who computes on them (see ARCHITECTURE.md, "Placement modes").
/// Only `cpu` exists so far; offload/cached/gpu/hybrid land with later issues.
enum class Placement { kCpu = 0 };

/// How host tables are spread over NUMA nodes.
enum class NumaPolicy {
  kInterleave = 0,  ///< row blocks dealt round-robin over all nodes (bandwidth of every node)
  kBind = 1,        ///< every table bound to `numa_node`
};

/// One table and its placement.
struct TableConfig {
  TableSpec spec;                       ///< shape, pooling, initializer, optimizer
  Placement placement = Placement::kCpu;///< placement mode of this table
};

/// Everything Store::open needs.
struct StoreConfig {
  std::vector<TableConfig> tables;  ///< at least one; names unique
  int threads = 0;                  ///< worker threads for kernels (0: all cores)
  NumaPolicy numa = NumaPolicy::kInterleave;  ///< host table placement
  int numa_node = 0;                ///< node for NumaPolicy::kBind
  bool huge_pages = true;           ///< back host tables with transparent huge pages
  int fake_numa_nodes = 0;          ///< > 0: pretend the machine has this many nodes (tests)
};

const char* to_string(Placement p) noexcept;
Result<Placement> parse_placement(const std::string& s);
const char* to_string(NumaPolicy p) noexcept;
Result<NumaPolicy> parse_numa_policy(const std::string& s);

/// Checks every table and the store-wide fields; errors name the table and the value.
Status validate(const StoreConfig& config);

/// Parses a JSON config. Schema (every field but tables[].name/rows/dim optional):
///   {"threads": 2, "numa": "interleave"|"bind", "numa_node": 0, "huge_pages": true,
///    "tables": [{"name": "user", "rows": 1000, "dim": 64, "dtype": "fp32", "pooling": "sum",
///                "placement": "cpu", "init": {"bound": 0.01, "seed": 0},
///                "optimizer": {"kind": "adagrad", "learning_rate": 0.01, "eps": 1e-8,
///                              "beta1": 0.9, "beta2": 0.999, "weight_decay": 0,
///                              "initial_accumulator": 0}}]}
/// Unknown keys are errors (a typo must not silently fall back to a default). Validates the result.
Result<StoreConfig> parse_store_config(const std::string& json_text);
/// Reads and parses a JSON config file.
Result<StoreConfig> load_store_config(const std::string& path);
/// The JSON form of a config (round-trips through parse_store_config).
std::string to_json(const StoreConfig& config);

}  // namespace strata
