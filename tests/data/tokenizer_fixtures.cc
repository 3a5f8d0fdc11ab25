#include "tokenizer_fixtures.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace tessera::data::testing {

std::filesystem::path tokenizer_fixture_dir() {
  return TESSERA_TOKENIZER_FIXTURES;
}

const nlohmann::json& tokenizer_expected() {
  static const nlohmann::json expected = [] {
    const auto path = tokenizer_fixture_dir() / "expected.json";
    std::ifstream f(path);
    if (!f) throw std::runtime_error("cannot open " + path.string());
    std::ostringstream ss;
    ss << f.rdbuf();
    return nlohmann::json::parse(ss.str());
  }();
  return expected;
}

const nlohmann::json& tokenizer_reference(const std::string& name) {
  return tokenizer_expected().at("tokenizers").at(name);
}

std::filesystem::path tokenizer_fixture_file(const std::string& name) {
  return tokenizer_fixture_dir() / tokenizer_reference(name).at("file").get<std::string>();
}

std::vector<uint32_t> ids_of(const nlohmann::json& array) {
  return array.get<std::vector<uint32_t>>();
}

}  // namespace tessera::data::testing
