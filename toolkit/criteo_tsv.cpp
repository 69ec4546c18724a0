#include "toolkit/criteo_tsv.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace strata::bench {
namespace {

std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int hex_digit(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Shows a field in a message: at most 40 characters, control characters as '?'.
std::string show_field(const char* p, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n && i < 40; ++i) s.push_back(static_cast<unsigned char>(p[i]) < 0x20 ? '?' : p[i]);
  if (n > 40) s += "...";
  return s;
}

}  // namespace

Key criteo_key(std::uint32_t value, int table, std::int64_t rows) noexcept {
  const std::uint64_t h = mix64(static_cast<std::uint64_t>(value) | (static_cast<std::uint64_t>(table) << 32));
  return static_cast<Key>(h % static_cast<std::uint64_t>(rows));
}

Result<CriteoTsvReader> CriteoTsvReader::open(const std::string& path, std::vector<TableSpec> tables,
                                              CriteoTsvOptions options) {
  const std::string who = "criteo tsv '" + path + "'";
  if (tables.size() != static_cast<std::size_t>(kCriteoSparseFeatures))
    return Status::invalid_argument(who + ": " + std::to_string(tables.size()) + " tables (expected " +
                                    std::to_string(kCriteoSparseFeatures) + ", one per categorical feature)");
  for (const TableSpec& t : tables) {
    if (t.rows <= 0)
      return Status::invalid_argument(who + ": table '" + t.name + "': rows " + std::to_string(t.rows) +
                                      " must be > 0");
  }
  const auto column = [](int c) { return c >= 0 && c < kCriteoSparseFeatures; };
  if (!options.key_columns.empty() && (options.key_columns.size() != tables.size() ||
                                       !std::all_of(options.key_columns.begin(), options.key_columns.end(), column)))
    return Status::invalid_argument(who + ": key_columns has " + std::to_string(options.key_columns.size()) +
                                    " entries (expected none, or 26 column indices in [0, 26))");
  if (options.batch_size <= 0)
    return Status::invalid_argument(who + ": batch_size " + std::to_string(options.batch_size) + " must be > 0");
  CriteoTsvReader r;
  r.path_ = path;
  r.tables_ = std::move(tables);
  r.options_ = options;
  r.in_ = std::make_unique<std::ifstream>(path, std::ios::binary);
  if (!*r.in_) {
    if (errno == ENOENT) return Status::not_found(who + " does not exist");
    return Status::io_error("cannot open " + who + ": " + std::strerror(errno));
  }
  return Result<CriteoTsvReader>(std::move(r));
}

Result<bool> CriteoTsvReader::next(KeyBatch& out) {
  const int first_cat = (options_.has_label ? 1 : 0) + kCriteoDenseFeatures;
  const int expected_fields = first_cat + kCriteoSparseFeatures;
  const auto n_tables = static_cast<std::size_t>(kCriteoSparseFeatures);

  KeyBatch kb;
  kb.features.resize(n_tables);
  for (std::size_t t = 0; t < n_tables; ++t) {
    kb.features[t].table = tables_[t].name;
    kb.features[t].offsets.reserve(static_cast<std::size_t>(options_.batch_size) + 1);
    kb.features[t].offsets.push_back(0);
    kb.features[t].keys.reserve(static_cast<std::size_t>(options_.batch_size));
  }
  std::vector<float> labels;
  std::int64_t n = 0;
  // Positions of the fields of one line; kept outside the loop to reuse the allocation.
  std::vector<std::pair<std::size_t, std::size_t>> fields;
  fields.reserve(static_cast<std::size_t>(expected_fields) + 1);

  // On an error the reader goes back here, so nothing of the failed batch is lost or half-read.
  const std::streampos batch_start = in_->tellg();
  const std::int64_t line_at_start = line_;
  const auto fail = [&](Status st) -> Status {
    in_->clear();
    in_->seekg(batch_start);
    line_ = line_at_start;
    return st;
  };
  while (n < options_.batch_size) {
    if (!std::getline(*in_, line_buf_)) {
      if (in_->bad()) return fail(Status::io_error("cannot read criteo tsv '" + path_ + "': " + std::strerror(errno)));
      break;  // end of file
    }
    const std::int64_t line_no = line_ + 1;
    if (!line_buf_.empty() && line_buf_.back() == '\r') line_buf_.pop_back();
    if (line_buf_.empty()) {
      line_ = line_no;
      continue;
    }
    fields.clear();
    std::size_t begin = 0;
    for (std::size_t i = 0; i <= line_buf_.size(); ++i) {
      if (i == line_buf_.size() || line_buf_[i] == '\t') {
        fields.emplace_back(begin, i - begin);
        begin = i + 1;
      }
    }
    if (static_cast<int>(fields.size()) != expected_fields)
      return fail(Status::invalid_argument(
          "criteo tsv '" + path_ + "' line " + std::to_string(line_no) + ": " + std::to_string(fields.size()) +
          " tab-separated fields (expected " + std::to_string(expected_fields) +
          (options_.has_label ? ": label, 13 integer and 26 categorical features)"
                              : ": 13 integer and 26 categorical features, no label)")));
    float label = 0.0f;
    if (options_.has_label && fields[0].second > 0) label = line_buf_[fields[0].first] == '1' ? 1.0f : 0.0f;
    // Parse every categorical field of the line before appending any, so a bad line adds nothing.
    Key keys[kCriteoSparseFeatures];
    bool present[kCriteoSparseFeatures];
    for (int t = 0; t < kCriteoSparseFeatures; ++t) {
      const int field = first_cat + t;
      const char* p = line_buf_.data() + fields[static_cast<std::size_t>(field)].first;
      const std::size_t len = fields[static_cast<std::size_t>(field)].second;
      present[t] = len > 0;
      if (len == 0) continue;
      std::uint32_t v = 0;
      bool ok = len <= 8;
      for (std::size_t i = 0; ok && i < len; ++i) {
        const int d = hex_digit(p[i]);
        if (d < 0) ok = false;
        v = (v << 4) | static_cast<std::uint32_t>(d < 0 ? 0 : d);
      }
      if (!ok)
        return fail(Status::invalid_argument("criteo tsv '" + path_ + "' line " + std::to_string(line_no) + " field " +
                                             std::to_string(field) + " (C" + std::to_string(t + 1) + "): '" +
                                             show_field(p, len) +
                                             "' is not a categorical value (expected 1 to 8 hex digits, or empty)"));
      const int key_column = options_.key_columns.empty() ? t : options_.key_columns[static_cast<std::size_t>(t)];
      keys[t] = criteo_key(v, key_column, tables_[static_cast<std::size_t>(t)].rows);
    }
    for (std::size_t t = 0; t < n_tables; ++t) {
      JaggedKeys& f = kb.features[t];
      if (present[t]) f.keys.push_back(keys[t]);
      f.offsets.push_back(static_cast<std::int64_t>(f.keys.size()));
    }
    if (options_.has_label) labels.push_back(label);
    line_ = line_no;
    ++n;
  }
  if (n == 0 || (options_.drop_last && n < options_.batch_size)) return false;
  samples_ += n;
  labels_ = std::move(labels);
  out = std::move(kb);
  return true;
}

Result<std::vector<KeyBatch>> read_criteo_tsv(const std::string& path, const std::vector<TableSpec>& tables,
                                              CriteoTsvOptions options, std::int64_t max_batches) {
  STRATA_ASSIGN_OR_RETURN(CriteoTsvReader r, CriteoTsvReader::open(path, tables, std::move(options)));
  std::vector<KeyBatch> out;
  while (max_batches <= 0 || static_cast<std::int64_t>(out.size()) < max_batches) {
    KeyBatch b;
    STRATA_ASSIGN_OR_RETURN(bool more, r.next(b));
    if (!more) break;
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace strata::bench
