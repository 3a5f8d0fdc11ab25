#include "tessera/nn/moe_mlp.h"

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/kernels/dropout.h"
#include "tessera/kernels/layernorm.h"

namespace tessera::nn {

namespace k = tessera::kernels;

namespace {
// ln_2 is registered before the router (the parameter order of a GPT-2 block).
int add_ln2(ParameterSet& ps, const GPTConfig& cfg, int layer, const char* what) {
  const std::string name = "h." + std::to_string(layer) + ".ln_2." + what;
  const bool weight = std::string(what) == "weight";
  return ps.add(name, {cfg.n_embd}, weight ? Init::Ones : Init::Zeros, 0.0f, false);
}
}  // namespace

MoeMlp::MoeMlp(ParameterSet& ps, ParameterSet& experts, const GPTConfig& cfg, int layer,
               const TensorSplit& split, ExpertSplit expert_split, const ContextSplit& context,
               Recompute recompute)
    : ps_(ps),
      cfg_(cfg),
      layer_(layer),
      split_(split),
      recompute_(recompute),
      rows_per_sequence_(context.rows_per_sequence(cfg.block_size)),
      ln_w_(add_ln2(ps, cfg, layer, "weight")),
      ln_b_(add_ln2(ps, cfg, layer, "bias")),
      moe_(ps, experts, cfg, layer, expert_split, context) {
  mark_sequence_partial(ps, ln_w_, split);
  mark_sequence_partial(ps, ln_b_, split);
  site_drop_ = stable_hash("h." + std::to_string(layer) + ".mlp.dropout");
}

void MoeMlp::allocate(MoeMlpRecord& r, int max_batch, Allocator& alloc,
                      std::vector<NamedActivation>* list) const {
  const int64_t BT = max_batch * rows_per_sequence_, C = cfg_.n_embd;
  const TokenRange rows_of = token_range(split_, BT);
  ActivationAllocator rows(alloc, rows_of.per, list, split_.sequence_parallel());
  const std::string h = "h." + std::to_string(layer_) + ".";
  if (split_.sequence_parallel())  // every rank's rows, gathered (padded)
    r.ln2 = ActivationAllocator(alloc, rows_of.padded(), nullptr)(h + "ln_2", C);
  else
    r.ln2 = rows(h + "ln_2", C);
  r.ln2_mean = rows(h + "ln_2.mean", 1);
  r.ln2_rstd = rows(h + "ln_2.rstd", 1);
  r.moe = std::make_shared<MixtureOfExperts::Record>(moe_.make_record(max_batch, alloc));
  if (list) {  // the router's [B T, E] activations (the experts' rows vary with routing)
    const int64_t E = cfg_.moe.experts;
    list->push_back({h + "mlp.router.logits", r.moe->logits, E});
    list->push_back({h + "mlp.router.probs", r.moe->probs, E});
  }
  if (cfg_.dropout > 0.0f) r.mask = rows(h + "mlp.dropout.mask", C, DType::U8);
}

std::unique_ptr<MlpRecord> MoeMlp::make_record(int max_batch, Allocator& alloc,
                                               std::vector<NamedActivation>* list) const {
  auto r = std::make_unique<MoeMlpRecord>();
  if (recompute_ != Recompute::Full) allocate(*r, max_batch, alloc, list);
  return r;
}

void MoeMlp::reserve(BlockWorkspace& ws, int max_batch, Allocator& alloc) const {
  if (!ws.moe)
    ws.moe = std::make_shared<MixtureOfExperts::Workspace>(MixtureOfExperts::make_workspace(alloc));
  reserve_mlp_record<MoeMlpRecord>(
      ws, kind(), recompute_, [&](MoeMlpRecord& r) { allocate(r, max_batch, alloc, nullptr); });
}

MoeMlpRecord& MoeMlp::scratch(BlockWorkspace& ws) const {
  return reserved_mlp_record<MoeMlpRecord>(ws, kind(), layer_);
}

void MoeMlp::run_forward(const BlockPass& mb, const float* x, float* y, MoeMlpRecord& r,
                         BlockWorkspace& ws) const {
  const int64_t C = cfg_.n_embd;
  const TpRegion tp = branch_region(split_, mb, ws, cfg_.n_embd);
  const int R = static_cast<int>(tp.rows.size());
  // Under sequence parallelism this rank's rows go to their place of the gathered record.
  float* ln2 = r.ln2.f32() + (tp.sequence() ? tp.rows.place() * C : 0);
  k::layernorm_forward(ln2, r.ln2_mean.f32(), r.ln2_rstd.f32(), x, ps_.param_data(ln_w_),
                       ps_.param_data(ln_b_), R, static_cast<int>(C), cfg_.ln_eps);
  if (tp.sequence()) {  // gathered in fp32 whatever the wire: the router reads fp32
    TensorSplit fp32_wire = split_;
    fp32_wire.wire = DType::F32;
    gather_to_tp(fp32_wire, ln2, r.ln2.f32(), tp.rows, C);
  }
  // Every token on every tp rank: complete, no reduce point.
  moe_.forward(r.ln2.f32(), ws.proj.f32(), mb.B, mb.T, mb.loss_scale, *r.moe, *ws.moe,
               y != nullptr && mb.training, mb.positions);
  const BranchDropout drop = branch_dropout(mb, tp, site_drop_, r.mask);
  if (y == nullptr) {  // a recomputation needs only the mask of the last dropout
    drop.draw_mask(R, static_cast<int>(C));
    return;
  }
  // This rank's rows of the output (the experts' biases are inside it).
  residual_branch(tp, y, ws.proj.f32() + tp.rows.begin * C, nullptr, x, drop);
}

void MoeMlp::forward(const BlockPass& mb, const float* x, float* y, MlpRecord& r,
                     BlockWorkspace& ws) const {
  run_forward(mb, x, y, recompute_ == Recompute::Full ? scratch(ws) : static_cast<MoeMlpRecord&>(r),
              ws);
}

void MoeMlp::recompute(const BlockPass& mb, const float* x, BlockWorkspace& ws) const {
  run_forward(mb, x, nullptr, scratch(ws), ws);
}

void MoeMlp::backward(const BlockPass& mb, const float* x, MlpRecord& r, float* dres,
                      BlockWorkspace& ws, bool defer) const {
  (void)defer;  // the mixture computes all its gradients now, also under the zero-bubble split
  run_backward(mb, x, recompute_ == Recompute::Full ? scratch(ws) : static_cast<MoeMlpRecord&>(r),
               dres, ws);
}

void MoeMlp::run_backward(const BlockPass& mb, const float* x, const MoeMlpRecord& r, float* dres,
                          BlockWorkspace& ws) const {
  const int64_t C = cfg_.n_embd;
  const TpRegion tp = branch_region(split_, mb, ws, cfg_.n_embd);
  const int R = static_cast<int>(tp.rows.size());
  // Every token's output gradient (all-gathered under sequence parallelism); the input gradient
  // is complete on every tp rank: no reduction, this rank's rows of it.
  const float* dy = row_linear_grad_output(tp, dres, branch_dropout(mb, tp, site_drop_, r.mask));
  float* dln = ws.dln.f32();
  moe_.backward(*r.moe, dy, dln, *ws.moe);
  k::layernorm_backward(dres, ps_.grad_data(ln_w_), ps_.grad_data(ln_b_), dln + tp.rows.begin * C,
                        x, ps_.param_data(ln_w_), r.ln2_mean.f32(), r.ln2_rstd.f32(), R,
                        static_cast<int>(C));
}

void MoeMlp::backward_weight(const BlockPass& mb, MlpRecord& r) const {
  (void)mb, (void)r;  // nothing deferred (backward computed every gradient)
}

}  // namespace tessera::nn
