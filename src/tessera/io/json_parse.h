// Parsing JSON that comes from outside (files, headers) with a bound on nesting depth.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string_view>

namespace tessera::io {

// No format tessera reads nests deeper than a few levels.
inline constexpr int kMaxJsonDepth = 128;

// nlohmann::json::parse(text), but a document nested deeper than kMaxJsonDepth is rejected with
// a nlohmann::json::exception (so callers' existing handlers report it): the parser itself is
// iterative, but copying, comparing, dumping and converting a json value recurse once per level,
// so a few megabytes of '[' would otherwise overflow the stack wherever the value is used.
nlohmann::json parse_json(std::string_view text);

}  // namespace tessera::io
