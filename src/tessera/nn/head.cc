#include "tessera/nn/head.h"

#include <cmath>
#include <cstring>

#include "tessera/core/error.h"
#include "tessera/kernels/gemm.h"
#include "tessera/kernels/layernorm.h"
#include "tessera/kernels/rmsnorm.h"
#include "tessera/kernels/softmax_xent.h"

namespace tessera::nn {

namespace k = tessera::kernels;

Head::Head(ParameterSet& ps, const GPTConfig& cfg, int wte, TensorSplit split,
           int64_t rows_per_sequence)
    : ps_(ps),
      cfg_(cfg),
      split_(split),
      vocab_(vocab_range(split, cfg.vocab_size)),
      rows_per_sequence_(rows_per_sequence > 0 ? rows_per_sequence : cfg.block_size),
      wte_(cfg.tie_embeddings ? wte : -1),
      tied_(cfg.tie_embeddings),
      owns_wte_(cfg.tie_embeddings && wte < 0) {
  const int64_t C = cfg.n_embd;
  // A tied head's copy has the embedding's name, so the same initial values and checkpoint entry.
  const char* name = !tied_        ? "lm_head.weight"
                     : cfg.llama() ? "model.embed_tokens.weight"
                                   : "wte.weight";
  if (wte_ < 0)
    wte_ = ps.add(name, {cfg.vocab_size, C}, Init::Normal, 0.02f, true,
                  vocab_shard(split, cfg.vocab_size));
  TESSERA_ASSERT(ps.infos()[wte_].local_shape[0] == vocab_.size(),
                 "the head's wte does not hold its vocabulary slice");
  if (cfg.llama()) {
    lnf_w_ = ps.add("model.norm.weight", {C}, Init::Ones, 0.0f, false);
  } else {
    lnf_w_ = ps.add("ln_f.weight", {C}, Init::Ones, 0.0f, false);
    lnf_b_ = ps.add("ln_f.bias", {C}, Init::Zeros, 0.0f, false);
  }
  for (int i : {lnf_w_, lnf_b_})
    if (i >= 0) mark_sequence_partial(ps, i, split);  // the norm sees its rows only
  ps.mark_gemm_weight(wte_);
}

Head::Record Head::make_record(int max_batch, Allocator& alloc,
                               std::vector<NamedActivation>* list) const {
  const int64_t BT = max_batch * rows_per_sequence_;
  const TokenRange rows = token_range(split_, BT);
  ActivationAllocator a(alloc, BT, list);
  ActivationAllocator mine(alloc, rows.per, list, split_.sequence_parallel());
  Record r;
  r.lnf = ActivationAllocator(alloc, rows.padded(), list)("ln_f", cfg_.n_embd);
  if (!cfg_.llama()) r.lnf_mean = mine("ln_f.mean", 1);
  r.lnf_rstd = mine("ln_f.rstd", 1);
  r.logits = a("logits", vocab_.size());
  r.lse = a("logsumexp", 1);
  r.losses = a("losses", 1);
  r.targets = a("targets", 1, DType::I32);
  return r;
}

double Head::forward(const StepContext& ctx, const Batch& b, const float* x, Record& r) const {
  const int BT = b.B * b.T, C = cfg_.n_embd, V = static_cast<int>(vocab_.size());
  r.x = x;
  r.B = b.B;
  r.T = b.T;
  r.have_targets = b.targets != nullptr;
  r.loss_scale = ctx.loss_scale;
  const TokenRange rows = token_range(split_, BT);
  float* lnf_rows = r.lnf.f32() + rows.place() * C;  // this rank's rows of ln_f(x), in place
  if (cfg_.llama())
    k::rmsnorm_forward(lnf_rows, r.lnf_rstd.f32(), x, ps_.param_data(lnf_w_), rows.size(), C,
                       cfg_.ln_eps);
  else
    k::layernorm_forward(lnf_rows, r.lnf_mean.f32(), r.lnf_rstd.f32(), x, ps_.param_data(lnf_w_),
                         ps_.param_data(lnf_b_), static_cast<int>(rows.size()), C, cfg_.ln_eps);
  const float* lnf = split_.sequence_parallel()
                         ? gather_to_tp(split_, lnf_rows, r.lnf.f32(), rows, C)
                         : copy_to_tp(split_, lnf_rows, static_cast<int64_t>(BT) * C);
  ps_.refresh_bf16_copy(wte_);  // (a bf16 model's copy; its backward reads the same)
  if (V > 0) k::matmul_nt_forward(r.logits.f32(), lnf, ps_.gemm_weight(wte_), BT, C, V);
  if (!r.have_targets) return 0.0;
  std::memcpy(r.targets.data<int32_t>(), b.targets, sizeof(int32_t) * BT);
  if (split_.size() == 1)
    return k::softmax_xent_forward(r.losses.f32(), r.lse.f32(), r.logits.f32(), b.targets, BT, V);
  // Vocabulary-parallel cross-entropy from the slices: global row max, then the sums of
  // exponentials and the target logit (one rank holds it, the others add 0), summed over the group.
  float* row_max = r.lse.f32();
  k::vocab_slice_max(row_max, r.logits.f32(), BT, V);
  max_over_tp(split_, row_max, BT);
  Tensor stats = Tensor::empty({2 * static_cast<int64_t>(BT)}, DType::F32, MemCategory::Activations,
                               "head.vocab_stats");
  float* sum_exp = stats.f32();
  float* target_logit = sum_exp + BT;
  k::vocab_slice_sum_exp(sum_exp, target_logit, r.logits.f32(), row_max, b.targets, vocab_.begin,
                         BT, V);
  sum_over_tp(split_, sum_exp, 2 * static_cast<int64_t>(BT));  // fp32 statistics
  double total = 0.0;
  float* losses = r.losses.f32();
  for (int n = 0; n < BT; ++n) {
    const float lse = row_max[n] + std::log(sum_exp[n]);
    r.lse.f32()[n] = lse;
    losses[n] = b.targets[n] < 0 ? 0.0f : lse - target_logit[n];
    total += losses[n];
  }
  return total;
}

void Head::backward_weight(const Record& r) const {
  const int BT = r.B * r.T, C = cfg_.n_embd, V = static_cast<int>(vocab_.size());
  if (V > 0)
    k::matmul_nt_backward(nullptr, ps_.grad_data(wte_), r.logits.f32(), r.lnf.f32(), nullptr, BT, C,
                          V);
}

void Head::backward(Record& r, float* dx, float* scratch, bool defer_weights) const {
  TESSERA_CHECK(r.B > 0, "backward() without a preceding forward()");
  TESSERA_CHECK(r.have_targets, "backward() needs a forward() with targets");
  const int BT = r.B * r.T, C = cfg_.n_embd, V = static_cast<int>(vocab_.size());
  float* dlogits = r.logits.f32();  // in place
  if (split_.size() == 1)
    k::softmax_xent_backward(dlogits, r.logits.f32(), r.lse.f32(), r.targets.data<int32_t>(),
                             r.loss_scale, BT, V);
  else
    k::softmax_xent_backward_slice(dlogits, r.logits.f32(), r.lse.f32(), r.targets.data<int32_t>(),
                                   vocab_.begin, r.loss_scale, BT, V);
  if (V > 0) {
    k::matmul_nt_backward(scratch, defer_weights ? nullptr : ps_.grad_data(wte_), dlogits,
                          r.lnf.f32(), ps_.gemm_weight(wte_), BT, C, V);
  } else {
    std::memset(scratch, 0, sizeof(float) * static_cast<size_t>(BT) * C);
  }
  // Summed over the vocabulary slices (on this rank's rows under sequence parallelism).
  const TokenRange rows = token_range(split_, BT);
  const float* dlnf =
      split_.sequence_parallel()
          ? gather_to_tp_backward(split_, scratch, scratch + rows.place() * C, rows, C)
          : copy_to_tp_backward(split_, scratch, static_cast<int64_t>(BT) * C);
  std::memset(dx, 0, sizeof(float) * static_cast<size_t>(rows.size()) * C);
  if (cfg_.llama())
    k::rmsnorm_backward(dx, ps_.grad_data(lnf_w_), dlnf, r.x, ps_.param_data(lnf_w_),
                        r.lnf_rstd.f32(), rows.size(), C);
  else
    k::layernorm_backward(dx, ps_.grad_data(lnf_w_), ps_.grad_data(lnf_b_), dlnf, r.x,
                          ps_.param_data(lnf_w_), r.lnf_mean.f32(), r.lnf_rstd.f32(),
                          static_cast<int>(rows.size()), C);
  r.have_targets = false;  // the logits are now gradients: a second backward would be wrong
}

void Head::decode(const float* x, int64_t rows, float* logits, float* norm, float* mean,
                  float* rstd) const {
  TESSERA_ASSERT(split_.size() == 1, "the head's decode without tensor parallelism only");
  const int C = cfg_.n_embd, V = static_cast<int>(vocab_.size());
  if (cfg_.llama())
    k::rmsnorm_forward(norm, rstd, x, ps_.param_data(lnf_w_), rows, C, cfg_.ln_eps);
  else
    k::layernorm_forward(norm, mean, rstd, x, ps_.param_data(lnf_w_), ps_.param_data(lnf_b_),
                         static_cast<int>(rows), C, cfg_.ln_eps);
  ps_.refresh_bf16_copy(wte_);
  k::matmul_nt_forward(logits, norm, ps_.gemm_weight(wte_), static_cast<int>(rows), C, V);
}

}  // namespace tessera::nn
