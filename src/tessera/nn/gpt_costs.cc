#include "tessera/nn/gpt_costs.h"

namespace tessera::nn {

namespace {
GPTParams llama_params(const GPTConfig& c) {
  const int64_t C = c.n_embd, D = c.head_dim(), F = c.mlp_hidden();
  const int64_t q = int64_t{c.n_head} * D, kv = int64_t{c.kv_heads()} * D;
  GPTParams p;
  p.wte = static_cast<int64_t>(c.vocab_size) * C;
  p.layer_norm = C;  // an RMSNorm: a gain only
  p.attention = p.layer_norm + C * (q + 2 * kv) + q * C;
  if (c.qkv_bias) p.attention += q + 2 * kv;
  if (c.o_bias) p.attention += C;
  p.mlp = p.layer_norm + 3 * C * F;
  p.expert = 3 * C * c.moe_hidden();
  p.router = C * c.moe.experts;
  if (c.moe.shared_ffn_dim > 0)
    p.shared_expert = 3 * C * c.moe.shared_ffn_dim + (c.moe.shared_gate ? C : 0);
  p.head = p.layer_norm + (c.tie_embeddings ? 0 : p.wte);
  return p;
}
}  // namespace

GPTParams gpt_params(const GPTConfig& c) {
  if (c.llama()) return llama_params(c);
  const int64_t C = c.n_embd;
  GPTParams p;
  p.wte = static_cast<int64_t>(c.vocab_size) * C;
  p.wpe = static_cast<int64_t>(c.block_size) * C;
  p.layer_norm = 2 * C;
  p.attention = p.layer_norm + (3 * C * C + 3 * C) + (C * C + C);
  p.expert = (4 * C * C + 4 * C) + (4 * C * C + C);
  p.mlp = p.layer_norm + p.expert;
  p.router = C * c.moe.experts;
  p.head = p.layer_norm;
  return p;
}

int64_t attention_half_params(const GPTConfig& c) {
  return gpt_params(c).attention;
}

int64_t mlp_half_params(const GPTConfig& c, int layer, int experts) {
  const GPTParams p = gpt_params(c);
  if (!c.moe.is_moe_layer(layer)) return p.mlp;
  return p.layer_norm + p.router + static_cast<int64_t>(experts) * p.expert + p.shared_expert;
}

namespace {
// Every parameter but wpe, with `experts` of each MoE block's experts.
int64_t params_without_wpe(const GPTConfig& c, int experts) {
  int64_t n = gpt_params(c).wte + gpt_params(c).head;
  for (int l = 0; l < c.n_layer; ++l)
    n += attention_half_params(c) + mlp_half_params(c, l, experts);
  return n;
}
}  // namespace

int64_t total_params(const GPTConfig& c) {
  return params_without_wpe(c, c.moe.experts) + gpt_params(c).wpe;
}

int64_t active_params_without_wpe(const GPTConfig& c) {
  return params_without_wpe(c, c.moe.top_k);
}

double model_flops_per_token(const GPTConfig& c, int T) {
  // An untied model's input embedding is a lookup, not a matmul (the head's own weight counts).
  const int64_t lookup = c.tie_embeddings ? 0 : gpt_params(c).wte;
  // Causal attention: each query meets the keys at or before it, half of PaLM's dense 12 L C T.
  return 6.0 * static_cast<double>(active_params_without_wpe(c) - lookup) +
         6.0 * c.n_layer * static_cast<double>(c.n_embd) * T;
}

int mlp_passes(const GPTConfig& c, int layer) {
  return c.moe.is_moe_layer(layer) ? c.moe.top_k : 1;
}

BlockFlops block_flops(const GPTConfig& c, int layer, int T) {
  const double C = c.n_embd;
  BlockFlops f;
  f.qkv = 2 * 3 * C * C;
  f.attention_out = 2 * C * C;
  f.attention_core = 4.0 * T * C;
  f.attention_core_recompute = 2.0 * T * C;
  f.mlp = 2 * 8 * C * C;
  const bool moe = c.moe.is_moe_layer(layer);
  if (c.llama()) {  // grouped-query q/k/v; three F-wide matmuls (an expert's own F)
    f.qkv = 2 * C * static_cast<double>(c.n_head + 2 * c.kv_heads()) * c.head_dim();
    f.mlp = 2 * 3 * C * (moe ? c.moe_hidden() : c.mlp_hidden());
  }
  if (moe) {
    f.router = 2 * C * c.moe.experts;
    if (c.moe.shared_ffn_dim > 0)
      f.shared_expert = 2 * 3 * C * c.moe.shared_ffn_dim + (c.moe.shared_gate ? 2 * C : 0);
  }
  return f;
}

double head_flops(const GPTConfig& c) {
  return 2.0 * c.n_embd * c.vocab_size;
}

}  // namespace tessera::nn
