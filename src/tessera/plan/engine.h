// The accounting of an implementation ("engine"): how a model stage's parameters, activations,
// work and communication come out on one device, and how a pipeline rank's memory adds up.
//   tessera   this code base as it runs today (fp32 CPU ranks; fp32 model states and activations
//             under --precision bf16 too, with the traffic EngineOptions says travels in bf16):
//             parameter padding, the activation records of nn/block.h to the byte, pooled
//             records, ZeRO buckets (docs/PLANNER.md).
//   megatron  mixed precision as Megatron-LM and the papers count it: 2-byte parameters and
//             gradients, 12 bytes of fp32 optimizer state per parameter (Rajbhandari et al. 2020),
//             activations per layer as Korthikanti et al. 2022 (korthikanti.h).
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tessera/parallel/pipeline/pipeline_split.h"
#include "tessera/plan/context_parallel.h"
#include "tessera/plan/gemm_efficiency.h"
#include "tessera/plan/layout.h"
#include "tessera/plan/model_spec.h"

namespace tessera::plan {

// Bytes per parameter element of each model state, and per element moved by data parallelism.
struct Numerics {
  double param = 4, grad = 4, optimizer = 8;  // optimizer: all of its state per element
  double comm = 4;                            // gradient reductions
  double replica_comm = 4;  // HSDP: the reduced shards' all-reduce over their replicas
  double gather = 4;  // ZeRO-3 parameter gathers (ZeRO-1/2's gather after the step moves `param`)
  double activation = 4;          // tensor- and pipeline-parallel activations on the wire
  double optimizer_traffic = 40;  // memory traffic of one optimizer step per element
};

// One model stage (a chunk of consecutive units on one pipeline rank), seen from one device of its
// tensor- and context-parallel groups, per micro-batch of `micro_batch` sequences (that device's
// micro_batch x seq / cp tokens of it).
struct StageSheet {
  parallel::UnitRange units;
  int blocks = 0;
  bool has_embedding = false, has_head = false;
  // Parameter elements this device holds before ZeRO (its tensor- and expert-parallel shard, with
  // the engine's padding): replicated over the data-parallel group, or (experts) over dp / ep.
  double dense_elems = 0, expert_elems = 0;
  std::vector<double> unit_elems;  // per unit of the stage, in order (gradient buckets)
  double tied_wte_elems = 0;       // a wte copy summed over the embedding group (pp > 1)
  // LayerNorm elements whose gradients are partial sums over the rows under sequence parallelism,
  // summed over the stage's dp x tp ranks after the data-parallel reduction.
  double sequence_partial_elems = 0;
  // Bytes of bf16 weight copies next to the parameters (tessera under bf16 with resident
  // parameters, not ZeRO-3: nn/parameters.h gemm_weight), counted with the parameters.
  double bf16_copy_bytes = 0;
  // Activation memory: bytes kept per micro-batch until its backward (one record), the extra a
  // micro-batch waiting for its weight gradients keeps (zb-h1), and the stage's scratch.
  double record_bytes = 0, deferred_bytes = 0, workspace_bytes = 0;
  // Work per micro-batch: matmul FLOPs of the forward, the whole backward, the weight-gradient part
  // of it (W), and the forward the backward reruns (recomputation); memory traffic of the
  // elementwise kernels in the same three parts.
  double fwd_flops = 0, bwd_flops = 0, wgrad_flops = 0, recompute_flops = 0;
  // With gemm_costed, the same FLOPs each divided by its GEMM shape's efficiency (seconds = cost /
  // peak, plan/work.h); without, the planner divides the FLOPs by the one matmul_efficiency.
  bool gemm_costed = false;
  double fwd_cost = 0, bwd_cost = 0, wgrad_cost = 0, recompute_cost = 0;
  double fwd_bytes = 0, bwd_bytes = 0, recompute_bytes = 0;
  // Tensor-parallel collectives per micro-batch, as all-reduces of `tp_bytes` each (an all-gather
  // plus a reduce-scatter under sequence parallelism moves the same).
  int tp_fwd = 0, tp_bwd = 0, tp_recompute = 0;
  double tp_bytes = 0;
  // Expert-parallel all-to-alls per micro-batch (dispatch and combine), bytes each device sends.
  int a2a_fwd = 0, a2a_bwd = 0;
  double a2a_bytes = 0;
  double boundary_bytes = 0;  // what one device sends the next stage per micro-batch
  // Context parallelism (plan/context_parallel.h), per micro-batch: one attention core's exchange
  // (its shape, with the engine's element size), the attention cores and MoE routers the stage
  // runs forward (each exchanging once per forward, recomputations included, and each core once
  // per backward), the cores' own work (what a ring's transfers hide behind), and the most
  // transient bytes a core's call holds (tessera).
  CpShape cp;
  int cp_cores = 0, cp_routers = 0;
  int cp_core_recomputes = 0, cp_router_recomputes = 0;
  double core_fwd_flops = 0, core_bwd_flops = 0, core_fwd_cost = 0, core_bwd_cost = 0;
  CpTransient cp_transient;
  // Bytes one device sends its cp ranks per micro-batch (attention and routing, recomputation
  // included).
  double cp_bytes(const ModelSpec& m, const Layout& l) const;
  double params() const { return dense_elems + expert_elems; }
};

struct MemoryTerms {
  double parameters = 0, gradients = 0, optimizer_state = 0, activations = 0, buffers = 0,
         reserved = 0;
  double model_states() const { return parameters + gradients + optimizer_state; }
  double total() const { return model_states() + activations + buffers + reserved; }
  // The largest term and its name ("activations").
  std::pair<std::string, double> largest() const;
};
nlohmann::json to_json(const MemoryTerms& m);

// What the plan knows besides the model and the layout.
struct EngineOptions {
  double bucket_mb = 25;  // gradient bucket target (tessera's --bucket-mb)
  bool sgd = false;       // tessera's --optimizer sgd (one state buffer) instead of AdamW
  // Bytes per element on the wire (tessera's --grad-reduce-dtype, --param-gather-dtype and
  // --activation-comm-dtype: 4 for fp32, 2 for bf16): gradient reductions, ZeRO-3 parameter
  // gathers, tensor- and pipeline-parallel activations. The megatron engine sends 2 bytes always.
  double grad_comm_bytes = 4, param_gather_bytes = 4, activation_comm_bytes = 4;
  // tessera under --precision bf16: blocks keep their GEMM-only inputs in bf16 (nn/block.h).
  bool bf16_gemm_inputs = false;
  // tessera under --precision bf16 through oneDNN: a bf16 copy of every GEMM weight unless ZeRO-3
  // (nn/gpt.h, GPTLayout::bf16_weight_copies).
  bool bf16_weight_copies = false;
  // Matmul efficiency by GEMM shape (the cluster's gemm_efficiency; the planner sets it): the
  // tessera engine costs each GEMM at its shape. Empty: one efficiency for all.
  GemmEfficiency gemm_efficiency;
  AttentionEfficiency attention_efficiency;  // the attention kernel's (with gemm_efficiency)
  // Routing imbalance (tessera, ep > 1): the rows the busiest expert-parallel rank's experts run
  // over balanced routing's top-k x B s (1: balanced). Scales its routed rows' memory and its
  // expert MLPs' time; FLOPs (MFU, HFU) stay those of balanced routing.
  double moe_skew = 1;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string name() const = 0;
  virtual Numerics numerics() const = 0;
  // Whether a stage may hold no layer, only the embedding or the head (layout_problems).
  virtual bool uneven_stages() const = 0;
  // The units of each model stage (pp * virtual_stages of them, in model order).
  virtual std::vector<parallel::UnitRange> split(const ModelSpec& m, const Layout& l) const = 0;
  virtual StageSheet stage(const ModelSpec& m, const Layout& l,
                           const parallel::UnitRange& units) const = 0;
  // The memory of a pipeline rank holding `chunks` (its model stages, chunk 0 first), given the
  // most micro-batches each chunk holds at once (`chunk_peaks`) and the most the rank holds at
  // once in micro-batch equivalents through all its layers (`rank_peak`, a chunk's counting 1/v),
  // with `micro_batches` per step.
  virtual MemoryTerms rank_memory(const ModelSpec& m, const Layout& l,
                                  const std::vector<StageSheet>& chunks,
                                  const std::vector<int>& chunk_peaks, double rank_peak,
                                  int micro_batches) const = 0;
  // Data-parallel bytes this rank sends per step (ring accounting, as parallel::CommVolume).
  double dp_bytes_per_step(const Layout& l, const std::vector<StageSheet>& chunks,
                           int micro_batches) const;

  EngineOptions options;
};

// Adds the model states of chunk `s` under l's ZeRO stage: its dense parameters sharded over the
// gradient group (dp x cp), its experts over the dp / ep x cp ranks holding the same experts.
void add_model_states(MemoryTerms& total, const StageSheet& s, const Layout& l, const Numerics& n);

struct WorkRules;
// Fills the work fields of `s` (FLOPs, elementwise bytes, collectives, context parallelism's
// exchanges with `cp_elem_bytes` per element) with the sum of unit_work over its units
// (plan/work.h).
void add_unit_work(StageSheet& s, const ModelSpec& m, const Layout& l, const WorkRules& r,
                   double cp_elem_bytes);
// Which part of unit u a stage holds (a half where the stage boundary cuts the block).
nn::BlockPart part_of(const parallel::UnitRange& units, int u);

// "tessera" or "megatron"; ConfigError otherwise.
std::unique_ptr<Engine> make_engine(const std::string& name, const EngineOptions& o = {});

// Model-state bytes of `elems` parameter elements replicated over `group` data-parallel ranks under
// ZeRO stage `zero` (Rajbhandari et al. 2020): stage 1 shards the optimizer state, 2 also the
// gradients, 3 also the parameters.
MemoryTerms zero_model_states(double elems, parallel::ZeroStage zero, int group, const Numerics& n);

}  // namespace tessera::plan
