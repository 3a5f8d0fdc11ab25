#include "tessera/io/json_parse.h"

#include <gtest/gtest.h>

#include <string>

#include "tessera/io/checkpoint.h"
#include "tessera/io/hf_config.h"
#include "tessera/io/safetensors.h"
#include "test_util.h"

namespace tessera::io {
namespace {

using testing::expect_error;
using testing::spit;

std::string nested(int depth) {
  return std::string(static_cast<size_t>(depth), '[') +
         std::string(static_cast<size_t>(depth), ']');
}

TEST(ParseJson, ParsesLikeNlohmann) {
  const std::string text = R"({"a": [1, 2.5, "x", null, true, {"b": {}}]})";
  EXPECT_EQ(parse_json(text), nlohmann::json::parse(text));
  EXPECT_THROW(parse_json("{"), nlohmann::json::parse_error);
}

TEST(ParseJson, NestingIsBounded) {
  EXPECT_NO_THROW(parse_json(nested(kMaxJsonDepth + 1)));  // depth counts enclosing containers
  EXPECT_NO_THROW(parse_json(R"({"a": )" + nested(kMaxJsonDepth) + "}"));
  try {
    parse_json(nested(kMaxJsonDepth + 2));
    ADD_FAILURE() << "a document nested too deeply was accepted";
  } catch (const nlohmann::json::exception& e) {
    EXPECT_NE(std::string(e.what()).find("nesting deeper than 128 levels"), std::string::npos);
  }
  // A million levels: rejected as it is read, before anything recurses over it.
  EXPECT_THROW(parse_json(nested(1'000'000)), nlohmann::json::exception);
}

class JsonFilesTest : public testing::TempDirTest {};

TEST_F(JsonFilesTest, ParsersReportDeepNestingAsTheirOwnErrors) {
  const std::string deep = R"({"n_layer": )" + nested(100'000) + "}";
  spit(dir_ / "config.json", deep);
  expect_error<ConfigError>([&] { read_hf_config(dir_ / "config.json"); },
                            {"config.json", "not valid JSON", "nesting deeper"});
  std::string header = R"({"t": )" + nested(100'000) + "}";
  std::string st(8, '\0');
  for (int i = 0; i < 8; ++i) st[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  spit(dir_ / "deep.safetensors", st + header);
  expect_error<IoError>([&] { SafetensorsFile f(dir_ / "deep.safetensors"); },
                        {"deep.safetensors", "not valid JSON", "nesting deeper"});
  std::filesystem::create_directories(dir_ / "ckpt" / "step-00000001");
  spit(dir_ / "ckpt" / "step-00000001" / "state.json", deep);
  expect_error<IoError>([&] { load_checkpoint(dir_ / "ckpt"); },
                        {"state.json", "not valid JSON", "nesting deeper"});
}

}  // namespace
}  // namespace tessera::io
