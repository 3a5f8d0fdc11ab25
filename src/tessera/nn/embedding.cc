#include "tessera/nn/embedding.h"

#include <cstring>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/kernels/dropout.h"
#include "tessera/kernels/embedding.h"
#include "tessera/nn/context_parallel.h"

namespace tessera::nn {

namespace k = tessera::kernels;

namespace {
// OpenAI's released GPT-2 code initialises wpe with std 0.01 (Hugging Face and nanoGPT use 0.02).
constexpr float kWpeStd = 0.01f;
}  // namespace

Embedding::Embedding(ParameterSet& ps, const GPTConfig& cfg, TensorSplit split,
                     int64_t rows_per_sequence)
    : ps_(ps),
      cfg_(cfg),
      split_(split),
      rows_(vocab_range(split, cfg.vocab_size)),
      rows_per_sequence_(rows_per_sequence > 0 ? rows_per_sequence : cfg.block_size),
      site_(stable_hash("drop")) {
  const int64_t C = cfg.n_embd, V = cfg.vocab_size;
  if (cfg.llama()) {  // no learned positions (rotary embeddings, in the attention)
    wte_ = ps.add("model.embed_tokens.weight", {V, C}, Init::Normal, kInitStd, true,
                  vocab_shard(split, V));
    return;
  }
  wte_ = ps.add("wte.weight", {V, C}, Init::Normal, kInitStd, true, vocab_shard(split, V));
  wpe_ = ps.add("wpe.weight", {cfg.block_size, C}, Init::Normal, kWpeStd, true);
}

Embedding::Record Embedding::make_record(int max_batch, Allocator& alloc) const {
  const int64_t BT = max_batch * rows_per_sequence_;
  Record r;
  r.tokens = Tensor::zeros({BT}, DType::I32, MemCategory::Activations, "tokens", &alloc);
  if (cfg_.dropout > 0.0f && !cfg_.llama())
    r.mask = Tensor::zeros({token_range(split_, BT).per * cfg_.n_embd}, DType::U8,
                           MemCategory::Activations, "drop.mask", &alloc);
  return r;
}

void Embedding::forward(const StepContext& ctx, const Batch& b, float* out, Record& r,
                        float* scratch) const {
  const int B = b.B, T = b.T, C = cfg_.n_embd;
  const int64_t n = static_cast<int64_t>(B) * T;
  const TokenRange rows = token_range(split_, n);
  const kernels::RowMap map = row_map(b);
  r.B = B;
  r.T = T;
  r.p = ctx.training && !cfg_.llama() ? cfg_.dropout : 0.0f;
  if (b.positions)
    r.positions.assign(b.positions, b.positions + T);
  else
    r.positions.clear();
  const int64_t* pos = b.positions;
  std::memcpy(r.tokens.data<int32_t>(), b.tokens, sizeof(int32_t) * B * T);
  const float* wte = ps_.param_data(wte_);
  const float* wpe = wpe_ >= 0 ? ps_.param_data(wpe_) : nullptr;
  if (split_.size() == 1) {
    if (wpe)
      k::embedding_forward(out, b.tokens, wte, wpe, B, T, C, pos);
    else
      k::embedding_lookup_rows(out, b.tokens, wte, 0, rows_.size(), n, C);
  } else if (!split_.sequence_parallel()) {
    k::embedding_lookup_rows(out, b.tokens, wte, rows_.begin, rows_.size(), n, C);
    // Each element is one rank's row value plus zeros: exact in fp32; a bf16 wire rounds the value.
    reduce_from_tp(split_, out, n * C);
    if (wpe) k::add_positions(out, wpe, B, T, C, pos);
  } else {
    TESSERA_ASSERT(scratch != nullptr, "the sequence-parallel embedding needs its scratch");
    k::embedding_lookup_rows(scratch, b.tokens, wte, rows_.begin, rows_.size(), n, C);
    reduce_scatter_from_tp(split_, scratch, out, rows, C);  // as above; this rank's rows
    if (wpe) k::add_positions_rows(out, wpe, map, rows.begin, rows.size(), C);
  }
  if (r.p > 0.0f)
    k::dropout_forward_rows(out, r.mask.data<uint8_t>(), out, rows.size(), C, r.p, ctx.seed,
                            mix_stream(ctx.step, site_), map, rows.begin);
}

void Embedding::backward(Record& r, float* dout, float* scratch) const {
  const int64_t n = static_cast<int64_t>(r.B) * r.T;
  const TokenRange rows = token_range(split_, n);
  const int64_t* pos = r.positions.empty() ? nullptr : r.positions.data();
  if (r.p > 0.0f)
    k::dropout_backward(dout, dout, r.mask.data<uint8_t>(), rows.size() * cfg_.n_embd, r.p);
  float* dwpe = wpe_ >= 0 ? ps_.grad_data(wpe_) : nullptr;
  if (split_.size() == 1) {
    k::embedding_backward(ps_.grad_data(wte_), dwpe, dout, r.tokens.data<int32_t>(), r.B, r.T,
                          cfg_.n_embd, pos);
    return;
  }
  // The gradient of every token on every rank of the group: each keeps its rows' share of wte.
  const float* d = dout;
  if (split_.sequence_parallel()) {
    TESSERA_ASSERT(scratch != nullptr, "the sequence-parallel embedding needs its scratch");
    d = reduce_scatter_from_tp_backward(split_, dout, scratch, rows, cfg_.n_embd);
  }
  k::embedding_rows_backward(ps_.grad_data(wte_), dwpe, d, r.tokens.data<int32_t>(), rows_.begin,
                             rows_.size(), r.B, r.T, cfg_.n_embd, pos);
}

void Embedding::decode(const int32_t* tokens, int n, int64_t pos0, float* out) const {
  TESSERA_ASSERT(split_.size() == 1, "the embedding's decode without tensor parallelism only");
  const int C = cfg_.n_embd;
  k::embedding_lookup_rows(out, tokens, ps_.param_data(wte_), 0, cfg_.vocab_size, n, C);
  if (wpe_ >= 0)  // rows pos0 + i of a sequence of block_size positions
    k::add_positions_rows(out, ps_.param_data(wpe_), pos0, n, cfg_.block_size, C);
}

}  // namespace tessera::nn
