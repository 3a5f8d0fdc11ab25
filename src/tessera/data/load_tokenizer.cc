#include "tessera/data/load_tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tessera/core/error.h"
#include "tessera/data/bpe_tokenizer_adapter.h"
#include "tessera/data/hf_bpe_tokenizer.h"
#include "tessera/data/sentencepiece_tokenizer.h"
#include "tessera/io/json_parse.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

std::string read_tokenizer_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK_AS(IoError, f.is_open(), "could not open the tokenizer file ", path.string(),
                   "; it does not exist or is not readable");
  std::ostringstream ss;
  ss << f.rdbuf();
  TESSERA_CHECK_AS(IoError, !f.bad(), "could not read the tokenizer file ", path.string());
  return ss.str();
}

bool looks_like_json(std::string_view bytes) {
  const std::size_t first = bytes.find_first_not_of(" \t\r\n");
  return first != std::string_view::npos && bytes[first] == '{';
}

enum class JsonKind { kTessera, kHfByteLevel, kHfOther, kUnreadable };

// What a JSON tokenizer file is: tessera's format, or a Hugging Face tokenizer.json that works on
// byte-level text (its pre-tokenizer or decoder is ByteLevel) or not. kUnreadable: not a JSON
// object (the Hugging Face reader then says what is wrong).
JsonKind classify_json(std::string_view text) {
  try {
    const nlohmann::json j = io::parse_json(text);
    if (!j.is_object()) return JsonKind::kUnreadable;
    if (j.contains("format") && j["format"] == "tessera-bpe") return JsonKind::kTessera;
    for (const char* key : {"pre_tokenizer", "decoder"}) {
      if (j.contains(key) && j[key].dump().find("\"ByteLevel\"") != std::string::npos)
        return JsonKind::kHfByteLevel;
    }
    return JsonKind::kHfOther;
  } catch (const nlohmann::json::exception&) {
    return JsonKind::kUnreadable;
  }
}

// A token named by tokenizer_config.json: "<s>" or {"content": "<s>", ...}; null: none.
std::optional<uint32_t> config_token(const nlohmann::json& value, const char* key,
                                     const HfBpeTokenizer& tok, const fs::path& config) {
  if (value.is_null()) return std::nullopt;
  const nlohmann::json& content =
      value.is_object() && value.contains("content") ? value["content"] : value;
  TESSERA_CHECK_AS(IoError, content.is_string(), config.string(), ": ", key, " is ", value.dump(),
                   ", not a token");
  const auto id = tok.token_to_id(content.get<std::string>());
  TESSERA_CHECK_AS(IoError, id.has_value(), config.string(), ": ", key, " '",
                   content.get<std::string>(), "' is not a token of the tokenizer.json beside it");
  return id;
}

// BOS and EOS from the tokenizer_config.json beside a tokenizer.json, when there is one.
void apply_tokenizer_config(HfBpeTokenizer& tok, const fs::path& json_path) {
  const fs::path config = json_path.parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (!fs::is_regular_file(config, ec)) return;
  nlohmann::json j;
  try {
    j = io::parse_json(read_tokenizer_file(config));
  } catch (const nlohmann::json::exception& e) {
    throw IoError(detail::concat(config.string(), ": not valid JSON (", e.what(), ")"));
  }
  if (!j.is_object()) return;
  SpecialTokenIds ids = tok.special_tokens();
  if (j.contains("bos_token")) ids.bos = config_token(j["bos_token"], "bos_token", tok, config);
  if (j.contains("eos_token")) ids.eos = config_token(j["eos_token"], "eos_token", tok, config);
  tok.set_special_tokens(ids);
}

std::unique_ptr<Tokenizer> load_json(const fs::path& path, const std::string& text) {
  if (classify_json(text) == JsonKind::kTessera)
    return std::make_unique<BpeTokenizerAdapter>(BpeTokenizer::from_json(text, path.string()));
  auto tok = std::make_unique<HfBpeTokenizer>(HfBpeTokenizer::from_json(text, path.string()));
  apply_tokenizer_config(*tok, path);
  return tok;
}

std::unique_ptr<Tokenizer> load_file(const fs::path& path) {
  const std::string bytes = read_tokenizer_file(path);
  if (looks_like_json(bytes)) return load_json(path, bytes);
  return std::make_unique<SentencePieceTokenizer>(
      SentencePieceTokenizer::from_serialized(bytes, path.string()));
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return load_file(path);
  const fs::path json = path / "tokenizer.json", model = path / "tokenizer.model";
  const bool has_json = fs::is_regular_file(json, ec), has_model = fs::is_regular_file(model, ec);
  if (has_json) {
    const std::string text = read_tokenizer_file(json);
    // Llama 2's and Mistral's tokenizer.json is a conversion of the tokenizer.model beside it.
    if (has_model && looks_like_json(text) && classify_json(text) == JsonKind::kHfOther)
      return load_file(model);
    return looks_like_json(text) ? load_json(json, text) : load_file(json);
  }
  TESSERA_CHECK_AS(IoError, has_model, "the directory ", path.string(),
                   " holds no tokenizer: neither tokenizer.json nor tokenizer.model");
  return load_file(model);
}

}  // namespace tessera::data
