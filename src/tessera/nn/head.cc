#include "tessera/nn/head.h"

#include <cstring>

#include "tessera/core/error.h"
#include "tessera/kernels/gemm.h"
#include "tessera/kernels/layernorm.h"
#include "tessera/kernels/softmax_xent.h"

namespace tessera::nn {

namespace k = tessera::kernels;

Head::Head(ParameterSet& ps, const GPTConfig& cfg, int wte)
    : ps_(ps), cfg_(cfg), wte_(wte), owns_wte_(wte < 0) {
  const int64_t C = cfg.n_embd;
  if (owns_wte_)  // same name, so the same initial values and checkpoint entry as the embedding's
    wte_ = ps.add("wte.weight", {cfg.vocab_size, C}, Init::Normal, 0.02f, true);
  lnf_w_ = ps.add("ln_f.weight", {C}, Init::Ones, 0.0f, false);
  lnf_b_ = ps.add("ln_f.bias", {C}, Init::Zeros, 0.0f, false);
}

Head::Record Head::make_record(int max_batch, Allocator& alloc,
                               std::vector<NamedActivation>* list) const {
  const int64_t BT = static_cast<int64_t>(max_batch) * cfg_.block_size;
  ActivationAllocator a(alloc, BT, 0, list);
  Record r;
  r.lnf = a("ln_f", cfg_.n_embd);
  r.lnf_mean = a("ln_f.mean", 1);
  r.lnf_rstd = a("ln_f.rstd", 1);
  r.logits = a("logits", cfg_.vocab_size);
  r.lse = a("logsumexp", 1);
  r.losses = a("losses", 1);
  r.targets = a("targets", 1, DType::I32);
  return r;
}

double Head::forward(const StepContext& ctx, const Batch& b, const float* x, Record& r) const {
  const int BT = b.B * b.T, C = cfg_.n_embd, V = cfg_.vocab_size;
  r.x = x;
  r.B = b.B;
  r.T = b.T;
  r.have_targets = b.targets != nullptr;
  r.loss_scale = ctx.loss_scale;
  k::layernorm_forward(r.lnf.f32(), r.lnf_mean.f32(), r.lnf_rstd.f32(), x, ps_.param_data(lnf_w_),
                       ps_.param_data(lnf_b_), BT, C, cfg_.ln_eps);
  k::matmul_nt_forward(r.logits.f32(), r.lnf.f32(), ps_.param_data(wte_), BT, C, V);
  if (!r.have_targets) return 0.0;
  std::memcpy(r.targets.data<int32_t>(), b.targets, sizeof(int32_t) * BT);
  return k::softmax_xent_forward(r.losses.f32(), r.lse.f32(), r.logits.f32(), b.targets, BT, V);
}

void Head::backward(Record& r, float* dx, float* scratch) const {
  TESSERA_CHECK(r.B > 0, "backward() without a preceding forward()");
  TESSERA_CHECK(r.have_targets, "backward() needs a forward() with targets");
  const int BT = r.B * r.T, C = cfg_.n_embd, V = cfg_.vocab_size;
  float* dlogits = r.logits.f32();  // in place
  k::softmax_xent_backward(dlogits, r.logits.f32(), r.lse.f32(), r.targets.data<int32_t>(),
                           r.loss_scale, BT, V);
  k::matmul_nt_backward(scratch, ps_.grad_data(wte_), dlogits, r.lnf.f32(), ps_.param_data(wte_),
                        BT, C, V);
  std::memset(dx, 0, sizeof(float) * static_cast<size_t>(BT) * C);
  k::layernorm_backward(dx, ps_.grad_data(lnf_w_), ps_.grad_data(lnf_b_), scratch, r.x,
                        ps_.param_data(lnf_w_), r.lnf_mean.f32(), r.lnf_rstd.f32(), BT, C);
  r.have_targets = false;  // the logits are now gradients: a second backward would be wrong
}

}  // namespace tessera::nn
