#include "tessera/nn/attention_branch.h"

#include <cstring>
#include <utility>

#include "tessera/core/error.h"
#include "tessera/core/philox.h"
#include "tessera/kernels/flash_attention.h"
#include "tessera/kernels/parallel_rows.h"
#include "tessera/nn/context_parallel_attention.h"

namespace tessera::nn {

namespace k = tessera::kernels;

namespace {

// The fused kernel's view of a micro-batch's qkv: causal self-attention over each sequence's T
// rows, q, k and v strided views of the qkv rows; the dropout mask at the single-device
// coordinates (sample, global head, query, key).
k::FlashAttention flash_call(const BlockPass& mb, const float* qkv, const k::AttentionHeads& heads,
                             int head_offset, int n_head, uint64_t drop_site) {
  k::FlashAttention a;
  a.B = mb.B;
  a.Tq = a.Tk = mb.T;
  a.heads = heads;
  a.q = qkv;
  a.k = qkv + int64_t{heads.q} * heads.size;
  a.v = a.k + int64_t{heads.kv} * heads.size;
  a.ldq = a.ldkv = heads.row_width();
  a.causal = true;
  if (mb.p > 0.0f)
    a.drop = k::AttentionDropout{
        mb.p, mb.seed, mix_stream(mb.step, drop_site), mb.first_sample, head_offset, n_head, 0};
  return a;
}

}  // namespace

void AttentionBranch::allocate_core(AttentionRecord& r, int max_batch, Allocator& alloc,
                                    std::vector<NamedActivation>* list) const {
  ActivationAllocator a(alloc, max_batch * core_.rows_per_sequence, list);
  r.atty = a(core_.prefix + "atty", atty_width());
  r.lse = a(core_.prefix + "attn.lse", core_.heads.q);  // [B, heads, T]: heads floats per token
}

AttentionRecord AttentionBranch::make_record(int max_batch, Allocator& alloc,
                                             std::vector<NamedActivation>* list) const {
  AttentionRecord r;
  if (recompute_ == Recompute::Full) return r;
  allocate_rest(r, max_batch, alloc, list, core_.bf16_gemm_inputs ? DType::BF16 : DType::F32);
  if (recompute_ == Recompute::None) allocate_core(r, max_batch, alloc, list);
  return r;
}

void AttentionBranch::reserve(BlockWorkspace& ws, int max_batch, Allocator& alloc) const {
  if (!ws.delta.defined())
    ws.delta = ActivationAllocator(alloc, max_batch * core_.rows_per_sequence, nullptr)(
        "block.attention_delta", core_.heads.q);
  if (recompute_ == Recompute::None || ws.attention) return;
  ws.attention = std::make_unique<AttentionRecord>();
  if (recompute_ == Recompute::Full)
    allocate_rest(*ws.attention, max_batch, alloc, nullptr, DType::F32);
  allocate_core(*ws.attention, max_batch, alloc, nullptr);
}

ContextAttention AttentionBranch::context_call(const BlockPass& mb, BlockWorkspace& ws) const {
  ContextAttention a;
  // The MLP's gradient scratch is dead while the core runs (a block's MLP backward is done before
  // its attention's begins, its forward begins after the attention's ends; zero-bubble W passes
  // read their own copies), and so is the core's row term: the ring's blocks and delta live there.
  if (ws.dfch.defined() && ws.dfch.dtype() == DType::F32)
    a.lent = ws.dfch.f32(), a.lent_floats = ws.dfch.numel();
  if (ws.delta.defined()) {
    TESSERA_ASSERT(ws.delta.numel() >= mb.tokens() * core_.heads.q,
                   "the workspace's attention row term is smaller than the micro-batch's");
    a.lent_delta = ws.delta.f32();
  }
  a.cp = &context_;
  a.B = mb.B, a.T = mb.T, a.seq_len = mb.seq_len, a.positions = mb.positions;
  a.heads = core_.heads;
  a.head_offset = core_.head_offset, a.n_head = core_.n_head;
  if (mb.p > 0.0f)
    a.drop = k::AttentionDropout{
        mb.p, mb.seed, mix_stream(mb.step, core_.drop_site), mb.first_sample, 0, 0, 0};
  a.label = core_.prefix.substr(0, core_.prefix.size() - 1);  // "h.3"
  return a;
}

void AttentionBranch::core_forward(const BlockPass& mb, const float* qkv, float* atty, float* lse,
                                   BlockWorkspace& ws) const {
  if (mb.split() && context_.size() > 1)
    return context_attention_forward(context_call(mb, ws), qkv, atty, lse);
  const k::FlashAttention a =
      flash_call(mb, qkv, core_.heads, core_.head_offset, core_.n_head, core_.drop_site);
  k::flash_attention_forward(a, atty, atty_width(), lse);
}

void AttentionBranch::core_backward(const BlockPass& mb, const AttentionRecord& r,
                                    const float* datty, float* dqkv, BlockWorkspace& ws) const {
  if (mb.split() && context_.size() > 1)
    return context_attention_backward(context_call(mb, ws), r.qkv.f32(), r.atty.f32(), r.lse.f32(),
                                      datty, dqkv);
  const k::AttentionHeads& h = core_.heads;
  const k::FlashAttention a =
      flash_call(mb, r.qkv.f32(), h, core_.head_offset, core_.n_head, core_.drop_site);
  const int64_t W = h.row_width(), Cq = atty_width();
  k::parallel_rows(mb.tokens(), W, [&](int64_t first, int64_t end) {  // the kernel accumulates
    std::memset(dqkv + first * W, 0, sizeof(float) * static_cast<size_t>((end - first) * W));
  });
  float* delta = ws.delta.f32();
  k::flash_attention_delta(delta, r.atty.f32(), Cq, datty, Cq, mb.B, mb.T, h);
  float* dk = dqkv + int64_t{h.q} * h.size;
  k::flash_attention_backward(a, datty, Cq, r.lse.f32(), delta, dqkv, W, dk,
                              dk + int64_t{h.kv} * h.size, W);
}

void AttentionBranch::forward(const BlockPass& mb, const float* x, float* y, AttentionRecord& r,
                              BlockWorkspace& ws) const {
  switch (recompute_) {
    case Recompute::None:
      run_forward(mb, x, y, r, ws);
      return;
    case Recompute::Selective: {  // the core's output goes to the workspace and is dropped
      AttentionRecord& scratch = *ws.attention;
      std::swap(r.atty, scratch.atty), std::swap(r.lse, scratch.lse);
      run_forward(mb, x, y, r, ws);
      std::swap(r.atty, scratch.atty), std::swap(r.lse, scratch.lse);
      return;
    }
    case Recompute::Full:  // everything goes to the workspace and is dropped
      run_forward(mb, x, y, *ws.attention, ws);
      return;
  }
}

void AttentionBranch::recompute(const BlockPass& mb, const float* x, float* y,
                                BlockWorkspace& ws) const {
  TESSERA_ASSERT(recompute_ == Recompute::Full && ws.attention,
                 "recompute() of an attention without full recomputation");
  run_forward(mb, x, y, *ws.attention, ws);
}

AttentionRecord::Deferred& AttentionBranch::deferred_for(const BlockPass& mb,
                                                         AttentionRecord& r) const {
  return nn::deferred_for(r, mb.tokens(), [&](int64_t n) { return make_deferred(n, nullptr); });
}

void AttentionBranch::backward(const BlockPass& mb, const float* x, AttentionRecord& r, float* dres,
                               BlockWorkspace& ws, bool defer) const {
  AttentionRecord::Deferred* d = defer ? &deferred_for(mb, r) : nullptr;
  // W needs atty, which lives in the shared scratch under recomputation.
  auto keep_atty = [&](const AttentionRecord& from) {
    if (d)
      std::memcpy(d->atty.f32(), from.atty.f32(),
                  sizeof(float) * static_cast<size_t>(mb.tokens() * atty_width()));
  };
  switch (recompute_) {
    case Recompute::None:
      run_backward(mb, x, r, dres, ws, d);
      return;
    case Recompute::Selective: {  // the core again, from the kept qkv
      AttentionRecord& scratch = *ws.attention;
      core_forward(mb, r.qkv.f32(), scratch.atty.f32(), scratch.lse.f32(), ws);
      std::swap(r.atty, scratch.atty), std::swap(r.lse, scratch.lse);
      run_backward(mb, x, r, dres, ws, d);
      std::swap(r.atty, scratch.atty), std::swap(r.lse, scratch.lse);
      keep_atty(scratch);
      return;
    }
    case Recompute::Full: {  // the block recomputed the forward into the workspace
      const AttentionRecord& full = *ws.attention;
      run_backward(mb, x, full, dres, ws, d);
      keep_atty(full);  // (the norm: run_backward kept it)
      return;
    }
  }
}

}  // namespace tessera::nn
