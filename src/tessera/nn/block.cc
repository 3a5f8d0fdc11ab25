#include "tessera/nn/block.h"

#include <cmath>
#include <cstring>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/kernels/attention.h"
#include "tessera/kernels/bf16.h"
#include "tessera/kernels/dropout.h"
#include "tessera/kernels/gelu.h"
#include "tessera/kernels/gemm.h"
#include "tessera/kernels/layernorm.h"
#include "tessera/kernels/residual.h"

namespace tessera::nn {

namespace k = tessera::kernels;

namespace {
// A matmul input as the record keeps it: fp32, or the bf16 bits of the values a bf16 GEMM rounds
// it to anyway (Block's bf16_gemm_inputs). The forward's GEMMs read it too, right after
// keep_rounded, so nothing is rounded twice (fp32 records are where staging computed them).
k::GemmInput kept(const Tensor& t) {
  if (t.dtype() == DType::BF16) return t.data<uint16_t>();
  return t.f32();
}

// Where the forward computes a tensor the record keeps: in the record (fp32), or in fp32 scratch
// that keep_rounded then rounds into the record (bf16).
float* staging(const Tensor& rec, const Tensor& scratch) {
  return rec.dtype() == DType::BF16 ? scratch.f32() : rec.f32();
}
void keep_rounded(Tensor& rec, const float* staged, int64_t n) {
  if (rec.dtype() == DType::BF16) k::f32_to_bf16(rec.data<uint16_t>(), staged, n);
}
}  // namespace

Block::Block(ParameterSet& ps, const GPTConfig& cfg, int layer, TensorSplit split,
             Recompute recompute, ParameterSet* experts, ExpertSplit expert_split, BlockPart half,
             bool bf16_gemm_inputs)
    : ps_(ps),
      cfg_(cfg),
      layer_(layer),
      part_(half),
      split_(split),
      sequence_(split.sequence_parallel()),
      recompute_(recompute),
      bf16_gemm_inputs_(bf16_gemm_inputs) {
  const int t = split.size(), r = split.rank();
  const int64_t C = cfg.n_embd;
  TESSERA_CHECK_AS(ConfigError, cfg.n_head % t == 0, "the tensor-parallel size ", t,
                   " must divide the number of attention heads (", cfg.n_head, ")");
  heads_local_ = cfg.n_head / t;
  c_local_ = C / t;  // n_head divides C, t divides n_head
  mlp_local_ = 4 * C / t;
  const float proj_std = kInitStd / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
  // Shards: c_attn by columns (the same columns of q, k and v: 3 blocks), c_fc by columns, both
  // c_proj by rows; LayerNorms and the c_proj biases replicated. Under sequence parallelism the
  // LayerNorms see this rank's rows only: their gradients are partial sums.
  auto part = [&](int dim, int64_t blocks, int64_t len) {
    return t == 1 ? ShardSpec{} : ShardSpec{dim, blocks, r * len, len};
  };
  const std::string h = "h." + std::to_string(layer) + ".";
  q_ = Params{-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
  if (has_attention()) {
    q_.ln1_w = ps.add(h + "ln_1.weight", {C}, Init::Ones, 0.0f, false);
    q_.ln1_b = ps.add(h + "ln_1.bias", {C}, Init::Zeros, 0.0f, false);
    q_.attn_w = ps.add(h + "attn.c_attn.weight", {C, 3 * C}, Init::Normal, kInitStd, true,
                       part(1, 3, c_local_));
    q_.attn_b =
        ps.add(h + "attn.c_attn.bias", {3 * C}, Init::Zeros, 0.0f, false, part(0, 3, c_local_));
    q_.aproj_w = ps.add(h + "attn.c_proj.weight", {C, C}, Init::Normal, proj_std, true,
                        part(0, 1, c_local_));
    q_.aproj_b = ps.add(h + "attn.c_proj.bias", {C}, Init::Zeros, 0.0f, false);
  }
  if (has_mlp()) {
    q_.ln2_w = ps.add(h + "ln_2.weight", {C}, Init::Ones, 0.0f, false);
    q_.ln2_b = ps.add(h + "ln_2.bias", {C}, Init::Zeros, 0.0f, false);
  }
  if (!has_mlp()) {
    // the attention half has no MLP
  } else if (cfg.moe.is_moe_layer(layer)) {  // the MLP is a mixture of experts
    // The MoE runs on every token of the micro-batch (its capacity is per sequence): under
    // sequence parallelism its input is all-gathered first and each rank keeps its rows of the
    // output (run_forward).
    moe_.emplace(ps, experts ? *experts : ps, cfg, layer, expert_split);
  } else {
    q_.fc_w = ps.add(h + "mlp.c_fc.weight", {C, 4 * C}, Init::Normal, kInitStd, true,
                     part(1, 1, mlp_local_));
    q_.fc_b =
        ps.add(h + "mlp.c_fc.bias", {4 * C}, Init::Zeros, 0.0f, false, part(0, 1, mlp_local_));
    q_.mproj_w = ps.add(h + "mlp.c_proj.weight", {4 * C, C}, Init::Normal, proj_std, true,
                        part(0, 1, mlp_local_));
    q_.mproj_b = ps.add(h + "mlp.c_proj.bias", {C}, Init::Zeros, 0.0f, false);
  }
  for (int i : {q_.ln1_w, q_.ln1_b, q_.ln2_w, q_.ln2_b})
    if (i >= 0) mark_sequence_partial(ps, i, split);
  for (int i : {q_.attn_w, q_.aproj_w, q_.fc_w, q_.mproj_w})
    if (i >= 0) ps.mark_gemm_weight(i);
  site_attn_drop_ = stable_hash(h + "attn.attn_dropout");
  site_resid_drop_ = stable_hash(h + "attn.resid_dropout");
  site_mlp_drop_ = stable_hash(h + "mlp.dropout");
}

void Block::allocate(Record& r, int max_batch, Allocator& alloc, std::vector<NamedActivation>* list,
                     bool keep_attention, bool keep_rest, BlockPart part, DType gemm_inputs) const {
  const bool attn = part != BlockPart::Mlp, mlp = part != BlockPart::Attention;
  const int64_t T = cfg_.block_size, BT = static_cast<int64_t>(max_batch) * T;
  // The tensor-parallel region: every token, this rank's columns. The rest: this rank's rows.
  ActivationAllocator a(alloc, BT, BT * heads_local_ * T, list);
  ActivationAllocator rows(alloc, token_range(split_, BT).per, 0, list, sequence_);
  const std::string h = "h." + std::to_string(layer_) + ".";
  const bool drop = cfg_.dropout > 0.0f;
  const int64_t C = cfg_.n_embd;
  if (keep_rest && attn) {
    r.ln1 = rows(h + "ln_1", C, gemm_inputs);
    r.ln1_mean = rows(h + "ln_1.mean", 1);
    r.ln1_rstd = rows(h + "ln_1.rstd", 1);
    r.qkv = a(h + "qkv", 3 * c_local_);
    r.atty = a(h + "atty", c_local_, gemm_inputs);
    if (mlp) r.x_attn = rows(h + "x_attn", C);  // (a half's x_attn is its input or output)
    if (drop) r.mask_attn = rows(h + "attn.resid_dropout.mask", C, DType::U8);
  }
  if (keep_rest && mlp) {
    if (moe_ && sequence_) {  // the MoE's input: every rank's rows, gathered (fp32, padded)
      ActivationAllocator gathered(alloc, token_range(split_, BT).padded(), 0, nullptr);
      r.ln2 = gathered(h + "ln_2", C);
    } else {
      r.ln2 = rows(h + "ln_2", C, moe_ ? DType::F32 : gemm_inputs);  // (the MoE reads fp32)
    }
    r.ln2_mean = rows(h + "ln_2.mean", 1);
    r.ln2_rstd = rows(h + "ln_2.rstd", 1);
    if (moe_) {
      r.moe = std::make_shared<MoeMlp::Record>(moe_->make_record(max_batch, alloc));
      if (list) {  // the router's [B T, E] activations (the experts' rows vary with routing)
        const int64_t E = cfg_.moe.experts;
        list->push_back({h + "mlp.router.logits", r.moe->logits, E});
        list->push_back({h + "mlp.router.probs", r.moe->probs, E});
      }
    } else {
      r.fc = a(h + "fc", mlp_local_);
      r.fch = a(h + "fc.gelu", mlp_local_, gemm_inputs);
    }
    if (drop) r.mask_mlp = rows(h + "mlp.dropout.mask", C, DType::U8);
  }
  if (keep_attention && attn) {
    r.att = a(h + "att", 0);
    if (drop) r.att_drop = a(h + "att.dropped", 0);
  }
}

Block::Record Block::make_record(int max_batch, Allocator& alloc,
                                 std::vector<NamedActivation>* list) const {
  Record r;
  allocate(r, max_batch, alloc, list, recompute_ == Recompute::None, recompute_ != Recompute::Full,
           part_, bf16_gemm_inputs_ ? DType::BF16 : DType::F32);
  return r;
}

Block::Workspace Block::make_workspace(int max_batch, Allocator& alloc) const {
  const int64_t T = cfg_.block_size, BT = static_cast<int64_t>(max_batch) * T;
  ActivationAllocator a(alloc, BT, T * T, nullptr);
  ActivationAllocator padded(alloc, token_range(split_, BT).padded(), 0, nullptr);
  const int64_t C = cfg_.n_embd;
  Workspace ws;
  ws.proj = padded("block.proj", C);
  ws.dln = padded("block.d_ln", C);
  if (sequence_) ws.gathered = padded("block.gathered_ln", C);
  ws.datty = a("block.d_atty", c_local_);
  ws.dqkv = a("block.d_qkv", 3 * c_local_);
  ws.dfch = a("block.d_fc", mlp_local_);
  ws.dscratch = a("block.d_att", 0);  // [T, T]
  if (cfg_.moe.enabled())
    ws.moe = std::make_shared<MoeMlp::Workspace>(MoeMlp::make_workspace(alloc));
  if (recompute_ != Recompute::None) {
    ws.recomputed = std::make_unique<Record>();
    const bool selective = recompute_ == Recompute::Selective;
    allocate(*ws.recomputed, max_batch, alloc, nullptr, true, !selective, BlockPart::Whole);
    if (selective) ws.atty = a("block.recomputed_atty", c_local_);
  }
  return ws;
}

void Block::complete_workspace(Workspace& ws, int max_batch, Allocator& alloc) const {
  if (recompute_ != Recompute::Full || !has_mlp()) return;  // (Selective keeps no MLP tensor)
  Record& r = *ws.recomputed;
  if (moe_ && !r.moe) r.moe = std::make_shared<MoeMlp::Record>(moe_->make_record(max_batch, alloc));
  if (!moe_ && !r.fc.defined()) {
    const int64_t BT = static_cast<int64_t>(max_batch) * cfg_.block_size;
    ActivationAllocator a(alloc, BT, 0, nullptr);
    r.fc = a("block.recomputed_fc", mlp_local_);
    r.fch = a("block.recomputed_fc.gelu", mlp_local_);
  }
}

void Block::attention(float* atty, float* att, float* att_drop, const Record& r) const {
  const bool drop = r.p > 0.0f;
  k::AttentionDropout ad{r.p,
                         r.seed,
                         mix_stream(r.step, site_attn_drop_),
                         r.first_sample,
                         split_.rank() * heads_local_,
                         cfg_.n_head};
  k::attention_forward(atty, att, drop ? att_drop : nullptr, r.qkv.f32(), r.B, r.T,
                       static_cast<int>(c_local_), heads_local_, drop ? &ad : nullptr);
}

void Block::run_forward(const float* x, float* y, Record& r, Workspace& ws,
                        bool write_output) const {
  const int BT = r.B * r.T, C = cfg_.n_embd;
  const int Cl = static_cast<int>(c_local_), F = static_cast<int>(mlp_local_);
  const int64_t n = static_cast<int64_t>(BT) * C;
  // The residual stream's rows on this rank (all BT without sequence parallelism); dropout masks
  // are keyed by the global token (first_row + i), so the rows draw the single-device mask.
  const TokenRange rows = token_range(split_, BT);
  const int R = static_cast<int>(rows.size());
  const int64_t first_row = r.first_sample * r.T + rows.begin;
  const bool drop = r.p > 0.0f;
  auto p = [&](int i) { return ps_.param_data(i); };
  auto w = [&](int i) { return ps_.gemm_weight(i); };  // bf16 copies (refreshed here) or fp32
  for (int i : {q_.attn_w, q_.aproj_w, q_.fc_w, q_.mproj_w})
    if (i >= 0) ps_.refresh_bf16_copy(i);
  // Entering the tensor-parallel region (every token) from a LayerNorm output of this rank's rows.
  auto to_tp = [&](const float* ln) {
    return sequence_ ? gather_to_tp(split_, ln, ws.gathered.f32(), rows, C)
                     : copy_to_tp(split_, ln, n);
  };
  // Leaving it at a reduce point: the sum of the partial projections, on this rank's rows.
  auto from_tp = [&](float* proj) {
    return sequence_ ? reduce_scatter_from_tp(split_, proj, proj + rows.place() * C, rows, C)
                     : reduce_from_tp(split_, proj, n);
  };
  // out = residual + dropout(proj + bias) on this rank's rows, after the reduce point.
  auto residual_branch = [&](float* out, float* proj, const float* bias, const float* residual,
                             Tensor& mask, uint64_t site) {
    const int64_t rn = static_cast<int64_t>(R) * C;
    if (!drop && bias) {
      k::bias_residual_forward(out, proj, bias, residual, R, C);
      return;
    }
    if (bias) k::bias_forward(proj, proj, bias, R, C);
    if (!drop) {
      k::residual_forward(out, residual, proj, rn);
      return;
    }
    k::dropout_forward_rows(proj, mask.data<uint8_t>(), proj, R, C, r.p, r.seed,
                            mix_stream(r.step, site), first_row);
    k::residual_forward(out, residual, proj, rn);
  };

  // The residual stream between the halves: the record's (whole block), the attention half's
  // output y, or the MLP half's input x.
  float* x_attn_out = part_ == BlockPart::Whole ? r.x_attn.f32() : y;  // the attention writes it
  const float* x_attn = has_attention() ? x_attn_out : x;              // the MLP reads it

  // Attention branch: x_attn = x + dropout(attention(ln_1(x)) W_proj + b_proj).
  // GEMM inputs the record may keep in bf16 are computed in the backward-only scratch first.
  if (has_attention()) {
    float* ln1_out = staging(r.ln1, ws.dln);
    k::layernorm_forward(ln1_out, r.ln1_mean.f32(), r.ln1_rstd.f32(), x, p(q_.ln1_w), p(q_.ln1_b),
                         R, C, cfg_.ln_eps);
    keep_rounded(r.ln1, ln1_out, static_cast<int64_t>(R) * C);
    const k::GemmInput ln1 = sequence_ ? k::GemmInput(to_tp(ln1_out)) : kept(r.ln1);
    k::matmul_forward(r.qkv.f32(), ln1, w(q_.attn_w), p(q_.attn_b), nullptr, BT, C, 3 * Cl);
    float* atty = staging(r.atty, ws.datty);
    attention(atty, r.att.f32(), r.att_drop.defined() ? r.att_drop.f32() : nullptr, r);
    keep_rounded(r.atty, atty, static_cast<int64_t>(BT) * Cl);
    if (!write_output && !has_mlp()) {  // recomputing an attention half: the mask is what is left
      if (drop)
        k::dropout_mask_rows(r.mask_attn.data<uint8_t>(), R, C, r.p, r.seed,
                             mix_stream(r.step, site_resid_drop_), first_row);
      return;
    }
    k::matmul_forward(ws.proj.f32(), kept(r.atty), w(q_.aproj_w), nullptr, nullptr, BT, Cl, C);
    float* attn_out = from_tp(ws.proj.f32());  // reduce point
    residual_branch(x_attn_out, attn_out, p(q_.aproj_b), x, r.mask_attn, site_resid_drop_);
  }
  if (!has_mlp()) return;

  // MLP branch: y = x_attn + dropout(gelu(ln_2(x_attn) W_fc + b_fc) W_proj + b_proj), or with
  // the mixture of experts, y = x_attn + dropout(moe(ln_2(x_attn))) (complete on every tp rank;
  // its backward needs the experts' outputs, so a recomputation runs all of it).
  // (An MoE block under sequence parallelism writes this rank's rows at their place of the
  // gathered record.)
  float* ln2_out = moe_ && sequence_ ? r.ln2.f32() + rows.place() * C : staging(r.ln2, ws.dln);
  k::layernorm_forward(ln2_out, r.ln2_mean.f32(), r.ln2_rstd.f32(), x_attn, p(q_.ln2_w),
                       p(q_.ln2_b), R, C, cfg_.ln_eps);
  keep_rounded(r.ln2, ln2_out, static_cast<int64_t>(R) * C);
  float* fch = nullptr;
  if (moe_) {         // every token on every tp rank: complete, no reduce point
    if (sequence_) {  // gathered in fp32 whatever the wire: the router reads fp32
      TensorSplit fp32_wire = split_;
      fp32_wire.wire = DType::F32;
      gather_to_tp(fp32_wire, ln2_out, r.ln2.f32(), rows, C);
    }
    moe_->forward(r.ln2.f32(), ws.proj.f32(), r.B, r.T, r.loss_scale, *r.moe, *ws.moe,
                  write_output && r.training);
  } else {
    const k::GemmInput ln2 = sequence_ ? k::GemmInput(to_tp(ln2_out)) : kept(r.ln2);
    k::matmul_forward(r.fc.f32(), ln2, w(q_.fc_w), p(q_.fc_b), nullptr, BT, C, F);
    fch = staging(r.fch, ws.dfch);
    k::gelu_forward(fch, r.fc.f32(), static_cast<int64_t>(BT) * F);
    keep_rounded(r.fch, fch, static_cast<int64_t>(BT) * F);
  }
  if (!write_output) {  // a recomputation needs only the mask of the last dropout
    if (drop)
      k::dropout_mask_rows(r.mask_mlp.data<uint8_t>(), R, C, r.p, r.seed,
                           mix_stream(r.step, site_mlp_drop_), first_row);
    return;
  }
  if (moe_) {  // the experts' biases are inside their outputs; this rank's rows of them
    residual_branch(y, ws.proj.f32() + rows.begin * C, nullptr, x_attn, r.mask_mlp, site_mlp_drop_);
    return;
  }
  k::matmul_forward(ws.proj.f32(), kept(r.fch), w(q_.mproj_w), nullptr, nullptr, BT, F, C);
  float* mlp_out = from_tp(ws.proj.f32());  // reduce point
  residual_branch(y, mlp_out, p(q_.mproj_b), x_attn, r.mask_mlp, site_mlp_drop_);
}

void Block::forward(const StepContext& ctx, const Batch& b, const float* x, float* y, Record& r,
                    Workspace& ws) const {
  r.x = x;
  r.B = b.B;
  r.T = b.T;
  r.first_sample = b.first_sample;
  r.p = ctx.training ? cfg_.dropout : 0.0f;
  r.seed = ctx.seed;
  r.step = ctx.step;
  r.loss_scale = ctx.loss_scale;
  r.training = ctx.training;
  switch (recompute_) {
    case Recompute::None:
      run_forward(x, y, r, ws, true);
      return;
    case Recompute::Selective: {  // the probabilities go to the workspace and are dropped
      Record with_scratch = r;
      with_scratch.att = ws.recomputed->att;
      with_scratch.att_drop = ws.recomputed->att_drop;
      run_forward(x, y, with_scratch, ws, true);
      return;
    }
    case Recompute::Full: {  // everything goes to the workspace and is dropped
      Record& scratch = *ws.recomputed;
      scratch.B = r.B, scratch.T = r.T, scratch.p = r.p;
      scratch.first_sample = r.first_sample, scratch.seed = r.seed, scratch.step = r.step;
      scratch.loss_scale = r.loss_scale, scratch.training = r.training;
      scratch.x = x;
      run_forward(x, y, scratch, ws, true);
      return;
    }
  }
}

void Block::backward(Record& r, float* dres, Workspace& ws, bool defer_weights) const {
  TESSERA_ASSERT(r.B > 0 && r.x != nullptr, "Block::backward of h.", layer_, " without a forward");
  Record::DeferredWeightGrads* defer = defer_weights ? &deferred_for(r) : nullptr;
  switch (recompute_) {
    case Recompute::None:
      run_backward(r, dres, ws, defer);
      return;
    case Recompute::Selective: {
      Record full = r;
      full.att = ws.recomputed->att;
      full.att_drop = ws.recomputed->att_drop;
      if (has_attention())
        attention(ws.atty.f32(), full.att.f32(),
                  full.att_drop.defined() ? full.att_drop.f32() : nullptr, full);
      run_backward(full, dres, ws, defer);
      return;
    }
    case Recompute::Full: {
      Record& full = *ws.recomputed;
      full.B = r.B, full.T = r.T, full.p = r.p;
      full.first_sample = r.first_sample, full.seed = r.seed, full.step = r.step;
      full.loss_scale = r.loss_scale, full.training = r.training;
      full.x = r.x;
      run_forward(r.x, nullptr, full, ws, false);
      run_backward(full, dres, ws, defer);
      if (defer) {  // W needs the matmuls' inputs, which live in the shared scratch
        const int64_t BT = static_cast<int64_t>(r.B) * r.T;
        auto keep = [&](Tensor& dst, const Tensor& src, int64_t width) {
          std::memcpy(dst.f32(), src.f32(), sizeof(float) * static_cast<size_t>(BT * width));
        };
        if (has_attention()) keep(defer->atty, full.atty, c_local_);  // (ln_1, ln_2: run_backward)
        if (has_mlp() && !moe_) keep(defer->fch, full.fch, mlp_local_);
      }
      return;
    }
  }
}

Block::Record::DeferredWeightGrads& Block::deferred_for(Record& r) const {
  const int64_t BT = static_cast<int64_t>(r.B) * r.T, C = cfg_.n_embd;
  if (!r.deferred || r.deferred->tokens != BT) {
    auto d = std::make_shared<Record::DeferredWeightGrads>();
    d->tokens = BT;
    auto make = [&](int64_t width, const char* name) {
      return Tensor::zeros({BT * width}, DType::F32, MemCategory::Activations, name);
    };
    const bool attn = has_attention(), mlp = has_mlp() && !moe_;  // (the MoE's are not deferred)
    if (mlp) {
      d->d_mproj = make(C, "block.deferred.d_mlp_proj");
      d->d_fc = make(mlp_local_, "block.deferred.d_fc");
    }
    if (attn) {
      d->d_aproj = make(C, "block.deferred.d_attn_proj");
      d->d_attn = make(3 * c_local_, "block.deferred.d_qkv");
    }
    if (recompute_ == Recompute::Full || sequence_) {  // the record has no whole ln_1, ln_2
      if (attn) d->ln1 = make(C, "block.deferred.ln_1");
      if (mlp) d->ln2 = make(C, "block.deferred.ln_2");
    }
    if (recompute_ == Recompute::Full) {
      if (attn) d->atty = make(c_local_, "block.deferred.atty");
      if (mlp) d->fch = make(mlp_local_, "block.deferred.fch");
    }
    r.deferred = std::move(d);
  }
  return *r.deferred;
}

void Block::backward_weight(Record& r) const {
  TESSERA_ASSERT(r.deferred != nullptr, "Block::backward_weight of h.", layer_,
                 " without a deferred backward");
  const Record::DeferredWeightGrads& d = *r.deferred;
  const int BT = r.B * r.T, C = cfg_.n_embd;
  const int Cl = static_cast<int>(c_local_), F = static_cast<int>(mlp_local_);
  auto g = [&](int i) { return ps_.grad_data(i); };
  // A matmul's input: the fp32 copy the BI pass kept, or the record's (fp32 or bf16).
  auto in = [](const Tensor& copy, const Tensor& rec) { return kept(copy.defined() ? copy : rec); };
  if (has_mlp() && !moe_) {  // an MoE block computed its MLP's gradients in backward already
    k::matmul_backward(nullptr, g(q_.mproj_w), g(q_.mproj_b), d.d_mproj.f32(), in(d.fch, r.fch),
                       nullptr, BT, F, C);
    k::matmul_backward(nullptr, g(q_.fc_w), g(q_.fc_b), d.d_fc.f32(), in(d.ln2, r.ln2), nullptr, BT,
                       C, F);
  }
  if (!has_attention()) return;
  k::matmul_backward(nullptr, g(q_.aproj_w), g(q_.aproj_b), d.d_aproj.f32(), in(d.atty, r.atty),
                     nullptr, BT, Cl, C);
  k::matmul_backward(nullptr, g(q_.attn_w), g(q_.attn_b), d.d_attn.f32(), in(d.ln1, r.ln1), nullptr,
                     BT, C, 3 * Cl);
}

void Block::run_backward(const Record& r, float* dres, Workspace& ws,
                         Record::DeferredWeightGrads* defer) const {
  const int B = r.B, T = r.T, BT = B * T, C = cfg_.n_embd;
  const int Cl = static_cast<int>(c_local_), F = static_cast<int>(mlp_local_);
  const int64_t n = static_cast<int64_t>(BT) * C;
  const TokenRange rows = token_range(split_, BT);  // dres holds these rows
  const int R = static_cast<int>(rows.size());
  const bool drop = r.p > 0.0f;
  auto p = [&](int i) { return ps_.param_data(i); };
  auto w = [&](int i) { return ps_.gemm_weight(i); };  // as the forward read them
  // Weight gradients now, or (zero-bubble BI) the output gradient kept for W.
  auto g = [&](int i) { return defer ? nullptr : ps_.grad_data(i); };
  auto keep = [&](Tensor Record::DeferredWeightGrads::*slot, const float* dout, int64_t width) {
    if (defer && (defer->*slot).defined())
      std::memcpy((defer->*slot).f32(), dout, sizeof(float) * static_cast<size_t>(BT * width));
  };
  auto g_ln = [&](int i) { return ps_.grad_data(i); };  // LayerNorms: always now
  float* dln = ws.dln.f32();
  // A reduce point's backward: the output gradient of this rank's rows (after the dropout's
  // backward, written where the rows go in ws.proj) on every token. reduce_from_tp's backward is
  // the identity: without sequence parallelism dres is complete on every rank.
  float* dy_rows = ws.proj.f32() + rows.place() * C;
  auto grad_to_tp = [&](const float* dy) {
    return sequence_ ? reduce_scatter_from_tp_backward(split_, dy, ws.proj.f32(), rows, C) : dy;
  };
  // A column-parallel input's gradient (partial on each rank), summed, on this rank's rows.
  auto grad_from_tp = [&](float* d) {
    return sequence_ ? gather_to_tp_backward(split_, d, d + rows.place() * C, rows, C)
                     : copy_to_tp_backward(split_, d, n);
  };
  // A column-parallel layer's input for its weight gradient: the record keeps only this rank's
  // rows of the LayerNorm output under sequence parallelism, so it is all-gathered again (bf16
  // rows widened first, exact, into their place of the gathered buffer).
  auto tp_input = [&](const Tensor& ln) -> k::GemmInput {
    if (!sequence_) return kept(ln);
    float* place = ws.gathered.f32() + rows.place() * C;
    if (ln.dtype() == DType::BF16)
      k::bf16_to_f32(place, ln.data<uint16_t>(), static_cast<int64_t>(R) * C);
    const float* slice = ln.dtype() == DType::BF16 ? place : ln.f32();
    return gather_to_tp(split_, slice, ws.gathered.f32(), rows, C);
  };
  // A kept input's fp32 values for the zero-bubble copy (which exists only where they are fp32).
  auto keep_input = [&](Tensor Record::DeferredWeightGrads::*slot, k::GemmInput in, int64_t width) {
    if (defer && (defer->*slot).defined()) {
      TESSERA_ASSERT(in.f32 != nullptr, "a zero-bubble copy of a bf16-kept input");
      std::memcpy((defer->*slot).f32(), in.f32, sizeof(float) * static_cast<size_t>(BT * width));
    }
  };

  // The residual stream between the halves (the MLP half's input).
  const float* x_attn = part_ == BlockPart::Whole ? r.x_attn.f32() : r.x;  // (unused: attention)

  // MLP branch.
  const float* dy = dres;
  if (has_mlp()) {
    if (drop) {
      k::dropout_backward(dy_rows, dres, r.mask_mlp.data<uint8_t>(), static_cast<int64_t>(R) * C,
                          r.p);
      dy = dy_rows;
    }
    dy = grad_to_tp(dy);
    if (moe_) {
      // dy: every token's output gradient (gathered under sequence parallelism); the input
      // gradient is complete on every tp rank: no reduction, this rank's rows of it.
      moe_->backward(*r.moe, dy, dln, *ws.moe);
      k::layernorm_backward(dres, g_ln(q_.ln2_w), g_ln(q_.ln2_b), dln + rows.begin * C, x_attn,
                            p(q_.ln2_w), r.ln2_mean.f32(), r.ln2_rstd.f32(), R, C);
    } else {
      float* dfch = ws.dfch.f32();
      keep(&Record::DeferredWeightGrads::d_mproj, dy, C);
      k::matmul_backward(dfch, g(q_.mproj_w), g(q_.mproj_b), dy, kept(r.fch), w(q_.mproj_w), BT, F,
                         C);
      k::gelu_backward(dfch, dfch, r.fc.f32(), static_cast<int64_t>(BT) * F);
      keep(&Record::DeferredWeightGrads::d_fc, dfch, F);
      const k::GemmInput ln2 = tp_input(r.ln2);
      keep_input(&Record::DeferredWeightGrads::ln2, ln2, C);
      k::matmul_backward(dln, g(q_.fc_w), g(q_.fc_b), dfch, ln2, w(q_.fc_w), BT, C, F);
      k::layernorm_backward(dres, g_ln(q_.ln2_w), g_ln(q_.ln2_b), grad_from_tp(dln), x_attn,
                            p(q_.ln2_w), r.ln2_mean.f32(), r.ln2_rstd.f32(), R, C);
    }
  }
  if (!has_attention()) return;

  // Attention branch.
  dy = dres;
  if (drop) {
    k::dropout_backward(dy_rows, dres, r.mask_attn.data<uint8_t>(), static_cast<int64_t>(R) * C,
                        r.p);
    dy = dy_rows;
  }
  dy = grad_to_tp(dy);
  keep(&Record::DeferredWeightGrads::d_aproj, dy, C);
  k::matmul_backward(ws.datty.f32(), g(q_.aproj_w), g(q_.aproj_b), dy, kept(r.atty), w(q_.aproj_w),
                     BT, Cl, C);
  k::attention_backward(ws.dqkv.f32(), ws.dscratch.f32(), ws.datty.f32(), r.att.f32(),
                        drop ? r.att_drop.f32() : nullptr, r.qkv.f32(), B, T, Cl, heads_local_,
                        r.p);
  keep(&Record::DeferredWeightGrads::d_attn, ws.dqkv.f32(), 3 * Cl);
  const k::GemmInput ln1 = tp_input(r.ln1);
  keep_input(&Record::DeferredWeightGrads::ln1, ln1, C);
  k::matmul_backward(dln, g(q_.attn_w), g(q_.attn_b), ws.dqkv.f32(), ln1, w(q_.attn_w), BT, C,
                     3 * Cl);
  k::layernorm_backward(dres, g_ln(q_.ln1_w), g_ln(q_.ln1_b), grad_from_tp(dln), r.x, p(q_.ln1_w),
                        r.ln1_mean.f32(), r.ln1_rstd.f32(), R, C);
}

}  // namespace tessera::nn
