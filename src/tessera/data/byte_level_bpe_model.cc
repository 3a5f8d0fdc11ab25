#include "tessera/data/byte_level_bpe_model.h"

#include <queue>

#include "tessera/core/error.h"
#include "tessera/data/byte_level.h"

namespace tessera::data {
namespace {

// A queued merge: Hugging Face's order (lowest rank first, then leftmost position).
struct QueuedMerge {
  uint32_t rank;
  uint32_t pos;
  uint32_t new_id;
  bool operator<(const QueuedMerge& o) const {  // std::priority_queue pops the largest
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

struct Symbol {
  uint32_t id;
  int32_t prev;
  int32_t next;
  bool alive;
};

std::string printable_byte(int b) {
  return detail::concat("0x", "0123456789abcdef"[b >> 4], "0123456789abcdef"[b & 15]);
}

}  // namespace

ByteLevelBpeModel::ByteLevelBpeModel(const std::vector<std::pair<std::string, uint32_t>>& vocab,
                                     const std::vector<std::pair<std::string, std::string>>& merges,
                                     const Options& options, const std::string& source)
    : ignore_merges_(options.ignore_merges), fuse_unk_(options.fuse_unk) {
  id_bytes_.reserve(vocab.size());
  std::unordered_map<uint32_t, const std::string*> id_text;
  by_text_.reserve(vocab.size());
  by_bytes_.reserve(vocab.size());
  byte_id_.fill(-1);
  for (const auto& [text, id] : vocab) {
    TESSERA_CHECK_AS(IoError, id <= kMaxId, source, ": the token '", text, "' has the id ", id,
                     "; ids above ", kMaxId, " are not supported");
    const auto [seen, inserted] = id_text.emplace(id, &text);
    TESSERA_CHECK_AS(IoError, inserted, source, ": the vocabulary gives the id ", id, " to both '",
                     *seen->second, "' and '", text, "'");
    id_limit_ = std::max(id_limit_, id + 1);
    by_text_.emplace(text, id);
    // A token with a character outside the byte-level alphabet is never produced from bytes
    // (Hugging Face's decoder then gives its text as it is written).
    if (auto bytes = byte_level::to_bytes(text)) {
      if (bytes->size() == 1) byte_id_[static_cast<unsigned char>((*bytes)[0])] = id;
      by_bytes_.emplace(*bytes, id);
      id_bytes_.emplace(id, std::move(*bytes));
    } else {
      id_bytes_.emplace(id, text);
    }
  }
  if (options.unk_token) {
    auto it = by_text_.find(*options.unk_token);
    TESSERA_CHECK_AS(IoError, it != by_text_.end(), source, ": the unk_token '", *options.unk_token,
                     "' is not in the vocabulary");
    unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    TESSERA_CHECK_AS(IoError, byte_id_[static_cast<std::size_t>(b)] >= 0 || unk_id_, source,
                     ": the vocabulary has no token for the byte ", printable_byte(b),
                     " (written '", byte_level::from_bytes(std::string(1, static_cast<char>(b))),
                     "') and there is no unk_token; a byte-level BPE needs all 256 bytes");
  }
  merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& a = merges[rank].first;  // (clang 14 cannot capture structured bindings)
    const std::string& b = merges[rank].second;
    const auto id_of = [&](const std::string& token) {
      auto it = by_text_.find(token);
      TESSERA_CHECK_AS(IoError, it != by_text_.end(), source, ": merge ", rank, " ('", a, "', '", b,
                       "') names '", token, "', which is not in the vocabulary");
      return it->second;
    };
    const uint32_t left = id_of(a), right = id_of(b);
    auto it = by_text_.find(a + b);
    TESSERA_CHECK_AS(IoError, it != by_text_.end(), source, ": merge ", rank, " ('", a, "', '", b,
                     "') makes '", a + b, "', which is not in the vocabulary");
    // A repeated pair keeps its last rank, as Hugging Face's map does.
    merges_[pair_key(left, right)] = {static_cast<uint32_t>(rank), it->second};
  }
}

void ByteLevelBpeModel::encode_piece(std::string_view piece, std::vector<uint32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    auto it = by_bytes_.find(std::string(piece));
    if (it != by_bytes_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<Symbol> sym;
  sym.reserve(piece.size());
  bool previous_unknown = false;
  for (char c : piece) {
    const int64_t id = byte_id_[static_cast<unsigned char>(c)];
    if (id < 0 && previous_unknown && fuse_unk_) continue;
    previous_unknown = id < 0;
    const uint32_t token = id >= 0 ? static_cast<uint32_t>(id) : *unk_id_;
    const auto i = static_cast<int32_t>(sym.size());
    sym.push_back({token, i - 1, i + 1, true});
  }
  sym.back().next = -1;
  const auto find = [&](uint32_t a, uint32_t b) -> const MergeTarget* {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  std::priority_queue<QueuedMerge> queue;
  for (std::size_t i = 0; i + 1 < sym.size(); ++i) {
    if (const MergeTarget* m = find(sym[i].id, sym[i + 1].id))
      queue.push({m->rank, static_cast<uint32_t>(i), m->id});
  }
  while (!queue.empty()) {
    const QueuedMerge top = queue.top();
    queue.pop();
    Symbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = sym[static_cast<std::size_t>(left.next)];
    // A stale entry: the pair at this position changed since it was queued.
    const MergeTarget* now = find(left.id, right.id);
    if (now == nullptr || now->id != top.new_id) continue;
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0)
      sym[static_cast<std::size_t>(right.next)].prev = static_cast<int32_t>(top.pos);
    if (left.prev >= 0) {
      const Symbol& p = sym[static_cast<std::size_t>(left.prev)];
      if (const MergeTarget* m = find(p.id, left.id))
        queue.push({m->rank, static_cast<uint32_t>(left.prev), m->id});
    }
    if (left.next >= 0) {
      const Symbol& n = sym[static_cast<std::size_t>(left.next)];
      if (const MergeTarget* m = find(left.id, n.id)) queue.push({m->rank, top.pos, m->id});
    }
  }
  for (const Symbol& s : sym)
    if (s.alive) out.push_back(s.id);
}

std::optional<std::string_view> ByteLevelBpeModel::token_bytes(uint32_t id) const {
  auto it = id_bytes_.find(id);
  if (it == id_bytes_.end()) return std::nullopt;
  return std::string_view(it->second);
}

std::optional<uint32_t> ByteLevelBpeModel::token_to_id(std::string_view token) const {
  auto it = by_text_.find(std::string(token));
  if (it == by_text_.end()) return std::nullopt;
  return it->second;
}

}  // namespace tessera::data
