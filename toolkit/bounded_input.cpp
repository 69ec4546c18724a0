#include "toolkit/bounded_input.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/json_keys.hpp"

namespace strata::bench {
namespace {

using nlohmann::json;

// The kind of a file that is not a regular one, for messages.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string byte_limit_text(std::uint64_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) (void)::close(fd);
  }
};

// A SAX consumer that only tracks the nesting depth and the keys of the objects open, and stops
// the parse when it goes past the depth limit or at a key given twice; it builds nothing.
// nlohmann's parser keeps its own state on the heap, so the pass uses bounded stack whatever the
// input.
class DepthCheck final : public json::json_sax_t {
 public:
  explicit DepthCheck(int max_depth) : max_depth_(max_depth) {}

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    keys_.start(true);
    return enter();
  }
  bool key(string_t& k) override {
    if (keys_.key(k)) return true;
    duplicate_ = true;  // the parser would keep the last value silently
    return false;
  }
  bool end_object() override { return leave(); }
  bool start_array(std::size_t) override {
    keys_.start(false);
    return enter();
  }
  bool end_array() override { return leave(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error_ = e.what();
    return false;
  }

  bool too_deep() const noexcept { return too_deep_; }
  /// True when a key was given twice in one object (the parse stopped there; keys() names it).
  bool duplicate() const noexcept { return duplicate_; }
  const DuplicateKeys& keys() const noexcept { return keys_; }
  const std::string& error() const noexcept { return error_; }

 private:
  bool enter() {
    if (++depth_ > max_depth_) {
      too_deep_ = true;
      return false;
    }
    return true;
  }
  bool leave() {
    --depth_;
    keys_.end();
    return true;
  }
  bool value() {
    keys_.value();
    return true;
  }

  int max_depth_;
  int depth_ = 0;
  bool too_deep_ = false;
  DuplicateKeys keys_;  // the keys of each object open
  bool duplicate_ = false;
  std::string error_;
};

std::string dump_string(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }

// Appends `v` to `out` until `out` is longer than `budget`; the caller cuts the result.
void append_excerpt(const json& v, std::string& out, std::size_t budget, int depth) {
  constexpr int kMaxExcerptDepth = 8;
  if (out.size() > budget) return;
  // Enough of a string to pass the budget, so a cut one is always cut again below.
  const auto append_string = [&](const std::string& s) {
    const std::size_t room = budget + 1 - out.size() + 8;
    out += dump_string(s.size() > room ? s.substr(0, utf8_cut(s, room)) : s);
  };
  if (v.is_object() || v.is_array()) {
    const bool object = v.is_object();
    if (v.empty()) {
      out += object ? "{}" : "[]";
      return;
    }
    if (depth >= kMaxExcerptDepth) {
      out += object ? "{...}" : "[...]";
      return;
    }
    out += object ? '{' : '[';
    bool first = true;
    for (auto it = v.begin(); it != v.end() && out.size() <= budget; ++it) {
      if (!first) out += ',';
      first = false;
      if (object) {
        append_string(it.key());
        out += ':';
      }
      append_excerpt(it.value(), out, budget, depth + 1);
    }
    out += object ? '}' : ']';
  } else if (v.is_string()) {
    append_string(v.get_ref<const std::string&>());
  } else if (v.is_binary()) {
    out += "<binary>";
  } else {
    out += v.dump(-1, ' ', false, json::error_handler_t::replace);  // a number, boolean or null
  }
}

}  // namespace

std::string json_excerpt(const json& v, std::size_t max_chars) {
  std::string out;
  append_excerpt(v, out, max_chars, 0);
  return quote_prefix(out, max_chars);
}

Result<std::string> read_input_file(const std::string& path, const std::string& what, std::uint64_t max_bytes) {
  const std::string who = what + " '" + path + "'";
  const auto os_error = [&](const char* action, int err) {
    const std::string msg = std::string(action) + " " + who + ": " + std::strerror(err);
    return err == ENOENT ? Status::not_found(msg) : Status::io_error(msg);
  };
  const auto check_type_and_size = [&](const struct stat& st) -> Status {
    if (!S_ISREG(st.st_mode))
      return Status::invalid_argument(who + " is " + file_kind(st.st_mode) + ", not a regular file (expected a " +
                                      "JSON file of at most " + byte_limit_text(max_bytes) + ")");
    if (static_cast<std::uint64_t>(st.st_size) > max_bytes)
      return Status::invalid_argument(who + " has " + std::to_string(st.st_size) + " bytes, over the limit of " +
                                      byte_limit_text(max_bytes) + " for an input file");
    return Status::ok();
  };
  // Check the type before opening: opening a FIFO would block, and opening a device can have
  // effects of its own. The open file is checked again (the path may have changed in between).
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return os_error("cannot open", errno);
  STRATA_RETURN_IF_ERROR(check_type_and_size(st));
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return os_error("cannot open", errno);
  const FdCloser closer{fd};
  if (::fstat(fd, &st) != 0) return os_error("cannot stat", errno);
  STRATA_RETURN_IF_ERROR(check_type_and_size(st));
  std::string text;
  text.reserve(static_cast<std::size_t>(st.st_size));
  char buf[1 << 16];
  // Read one byte past the limit at most, to tell a file that grew past it.
  while (text.size() <= max_bytes) {
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(sizeof buf, max_bytes + 1 - text.size()));
    const ssize_t n = ::read(fd, buf, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      return os_error("cannot read", errno);
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  if (text.size() > max_bytes)
    return Status::invalid_argument(who + " grew past the limit of " + byte_limit_text(max_bytes) +
                                    " for an input file while it was read");
  return text;
}

Result<json> parse_json_limited(const std::string& text, const std::string& who, int max_depth) {
  DepthCheck check(max_depth);
  if (!json::sax_parse(text, &check)) {
    if (check.too_deep())
      return Status::invalid_argument(who + ": JSON nested deeper than " + std::to_string(max_depth) +
                                      " levels (expected at most " + std::to_string(max_depth) +
                                      " levels of arrays and objects)");
    if (check.duplicate()) return check.keys().status(who);
    return Status::invalid_argument(who + ": invalid JSON: " + quote_prefix(check.error(), 200));
  }
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::invalid_argument(who + ": invalid JSON");  // the SAX pass accepted it
  return j;
}

}  // namespace strata::bench
