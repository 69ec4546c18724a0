#pragma once
// DuplicateKeys: finds a key given twice in one object of a JSON document, which JSON parsers
// resolve silently (the last value wins). Fed the parser's events, so it serves any parser: the
// store's JSON inputs (configs, hardware profiles) through nlohmann's parse callback
// (store/detail/json_keys.hpp), strata-bench's workloads and profiles through its SAX pass.

#include <cstddef>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/status.hpp"

namespace strata {

/// Records the first key that an object of the document holds twice, with the path of that key
/// ("tables[1].optimizer.kind"). One object per parse; not thread-safe. Memory grows with the
/// depth of the document and the keys of the objects open at once, never with the path length
/// (the path is built only for the error).
class DuplicateKeys {
 public:
  /// An object (`object` true) or an array starts.
  void start(bool object);
  /// The innermost object or array ends (a value of the container around it).
  void end();
  /// A value other than an object or array was read.
  void value();
  /// A key of the innermost object; false when that object held it already.
  bool key(const std::string& key);

  /// OK, or invalid_argument "<who>: key 'tables[1].optimizer.kind' is given twice (expected each
  /// key at most once in an object)" for the first key found twice. A key that is empty or holds
  /// '.' or '[' shows as a JSON string in brackets (device["x.y"]), so a path reads one way; a
  /// path longer than 200 bytes is cut (at a UTF-8 character boundary).
  Status status(const std::string& who) const;

 private:
  struct Frame {
    bool object = false;
    std::unordered_set<std::string> keys;  // of an object: the keys seen so far
    std::string key;                       // of an object: the key whose value is being read
    std::size_t index = 0;                 // of an array: the element being read
  };
  std::string path_to(const std::string& key) const;

  std::vector<Frame> open_;  // the arrays and objects being read, outermost first
  std::string duplicate_;    // path of the first key found twice
  bool found_ = false;
};

}  // namespace strata
