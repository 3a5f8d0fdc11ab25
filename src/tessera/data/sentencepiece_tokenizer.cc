#include "tessera/data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <fstream>
#include <sstream>

#include "tessera/core/error.h"

namespace tessera::data {

SentencePieceTokenizer::SentencePieceTokenizer(
    std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp, std::string source)
    : sp_(std::move(sp)), source_(std::move(source)) {
  vocab_size_ = sp_->GetPieceSize();
  if (sp_->bos_id() >= 0) special_.bos = static_cast<uint32_t>(sp_->bos_id());
  if (sp_->eos_id() >= 0) special_.eos = static_cast<uint32_t>(sp_->eos_id());
}

SentencePieceTokenizer SentencePieceTokenizer::from_serialized(std::string_view model_bytes,
                                                               const std::string& source) {
  auto sp = std::make_shared<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->LoadFromSerializedProto(model_bytes);
  TESSERA_CHECK_AS(IoError, status.ok(), source, ": not a SentencePiece model (", status.ToString(),
                   ")");
  TESSERA_CHECK_AS(IoError, sp->GetPieceSize() > 0, source,
                   ": not a SentencePiece model (no pieces)");
  return SentencePieceTokenizer(std::move(sp), source);
}

SentencePieceTokenizer SentencePieceTokenizer::load(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK_AS(IoError, f.is_open(), "could not open the tokenizer file ", path.string(),
                   "; it does not exist or is not readable");
  std::ostringstream ss;
  ss << f.rdbuf();
  return from_serialized(ss.str(), path.string());
}

std::vector<uint32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  TESSERA_CHECK(status.ok(), source_, ": SentencePiece could not encode a text of ", text.size(),
                " bytes (", status.ToString(), ")");
  return std::vector<uint32_t>(ids.begin(), ids.end());
}

std::vector<uint32_t> SentencePieceTokenizer::encode_with_special_tokens(
    std::string_view text) const {
  std::vector<uint32_t> ids;
  if (special_.bos) ids.push_back(*special_.bos);
  const std::vector<uint32_t> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

void SentencePieceTokenizer::check_ids(std::span<const uint32_t> ids) const {
  for (uint32_t id : ids) {
    TESSERA_CHECK_AS(ConfigError, id < static_cast<uint32_t>(vocab_size_), "token id ", id,
                     " is not in the vocabulary of ", source_, " (", vocab_size_, " ids)");
  }
}

std::string SentencePieceTokenizer::decode(std::span<const uint32_t> ids) const {
  check_ids(ids);
  const std::vector<int> as_int(ids.begin(), ids.end());
  std::string text;
  const auto status = sp_->Decode(as_int, &text);
  TESSERA_CHECK(status.ok(), source_, ": SentencePiece could not decode ", ids.size(), " ids (",
                status.ToString(), ")");
  return text;
}

std::string SentencePieceTokenizer::id_to_piece(uint32_t id) const {
  const uint32_t one[] = {id};
  check_ids(one);
  return sp_->IdToPiece(static_cast<int>(id));
}

}  // namespace tessera::data
