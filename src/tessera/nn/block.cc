#include "tessera/nn/block.h"

#include "tessera/comm/launch.h"
#include "tessera/core/error.h"
#include "tessera/nn/attention.h"
#include "tessera/nn/gelu_mlp.h"
#include "tessera/nn/moe_mlp.h"
#include "tessera/nn/rotary_attention.h"
#include "tessera/nn/swiglu_mlp.h"
#include "tessera/nn/swiglu_moe_mlp.h"

namespace tessera::nn {

BlockPass block_pass(const StepContext& ctx, const Batch& b, float dropout) {
  BlockPass p;
  p.B = b.B;
  p.T = b.T;
  p.first_sample = b.first_sample;
  p.seq_len = b.length();
  p.positions = b.positions;
  p.p = ctx.training ? dropout : 0.0f;
  p.seed = ctx.seed;
  p.step = ctx.step;
  p.loss_scale = ctx.loss_scale;
  p.training = ctx.training;
  return p;
}

BlockWorkspace::BlockWorkspace() = default;
BlockWorkspace::~BlockWorkspace() = default;
BlockWorkspace::BlockWorkspace(BlockWorkspace&&) noexcept = default;
BlockWorkspace& BlockWorkspace::operator=(BlockWorkspace&&) noexcept = default;

Block::Block(ParameterSet& ps, const GPTConfig& cfg, int layer, TensorSplit split,
             ExpertSplit expert_split, ContextSplit context, Recompute recompute,
             ParameterSet* experts, BlockPart part, bool bf16_gemm_inputs)
    : Block(ps, cfg, layer, split, expert_split, &context, nullptr, recompute, experts, part,
            bf16_gemm_inputs) {}

Block::Block(ParameterSet& ps, const GPTConfig& cfg, int layer, TensorSplit split,
             ExpertSplit expert_split, Recompute recompute, ParameterSet* experts, BlockPart part,
             bool bf16_gemm_inputs)
    : Block(ps, cfg, layer, split, expert_split, nullptr, comm::one_rank(), recompute, experts,
            part, bf16_gemm_inputs) {}

Block::Block(ParameterSet& ps, const GPTConfig& cfg, int layer, TensorSplit split,
             ExpertSplit expert_split, const ContextSplit* context_split,
             std::unique_ptr<comm::Communicator> own_context, Recompute recompute,
             ParameterSet* experts, BlockPart part, bool bf16_gemm_inputs)
    : own_context_(std::move(own_context)),
      cfg_(cfg),
      layer_(layer),
      part_(part),
      split_(split),
      recompute_(recompute) {
  const ContextSplit context = context_split ? *context_split : ContextSplit(*own_context_);
  rows_per_sequence_ = context.rows_per_sequence(cfg.block_size);
  if (part != BlockPart::Mlp) {
    if (cfg.llama())
      attention_ = std::make_unique<RotaryAttention>(ps, cfg, layer, split, context, recompute,
                                                     bf16_gemm_inputs);
    else
      attention_ =
          std::make_unique<Attention>(ps, cfg, layer, split, context, recompute, bf16_gemm_inputs);
  }
  if (part == BlockPart::Attention) return;
  // The MoE's experts read fp32 inputs (their GEMM-only inputs are not kept in bf16).
  ParameterSet& eps = experts ? *experts : ps;
  if (cfg.moe.is_moe_layer(layer) && cfg.llama())
    mlp_ = std::make_unique<SwigluMoeMlp>(ps, eps, cfg, layer, split, expert_split, context,
                                          recompute);
  else if (cfg.moe.is_moe_layer(layer))
    mlp_ = std::make_unique<MoeMlp>(ps, eps, cfg, layer, split, expert_split, context, recompute);
  else if (cfg.llama())
    mlp_ = std::make_unique<SwigluMlp>(ps, cfg, layer, split, context, recompute, bf16_gemm_inputs);
  else
    mlp_ = std::make_unique<GeluMlp>(ps, cfg, layer, split, context, recompute, bf16_gemm_inputs);
}

int Block::heads_local() const {
  return cfg_.n_head / split_.size();
}

Block::Record Block::make_record(int max_batch, Allocator& alloc,
                                 std::vector<NamedActivation>* list) const {
  Record r;
  if (attention_) r.attention = attention_->make_record(max_batch, alloc, list);
  if (attention_ && mlp_ && recompute_ != Recompute::Full)
    r.x_attn = ActivationAllocator(alloc, token_range(split_, max_batch * rows_per_sequence_).per,
                                   list, split_.sequence_parallel())(
        "h." + std::to_string(layer_) + ".x_attn", cfg_.n_embd);
  if (mlp_) r.mlp = mlp_->make_record(max_batch, alloc, list);
  return r;
}

Block::Workspace Block::make_workspace(int max_batch, Allocator& alloc) const {
  const int64_t BT = max_batch * rows_per_sequence_;
  const int64_t C = cfg_.n_embd, t = split_.size();
  ActivationAllocator a(alloc, BT, nullptr);
  ActivationAllocator padded(alloc, token_range(split_, BT).padded(), nullptr);
  Workspace ws;
  ws.proj = padded("block.proj", C);
  ws.dln = padded("block.d_ln", C);
  if (split_.sequence_parallel()) ws.gathered = padded("block.gathered_ln", C);
  ws.datty = a("block.d_atty", C / t);
  ws.dqkv = a("block.d_qkv", 3 * C / t);
  ws.dfch = a("block.d_fc", cfg_.mlp_hidden() / t);
  complete_workspace(ws, max_batch, alloc);
  return ws;
}

void Block::complete_workspace(Workspace& ws, int max_batch, Allocator& alloc) const {
  if (recompute_ == Recompute::Full && part_ == BlockPart::Whole && !ws.x_attn.defined())
    ws.x_attn = ActivationAllocator(alloc, token_range(split_, max_batch * rows_per_sequence_).per,
                                    nullptr)("block.recomputed_x_attn", cfg_.n_embd);
  if (attention_) attention_->reserve(ws, max_batch, alloc);
  if (mlp_) mlp_->reserve(ws, max_batch, alloc);
}

void Block::forward(const StepContext& ctx, const Batch& b, const float* x, float* y, Record& r,
                    Workspace& ws) const {
  r.x = x;
  r.pass = block_pass(ctx, b, cfg_.dropout);
  if (!mlp_) {  // an attention half
    attention_->forward(r.pass, x, y, *r.attention, ws);
    return;
  }
  if (!attention_) {  // an MLP half
    mlp_->forward(r.pass, x, y, *r.mlp, ws);
    return;
  }
  // The residual stream between the branches: kept in the record, or scratch under Full.
  float* x_attn = recompute_ == Recompute::Full ? ws.x_attn.f32() : r.x_attn.f32();
  attention_->forward(r.pass, x, x_attn, *r.attention, ws);
  mlp_->forward(r.pass, x_attn, y, *r.mlp, ws);
}

void Block::backward(Record& r, float* dres, Workspace& ws, bool defer_weights) const {
  TESSERA_ASSERT(r.pass.B > 0 && r.x != nullptr, "Block::backward of h.", layer_,
                 " without a forward");
  // The MLP's input: the record's residual stream (a whole block), or the half's input.
  const float* x_attn = !attention_                     ? r.x
                        : recompute_ == Recompute::Full ? ws.x_attn.f32()
                                                        : r.x_attn.f32();
  if (recompute_ == Recompute::Full) {  // the forward again, into the workspace
    if (attention_) attention_->recompute(r.pass, r.x, mlp_ ? ws.x_attn.f32() : nullptr, ws);
    if (mlp_) mlp_->recompute(r.pass, x_attn, ws);
  }
  if (mlp_) mlp_->backward(r.pass, x_attn, *r.mlp, dres, ws, defer_weights);
  if (attention_) attention_->backward(r.pass, r.x, *r.attention, dres, ws, defer_weights);
}

size_t Block::deferred_bytes(int64_t tokens) const {
  size_t bytes = mlp_ ? mlp_->deferred_bytes(tokens) : 0;
  if (attention_)
    bytes += allocated_bytes([&](Allocator* a) { return attention_->make_deferred(tokens, a); });
  return bytes;
}

void Block::backward_weight(Record& r) const {
  if (mlp_) mlp_->backward_weight(r.pass, *r.mlp);
  if (attention_) attention_->backward_weight(r.pass, *r.attention);
}

}  // namespace tessera::nn
