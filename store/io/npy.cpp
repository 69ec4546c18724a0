#include "store/io/npy.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <string_view>

#include "core/half.hpp"
#include "store/io/file_io.hpp"

namespace strata {
namespace {

static_assert(std::numeric_limits<float>::is_iec559 && sizeof(float) == 4,
              "npy I/O stores host floats as IEEE-754 binary32");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "npy I/O writes host floats as little-endian '<f4' without swapping");

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;
constexpr std::size_t kV1Prefix = 10;  // magic, 2 version bytes, uint16 header length
constexpr std::size_t kV2Prefix = 12;  // magic, 2 version bytes, uint32 header length
constexpr std::size_t kHeaderAlign = 64;
// No writer produces headers this large; a bigger length field means a corrupt file.
constexpr std::size_t kMaxHeaderLen = std::size_t{16} << 20;
constexpr const char* kF32Descr = "<f4";
constexpr const char* kF16Descr = "<f2";
constexpr const char* kI64Descr = "<i8";

std::string format_shape(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

// Printable rendering of untrusted bytes for error messages.
std::string quote_bytes(std::string_view b, std::size_t max_len = 80) {
  std::string s;
  for (std::size_t i = 0; i < b.size() && i < max_len; ++i) {
    const auto c = static_cast<unsigned char>(b[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      s += static_cast<char>(c);
    } else {
      static const char kHex[] = "0123456789abcdef";
      s += "\\x";
      s += kHex[c >> 4];
      s += kHex[c & 0xF];
    }
  }
  if (b.size() > max_len) s += "...";
  return s;
}

// Total header size (prefix + dict) from the first bytes of a file; checks magic and version.
Result<std::size_t> npy_header_size(std::string_view bytes) {
  if (bytes.size() < kV1Prefix) {
    return Status::data_loss("too short for an npy file: " + std::to_string(bytes.size()) +
                             " bytes (expected at least " + std::to_string(kV1Prefix) + ")");
  }
  if (bytes.substr(0, kMagicLen) != std::string_view(kMagic, kMagicLen)) {
    return Status::data_loss("not an npy file: starts with '" + quote_bytes(bytes.substr(0, kMagicLen)) +
                             "' (expected '\\x93NUMPY')");
  }
  const auto major = static_cast<unsigned char>(bytes[6]);
  const auto minor = static_cast<unsigned char>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0) {
    return Status::invalid_argument("unsupported npy format version " + std::to_string(major) + "." +
                                    std::to_string(minor) + " (expected 1.0, 2.0 or 3.0)");
  }
  const auto byte_at = [&](std::size_t i) { return std::size_t{static_cast<unsigned char>(bytes[i])}; };
  if (major == 1) return kV1Prefix + (byte_at(8) | byte_at(9) << 8);
  if (bytes.size() < kV2Prefix) {
    return Status::data_loss("too short for an npy " + std::to_string(major) +
                             ".0 file: " + std::to_string(bytes.size()) + " bytes (expected at least " +
                             std::to_string(kV2Prefix) + ")");
  }
  const std::size_t len = byte_at(8) | byte_at(9) << 8 | byte_at(10) << 16 | byte_at(11) << 24;
  if (len > kMaxHeaderLen) {
    return Status::data_loss("npy header length " + std::to_string(len) + " is implausible (at most " +
                             std::to_string(kMaxHeaderLen) + ")");
  }
  return kV2Prefix + len;
}

// Recursive-descent reader for the Python dict literal numpy writes as the header.
class DictParser {
 public:
  explicit DictParser(std::string_view text) : text_(text) {}

  Result<NpyHeader> parse() {
    NpyHeader h;
    bool have_descr = false, have_order = false, have_shape = false;
    if (!consume('{')) return malformed("'{'");
    for (;;) {
      if (consume('}')) break;
      std::string key;
      STRATA_RETURN_IF_ERROR(parse_string(&key, "a quoted key or '}'"));
      if (!consume(':')) return malformed("':' after key '" + key + "'");
      if (key == "descr") {
        if (have_descr) return duplicate(key);
        have_descr = true;
        skip_ws();
        if (pos_ < text_.size() && text_[pos_] == '[') {
          return Status::invalid_argument("structured dtype (a list descr) is not supported (expected '" +
                                          std::string(kF32Descr) + "')");
        }
        STRATA_RETURN_IF_ERROR(parse_string(&h.descr, "a quoted dtype string for 'descr'"));
      } else if (key == "fortran_order") {
        if (have_order) return duplicate(key);
        have_order = true;
        STRATA_RETURN_IF_ERROR(parse_bool(&h.fortran_order));
      } else if (key == "shape") {
        if (have_shape) return duplicate(key);
        have_shape = true;
        STRATA_RETURN_IF_ERROR(parse_shape(&h.shape));
      } else {
        return Status::data_loss("npy header has unknown key '" + key +
                                 "' (expected only 'descr', 'fortran_order' and 'shape')");
      }
      if (consume(',')) continue;
      if (consume('}')) break;
      return malformed("',' or '}'");
    }
    skip_ws();
    if (pos_ != text_.size()) return malformed("only padding after '}'");
    if (!have_descr || !have_order || !have_shape) {
      std::string missing;
      for (auto [have, name] : {std::pair{have_descr, "'descr'"}, std::pair{have_order, "'fortran_order'"},
                                std::pair{have_shape, "'shape'"}}) {
        if (!have) missing += (missing.empty() ? "" : ", ") + std::string(name);
      }
      return Status::data_loss("npy header lacks " + missing + ": '" + quote_bytes(text_, 200) + "'");
    }
    return h;
  }

 private:
  void skip_ws() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool consume(char c) {
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool consume_word(std::string_view w) {
    skip_ws();
    if (text_.substr(pos_, w.size()) != w) return false;
    const std::size_t end = pos_ + w.size();
    if (end < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[end])) || text_[end] == '_')) {
      return false;
    }
    pos_ = end;
    return true;
  }
  Status malformed(const std::string& expected) const {
    const std::string_view rest = text_.substr(std::min(pos_, text_.size()));
    return Status::data_loss("malformed npy header: expected " + expected + " at offset " + std::to_string(pos_) +
                             ", found '" + quote_bytes(rest, 24) + "' in '" + quote_bytes(text_, 200) + "'");
  }
  static Status duplicate(const std::string& key) { return Status::data_loss("npy header repeats key '" + key + "'"); }

  Status parse_string(std::string* out, const std::string& what) {
    skip_ws();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return malformed(what);
    const char quote = text_[pos_];
    std::size_t i = pos_ + 1;
    std::string s;
    for (; i < text_.size() && text_[i] != quote; ++i) {
      if (text_[i] == '\\' && i + 1 < text_.size()) ++i;  // Python escape: take the next char as is
      s += text_[i];
    }
    if (i >= text_.size()) return malformed("a closing quote for " + what);
    pos_ = i + 1;
    *out = std::move(s);
    return Status::ok();
  }

  Status parse_bool(bool* out) {
    if (consume_word("True")) {
      *out = true;
    } else if (consume_word("False")) {
      *out = false;
    } else {
      return malformed("True or False for 'fortran_order'");
    }
    return Status::ok();
  }

  Status parse_int(std::int64_t* out) {
    skip_ws();
    if (pos_ < text_.size() && text_[pos_] == '-') {
      return Status::data_loss("npy header has a negative dimension in 'shape': '" + quote_bytes(text_, 200) + "'");
    }
    if (pos_ >= text_.size() || !std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      return malformed("a non-negative integer dimension");
    }
    std::int64_t v = 0;
    for (; pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_])); ++pos_) {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, text_[pos_] - '0', &v)) {
        return Status::data_loss("npy header dimension overflows 64 bits: '" + quote_bytes(text_, 200) + "'");
      }
    }
    if (pos_ < text_.size() && (text_[pos_] == 'L' || text_[pos_] == 'l')) ++pos_;  // Python 2 long
    *out = v;
    return Status::ok();
  }

  // A Python tuple of ints: "()", "(5,)", "(3, 4)", "(3, 4,)". "(5)" is an int, not a tuple.
  Status parse_shape(std::vector<std::int64_t>* out) {
    if (!consume('(')) return malformed("'(' starting the 'shape' tuple");
    out->clear();
    bool trailing_comma = false;
    while (!consume(')')) {
      std::int64_t d = 0;
      STRATA_RETURN_IF_ERROR(parse_int(&d));
      out->push_back(d);
      trailing_comma = consume(',');
      if (!trailing_comma) {
        if (consume(')')) break;
        return malformed("',' or ')' in the 'shape' tuple");
      }
    }
    if (out->size() == 1 && !trailing_comma) return malformed("',' after the only dimension of 'shape'");
    return Status::ok();
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

Result<std::int64_t> element_count(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) {
      return Status::data_loss("shape " + format_shape(shape) + " has more elements than fit in 64 bits");
    }
  }
  return n;
}

}  // namespace

namespace {

// write_npy of elements of `descr`, `element` bytes each, of `shape` (1 or 2 dimensions).
Status write_npy_of(const std::string& path, const void* data, const std::vector<std::int64_t>& shape,
                    const char* descr, std::int64_t element) {
  for (const std::int64_t d : shape)
    if (d < 0)
      return Status::invalid_argument(path + ": cannot write an npy array of shape " + format_shape(shape) +
                                      ": dimensions must be >= 0");
  std::int64_t bytes = element;
  for (const std::int64_t d : shape)
    if (__builtin_mul_overflow(bytes, d, &bytes))
      return Status::invalid_argument(path + ": npy array " + format_shape(shape) + " is too large");
  if (data == nullptr && bytes > 0) {
    return Status::invalid_argument(path + ": null data for a non-empty npy array");
  }

  std::string header =
      "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " + format_shape(shape) + ", }";
  // Pad with spaces so that prefix + dict + '\n' is a multiple of 64, as numpy does (aligned data).
  const std::size_t unpadded = kV1Prefix + header.size() + 1;
  header.append((kHeaderAlign - unpadded % kHeaderAlign) % kHeaderAlign, ' ');
  header += '\n';
  std::string prefix(kMagic, kMagicLen);
  prefix += '\x01';
  prefix += '\x00';
  prefix += static_cast<char>(header.size() & 0xFF);
  prefix += static_cast<char>(header.size() >> 8);  // v1.0: fits in uint16 (a few dozen bytes)

  STRATA_ASSIGN_OR_RETURN(detail::AtomicFileWriter writer, detail::AtomicFileWriter::create(path));
  STRATA_RETURN_IF_ERROR(writer.append(prefix.data(), prefix.size()));
  STRATA_RETURN_IF_ERROR(writer.append(header.data(), header.size()));
  STRATA_RETURN_IF_ERROR(writer.append(data, static_cast<std::size_t>(bytes)));
  return writer.commit();
}

}  // namespace

Status write_npy(const std::string& path, const float* data, std::int64_t rows, std::int64_t cols) {
  return write_npy_of(path, data, {rows, cols}, kF32Descr, 4);
}

Status write_npy_f16(const std::string& path, const std::uint16_t* bits, std::int64_t rows, std::int64_t cols) {
  return write_npy_of(path, bits, {rows, cols}, kF16Descr, 2);
}

Status write_npy_i64(const std::string& path, const std::int64_t* data, std::int64_t n) {
  return write_npy_of(path, data, {n}, kI64Descr, 8);
}

Result<NpyHeader> parse_npy_header(const std::string& bytes) {
  STRATA_ASSIGN_OR_RETURN(const std::size_t total, npy_header_size(bytes));
  if (bytes.size() < total) {
    return Status::data_loss("truncated npy header: " + std::to_string(bytes.size()) + " bytes found, header needs " +
                             std::to_string(total));
  }
  const std::size_t prefix = static_cast<unsigned char>(bytes[6]) == 1 ? kV1Prefix : kV2Prefix;
  STRATA_ASSIGN_OR_RETURN(NpyHeader h, DictParser(std::string_view(bytes).substr(prefix, total - prefix)).parse());
  h.data_offset = total;
  return h;
}

namespace {

// An opened .npy file whose header parsed, of C order and of a data section that holds its shape's elements. `check`
// refuses a dtype or shape (with C order; Fortran order is refused after it) or gives the element's bytes.
struct OpenNpy {
  detail::FileReader file;
  NpyHeader h;
  std::int64_t count = 0;  // elements
};
Result<OpenNpy> open_npy(const std::string& path, const std::function<Result<std::uint64_t>(const NpyHeader&)>& check) {
  OpenNpy o;
  STRATA_ASSIGN_OR_RETURN(o.file, detail::FileReader::open(path));
  detail::FileReader& file = o.file;
  std::string head(static_cast<std::size_t>(std::min<std::uint64_t>(file.size(), kV2Prefix)), '\0');
  STRATA_RETURN_IF_ERROR(file.read_at(0, head.data(), head.size()));
  Result<std::size_t> header_size = npy_header_size(head);
  if (!header_size.is_ok()) return header_size.status().with_context(path);
  if (*header_size > file.size()) {
    return Status::data_loss(path + ": truncated npy header: file is " + std::to_string(file.size()) +
                             " bytes, header needs " + std::to_string(*header_size));
  }
  head.resize(*header_size);
  STRATA_RETURN_IF_ERROR(file.read_at(0, head.data(), head.size()));
  Result<NpyHeader> parsed = parse_npy_header(head);
  if (!parsed.is_ok()) return parsed.status().with_context(path);
  o.h = std::move(parsed).value();
  const NpyHeader& h = o.h;
  STRATA_ASSIGN_OR_RETURN(const std::uint64_t element, check(h));
  if (h.fortran_order) {
    return Status::invalid_argument(path + ": fortran_order is True (expected False: C order, row-major)");
  }
  STRATA_ASSIGN_OR_RETURN(o.count, element_count(h.shape));
  std::uint64_t want = 0;
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(o.count), element, &want)) {
    return Status::data_loss(path + ": shape " + format_shape(h.shape) + " is too large");
  }
  const std::uint64_t found = file.size() - h.data_offset;
  if (found != want) {
    return Status::data_loss(path + ": " + (found < want ? "truncated" : "trailing bytes") + ": " +
                             std::to_string(found) + " data bytes found, expected " + std::to_string(want) +
                             " for shape " + format_shape(h.shape) + " '" + h.descr + "' after a " +
                             std::to_string(h.data_offset) + "-byte header");
  }
  return o;
}

}  // namespace

Result<std::vector<float>> read_npy_matrix(const std::string& path, std::int64_t expected_rows,
                                           std::int64_t expected_cols) {
  if (expected_rows < 0 || expected_cols < 0) {
    return Status::invalid_argument(path + ": expected shape (" + std::to_string(expected_rows) + ", " +
                                    std::to_string(expected_cols) + ") has a negative dimension");
  }
  bool half = false;
  const auto check = [&](const NpyHeader& h) -> Result<std::uint64_t> {
    half = h.descr == kF16Descr;
    if (h.descr != kF32Descr && !half) {
      return Status::invalid_argument(path + ": dtype '" + h.descr + "' is not supported (expected '" + kF32Descr +
                                      "', little-endian float32, or '" + kF16Descr + "', little-endian float16)");
    }
    const std::vector<std::int64_t> expected_shape = {expected_rows, expected_cols};
    if (h.shape != expected_shape && !h.fortran_order) {
      return Status::invalid_argument(path + ": shape " + format_shape(h.shape) +
                                      " does not match the table (expected " + format_shape(expected_shape) + ")");
    }
    return std::uint64_t{half ? 2u : 4u};
  };
  STRATA_ASSIGN_OR_RETURN(OpenNpy opened, open_npy(path, check));
  detail::FileReader& file = opened.file;
  const NpyHeader& h = opened.h;
  const std::int64_t count = opened.count;
  const std::uint64_t want = static_cast<std::uint64_t>(count) * (half ? 2 : 4);

  std::vector<float> out;
  try {
    out.resize(static_cast<std::size_t>(count));
  } catch (const std::bad_alloc&) {
    return Status::resource_exhausted(path + ": cannot allocate " +
                                      std::to_string(4 * static_cast<std::uint64_t>(count)) + " bytes for shape " +
                                      format_shape(h.shape));
  }
  if (!half) {
    STRATA_RETURN_IF_ERROR(file.read_at(h.data_offset, out.data(), static_cast<std::size_t>(want)));
    return out;
  }
  // fp16: read in chunks of bits, each widened (exactly) into its floats.
  constexpr std::int64_t kChunk = std::int64_t{1} << 16;
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(std::min(count, kChunk)));
  for (std::int64_t i0 = 0; i0 < count; i0 += kChunk) {
    const std::int64_t n = std::min(kChunk, count - i0);
    STRATA_RETURN_IF_ERROR(
        file.read_at(h.data_offset + 2 * static_cast<std::uint64_t>(i0), bits.data(), static_cast<std::size_t>(2 * n)));
    for (std::int64_t i = 0; i < n; ++i)
      out[static_cast<std::size_t>(i0 + i)] = widen_f16(bits[static_cast<std::size_t>(i)]);
  }
  return out;
}

Result<std::vector<std::int64_t>> read_npy_i64(const std::string& path) {
  const auto check = [&](const NpyHeader& h) -> Result<std::uint64_t> {
    if (h.descr != kI64Descr)
      return Status::invalid_argument(path + ": dtype '" + h.descr + "' is not supported (expected '" + kI64Descr +
                                      "', little-endian int64)");
    if (h.shape.size() != 1 && !h.fortran_order)
      return Status::invalid_argument(path + ": shape " + format_shape(h.shape) + " (expected one dimension, (n,))");
    return std::uint64_t{8};
  };
  STRATA_ASSIGN_OR_RETURN(OpenNpy opened, open_npy(path, check));
  std::vector<std::int64_t> out(static_cast<std::size_t>(opened.count));
  STRATA_RETURN_IF_ERROR(opened.file.read_at(opened.h.data_offset, out.data(), out.size() * sizeof(std::int64_t)));
  return out;
}

}  // namespace strata
