#pragma once
// The keys of a batch that are used more than once, found without deduplicating the rest: what
// `cpu` and `offload`'s backward needs (backward_update_by_bag updates a row used once straight from its
// bag's gradient, and reduces only the repeated ones). Keys are row ids of a dense table, so the
// positions are split by key range, and each range is scanned with a direct-mapped array instead
// of a hash table: cheaper per key than dedup_keys, and it builds no CSR for the keys used once
// (strata-micro BM_StepFindRepeats against BM_StepDedup/1, 262k uniform keys of 2M rows: 0.86 ms
// against 2.5 ms).

#include <cstdint>
#include <vector>

#include "core/table_spec.hpp"
#include "host/dedup.hpp"

namespace strata {

/// Result of find_repeats.
struct Repeats {
  std::vector<std::uint8_t> repeated;  ///< (n) 1 where the key at that position is used more than once
  /// The repeated keys of each key range, each with its positions ascending (first-use order
  /// within the range). Ranges are disjoint, so their keys are too.
  std::vector<UniqueKeys> ranges;
};

/// Reusable memory of find_repeats (keep it across batches: the per-thread maps are allocated once
/// and never cleared, only re-tagged).
struct RepeatsScratch {
  std::vector<std::int64_t> counts;          ///< (chunks x ranges) positions per chunk and range
  std::vector<std::int64_t> start;           ///< (ranges + 1) where each range's positions start in by_range
  std::vector<std::int32_t> by_range;        ///< (n) positions grouped by range, ascending within each
  std::vector<std::uint32_t> range_offsets;  ///< (n) the keys of by_range, less their range's first key
  std::vector<std::int32_t> next;            ///< (n) next use of the same key (index in the range + 1), 0 = none
  /// Key offset in a range -> epoch << 32 | seen twice << 31 | (last use in the range + 1): one
  /// per arena thread, never cleared (an entry of an older epoch is empty).
  struct Map {
    std::vector<std::uint64_t> last;
    std::uint32_t epoch = 0;
    std::vector<std::int32_t> heads;  ///< first uses of the range's repeated keys
  };
  std::vector<Map> maps;
  // Key spaces over 2^28 rows: a hash dedup (host/repeats.cpp).
  UniqueKeys unique;
  DedupScratch dedup;
  /// L2 cache bytes the maps are sized for (each at most a quarter of it, see
  /// find_repeats_map_entries); 0, the default, is this machine's (Topology::l2_cache_bytes()).
  /// The result does not depend on it.
  std::uint64_t l2_bytes = 0;
};

/// Finds the keys of keys[0..n) (host memory, each in [0, key_space), n < 2^31) used more than
/// once. Up to 2^28 rows the positions are split by key range and scanned with direct-mapped
/// arrays (find_repeats_map_entries: a quarter of the L2 cache per thread, more for key spaces
/// over 256 maps of that size, 8 MB at most; kept in scratch); beyond, keys are deduplicated by hash
/// (dedup_keys) and `ranges` has one entry. Which keys are repeated, and their positions, do not
/// depend on scratch.l2_bytes; how they are split into `ranges` does. Runs on the calling thread's
/// oneTBB arena.
void find_repeats(const Key* keys, std::int64_t n, std::int64_t key_space, Repeats& out, RepeatsScratch& scratch);
/// The same of int32 keys, read as they are.
void find_repeats(const std::int32_t* keys, std::int64_t n, std::int64_t key_space, Repeats& out,
                  RepeatsScratch& scratch);
/// The same of a feature's keys (int64 or int32: JaggedKeys::keys32).
void find_repeats(const JaggedKeys& f, std::int64_t key_space, Repeats& out, RepeatsScratch& scratch);

/// One table's keys for find_repeats_tables.
struct TableKeys {
  const Key* keys = nullptr;  ///< (n) host, each in [0, rows)
  std::int64_t n = 0;
  std::int64_t rows = 0;
  const std::int32_t* keys32 = nullptr;  ///< set instead of keys: int32 keys, read as they are
};

/// Reusable memory of find_repeats_tables.
struct TablesRepeatsScratch {
  std::vector<Key> keys;  ///< the tables' keys, one key space: table i's keys + the rows before it
  std::vector<std::int64_t> key_base, pos_base;  ///< (tables + 1) prefix sums of rows and of n
  Repeats all;                                   ///< find_repeats of `keys`
  RepeatsScratch scratch;
};

/// find_repeats of several tables in one pass: their keys are laid end to end in one key space
/// (table i's rows after those of tables 0..i-1) and scanned once, so a batch of many small tables
/// pays one scan (three parallel loops) instead of one per table. out[i] gets table i's result,
/// the same keys and positions as find_repeats(tables[i]) gives (in ranges of the shared key space:
/// out[i].ranges has one entry per range of it, most of them empty for a small table). The tables'
/// rows summed must stay within kRepeatsTablesMaxRows and their keys summed within
/// kRepeatsTablesMaxKeys. Runs on the calling thread's
/// oneTBB arena.
void find_repeats_tables(const std::vector<TableKeys>& tables, std::vector<Repeats*>& out,
                         TablesRepeatsScratch& scratch);

/// The most rows find_repeats_tables takes in all (the direct-mapped scan's limit).
inline constexpr std::int64_t kRepeatsTablesMaxRows = std::int64_t{1} << 28;
/// The most keys find_repeats_tables takes in all (positions are 32-bit, as find_repeats' n < 2^31).
inline constexpr std::int64_t kRepeatsTablesMaxKeys = (std::int64_t{1} << 31) - 1;

/// Entries of the direct-mapped array one thread of find_repeats keeps in its scratch for a key
/// space (8 bytes each; 0 beyond 2^28 rows, where a hash dedup is used): the key range width, but
/// no more than the key space, so a small table's scratch stays small. The range width is the
/// largest power of two whose map fits in a quarter of an L2 of l2_bytes (0: this machine's; between
/// 2^10 and 2^20 entries), widened until the key space has at most 256 ranges.
std::int64_t find_repeats_map_entries(std::int64_t key_space, std::uint64_t l2_bytes = 0) noexcept;

}  // namespace strata
