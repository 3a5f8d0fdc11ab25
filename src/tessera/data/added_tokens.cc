#include "tessera/data/added_tokens.h"

#include <algorithm>

#include "tessera/core/error.h"

namespace tessera::data {

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (auto& pass : passes_) pass.by_first_byte.resize(256);
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    TESSERA_CHECK_AS(ConfigError, !t.content.empty(), "added token ", t.id, " has no content");
    const bool new_id = by_id_.emplace(t.id, i).second;
    TESSERA_CHECK_AS(ConfigError, new_id, "two added tokens have the id ", t.id);
    const bool new_content = by_content_.emplace(t.content, i).second;
    TESSERA_CHECK_AS(ConfigError, new_content, "two added tokens have the content '", t.content,
                     "'");
    Pass& pass = passes_[t.normalized ? 1 : 0];
    pass.by_first_byte[static_cast<unsigned char>(t.content[0])].push_back(
        static_cast<uint32_t>(i));
    pass.empty = false;
  }
  for (auto& pass : passes_) {
    for (auto& bucket : pass.by_first_byte) {
      std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
        return tokens_[a].content.size() > tokens_[b].content.size();
      });
    }
  }
}

std::pair<std::size_t, uint32_t> AddedTokenMatcher::next_match(const Pass& pass,
                                                               std::string_view text,
                                                               std::size_t from) const {
  for (std::size_t pos = from; pos < text.size(); ++pos) {
    for (uint32_t i : pass.by_first_byte[static_cast<unsigned char>(text[pos])]) {
      if (text.substr(pos).starts_with(tokens_[i].content)) return {pos, i};  // the longest
    }
  }
  return {std::string_view::npos, 0};
}

void AddedTokenMatcher::split_pass(
    std::size_t pass, std::string_view text,
    const std::function<void(std::string_view, std::optional<uint32_t>)>& fn) const {
  if (pass == 2 || passes_[pass].empty) {
    if (pass < 2) return split_pass(pass + 1, text, fn);
    if (!text.empty()) fn(text, std::nullopt);
    return;
  }
  std::size_t done = 0;
  for (;;) {
    const auto [start, index] = next_match(passes_[pass], text, done);
    if (start == std::string_view::npos) break;
    if (start > done) split_pass(pass + 1, text.substr(done, start - done), fn);
    fn(text.substr(start, tokens_[index].content.size()), tokens_[index].id);
    done = start + tokens_[index].content.size();
  }
  if (done < text.size()) split_pass(pass + 1, text.substr(done), fn);
}

void AddedTokenMatcher::split(
    std::string_view text,
    const std::function<void(std::string_view, std::optional<uint32_t>)>& fn) const {
  split_pass(0, text, fn);
}

const AddedToken* AddedTokenMatcher::find(uint32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedTokenMatcher::find(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

}  // namespace tessera::data
