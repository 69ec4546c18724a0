#include "store/detail/json_keys.hpp"

namespace strata::detail {

using nlohmann::json;

json::parser_callback_t DuplicateKeys::callback() {
  return [this](int /*depth*/, json::parse_event_t event, json& parsed) { return on_event(event, parsed); };
}

bool DuplicateKeys::on_event(json::parse_event_t event, const json& parsed) {
  // A value read whole: the next one of its array is the next element.
  const auto value_done = [this] {
    if (!open_.empty() && !open_.back().object) ++open_.back().index;
  };
  switch (event) {
    case json::parse_event_t::object_start:
    case json::parse_event_t::array_start:
      open_.emplace_back();
      open_.back().object = event == json::parse_event_t::object_start;
      break;
    case json::parse_event_t::key: {
      Frame& f = open_.back();
      f.key = parsed.get<std::string>();
      if (!f.keys.insert(f.key).second && !found_) {
        duplicate_ = path_to(f.key);
        found_ = true;
      }
      break;
    }
    case json::parse_event_t::object_end:
    case json::parse_event_t::array_end:
      open_.pop_back();
      value_done();
      break;
    case json::parse_event_t::value:
      value_done();
      break;
  }
  return true;  // keep every value: the document is the same as without the callback
}

std::string DuplicateKeys::path_to(const std::string& key) const {
  std::string path;
  // Every open container but the innermost leads into the next one by its key or index.
  for (std::size_t i = 0; i + 1 < open_.size(); ++i)
    path += open_[i].object ? "." + open_[i].key : "[" + std::to_string(open_[i].index) + "]";
  path += "." + key;
  if (path[0] == '.') path.erase(0, 1);  // a key of the top-level object
  constexpr std::size_t kMaxShown = 200;
  if (path.size() > kMaxShown) path = path.substr(0, kMaxShown) + "...";
  return path;
}

Status DuplicateKeys::status(const std::string& who) const {
  if (!found_) return Status::ok();
  return Status::invalid_argument(who + ": key '" + duplicate_ +
                                  "' is given twice (expected each key at most once in an object)");
}

}  // namespace strata::detail
