// The text of a JSON record for stdout.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace stsa::cli {

// One line of JSON. Strings that are not UTF-8 (a path given in bytes, as Linux allows)
// print with U+FFFD in place of the bad bytes: dump() would throw after the work, and
// after files were written.
inline std::string json_text(const nlohmann::json& record) {
  return record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace stsa::cli
