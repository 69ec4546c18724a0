#include "core/json_keys.hpp"

#include <cstdio>

#include "core/text.hpp"

namespace strata {
namespace {

// The step of a path into an object's `key`: ".key", or ["key"] (a JSON string) when the key is
// empty or holds '.' or '[', which would make the path read another way.
std::string key_step(const std::string& key) {
  if (!key.empty() && key.find_first_of(".[") == std::string::npos) return "." + key;
  std::string out = "[\"";
  for (const char c : key) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"]";
}

}  // namespace

void DuplicateKeys::start(bool object) {
  open_.emplace_back();
  open_.back().object = object;
}

void DuplicateKeys::end() {
  open_.pop_back();
  value();
}

void DuplicateKeys::value() {
  // A value read whole: the next one of its array is the next element.
  if (!open_.empty() && !open_.back().object) ++open_.back().index;
}

bool DuplicateKeys::key(const std::string& key) {
  Frame& f = open_.back();
  f.key = key;
  if (f.keys.insert(key).second) return true;
  if (!found_) {
    duplicate_ = path_to(key);
    found_ = true;
  }
  return false;
}

std::string DuplicateKeys::path_to(const std::string& key) const {
  std::string path;
  // Every open container but the innermost leads into the next one by its key or index.
  for (std::size_t i = 0; i + 1 < open_.size(); ++i)
    path += open_[i].object ? key_step(open_[i].key) : "[" + std::to_string(open_[i].index) + "]";
  path += key_step(key);
  if (path[0] == '.') path.erase(0, 1);  // a key of the top-level object
  constexpr std::size_t kMaxShown = 200;
  return quote_prefix(path, kMaxShown);
}

Status DuplicateKeys::status(const std::string& who) const {
  if (!found_) return Status::ok();
  return Status::invalid_argument(who + ": key '" + duplicate_ +
                                  "' is given twice (expected each key at most once in an object)");
}

}  // namespace strata
