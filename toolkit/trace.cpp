#include "toolkit/trace.hpp"

#include <array>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <unordered_set>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace strata::bench {
namespace {

// ---- CRC-32C ----

constexpr std::array<std::uint32_t, 256> make_crc_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<std::uint32_t, 256> kCrcTable = make_crc_table();

// ---- little-endian encoding ----

constexpr bool kLittleEndianHost =
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    true;
#else
    false;
#endif

void put_u32(std::vector<unsigned char>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void put_u64(std::vector<unsigned char>& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void put_i64_array(std::vector<unsigned char>& out, const std::int64_t* p, std::size_t n) {
  if (kLittleEndianHost) {
    const auto* b = reinterpret_cast<const unsigned char*>(p);
    out.insert(out.end(), b, b + n * sizeof(std::int64_t));
  } else {
    for (std::size_t i = 0; i < n; ++i) put_u64(out, static_cast<std::uint64_t>(p[i]));
  }
}
void put_f32_array(std::vector<unsigned char>& out, const float* p, std::size_t n) {
  if (kLittleEndianHost) {
    const auto* b = reinterpret_cast<const unsigned char*>(p);
    out.insert(out.end(), b, b + n * sizeof(float));
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t u = 0;
      std::memcpy(&u, p + i, 4);
      put_u32(out, u);
    }
  }
}
void patch_u64(std::vector<unsigned char>& out, std::size_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out[at + static_cast<std::size_t>(i)] = static_cast<unsigned char>(v >> (8 * i));
}

std::uint32_t get_u32(const unsigned char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08" PRIx32, v);
  return buf;
}

// The 8 magic bytes as text: printable ASCII as is, anything else as \xNN.
std::string show_bytes(const unsigned char* p, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\' && p[i] != '\'') {
      s.push_back(static_cast<char>(p[i]));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", p[i]);
      s += buf;
    }
  }
  return s;
}

// Offsets of the fixed header fields (docs/trace-format.md).
constexpr std::size_t kOffVersion = 8;
constexpr std::size_t kOffFlags = 12;
constexpr std::size_t kOffNumTables = 16;
constexpr std::size_t kOffNumBatches = 20;
constexpr std::size_t kFixedHeaderBytes = 28;
constexpr std::size_t kRecordHeadBytes = 12;  // record magic + payload_len
constexpr std::uint32_t kFeatureHasWeights = 1u;

std::atomic<std::uint64_t> g_temp_counter{0};

Status os_error(const std::string& what, const std::string& path) {
  return Status::io_error(what + " '" + path + "': " + std::strerror(errno));
}

// fsync of the directory holding `path`, so the rename itself is durable. Best effort: some file
// systems refuse to open directories; the data are already synced.
void sync_parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  (void)::fsync(fd);
  (void)::close(fd);
}

}  // namespace

std::uint32_t trace_crc32c(const void* data, std::size_t n, std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  for (std::size_t i = 0; i < n; ++i) c = kCrcTable[(c ^ p[i]) & 0xffu] ^ (c >> 8);
  return ~c;
}

// ---------------------------------------------------------------------------------------------
// TraceWriter

void TraceWriter::FileCloser::operator()(std::FILE* f) const noexcept {
  if (f) std::fclose(f);
}

Result<TraceWriter> TraceWriter::create(const std::string& path, std::vector<TraceTable> tables) {
  const std::string who = "trace '" + path + "'";
  if (tables.empty()) return Status::invalid_argument(who + ": no tables (expected at least one)");
  if (tables.size() > 0xffffffffu)
    return Status::invalid_argument(who + ": " + std::to_string(tables.size()) + " tables (expected < 2^32)");
  TraceWriter w;
  for (std::size_t i = 0; i < tables.size(); ++i) {
    const TraceTable& t = tables[i];
    if (t.name.empty()) return Status::invalid_argument(who + ": table " + std::to_string(i) + " has an empty name");
    if (t.name.size() > kTraceMaxNameBytes)
      return Status::invalid_argument(who + ": table " + std::to_string(i) + " name is " +
                                      std::to_string(t.name.size()) + " bytes (expected at most " +
                                      std::to_string(kTraceMaxNameBytes) + ")");
    if (t.rows <= 0)
      return Status::invalid_argument(who + ": table '" + t.name + "': rows " + std::to_string(t.rows) +
                                      " must be > 0");
    if (!w.index_.emplace(t.name, static_cast<std::uint32_t>(i)).second)
      return Status::invalid_argument(who + ": table '" + t.name + "' appears twice (expected unique names)");
  }
  w.path_ = path;
  w.temp_path_ = path + ".tmp-" + std::to_string(::getpid()) + "-" +
                 std::to_string(g_temp_counter.fetch_add(1, std::memory_order_relaxed));
  w.file_.reset(std::fopen(w.temp_path_.c_str(), "wb"));
  if (!w.file_) return os_error("cannot create trace", w.temp_path_);
  w.tables_ = std::move(tables);

  std::vector<unsigned char>& h = w.header_;
  h.insert(h.end(), kTraceMagic, kTraceMagic + 8);
  put_u32(h, kTraceVersion);
  put_u32(h, 0);  // flags
  put_u32(h, static_cast<std::uint32_t>(w.tables_.size()));
  put_u64(h, 0);  // num_batches, patched by close()
  for (const TraceTable& t : w.tables_) {
    put_u32(h, static_cast<std::uint32_t>(t.name.size()));
    h.insert(h.end(), t.name.begin(), t.name.end());
    put_u64(h, static_cast<std::uint64_t>(t.rows));
  }
  std::vector<unsigned char> with_crc = h;
  put_u32(with_crc, trace_crc32c(h.data(), h.size()));
  if (std::fwrite(with_crc.data(), 1, with_crc.size(), w.file_.get()) != with_crc.size()) {
    Status st = os_error("cannot write trace", w.temp_path_);
    w.discard();
    return st;
  }
  return Result<TraceWriter>(std::move(w));
}

TraceWriter::TraceWriter(TraceWriter&& o) noexcept
    : path_(std::move(o.path_)),
      temp_path_(std::move(o.temp_path_)),
      file_(std::move(o.file_)),
      tables_(std::move(o.tables_)),
      index_(std::move(o.index_)),
      header_(std::move(o.header_)),
      record_(std::move(o.record_)),
      batches_(o.batches_),
      failed_(o.failed_),
      closed_(o.closed_) {
  o.temp_path_.clear();
  o.closed_ = true;
}

TraceWriter& TraceWriter::operator=(TraceWriter&& o) noexcept {
  if (this != &o) {
    discard();
    path_ = std::move(o.path_);
    temp_path_ = std::move(o.temp_path_);
    file_ = std::move(o.file_);
    tables_ = std::move(o.tables_);
    index_ = std::move(o.index_);
    header_ = std::move(o.header_);
    record_ = std::move(o.record_);
    batches_ = o.batches_;
    failed_ = o.failed_;
    closed_ = o.closed_;
    o.temp_path_.clear();
    o.closed_ = true;
  }
  return *this;
}

TraceWriter::~TraceWriter() { discard(); }

void TraceWriter::discard() noexcept {
  file_.reset();
  if (!closed_ && !temp_path_.empty()) (void)std::remove(temp_path_.c_str());
  temp_path_.clear();
}

Status TraceWriter::append(const KeyBatch& batch) {
  const std::string who = "trace '" + path_ + "': batch " + std::to_string(batches_);
  if (closed_) return Status::failed_precondition(who + ": the writer is closed");
  if (failed_) return Status::failed_precondition(who + ": an earlier write failed");
  if (batch.features.empty()) return Status::invalid_argument(who + ": no features (expected at least one)");
  if (batch.features.size() > tables_.size())
    return Status::invalid_argument(who + ": " + std::to_string(batch.features.size()) + " features for " +
                                    std::to_string(tables_.size()) + " tables (each table at most once)");
  const std::int64_t batch_size = batch.batch_size();
  std::vector<std::uint32_t> feature_table(batch.features.size());
  std::vector<bool> seen(tables_.size(), false);
  for (std::size_t i = 0; i < batch.features.size(); ++i) {
    const JaggedKeys& f = batch.features[i];
    const auto it = index_.find(f.table);
    if (it == index_.end())
      return Status::invalid_argument(who + ": feature " + std::to_string(i) + " names table '" + f.table +
                                      "', which is not in the trace header");
    if (seen[it->second])
      return Status::invalid_argument(who + ": table '" + f.table + "' appears twice (expected at most once)");
    seen[it->second] = true;
    feature_table[i] = it->second;
    TableSpec spec;
    spec.name = f.table;
    spec.rows = tables_[it->second].rows;
    const Status st = validate(f, spec, batch_size);
    if (!st.is_ok()) return st.with_context(who);
  }

  std::vector<unsigned char>& r = record_;
  r.clear();
  put_u32(r, kTraceRecordMagic);
  put_u64(r, 0);  // payload_len, patched below
  put_u32(r, static_cast<std::uint32_t>(batch.features.size()));
  put_u64(r, static_cast<std::uint64_t>(batch_size));
  for (std::size_t i = 0; i < batch.features.size(); ++i) {
    const JaggedKeys& f = batch.features[i];
    put_u32(r, feature_table[i]);
    put_u32(r, f.weights.empty() ? 0u : kFeatureHasWeights);
    put_u64(r, static_cast<std::uint64_t>(f.num_keys()));
    // int32 keys and offsets (JaggedKeys::keys32, offsets32) are written as int64, as the format holds them.
    if (f.offsets32.empty()) {
      put_i64_array(r, f.offsets.data(), f.offsets.size());
    } else {
      for (const std::int32_t o : f.offsets32) put_u64(r, static_cast<std::uint64_t>(std::int64_t{o}));
    }
    if (f.keys32.empty()) {
      put_i64_array(r, f.keys.data(), f.keys.size());
    } else {
      for (const std::int32_t k : f.keys32) put_u64(r, static_cast<std::uint64_t>(std::int64_t{k}));
    }
    if (!f.weights.empty()) put_f32_array(r, f.weights.data(), f.weights.size());
  }
  patch_u64(r, 4, r.size() - kRecordHeadBytes);
  put_u32(r, trace_crc32c(r.data(), r.size()));
  if (std::fwrite(r.data(), 1, r.size(), file_.get()) != r.size()) {
    failed_ = true;
    return os_error("cannot write trace", temp_path_);
  }
  ++batches_;
  return Status::ok();
}

Status TraceWriter::close() {
  const std::string who = "trace '" + path_ + "'";
  if (closed_) return Status::failed_precondition(who + ": already closed");
  if (failed_) return Status::failed_precondition(who + ": an earlier write failed; nothing was written");
  patch_u64(header_, kOffNumBatches, batches_);
  std::vector<unsigned char> with_crc = header_;
  put_u32(with_crc, trace_crc32c(header_.data(), header_.size()));
  std::FILE* f = file_.get();
  if (std::fseek(f, 0, SEEK_SET) != 0 || std::fwrite(with_crc.data(), 1, with_crc.size(), f) != with_crc.size() ||
      std::fflush(f) != 0) {
    failed_ = true;
    return os_error("cannot write trace", temp_path_);
  }
  if (::fsync(::fileno(f)) != 0) {
    failed_ = true;
    return os_error("cannot fsync trace", temp_path_);
  }
  std::FILE* raw = file_.release();
  if (std::fclose(raw) != 0) {
    failed_ = true;
    return os_error("cannot close trace", temp_path_);
  }
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    failed_ = true;
    return Status::io_error("cannot rename '" + temp_path_ + "' to '" + path_ + "': " + std::strerror(errno));
  }
  closed_ = true;
  sync_parent_dir(path_);
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// TraceReader

void TraceReader::FileCloser::operator()(std::FILE* f) const noexcept {
  if (f) std::fclose(f);
}

Status TraceReader::error_at(std::uint64_t offset, const std::string& what) const {
  return Status::data_loss("trace '" + path_ + "' at byte " + std::to_string(offset) + ": " + what);
}

Status TraceReader::read_exact(void* dst, std::size_t n, const char* what) {
  if (n > file_size_ - std::min(pos_, file_size_))
    return error_at(pos_, std::string("truncated: expected ") + std::to_string(n) + " bytes (" + what +
                              ") but the file ends at byte " + std::to_string(file_size_));
  if (n > 0 && std::fread(dst, 1, n, file_.get()) != n) {
    if (std::ferror(file_.get())) return os_error("cannot read trace", path_);
    return error_at(pos_, std::string("truncated: expected ") + std::to_string(n) + " bytes (" + what +
                              ") but the file ended early");
  }
  pos_ += n;
  return Status::ok();
}

Result<TraceReader> TraceReader::open(const std::string& path) {
  TraceReader r;
  r.path_ = path;
  r.file_.reset(std::fopen(path.c_str(), "rb"));
  if (!r.file_) {
    if (errno == ENOENT) return Status::not_found("trace '" + path + "' does not exist");
    return os_error("cannot open trace", path);
  }
  struct stat st {};
  if (::fstat(::fileno(r.file_.get()), &st) != 0) return os_error("cannot stat trace", path);
  if (!S_ISREG(st.st_mode)) return Status::invalid_argument("trace '" + path + "' is not a regular file");
  r.file_size_ = static_cast<std::uint64_t>(st.st_size);

  // The fixed part; magic and version are checked before anything else so that a file of another
  // kind or version gets that message, not a truncation or checksum one.
  std::vector<unsigned char> h(kFixedHeaderBytes);
  const std::size_t magic_bytes = static_cast<std::size_t>(std::min<std::uint64_t>(8, r.file_size_));
  if (magic_bytes > 0) STRATA_RETURN_IF_ERROR(r.read_exact(h.data(), magic_bytes, "magic"));
  if (std::memcmp(h.data(), kTraceMagic, magic_bytes) != 0)
    return Status::invalid_argument("trace '" + path + "' at byte 0: magic '" + show_bytes(h.data(), magic_bytes) +
                                    "' (expected 'STRTRACE': not a Strata trace file)");
  if (magic_bytes < 8) {
    return r.error_at(magic_bytes,
                      "truncated: expected 8 bytes (magic) but the file ends at byte " + std::to_string(r.file_size_));
  }
  STRATA_RETURN_IF_ERROR(r.read_exact(h.data() + 8, 4, "version"));
  const std::uint32_t version = get_u32(h.data() + kOffVersion);
  if (version != kTraceVersion)
    return Status::invalid_argument("trace '" + path + "' at byte " + std::to_string(kOffVersion) + ": version " +
                                    std::to_string(version) + " (expected " + std::to_string(kTraceVersion) +
                                    "; this program reads only version " + std::to_string(kTraceVersion) + ")");
  STRATA_RETURN_IF_ERROR(r.read_exact(h.data() + 12, kFixedHeaderBytes - 12, "header"));
  const std::uint32_t flags = get_u32(h.data() + kOffFlags);
  const std::uint32_t num_tables = get_u32(h.data() + kOffNumTables);
  r.num_batches_ = get_u64(h.data() + kOffNumBatches);
  // Each table entry takes at least 13 bytes; a count that cannot fit is corruption, reported
  // before the loop below would run into the end of the file.
  if (num_tables > (r.file_size_ - r.pos_) / 13)
    return r.error_at(kOffNumTables, std::to_string(num_tables) + " tables cannot fit in the " +
                                         std::to_string(r.file_size_ - r.pos_) +
                                         " bytes after the fixed header (corrupt or truncated header)");

  // Table entries. Sizes are checked against the file size before anything is allocated.
  for (std::uint32_t t = 0; t < num_tables; ++t) {
    const std::uint64_t at = r.pos_;
    unsigned char len_bytes[4];
    STRATA_RETURN_IF_ERROR(r.read_exact(len_bytes, 4, "table name length"));
    h.insert(h.end(), len_bytes, len_bytes + 4);
    const std::uint32_t name_len = get_u32(len_bytes);
    if (name_len == 0 || name_len > kTraceMaxNameBytes) {
      // Could be corruption of any header byte: let the checksum speak first if it is readable.
      return r.error_at(at, "table " + std::to_string(t) + " name length " + std::to_string(name_len) +
                                " (expected 1 to " + std::to_string(kTraceMaxNameBytes) + ")");
    }
    const std::size_t old = h.size();
    h.resize(old + name_len + 8);
    STRATA_RETURN_IF_ERROR(r.read_exact(h.data() + old, name_len, "table name"));
    STRATA_RETURN_IF_ERROR(r.read_exact(h.data() + old + name_len, 8, "table rows"));
    TraceTable tt;
    tt.name.assign(reinterpret_cast<const char*>(h.data() + old), name_len);
    tt.rows = static_cast<std::int64_t>(get_u64(h.data() + old + name_len));
    r.tables_.push_back(std::move(tt));
  }
  unsigned char crc_bytes[4];
  const std::uint64_t crc_at = r.pos_;
  STRATA_RETURN_IF_ERROR(r.read_exact(crc_bytes, 4, "header checksum"));
  const std::uint32_t stored = get_u32(crc_bytes);
  const std::uint32_t computed = trace_crc32c(h.data(), h.size());
  if (stored != computed)
    return r.error_at(crc_at, "header checksum " + hex32(stored) + " does not match the CRC-32C " + hex32(computed) +
                                  " of bytes 0.." + std::to_string(crc_at) + " (corrupt header)");
  // Checked after the checksum: a valid checksum means the writer produced these values.
  if (flags != 0)
    return Status::invalid_argument("trace '" + path + "' at byte " + std::to_string(kOffFlags) + ": flags " +
                                    hex32(flags) + " (expected 0 in version 1)");
  if (num_tables == 0) return r.error_at(kOffNumTables, "0 tables (expected at least one)");
  std::unordered_set<std::string> names;
  for (const TraceTable& t : r.tables_) {
    if (t.rows <= 0)
      return r.error_at(crc_at, "table '" + t.name + "' has rows " + std::to_string(t.rows) + " (expected > 0)");
    if (!names.insert(t.name).second) return r.error_at(crc_at, "table '" + t.name + "' appears twice in the header");
  }
  r.first_record_ = r.pos_;
  return Result<TraceReader>(std::move(r));
}

Status TraceReader::rewind() {
  if (std::fseek(file_.get(), static_cast<long>(first_record_), SEEK_SET) != 0)
    return os_error("cannot seek in trace", path_);
  pos_ = first_record_;
  batches_read_ = 0;
  return Status::ok();
}

Result<bool> TraceReader::record_head(unsigned char* head, std::uint64_t& payload_len) {
  if (batches_read_ == num_batches_) {
    if (pos_ != file_size_)
      return error_at(pos_, std::to_string(file_size_ - pos_) + " trailing bytes after the last of " +
                                std::to_string(num_batches_) + " batches (expected end of file)");
    return false;
  }
  const std::uint64_t at = pos_;
  const std::string batch = "batch " + std::to_string(batches_read_);
  STRATA_RETURN_IF_ERROR(read_exact(head, kRecordHeadBytes, (batch + " record header").c_str()));
  const std::uint32_t magic = get_u32(head);
  if (magic != kTraceRecordMagic)
    return error_at(at,
                    batch + ": record magic " + hex32(magic) + " (expected " + hex32(kTraceRecordMagic) + " 'BTCH')");
  payload_len = get_u64(head + 4);
  const std::uint64_t left = file_size_ - pos_;
  if (payload_len > left || left - payload_len < 4)
    return error_at(at, "truncated: " + batch + " declares a " + std::to_string(payload_len) +
                            "-byte payload plus a 4-byte checksum but only " + std::to_string(left) +
                            " bytes follow its header");
  return true;
}

Result<bool> TraceReader::skip() {
  unsigned char head[kRecordHeadBytes];
  std::uint64_t payload_len = 0;
  STRATA_ASSIGN_OR_RETURN(const bool more, record_head(head, payload_len));
  if (!more) return false;
  if (::fseeko(file_.get(), static_cast<off_t>(payload_len + 4), SEEK_CUR) != 0)
    return os_error("cannot seek in trace", path_);
  pos_ += payload_len + 4;
  ++batches_read_;
  return true;
}

Result<bool> TraceReader::next(KeyBatch& out) {
  const std::uint64_t at = pos_;
  const std::string batch = "batch " + std::to_string(batches_read_);
  unsigned char head[kRecordHeadBytes];
  std::uint64_t payload_len = 0;
  STRATA_ASSIGN_OR_RETURN(const bool more, record_head(head, payload_len));
  if (!more) return false;
  record_.resize(static_cast<std::size_t>(payload_len) + 4);
  STRATA_RETURN_IF_ERROR(read_exact(record_.data(), record_.size(), (batch + " payload").c_str()));
  const std::uint32_t stored = get_u32(record_.data() + payload_len);
  const std::uint32_t computed =
      trace_crc32c(record_.data(), static_cast<std::size_t>(payload_len), trace_crc32c(head, kRecordHeadBytes));
  if (stored != computed)
    return error_at(at, batch + ": checksum " + hex32(stored) + " does not match the CRC-32C " + hex32(computed) +
                            " of the record's " + std::to_string(kRecordHeadBytes + payload_len) +
                            " bytes (corrupt record)");

  // Decode. The checksum matched, so a bad value here means a writer bug or a crafted file; still
  // every length is checked against the bytes that are left.
  const unsigned char* p = record_.data();
  const unsigned char* const end = p + payload_len;
  const std::uint64_t base = at + kRecordHeadBytes;  // file offset of payload byte 0
  const auto off = [&](const unsigned char* q) { return base + static_cast<std::uint64_t>(q - record_.data()); };
  const auto need = [&](std::uint64_t n, const std::string& what) -> Status {
    if (n > static_cast<std::uint64_t>(end - p))
      return error_at(off(p), batch + ": " + what + " needs " + std::to_string(n) + " bytes but the payload has " +
                                  std::to_string(end - p) + " left (bad record)");
    return Status::ok();
  };
  STRATA_RETURN_IF_ERROR(need(12, "the feature count and batch size"));
  const std::uint32_t num_features = get_u32(p);
  const auto batch_size = static_cast<std::int64_t>(get_u64(p + 4));
  if (num_features == 0 || num_features > tables_.size())
    return error_at(off(p), batch + ": " + std::to_string(num_features) + " features (expected 1 to " +
                                std::to_string(tables_.size()) + ")");
  if (batch_size < 0)
    return error_at(off(p + 4), batch + ": batch size " + std::to_string(batch_size) + " (expected >= 0)");
  p += 12;

  KeyBatch kb;
  kb.features.resize(num_features);
  std::vector<bool> seen(tables_.size(), false);
  for (std::uint32_t i = 0; i < num_features; ++i) {
    const std::uint64_t feature_at = off(p);
    STRATA_RETURN_IF_ERROR(need(16, "feature " + std::to_string(i) + " header"));
    const std::uint32_t table = get_u32(p);
    const std::uint32_t flags = get_u32(p + 4);
    const std::uint64_t num_keys = get_u64(p + 8);
    if (table >= tables_.size())
      return error_at(feature_at, batch + ": feature " + std::to_string(i) + " table index " + std::to_string(table) +
                                      " (expected < " + std::to_string(tables_.size()) + ")");
    if (seen[table])
      return error_at(feature_at,
                      batch + ": table '" + tables_[table].name + "' appears twice (expected at most once)");
    seen[table] = true;
    if ((flags & ~kFeatureHasWeights) != 0)
      return error_at(feature_at + 4, batch + ": feature flags " + hex32(flags) + " (expected 0 or 1)");
    p += 16;
    const bool weighted = (flags & kFeatureHasWeights) != 0;
    const std::uint64_t n_off = static_cast<std::uint64_t>(batch_size) + 1;
    // Overflow-safe: each count is first compared with the bytes left.
    const std::uint64_t left_bytes = static_cast<std::uint64_t>(end - p);
    if (n_off > left_bytes / 8 || num_keys > left_bytes / 8)
      return error_at(feature_at, batch + ": feature " + std::to_string(i) + " (table '" + tables_[table].name +
                                      "') declares " + std::to_string(n_off) + " offsets and " +
                                      std::to_string(num_keys) + " keys but the payload has " +
                                      std::to_string(left_bytes) + " bytes left (bad record)");
    const std::uint64_t bytes = 8 * n_off + 8 * num_keys + (weighted ? 4 * num_keys : 0);
    STRATA_RETURN_IF_ERROR(
        need(bytes, "feature " + std::to_string(i) + " (table '" + tables_[table].name + "') arrays"));

    JaggedKeys& f = kb.features[i];
    f.table = tables_[table].name;
    f.offsets.resize(static_cast<std::size_t>(n_off));
    f.keys.resize(static_cast<std::size_t>(num_keys));
    if (kLittleEndianHost) {
      std::memcpy(f.offsets.data(), p, 8 * f.offsets.size());  // never empty: batch_size + 1 >= 1
      p += 8 * f.offsets.size();
      if (!f.keys.empty()) std::memcpy(f.keys.data(), p, 8 * f.keys.size());
      p += 8 * f.keys.size();
    } else {
      for (auto& o : f.offsets) o = static_cast<std::int64_t>(get_u64(p)), p += 8;
      for (auto& k : f.keys) k = static_cast<Key>(get_u64(p)), p += 8;
    }
    if (weighted) {
      f.weights.resize(static_cast<std::size_t>(num_keys));
      for (auto& w : f.weights) {
        const std::uint32_t u = get_u32(p);
        std::memcpy(&w, &u, 4);
        p += 4;
      }
    }
    TableSpec spec;
    spec.name = f.table;
    spec.rows = tables_[table].rows;
    const Status st = validate(f, spec, batch_size);
    if (!st.is_ok()) return error_at(feature_at, batch + ": " + st.message() + " (bad record)");
  }
  if (p != end)
    return error_at(off(p), batch + ": " + std::to_string(end - p) +
                                " unused payload bytes (expected the payload to "
                                "end after the last feature)");
  out = std::move(kb);
  ++batches_read_;
  return true;
}

// ---------------------------------------------------------------------------------------------

Status write_trace(const std::string& path, const std::vector<TraceTable>& tables,
                   const std::vector<KeyBatch>& batches) {
  STRATA_ASSIGN_OR_RETURN(TraceWriter w, TraceWriter::create(path, tables));
  for (const KeyBatch& b : batches) STRATA_RETURN_IF_ERROR(w.append(b));
  return w.close();
}

Result<Trace> read_trace(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(TraceReader r, TraceReader::open(path));
  Trace t;
  t.tables = r.tables();
  for (;;) {
    KeyBatch b;
    STRATA_ASSIGN_OR_RETURN(bool more, r.next(b));
    if (!more) break;
    t.batches.push_back(std::move(b));
  }
  return t;
}

}  // namespace strata::bench
