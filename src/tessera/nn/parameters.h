// A rank's parameters: global identity (name, global shape, shard) plus one contiguous buffer for
// values and one for gradients, with a view per parameter. A data-parallel bucket is then a slice
// of the gradient buffer and a ZeRO shard an offset range (docs/ARCHITECTURE.md, decision 2).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tessera/core/allocator.h"
#include "tessera/core/tensor.h"
#include "tessera/kernels/gemm.h"

namespace tessera::nn {

enum class Init { Zeros, Ones, Normal };

// GPT-2's standard deviation for normally initialised weights (the residual projections divide it
// by sqrt(2 n_layer)).
inline constexpr float kInitStd = 0.02f;

// Which part of a parameter's global tensor this rank holds: along dimension `dim`, viewed as
// `blocks` equal consecutive blocks, the rank holds [offset, offset + length) of each block.
// dim == -1: the whole tensor (replicated). Example: the column shard r of c_attn.weight [C, 3C]
// under tp-way tensor parallelism is {dim 1, blocks 3, offset r*C/tp, length C/tp}.
struct ShardSpec {
  int dim = -1;
  int64_t blocks = 1;
  int64_t offset = 0;
  int64_t length = 0;
};

// Parameter groups (docs/ARCHITECTURE.md, decision 16): over which communicators a parameter's
// gradient is summed and which copy the global gradient norm counts. Every gradient is summed over
// the data-parallel group; these say what comes on top.
struct GradReduction {
  // Replicated across tensor-parallel ranks, but each rank's gradient is partial (sequence
  // parallelism: LayerNorms and row-parallel biases see only a slice of the sequence).
  bool over_tensor_parallel = false;
  // The tied wte held by both the first and the last pipeline stage (Megatron's embedding group).
  bool over_embedding_group = false;
  // Whether this rank's copy counts in the global gradient norm. Each global element is counted
  // exactly once: tensor-parallel replicas count on tensor-parallel rank 0, the tied wte on the
  // first stage.
  bool counts_in_norm = true;
};

struct ParamInfo {
  std::string name;    // Hugging Face GPT-2 name: "h.3.attn.c_attn.weight"
  Shape global_shape;  // HF layout (Conv1D weights are [in, out])
  ShardSpec shard;
  Shape local_shape;   // derived from global_shape and shard
  int64_t offset = 0;  // element offset of this parameter in the rank's flat buffers
  Init init = Init::Normal;
  float init_std = 0.02f;
  bool weight_decay = true;  // 2-D weights decay; biases and LayerNorm gains do not
  GradReduction reduction;
  bool tp_replicated() const { return shard.dim < 0; }

  int64_t local_numel() const { return shape_numel(local_shape); }
  int64_t global_numel() const { return shape_numel(global_shape); }
  // Global flat index (row-major in global_shape) of local flat element `i`.
  int64_t global_index(int64_t i) const;
  // The local elements [local_begin, local_begin + n) as runs of consecutive global indices, in
  // local order: {global offset, length} each. What a rank reads of a full tensor in a file.
  std::vector<std::pair<int64_t, int64_t>> global_runs(int64_t local_begin, int64_t n) const;
};

// How a model lays out its flat parameter and gradient buffers; a parallel engine says what it
// needs (parallel::flat_layout_for): ZeRO shards need units padded to 16 * dp floats, ZeRO-2/3 no
// full gradient buffer, ZeRO-3 no full parameter buffer.
struct FlatLayout {
  int64_t unit_alignment = 16;  // floats; every unit (layer) starts at a multiple of it
  bool full_params = true;      // allocate the full parameter buffer
  bool full_grads = true;       // allocate the full gradient buffer
};

class ParameterSet {
 public:
  // Registers a parameter and returns its index. Call before materialize().
  int add(std::string name, Shape global_shape, Init init, float init_std, bool weight_decay,
          ShardSpec shard = {});
  // Pads the layout so the next parameter starts at a multiple of `floats` elements. Models call
  // it at the end of each unit (layer) so that ZeRO can split every unit into equal shards.
  void pad_to_multiple(int64_t floats);
  // Allocates the flat parameter and gradient buffers (each parameter 64-byte aligned) and zeroes
  // both. Padding between parameters stays zero forever. ZeRO stages that shard parameters or
  // gradients leave the corresponding full buffer unallocated and point the parameters at their
  // own storage with set_param_data / set_grad_data.
  // bf16_copies: also allocate the bf16 copies of the weights marked with mark_gemm_weight (a
  // bf16 model whose parameters are resident: see gemm_weight).
  void materialize(Allocator& alloc, bool full_params = true, bool full_grads = true,
                   bool bf16_copies = false);
  void materialize(Allocator& alloc, const FlatLayout& f) {
    materialize(alloc, f.full_params, f.full_grads);
  }
  bool materialized() const { return materialized_; }
  // Element with global index g of parameter P becomes init(philox(seed, stable_hash(P.name), g)).
  void initialize(uint64_t seed);
  // The initial values of flat positions [begin, end) (padding is 0) into out[0 .. end-begin):
  // what initialize() would write there. A ZeRO-3 rank initialises just its shard with it.
  // Large ranges are filled by the rank's compute threads (its BLAS threads): bitwise the same.
  void initial_values(uint64_t seed, int64_t begin, int64_t end, float* out) const;

  const std::vector<ParamInfo>& infos() const { return infos_; }
  int size() const { return static_cast<int>(infos_.size()); }
  int64_t numel() const { return numel_; }  // local elements including alignment padding
  int64_t global_numel() const;             // sum of global sizes, no padding
  Tensor& flat_params() { return flat_params_; }
  Tensor& flat_grads() { return flat_grads_; }
  const Tensor& flat_params() const { return flat_params_; }
  const Tensor& flat_grads() const { return flat_grads_; }
  Tensor param(int i) const;
  Tensor grad(int i) const;
  Tensor param(std::string_view name) const { return param(index(name)); }
  Tensor grad(std::string_view name) const { return grad(index(name)); }
  void set_reduction(int i, const GradReduction& r) { infos_[i].reduction = r; }
  int index(std::string_view name) const;  // throws ConfigError naming an unknown parameter
  bool contains(std::string_view name) const;
  void zero_grads();

  // Where parameter i's values and gradients are right now. They start in the flat buffers; the
  // ZeRO-3 engine points them at gathered layer buffers while a layer runs, and ZeRO-2/3 point
  // the gradients at per-bucket buffers during backward. Kernels must read these at use time.
  float* param_data(int i) const { return param_ptr_[i]; }
  float* grad_data(int i) const { return grad_ptr_[i]; }
  void set_param_data(int i, float* p) { param_ptr_[i] = p; }
  void set_grad_data(int i, float* g) { grad_ptr_[i] = g; }
  // bf16 copies of the weights that GEMMs read (docs/ARCHITECTURE.md, decision 33). A module marks
  // its GEMM weights before materialize(); a bf16 model whose parameters are resident (not ZeRO-3,
  // whose gathered layer buffers come and go) asks materialize() for copies of them, in one buffer
  // (category Parameters, 2 bytes per weight). The forward that reads a weight converts it into its
  // copy first (refresh_bf16_copy) and its GEMMs, and the backward of that forward, read the copy
  // (gemm_weight): a weight is converted once per forward instead of once per GEMM. Parameters do
  // not change between a forward and its backward (the fp32 gradients would be wrong too).
  //
  // A copy is "current" from its conversion until bf16_copies_stale(): refresh_bf16_copy converts
  // only a copy that is not, so the micro-batches, recomputations and evaluations of a step convert
  // each weight once. An optimizer whose segment holds a whole weight writes its copy with the
  // values it updates (optim::Segment::bf16, while they are in the cache), so the copy stays
  // current. Whatever else writes values marks the copies stale: initialize(), the loads
  // (parallel::DataParallel, train::load_weights), a sharded engine's step and gather
  // (DataParallel::optimizer_step). Code that writes values through param_data() must call
  // bf16_copies_stale().
  void mark_gemm_weight(int i);
  bool has_bf16_copies() const { return bf16_copies_.defined(); }
  size_t bf16_copy_bytes() const { return bf16_copies_.defined() ? bf16_copies_.nbytes() : 0; }
  // A no-op without a copy. const: the copies are a cache of the values (the modules hold their
  // parameter set const).
  void refresh_bf16_copy(int i) const;
  // Weight i's bf16 copy, or null without one.
  uint16_t* bf16_copy(int i) const { return bf16_ptr_.empty() ? nullptr : bf16_ptr_[i]; }
  // Copy i holds bf16 of the values now (its writer, an optimizer step, says so).
  void mark_bf16_copy_current(int i) const;
  // Every copy must be converted again before a GEMM reads it.
  void bf16_copies_stale() const;
  // What a GEMM reads of weight i: its bf16 copy when it has one, else the fp32 values.
  kernels::GemmInput gemm_weight(int i) const {
    if (!bf16_ptr_.empty() && bf16_ptr_[i] != nullptr) return bf16_ptr_[i];
    return param_ptr_[i];
  }
  // The parameters whose flat ranges lie in [begin, end), as an index range [first, last).
  std::pair<int, int> params_in(int64_t begin, int64_t end) const;

 private:
  void fill_initial_values(uint64_t seed, int64_t begin, int64_t end, float* out) const;

  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, int> by_name_;
  int64_t numel_ = 0;
  bool materialized_ = false;
  Tensor flat_params_, flat_grads_;
  std::vector<float*> param_ptr_, grad_ptr_;
  std::vector<bool> gemm_weight_;  // marked by mark_gemm_weight
  Tensor bf16_copies_;             // BF16: the marked weights' copies, 64-byte aligned each
  std::vector<uint16_t*> bf16_ptr_;
  mutable std::vector<uint8_t> bf16_current_;  // per parameter: its copy holds the values now
};

}  // namespace tessera::nn
