#pragma once
// The parse callback that refuses a key given twice in one object of the JSON inputs the store
// reads from users: store configs (and so strata-tune's plans) and hardware profiles.

#include <nlohmann/json.hpp>

#include "core/json_keys.hpp"

namespace strata::detail {

/// A callback for nlohmann::json::parse that feeds `keys` the parse's events (ask keys.status()
/// after the parse) and keeps every value: the document is the same as without it. `keys` must
/// outlive the parse.
nlohmann::json::parser_callback_t duplicate_keys_callback(DuplicateKeys& keys);

}  // namespace strata::detail
