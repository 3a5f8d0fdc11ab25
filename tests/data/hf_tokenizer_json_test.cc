// Reading tokenizer.json: what is supported gives the reference's ids (the merge forms, the
// ignore_merges rule, the pre-tokenizer forms, templates), and everything else is a clear error
// (IoError for a malformed file, ConfigError for an unsupported one, both naming the file).
#include "tessera/data/hf_tokenizer_json.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>

#include "tessera/core/error.h"
#include "tessera/data/byte_level.h"
#include "tessera/data/hf_bpe_tokenizer.h"
#include "tokenizer_fixtures.h"

namespace tessera::data {
namespace {

using nlohmann::json;
using testing::tokenizer_fixture_file;
using testing::tokenizer_reference;

json fixture_json(const std::string& name) {
  std::ifstream f(tokenizer_fixture_file(name));
  return json::parse(f);
}

// A minimal byte-level BPE: the 256 byte tokens, then "bc", "ab", "abc" from three merges in the
// order (b c), (a b), (ab c).
json tiny_tokenizer(bool ignore_merges) {
  json vocab = json::object();
  uint32_t next = 0;
  for (int b = 0; b < 256; ++b) vocab[byte_level::from_bytes(std::string(1, char(b)))] = next++;
  for (const char* t : {"bc", "ab", "abc"}) vocab[t] = next++;
  return {
      {"version", "1.0"},
      {"added_tokens", json::array({{{"id", next},
                                     {"content", "<X>"},
                                     {"single_word", false},
                                     {"lstrip", false},
                                     {"rstrip", false},
                                     {"normalized", false},
                                     {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"ignore_merges", ignore_merges},
        {"vocab", vocab},
        {"merges", json::array({"b c", "a b", "ab c"})}}}};
}

HfBpeTokenizer from(const json& j) {
  return HfBpeTokenizer::from_json(j.dump(), "test/tokenizer.json");
}

std::vector<uint32_t> ids_of_tokens(const HfBpeTokenizer& tok,
                                    std::initializer_list<const char*> tokens) {
  std::vector<uint32_t> ids;
  for (const char* t : tokens) ids.push_back(*tok.token_to_id(t));
  return ids;
}

// The ids below are what Hugging Face tokenizers 0.23 gives for the same file.
TEST(HfTokenizerJson, MergesApplyByRankAndIgnoreMergesTakesWholeTokens) {
  const auto plain = from(tiny_tokenizer(false));
  EXPECT_EQ(plain.encode("abc abc"), ids_of_tokens(plain, {"a", "bc", "Ġ", "a", "bc"}));
  const auto whole = from(tiny_tokenizer(true));
  EXPECT_EQ(whole.encode("abc abc"), ids_of_tokens(whole, {"abc", "Ġ", "a", "bc"}));
  EXPECT_EQ(whole.vocab_size(), 256 + 3 + 1);
}

TEST(HfTokenizerJson, AddPrefixSpaceAppliesToEachTextBetweenAddedTokens) {
  json j = tiny_tokenizer(false);
  j["pre_tokenizer"]["add_prefix_space"] = true;
  const auto tok = from(j);
  EXPECT_EQ(tok.encode("abc<X>abc  x"),
            ids_of_tokens(tok, {"Ġ", "a", "bc", "<X>", "Ġ", "a", "bc", "Ġ", "Ġ", "x"}));
  EXPECT_EQ(tok.decode(tok.encode("abc<X>abc  x")), " abc<X> abc  x");
}

TEST(HfTokenizerJson, StringAndArrayMergesGiveTheSameTokenizer) {
  json arrays = fixture_json("llama3");
  ASSERT_TRUE(arrays["model"]["merges"][0].is_array());
  json strings = arrays;
  for (auto& m : strings["model"]["merges"])
    m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  const std::string text = tokenizer_reference("llama3")["cases"]["multilingual"]["text"];
  EXPECT_EQ(from(arrays).encode(text), from(strings).encode(text));
  EXPECT_EQ(from(strings).encode(text),
            testing::ids_of(tokenizer_reference("llama3")["cases"]["multilingual"]["ids"]));
}

TEST(HfTokenizerJson, ALiteralSplitPatternCutsAtTheString) {
  json j = tiny_tokenizer(false);
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"String", "b"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  const auto tok = from(j);
  // "abc" is cut into "a", "b", "c": no merge applies across the cuts.
  EXPECT_EQ(tok.encode("abc"), ids_of_tokens(tok, {"a", "b", "c"}));
}

TEST(HfTokenizerJson, TemplateProcessingInASequencePutsItsTokensAroundTheText) {
  json j = tiny_tokenizer(false);
  const uint32_t x = 259;
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "<X>"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
           {{"SpecialToken", {{"id", "<X>"}, {"type_id", 0}}}}}},
         {"pair", json::array()},
         {"special_tokens", {{"<X>", {{"id", "<X>"}, {"ids", {x}}, {"tokens", {"<X>"}}}}}}}}}};
  const auto tok = from(j);
  const auto a = *tok.token_to_id("a");
  EXPECT_EQ(tok.encode_with_special_tokens("a"), (std::vector<uint32_t>{x, a, x}));
  EXPECT_EQ(tok.encode("a"), std::vector<uint32_t>{a});
  EXPECT_EQ(tok.special_tokens().bos, x);
}

// The error a modified tokenizer.json gives.
template <typename E>
std::string error_of(const std::function<void(json&)>& modify) {
  json j = tiny_tokenizer(false);
  modify(j);
  try {
    from(j);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no error";
}

TEST(HfTokenizerJson, UnsupportedPartsAreConfigErrorsNamingThem) {
  EXPECT_EQ(error_of<ConfigError>([](json& j) {
              j["pre_tokenizer"] = {{"type", "Metaspace"}};
            }),
            "test/tokenizer.json: pre_tokenizer type 'Metaspace' is not supported "
            "(supported: ByteLevel, Split+ByteLevel)");
  EXPECT_EQ(error_of<ConfigError>([](json& j) { j["model"]["type"] = "WordPiece"; }),
            "test/tokenizer.json: model type 'WordPiece' is not supported (supported: BPE, with a "
            "ByteLevel pre-tokenizer; for a SentencePiece model use tokenizer.model)");
  EXPECT_EQ(error_of<ConfigError>([](json& j) {
              j["normalizer"] = {{"type", "NFC"}};
            }),
            "test/tokenizer.json: normalizer type 'NFC' is not supported (supported: none)");
  EXPECT_EQ(error_of<ConfigError>([](json& j) { j["decoder"] = nullptr; }),
            "test/tokenizer.json: decoder null is not supported (supported: ByteLevel)");
  EXPECT_EQ(
      error_of<ConfigError>([](json& j) {
        j["post_processor"] = {{"type", "BertProcessing"}};
      }),
      "test/tokenizer.json: post_processor type 'BertProcessing' is not supported (supported: "
      "ByteLevel, TemplateProcessing, a Sequence of them)");
  EXPECT_EQ(error_of<ConfigError>([](json& j) { j["added_tokens"][0]["lstrip"] = true; }),
            "test/tokenizer.json: added token '<X>' has lstrip true, which is not supported "
            "(supported: false)");
  EXPECT_EQ(error_of<ConfigError>([](json& j) { j["model"]["dropout"] = 0.1; }),
            "test/tokenizer.json: model.dropout 0.1 is not supported (BPE dropout makes encoding "
            "random; supported: null)");
  EXPECT_EQ(error_of<ConfigError>([](json& j) {
              j["pre_tokenizer"] = {{"type", "Sequence"},
                                    {"pretokenizers",
                                     {{{"type", "Split"},
                                       {"pattern", {{"Regex", "\\s+"}}},
                                       {"behavior", "Removed"},
                                       {"invert", false}},
                                      {{"type", "ByteLevel"}, {"use_regex", false}}}}};
            }),
            "test/tokenizer.json: pre_tokenizer Split behavior 'Removed' is not supported "
            "(supported: Isolated)");
  EXPECT_EQ(error_of<ConfigError>([](json& j) {
              j["pre_tokenizer"] = {{"type", "Sequence"},
                                    {"pretokenizers",
                                     {{{"type", "ByteLevel"}, {"use_regex", false}},
                                      {{"type", "Digits"}, {"individual_digits", true}}}}};
            }),
            "test/tokenizer.json: pre_tokenizer Sequence step 0 of type 'ByteLevel' is not "
            "supported (supported: ByteLevel, Split+ByteLevel): Split steps, then ByteLevel last");
  const std::string bad_regex = error_of<ConfigError>([](json& j) {
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"},
                             {"pattern", {{"Regex", "(\\p{L}+"}}},
                             {"behavior", "Isolated"},
                             {"invert", false}},
                            {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  });
  EXPECT_EQ(bad_regex.find("test/tokenizer.json: pre_tokenizer Split 0: the pattern '(\\p{L}+' "
                           "does not compile at offset"),
            0u)
      << bad_regex;
}

TEST(HfTokenizerJson, MalformedFilesAreIoErrorsNamingTheProblem) {
  const std::string text = tiny_tokenizer(false).dump();
  try {
    HfBpeTokenizer::from_json(text.substr(0, text.size() / 2), "cut/tokenizer.json");
    FAIL() << "a truncated file loaded";
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()).find("cut/tokenizer.json: not valid JSON ("), 0u) << e.what();
  }
  EXPECT_EQ(error_of<IoError>([](json& j) { j["model"]["merges"].push_back("ab zz"); }),
            "test/tokenizer.json: merge 3 ('ab', 'zz') names 'zz', which is not in the vocabulary");
  EXPECT_EQ(error_of<IoError>([](json& j) { j["model"]["merges"].push_back("bc c"); }),
            "test/tokenizer.json: merge 3 ('bc', 'c') makes 'bcc', which is not in the vocabulary");
  EXPECT_EQ(error_of<IoError>([](json& j) { j["model"]["merges"].push_back("a b c"); }),
            "test/tokenizer.json: merge 3 is \"a b c\", not two tokens separated by one space");
  EXPECT_EQ(error_of<IoError>([](json& j) { j["model"]["merges"].push_back(json::array({"a"})); }),
            "test/tokenizer.json: merge 3 is [\"a\"], not \"a b\" or [\"a\", \"b\"]");
  EXPECT_EQ(error_of<IoError>([](json& j) { j["model"]["vocab"].erase("Ā"); }),
            "test/tokenizer.json: the vocabulary has no token for the byte 0x00 (written 'Ā') and "
            "there is no unk_token; a byte-level BPE needs all 256 bytes");
  EXPECT_EQ(error_of<IoError>([](json& j) { j["model"]["vocab"]["abc"] = -3; }),
            "test/tokenizer.json: model.vocab[\"abc\"] is -3, not a token id (0 to 16777215)");
  EXPECT_EQ(error_of<IoError>([](json& j) { j["model"]["vocab"]["zz"] = 3; }),
            "test/tokenizer.json: the vocabulary gives the id 3 to both 'zz' and 'ă'");
  EXPECT_EQ(error_of<IoError>([](json& j) { j["added_tokens"][0]["id"] = 300; }),
            "test/tokenizer.json: the added token '<X>' has the id 300, but Hugging Face's "
            "tokenizers would give it 259 (the vocabulary's id of the same token, else the next "
            "id after the vocabulary and the added tokens before it)");
  EXPECT_EQ(error_of<IoError>([](json& j) { j.erase("model"); }),
            "test/tokenizer.json: the file has no \"model\"");
  EXPECT_EQ(error_of<IoError>([](json& j) { j["added_tokens"][0].erase("content"); }),
            "test/tokenizer.json: added_tokens[0] has no \"content\"");
  EXPECT_EQ(error_of<IoError>([](json& j) { j["model"]["merges"] = 5; }),
            "test/tokenizer.json: model.merges is missing or not an array");
  EXPECT_EQ(error_of<IoError>([](json& j) { j = json::array(); }),
            "test/tokenizer.json: the top level is not a JSON object");
}

TEST(HfTokenizerJson, AnUnkTokenStandsForBytesWithoutATokenAsInHuggingFace) {
  json j = tiny_tokenizer(false);
  j["model"]["vocab"].erase("Ā");  // byte 0x00
  j["model"]["vocab"]["<unk>"] = 300;
  j["model"]["unk_token"] = "<unk>";
  const auto tok = from(j);
  EXPECT_EQ(tok.encode(std::string("a\0\0", 3)),
            (std::vector<uint32_t>{*tok.token_to_id("a"), 300, 300}));
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(from(j).encode(std::string("a\0\0", 3)),
            (std::vector<uint32_t>{*tok.token_to_id("a"), 300}));
}

}  // namespace
}  // namespace tessera::data
