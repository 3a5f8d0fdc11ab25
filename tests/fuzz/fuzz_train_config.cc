// Fuzz target: a training config file (train/train_config.h), as `tessera train --config FILE`
// reads it: parsed, mapped onto TrainConfig, validated. Every value that was accepted must be
// the value in the file (no silent wrap-around or overflow to infinity), and a config that
// passes must survive a to_json / train_config_from_json round trip unchanged.
#include <cmath>
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "tessera/core/error.h"
#include "tessera/train/train_config.h"

using namespace tessera;

namespace {

// `out` (a TrainConfig field written back to JSON) holds the value of `in` (from the file).
bool same_value(const nlohmann::json& in, const nlohmann::json& out) {
  if (!in.is_number() || out.is_number_integer()) return in == out;  // integers: exactly
  // A float field: the nearest float to the number in the file.
  const double x = in.get<double>(), y = out.get<double>();
  return std::isfinite(y) && std::fabs(x - y) <= 1e-7 * std::fabs(x) + 1e-38;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::write_input("train.json", data, size);
  try {
    const nlohmann::json in = train::read_json_file(path);
    const train::TrainConfig c = train::train_config_from_json(in);
    const nlohmann::json out = train::to_json(c);
    for (const auto& [key, value] : in.items()) {
      fuzz::require(same_value(value, out.at(key)), "an accepted value is the one in the file");
    }
    c.validate();
    fuzz::require(train::to_json(train::train_config_from_json(out)) == out,
                  "a valid config survives to_json and train_config_from_json");
  } catch (const Error& e) {
    fuzz::rejected(e);  // The expected outcome for a malformed or invalid config.
  }
  return 0;
}
