#include "tessera/nn/embedding.h"

#include <cstring>

#include "tessera/core/philox.h"
#include "tessera/kernels/dropout.h"
#include "tessera/kernels/embedding.h"

namespace tessera::nn {

namespace k = tessera::kernels;

namespace {
constexpr float kInitStd = 0.02f;
// OpenAI's released GPT-2 code initialises wpe with std 0.01 (Hugging Face and nanoGPT use 0.02).
constexpr float kWpeStd = 0.01f;
}  // namespace

Embedding::Embedding(ParameterSet& ps, const GPTConfig& cfg, TensorSplit split)
    : ps_(ps),
      cfg_(cfg),
      split_(split),
      rows_(vocab_range(split, cfg.vocab_size)),
      site_(stable_hash("drop")) {
  const int64_t C = cfg.n_embd, V = cfg.vocab_size;
  wte_ = ps.add("wte.weight", {V, C}, Init::Normal, kInitStd, true, vocab_shard(split, V));
  wpe_ = ps.add("wpe.weight", {cfg.block_size, C}, Init::Normal, kWpeStd, true);
}

Embedding::Record Embedding::make_record(int max_batch, Allocator& alloc) const {
  const int64_t BT = static_cast<int64_t>(max_batch) * cfg_.block_size;
  Record r;
  r.tokens = Tensor::zeros({BT}, DType::I32, MemCategory::Activations, "tokens", &alloc);
  if (cfg_.dropout > 0.0f)
    r.mask =
        Tensor::zeros({BT * cfg_.n_embd}, DType::U8, MemCategory::Activations, "drop.mask", &alloc);
  return r;
}

void Embedding::forward(const StepContext& ctx, const Batch& b, float* out, Record& r) const {
  const int B = b.B, T = b.T, C = cfg_.n_embd;
  r.B = B;
  r.T = T;
  r.p = ctx.training ? cfg_.dropout : 0.0f;
  std::memcpy(r.tokens.data<int32_t>(), b.tokens, sizeof(int32_t) * B * T);
  if (split_.size() == 1) {
    k::embedding_forward(out, b.tokens, ps_.param_data(wte_), ps_.param_data(wpe_), B, T, C);
  } else {
    const int64_t n = static_cast<int64_t>(B) * T;
    k::embedding_lookup_rows(out, b.tokens, ps_.param_data(wte_), rows_.begin, rows_.size(), n, C);
    reduce_from_tp(split_, out, n * C);  // each element: one rank's row value plus zeros
    k::add_positions(out, ps_.param_data(wpe_), B, T, C);
  }
  if (r.p > 0.0f)
    k::dropout_forward_btc(out, r.mask.data<uint8_t>(), out, B, T, C, r.p, ctx.seed,
                           mix_stream(ctx.step, site_), b.first_sample);
}

void Embedding::backward(Record& r, float* dout) const {
  const int64_t n = static_cast<int64_t>(r.B) * r.T * cfg_.n_embd;
  if (r.p > 0.0f) k::dropout_backward(dout, dout, r.mask.data<uint8_t>(), n, r.p);
  if (split_.size() == 1)
    k::embedding_backward(ps_.grad_data(wte_), ps_.grad_data(wpe_), dout, r.tokens.data<int32_t>(),
                          r.B, r.T, cfg_.n_embd);
  else  // dout is the same on every rank of the group: each keeps its rows' share
    k::embedding_rows_backward(ps_.grad_data(wte_), ps_.grad_data(wpe_), dout,
                               r.tokens.data<int32_t>(), rows_.begin, rows_.size(), r.B, r.T,
                               cfg_.n_embd);
}

}  // namespace tessera::nn
