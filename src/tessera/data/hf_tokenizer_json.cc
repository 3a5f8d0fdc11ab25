#include "tessera/data/hf_tokenizer_json.h"

#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/io/json_parse.h"

namespace tessera::data {
namespace {

using nlohmann::json;

// Messages: `source: what`. A malformed file is an IoError, an unsupported one a ConfigError.
class HfJsonReader {
 public:
  explicit HfJsonReader(const std::string& source) : source_(source) {}

  [[noreturn]] void malformed(const std::string& what) const {
    throw IoError(detail::concat(source_, ": ", what));
  }
  [[noreturn]] void unsupported(const std::string& what) const {
    throw ConfigError(detail::concat(source_, ": ", what));
  }

  const json& object_field(const json& j, const char* key, const std::string& where) const {
    if (!j.contains(key)) malformed(detail::concat(where, " has no \"", key, "\""));
    const json& v = j[key];
    if (!v.is_object()) malformed(detail::concat(where, ".", key, " is not an object"));
    return v;
  }
  std::string string_field(const json& j, const char* key, const std::string& where) const {
    if (!j.contains(key)) malformed(detail::concat(where, " has no \"", key, "\""));
    const json& v = j[key];
    if (!v.is_string())
      malformed(detail::concat(where, ".", key, " is ", v.dump(), ", not a string"));
    return v.get<std::string>();
  }
  bool bool_field(const json& j, const char* key, bool fallback, const std::string& where) const {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean())
      malformed(detail::concat(where, ".", key, " is ", j[key].dump(), ", not true or false"));
    return j[key].get<bool>();
  }
  uint32_t id_value(const json& v, const std::string& where) const {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > ByteLevelBpeModel::kMaxId)
      malformed(detail::concat(where, " is ", v.dump(), ", not a token id (0 to ",
                               ByteLevelBpeModel::kMaxId, ")"));
    return static_cast<uint32_t>(v.get<uint64_t>());
  }
  // The "type" of a pipeline step; `where` names the step for messages.
  std::string type_of(const json& step, const std::string& where) const {
    if (!step.is_object()) malformed(detail::concat(where, " is ", step.dump(), ", not an object"));
    return string_field(step, "type", where);
  }

 private:
  const std::string& source_;
};

void read_model(const HfJsonReader& r, const json& root, HfTokenizerJson& out) {
  const json& model = r.object_field(root, "model", "the file");
  // Files of old versions leave out the type of a BPE model.
  const std::string type = model.contains("type")     ? r.string_field(model, "type", "model")
                           : model.contains("merges") ? "BPE"
                                                      : "(none)";
  if (type != "BPE")
    r.unsupported(detail::concat("model type '", type,
                                 "' is not supported (supported: BPE, with a ByteLevel "
                                 "pre-tokenizer; for a SentencePiece model use tokenizer.model)"));
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    r.unsupported(detail::concat("model.dropout ", model["dropout"].dump(),
                                 " is not supported (BPE dropout makes encoding random; "
                                 "supported: null)"));
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() &&
        !(model[key].is_string() && model[key].get<std::string>().empty()))
      r.unsupported(detail::concat("model.", key, " ", model[key].dump(),
                                   " is not supported with byte-level BPE (supported: null)"));
  }
  if (model.contains("unk_token") && !model["unk_token"].is_null())
    out.model_options.unk_token = r.string_field(model, "unk_token", "model");
  out.model_options.fuse_unk = r.bool_field(model, "fuse_unk", false, "model");
  out.model_options.ignore_merges = r.bool_field(model, "ignore_merges", false, "model");
  r.bool_field(model, "byte_fallback", false, "model");  // checked; a byte-level vocabulary
                                                         // has every byte, so it never applies

  const json& vocab = r.object_field(model, "vocab", "model");
  out.vocab.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items())
    out.vocab.emplace_back(token, r.id_value(id, detail::concat("model.vocab[\"", token, "\"]")));

  if (!model.contains("merges") || !model["merges"].is_array())
    r.malformed("model.merges is missing or not an array");
  const json& merges = model["merges"];
  out.merges.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {  // "a b" (GPT-2's and older files)
      const std::string s = m.get<std::string>();
      const std::size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        r.malformed(detail::concat("merge ", i, " is ", m.dump(),
                                   ", not two tokens separated by one space"));
      out.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());  // ["a", "b"]
    } else {
      r.malformed(detail::concat("merge ", i, " is ", m.dump(), ", not \"a b\" or [\"a\", \"b\"]"));
    }
  }
}

void read_added_tokens(const HfJsonReader& r, const json& root, HfTokenizerJson& out) {
  if (!root.contains("added_tokens") || root["added_tokens"].is_null()) return;
  const json& added = root["added_tokens"];
  if (!added.is_array()) r.malformed("added_tokens is not an array");
  for (std::size_t i = 0; i < added.size(); ++i) {
    const std::string where = detail::concat("added_tokens[", i, "]");
    const json& t = added[i];
    if (!t.is_object()) r.malformed(detail::concat(where, " is not an object"));
    AddedToken token;
    if (!t.contains("id")) r.malformed(detail::concat(where, " has no \"id\""));
    token.id = r.id_value(t["id"], where + ".id");
    token.content = r.string_field(t, "content", where);
    if (token.content.empty()) r.malformed(detail::concat(where, ".content is empty"));
    for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
      if (r.bool_field(t, flag, false, where))
        r.unsupported(detail::concat("added token '", token.content, "' has ", flag,
                                     " true, which is not supported (supported: false)"));
    }
    token.special = r.bool_field(t, "special", false, where);
    token.normalized = r.bool_field(t, "normalized", !token.special, where);
    out.added_tokens.push_back(std::move(token));
  }
}

void read_normalizer(const HfJsonReader& r, const json& root) {
  if (!root.contains("normalizer") || root["normalizer"].is_null()) return;
  const json& n = root["normalizer"];
  const std::string type = r.type_of(n, "normalizer");
  if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array() &&
      n["normalizers"].empty())
    return;
  r.unsupported(detail::concat("normalizer type '", type, "' is not supported (supported: none)"));
}

void read_byte_level(const HfJsonReader& r, const json& step, const std::string& where,
                     HfTokenizerJson& out) {
  // Hugging Face's defaults for fields a file leaves out.
  out.add_prefix_space = r.bool_field(step, "add_prefix_space", true, where);
  out.byte_level_use_regex = r.bool_field(step, "use_regex", true, where);
}

void read_split(const HfJsonReader& r, const json& step, const std::string& where,
                HfTokenizerJson& out) {
  const json& pattern = r.object_field(step, "pattern", where);
  HfTokenizerJson::Split split;
  if (pattern.contains("Regex") && pattern.size() == 1) {
    split.pattern = r.string_field(pattern, "Regex", where + ".pattern");
  } else if (pattern.contains("String") && pattern.size() == 1) {
    split.pattern = r.string_field(pattern, "String", where + ".pattern");
    split.literal = true;
  } else {
    r.malformed(detail::concat(where, ".pattern is ", pattern.dump(),
                               ", not {\"Regex\": ...} or {\"String\": ...}"));
  }
  const std::string behavior = r.string_field(step, "behavior", where);
  if (behavior != "Isolated")
    r.unsupported(detail::concat("pre_tokenizer Split behavior '", behavior,
                                 "' is not supported (supported: Isolated)"));
  if (r.bool_field(step, "invert", false, where))
    r.unsupported("pre_tokenizer Split with invert true is not supported (supported: false)");
  out.splits.push_back(std::move(split));
}

void read_pre_tokenizer(const HfJsonReader& r, const json& root, HfTokenizerJson& out) {
  constexpr std::string_view kSupported = "(supported: ByteLevel, Split+ByteLevel)";
  if (!root.contains("pre_tokenizer") || root["pre_tokenizer"].is_null())
    r.unsupported(detail::concat("pre_tokenizer null is not supported ", kSupported));
  const json& pre = root["pre_tokenizer"];
  const std::string type = r.type_of(pre, "pre_tokenizer");
  if (type == "ByteLevel") return read_byte_level(r, pre, "pre_tokenizer", out);
  if (type != "Sequence")
    r.unsupported(detail::concat("pre_tokenizer type '", type, "' is not supported ", kSupported));
  if (!pre.contains("pretokenizers") || !pre["pretokenizers"].is_array())
    r.malformed("pre_tokenizer.pretokenizers is missing or not an array");
  const json& steps = pre["pretokenizers"];
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const std::string where = detail::concat("pre_tokenizer.pretokenizers[", i, "]");
    const std::string step = r.type_of(steps[i], where);
    const bool last = i + 1 == steps.size();
    if (step == "Split" && !last) {
      read_split(r, steps[i], where, out);
    } else if (step == "ByteLevel" && last) {
      read_byte_level(r, steps[i], where, out);
    } else {
      r.unsupported(detail::concat("pre_tokenizer Sequence step ", i, " of type '", step,
                                   "' is not supported ", kSupported,
                                   ": Split steps, then ByteLevel last"));
    }
  }
  if (steps.empty() || r.type_of(steps.back(), "pre_tokenizer") != "ByteLevel")
    r.unsupported(detail::concat(
        "a pre_tokenizer Sequence without ByteLevel last is not supported ", kSupported));
}

void read_decoder(const HfJsonReader& r, const json& root) {
  const bool missing = !root.contains("decoder") || root["decoder"].is_null();
  const std::string type = missing ? "null" : r.type_of(root["decoder"], "decoder");
  if (type != "ByteLevel")
    r.unsupported(detail::concat("decoder ", missing ? "null" : "type '" + type + "'",
                                 " is not supported (supported: ByteLevel)"));
}

// One TemplateProcessing: its "single" template around whatever the earlier steps made.
void read_template(const HfJsonReader& r, const json& step, const std::string& where,
                   HfTokenizerJson& out) {
  if (!step.contains("single") || !step["single"].is_array())
    r.malformed(detail::concat(where, ".single is missing or not an array"));
  const json& specials = step.contains("special_tokens") ? step["special_tokens"] : json::object();
  if (!specials.is_object()) r.malformed(detail::concat(where, ".special_tokens is not an object"));
  std::vector<uint32_t> prefix, suffix;
  bool seen_text = false;
  for (const json& piece : step["single"]) {
    if (piece.is_object() && piece.contains("Sequence") && piece["Sequence"].is_object()) {
      const std::string id = r.string_field(piece["Sequence"], "id", where + ".single");
      if (id != "A" || seen_text)
        r.malformed(detail::concat(where, ".single names the sequence '", id,
                                   "'; a single-text template holds $A once"));
      seen_text = true;
    } else if (piece.is_object() && piece.contains("SpecialToken") &&
               piece["SpecialToken"].is_object()) {
      const std::string name = r.string_field(piece["SpecialToken"], "id", where + ".single");
      if (!specials.contains(name) || !specials[name].is_object() ||
          !specials[name].contains("ids") || !specials[name]["ids"].is_array())
        r.malformed(detail::concat(where, ".special_tokens has no ids for '", name, "'"));
      for (const json& id : specials[name]["ids"])
        (seen_text ? suffix : prefix).push_back(r.id_value(id, where + ".special_tokens"));
    } else {
      r.malformed(detail::concat(where, ".single holds ", piece.dump(),
                                 ", not a SpecialToken or a Sequence"));
    }
  }
  if (!seen_text) r.malformed(detail::concat(where, ".single does not hold the text ($A)"));
  prefix.insert(prefix.end(), out.template_prefix.begin(), out.template_prefix.end());
  out.template_prefix = std::move(prefix);
  out.template_suffix.insert(out.template_suffix.end(), suffix.begin(), suffix.end());
}

void read_post_processor(const HfJsonReader& r, const json& root, HfTokenizerJson& out) {
  if (!root.contains("post_processor") || root["post_processor"].is_null()) return;
  const json& post = root["post_processor"];
  const auto step = [&](const json& s, const std::string& where) {
    const std::string type = r.type_of(s, where);
    if (type == "ByteLevel") return;  // offsets only
    if (type == "TemplateProcessing") return read_template(r, s, where, out);
    r.unsupported(detail::concat("post_processor type '", type,
                                 "' is not supported (supported: ByteLevel, TemplateProcessing, "
                                 "a Sequence of them)"));
  };
  if (r.type_of(post, "post_processor") != "Sequence") return step(post, "post_processor");
  if (!post.contains("processors") || !post["processors"].is_array())
    r.malformed("post_processor.processors is missing or not an array");
  for (std::size_t i = 0; i < post["processors"].size(); ++i)
    step(post["processors"][i], detail::concat("post_processor.processors[", i, "]"));
}

}  // namespace

HfTokenizerJson parse_hf_tokenizer_json(std::string_view json_text, const std::string& source) {
  HfJsonReader r(source);
  json root;
  try {
    root = io::parse_json(json_text);
  } catch (const json::exception& e) {
    r.malformed(detail::concat("not valid JSON (", e.what(), ")"));
  }
  if (!root.is_object()) r.malformed("the top level is not a JSON object");
  HfTokenizerJson out;
  try {
    read_model(r, root, out);
    read_added_tokens(r, root, out);
    read_normalizer(r, root);
    read_pre_tokenizer(r, root, out);
    read_decoder(r, root);
    read_post_processor(r, root, out);
  } catch (const json::exception& e) {  // a type the checks above did not expect
    r.malformed(detail::concat("unexpected JSON content (", e.what(), ")"));
  }
  return out;
}

}  // namespace tessera::data
