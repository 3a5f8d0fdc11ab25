#include "tessera/nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tessera/comm/launch.h"
#include "tessera/core/error.h"
#include "tessera/kernels/attention.h"
#include "tessera/nn/gpt_costs.h"

namespace tessera::nn {

GPT::GPT(const GPTConfig& cfg, int max_batch, Allocator& alloc, const GPTLayout& layout)
    : GPT(cfg, max_batch, alloc, layout, comm::one_rank()) {}

GPT::GPT(const GPTConfig& cfg, int max_batch, Allocator& alloc, const GPTLayout& layout,
         std::unique_ptr<comm::Communicator> one_rank)
    : GPT(cfg, max_batch, alloc, layout, *one_rank, *one_rank, *one_rank) {
  one_rank_ = std::move(one_rank);
}

GPT::GPT(const GPTConfig& cfg, int max_batch, Allocator& alloc, const GPTLayout& layout,
         comm::Communicator& tensor_group, comm::Communicator& expert_group)
    : GPT(cfg, max_batch, alloc, layout, tensor_group, expert_group, comm::one_rank()) {}

GPT::GPT(const GPTConfig& cfg, int max_batch, Allocator& alloc, const GPTLayout& layout,
         comm::Communicator& tensor_group, comm::Communicator& expert_group,
         std::unique_ptr<comm::Communicator> own_context)
    : GPT(cfg, max_batch, alloc, layout, tensor_group, expert_group, *own_context) {
  own_context_ = std::move(own_context);
}

GPT::GPT(const GPTConfig& cfg, int max_batch, Allocator& alloc, const GPTLayout& layout,
         comm::Communicator& tensor_group, comm::Communicator& expert_group,
         comm::Communicator& context_group)
    : cfg_(cfg),
      layout_(layout),
      tp_(tensor_group, layout.sequence_parallel, layout.activation_wire),
      ep_(expert_group),
      cp_(context_group, layout.cp_comm),
      max_batch_(max_batch),
      alloc_(alloc) {
  validate(cfg_);
  TESSERA_CHECK_AS(ConfigError, max_batch > 0, "max_batch must be positive, got ", max_batch);
  TESSERA_CHECK_AS(ConfigError, layout.unit_alignment > 0 && layout.unit_alignment % 16 == 0,
                   "unit alignment must be a positive multiple of 16, got ", layout.unit_alignment);
  const int L = cfg_.n_layer;
  if (layout_.gemm.precision == kernels::Precision::BF16)
    layout_.gemm.bf16 = kernels::resolve_bf16_gemm(layout_.gemm.bf16);  // ConfigError if refused
  first_unit_ = layout.first_unit;
  last_unit_ = layout.last_unit < 0 ? L + 1 : layout.last_unit;
  TESSERA_CHECK_AS(
      ConfigError, 0 <= first_unit_ && first_unit_ <= last_unit_ && last_unit_ <= L + 1,
      "a stage holds units [", first_unit_, ", ", last_unit_,
      "] but the model has units 0 (embedding), 1..", L, " (blocks) and ", L + 1, " (head)");
  TESSERA_CHECK_AS(
      ConfigError,
      (!layout.starts_mid_block || (1 <= first_unit_ && first_unit_ <= L)) &&
          (!layout.ends_mid_block || (1 <= last_unit_ && last_unit_ <= L)) &&
          !(layout.starts_mid_block && layout.ends_mid_block && first_unit_ == last_unit_),
      "a stage can begin or end mid-block only at a block (units 1..", L,
      "), and not both in one block; got units [", first_unit_,
      layout.starts_mid_block ? " (MLP half)" : "", ", ", last_unit_,
      layout.ends_mid_block ? " (attention half)" : "", "]");
  first_block_ = std::max(first_unit_, 1) - 1;
  const int last_block = std::min(last_unit_, L) - 1;  // inclusive, 0-based layer index
  const TensorSplit& tp = tp_;
  const bool replicas_count = tp.rank() == 0;  // tensor-parallel replicas count on rank 0

  TESSERA_CHECK_AS(ConfigError,
                   layout.expert_unit_alignment > 0 && layout.expert_unit_alignment % 16 == 0,
                   "expert unit alignment must be a positive multiple of 16, got ",
                   layout.expert_unit_alignment);
  auto end_unit = [&] {
    params_.pad_to_multiple(layout.unit_alignment);
    unit_begin_.push_back(params_.numel());
    expert_params_.pad_to_multiple(layout.expert_unit_alignment);
    expert_unit_begin_.push_back(expert_params_.numel());
  };
  unit_begin_.push_back(0);
  expert_unit_begin_.push_back(0);
  if (first_unit_ == 0) {
    embedding_.emplace(params_, cfg_, tp, rows_per_sequence());
    end_unit();
  }
  blocks_.reserve(static_cast<size_t>(std::max(0, last_block - first_block_ + 1)));
  for (int l = first_block_; l <= last_block; ++l) {
    BlockPart part = BlockPart::Whole;
    if (l == first_block_ && layout.starts_mid_block) part = BlockPart::Mlp;
    if (l == last_block && layout.ends_mid_block) part = BlockPart::Attention;
    blocks_.emplace_back(
        params_, cfg_, l, tp, ep_, cp_, layout.recompute, &expert_params_, part,
        layout.bf16_gemm_inputs && layout.gemm.precision == kernels::Precision::BF16);
    end_unit();
  }
  if (last_unit_ == L + 1) {
    head_.emplace(params_, cfg_, embedding_ ? embedding_->wte() : -1, tp, rows_per_sequence());
    end_unit();
  }
  // Parameter groups: replicated tensor-parallel copies count in the norm once; the two copies of
  // a tied wte on different stages are summed over the embedding group and counted once.
  // (The modules mark the sequence-parallel partial sums, GradReduction::over_tensor_parallel.)
  for (int i = 0; i < params_.size(); ++i) {
    GradReduction r = params_.infos()[i].reduction;
    r.counts_in_norm = !params_.infos()[i].tp_replicated() || replicas_count;
    params_.set_reduction(i, r);
  }
  if (embedding_ && !head_ && cfg_.tie_embeddings) {
    GradReduction r = params_.infos()[embedding_->wte()].reduction;
    r.over_embedding_group = true;
    params_.set_reduction(embedding_->wte(), r);
  }
  if (head_ && head_->owns_wte()) {
    GradReduction r = params_.infos()[head_->wte()].reduction;
    r.over_embedding_group = true;
    r.counts_in_norm = false;  // the first stage's copy counts
    params_.set_reduction(head_->wte(), r);
  }
  for (int i = 0; i < expert_params_.size(); ++i) {  // experts are whole on every tp rank
    GradReduction r;
    r.counts_in_norm = replicas_count;
    expert_params_.set_reduction(i, r);
  }
  const bool bf16_copies = layout.full_params &&
                           layout_.gemm.precision == kernels::Precision::BF16 &&
                           keeps_weight_copies(layout.bf16_weight_copies,
                                               layout_.gemm.bf16 == kernels::Bf16Gemm::OneDnn);
  params_.materialize(alloc_, layout.full_params, layout.full_grads, bf16_copies);
  expert_params_.materialize(alloc_, layout.full_params, layout.full_grads, bf16_copies);

  const TokenRange rows = token_range(tp, max_batch_ * rows_per_sequence());
  if (!blocks_.empty()) {
    ws_ = blocks_.front().make_workspace(max_batch_, alloc_);
    for (const Block& b : blocks_) b.complete_workspace(ws_, max_batch_, alloc_);
  } else  // the head's backward scratch, the sequence-parallel embedding's
    ws_.dln = Tensor::zeros({rows.padded() * cfg_.n_embd}, DType::F32, MemCategory::Activations,
                            "block.d_ln", &alloc_);
  dres_ = Tensor::zeros({rows.per * cfg_.n_embd}, DType::F32, MemCategory::Activations,
                        "d_residual", &alloc_);
}

void GPT::initialize(uint64_t seed) {
  params_.initialize(seed);
  expert_params_.initialize(seed);
}

std::vector<const MixtureOfExperts*> GPT::moe_layers() const {
  std::vector<const MixtureOfExperts*> out;
  for (const Block& b : blocks_)
    if (b.moe()) out.push_back(b.moe());
  return out;
}

size_t GPT::deferred_bytes(int B, int T) const {
  size_t bytes = 0;
  for (const Block& b : blocks_) bytes += b.deferred_bytes(static_cast<int64_t>(B) * T);
  return bytes;
}

void GPT::reset_moe_stats() {
  for (const MixtureOfExperts* m : moe_layers()) m->reset_stats();
}

int GPT::tied_unit(int u) const {
  return u == cfg_.n_layer + 1 && head_ && head_->tied() && !head_->owns_wte() ? 0 : -1;
}

void GPT::hook(void (UnitHooks::*f)(int), int unit) {
  hooks_.call(f, unit);
}

void GPT::hook_reverse(void (UnitHooks::*f)(int), int unit) {
  hooks_.call_reverse(f, unit);
}

std::unique_ptr<StageRecord> GPT::make_record() {
  auto rec = std::make_unique<Record>();
  const TensorSplit& tp = tp_;
  const TokenRange rows = token_range(tp, max_batch_ * rows_per_sequence());
  ActivationAllocator a(alloc_, rows.per, &rec->named, tp.sequence_parallel());
  if (embedding_) rec->embedding = embedding_->make_record(max_batch_, alloc_);
  rec->hidden.push_back(a(has_embedding() ? "x0" : "stage_input", cfg_.n_embd));
  for (const Block& b : blocks_) {
    rec->blocks.push_back(b.make_record(max_batch_, alloc_, &rec->named));
    const bool attention_half = b.part() == BlockPart::Attention;
    rec->hidden.push_back(
        a("h." + std::to_string(b.layer()) + (attention_half ? ".x_attn" : ".x_out"), cfg_.n_embd));
  }
  if (head_) rec->head = head_->make_record(max_batch_, alloc_, &rec->named);
  return rec;
}

void GPT::check_batch(const Batch& b) const {
  TESSERA_CHECK_AS(ShapeError, b.B > 0 && b.B <= max_batch_, "batch size B=", b.B,
                   " must be in [1, ", max_batch_, "] (the model's max_batch)");
  // Records hold max_batch sequences of rows_per_sequence rows (a cp rank's share of block_size).
  TESSERA_CHECK_AS(ShapeError, int64_t{b.B} * b.T <= int64_t{max_batch_} * rows_per_sequence(),
                   "a batch of ", b.B, " x ", b.T, " rows does not fit the model's records of ",
                   max_batch_, " x ", rows_per_sequence(),
                   " rows (max_batch sequences of the block_size / cp rows a context-parallel "
                   "rank holds); whole sequences of a context-parallel model need max_batch >= cp");
  TESSERA_CHECK_AS(ShapeError, b.T > 0 && b.length() <= cfg_.block_size,
                   "sequence length T=", b.length(), " must be in [1, ", cfg_.block_size,
                   "] (block_size)");
  // Context parallelism: this rank's share of sequences split over the model's cp group.
  TESSERA_CHECK_AS(
      ShapeError,
      b.split() ? cp_.size() > 1 && b.length() == int64_t{b.T} * cp_.size() : b.length() == b.T,
      "a batch of ", b.T, " rows of each sequence of ", b.length(), " tokens",
      b.split() ? " (split)" : " (whole, no positions)",
      " does not fit a model whose context-parallel group has ", cp_.size(),
      " ranks: a split batch holds length / cp rows of each sequence at their "
      "positions, a whole one every row");
  TESSERA_CHECK_AS(ShapeError, !has_embedding() || b.tokens != nullptr, "batch has no tokens");
  const int V = cfg_.vocab_size;
  for (int i = 0; i < b.B * b.T; ++i) {
    if (b.tokens != nullptr) {
      const int32_t id = b.tokens[i];
      TESSERA_CHECK_AS(ConfigError, id >= 0 && id < V, "token id ", id, " at sample ",
                       b.first_sample + i / b.T, " (row ", i / b.T, "), position ", i % b.T,
                       " is outside the vocabulary [0, ", V, ")");
    }
    if (b.targets != nullptr) {
      const int32_t tg = b.targets[i];
      TESSERA_CHECK_AS(ConfigError, tg >= -1 && tg < V, "target id ", tg, " at sample ",
                       b.first_sample + i / b.T, " (row ", i / b.T, "), position ", i % b.T,
                       " is outside [-1, ", V, ")");
    }
  }
}

double GPT::forward(const StepContext& ctx, const Batch& b, StageRecord& stage_rec) {
  Record& rec = record(stage_rec);
  check_batch(b);
  kernels::GemmModeScope precision(layout_.gemm);
  rec.B = b.B;
  rec.T = b.T;
  if (embedding_) {
    hook(&UnitHooks::before_forward, 0);
    embedding_->forward(ctx, b, rec.hidden[0].f32(), *rec.embedding, ws_.dln.f32());
    hook_reverse(&UnitHooks::after_forward, 0);
  }
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const int unit = blocks_[i].layer() + 1;
    hook(&UnitHooks::before_forward, unit);
    blocks_[i].forward(ctx, b, rec.hidden[i].f32(), rec.hidden[i + 1].f32(), rec.blocks[i], ws_);
    hook_reverse(&UnitHooks::after_forward, unit);
  }
  if (!head_) return 0.0;
  hook(&UnitHooks::before_forward, cfg_.n_layer + 1);
  const double loss = head_->forward(ctx, b, rec.hidden.back().f32(), *rec.head);
  hook_reverse(&UnitHooks::after_forward, cfg_.n_layer + 1);
  return loss;
}

void GPT::backward(StageRecord& rec, const float* dout, const BackwardPass& pass) {
  backward_pass(record(rec), dout, false, pass);
}

void GPT::backward_input(StageRecord& rec, const float* dout) {
  backward_pass(record(rec), dout, true, BackwardPass{});
}

const float* GPT::input_grad(const StageRecord& rec) const {
  TESSERA_ASSERT(!has_embedding(), "input_grad() of the first stage, which has no input");
  return record(rec).hidden.front().f32();
}

void GPT::backward_pass(Record& rec, const float* dout, bool split, const BackwardPass& pass) {
  TESSERA_CHECK(rec.B > 0, "backward() without a preceding forward()");
  kernels::GemmModeScope precision(layout_.gemm);
  const int64_t n = hidden_elems(rec.B, rec.T);
  float* dres = dres_.f32();
  // After a unit's part of the pass: its gradients are final (whole backward) or wait for W.
  auto after = [&](int unit) {
    if (split)
      hook_reverse(&UnitHooks::after_backward_input, unit);
    else
      hooks_.after_backward(unit, pass);
  };
  if (head_) {
    hook(&UnitHooks::before_backward, cfg_.n_layer + 1);
    head_->backward(*rec.head, dres, ws_.dln.f32(), split);
    after(cfg_.n_layer + 1);
  } else {
    TESSERA_ASSERT(dout != nullptr, "a stage without the head needs the output gradient");
    std::memcpy(dres, dout, sizeof(float) * static_cast<size_t>(n));
  }
  for (size_t i = blocks_.size(); i-- > 0;) {
    const int unit = blocks_[i].layer() + 1;
    hook(&UnitHooks::before_backward, unit);
    blocks_[i].backward(rec.blocks[i], dres, ws_, split);
    after(unit);
  }
  if (embedding_) {  // all of its gradients are weight gradients, and cheap: always now
    hook(&UnitHooks::before_backward, 0);
    embedding_->backward(*rec.embedding, dres, ws_.dln.f32());
    after(0);
  } else {  // dL/d input, in the record (its input is not read again)
    std::memcpy(rec.hidden.front().f32(), dres, sizeof(float) * static_cast<size_t>(n));
  }
}

void GPT::backward_weight(StageRecord& stage_rec, const BackwardPass& pass) {
  Record& rec = record(stage_rec);
  kernels::GemmModeScope precision(layout_.gemm);
  if (head_) {
    hook(&UnitHooks::before_backward_weight, cfg_.n_layer + 1);
    head_->backward_weight(*rec.head);
    hooks_.after_backward(cfg_.n_layer + 1, pass);
  }
  for (size_t i = blocks_.size(); i-- > 0;) {
    const int unit = blocks_[i].layer() + 1;
    hook(&UnitHooks::before_backward_weight, unit);
    blocks_[i].backward_weight(rec.blocks[i]);
    hooks_.after_backward(unit, pass);
  }
  if (embedding_) {
    hook(&UnitHooks::before_backward_weight, 0);
    hooks_.after_backward(0, pass);
  }
}

int64_t GPT::hidden_elems(int B, int T) const {
  return token_range(tp_, static_cast<int64_t>(B) * T).per * cfg_.n_embd;
}

double GPT::forward(const Batch& b, const StepContext& ctx) {
  TESSERA_CHECK(has_embedding() && has_head(),
                "the single-record forward needs the whole model on this rank");
  return forward(ctx, b, shared());
}

void GPT::backward() {
  TESSERA_CHECK(shared_if_made() != nullptr, "backward() without a preceding forward()");
  backward(shared(), nullptr);
}

const float* GPT::logits() const {
  TESSERA_CHECK(shared_if_made() != nullptr, "logits() before forward()");
  return shared_if_made()->head->logits.f32();
}

std::vector<float> GPT::full_logits_row(int64_t row) const {
  TESSERA_CHECK(shared_if_made() != nullptr && head_, "full_logits_row() before forward()");
  const VocabRange v = head_->vocab();
  std::vector<float> out(static_cast<size_t>(cfg_.vocab_size), 0.0f);
  const float* slice = shared_if_made()->head->logits.f32() + row * v.size();
  std::copy(slice, slice + v.size(), out.begin() + v.begin);
  sum_over_tp(tp_, out.data(), cfg_.vocab_size);  // disjoint slices: exact
  return out;
}

const float* GPT::losses() const {
  TESSERA_CHECK(shared_if_made() != nullptr, "losses() before forward()");
  return shared_if_made()->head->losses.f32();
}

std::string GPT::decode_unsupported() const {
  if (!has_embedding() || !has_head())
    return "the whole model on one rank (this is a pipeline stage, units " +
           std::to_string(first_unit_) + ".." + std::to_string(last_unit_) + ")";
  if (tp_.size() > 1)
    return "a model without tensor parallelism (this rank holds 1/" + std::to_string(tp_.size()) +
           " of it)";
  if (ep_.size() > 1)
    return "a model without expert parallelism (its experts are split over " +
           std::to_string(ep_.size()) + " ranks)";
  if (!layout_.full_params) return "the parameters resident on the rank (not ZeRO-3)";
  if (cfg_.moe.enabled() && cfg_.moe.capacity_factor > 0.0f)
    return "a dropless mixture of experts (this one has capacity factor " +
           std::to_string(cfg_.moe.capacity_factor) +
           ": which tokens an expert drops depends on the whole sequence)";
  return "";
}

KvCache GPT::make_kv_cache(int positions) {
  const std::string why = decode_unsupported();
  TESSERA_CHECK_AS(ConfigError, why.empty(), "generation with a key/value cache needs ", why,
                   "; generate with the full forward instead");
  const int P = positions == 0 ? cfg_.block_size : positions;
  TESSERA_CHECK_AS(ConfigError, P >= 1 && P <= cfg_.block_size, "a key/value cache of ", P,
                   " positions: it holds 1 to block_size (", cfg_.block_size, ") positions");
  const int64_t C = cfg_.n_embd, D = cfg_.head_dim();
  const int64_t Hq = cfg_.n_head, Hkv = cfg_.llama() ? cfg_.kv_heads() : cfg_.n_head;
  auto make = [&](int64_t n, const std::string& name) {
    return Tensor::zeros({n}, DType::F32, MemCategory::Activations, name, &alloc_);
  };
  KvCache c;
  c.model_ = this;
  c.capacity_ = P;
  c.width_ = Hkv * D;
  for (const Block& b : blocks_) {
    const std::string h = "h." + std::to_string(b.layer()) + ".kv_cache";
    c.layers_.push_back({make(P * c.width_, h + ".k"), make(P * c.width_, h + ".v")});
  }
  DecodeScratch& s = c.scratch_;
  s.rows = P;
  s.positions = P;
  s.norm = make(P * C, "decode.norm");
  s.mean = make(P, "decode.norm.mean");
  s.rstd = make(P, "decode.norm.rstd");
  s.qkv = make(P * (Hq + 2 * Hkv) * D, "decode.qkv");
  s.atty = make(P * Hq * D, "decode.atty");
  s.scores = make(kernels::attention_decode_scratch(
                      P, P,
                      kernels::AttentionHeads{static_cast<int>(Hq), static_cast<int>(Hkv),
                                              static_cast<int>(D)}),
                  "decode.scores");
  s.x_attn = make(P * C, "decode.x_attn");
  s.position.resize(static_cast<size_t>(P));
  s.alloc = &alloc_;
  c.hidden_[0] = make(P * C, "decode.x");
  c.hidden_[1] = make(P * C, "decode.y");
  c.logits_ = make(cfg_.vocab_size, "decode.logits");
  return c;
}

const float* GPT::decode(const int32_t* tokens, int n, KvCache& cache) {
  run_decode(tokens, n, cache, nullptr);
  return cache.logits_.f32();
}

void GPT::decode(const int32_t* tokens, int n, KvCache& cache, float* logits) {
  TESSERA_CHECK(logits != nullptr, "decode() into null logits");
  run_decode(tokens, n, cache, logits);
}

void GPT::run_decode(const int32_t* tokens, int n, KvCache& cache, float* logits) {
  TESSERA_CHECK(cache.model_ == this, "decode() with a key/value cache made by another model");
  TESSERA_CHECK_AS(ShapeError, n >= 1 && n <= cache.room(), "decoding ", n,
                   " new tokens with a key/value cache holding ", cache.length(), " of its ",
                   cache.capacity(), " positions: it takes 1 to ", cache.room(),
                   " (a full cache does not slide: reset() it and prefill the window to continue "
                   "from)");
  for (int i = 0; i < n; ++i)
    TESSERA_CHECK_AS(ConfigError, tokens[i] >= 0 && tokens[i] < cfg_.vocab_size, "token id ",
                     tokens[i], " at position ", cache.length() + i,
                     " is outside the vocabulary [0, ", cfg_.vocab_size, ")");
  kernels::GemmModeScope precision(layout_.gemm);
  // In pieces of at most the rows a record of one sequence holds (the MLPs' decode scratch, and
  // the workspace: all of block_size, or a context-parallel rank's share of it).
  const int piece = static_cast<int>(rows_per_sequence());
  for (int at = 0; at < n; at += piece) {
    const int m = std::min(piece, n - at);
    const DecodeStep step{m, cache.length()};
    float* x = cache.hidden_[0].f32();
    float* y = cache.hidden_[1].f32();
    embedding_->decode(tokens + at, m, step.pos0, x);
    for (size_t i = 0; i < blocks_.size(); ++i) {
      blocks_[i].decode(step, x, y, cache.layers_[i], cache.scratch_, ws_);
      std::swap(x, y);
    }
    DecodeScratch& s = cache.scratch_;
    const int64_t C = cfg_.n_embd;
    if (logits)
      head_->decode(x, m, logits + static_cast<int64_t>(at) * cfg_.vocab_size, s.norm.f32(),
                    s.mean.f32(), s.rstd.f32());
    else if (at + m == n)  // the last row only
      head_->decode(x + (m - 1) * C, 1, cache.logits_.f32(), s.norm.f32(), s.mean.f32(),
                    s.rstd.f32());
    cache.length_ += m;
  }
}

int64_t GPT::num_params_without_wpe() const {
  return total_params(cfg_) - gpt_params(cfg_).wpe;
}

double GPT::flops_per_token(int T) const {
  return model_flops_per_token(cfg_, T);
}

std::string GPT::first_non_finite(const Record* rec) const {
  auto bad = [](const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(x[i])) return true;
    return false;
  };
  // Parameters first: a bad weight is the cause, bad gradients and activations its effects.
  // (Pointers are null where a ZeRO engine holds no full copy.)
  for (const ParameterSet* ps : {&params_, &expert_params_})
    for (int i = 0; i < ps->size(); ++i) {
      const float* w = ps->param_data(i);
      if (w && bad(w, ps->infos()[i].local_numel())) return ps->infos()[i].name;
    }
  for (const ParameterSet* ps : {&params_, &expert_params_})
    for (int i = 0; i < ps->size(); ++i) {
      const float* d = ps->grad_data(i);
      if (d && bad(d, ps->infos()[i].local_numel())) return ps->infos()[i].name + " (gradient)";
    }
  if (!rec) rec = shared_if_made();
  if (!rec || rec->B == 0) return "";
  const int T = rec->T;
  const int64_t BT = static_cast<int64_t>(rec->B) * T;
  const int64_t my_rows = token_range(tp_, BT).size();
  const bool logits_valid = rec->head && rec->head->have_targets;
  for (const NamedActivation& a : rec->named) {
    if (a.name == "logits" && !logits_valid) continue;
    if (bad(a.t.f32(), (a.sequence_slice ? my_rows : BT) * a.width))
      return a.name + " (activation)";
  }
  return "";
}

}  // namespace tessera::nn

namespace tessera::nn {

ParameterSet& ExpertUnits::params() {
  return model_.expert_params();
}
const ParameterSet& ExpertUnits::params() const {
  return model_.params(ParamGroup::Experts);
}
int ExpertUnits::first_unit() const {
  return model_.first_unit();
}
int ExpertUnits::last_unit() const {
  return model_.last_unit();
}
int64_t ExpertUnits::unit_begin(int u) const {
  return model_.unit_begin(u, ParamGroup::Experts);
}
void ExpertUnits::add_hooks(UnitHooks* hooks) {
  model_.add_hooks(hooks);
}
void ExpertUnits::remove_hooks(UnitHooks* hooks) {
  model_.remove_hooks(hooks);
}

}  // namespace tessera::nn
