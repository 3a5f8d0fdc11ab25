// GPT-2 (Radford et al. 2019) on one rank, as a pipeline *stage*: a contiguous range of units
// built from the modules Embedding (unit 0), Block (units 1..L) and Head (unit L+1). With every
// unit on the rank (the default) it is the whole model: learned positions, pre-LayerNorm blocks
// (ln_1 -> attn -> +, ln_2 -> mlp -> +), final ln_f, LM head tied to wte. Parameters carry
// Hugging Face GPT2Model names and layouts ("h.3.attn.c_attn.weight" [C, 3C]).
//
// Initialisation (GPT-2's scheme, drawn from philox(seed, stable_hash(name), global index) by
// ParameterSet::initialize): weights normal(0, 0.02); attn.c_proj.weight and mlp.c_proj.weight
// normal(0, 0.02 / sqrt(2 * n_layer)); wpe normal(0, 0.01) as in OpenAI's released GPT-2 code
// (Hugging Face and nanoGPT use 0.02); biases 0; LayerNorm gains 1.
//
// Dropout sites (HF module names) and their streams, mix_stream(step, stable_hash(site)):
//   "drop" on the embedding sum, "h.<l>.attn.attn_dropout" on attention probabilities,
//   "h.<l>.attn.resid_dropout" and "h.<l>.mlp.dropout" on the two residual branches.
//
// A StageModel (nn/stage_model.h): forward(ctx, batch, record) and backward(record, ...) work on a
// Record the caller owns (make_record()), so a pipeline stage can hold several; the single-record
// forward(batch, ctx) / backward() use the shared record (evaluation, sampling, tests).
//
// Mixture of experts (cfg.moe, nn/moe.h): the experts of the MoE blocks live in a second
// parameter set, params(ParamGroup::Experts), with its own flat buffers and unit offsets, so that
// a data-parallel engine over the expert-data-parallel group can reduce and shard them apart from
// the rest of the model (docs/ARCHITECTURE.md, decision 30). The routers stay in params().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/core/tensor.h"
#include "tessera/kernels/precision.h"
#include "tessera/nn/activations.h"
#include "tessera/nn/block.h"
#include "tessera/nn/context_parallel.h"
#include "tessera/nn/embedding.h"
#include "tessera/nn/gpt_config.h"
#include "tessera/nn/head.h"
#include "tessera/nn/parameters.h"
#include "tessera/nn/stage_model.h"
#include "tessera/nn/tensor_parallel.h"
#include "tessera/nn/unit_hooks.h"
#include "tessera/nn/unit_model.h"

namespace tessera::nn {

// How this rank's part of the model is laid out (parallel engines choose it; defaults = one rank).
struct GPTLayout {
  // Each unit starts at a multiple of this many floats in the flat buffers.
  int64_t unit_alignment = 16;
  // Allocate the full flat parameter / gradient buffers (ZeRO-3 / ZeRO-2 do not).
  bool full_params = true;
  bool full_grads = true;
  // The units this rank holds: [first_unit, last_unit], 0 = embedding, 1..L = blocks, L+1 = head;
  // last_unit -1 means through the head.
  int first_unit = 0;
  int last_unit = -1;
  // A stage may begin with the MLP half of block first_unit (its input is then the residual
  // stream after that block's attention) and end after the attention half of block last_unit
  // (Block's BlockPart), so that pipeline stages balance at half-block grain.
  bool starts_mid_block = false;
  bool ends_mid_block = false;
  Recompute recompute = Recompute::None;
  // Sequence parallelism inside the tensor-parallel group (more than one rank), and what
  // tensor-parallel activations and their gradients travel in (F32 or BF16, nn/tensor_parallel.h).
  bool sequence_parallel = false;
  DType activation_wire = DType::F32;
  // How the attention of a micro-batch split over the context-parallel group meets the rest of
  // each sequence (nn/context_parallel_attention.h).
  CpComm cp_comm = CpComm::AllGather;
  // The unit alignment of the expert parameter set (16 x the expert-data-parallel size under
  // ZeRO).
  int64_t expert_unit_alignment = 16;
  // The precision of the model's GEMMs (kernels/precision.h; decision 33): the model installs it
  // on the calling thread for each forward and backward. Parameters, gradients and activations
  // stay fp32; the MoE router's GEMMs are fp32 in any mode. A bf16 path of Auto is resolved when
  // the model is built (layout().gemm holds the path in use).
  kernels::GemmMode gemm;
  // Under bf16 GEMMs, keep the activations only bf16 GEMMs read in bf16 (Block's
  // bf16_gemm_inputs: the same numbers in half their bytes). false: every activation in fp32.
  bool bf16_gemm_inputs = true;
  // Under bf16 GEMMs with resident parameters (full_params: not ZeRO-3), a bf16 copy of each GEMM
  // weight, converted once per forward and read by its GEMMs and the backward's instead of a
  // conversion per GEMM call (ParameterSet::gemm_weight): 2 more bytes per weight, bitwise the
  // same results. Auto: where the bf16 GEMM reads bf16 in place (oneDNN); the emulated path widens
  // a bf16 copy into fp32 scratch just as it rounds an fp32 weight there, so a copy would cost
  // memory and save nothing (measured: docs/PERFORMANCE.md).
  using WeightCopies = nn::WeightCopies;
  WeightCopies bf16_weight_copies = WeightCopies::Auto;
};

// The two parameter sets of a model: everything but the experts, and the experts.
enum class ParamGroup { Model, Experts };

class GPT;

// A GPT's expert parameter set as a model of its own (same units, hooks and stage), so the
// data-parallel engine of the experts (over the expert-data-parallel group) is a DataParallel like
// any other. Units without experts span nothing; no unit is tied.
class ExpertUnits final : public UnitModel {
 public:
  explicit ExpertUnits(GPT& model) : model_(model) {}
  ParameterSet& params() override;
  const ParameterSet& params() const override;
  int first_unit() const override;
  int last_unit() const override;
  int64_t unit_begin(int u) const override;
  // A full-model file holds the rest of the model, which this set does not read.
  bool holds_whole_model() const override { return false; }
  void add_hooks(UnitHooks* hooks) override;
  void remove_hooks(UnitHooks* hooks) override;

 private:
  GPT& model_;
};

// Generation with a key/value cache (GPT::make_kv_cache, GPT::decode): the keys and values of one
// sequence in every layer of a GPT, kept between decode steps.
//
// A decode step runs n new tokens at positions [pos0, pos0 + n) of one sequence through the model,
// given every layer's keys and values of positions [0, pos0) in the cache: the embedding of the new
// tokens (GPT-2: with wpe at their positions), in each block the attention of the new queries over
// the cached and new keys (causal among the new ones; AttentionBranch::decode, which writes the new
// keys and values into the cache: after rotation in a rotary model) and the MLP on the new rows
// (the module's ordinary forward on a scratch record: exact, because an MLP, a dropless mixture of
// experts too, works row by row), and the head's logits of the new rows. Each new row's logits are
// those a full forward of the sequence [0, pos0 + n) gives at its position, to rounding (the GEMMs
// see other shapes).
//
// The cache holds block_size positions (or fewer, if asked): a model has no positions past
// block_size (GPT-2's wpe has block_size rows; a rotary model trains and samples at block_size).
// A decode that would pass the cache's capacity is refused (ShapeError): the caller decides what a
// full cache means. train::generate re-prefills the last block_size tokens at positions
// [0, block_size) for every token past block_size, which is exactly what today's window does
// (train/generate.h).
//
// Everything is allocated once, by GPT::make_kv_cache, in the model's allocator under Activations
// (the MLP's scratch record of each kind by the first decode that needs it).
class KvCache {
 public:
  KvCache() = default;
  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&&) noexcept = default;

  int64_t length() const { return length_; }      // positions held: [0, length)
  int64_t capacity() const { return capacity_; }  // positions it can hold
  int64_t room() const { return capacity_ - length_; }
  bool full() const { return length_ == capacity_; }
  // Forgets every position (the memory stays): the next decode starts a sequence at position 0.
  void reset() { length_ = 0; }

  int layers() const { return static_cast<int>(layers_.size()); }
  int64_t width() const { return width_; }  // of a key (value) row: kv_heads x head_dim
  // Layer l's keys and values, [capacity, width] (rows [0, length) meaningful).
  const float* keys(int l) const { return layers_.at(static_cast<size_t>(l)).k.f32(); }
  const float* values(int l) const { return layers_.at(static_cast<size_t>(l)).v.f32(); }

 private:
  friend class GPT;
  std::vector<KvLayer> layers_;
  int64_t length_ = 0, capacity_ = 0, width_ = 0;
  DecodeScratch scratch_;
  Tensor hidden_[2];  // [rows, C]: the residual stream, in turn a block's input and output
  Tensor logits_;     // [V]: the last new token's logits
  const GPT* model_ = nullptr;
};

class GPT : public StageModel {
 public:
  // The activations of one micro-batch on this stage.
  struct Record : StageRecord {
    std::optional<Embedding::Record> embedding;
    // hidden[0]: the stage's input (the embedding's output on the first stage); hidden[i + 1]:
    // the output of the stage's i-th block. [B, T, C] each, or this rank's rows of the B*T tokens
    // under sequence parallelism (token_range; hidden_elems).
    // After the backward of a stage without the embedding, hidden[0] holds dL/d input instead
    // (input_grad(rec)): the input is not read again.
    std::vector<Tensor> hidden;
    std::vector<Block::Record> blocks;
    std::optional<Head::Record> head;
    std::vector<NamedActivation> named;  // every F32 activation, for first_non_finite
    int B = 0, T = 0;
  };

  // Validates cfg and the layout, registers and materialises this stage's parameters (zero until
  // initialize()), and allocates the shared workspace for (max_batch, block_size). The blocks'
  // heads, MLP columns and the vocabulary are split over `tensor_group`, the MoE blocks' experts
  // over `expert_group`, and a split micro-batch's sequences (Batch::positions) over
  // `context_group` (size-1 groups: not split; without a context group, whole sequences only).
  GPT(const GPTConfig& cfg, int max_batch, Allocator& alloc, const GPTLayout& layout,
      comm::Communicator& tensor_group, comm::Communicator& expert_group,
      comm::Communicator& context_group);
  GPT(const GPTConfig& cfg, int max_batch, Allocator& alloc, const GPTLayout& layout,
      comm::Communicator& tensor_group, comm::Communicator& expert_group);
  // A GPT computed on one rank alone (its own one-rank group for both).
  GPT(const GPTConfig& cfg, int max_batch, Allocator& alloc, const GPTLayout& layout = {});
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  void initialize(uint64_t seed);  // GPT-2 initialisation (see above)
  const GPTConfig& config() const { return cfg_; }
  const GPTLayout& layout() const { return layout_; }
  const TensorSplit& tensor_split() const { return tp_; }
  int max_batch() const { return max_batch_; }
  // The rows of each sequence this model's records and workspace hold: block_size, or a
  // context-parallel rank's share of it (ContextSplit::rows_per_sequence; activations / cp).
  int64_t rows_per_sequence() const { return cp_.rows_per_sequence(cfg_.block_size); }
  ParameterSet& params() override { return params_; }
  const ParameterSet& params() const override { return params_; }
  ParameterSet& params(ParamGroup g) { return g == ParamGroup::Model ? params_ : expert_params_; }
  const ParameterSet& params(ParamGroup g) const {
    return g == ParamGroup::Model ? params_ : expert_params_;
  }
  ParameterSet& expert_params() { return expert_params_; }
  bool has_experts() const override { return expert_params_.size() > 0; }
  // The expert parameter set as a UnitModel (for its own DataParallel engine).
  UnitModel& expert_units() override { return expert_units_; }

  // Units (see unit_hooks.h). Global ids: 0 = embedding, 1..L = blocks, L+1 = head.
  int num_units() const { return cfg_.n_layer + 2; }  // of the whole model
  int first_unit() const override { return first_unit_; }
  int last_unit() const override { return last_unit_; }
  bool has_embedding() const { return embedding_.has_value(); }
  bool has_head() const { return head_.has_value(); }
  // Flat offset where unit u's parameters start, u in [first_unit, last_unit + 1];
  // unit_begin(last_unit + 1) = params().numel().
  int64_t unit_begin(int u) const override { return unit_begin_[u - first_unit_]; }
  // The same in the given parameter set (units without experts span nothing in the expert set).
  int64_t unit_begin(int u, ParamGroup g) const {
    return (g == ParamGroup::Model ? unit_begin_ : expert_unit_begin_)[u - first_unit_];
  }
  // The other unit whose parameters unit u reads (the head reads the tied wte of unit 0 when both
  // are on this rank), or -1.
  int tied_unit(int u) const override;
  bool holds_whole_model() const override {
    return has_embedding() && has_head() && !has_experts();
  }
  // Callbacks around each unit's forward and backward, called in order (before_*) and in reverse
  // order (after_*), like nested scopes.
  void add_hooks(UnitHooks* hooks) override { hooks_.add(hooks); }
  void remove_hooks(UnitHooks* hooks) override { hooks_.remove(hooks); }

  // A record for one micro-batch of up to max_batch sequences (Activations category): a Record.
  std::unique_ptr<StageRecord> make_record() override;
  // Stage forward of micro-batch b. The first stage reads b.tokens (checked); later stages read
  // input(rec), which the caller fills. Returns the SUM of the token cross-entropies over targets
  // that are not -1 on the last stage (0 without targets or on other stages).
  double forward(const StepContext& ctx, const Batch& b, StageRecord& rec) override;
  // Stage backward of the micro-batch in rec: the last stage starts from its loss; other stages
  // from dout[B, T, C] = dL/d output(rec). ACCUMULATES parameter gradients; on a stage without
  // the embedding, dL/d input(rec) is left in input_grad(rec) (the input's buffer).
  void backward(StageRecord& rec, const float* dout = nullptr,
                const BackwardPass& pass = {}) override;
  // The zero-bubble split of backward (Qi et al. 2024): backward_input leaves dL/d input in
  // input_grad(rec) and accumulates only the cheap parameter gradients (LayerNorms, the
  // embedding); backward_weight(rec) later accumulates the matmuls' weight gradients from what
  // the first kept in rec. Together they give backward's gradients.
  void backward_input(StageRecord& rec, const float* dout = nullptr) override;
  void backward_weight(StageRecord& rec, const BackwardPass& pass = {}) override;
  // Elements of a hidden state of a (B, T) micro-batch on this rank, as stages pass it on: B*T*C,
  // or token_range(B*T).per * C under sequence parallelism (the same on every rank of the group).
  int64_t hidden_elems(int B, int T) const override;
  float* input(StageRecord& rec) override { return record(rec).hidden.front().f32(); }
  const float* output(const StageRecord& rec) const override {
    return record(rec).hidden.back().f32();
  }
  const float* input_grad(const StageRecord& rec) const override;

  // Single-record form (whole model): forward() then backward() of the same batch.
  double forward(const Batch& b, const StepContext& ctx);
  void backward();
  // [B, T, V] logits of the last single-record forward(); valid until backward(). Under tensor
  // parallelism only this rank's vocabulary slice: [B, T, head vocab().size()].
  const float* logits() const;
  // The full [V] logits of row `row` (b * T + t) of the last single-record forward(). Under tensor
  // parallelism a collective over the group (each rank's slice placed, summed; exact).
  std::vector<float> full_logits_row(int64_t row) const;
  // Per-token losses [B, T] of the last single-record forward() with targets.
  const float* losses() const;

  // Generation with a key/value cache (KvCache above). What keeps this model from it ("" if
  // nothing): it needs the whole model on this rank (not a pipeline stage) without tensor or
  // expert parallelism, its parameters resident (not ZeRO-3), and no mixture of experts with a
  // capacity (which tokens an expert drops depends on the whole sequence, later tokens included,
  // so an earlier token's output would change as the sequence grows). Such models generate with
  // the full forward (train::generate does).
  std::string decode_unsupported() const;
  bool can_decode() const { return decode_unsupported().empty(); }
  // A cache for one sequence of up to `positions` tokens (0: block_size, the most there is) and
  // the scratch of its decode steps, allocated once in the model's allocator (Activations).
  // ConfigError naming the reason when the model cannot decode.
  KvCache make_kv_cache(int positions = 0);
  // Runs the n new tokens[n] at positions [cache.length(), cache.length() + n) of the cache's
  // sequence (n >= 1: a prefill of several tokens, or one step) and appends their keys and values
  // to the cache. Returns the [V] logits of the last new token (in the cache: valid until its next
  // decode); the second form ASSIGNS every new token's logits[n, V] instead. Each row's logits are
  // those the full forward of the sequence gives at its position (to rounding). ShapeError when
  // the cache has no room for n more positions (it never slides: the caller resets it and
  // prefills the window it wants); ConfigError for a token outside the vocabulary. Inference only
  // (no dropout, no MoE statistics); no unit hooks run.
  const float* decode(const int32_t* tokens, int n, KvCache& cache);
  void decode(const int32_t* tokens, int n, KvCache& cache, float* logits);

  int64_t num_params_without_wpe() const;  // whole-model parameter count minus wpe (PaLM's N)
  // 6 N + 6 L C T (forward + backward, causal attention: nn/gpt_costs.h), N counting the
  // parameters a token uses: k of the
  // E experts of an MoE block, and its router.
  double flops_per_token(int T) const;

  // The bytes a zero-bubble BI keeps for W of a (B, T) micro-batch through this stage's blocks
  // (measured: the modules allocate them against an allocator of address space only).
  size_t deferred_bytes(int B, int T) const;

  // The MoE blocks of this stage, and their statistics since the last reset.
  std::vector<const MixtureOfExperts*> moe_layers() const;
  void reset_moe_stats();

  // The first parameter, gradient or activation (of `rec`, default: the shared record) holding a
  // NaN/Inf, e.g. "h.2.mlp.c_fc.weight (gradient)" or "h.0.qkv (activation)"; "" if all finite.
  std::string first_non_finite(const Record* rec = nullptr) const;

 private:
  void check_batch(const Batch& b) const;
  // decode(): the new rows' logits into `logits` ([n, V]), or the last row's into the cache.
  void run_decode(const int32_t* tokens, int n, KvCache& cache, float* logits);
  void backward_pass(Record& rec, const float* dout, bool split, const BackwardPass& pass);
  static Record& record(StageRecord& r) { return static_cast<Record&>(r); }
  static const Record& record(const StageRecord& r) { return static_cast<const Record&>(r); }
  Record& shared() { return record(shared_record()); }
  const Record* shared_if_made() const {
    return static_cast<const Record*>(shared_record_if_made());
  }
  void hook(void (UnitHooks::*f)(int), int unit);
  void hook_reverse(void (UnitHooks::*f)(int), int unit);
  Block& block(int unit) { return blocks_[unit - 1 - first_block_]; }

  GPT(const GPTConfig& cfg, int max_batch, Allocator& alloc, const GPTLayout& layout,
      std::unique_ptr<comm::Communicator> one_rank);
  GPT(const GPTConfig& cfg, int max_batch, Allocator& alloc, const GPTLayout& layout,
      comm::Communicator& tensor_group, comm::Communicator& expert_group,
      std::unique_ptr<comm::Communicator> own_context);

  std::unique_ptr<comm::Communicator> one_rank_;     // the groups of a GPT on one rank alone
  std::unique_ptr<comm::Communicator> own_context_;  // the context group of a GPT built without
  GPTConfig cfg_;
  GPTLayout layout_;
  TensorSplit tp_;
  ExpertSplit ep_;
  ContextSplit cp_;
  int max_batch_;
  Allocator& alloc_;
  int first_unit_, last_unit_, first_block_;
  ParameterSet params_;
  ParameterSet expert_params_;
  std::optional<Embedding> embedding_;
  std::vector<Block> blocks_;
  std::optional<Head> head_;
  std::vector<int64_t> unit_begin_, expert_unit_begin_;
  UnitHookList hooks_;
  ExpertUnits expert_units_{*this};
  Block::Workspace ws_;
  Tensor dres_;  // [B, T, C]: the residual stream's gradient during backward (scratch)
};

}  // namespace tessera::nn
