#include "tessera/data/hf_bpe_tokenizer.h"

#include <deque>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "tessera/core/error.h"

namespace tessera::data {

// One encode call: the output, a cache of the pieces seen (where their ids first appeared in the
// output) and the strings made for add_prefix_space, which the cache's keys may point into.
struct HfBpeTokenizer::EncodeState {
  std::vector<uint32_t>& out;
  std::unordered_map<std::string_view, std::pair<std::size_t, std::size_t>> cache;
  std::deque<std::string> prefixed;
};

HfBpeTokenizer::HfBpeTokenizer(const HfTokenizerJson& spec, const std::string& source)
    : source_(source),
      model_(spec.vocab, spec.merges, spec.model_options, source),
      add_prefix_space_(spec.add_prefix_space),
      template_prefix_(spec.template_prefix),
      template_suffix_(spec.template_suffix) {
  // Hugging Face gives each added token the vocabulary's id of its content, else the id after the
  // vocabulary (entries counted) and after the added tokens before it, whatever the file says
  // (it only warns). A file whose ids differ from that is refused rather than guessed at.
  const auto count = static_cast<uint32_t>(spec.vocab.size());
  std::optional<uint32_t> max_added;
  for (const AddedToken& t : spec.added_tokens) {
    std::optional<uint32_t> expected = model_.token_to_id(t.content);
    if (!expected) expected = !max_added ? count : (*max_added >= count ? *max_added + 1 : count);
    TESSERA_CHECK_AS(IoError, t.id == *expected, source, ": the added token '", t.content,
                     "' has the id ", t.id, ", but Hugging Face's tokenizers would give it ",
                     *expected,
                     " (the vocabulary's id of the same token, else the next id after "
                     "the vocabulary and the added tokens before it)");
    max_added = std::max(max_added.value_or(0), t.id);
  }
  try {
    added_ = AddedTokenMatcher(spec.added_tokens);
  } catch (const ConfigError& e) {
    throw IoError(detail::concat(source, ": ", e.what()));
  }
  for (std::size_t i = 0; i < spec.splits.size(); ++i)
    splits_.emplace_back(spec.splits[i].pattern, spec.splits[i].literal,
                         detail::concat(source, ": pre_tokenizer Split ", i));
  if (spec.byte_level_use_regex)
    byte_level_regex_.emplace(kGpt2Pattern, false, source + ": ByteLevel");

  vocab_size_ = model_.id_limit();
  for (const AddedToken& t : added_.tokens()) vocab_size_ = std::max(vocab_size_, t.id + 1);
  for (const auto* ids : {&template_prefix_, &template_suffix_}) {
    for (uint32_t id : *ids) {
      TESSERA_CHECK_AS(IoError, added_.find(id) || model_.token_bytes(id), source,
                       ": the post_processor's template uses the id ", id,
                       ", which is neither an added token nor in the vocabulary");
    }
  }
  if (!template_prefix_.empty()) special_.bos = template_prefix_.front();
  for (std::string_view name : {"<|end_of_text|>", "<|endoftext|>", "</s>"}) {
    const AddedToken* t = added_.find(name);
    if (t && t->special) {
      special_.eos = t->id;
      break;
    }
  }
}

HfBpeTokenizer HfBpeTokenizer::from_json(std::string_view json_text, const std::string& source) {
  return HfBpeTokenizer(parse_hf_tokenizer_json(json_text, source), source);
}

HfBpeTokenizer HfBpeTokenizer::load(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK_AS(IoError, f.is_open(), "could not open the tokenizer file ", path.string(),
                   "; it does not exist or is not readable");
  std::ostringstream ss;
  ss << f.rdbuf();
  return from_json(ss.str(), path.string());
}

void HfBpeTokenizer::encode_piece_cached(std::string_view piece, EncodeState& state) const {
  auto it = state.cache.find(piece);
  if (it != state.cache.end()) {
    const auto [pos, len] = it->second;
    for (std::size_t i = 0; i < len; ++i) state.out.push_back(state.out[pos + i]);
    return;
  }
  const std::size_t pos = state.out.size();
  model_.encode_piece(piece, state.out);
  state.cache.emplace(piece, std::pair{pos, state.out.size() - pos});
}

// Stage i < splits_.size() is the i-th Split; the last stage is ByteLevel.
void HfBpeTokenizer::pre_tokenize(std::string_view piece, std::size_t stage,
                                  EncodeState& state) const {
  if (stage < splits_.size()) {
    splits_[stage].split(piece, [&](std::string_view p) { pre_tokenize(p, stage + 1, state); });
    return;
  }
  if (add_prefix_space_ && !piece.starts_with(' ')) {
    std::string& prefixed = state.prefixed.emplace_back();
    prefixed.reserve(piece.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(piece);
    piece = prefixed;
  }
  if (byte_level_regex_) {
    byte_level_regex_->split(piece, [&](std::string_view p) { encode_piece_cached(p, state); });
  } else {
    encode_piece_cached(piece, state);
  }
}

std::vector<uint32_t> HfBpeTokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 16);
  EncodeState state{out, {}, {}};
  added_.split(text, [&](std::string_view segment, std::optional<uint32_t> id) {
    if (id) {
      out.push_back(*id);
    } else {
      pre_tokenize(segment, 0, state);
    }
  });
  return out;
}

std::vector<uint32_t> HfBpeTokenizer::encode_with_special_tokens(std::string_view text) const {
  std::vector<uint32_t> ids = encode(text);
  ids.insert(ids.begin(), template_prefix_.begin(), template_prefix_.end());
  ids.insert(ids.end(), template_suffix_.begin(), template_suffix_.end());
  return ids;
}

std::string HfBpeTokenizer::decode(std::span<const uint32_t> ids) const {
  std::string out;
  out.reserve(ids.size() * 4);
  for (uint32_t id : ids) {
    if (const AddedToken* t = added_.find(id)) {
      out += t->content;
    } else if (auto bytes = model_.token_bytes(id)) {
      out += *bytes;
    } else {
      throw ConfigError(detail::concat("token id ", id, " is not in the vocabulary of ", source_,
                                       " (", vocab_size_, " ids)"));
    }
  }
  return out;
}

std::optional<uint32_t> HfBpeTokenizer::token_to_id(std::string_view token) const {
  if (const AddedToken* t = added_.find(token)) return t->id;
  return model_.token_to_id(token);
}

}  // namespace tessera::data
