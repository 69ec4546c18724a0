#pragma once
// The geometry of world checkpoints, pure (no files, no stores, no communicator): which part of a table a piece
// file or a rank's shard holds (Box), whether the pieces of a checkpoint tile their table, and how the rows of
// pieces saved by one world reach the shards of another: a TablePlan names the reader of each piece and the target
// box of each rank; a load walks spans of global rows and, per span, each reader packs what every rank needs
// (pack_span), one all_to_all_v moves it (counts from span_bytes, which every rank computes alike), and each rank
// unpacks its window (unpack_span).
//
// Records: a piece file, a send buffer and nothing else hold a row as [cols weights | state] fp32, where the state
// of a box of `cols` columns is optimizer_state_dim(kind, cols) floats: block b's local column j is global state
// column b * dim + col_offset + j (adagrad one block, adam two, sgd none); rowwise_adagrad's one float belongs to
// the whole row (its tables are never column-sharded, so every box of one holds all columns).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.hpp"
#include "core/table_spec.hpp"
#include "dispatch/shard_layout.hpp"

namespace strata {
struct ShardInfo;
}  // namespace strata

namespace strata::detail {

/// A part of a table: global rows row_start + i * row_step for i in [0, rows), times columns [col_offset,
/// col_offset + cols). Row shards: start = rank, step = world; everything else start 0, step 1 (ShardInfo's
/// convention). The empty box (Box{}) holds nothing.
struct Box {
  std::int64_t rows = 0;
  std::int32_t row_start = 0, row_step = 1, col_offset = 0, cols = 0;
  bool empty() const noexcept { return rows == 0 || cols == 0; }
  friend bool operator==(const Box& a, const Box& b) noexcept {
    return a.rows == b.rows && a.row_start == b.row_start && a.row_step == b.row_step && a.col_offset == b.col_offset &&
           a.cols == b.cols;
  }
  friend bool operator!=(const Box& a, const Box& b) noexcept { return !(a == b); }
};

/// The whole table: `rows` rows from 0 step 1, all `dim` columns.
Box whole_box(std::int64_t rows, std::int32_t dim);
/// What a rank holds by its ShardInfo; Box{} when it holds nothing (local_rows or local_dim 0).
Box box_of(const ShardInfo& s);
/// What rank `rank` holds under `layout`; Box{} when it holds nothing. Equal to box_of(shard_info) of that rank.
Box box_of(const dispatch::ShardLayout& layout, int rank);
/// "rows 2 + 4i (9 rows), columns 0-7": a box in messages.
std::string describe(const Box& b);

/// The local rows of `b` among global rows [row0, row0 + n): first local row and count (one contiguous run, as
/// ShardLayout::local_range). {0, 0} for an empty box; the first is clamped to b.rows.
std::pair<std::int64_t, std::int64_t> local_range(const Box& b, std::int64_t row0, std::int64_t n);

/// Whether the boxes of `pieces` (with their file names `files`, same order) cover each (row, column) of a table of
/// `rows` x `dim` exactly once, in one of the three shapes a save writes: one whole piece; row pieces (all
/// columns, one step k, distinct starts, one piece per start below min(k, rows), each with its ceil((rows -
/// start) / k) rows); column pieces (all rows, column ranges that tile [0, dim)). kDataLoss "table '<table>':
/// piece '<file>' (<box>): <what> (expected <what>; corrupt)" naming the first misfit, or "... the pieces do not
/// cover <rows or columns> (corrupt)" for a gap; rows < 0 or dim < 1 are refused first. Pure, and sizes nothing by
/// the numbers it checks (a manifest's): its work and memory grow with pieces.size() only.
Status check_tiling(const std::string& table, std::int64_t rows, std::int32_t dim, const std::vector<Box>& pieces,
                    const std::vector<std::string>& files);

/// Receive window per rank and span that plan_table aims for (bytes of records).
inline constexpr std::int64_t kSpanBytes = std::int64_t{32} << 20;

/// How one table of a checkpoint goes from its pieces to the shards of a world of `targets.size()` ranks.
/// Identical on every rank (pure function of the manifest and the config).
struct TablePlan {
  std::int64_t rows = 0;
  std::int32_t dim = 0;
  OptimizerKind kind = OptimizerKind::kSgd;
  std::vector<Box> pieces;     ///< the checkpoint's pieces, manifest order (check_tiling passed)
  std::vector<Box> targets;    ///< per rank of the loading world: the box it holds (Box{}: none)
  std::vector<int> reader;     ///< per piece: the rank that reads it and sends its rows to their holders
  std::int64_t span_rows = 1;  ///< global rows per span: about kSpanBytes of records per receiving rank
  bool crosses = false;        ///< whether any reader sends rows to another rank (else no exchange is needed)
};

/// Plans the load of a table of `spec` saved as `pieces` (tiled) into a world of `world` ranks sharded by
/// `target` (table `table_index` of the config; world 1: the whole table, whatever the plan). Readers: a row piece
/// goes to rank row_start % world (its saver's rank), the k-th column piece by col_offset to k % world (its
/// saver's), a whole piece to the owner of a table-sharded target, else to table_index % world. So a world loading
/// its own sharding reads only its own pieces and exchanges nothing. Errors: the plan does not fit the world
/// (validate_plan's).
Result<TablePlan> plan_table(const TableSpec& spec, const dispatch::ShardingPlan& target, int table_index, int world,
                             std::vector<Box> pieces);

/// Floats of a record of a box of `cols` columns: cols + optimizer_state_dim(kind, cols).
std::int64_t record_floats(OptimizerKind kind, std::int32_t cols);

/// Bytes rank `from` sends to rank `to` for global rows [row0, row0 + n) of the plan's table (its pieces' rows
/// that `to` holds, the columns both hold, records of that width); the count on both sides of the exchange.
std::int64_t span_bytes(const TablePlan& p, int from, int to, std::int64_t row0, std::int64_t n);

/// Packs what rank `me` sends for global rows [row0, row0 + n): for each destination q, at byte offset
/// send_displs[q] of `send` (host), span_bytes(p, me, q, row0, n) bytes: for each piece `me` reads (manifest
/// order), the rows of its run that q holds, ascending, each as a record of the columns both hold.
/// piece_records[k] (host) is piece k's run in the span (local_range(pieces[k], row0, n): its records, of
/// record_floats(kind, cols) floats); null for the pieces `me` does not read.
void pack_span(const TablePlan& p, int me, std::int64_t row0, std::int64_t n,
               const std::vector<const float*>& piece_records, float* send,
               const std::vector<std::int64_t>& send_displs);

/// Unpacks what rank `me` received for global rows [row0, row0 + n) (from each rank q at byte offset
/// recv_displs[q] of `recv`, host, as pack_span packed it) into its window: the run local_range(targets[me], row0,
/// n) of its box, `weights` (count, cols) and `state` (count, optimizer_state_dim(kind, cols)), host; `state` may
/// be null when that is 0.
void unpack_span(const TablePlan& p, int me, std::int64_t row0, std::int64_t n, const float* recv,
                 const std::vector<std::int64_t>& recv_displs, float* weights, float* state);

}  // namespace strata::detail
