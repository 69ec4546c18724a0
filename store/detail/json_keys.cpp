#include "store/detail/json_keys.hpp"

namespace strata::detail {

using nlohmann::json;

json::parser_callback_t duplicate_keys_callback(DuplicateKeys& keys) {
  return [&keys](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        keys.start(event == json::parse_event_t::object_start);
        break;
      case json::parse_event_t::key:
        (void)keys.key(parsed.get<std::string>());
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        keys.end();
        break;
      case json::parse_event_t::value:
        keys.value();
        break;
    }
    return true;  // keep every value
  };
}

}  // namespace strata::detail
