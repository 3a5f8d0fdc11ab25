#include "tessera/io/json_parse.h"

#include <nlohmann/json.hpp>
#include <string>

namespace tessera::io {
namespace {

// nlohmann's exception constructor is protected: a subclass can make one with our message.
class JsonTooDeep : public nlohmann::json::exception {
 public:
  JsonTooDeep()
      : nlohmann::json::exception(
            0, ("nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels").c_str()) {}
};

}  // namespace

nlohmann::json parse_json(std::string_view text) {
  const nlohmann::json::parser_callback_t limit_depth =
      [](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
        if (depth > kMaxJsonDepth && (event == nlohmann::json::parse_event_t::object_start ||
                                      event == nlohmann::json::parse_event_t::array_start))
          throw JsonTooDeep();
        return true;
      };
  return nlohmann::json::parse(text, limit_depth);
}

}  // namespace tessera::io
