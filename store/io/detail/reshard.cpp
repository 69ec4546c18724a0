#include "store/io/detail/reshard.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "store/store.hpp"

namespace strata::detail {
namespace {

// Whether global row g is one of b's rows.
bool holds_row(const Box& b, std::int64_t g) {
  if (b.empty() || g < b.row_start) return false;
  const std::int64_t d = g - b.row_start;
  return d % b.row_step == 0 && d / b.row_step < b.rows;
}

// The columns both boxes hold: [lo, hi), empty when hi <= lo.
std::pair<std::int32_t, std::int32_t> common_cols(const Box& a, const Box& b) {
  return {std::max(a.col_offset, b.col_offset), std::min(a.col_offset + a.cols, b.col_offset + b.cols)};
}

// Rows of piece `pc` in [row0, row0 + n) that target `t` holds too: the rows of two arithmetic progressions in
// common, counted without walking them (load plans whole tables with it).
std::int64_t common_rows(const Box& pc, const Box& t, std::int64_t row0, std::int64_t n) {
  const auto run = local_range(pc, row0, n);
  if (t.empty() || run.second == 0) return 0;
  const std::int64_t s = pc.row_step, u = t.row_step;
  if (s < 1 || u < 1) return 0;  // not boxes of a table (check_tiling refuses such pieces)
  const std::int64_t first = pc.row_start + run.first * s, last = first + (run.second - 1) * s;
  const std::int64_t lo = std::max(first, std::int64_t{t.row_start});
  const std::int64_t hi = std::min(last, t.row_start + (t.rows - 1) * u);
  if (lo > hi) return 0;
  // The common rows repeat every lcm(s, u); the first is among the next u / gcd(s, u) rows of the piece from lo.
  std::int64_t g = first + (lo - first + s - 1) / s * s;
  for (std::int64_t k = 0; k < u / std::gcd(s, u); ++k, g += s)
    if ((g - t.row_start) % u == 0) return g > hi ? 0 : (hi - g) / std::lcm(s, u) + 1;
  return 0;
}

// The indices of `boxes` in ascending order of `field` (manifest order among equals).
std::vector<std::size_t> order_by(const std::vector<Box>& boxes, std::int32_t Box::*field) {
  std::vector<std::size_t> order(boxes.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return boxes[a].*field < boxes[b].*field; });
  return order;
}

// Copies the columns [lo, hi) of one record of box `from` into one record of box `to` (weights, then every state
// block; rowwise_adagrad's one float whole). `kind` the table's optimizer.
void copy_record(OptimizerKind kind, const float* src, const Box& from, float* dst_w, float* dst_s, const Box& to,
                 std::int32_t lo, std::int32_t hi) {
  const std::size_t w = static_cast<std::size_t>(hi - lo);
  std::memcpy(dst_w + (lo - to.col_offset), src + (lo - from.col_offset), w * sizeof(float));
  const float* src_s = src + from.cols;
  if (kind == OptimizerKind::kRowwiseAdagrad) {
    dst_s[0] = src_s[0];  // tables of rowwise_adagrad are never column-sharded: both boxes hold the whole row
    return;
  }
  const int blocks = optimizer_state_dim(kind, 1);
  for (std::ptrdiff_t b = 0; b < blocks; ++b)
    std::memcpy(dst_s + b * to.cols + (lo - to.col_offset), src_s + b * from.cols + (lo - from.col_offset),
                w * sizeof(float));
}

}  // namespace

Box whole_box(std::int64_t rows, std::int32_t dim) {
  Box b;
  b.rows = rows;
  b.cols = dim;
  return b;
}

Box box_of(const ShardInfo& s) {
  if (s.local_rows == 0 || s.local_dim == 0) return Box{};
  Box b;
  b.rows = s.local_rows;
  b.row_start = static_cast<std::int32_t>(s.row_start);
  b.row_step = static_cast<std::int32_t>(s.row_step);
  b.col_offset = s.col_offset;
  b.cols = s.local_dim;
  return b;
}

Box box_of(const dispatch::ShardLayout& layout, int rank) {
  if (!layout.holds(rank)) return Box{};
  Box b;
  b.rows = layout.local_rows(rank);
  if (layout.type() == dispatch::ShardingType::kRow) {
    b.row_start = rank;
    b.row_step = layout.world();
  }
  b.col_offset = layout.col_offset(rank);
  b.cols = layout.local_dim(rank);
  return b;
}

std::string describe(const Box& b) {
  if (b.empty()) return "no rows";
  std::string rows;
  if (b.row_step == 1)
    rows = "rows " + std::to_string(b.row_start) + "-" + std::to_string(b.row_start + b.rows - 1);
  else
    rows = "rows " + std::to_string(b.row_start) + " + " + std::to_string(b.row_step) + "i (" + std::to_string(b.rows) +
           (b.rows == 1 ? " row)" : " rows)");
  return rows + ", columns " + std::to_string(b.col_offset) + "-" + std::to_string(b.col_offset + b.cols - 1);
}

std::pair<std::int64_t, std::int64_t> local_range(const Box& b, std::int64_t row0, std::int64_t n) {
  if (b.empty()) return {0, 0};
  // Local rows i with row0 <= row_start + i * row_step < row0 + n (ShardLayout::local_range's rule), and i < rows.
  const auto first = [&](std::int64_t g) {
    const std::int64_t i = g <= b.row_start ? 0 : (g - b.row_start + b.row_step - 1) / b.row_step;
    return std::min(i, b.rows);
  };
  const std::int64_t a = first(row0), e = first(row0 + n);
  return {a, e - a};
}

Status check_tiling(const std::string& table, std::int64_t rows, std::int32_t dim, const std::vector<Box>& pieces,
                    const std::vector<std::string>& files) {
  const std::string who =
      "table '" + table + "' (" + std::to_string(rows) + " rows, " + std::to_string(dim) + " columns): ";
  auto misfit = [&](std::size_t k, const std::string& what, const std::string& expected) {
    const std::string file = k < files.size() ? files[k] : "#" + std::to_string(k);
    return Status::data_loss(who + "piece '" + file + "' (" + describe(pieces[k]) + "): " + what + " (expected " +
                             expected + "; corrupt)");
  };
  auto gap = [&](const std::string& what) {
    return Status::data_loss(who + "the pieces do not cover " + what + " (corrupt)");
  };
  if (rows < 0 || dim < 1)
    return Status::data_loss("table '" + table + "': rows " + std::to_string(rows) + ", dim " + std::to_string(dim) +
                             " (expected rows >= 0 and dim >= 1; corrupt)");
  if (pieces.size() == 1 && pieces[0] == whole_box(rows, dim)) return Status::ok();
  if (pieces.empty()) return rows == 0 ? Status::ok() : gap("any row");
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    const Box& b = pieces[k];
    if (b.rows < 1 || b.cols < 1 || b.row_start < 0 || b.row_step < 1 || b.col_offset < 0 ||
        std::int64_t{b.col_offset} + b.cols > dim)
      return misfit(k, "not a part of the table",
                    "at least one row, a row step >= 1 and columns inside 0-" + std::to_string(dim - 1));
  }
  const bool by_rows =
      std::all_of(pieces.begin(), pieces.end(), [&](const Box& b) { return b.col_offset == 0 && b.cols == dim; });
  if (by_rows) {
    // Row pieces: one step k; start s < min(k, rows) holds rows s, s + k, ... below `rows`. Walked in order of
    // their starts, so that nothing is sized by the manifest's numbers (a step of 2^31 - 1 is one piece, not a
    // table of 2^31 - 1 starts).
    const std::int32_t k = pieces[0].row_step;
    const std::int64_t starts = std::min<std::int64_t>(k, rows);
    for (std::size_t i = 0; i < pieces.size(); ++i)
      if (pieces[i].row_step != k)
        return misfit(i, "row step " + std::to_string(pieces[i].row_step),
                      "the step " + std::to_string(k) + " of the first piece, as every row piece of one save");
    const auto row_gap = [&](std::int64_t s) {
      return gap("rows " + std::to_string(s) + (k == 1 ? "" : " + " + std::to_string(k) + "i"));
    };
    const std::vector<std::size_t> order = order_by(pieces, &Box::row_start);
    std::int64_t next = 0;  // the first start no piece so far holds
    for (std::size_t j = 0; j < order.size(); ++j) {
      const std::size_t i = order[j];
      const std::int64_t s = pieces[i].row_start;
      if (s >= starts)
        return misfit(i, "first row " + std::to_string(s),
                      "a first row below " + std::to_string(starts) + ", the rows of step " + std::to_string(k));
      if (s < next)  // the start of the piece before it in this order
        return misfit(i,
                      "overlaps piece '" + (order[j - 1] < files.size() ? files[order[j - 1]] : "") + "' (rows " +
                          std::to_string(s) + " + " + std::to_string(k) + "i)",
                      "each row in one piece");
      if (s > next) return row_gap(next);
      next = s + 1;
    }
    if (next < starts) return row_gap(next);
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const Box& b = pieces[i];
      const std::int64_t want = (rows - b.row_start - 1) / k + 1;  // b.row_start < rows: at least one
      if (b.rows != want)
        return misfit(i, std::to_string(b.rows) + " rows",
                      std::to_string(want) + ", the rows from " + std::to_string(b.row_start) + " step " +
                          std::to_string(k) + " below " + std::to_string(rows));
    }
    return Status::ok();
  }
  // Column pieces: every row each, column ranges tiling [0, dim).
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Box& b = pieces[i];
    if (b.row_start != 0 || b.row_step != 1 || b.rows != rows)
      return misfit(i, "part of the rows",
                    "all " + std::to_string(rows) + " rows (rows 0-" + std::to_string(rows - 1) +
                        "), as a column piece (the pieces of this table split its columns)");
  }
  std::int32_t next = 0;
  for (std::size_t i : order_by(pieces, &Box::col_offset)) {
    const Box& b = pieces[i];
    if (b.col_offset < next)
      return misfit(i, "overlaps another piece in column " + std::to_string(b.col_offset), "each column in one piece");
    if (b.col_offset > next) return gap("columns " + std::to_string(next) + "-" + std::to_string(b.col_offset - 1));
    next = b.col_offset + b.cols;
  }
  if (next < dim) return gap("columns " + std::to_string(next) + "-" + std::to_string(dim - 1));
  return Status::ok();
}

std::int64_t record_floats(OptimizerKind kind, std::int32_t cols) {
  return std::int64_t{cols} + optimizer_state_dim(kind, cols);
}

Result<TablePlan> plan_table(const TableSpec& spec, const dispatch::ShardingPlan& target, int table_index, int world,
                             std::vector<Box> pieces) {
  TablePlan p;
  p.rows = spec.rows;
  p.dim = spec.dim;
  p.kind = spec.optimizer.kind;
  p.pieces = std::move(pieces);
  int whole_reader = world > 0 ? table_index % world : 0;
  if (world == 1) {
    p.targets = {whole_box(spec.rows, spec.dim)};
  } else {
    STRATA_ASSIGN_OR_RETURN(dispatch::ShardLayout layout,
                            dispatch::ShardLayout::make(spec, target, world, table_index));
    for (int q = 0; q < world; ++q) p.targets.push_back(box_of(layout, q));
    if (layout.type() == dispatch::ShardingType::kTable) whole_reader = layout.owner_of(0);
  }
  // The saver's rank of a column piece is its place among the pieces by first column (ranks split columns in order).
  std::vector<int> column_index(p.pieces.size(), 0);
  for (std::size_t k = 0; k < p.pieces.size(); ++k)
    for (const Box& other : p.pieces)
      column_index[k] += other.cols < spec.dim && other.col_offset < p.pieces[k].col_offset ? 1 : 0;
  for (std::size_t k = 0; k < p.pieces.size(); ++k) {
    const Box& b = p.pieces[k];
    if (b == whole_box(spec.rows, spec.dim))
      p.reader.push_back(whole_reader);
    else if (b.cols < spec.dim)
      p.reader.push_back(column_index[k] % world);
    else
      p.reader.push_back(b.row_start % world);
  }
  std::int32_t widest = 0;
  for (const Box& t : p.targets) widest = std::max(widest, t.cols);
  const std::int64_t record_bytes = std::max<std::int64_t>(1, record_floats(p.kind, widest) * 4);
  p.span_rows = std::max<std::int64_t>(1, kSpanBytes / record_bytes);
  if (world > 1 && target.type == dispatch::ShardingType::kRow) p.span_rows *= world;
  p.span_rows = std::min(p.span_rows, std::max<std::int64_t>(1, spec.rows));
  for (int from = 0; from < world && !p.crosses; ++from)
    for (int to = 0; to < world && !p.crosses; ++to)
      p.crosses = from != to && span_bytes(p, from, to, 0, spec.rows) > 0;
  return p;
}

std::int64_t span_bytes(const TablePlan& p, int from, int to, std::int64_t row0, std::int64_t n) {
  const Box& t = p.targets[static_cast<std::size_t>(to)];
  std::int64_t bytes = 0;
  for (std::size_t k = 0; k < p.pieces.size(); ++k) {
    if (p.reader[k] != from) continue;
    const auto cols = common_cols(p.pieces[k], t);
    if (cols.second <= cols.first) continue;
    bytes += common_rows(p.pieces[k], t, row0, n) * record_floats(p.kind, cols.second - cols.first) * 4;
  }
  return bytes;
}

void pack_span(const TablePlan& p, int me, std::int64_t row0, std::int64_t n,
               const std::vector<const float*>& piece_records, float* send,
               const std::vector<std::int64_t>& send_displs) {
  for (std::size_t q = 0; q < p.targets.size(); ++q) {
    const Box& t = p.targets[q];
    float* out = send + send_displs[q] / static_cast<std::int64_t>(sizeof(float));
    for (std::size_t k = 0; k < p.pieces.size(); ++k) {
      if (p.reader[k] != me) continue;
      const Box& pc = p.pieces[k];
      const auto cols = common_cols(pc, t);
      if (cols.second <= cols.first || t.empty()) continue;
      const std::int32_t w = cols.second - cols.first;
      const std::int64_t width = record_floats(p.kind, pc.cols);
      const auto run = local_range(pc, row0, n);
      // A record of the send buffer is a record of the box "these rows x columns [lo, hi)".
      Box sent = whole_box(1, w);
      sent.col_offset = cols.first;
      for (std::int64_t i = 0; i < run.second; ++i) {
        if (!holds_row(t, pc.row_start + (run.first + i) * std::int64_t{pc.row_step})) continue;
        copy_record(p.kind, piece_records[k] + i * width, pc, out, out + w, sent, cols.first, cols.second);
        out += record_floats(p.kind, w);
      }
    }
  }
}

void unpack_span(const TablePlan& p, int me, std::int64_t row0, std::int64_t n, const float* recv,
                 const std::vector<std::int64_t>& recv_displs, float* weights, float* state) {
  const Box& t = p.targets[static_cast<std::size_t>(me)];
  if (t.empty()) return;
  const std::int64_t first = local_range(t, row0, n).first;
  const std::int64_t state_dim = optimizer_state_dim(p.kind, t.cols);
  for (std::size_t q = 0; q < p.targets.size(); ++q) {
    const float* in = recv + recv_displs[q] / static_cast<std::int64_t>(sizeof(float));
    for (std::size_t k = 0; k < p.pieces.size(); ++k) {
      if (p.reader[k] != static_cast<int>(q)) continue;
      const Box& pc = p.pieces[k];
      const auto cols = common_cols(pc, t);
      if (cols.second <= cols.first) continue;
      const std::int32_t w = cols.second - cols.first;
      Box sent = whole_box(1, w);
      sent.col_offset = cols.first;
      const auto run = local_range(pc, row0, n);
      for (std::int64_t i = 0; i < run.second; ++i) {
        const std::int64_t g = pc.row_start + (run.first + i) * std::int64_t{pc.row_step};
        if (!holds_row(t, g)) continue;
        const std::int64_t l = (g - t.row_start) / t.row_step - first;
        copy_record(p.kind, in, sent, weights + l * t.cols, state + l * state_dim, t, cols.first, cols.second);
        in += record_floats(p.kind, w);
      }
    }
  }
}

}  // namespace strata::detail
