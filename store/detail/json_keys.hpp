#pragma once
// DuplicateKeys: a parser callback for nlohmann::json::parse that finds a key given twice in one
// object, which the parser would otherwise resolve silently (the last value wins). Used by every
// JSON input the store reads from users: store configs (and so strata-tune's plans) and hardware
// profiles.

#include <cstddef>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.hpp"

namespace strata::detail {

/// Records the first key that an object of the document holds twice, with the path of that key
/// ("tables[1].optimizer.kind"). Pass callback() to nlohmann::json::parse, then ask status(). One
/// object per parse; not thread-safe. Memory grows with the depth of the document and the keys of
/// the objects open at once, never with the path length (the path is built only for the error).
class DuplicateKeys {
 public:
  /// The callback to give nlohmann::json::parse; it keeps every value and refers to this object,
  /// which must outlive the parse.
  nlohmann::json::parser_callback_t callback();

  /// OK, or invalid_argument "<who>: key 'tables[0].name' is given twice (expected each key at most
  /// once in an object)" for the first key found twice.
  Status status(const std::string& who) const;

 private:
  struct Frame {
    bool object = false;
    std::unordered_set<std::string> keys;  // of an object: the keys seen so far
    std::string key;                       // of an object: the key whose value is being read
    std::size_t index = 0;                 // of an array: the element being read
  };
  bool on_event(nlohmann::json::parse_event_t event, const nlohmann::json& parsed);
  std::string path_to(const std::string& key) const;

  std::vector<Frame> open_;  // the arrays and objects being read, outermost first
  std::string duplicate_;    // path of the first key found twice; empty: none
  bool found_ = false;
};

}  // namespace strata::detail
